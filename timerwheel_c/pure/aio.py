"""asyncio timers driven by one TimerWheel: ``WheelScheduler``, its ``timeout()`` and its
``keyed()`` timers. The pure-Python twin of ``src/_aio.pyx``, class by class in the same order.

Public sources: asyncio's ``TimerHandle``/``call_later``/``asyncio.timeout`` (the API
mirrored here), the hashed timing wheel (:class:`timerwheel_c.TimerWheel`, after
Varghese & Lauck and Netty's HashedWheelTimer), and the single-deadline reactor arming
of tokio's time driver: the loop holds ONE timer, at the wheels' earliest due time,
however many handles and keys are pending. ``docs/DESIGN.md`` ("asyncio integration")
gives the design.

Clock and rounding. The wheel counts integer milliseconds on the loop's own clock
(``loop.time()`` seconds, times 1000). A handle's deadline ``when`` (loop seconds) is
rounded UP to its due millisecond ``d``, with ``d / 1000 >= when`` checked in float.
The loop time of a wake-up is rounded DOWN: the largest ms ``n`` with
``n / 1000 <= loop.time()``. A handle fires only when ``d <= n``, so its callback never
runs before ``when`` by the loop's clock (checked in float arithmetic, not assumed),
and with 1 ms ticks it runs within one tick plus the loop's scheduling slack after it.

Real time versus the loop clock. asyncio's ``loop.time()`` is ``time.monotonic()``; but
uvloop's is libuv's loop time, whole milliseconds (floored) of libuv's "fast" monotonic
clock, so it trails the real time by up to 1 ms (2 ms where that clock is Linux's
CLOCK_MONOTONIC_COARSE, which libuv picks when it ticks every 1 ms or finer), and
``loop.time() + delay`` may then come before ``delay`` has really passed. uvloop's own
``call_later`` adds to this by rounding the delay to the NEAREST ms. WheelScheduler adds
the loop clock's lag to each due time (``clock_slack_s``: 1 or 2 ms on uvloop, 0
otherwise), so a callback never runs before its delay has passed in real time either.

Keyed timers. ``keyed(callback)`` gives a set of timers named by int keys (a connection id,
a file descriptor), with no handle object per timer: one wheel of its own per set, driven by
the scheduler's one wake-up. Within a wake-up, handles run first, then each keyed set in
creation order; each keeps due order, ties in arming order.
"""
from __future__ import annotations

import asyncio
import contextvars
import math
from typing import Any, Callable, Optional

from .._common import _refuse_copy
from .._aio_common import (
    HAS_UNCANCEL,
    IN_BATCH,
    KEY_LIMIT,
    KEY_MIN,
    MAX_DUE_MS,
    NO_WAKE,
    check_callback,
    check_key,
    check_seconds,
    check_slack,
    deadline_error,
    default_clock_slack_s,
    floor_ms,
)
from .wheel import TimerWheel

__all__ = ["KeyedTimers", "WheelHandle", "WheelScheduler", "WheelTimeout"]

_INF = math.inf
_ceil = math.ceil

class WheelHandle:
    """A callback armed on a :class:`WheelScheduler`; mirrors ``asyncio.TimerHandle``.

    Shares ``cancel()``, ``cancelled()`` and ``when()`` with ``asyncio.TimerHandle`` and
    adds ``reschedule(delay)``, the in-place re-arm an idle timeout does on each message.
    Create handles with :meth:`WheelScheduler.call_later` / :meth:`WheelScheduler.call_at`.
    """

    __slots__ = ("_scheduler", "_token", "_timer_id", "_when", "_callback", "_args", "_context",
                 "_cancelled", "__weakref__")

    def __init__(self, scheduler: WheelScheduler, when_s: float, callback: Callable[..., Any],
                 args: tuple, context: contextvars.Context) -> None:
        self._scheduler = scheduler
        self._token = 0     # the wheel token: key of scheduler._handles while armed
        self._timer_id = 0  # the wheel's id while armed; 0 once run, cancelled or never armed
        self._when = when_s
        self._callback: Any = callback  # None once cancelled
        self._args: Any = args
        self._context = context
        self._cancelled = False

    def when(self) -> float:
        """The deadline in loop-clock seconds (``loop.time()`` units), as asyncio's ``when()``.

        The callback runs at the first wake-up whose loop time is at or after it plus the
        scheduler's ``clock_slack_s``.
        """
        return self._when

    def get_context(self) -> contextvars.Context:
        """The context the callback runs in (as ``asyncio.Handle.get_context``, 3.12+)."""
        return self._context

    def cancelled(self) -> bool:
        """True once :meth:`cancel` was called (or the scheduler closed) before a run."""
        return self._cancelled

    def cancel(self) -> None:
        """Cancel the callback; a no-op if it is already cancelled.

        Safe from any callback, including one in the same fire batch: a handle cancelled
        by an earlier callback of the batch does not run. Frees the wheel entry at once.
        """
        if not self._cancelled:
            self._cancelled = True
            self._scheduler._disarm(self)
            self._callback = None
            self._args = None

    def reschedule(self, delay: float) -> bool:
        """Re-arm in place to run ``delay`` seconds from now (``loop.time() + delay``).

        Works whether the handle is pending, is due in the running fire batch (it then
        runs at the new time, not now), or has already run (it runs once more: a
        callback may re-arm itself). Keeps the handle and its callback.

        Returns:
            True if armed; False if the handle was cancelled (nothing is armed).
        Raises:
            TypeError: ``delay`` is not a real number. ValueError: it is NaN or infinite.
            RuntimeError: the scheduler is closed.
        """
        if self._cancelled:
            return False
        # The per-message path of every idle timeout: a float delay skips the full check.
        if type(delay) is not float or not -_INF < delay < _INF:
            delay = check_seconds(delay)
        scheduler = self._scheduler
        scheduler._rearm(self, scheduler._time() + delay)
        return True

    def _run(self) -> None:
        """Run the callback in its context; exceptions go to the loop's handler, as asyncio."""
        try:
            self._context.run(self._callback, *self._args)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._scheduler._loop.call_exception_handler({
                "message": f"Exception in callback {self._callback!r}{self._args!r}",
                "exception": exc,
                "handle": self,
            })

    def __repr__(self) -> str:
        state = "cancelled" if self._cancelled else f"when={self._when:.3f}"
        return f"<WheelHandle {state} {self._callback!r}>"


class WheelScheduler:
    """``call_later``/``call_at``/``timeout``/``keyed`` for an asyncio loop, on a TimerWheel.

    Args:
        loop: the event loop (default: the running loop). Works with the default loop
            and with uvloop.
        wheel_class: the wheel to drive (default: the pure twin
            ``timerwheel_c.pure.TimerWheel``; the compiled scheduler drives the compiled
            wheel). Called as ``wheel_class(now_ms=...)`` with the loop clock in integer ms.
        clock_slack_s: seconds added to every due time to cover how far ``loop.time()``
            may trail the real time (default: 0.001 or 0.002 on uvloop, whose clock is
            libuv's whole-ms loop time; else 0).

    Arming: one loop timer (``loop.call_at``) sits at the wheels' earliest
    ``next_fire_ms()``. It is moved only when a new due time is earlier than it, never
    once per timer; when it fires it advances the wheels to the loop time, runs the due
    callbacks in fire order (equal deadlines in arming order, as asyncio) and re-arms once.

    Like ``loop.call_later``, it is not thread-safe: use it from the loop's thread.

    Raises:
        RuntimeError: ``loop`` is None and no loop is running.
        TypeError / ValueError: ``clock_slack_s`` is not a finite number >= 0.
    """

    def __init__(self, loop: Optional[asyncio.AbstractEventLoop] = None, *,
                 wheel_class: Optional[Callable[..., Any]] = None,
                 clock_slack_s: Optional[float] = None) -> None:
        self._loop = asyncio.get_running_loop() if loop is None else loop
        self._time = self._loop.time
        self._slack_s = check_slack(
            default_clock_slack_s(self._loop) if clock_slack_s is None else clock_slack_s)
        self._wheel_class = TimerWheel if wheel_class is None else wheel_class
        self._wheel = self._wheel_class(now_ms=floor_ms(self._loop.time()))
        self._handles: dict[int, WheelHandle] = {}  # token -> armed handle
        self._next_token = 0
        self._keyed: list[KeyedTimers] = []
        self._wake: Optional[asyncio.TimerHandle] = None
        self._wake_ms = NO_WAKE
        self._fired: list[int] = []  # reused by every fire batch
        self._closed = False

    @property
    def clock_slack_s(self) -> float:
        """Seconds added to every due time for the loop clock's lag behind real time."""
        return self._slack_s

    def active_count(self) -> int:
        """How many handles are armed (neither run, nor cancelled); keyed timers not included.

        (Not ``__len__``: an empty scheduler must not be falsy in ``scheduler or loop``.)
        """
        return len(self._handles)

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any,
                   context: Optional[contextvars.Context] = None) -> WheelHandle:
        """Run ``callback(*args)`` ``delay`` seconds from now, like ``loop.call_later``.

        The callback runs on the loop in ``context`` (default: a copy of the current
        context, as asyncio), never before ``loop.time() + delay``. A delay of 0 or
        less runs it on the next tick (1 ms).

        Returns:
            a :class:`WheelHandle`.
        Raises:
            TypeError: ``delay`` is not a real number, or ``callback`` is not a plain
                callable. ValueError: ``delay`` is NaN or infinite, or beyond the wheel's
                range (2**62 ms). RuntimeError: the scheduler is closed.
        """
        return self.call_at(self._time() + check_seconds(delay), callback, *args,
                            context=context)

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any,
                context: Optional[contextvars.Context] = None) -> WheelHandle:
        """Run ``callback(*args)`` at loop time ``when`` (seconds), like ``loop.call_at``.

        Raises the same exceptions as :meth:`call_later` (``when`` for ``delay``).
        """
        if self._closed:
            raise RuntimeError("WheelScheduler is closed")
        check_callback(callback, "call_at")
        when = check_seconds(when, "when")
        handle = WheelHandle(self, when, callback, args,
                             contextvars.copy_context() if context is None else context)
        self._rearm(handle, when)
        return handle

    def timeout(self, delay: Optional[float]) -> WheelTimeout:
        """An ``async with`` block cancelled after ``delay`` seconds, like ``asyncio.timeout``.

        ``None`` disarms it. On expiry the task is cancelled and the block raises
        ``TimeoutError`` (the builtin). Re-arm it with :meth:`WheelTimeout.reschedule`.

        Raises:
            TypeError / ValueError: ``delay`` is not a finite real number (or None).
        """
        return WheelTimeout(self, delay)

    def keyed(self, callback: Callable[[int], Any], *,
              context: Optional[contextvars.Context] = None) -> KeyedTimers:
        """A set of timers named by int keys, each firing ``callback(key)``, with no handle per timer.

        The callback runs on the loop in ``context`` (default: a copy of the current context,
        taken now), with the guarantees of :meth:`call_later`: never early, due order, ties
        in arming order.

        Raises:
            TypeError: ``callback`` is not a plain callable. RuntimeError: the scheduler is closed.
        """
        if self._closed:
            raise RuntimeError("WheelScheduler is closed")
        check_callback(callback, "keyed")
        keyed = KeyedTimers(self, callback,
                            contextvars.copy_context() if context is None else context)
        self._keyed.append(keyed)
        return keyed

    def close(self) -> None:
        """Cancel every armed handle and keyed timer and the wake-up; later arming raises RuntimeError.

        Idempotent. Safe from inside a callback: the rest of the batch does not run.
        """
        if self._closed:
            return
        self._closed = True
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        handles, self._handles = self._handles, {}
        for handle in handles.values():
            handle._cancelled = True
            handle._timer_id = 0
            handle._callback = None
            handle._args = None
        # A running batch (_on_wake) holds this same dict: emptied, its later pops find
        # nothing, so the rest of the batch is skipped quietly.
        handles.clear()
        for keyed in self._keyed:
            keyed._clear()
        self._keyed = []
        self._wheel = None

    def __reduce_ex__(self, protocol):
        _refuse_copy(self)

    # -- internals: arming a timer and the one loop wake-up ---------------------------

    def _due_ms(self, when_s: float) -> int:
        """The due ms of a deadline ``when_s`` (loop seconds), never early in float.

        The deadline plus the clock slack, rounded up, and bumped if float rounding left it
        early, so due_ms / 1000 >= due_s holds in float.
        """
        due_s = when_s + self._slack_s
        due_ms = _ceil(due_s * 1000.0)
        if due_ms / 1000.0 < due_s:
            due_ms += 1
        if due_ms > MAX_DUE_MS:
            raise deadline_error(when_s)
        return due_ms

    def _after_ms(self, wheel: Any, due_ms: int) -> int:
        """``due_ms`` as a delay on ``wheel``'s clock. While a wheel holds nothing its clock is
        caught up to the loop first, so a new timer lands in the slots, not in the overflow."""
        if not len(wheel):
            self._advance(wheel, floor_ms(self._time()), None)
        return due_ms - wheel.now_ms()

    def _rearm(self, handle: WheelHandle, when_s: float) -> None:
        """Arm ``handle`` at loop time ``when_s``: in place if pending, else under a new token."""
        if self._closed:
            raise RuntimeError("WheelScheduler is closed")
        due_ms = self._due_ms(when_s)
        handle._when = when_s
        handles = self._handles
        after_ms = self._after_ms(self._wheel, due_ms)
        timer_id = handle._timer_id
        # A pending handle moves in place. One that ran, or is due in the running batch
        # (its wheel timer already fired), gets a fresh token: the batch skips the old.
        if not timer_id or not self._wheel.reschedule(timer_id, after_ms):
            if timer_id:
                del handles[handle._token]
            token = self._next_token = self._next_token + 1
            handle._token = token
            handle._timer_id = self._wheel.schedule(after_ms, token)
            handles[token] = handle
        if due_ms < self._wake_ms:
            self._arm_wake(due_ms)

    def _disarm(self, handle: WheelHandle) -> None:
        if handle._timer_id:
            del self._handles[handle._token]
            self._wheel.cancel(handle._timer_id)
            handle._timer_id = 0

    @staticmethod
    def _advance(wheel: Any, now_ms: int, fired: Optional[list]) -> None:
        """Advance ``wheel`` to ``now_ms`` (never backwards), appending due tokens to ``fired``."""
        if now_ms > wheel.now_ms():
            if fired is None:
                wheel.advance(now_ms)
            else:
                wheel.advance(now_ms, fired)

    def _arm_wake(self, due_ms: int) -> None:
        """Move the one loop wake-up to ``due_ms``; aimed so the wake-up sees ``due_ms``."""
        if self._wake is not None:
            self._wake.cancel()
        at_s = due_ms / 1000.0
        if floor_ms(at_s) < due_ms:  # float rounding put it a hair early
            at_s = math.nextafter(at_s, math.inf)
        self._wake_ms = due_ms
        self._wake = self._loop.call_at(at_s, self._on_wake)

    def _on_wake(self) -> None:
        """Advance the wheels to the loop time and run every due callback, then re-arm once."""
        self._wake = None
        self._wake_ms = IN_BATCH
        now_ms = floor_ms(self._time())
        try:
            self._run_handles(now_ms)
            for keyed in self._keyed:
                if self._closed:
                    break
                keyed._run(now_ms)
        finally:
            self._end_batch()

    def _run_handles(self, now_ms: int) -> None:
        """Advance the handles' wheel to ``now_ms`` and run the due handles in fire order."""
        fired = self._fired
        self._advance(self._wheel, now_ms, fired)
        handles = self._handles
        ran = 0
        try:
            for token in fired:
                ran += 1
                handle = handles.pop(token, None)
                # None: cancelled or re-armed by an earlier callback in this batch.
                if handle is not None:
                    handle._timer_id = 0
                    handle._run()
        finally:
            self._requeue(fired, ran)

    def _requeue(self, fired: list[int], ran: int) -> None:
        """Keep the handles a SystemExit/KeyboardInterrupt skipped: they are already due, so
        they go back after 1 ms, in order, and none is lost."""
        if not self._closed:
            wheel = self._wheel
            for token in fired[ran:]:
                handle = self._handles.get(token)
                if handle is not None:
                    handle._timer_id = wheel.schedule(1, token)
        fired.clear()

    def _end_batch(self) -> None:
        """Re-arm the wake-up once, at the earliest due time of any wheel."""
        self._wake_ms = NO_WAKE
        if self._closed:
            return
        # next_fire_ms() may be a lower bound; a wake-up that finds nothing re-arms.
        wake_ms = NO_WAKE
        for wheel in [self._wheel] + [keyed._wheel for keyed in self._keyed]:
            if len(wheel):
                wake_ms = min(wake_ms, max(wheel.next_fire_ms(), wheel.now_ms() + 1))
        if wake_ms != NO_WAKE:
            self._arm_wake(wake_ms)


class KeyedTimers:
    """Timers named by int keys, all firing one callback: :meth:`WheelScheduler.keyed`.

    One timer per key at most: ``arm(key, delay)`` arms it, or re-arms it in place. Firing
    calls ``callback(key)`` on the loop in the context captured by ``keyed()``; an exception
    goes to the loop's exception handler, as asyncio's callbacks. Keys are ints in
    [-2**63, 2**63) (a connection id, a file descriptor). No object is made per timer.
    """

    __slots__ = ("_scheduler", "_wheel", "_callback", "_context", "_entries", "_keys",
                 "_next_token", "_fired")

    def __init__(self, scheduler: WheelScheduler, callback: Callable[[int], Any],
                 context: contextvars.Context) -> None:
        self._scheduler = scheduler
        self._wheel = scheduler._wheel_class(now_ms=floor_ms(scheduler._time()))
        self._callback = callback
        self._context = context
        self._entries: dict[int, list] = {}  # key -> [timer_id, token, when_s]
        self._keys: dict[int, int] = {}      # token -> key, while its timer is armed or due
        self._next_token = 0
        self._fired: list[int] = []

    def arm(self, key: int, delay: float) -> None:
        """Arm ``key`` to fire ``delay`` seconds from now (``loop.time() + delay``), never earlier.

        Re-arms in place if ``key`` is armed (also when it is due in the running batch: it then
        fires at the new time, not now). A delay of 0 or less fires on the next tick (1 ms).

        Raises:
            TypeError: ``key`` is not an int or ``delay`` not a real number. ValueError:
                ``key`` outside [-2**63, 2**63), ``delay`` NaN or infinite or beyond the
                wheel's range (2**62 ms). RuntimeError: the scheduler is closed.
        """
        if type(key) is not int or not KEY_MIN <= key < KEY_LIMIT:
            key = check_key(key)
        if type(delay) is not float or not -_INF < delay < _INF:
            delay = check_seconds(delay)
        scheduler = self._scheduler
        if scheduler._closed:
            raise RuntimeError("WheelScheduler is closed")
        when_s = scheduler._time() + delay
        due_ms = scheduler._due_ms(when_s)
        wheel = self._wheel
        after_ms = scheduler._after_ms(wheel, due_ms)
        entry = self._entries.get(key)
        if entry is None:
            token = self._next_token = self._next_token + 1
            self._entries[key] = [wheel.schedule(after_ms, token), token, when_s]
            self._keys[token] = key
        else:
            entry[2] = when_s
            if not wheel.reschedule(entry[0], after_ms):
                # Due in the running batch: a fresh token, so the batch skips the old one.
                del self._keys[entry[1]]
                token = self._next_token = self._next_token + 1
                entry[0] = wheel.schedule(after_ms, token)
                entry[1] = token
                self._keys[token] = key
        if due_ms < scheduler._wake_ms:
            scheduler._arm_wake(due_ms)

    def cancel(self, key: int) -> bool:
        """Disarm ``key``. Returns True if it was armed (its callback will not run), else False.

        Raises:
            TypeError / ValueError: ``key`` is not an int in [-2**63, 2**63).
        """
        key = check_key(key)
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        del self._keys[entry[1]]
        self._wheel.cancel(entry[0])
        return True

    def when(self, key: int) -> Optional[float]:
        """The deadline of ``key`` in loop-clock seconds, or None if it is not armed.

        Raises:
            TypeError / ValueError: ``key`` is not an int in [-2**63, 2**63).
        """
        entry = self._entries.get(check_key(key))
        return None if entry is None else entry[2]

    def __contains__(self, key: object) -> bool:
        """True if ``key`` is armed (pending, or due in the running batch and not yet run)."""
        return check_key(key) in self._entries

    def __len__(self) -> int:
        """How many keys are armed."""
        return len(self._entries)

    def _run(self, now_ms: int) -> None:
        """Advance this set's wheel to ``now_ms`` and fire the due keys in fire order."""
        fired = self._fired
        self._scheduler._advance(self._wheel, now_ms, fired)
        keys, entries = self._keys, self._entries
        ran = 0
        try:
            for token in fired:
                ran += 1
                key = keys.pop(token, None)
                # None: cancelled or re-armed by an earlier callback in this batch.
                if key is not None:
                    del entries[key]
                    self._fire(key)
        finally:
            if not self._scheduler._closed:
                for token in fired[ran:]:
                    key = keys.get(token)
                    if key is not None:
                        entries[key][0] = self._wheel.schedule(1, token)
            fired.clear()

    def _fire(self, key: int) -> None:
        """Run ``callback(key)`` in the set's context; exceptions go to the loop's handler."""
        try:
            self._context.run(self._callback, key)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._scheduler._loop.call_exception_handler({
                "message": f"Exception in callback {self._callback!r}({key!r})",
                "exception": exc,
            })

    def _clear(self) -> None:
        """Drop every key (the scheduler closes); the running batch then finds none."""
        self._entries.clear()
        self._keys.clear()

    def __repr__(self) -> str:
        return f"<KeyedTimers armed={len(self._entries)} {self._callback!r}>"

    def __reduce_ex__(self, protocol):
        _refuse_copy(self)


class WheelTimeout:
    """The ``async with`` block of :meth:`WheelScheduler.timeout`; mirrors ``asyncio.Timeout``.

    On expiry it cancels the current task; on exit it turns that cancellation into the
    builtin ``TimeoutError``. Where ``Task.uncancel`` exists (Python 3.11+) a cancel
    from elsewhere that arrives meanwhile still propagates as ``CancelledError``, as in
    ``asyncio.timeout``; on 3.9/3.10 the two cannot be told apart.

    Unlike ``asyncio.Timeout.reschedule(when)``, :meth:`reschedule` takes a relative
    ``delay`` in seconds: it is the per-message re-arm of an idle timeout.
    """

    __slots__ = ("_scheduler", "_delay", "_handle", "_task", "_cancelling", "_state")

    def __init__(self, scheduler: WheelScheduler, delay: Optional[float]) -> None:
        self._scheduler = scheduler
        self._delay = None if delay is None else check_seconds(delay)
        self._handle: Optional[WheelHandle] = None
        self._task: Optional[asyncio.Task] = None
        self._cancelling = 0
        self._state = "created"

    def when(self) -> Optional[float]:
        """The deadline in loop-clock seconds, or None when disarmed or not yet entered."""
        handle = self._handle
        return None if handle is None or handle.cancelled() else handle.when()

    def expired(self) -> bool:
        """True once the deadline passed and the task was cancelled."""
        return self._state in ("expiring", "expired")

    def reschedule(self, delay: Optional[float]) -> None:
        """Move the deadline to ``delay`` seconds from now; ``None`` disarms it.

        Before the block is entered it replaces the initial delay.

        Raises:
            RuntimeError: the timeout already expired or the block exited.
            TypeError / ValueError: ``delay`` is not a finite real number (or None).
        """
        if self._state not in ("created", "entered"):
            raise RuntimeError(f"cannot reschedule a {self._state} timeout")
        if delay is not None:
            delay = check_seconds(delay)
        if self._state == "created":
            self._delay = delay
        elif delay is None:
            if self._handle is not None:
                self._handle.cancel()
                self._handle = None
        elif self._handle is not None:
            self._handle.reschedule(delay)
        else:
            self._handle = self._scheduler.call_later(delay, self._on_timeout)

    async def __aenter__(self) -> WheelTimeout:
        if self._state != "created":
            raise RuntimeError("timeout has already been entered")
        # The scheduler's loop, named: current_task() would look the running loop up first.
        task = asyncio.current_task(self._scheduler._loop)
        if task is None:
            raise RuntimeError("timeout() must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling() if HAS_UNCANCEL else 0
        self._state = "entered"
        if self._delay is not None:
            self._handle = self._scheduler.call_later(self._delay, self._on_timeout)
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._state == "expiring":
            self._state = "expired"
            task: Any = self._task
            outside_cancels = task.uncancel() > self._cancelling if HAS_UNCANCEL else False
            if exc_type is asyncio.CancelledError and not outside_cancels:
                raise TimeoutError from exc
        else:
            self._state = "exited"

    def _on_timeout(self) -> None:
        task: Any = self._task
        task.cancel()
        self._state = "expiring"
        self._handle = None

    def __repr__(self) -> str:
        return f"<WheelTimeout [{self._state}] when={self.when()}>"


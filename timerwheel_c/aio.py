"""asyncio timers driven by one TimerWheel: ``WheelScheduler`` and its ``timeout()``.

Public sources: asyncio's ``TimerHandle``/``call_later``/``asyncio.timeout`` (the API
mirrored here), the hashed timing wheel (:class:`timerwheel_c.TimerWheel`, after
Varghese & Lauck and Netty's HashedWheelTimer), and the single-deadline reactor arming
of tokio's time driver: the loop holds ONE timer, at the wheel's earliest due time,
however many handles are pending. ``docs/DESIGN.md`` ("asyncio integration") gives the design.

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
"""
from __future__ import annotations

import asyncio
import contextvars
import inspect
import math
import numbers
import sys
import time
from typing import Any, Callable, Optional

from . import TimerWheel

__all__ = ["WheelHandle", "WheelScheduler", "WheelTimeout"]

# Wake-up sentinels for ``WheelScheduler._wake_ms`` (an int ms otherwise): no wake-up
# is armed, so any due time arms one; a fire batch is running and re-arms once at its
# end, so no due time arms one (both are plain ``due_ms < _wake_ms`` comparisons).
_NO_WAKE = 1 << 63
_IN_BATCH = -1
# The wheel refuses due times beyond 2**62 ms (TimerWheel's range check).
_MAX_DUE_MS = 1 << 62
_INF = math.inf
_ceil = math.ceil
# Linux's CLOCK_MONOTONIC_COARSE, which the time module does not name.
_CLOCK_MONOTONIC_COARSE = 6
# Task.uncancel() (3.11+) tells the timeout's own cancel from one sent from elsewhere.
_HAS_UNCANCEL = sys.version_info >= (3, 11)


def _floor_ms(now_s: float) -> int:
    """Largest integer ms ``n`` with ``n / 1000 <= now_s`` (float-exact, not assumed)."""
    now_ms = math.floor(now_s * 1000.0)
    if now_ms / 1000.0 > now_s:
        now_ms -= 1
    elif (now_ms + 1) / 1000.0 <= now_s:
        now_ms += 1
    return now_ms


def _is_uvloop(loop: Any) -> bool:
    return type(loop).__module__.partition(".")[0] == "uvloop"


def _uvloop_clock_slack_s() -> float:
    """How far uvloop's ``loop.time()`` may trail the real monotonic time, in seconds.

    It is libuv's loop time: whole ms (floored: < 1 ms behind) read from libuv's "fast"
    clock, which on Linux is CLOCK_MONOTONIC_COARSE whenever that ticks every 1 ms or
    finer (then up to one tick more behind), else CLOCK_MONOTONIC (libuv uv__hrtime).
    """
    slack_s = 0.001
    if sys.platform.startswith("linux"):
        try:
            coarse_s = time.clock_getres(_CLOCK_MONOTONIC_COARSE)
        except OSError:
            coarse_s = 0.0
        if coarse_s <= 0.001:
            slack_s += coarse_s
    return slack_s


def _check_seconds(value: Any, name: str = "delay") -> float:
    """``value`` in seconds as a finite float; TypeError / ValueError naming it otherwise.

    Any real number (int, float, numpy scalars) but bool is accepted, as asyncio does.
    """
    if type(value) is not float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a real number of seconds, got {value!r}")
        try:
            value = float(value)
        except OverflowError:
            raise ValueError(f"{name} must be finite, got {value!r} seconds") from None
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r} seconds")
    return value


def _check_callback(callback: Any, method: str) -> None:
    if not callable(callback):
        raise TypeError(f"a callable object was expected by {method}(), got {callback!r}")
    if inspect.iscoroutinefunction(callback) or inspect.iscoroutine(callback):
        raise TypeError(f"coroutines cannot be used with {method}(), got {callback!r}")


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
        self._callback: Any = callback  # None once run or cancelled
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
            delay = _check_seconds(delay)
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
    """``call_later``/``call_at``/``timeout`` for an asyncio loop, on one TimerWheel.

    Args:
        loop: the event loop (default: the running loop). Works with the default loop
            and with uvloop.
        wheel_class: the wheel to drive (default :class:`timerwheel_c.TimerWheel`; pass
            ``timerwheel_c.pure.TimerWheel`` to pin the pure twin). Called as
            ``wheel_class(now_ms=...)`` with the loop clock in integer ms.
        clock_slack_s: seconds added to every due time to cover how far ``loop.time()``
            may trail the real time (default: 0.001 or 0.002 on uvloop, whose clock is
            libuv's whole-ms loop time, see ``_uvloop_clock_slack_s``; else 0).

    Arming: one loop timer (``loop.call_at``) sits at the wheel's ``next_fire_ms()``. It
    is moved only when a new due time is earlier than it, never once per timer; when
    it fires it advances the wheel to the loop time, runs the due callbacks in fire
    order (equal deadlines in arming order, as asyncio) and re-arms once.

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
        if clock_slack_s is None:
            clock_slack_s = _uvloop_clock_slack_s() if _is_uvloop(self._loop) else 0.0
        self._slack_s = _check_seconds(clock_slack_s, "clock_slack_s")
        if self._slack_s < 0:
            raise ValueError(f"clock_slack_s must be >= 0, got {clock_slack_s!r}")
        # The wheel's clock in ms, mirrored here (it moves only in _advance).
        self._now_ms = _floor_ms(self._loop.time())
        self._wheel = (TimerWheel if wheel_class is None else wheel_class)(now_ms=self._now_ms)
        self._handles: dict[int, WheelHandle] = {}  # token -> armed handle
        self._next_token = 0
        self._wake: Optional[asyncio.TimerHandle] = None
        self._wake_ms = _NO_WAKE
        self._fired: list[int] = []  # reused by every fire batch
        self._closed = False

    @property
    def clock_slack_s(self) -> float:
        """Seconds added to every due time for the loop clock's lag behind real time."""
        return self._slack_s

    def active_count(self) -> int:
        """How many handles are armed (neither run, nor cancelled), as the wheel's count.

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
        return self.call_at(self._loop.time() + _check_seconds(delay), callback, *args,
                            context=context)

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any,
                context: Optional[contextvars.Context] = None) -> WheelHandle:
        """Run ``callback(*args)`` at loop time ``when`` (seconds), like ``loop.call_at``.

        Raises the same exceptions as :meth:`call_later` (``when`` for ``delay``).
        """
        if self._closed:
            raise RuntimeError("WheelScheduler is closed")
        _check_callback(callback, "call_at")
        when = _check_seconds(when, "when")
        handle = WheelHandle(self, when, callback, args,
                             contextvars.copy_context() if context is None else context)
        self._rearm(handle, when)
        return handle

    def timeout(self, delay: Optional[float]) -> WheelTimeout:
        """An ``async with`` block cancelled after ``delay`` seconds, like ``asyncio.timeout``.

        ``None`` disarms it. On expiry the task is cancelled and the block raises
        ``TimeoutError`` (the builtin). Re-arm it with :meth:`WheelTimeout.reschedule`.
        """
        return WheelTimeout(self, delay)

    def close(self) -> None:
        """Cancel every armed handle and the wake-up; later calls raise RuntimeError.

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
        self._wheel = None

    # -- internals: arming a handle and the one loop wake-up ------------------------

    def _rearm(self, handle: WheelHandle, when_s: float) -> None:
        """Arm ``handle`` at loop time ``when_s``: in place if pending, else under a new token."""
        if self._closed:
            raise RuntimeError("WheelScheduler is closed")
        # The due ms: the deadline plus the clock slack, rounded up, and bumped if float
        # rounding left it early, so due_ms / 1000 >= due_s holds in float (inline: this
        # is the per-message path).
        due_s = when_s + self._slack_s
        due_ms = _ceil(due_s * 1000.0)
        if due_ms / 1000.0 < due_s:
            due_ms += 1
        if due_ms > _MAX_DUE_MS:
            raise ValueError(f"deadline {when_s!r} s is beyond the wheel's range (2**62 ms)")
        handle._when = when_s
        handles = self._handles
        # The wheel's clock moves only on wake-ups. While it holds nothing, catch it up to
        # the loop so a new timer lands in the slots rather than in the overflow.
        if not handles:
            self._advance(_floor_ms(self._loop.time()), None)
        after_ms = due_ms - self._now_ms
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

    def _advance(self, now_ms: int, fired: Optional[list]) -> None:
        """Advance the wheel to ``now_ms`` (never backwards), appending due tokens to ``fired``."""
        if now_ms > self._now_ms:
            if fired is None:
                self._wheel.advance(now_ms)
            else:
                self._wheel.advance(now_ms, fired)
            self._now_ms = now_ms

    def _arm_wake(self, due_ms: int) -> None:
        """Move the one loop wake-up to ``due_ms``; aimed so the wake-up sees ``due_ms``."""
        if self._wake is not None:
            self._wake.cancel()
        at_s = due_ms / 1000.0
        if _floor_ms(at_s) < due_ms:  # float rounding put it a hair early
            at_s = math.nextafter(at_s, math.inf)
        self._wake_ms = due_ms
        self._wake = self._loop.call_at(at_s, self._on_wake)

    def _on_wake(self) -> None:
        """Advance the wheel to the loop time and run every due callback, then re-arm once."""
        self._wake = None
        self._wake_ms = _IN_BATCH
        fired = self._fired
        self._advance(_floor_ms(self._loop.time()), fired)
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
            self._end_batch(fired, ran)

    def _end_batch(self, fired: list[int], ran: int) -> None:
        """Re-arm the wake-up once; keep the tokens a SystemExit/KeyboardInterrupt skipped."""
        self._wake_ms = _NO_WAKE
        if self._closed:
            fired.clear()
            return
        wheel = self._wheel
        # A BaseException escaped a callback: the batch's remaining handles are already
        # due; put them back (after 1 ms, in order) so none is lost.
        for token in fired[ran:]:
            handle = self._handles.get(token)
            if handle is not None:
                handle._timer_id = wheel.schedule(1, token)
        fired.clear()
        if self._handles:
            # next_fire_ms() may be a lower bound; a wake-up that finds nothing re-arms.
            self._arm_wake(max(wheel.next_fire_ms(), self._now_ms + 1))


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
        self._delay = None if delay is None else _check_seconds(delay)
        self._handle: Optional[WheelHandle] = None
        self._task: Any = None  # the task entered in, an asyncio.Task
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
            delay = _check_seconds(delay)
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
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("timeout() must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling() if _HAS_UNCANCEL else 0
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
            outside_cancels = self._task.uncancel() > self._cancelling if _HAS_UNCANCEL else False
            if exc_type is asyncio.CancelledError and not outside_cancels:
                raise TimeoutError from exc
        else:
            self._state = "exited"

    def _on_timeout(self) -> None:
        self._task.cancel()
        self._state = "expiring"
        self._handle = None

    def __repr__(self) -> str:
        return f"<WheelTimeout [{self._state}] when={self.when()}>"


"""asyncio timers driven by one TimerWheel: ``WheelScheduler``, its ``timeout()`` and its
``keyed()`` timers. The pure-Python twin of ``src/_aio.pyx``: class by class and method by
method in the same order (the compiled module's ``c_*`` C-level methods have a private method
here where the Python methods need one: ``c_reschedule`` is ``_reschedule``, ``c_cancel`` is
``_cancel``, ``KeyedTimers.c_arm`` is ``_arm``), with the same internals but for the key table,
which is a dict here. The design comment at the top of ``src/_aio.pyx`` (tokens, references,
reentrancy) holds for both.

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
creation order; each keeps due order, ties in arming order. The scheduler holds its sets weakly,
and strongly only while a set has a key armed, as it holds a handle only while armed: a set
dropped with no key armed is freed, one dropped with keys armed fires them, then is freed.
"""
from __future__ import annotations

import asyncio
import contextvars
import math
import weakref
from typing import Any, Callable, Optional

from .._common import _refuse_copy
from .._aio_common import (
    HAS_UNCANCEL,
    IN_BATCH,
    KEY_LIMIT,
    KEYED_SWEEP_MIN,
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
_U64_LIMIT = 1 << 64

# Task states of WheelTimeout, in the order of asyncio.Timeout's.
T_CREATED, T_ENTERED, T_EXPIRING, T_EXPIRED, T_EXITED = range(5)
_STATE_NAMES = ("created", "entered", "expiring", "expired", "exited")


# A handle's wheel token is its index in the scheduler's ``_handles`` list, which holds it from
# its arming until it runs or is cancelled (index 0 stays unused: 0 is no token, as 0 is no timer
# id); freed indexes are reused last-freed first. (Module functions, as in the compiled core, where
# the event loop's timer store shares them: src/_aio_tokens.pxi.)


def _take_token(handles: list[Any], free_tokens: list[int], handle: Any) -> int:
    """Put ``handle`` in ``handles`` at a free index (the last freed, else a new one) and
    return it."""
    if not handles:
        # The collector cleared the list: its scheduler is garbage and a finalizer arms.
        handles.append(None)
        free_tokens.clear()
    if free_tokens:
        token = free_tokens.pop()
        handles[token] = handle
        return token
    handles.append(handle)
    return len(handles) - 1


def _give_token(handles: list[Any], free_tokens: list[int], token: int, handle: Any) -> None:
    """Free index ``token`` if ``handle`` is still there (not after a drain or the collector's clear)."""
    if 0 < token < len(handles) and handles[token] is handle:
        free_tokens.append(token)
        handles[token] = None


def _token_handle(handles: list[Any], token: int) -> Any:
    """The handle at index ``token``, or None (a freed or dropped index)."""
    return handles[token] if token < len(handles) else None


def _drop_tokens(wheel: Any, handles: list[Any], free_tokens: list[int]) -> list[Any]:
    """Empty ``wheel`` (every pending timer fires at the end of time, its token dropped) and
    ``handles``, and return the handles it held (no None), to reset once nothing names them: dropping a
    reference may run Python code (a finalizer that arms again)."""
    if len(wheel):
        wheel.advance(MAX_DUE_MS)
    detached = [handle for handle in handles if handle is not None]
    del handles[1:]
    free_tokens.clear()
    return detached


def _as_seconds(value: Any, name: str) -> float:
    """``check_seconds`` with the finite float first: the per-message path of every re-arm."""
    if type(value) is float and -_INF < value < _INF:
        return value
    return check_seconds(value, name)


class WheelHandle:
    """A callback armed on a :class:`WheelScheduler`; mirrors ``asyncio.TimerHandle``.

    Shares ``cancel()``, ``cancelled()``, ``when()`` and ``get_context()`` with
    ``asyncio.TimerHandle`` and adds ``reschedule(delay)``, the in-place re-arm an idle
    timeout does on each message. Create handles with :meth:`WheelScheduler.call_later` /
    :meth:`WheelScheduler.call_at`.
    """

    __slots__ = ("_scheduler", "_callback", "_args", "_context", "_when", "_timer_id", "_token")
    _scheduler: WheelScheduler
    _callback: Any            # None once cancelled
    _args: Any
    _context: Optional[contextvars.Context]  # None for a WheelTimeout's expiry handle
    _when: float
    _timer_id: int            # the wheel's id while armed or due in the running batch, else 0
    _token: int               # its index in the scheduler's _handles (its wheel token), or 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("WheelHandle objects are made by WheelScheduler.call_later() and call_at()")

    def when(self) -> float:
        """The deadline in loop-clock seconds (``loop.time()`` units), as asyncio's ``when()``.

        The callback runs at the first wake-up whose loop time is at or after it plus the
        scheduler's ``clock_slack_s``.
        """
        return self._when

    def get_context(self) -> Optional[contextvars.Context]:
        """The context the callback runs in (as ``asyncio.Handle.get_context``, 3.12+)."""
        return self._context

    def cancelled(self) -> bool:
        """True once :meth:`cancel` was called (or the scheduler closed) before a run."""
        return self._callback is None

    def cancel(self) -> None:
        """Cancel the callback; a no-op if it is already cancelled.

        Safe from any callback, including one in the same fire batch: a handle cancelled
        by an earlier callback of the batch does not run. Frees the wheel entry at once.
        """
        if self._callback is not None:
            self._scheduler._cancel(self)

    def reschedule(self, delay: float) -> bool:
        """Re-arm in place to run ``delay`` seconds from now (``loop.time() + delay``).

        Works whether the handle is pending, is due in the running fire batch (it then
        runs at the new time, not now), or has already run (it runs once more: a
        callback may re-arm itself). Keeps the handle and its callback. A move to the same or
        a later time writes the deadline alone (the wheel entry stays, and is re-filed when it
        comes due), so among callbacks due at its new ms it runs in the order it was re-filed.

        Returns:
            True if armed; False if the handle was cancelled (nothing is armed).
        Raises:
            TypeError: ``delay`` is not a real number. ValueError: it is NaN or infinite.
            RuntimeError: the scheduler is closed.
        """
        if self._callback is None:
            return False
        return self._scheduler._reschedule(self, _as_seconds(delay, "delay"))

    def __repr__(self) -> str:
        state = "cancelled" if self._callback is None else f"when={self._when:.3f}"
        return f"<WheelHandle {state} {self._callback!r}>"


def _run_handle(handle: WheelHandle) -> None:
    """Run a handle's callback in its context; exceptions go to the loop's handler, as asyncio."""
    try:
        if handle._context is None:  # a WheelTimeout's expiry: its callback is the timeout
            handle._callback._expire()
        else:
            handle._context.run(handle._callback, *handle._args)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        handle._scheduler._loop.call_exception_handler({
            "message": f"Exception in callback {handle._callback!r}{handle._args!r}",
            "exception": exc,
            "handle": handle,
        })


class WheelScheduler:
    """``call_later``/``call_at``/``timeout``/``timeout_at``/``keyed`` for an asyncio loop, on a
    TimerWheel.

    Args:
        loop: the event loop (default: the running loop). Works with the default loop
            and with uvloop.
        wheel_class: the wheel to drive (default: the pure twin
            ``timerwheel_c.pure.TimerWheel``; the compiled scheduler drives the compiled
            wheel). Called as ``wheel_class(now_ms=...)`` with the loop clock in integer ms.
        clock_slack_s: seconds added to every due time to cover how far ``loop.time()``
            may trail the real time (default: 0.001 or 0.002 on uvloop, whose clock is
            libuv's whole-ms loop time; else 0); at most 1 s (a lag, not a delay).

    Arming: one loop timer (``loop.call_at``) sits at the wheels' earliest
    ``next_fire_ms()``. It is moved only when a new due time is earlier than it, never
    once per timer; when it fires it advances the wheels to the loop time, runs the due
    callbacks in fire order (callbacks due in the same ms in arming order; asyncio's heap
    keeps no order among equal deadlines) and re-arms once.

    Like ``loop.call_later``, it is not thread-safe: use it from the loop's thread.

    Raises:
        RuntimeError: ``loop`` is None and no loop is running.
        TypeError / ValueError: ``clock_slack_s`` is not a number of seconds in [0, 1].
    """

    def __init__(self, loop: Optional[asyncio.AbstractEventLoop] = None, *,
                 wheel_class: Optional[Callable[..., Any]] = None,
                 clock_slack_s: Optional[float] = None) -> None:
        if getattr(self, "_loop", None) is not None:
            raise RuntimeError("WheelScheduler.__init__ called on a scheduler already in use")
        self._loop = asyncio.get_running_loop() if loop is None else loop
        self._time = self._loop.time
        self._slack_s = check_slack(
            default_clock_slack_s(self._loop) if clock_slack_s is None else clock_slack_s)
        self._wheel_class = TimerWheel if wheel_class is None else wheel_class
        now_ms = floor_ms(self._time())
        # The loop's ms that is every wheel's 0 ms: 0, unless the loop's clock went below 0 (a
        # wheel's ms are >= 0).
        self._origin_ms = now_ms - 1 if now_ms < 0 else 0
        self._behind = False  # a timer was armed due before its wheel's ms (the loop's clock went back)
        self._wheel = self._wheel_class(now_ms=now_ms - self._origin_ms)
        self._handles: list[Optional[WheelHandle]] = [None]  # token -> handle; 0 is no token
        self._free_tokens: list[int] = []  # the free indexes of _handles, a stack
        # Weak references to the keyed sets, in creation order; the sets holding armed keys, strongly.
        self._keyed: list[weakref.ref[KeyedTimers]] = []
        self._keyed_sweep_at = 0  # the length of _keyed at which its dead references are swept
        self._armed_keyed: set[KeyedTimers] = set()
        self._wake: Optional[asyncio.Handle] = None  # a TimerHandle, or a Handle at the next turn
        self._wake_ms = NO_WAKE
        self._closed = False

    @property
    def clock_slack_s(self) -> float:
        """Seconds added to every due time for the loop clock's lag behind real time."""
        return self._slack_s

    def active_count(self) -> int:
        """How many handles are armed (neither run, nor cancelled); keyed timers not included.

        (Not ``__len__``: an empty scheduler must not be falsy in ``scheduler or loop``.)
        """
        return len(self._wheel)

    def __sizeof__(self) -> int:
        """Bytes of the scheduler and its wheel (``TimerWheel.nbytes()``); handles are objects of their own."""
        return object.__sizeof__(self) + self._wheel.nbytes()

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
        delay_s = _as_seconds(delay, "delay")
        self._check_call(callback)
        return self._call_at(self._time() + delay_s, callback, args, context)

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any,
                context: Optional[contextvars.Context] = None) -> WheelHandle:
        """Run ``callback(*args)`` at loop time ``when`` (seconds), like ``loop.call_at``.

        Raises the same exceptions as :meth:`call_later` (``when`` for ``delay``).
        """
        self._check_call(callback)
        return self._call_at(_as_seconds(when, "when"), callback, args, context)

    def timeout(self, delay: Optional[float]) -> WheelTimeout:
        """An ``async with`` block cancelled ``delay`` seconds from now, as ``asyncio.timeout``.

        The deadline is ``loop.time() + delay``, taken now, as asyncio takes it; ``None``
        never expires. On expiry the task is cancelled and the block raises ``TimeoutError``
        (the builtin). Move the deadline with :meth:`WheelTimeout.reschedule` (loop time, as
        asyncio's) or :meth:`WheelTimeout.reschedule_after` (a delay).

        Raises:
            TypeError / ValueError: ``delay`` is not a finite real number (or None).
        """
        t = WheelTimeout.__new__(WheelTimeout)
        t._init(self, None if delay is None else self._time() + _as_seconds(delay, "delay"))
        return t

    def timeout_at(self, when: Optional[float]) -> WheelTimeout:
        """An ``async with`` block cancelled at loop time ``when`` (seconds), as
        ``asyncio.timeout_at``; ``None`` never expires.

        Raises:
            TypeError / ValueError: ``when`` is not a finite real number (or None).
        """
        t = WheelTimeout.__new__(WheelTimeout)
        t._init(self, None if when is None else _as_seconds(when, "when"))
        return t

    def keyed(self, callback: Callable[[int], Any], *,
              context: Optional[contextvars.Context] = None) -> KeyedTimers:
        """A set of timers named by int keys, each firing ``callback(key)``, with no handle per timer.

        The callback runs on the loop in ``context`` (default: a copy of the current context,
        taken now), with the guarantees of :meth:`call_later`: never early, due order, ties
        in arming order. The scheduler holds the set only while a key is armed: dropped with
        none armed, it is freed; dropped with keys armed, they still fire.

        Raises:
            TypeError: ``callback`` is not a plain callable. RuntimeError: the scheduler is closed.
        """
        if self._closed:
            raise RuntimeError("WheelScheduler is closed")
        check_callback(callback, "keyed")
        keyed = KeyedTimers.__new__(KeyedTimers)
        keyed._scheduler = self
        keyed._callback = callback
        keyed._context = contextvars.copy_context() if context is None else context
        keyed._wheel = self._wheel_class(now_ms=max(floor_ms(self._time()) - self._origin_ms, 0))
        keyed._entries = {}
        if len(self._keyed) >= self._keyed_sweep_at:
            # The references of the sets freed since are swept (a new list: a batch may be walking
            # this one), so the list stays within twice the live sets.
            self._keyed = [ref for ref in self._keyed if ref() is not None]
            self._keyed_sweep_at = 2 * len(self._keyed) + KEYED_SWEEP_MIN
        self._keyed.append(weakref.ref(keyed))
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
        self._drain()
        refs, self._keyed = self._keyed, []
        for ref in refs:
            keyed = ref()
            if keyed is not None:
                keyed._clear()
        # Last: a set dropped with keys armed is freed here, which may run Python code.
        self._armed_keyed = set()

    # -- the compiled twin's C-level API, where the Python methods need it -------------------

    def _reschedule(self, handle: WheelHandle, delay_s: float) -> bool:
        """``handle.reschedule(delay_s)`` (``c_reschedule``): False if it is cancelled.

        Raises:
            ValueError: ``handle`` is another scheduler's.
        """
        if handle._callback is None:
            return False
        if handle._scheduler is not self:
            raise ValueError(f"{handle!r} belongs to another WheelScheduler")
        when_s = self._time() + delay_s
        # A pending handle (or one due in the running batch) moved to the same or a later deadline
        # keeps its wheel entry, due earlier: only its deadline changes, and the handle is the one
        # object touched. When the entry fires, the batch re-files it by this deadline (_fire).
        if handle._timer_id != 0 and when_s >= handle._when:
            self._due_ms(when_s)  # the range check
            handle._when = when_s
            return True
        self._arm_handle(handle, when_s)
        return True

    def _cancel(self, handle: WheelHandle) -> None:
        """``handle.cancel()`` (``c_cancel``).

        Raises:
            ValueError: ``handle`` is another scheduler's.
        """
        if handle._callback is None:
            return
        if handle._scheduler is not self:
            raise ValueError(f"{handle!r} belongs to another WheelScheduler")
        self._disarm(handle)
        handle._callback = None
        handle._args = None

    # -- internals: arming a timer and the one loop wake-up ---------------------------

    def _check_call(self, callback: Any) -> None:
        """RuntimeError if closed; TypeError unless ``callback`` is a plain callable."""
        if self._closed:
            raise RuntimeError("WheelScheduler is closed")
        check_callback(callback, "call_at")

    def _call_at(self, when_s: float, callback: Callable[..., Any], args: tuple,
                 context: Optional[contextvars.Context]) -> WheelHandle:
        """A new handle for ``callback(*args)`` at loop time ``when_s``, armed."""
        handle = WheelHandle.__new__(WheelHandle)
        handle._scheduler = self
        handle._callback = callback
        handle._args = args
        handle._context = contextvars.copy_context() if context is None else context
        handle._timer_id = 0
        handle._token = 0
        self._arm_handle(handle, when_s)
        return handle

    def _due_ms(self, when_s: float) -> int:
        """The due ms of a deadline ``when_s`` (loop seconds), never early in float.

        The deadline plus the clock slack, rounded up, and bumped if float rounding left it
        early, so due_ms / 1000 >= due_s holds in float; counted from the wheels' origin (the
        loop's 0 ms, unless its clock went below 0). A deadline before the origin counts as due
        at 0, which arms the wake-up at once (:meth:`_arm_wake`).

        Raises:
            ValueError: the due time is beyond 2**62 ms.
        """
        due_s = when_s + self._slack_s
        scaled = due_s * 1000.0
        if not scaled <= MAX_DUE_MS:
            raise deadline_error(when_s)
        if scaled < self._origin_ms:
            return 0
        due_ms = _ceil(scaled)
        if due_ms / 1000.0 < due_s:
            due_ms += 1
        due_ms -= self._origin_ms
        if due_ms > MAX_DUE_MS:
            raise deadline_error(when_s)
        return due_ms

    def _follow_clock(self, loop_ms: int) -> int:
        """The wheels' ms of the loop's ms ``loop_ms``. A loop clock gone back before a wheel's time
        (a patched or virtual clock: ``mock.patch``, looptime), or below the wheels' origin, takes the
        wheels back with it: each timer is filed again by its deadline, in its old wheel's fire order
        (equal deadlines keep their order), as ``EventLoop`` does, and as asyncio's heap needs no
        telling. Without it a timer armed after the step fired once the clock came back to the
        wheel's time, late by the whole step."""
        rebase = loop_ms < self._origin_ms
        if rebase:
            self._origin_ms = loop_ms - 1  # the ms before: timers due now fire in this batch
        now_ms = loop_ms - self._origin_ms
        # A wheel at or past stale_ms is refiled: one after now_ms; back at its very ms too if a timer was
        # armed meanwhile (clamped to the ms after, it is owed now).
        stale_ms = now_ms if self._behind else now_ms + 1
        self._behind = False
        if rebase or self._wheel.now_ms() >= stale_ms:
            self._refile_handles(now_ms)
        for ref in self._keyed:
            keyed = ref()
            if keyed is not None and (rebase or keyed._wheel.now_ms() >= stale_ms):
                keyed._refile(now_ms)
        return now_ms

    def _refile_handles(self, now_ms: int) -> None:
        """File every armed handle again on a new wheel whose time is the ms before ``now_ms``."""
        old, wheel = self._wheel, self._wheel_class(now_ms=max(now_ms - 1, 0))
        try:
            for token in old.advance(MAX_DUE_MS):
                handle = _token_handle(self._handles, token)
                if handle is not None and handle._timer_id:
                    handle._timer_id = wheel.schedule(_refiled_ms(self, handle._when) - wheel.now_ms(), token)
        finally:
            self._wheel = wheel

    def _after_ms(self, wheel: Any, due_ms: int) -> int:
        """``due_ms`` as a delay on ``wheel``'s clock. While a wheel holds nothing its clock is
        caught up to the loop first, so a new timer lands in the slots, not in the overflow."""
        if not len(wheel):
            now_ms = floor_ms(self._time()) - self._origin_ms
            if now_ms > wheel.now_ms():
                wheel.advance(now_ms)
        if due_ms < wheel.now_ms():  # the clock went back: filed at the ms after the wheel's, for now
            self._behind = True
        return due_ms - wheel.now_ms()

    def _arm_handle(self, handle: WheelHandle, when_s: float) -> None:
        """Arm ``handle`` at loop time ``when_s``: in place if pending, else as a new wheel entry
        whose token is the handle's index in ``_handles``."""
        wheel = self._wheel
        if self._closed:
            raise RuntimeError("WheelScheduler is closed")
        due_ms = self._due_ms(when_s)
        # The wake-up first: a loop.call_at that raises (asyncio's debug check of the calling
        # thread) then leaves the handle as it was, armed or not.
        if due_ms < self._wake_ms:
            self._arm_wake(due_ms)
        after_ms = self._after_ms(wheel, due_ms)
        handle._when = when_s
        # A pending handle moves in place. One that ran, or is due in the running batch
        # (its wheel timer already fired), gets a new entry: the batch skips the old one.
        if handle._timer_id == 0 or not wheel.reschedule(handle._timer_id, after_ms):
            if handle._token == 0:
                handle._token = _take_token(self._handles, self._free_tokens, handle)
            handle._timer_id = wheel.schedule(after_ms, handle._token)

    def _disarm(self, handle: WheelHandle) -> None:
        """Take ``handle`` out of the wheel (if pending there) and out of ``_handles``."""
        timer_id, token = handle._timer_id, handle._token
        handle._timer_id = handle._token = 0
        if timer_id:
            self._wheel.cancel(timer_id)
        _give_token(self._handles, self._free_tokens, token, handle)

    def _arm_wake(self, due_ms: int) -> None:
        """Move the one loop wake-up to ``due_ms``; aimed so the wake-up sees ``due_ms``. A due ms of
        0 (at or before the wheels' origin) wakes at the loop's next turn: the loop's clock may lie
        below the origin (it went back), and the wake-up then follows it (:meth:`_follow_clock`)."""
        loop_ms = due_ms + self._origin_ms
        at_s = loop_ms / 1000.0
        if floor_ms(at_s) < loop_ms:  # float rounding put it a hair early
            at_s = math.nextafter(at_s, math.inf)
        # The new wake-up before the old one goes: if loop.call_at raises, the old one and its
        # _wake_ms stand, so no timer is left without a wake-up that _wake_ms claims is armed.
        # Due at 0, at the next turn, not at a time: the clock may go back further before then.
        wake = self._loop.call_soon(self._on_wake) if due_ms == 0 else self._loop.call_at(at_s, self._on_wake)
        if self._wake is not None:
            self._wake.cancel()
        self._wake_ms = due_ms
        self._wake = wake

    def _on_wake(self) -> None:
        """Advance the wheels to the loop time and run every due callback, then re-arm once."""
        self._wake = None
        self._wake_ms = IN_BATCH
        try:
            now_ms = self._follow_clock(floor_ms(self._time()))
            self._run_handles(now_ms)
            for ref in self._keyed:
                if self._closed:
                    break
                keyed = ref()
                if keyed is not None:
                    keyed._run(now_ms)
        finally:
            self._end_batch()

    def _run_handles(self, now_ms: int) -> None:
        """Advance the handles' wheel to ``now_ms`` and run the due handles in fire order."""
        wheel = self._wheel
        if now_ms <= wheel.now_ms():
            return
        fired = wheel.advance(now_ms)  # this batch's own list: a nested batch gets another
        i = 0
        try:
            _order_batch(self, _handle_due, fired)
            while i < len(fired):
                i += 1
                self._fire(fired[i - 1], now_ms)
        finally:
            self._requeue(fired, i)

    def _fire(self, token: int, now_ms: int) -> None:
        """Run the handle a fired ``token`` names, if it is due at ``now_ms``; re-file it by its
        deadline if that moved later while its entry waited."""
        handle = _token_handle(self._handles, token)
        # None: cancelled by an earlier callback of this batch, or closed; pending: re-armed by
        # one, or a new handle at a reused index.
        if handle is None or handle._timer_id == 0 or self._wheel.due_ms(handle._timer_id) is not None:
            return
        due_ms = self._due_ms(handle._when)
        if due_ms > now_ms:
            handle._timer_id = self._wheel.schedule(due_ms - self._wheel.now_ms(), token)
            return
        handle._timer_id = 0
        _give_token(self._handles, self._free_tokens, token, handle)
        handle._token = 0
        _run_handle(handle)

    def _requeue(self, fired: list[int], start: int) -> None:
        """Keep the handles a SystemExit/KeyboardInterrupt skipped (tokens from ``start`` on): each
        goes back at its due time, the next tick at the earliest, in order, and none is lost."""
        for token in fired[start:]:
            handle = _token_handle(self._handles, token)
            if (not self._closed and handle is not None and handle._timer_id
                    and self._wheel.due_ms(handle._timer_id) is None):
                # It keeps its index; a delay under 1 ms counts as 1.
                handle._timer_id = self._wheel.schedule(
                    self._due_ms(handle._when) - self._wheel.now_ms(), token)

    def _end_batch(self) -> None:
        """Re-arm the wake-up once, at the earliest due time of any wheel."""
        self._wake_ms = NO_WAKE
        if self._closed:
            return
        # next_fire_ms() may be a lower bound; a wake-up that finds nothing re-arms.
        wake_ms = _next_wake(self._wheel, NO_WAKE)
        for ref in self._keyed:
            keyed = ref()
            if keyed is not None:
                wake_ms = _next_wake(keyed._wheel, wake_ms)
        if wake_ms != NO_WAKE:
            self._arm_wake(wake_ms)

    def _drain(self) -> None:
        """Cancel every armed handle (and any due in the running batch): empty the wheel, then
        ``_handles``, detached first, as clearing a callback may run Python code."""
        for handle in _drop_tokens(self._wheel, self._handles, self._free_tokens):
            handle._timer_id = handle._token = 0
            handle._callback = handle._args = None

    def __reduce_ex__(self, protocol):
        _refuse_copy(self)


def _order_batch(owner: Any, due_of: Callable[[Any, int, int], int], fired: list[int]) -> None:
    """Put a batch of ``owner``'s tokens in due order (stable). A timer re-armed later in place
    fires from its earlier wheel entry, and is re-filed then; but when the loop woke after its new
    due time as well, it is due, and belongs among the timers of that due time.

    ``due_of(owner, token, last)`` is the due ms of a token's timer, or ``last`` if it names none.
    """
    last = 0
    for token in fired:
        due = due_of(owner, token, last)
        if due < last:
            break
        last = due
    else:
        return
    dues = []
    last = 0
    for i, token in enumerate(fired):
        last = due_of(owner, token, last)
        dues.append((last, i))
    fired[:] = [fired[i] for _, i in sorted(dues)]


def _handle_due(scheduler: WheelScheduler, token: int, last: int) -> int:
    """``_order_batch``'s ``due_of`` for a WheelScheduler's handles: the deadline's due ms."""
    handle = _token_handle(scheduler._handles, token)
    if handle is None:
        return last
    return scheduler._due_ms(handle._when)


def _refiled_ms(scheduler: WheelScheduler, when_s: float) -> int:
    """The due ms a timer is filed again at when the wheels follow the clock: its deadline's, or the
    wheels' last ms for one the new origin puts past their range (a deadline within the origin's
    distance of 2**62 ms, some 146 million years: no loop's clock reaches either)."""
    try:
        return scheduler._due_ms(when_s)
    except ValueError:
        return MAX_DUE_MS


def _next_wake(wheel: Any, wake_ms: int) -> int:
    """The earlier of ``wake_ms`` and the wake-up ``wheel`` needs, if it holds timers."""
    if not len(wheel):
        return wake_ms
    at_ms = wheel.next_fire_ms()
    if at_ms <= wheel.now_ms():
        at_ms = wheel.now_ms() + 1
    return at_ms if at_ms < wake_ms else wake_ms


class WheelTimeout:
    """The ``async with`` block of :meth:`WheelScheduler.timeout` and
    :meth:`WheelScheduler.timeout_at`; mirrors ``asyncio.Timeout``.

    On expiry it cancels the current task; on exit it turns that cancellation into the
    builtin ``TimeoutError``. Where ``Task.uncancel`` exists (Python 3.11+) a cancel
    from elsewhere that arrives meanwhile still propagates as ``CancelledError``, as in
    ``asyncio.timeout``; on 3.9/3.10 the two cannot be told apart.

    As asyncio's, :meth:`when` and :meth:`reschedule` speak absolute loop time; the
    per-message re-arm of an idle timeout is :meth:`reschedule_after` (a delay).

    Args:
        scheduler: the :class:`WheelScheduler` whose wheel holds the expiry.
        when: the deadline in loop seconds (``loop.time()`` units), or None: never expires.
    """

    __slots__ = ("_scheduler", "_when", "_handle", "_task", "_cancelling", "_state")

    def __init__(self, scheduler: WheelScheduler, when: Optional[float]) -> None:
        if not isinstance(scheduler, WheelScheduler):
            raise TypeError(f"scheduler must be a WheelScheduler, not {type(scheduler).__name__}")
        self._init(scheduler, None if when is None else _as_seconds(when, "when"))

    def _init(self, scheduler: WheelScheduler, when: Optional[float]) -> None:
        self._scheduler = scheduler
        self._when = when
        self._handle: Optional[WheelHandle] = None
        self._task: Any = None
        self._cancelling = 0
        self._state = T_CREATED

    def when(self) -> Optional[float]:
        """The deadline in loop-clock seconds, or None if it never expires (as asyncio's)."""
        return self._when

    def expired(self) -> bool:
        """True once the deadline passed and the task was cancelled."""
        return self._state == T_EXPIRING or self._state == T_EXPIRED

    def reschedule(self, when: Optional[float]) -> None:
        """Move the deadline to loop time ``when`` (seconds), as ``asyncio.Timeout.reschedule``;
        ``None`` disarms it. A deadline already passed expires on the next tick (1 ms).

        Unlike asyncio's (3.12+), it may also be called before the block is entered: it then
        replaces the initial deadline.

        Raises:
            RuntimeError: the timeout already expired or the block exited.
            TypeError / ValueError: ``when`` is not a finite real number (or None).
        """
        self._reschedule(None if when is None else _as_seconds(when, "when"))

    def reschedule_after(self, delay: Optional[float]) -> None:
        """Move the deadline to ``delay`` seconds from now (``loop.time() + delay``); ``None``
        disarms it. The per-message re-arm of an idle timeout; asyncio has no such method.

        Raises:
            as :meth:`reschedule` (``delay`` for ``when``).
        """
        if delay is None:
            self._reschedule(None)
        else:
            delay_s = _as_seconds(delay, "delay")
            self._reschedule(self._scheduler._time() + delay_s)

    def _reschedule(self, when: Optional[float]) -> None:
        """``reschedule(when)`` for a checked ``when`` (a float or None)."""
        if self._state != T_CREATED and self._state != T_ENTERED:
            raise RuntimeError(f"cannot reschedule a {_STATE_NAMES[self._state]} timeout")
        if self._state == T_ENTERED:  # armed first: a deadline refused leaves when() as it was
            if when is None:
                self._disarm()
            elif self._handle is not None:
                self._scheduler._arm_handle(self._handle, when)
            else:
                self._arm(when)
        self._when = when

    def _arm(self, when_s: float) -> None:
        """Arm the expiry at loop time ``when_s``, as a handle that runs in no context."""
        scheduler = self._scheduler
        if scheduler._closed:
            raise RuntimeError("WheelScheduler is closed")
        handle = WheelHandle.__new__(WheelHandle)
        handle._scheduler = scheduler
        handle._callback = self  # with no context: _run_handle calls _expire()
        handle._args = ()
        handle._context = None
        handle._timer_id = 0
        handle._token = 0
        scheduler._arm_handle(handle, when_s)
        self._handle = handle

    async def __aenter__(self) -> WheelTimeout:
        if self._state != T_CREATED:
            raise RuntimeError("timeout has already been entered")
        # The scheduler's loop, named: current_task() would look the running loop up first.
        task = asyncio.current_task(self._scheduler._loop)
        if task is None:
            raise RuntimeError("timeout() must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling() if HAS_UNCANCEL else 0
        self._state = T_ENTERED
        if self._when is not None:
            self._arm(self._when)
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        self._disarm()
        if self._state == T_EXPIRING:
            self._state = T_EXPIRED
            outside_cancels = self._task.uncancel() > self._cancelling if HAS_UNCANCEL else False
            if exc_type is asyncio.CancelledError and not outside_cancels:
                raise TimeoutError from exc
        else:
            self._state = T_EXITED

    def _expire(self) -> None:
        """The deadline passed: cancel the task (the block's exit turns it into TimeoutError)."""
        self._task.cancel()
        self._state = T_EXPIRING
        self._handle = None

    def _disarm(self) -> None:
        """Cancel the expiry handle, if any."""
        handle = self._handle
        if handle is not None:
            self._handle = None
            handle._scheduler._cancel(handle)

    def __repr__(self) -> str:
        return f"<WheelTimeout [{_STATE_NAMES[self._state]}] when={self.when()}>"


def _key_due(keyed: KeyedTimers, token: int, last: int) -> int:
    """``_order_batch``'s ``due_of`` for a KeyedTimers: the key's deadline's due ms."""
    entry = keyed._entries.get(_key_of(token))
    if entry is None:
        return last
    return keyed._scheduler._due_ms(entry[1])


def _as_key(key: Any) -> int:
    """``key`` as an int64: exact ints inline, anything else through ``check_key``."""
    if type(key) is int and KEY_MIN <= key < KEY_LIMIT:
        return key
    return check_key(key)


def _key_of(token: int) -> int:
    """The key a wheel token names (the key's two's complement, as the compiled twin casts it)."""
    return token - _U64_LIMIT if token >= KEY_LIMIT else token


class KeyedTimers:
    """Timers named by int keys, all firing one callback: :meth:`WheelScheduler.keyed`.

    One timer per key at most: ``arm(key, delay)`` arms it, or re-arms it in place. Firing
    calls ``callback(key)`` on the loop in the context captured by ``keyed()``; an exception
    goes to the loop's exception handler, as asyncio's callbacks. Keys are ints in
    [-2**63, 2**63) (a connection id, a file descriptor). No object is made per timer.
    """

    __slots__ = ("_scheduler", "_wheel", "_callback", "_context", "_entries", "__weakref__")
    _scheduler: WheelScheduler
    _wheel: Any               # tokens are the keys (their two's complement)
    _callback: Callable[[int], Any]
    _context: contextvars.Context
    _entries: dict[int, list]  # key -> [timer id, deadline in loop seconds]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("KeyedTimers objects are made by WheelScheduler.keyed()")

    def arm(self, key: int, delay: float) -> None:
        """Arm ``key`` to fire ``delay`` seconds from now (``loop.time() + delay``), never earlier.

        Re-arms in place if ``key`` is armed (also when it is due in the running batch: it then
        fires at the new time, not now). A delay of 0 or less fires on the next tick (1 ms). A
        re-arm to the same or a later time writes the deadline alone (the wheel entry stays, and
        is re-filed when it comes due), so among keys due at its new ms it fires in the order it
        was re-filed.

        Raises:
            TypeError: ``key`` is not an int or ``delay`` not a real number. ValueError:
                ``key`` outside [-2**63, 2**63), ``delay`` NaN or infinite or beyond the
                wheel's range (2**62 ms). RuntimeError: the scheduler is closed.
        """
        self._arm(_as_key(key), _as_seconds(delay, "delay"))

    def cancel(self, key: int) -> bool:
        """Disarm ``key``. Returns True if it was armed (its callback will not run), else False.

        Raises:
            TypeError / ValueError: ``key`` is not an int in [-2**63, 2**63).
        """
        return self._cancel(_as_key(key))

    def when(self, key: int) -> Optional[float]:
        """The deadline of ``key`` in loop-clock seconds, or None if it is not armed.

        Raises:
            TypeError / ValueError: ``key`` is not an int in [-2**63, 2**63).
        """
        entry = self._entries.get(_as_key(key))
        return None if entry is None else entry[1]

    def __contains__(self, key: object) -> bool:
        """True if ``key`` is armed (pending, or due in the running batch and not yet run)."""
        return _as_key(key) in self._entries

    def __len__(self) -> int:
        """How many keys are armed."""
        return len(self._entries)

    def __sizeof__(self) -> int:
        """Bytes of the set: the object, its key table and its wheel (``TimerWheel.nbytes()``)."""
        return object.__sizeof__(self) + self._entries.__sizeof__() + self._wheel.nbytes()

    # -- the compiled twin's C-level API, where the Python methods need it -------------------

    def _arm(self, key: int, delay_s: float) -> None:
        """``arm(key, delay_s)`` (``c_arm``).

        Raises:
            ValueError: ``delay_s`` is beyond the wheel's range. RuntimeError: the scheduler
                is closed.
        """
        scheduler = self._scheduler
        wheel = self._wheel
        if scheduler._closed:
            raise RuntimeError("WheelScheduler is closed")
        when_s = scheduler._time() + delay_s
        due_ms = scheduler._due_ms(when_s)
        if due_ms < scheduler._wake_ms:  # first, as for a handle: see WheelScheduler._arm_handle
            scheduler._arm_wake(due_ms)
        entry = self._entries.get(key)  # [timer id, deadline in loop seconds]
        if entry is not None and when_s >= entry[1]:
            # The same or a later deadline: the key keeps its wheel entry, due earlier, and only
            # its deadline changes (one table slot touched); when the entry fires, _run re-files
            # the key by this deadline. So does a key due in the running batch.
            entry[1] = when_s
            return
        after_ms = scheduler._after_ms(wheel, due_ms)
        if not self._entries:
            # Its first key: the scheduler holds the set while a key is armed.
            scheduler._armed_keyed.add(self)
        if entry is not None:
            if not wheel.reschedule(entry[0], after_ms):
                # Due in the running batch: a new entry; the batch skips the old token.
                entry[0] = wheel.schedule(after_ms, key % _U64_LIMIT)
            entry[1] = when_s
        else:
            self._entries[key] = [wheel.schedule(after_ms, key % _U64_LIMIT), when_s]

    def _cancel(self, key: int) -> bool:
        """``cancel(key)`` (``c_cancel``): True if it was armed."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        self._wheel.cancel(entry[0])
        if not self._entries:
            self._emptied()
        return True

    def _run(self, now_ms: int) -> None:
        """Advance this set's wheel to ``now_ms`` and fire the due keys in fire order."""
        wheel = self._wheel
        if now_ms <= wheel.now_ms():
            return
        fired = wheel.advance(now_ms)
        entries = self._entries
        i = 0
        try:
            _order_batch(self, _key_due, fired)
            while i < len(fired):
                key = _key_of(fired[i])
                i += 1
                entry = entries.get(key)
                # Absent: cancelled by an earlier callback of this batch; pending: re-armed by one.
                if entry is None or wheel.due_ms(entry[0]) is not None:
                    continue
                due_ms = self._scheduler._due_ms(entry[1])
                if due_ms > now_ms:  # re-armed later while its entry waited: re-filed, not run
                    entry[0] = wheel.schedule(due_ms - wheel.now_ms(), fired[i - 1])
                    continue
                del entries[key]
                if not entries:
                    self._emptied()
                self._fire(key)
        finally:
            # A SystemExit/KeyboardInterrupt skipped the rest: back at their due times, the next
            # tick at the earliest (a delay under 1 ms counts as 1), in order.
            while i < len(fired):
                key = _key_of(fired[i])
                i += 1
                entry = entries.get(key)
                if entry is not None and wheel.due_ms(entry[0]) is None:
                    entry[0] = wheel.schedule(
                        self._scheduler._due_ms(entry[1]) - wheel.now_ms(), fired[i - 1])

    def _refile(self, now_ms: int) -> None:
        """File every armed key again on a new wheel whose time is the ms before ``now_ms`` (see
        ``WheelScheduler._follow_clock``)."""
        old, wheel = self._wheel, self._scheduler._wheel_class(now_ms=max(now_ms - 1, 0))
        try:
            for token in old.advance(MAX_DUE_MS):
                entry = self._entries.get(_key_of(token))
                if entry is not None:
                    entry[0] = wheel.schedule(_refiled_ms(self._scheduler, entry[1]) - wheel.now_ms(), token)
        finally:
            self._wheel = wheel

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

    def _emptied(self) -> None:
        """Its last armed key is gone: the scheduler lets go of the set, which its owner may have
        dropped (the caller holds it, so it is not freed here)."""
        self._scheduler._armed_keyed.discard(self)

    def __repr__(self) -> str:
        return f"<KeyedTimers armed={len(self._entries)} {self._callback!r}>"

    def __reduce_ex__(self, protocol):
        _refuse_copy(self)

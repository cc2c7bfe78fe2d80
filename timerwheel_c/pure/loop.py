"""The event loop's timers on a timing wheel: ``LoopTimers`` and its ``TimerHandle``, and the
methods ``EventLoop`` takes from here (``time``, ``call_at``, ``call_later``, ``call_soon``). The pure-Python twin
of ``src/_loop.pyx``, in the same order.

:class:`timerwheel_c.loop.EventLoop` keeps every timer it makes (``call_at``, ``call_later``, so
``asyncio.sleep``, ``wait_for``, ``asyncio.timeout``, stream and library timeouts) here instead
of on asyncio's heap, and asks this store the two things asyncio's ``_run_once`` asks its heap
(CPython ``Lib/asyncio/base_events.py``): how long the selector may wait, and which handles are
due, to be appended to the ready queue.

The clock. The wheel counts integer ms of the loop's own clock (``loop.time()`` * 1000), read at
every call, so a patched ``loop.time`` or ``time.monotonic`` and the virtual clocks built on them
(looptime, aiotools' VirtualClock) move these timers as they move asyncio's; should that clock go
back before the wheel's time, the wheel follows it (each armed timer filed again by its deadline).
An iteration at loop time ``now`` moves every timer whose deadline is at or before ``now`` (or
NaN), or lies in the wheel's current ms before ``now + loop._clock_resolution`` (1 ns unless a
virtual clock sets more), as asyncio's ``_run_once`` moves its heap's, and no other: a deadline
is a rounded sum, and a clock moving in whole ticks (looptime) stops on a float 1 ulp below it. A deadline at or before ``loop.time()`` when it is armed (``call_later(0)``,
``call_later(-1)``, ``call_at(loop.time())``, NaN) is due now: the wheel's ``schedule_at`` files
it at the wheel's current ms, and the next iteration moves it, between the callbacks already
ready and the ones they queue. Any other timer with deadline ``when`` sits in the ms it lies in,
``d = floor(when * 1000)`` (float-exact). An iteration advances the wheel to its own ms,
``floor(now * 1000)``: the timers of earlier ms are all due (``when < (d + 1) / 1000 <= now``);
those of the current ms not yet due are held, filed again at the wheel's current ms, and the
selector waits exactly until the earliest of them (asyncio on epoll rounds its wait up to whole
ms). With none held, the selector's timeout is "until the start of the earliest occupied ms".

Order, as asyncio's heap: the handles moved in one iteration go to the ready queue by deadline,
equal deadlines in scheduling order (a sort by deadline, then arming order). They run after the callbacks already ready, and what they ``call_soon``
runs on the next iteration, exactly as in ``_run_once``.

Cancel is O(1) and frees the wheel entry at once: nothing is left to sweep, unlike the heap's
cancelled handles (aiohttp#8608). The handle ``call_at`` armed last for a later ms waits outside the
wheel until the store next reads the wheel or ``call_at`` arms another (``_wait``, ``_flush``), so
one cancelled before then (an ``asyncio.timeout`` block that ends in time) never enters it. A deadline past the wheel's range (2**62 ms, about 146 million
years of loop time, or ``inf``) is filed in the wheel's last ms, where it is held as any
not-yet-due timer of the current ms is once the clock gets there: listed in ``loop._scheduled``,
cancellable, and never run before the loop's time reaches it (``inf`` never), as on asyncio's heap.

Contexts, as asyncio's: a handle armed without one runs in a copy of its own of the context
current at arming, which ``get_context()`` answers. This twin copies at arming. The compiled one
copies when the handle first runs or is asked for its context, from a snapshot it shares among
the handles armed while the current context's variables stay the same (a copy is an object
freed with the handle, and most timers are cancelled unrun); the snapshot, never entered, is
dropped at each iteration, so no variable's value outlives its handles by more than one.

Memory layout, which no behaviour shows: the compiled twin places its handles, their indexes in
``_handles`` and their wheel entries in arming order, not in the ones freed last (docs/DESIGN.md,
"Placement"); this twin leaves its objects to Python's allocator and its wheel's entries to the
wheel's free list.
"""
from __future__ import annotations

import asyncio
import contextvars
import math
import weakref
from asyncio import base_events
from collections import deque
from typing import Any, Callable, Optional, cast

from .._common import _refuse_copy
from .._loop_common import (
    ASYNCIO_TIME,
    MAX_DUE_MS,
    MAX_SELECT_S,
    check_when,
    due_limit,
    handle_repr,
    handle_run_hook,
    later_through_call_at,
    loop_ms,
    order_key,
    patched_asyncio_time,
    report_exception,
)
from .wheel import TimerWheel

__all__ = ["LoopTimers", "TimerHandle", "call_at", "call_later", "call_soon", "install_methods", "time"]

# A waiting handle's _timer_id: armed, and no id the wheel gives.
WAITING_ID = -1

class TimerHandle:
    """A callback armed on the loop's wheel by ``call_at``/``call_later``; answers as
    ``asyncio.TimerHandle`` does: ``when()``, ``cancel()``, ``cancelled()``, ``get_context()``.

    Not a subclass of ``asyncio.TimerHandle`` (``isinstance`` is False, as for uvloop's handles,
    uvloop#482): that class keeps the heap's bookkeeping, which a wheel timer has none of.
    """

    __slots__ = ("_timers", "_callback", "_args", "_context", "_when", "_order_s", "_seq", "_timer_id", "_token",
                 "_cancelled", "_source_traceback", "_repr", "__weakref__")

    def __init__(self, timers: LoopTimers, when_s: float, callback: Callable[..., Any], args: tuple,
                 context: contextvars.Context) -> None:
        self._timers = timers
        self._callback: Any = callback  # None once cancelled
        self._args: Any = args
        self._context = context
        self._when = when_s
        self._order_s = when_s  # its place in due order: order_key(when, loop time armed at)
        self._seq = 0  # arming order: ties of deadline run in it
        self._timer_id = 0  # the wheel's id while armed (WAITING_ID while it waits), else 0
        self._token = 0     # key of timers._handles while armed
        self._cancelled = False
        self._source_traceback: Any = None  # debug mode: where it was made, as asyncio's
        self._repr: Optional[str] = None    # debug mode: the repr frozen at cancel(), as asyncio's

    def when(self) -> float:
        """The deadline in loop-clock seconds (``loop.time()`` units), as asyncio's."""
        return self._when

    def get_context(self) -> contextvars.Context:
        """The context the callback runs in (``asyncio.Handle.get_context``)."""
        return self._context

    def cancelled(self) -> bool:
        """True once :meth:`cancel` was called."""
        return self._cancelled

    def cancel(self) -> None:
        """Cancel the callback; a no-op if already cancelled or run. O(1): the wheel entry is
        freed at once, so no cancelled handle is kept anywhere."""
        if self._cancelled:
            return
        self._cancelled = True
        if self._timers.debug:
            self._repr = handle_repr(self, True)
        self._timers._disarm(self)
        self._callback = None
        self._args = None

    def _run(self) -> None:
        """Run the callback in its context; its exception goes to the loop's handler, as asyncio."""
        try:
            self._context.run(self._callback, *self._args)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            report_exception(self, self._timers._owner(), exc)

    @property
    def _loop(self) -> Any:
        return self._timers._owner()

    @property
    def _scheduled(self) -> bool:
        """True while armed, so listed in ``loop._scheduled``, as asyncio's flag of a handle on its heap."""
        return self._timer_id != 0

    def __repr__(self) -> str:
        return handle_repr(self, self._timers.debug)

    # Compared and hashed as asyncio's TimerHandle (CPython Lib/asyncio/events.py): ordered by
    # when(), equal when deadline, callback, arguments and cancellation are.
    def __hash__(self) -> int:
        return hash(self._when)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TimerHandle):
            return NotImplemented
        return (self._when == other._when and self._callback == other._callback and self._args == other._args
                and self._cancelled == other._cancelled)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, TimerHandle):
            return NotImplemented
        return self._when < other._when

    def __le__(self, other: object) -> bool:
        if not isinstance(other, TimerHandle):
            return NotImplemented
        return self._when < other._when or self.__eq__(other)

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, TimerHandle):
            return NotImplemented
        return self._when > other._when

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, TimerHandle):
            return NotImplemented
        return self._when > other._when or self.__eq__(other)

    def __reduce_ex__(self, protocol):
        _refuse_copy(self)


class LoopTimers:
    """An event loop's timers on one :class:`timerwheel_c.TimerWheel` (see the module docstring).

    Args:
        loop: the event loop; its ``time()`` is the clock.
    """

    def __init__(self, loop: Any) -> None:
        self._loop: Any = loop  # None once closed, when _loop_ref holds it instead
        self._loop_ref: Optional[weakref.ref] = None  # a weak reference to the loop once closed (see close())
        self._closed = False
        self._due_now = False  # a timer was armed due now since the last move_due
        self._held_when = math.inf  # earliest deadline waiting in the wheel's current ms (inf: none)
        self._next_seq = 0
        self.debug = False  # mirrors loop.get_debug(): cancel() then freezes the repr
        self._wheel = TimerWheel(now_ms=max(loop_ms(loop.time()), 0))
        self._handles: dict[int, TimerHandle] = {}  # token -> armed handle
        self._waiting: Optional[TimerHandle] = None  # armed last, not yet in the wheel (see _flush)
        self._next_token = 0
        self._fired: list[int] = []  # reused by every move_due

    def active_count(self) -> int:
        """How many timers are armed (neither run, moved to the ready queue, nor cancelled)."""
        self._flush()
        return len(self._handles)

    def scheduled(self) -> list:
        """The armed handles, a new list in due order: by ``when()``, equal deadlines in arming
        order, a NaN deadline placed as the loop time it was armed at."""
        self._flush()
        return sorted(self._handles.values(), key=_due_order)

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any,
                context: Optional[contextvars.Context] = None) -> TimerHandle:
        """``loop.call_at``: a new :class:`TimerHandle` for ``callback(*args)`` at loop time
        ``when`` (s), armed, in ``context`` (default: a copy of the current context).

        Raises:
            RuntimeError: the loop is closed. TypeError: from ``check_when``.
        """
        if type(when) is not float:
            when = check_when(when, "when")
        return self._call_at_when(when, callback, args, context)

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any,
                   context: Optional[contextvars.Context] = None) -> TimerHandle:
        """``loop.call_later``: ``call_at(loop.time() + delay, ...)``.

        Raises:
            as :meth:`call_at`, naming ``delay``.
        """
        if type(delay) is not float:
            delay = check_when(delay, "delay")
        now_s = self._owner().time()
        return self._call_at(now_s + delay, now_s, callback, args, context)

    def select_timeout(self, busy: bool) -> Optional[float]:
        """The selector's timeout in seconds for this iteration, as asyncio computes it:
        0 if ``busy`` (callbacks ready, or the loop stopping) or a timer is due now, None with
        no timer armed, else the time until the earliest timer fires, capped at one day."""
        if busy or self._due_now:
            return 0
        self._flush()
        if not len(self._wheel):
            return None
        now_s = self._owner().time()
        self._follow_clock(now_s)
        if self._due_now:
            return 0
        wheel = self._wheel
        if self._held_when < math.inf:  # in the current ms: before every later ms's timer
            # (capped: the wheel's last ms, past its range, holds deadlines any time later)
            return min(max(self._held_when - now_s, 0.0), MAX_SELECT_S)
        # A lower bound of the earliest due ms; a timer due in ms d is looked at once loop_ms(time) >= d.
        due_ms = wheel.next_fire_ms()
        if due_ms <= wheel.now_ms():
            if wheel.now_ms() == MAX_DUE_MS:  # the last ms holds only inf deadlines now
                return MAX_SELECT_S
            due_ms = wheel.now_ms() + 1
        wake_s = due_ms / 1000.0
        if loop_ms(wake_s) < due_ms:  # float rounding put it a hair early
            wake_s = math.nextafter(wake_s, math.inf)
        timeout_s = wake_s - now_s
        if timeout_s > MAX_SELECT_S:
            return MAX_SELECT_S
        return timeout_s if timeout_s > 0.0 else 0.0

    def move_due(self, ready: deque) -> int:
        """Append every due handle to ``ready`` (the loop's deque), in deadline order, equal
        deadlines in scheduling order. Due: its deadline is at or before ``loop.time()`` (or NaN),
        or lies in the wheel's ms before ``loop.time() + loop._clock_resolution`` (``due_limit``),
        as asyncio's ``_run_once`` moves its heap's. Returns how many were moved."""
        if self._closed:
            return 0
        self._flush()
        loop = self._owner()
        now_s = loop.time()
        self._follow_clock(now_s)
        wheel = self._wheel
        target_ms = loop_ms(now_s)
        if target_ms <= wheel.now_ms() and not self._due_now and self._held_when == math.inf:
            return 0
        due_s = due_limit(now_s, getattr(loop, "_clock_resolution", 0.0))
        if target_ms <= wheel.now_ms():
            if not (self._due_now or self._held_when <= due_s):
                return 0
            target_ms = wheel.now_ms()
        fired = self._fired
        fired.clear()
        self._due_now = False
        self._held_when = math.inf
        wheel.advance(target_ms, fired)
        batch = self._settle(fired, due_s)
        i = 0
        try:
            for handle in batch:
                ready.append(handle)
                i += 1
        finally:
            self._requeue(batch, i)
        return len(batch)

    def poll(self, selector: Any, timeout: Optional[float]) -> None:
        """``loop._process_events(selector.select(timeout))``: an iteration's I/O step, as asyncio's
        ``_run_once`` takes it (the compiled twin runs asyncio's epoll selector's ``select`` in C)."""
        self._owner()._process_events(selector.select(timeout))

    def run_ready(self, ready: deque, ntodo: int) -> int:
        """Run the next ``ntodo`` callbacks of ``ready`` (the loop's deque), and only those, as
        asyncio's ``_run_once`` does out of debug mode: each not cancelled through its ``_run()``,
        which reports its exception to the loop's handler and lets SystemExit and KeyboardInterrupt
        out, or a wheel handle through a replacement of asyncio's ``Handle._run`` (``handle_run_hook``).

        Returns:
            0; or, found in debug mode before a callback, how many are left, the first of them put
            back at the head of ``ready``, for the loop's checked path to run.
        """
        loop = self._owner()
        hooked = handle_run_hook()
        for i in range(ntodo):
            handle = ready.popleft()
            if handle._cancelled:
                continue
            if loop._debug:
                ready.appendleft(handle)
                return ntodo - i
            if hooked is None or isinstance(handle, asyncio.Handle):
                handle._run()
            else:  # a timer handle of the wheel, through asyncio's replaced Handle._run
                hooked(handle)
        return 0

    def close(self) -> None:
        """Drop every armed timer, as asyncio's close() clears its heap; later arming raises
        RuntimeError. Handles keep their state (not cancelled). Idempotent."""
        self._closed = True
        self._drain()
        if self._loop is not None:
            # The loop holds this store: held back strongly, the pair would be freed only by the
            # cyclic collector, where asyncio's closed loop goes as its last reference does.
            self._loop_ref = weakref.ref(self._loop)
            self._loop = None

    def _owner(self) -> Any:
        """The loop (None once a closed one is freed)."""
        return self._loop if self._loop_ref is None else self._loop_ref()

    def __reduce_ex__(self, protocol):
        _refuse_copy(self)

    # -- internals ----------------------------------------------------------------------------

    def _call_at_when(self, when_s: float, callback: Callable[..., Any], args: tuple,
                      context: Optional[contextvars.Context]) -> TimerHandle:
        """``call_at``: :meth:`_call_at`, reading the loop's time only where it decides anything. A
        deadline in a ms after the wheel's now is armed in that ms whatever the time: if it is
        already due, the next iteration advances the wheel to its ms and moves it, as it moves a
        due-now one, in the same order; if not, it is held until due, as ever."""
        due_ms = loop_ms(when_s)
        if when_s == when_s and due_ms > self._wheel.now_ms():
            handle = self._new_handle(when_s, when_s, callback, args, context)
            self._wait(handle, due_ms)
            return handle
        return self._call_at(when_s, self._owner().time(), callback, args, context)

    def _new_handle(self, when_s: float, order_s: float, callback: Callable[..., Any], args: tuple,
                    context: Optional[contextvars.Context]) -> TimerHandle:
        """A new, unarmed handle for ``callback(*args)`` at ``when_s``, in due order at ``order_s``.

        Raises:
            RuntimeError: the store is closed.
        """
        if self._closed:
            raise RuntimeError("Event loop is closed")
        handle = TimerHandle(self, when_s, callback, args,
                             contextvars.copy_context() if context is None else context)
        handle._order_s = order_s
        handle._seq = self._next_seq
        self._next_seq += 1
        return handle

    def _call_at(self, when_s: float, now_s: float, callback: Callable[..., Any], args: tuple,
                 context: Optional[contextvars.Context]) -> TimerHandle:
        """A new handle for ``callback`` at ``when_s``, armed: due now if ``when_s`` is at or before
        ``now_s`` (the loop's time) or NaN, as on asyncio's heap; else in the ms it lies in (held
        in the wheel's current ms if it lies there, or before: a negative loop time)."""
        handle = self._new_handle(when_s, order_key(when_s, now_s), callback, args, context)
        if not when_s > now_s:
            self._due_now = True
            self._arm(handle, self._wheel.now_ms())
            return handle
        # Past the wheel's range (inf too), in its last ms: held there until the clock passes it.
        due_ms = loop_ms(when_s)
        if due_ms < self._wheel.now_ms():
            # After now but before the wheel: the loop's clock went back (a patched clock).
            self._follow_clock(now_s)
        if due_ms <= self._wheel.now_ms():
            due_ms = self._wheel.now_ms()
            self._held_when = min(self._held_when, when_s)
        self._arm(handle, due_ms)
        return handle

    def _arm(self, handle: TimerHandle, due_ms: int) -> None:
        """Arm ``handle`` due at ``due_ms`` on the wheel (due now if not after its now), under a
        new token."""
        token = self._next_token
        self._next_token = token + 1
        handle._timer_id = self._wheel.schedule_at(due_ms, token)
        handle._token = token
        self._handles[token] = handle

    def _wait(self, handle: TimerHandle, due_ms: int) -> None:
        """Arm ``handle``, due at ``due_ms`` (after the wheel's now), to wait (see :meth:`_flush`),
        after the handle waiting goes in."""
        self._flush()
        self._waiting = handle
        handle._timer_id = WAITING_ID

    def _flush(self) -> None:
        """Put the waiting handle in the wheel, due in the ms its deadline lies in (after the wheel's
        now: every move of the wheel's now comes after a flush). Called before the wheel or
        ``_handles`` is read, so the wheel answers as if it had gone in when armed (a batch's order
        is sorted by deadline, then arming order, whatever order the wheel holds)."""
        handle = self._waiting
        if handle is None:
            return
        self._waiting = None
        self._arm(handle, loop_ms(handle._when))
        # The wheel's allocations may run the collector, whose finalizer may cancel this handle or
        # close the store while it goes in (the compiled twin runs no Python code here): undone as
        # they would have done it to a handle in the wheel.
        if handle._cancelled:
            self._disarm(handle)
        if self._closed:
            self._drain()

    def _disarm(self, handle: TimerHandle) -> None:
        """Take ``handle`` out of the wheel if armed there, or out of waiting."""
        timer_id = handle._timer_id
        handle._timer_id = 0
        if handle is self._waiting:
            self._waiting = None
        elif timer_id and self._wheel.cancel(timer_id):
            del self._handles[handle._token]

    def _follow_clock(self, now_s: float) -> None:
        """If the loop's clock went back before the wheel's time (a patched or virtual clock:
        ``mock.patch``, looptime), move the wheel back with it: every armed handle is filed again
        by its deadline, in the old wheel's fire order, so equal deadlines keep scheduling order."""
        now_ms = max(loop_ms(now_s), 0)
        old = self._wheel
        if now_ms >= old.now_ms():
            return
        self._flush()
        wheel = TimerWheel(now_ms=now_ms)
        self._held_when = math.inf
        try:
            for token in old.advance(MAX_DUE_MS):
                handle = self._handles[token]
                if handle._when > now_s:
                    due_ms = max(loop_ms(handle._when), now_ms)
                    if due_ms == now_ms:
                        self._held_when = min(self._held_when, handle._when)
                else:  # due now, NaN included
                    due_ms = now_ms
                    self._due_now = True
                handle._timer_id = wheel.schedule_at(due_ms, token)
        finally:
            self._wheel = wheel

    def _settle(self, fired: list, now_s: float) -> list:
        """The handles of a fired batch, marked unarmed and sorted by deadline then arming order;
        a token the collector's clear of ``_handles`` dropped is skipped. A handle whose deadline
        is after ``now_s`` is armed again under the same token: held at the wheel's now if its
        deadline lies in that ms, else in its own ms (armed due now by a clock that then went back:
        held in the current ms, it would hide every later ms's timer from the select timeout)."""
        handles = self._handles
        wheel = self._wheel
        batch = []
        for token in fired:
            handle = handles.get(token)
            if handle is None:
                continue
            if handle._when > now_s:
                due_ms = loop_ms(handle._when)
                if due_ms > wheel.now_ms():
                    handle._timer_id = wheel.schedule_at(due_ms, token)
                else:
                    handle._timer_id = wheel.schedule_at(wheel.now_ms(), token)
                    self._held_when = min(self._held_when, handle._when)
                continue
            del handles[token]
            handle._timer_id = 0
            batch.append(handle)
        batch.sort(key=_due_order)
        return batch

    def _requeue(self, batch: list, start: int) -> None:
        """Put back the handles an exception kept off the ready queue (from ``start``): already
        due, they are armed due now again, in order, so none is lost."""
        for handle in batch[start:]:
            if not (self._closed or handle._cancelled):
                self._due_now = True
                self._arm(handle, self._wheel.now_ms())

    def _drain(self) -> None:
        """Drop every armed handle (close)."""
        self._flush()
        handles, self._handles = self._handles, {}
        for handle in handles.values():
            self._wheel.cancel(handle._timer_id)
            handle._timer_id = 0


def _due_order(handle: TimerHandle) -> tuple:
    return (handle._order_s, handle._seq)


# EventLoop's own methods, on its class (so a patch of type(loop) sees every call, as on asyncio's
# loop); the compiled twin's have no Python frame.

def time(loop: Any) -> float:
    """``loop.time()``: asyncio's clock, ``time.monotonic()``, in seconds (a patch of
    ``time.monotonic``, or of ``time`` on asyncio's loop classes (see
    ``_loop_common.patched_asyncio_time``), is followed, as asyncio's loop follows it)."""
    if asyncio.SelectorEventLoop.time is not ASYNCIO_TIME:
        patched = patched_asyncio_time(loop, time)
        if patched is not None:
            return cast(float, patched())
    return cast(float, base_events.time.monotonic())  # type: ignore[attr-defined]  # as BaseEventLoop.time reads it


def call_at(loop: Any, when: float, callback: Callable[..., Any], *args: Any,
            context: Optional[contextvars.Context] = None) -> TimerHandle:
    """``loop.call_at``: run ``callback(*args)`` at loop time ``when`` (seconds), never before;
    at the next iteration if ``when`` is at or before ``loop.time()`` (or NaN), as asyncio.

    Returns:
        a :class:`TimerHandle`.
    Raises:
        TypeError: ``when`` is None or not a real number. RuntimeError: the loop is closed.
    """
    timers = loop._timers
    if timers.debug:
        return loop._call_at_checked(when, callback, args, context, 2)
    return timers.call_at(when, callback, *args, context=context)


def call_later(loop: Any, delay: float, callback: Callable[..., Any], *args: Any,
               context: Optional[contextvars.Context] = None) -> TimerHandle:
    """``loop.call_later``: run ``callback(*args)`` ``delay`` seconds from now (never before
    ``loop.time() + delay``; at the next iteration for a delay of 0 or less, or NaN).

    Returns:
        a :class:`TimerHandle`.
    Raises:
        TypeError: ``delay`` is None or not a real number. RuntimeError: the loop is closed.
    """
    # A call_at of the class's own or set on the loop (mock.patch.object): asyncio's call_later calls it.
    if type(loop).call_at is not call_at or "call_at" in getattr(loop, "__dict__", ()):
        return later_through_call_at(loop, delay, callback, args, context)
    timers = loop._timers
    if timers.debug:
        return loop._call_later_checked(delay, callback, args, context, 2)
    return timers.call_later(delay, callback, *args, context=context)


# ``loop.call_soon``: asyncio's own ``BaseEventLoop.call_soon``, which the compiled twin's stands for
# (it makes the same asyncio.Handle in C).
call_soon = asyncio.BaseEventLoop.call_soon


def install_methods(cls: type) -> None:
    """Give ``cls`` (EventLoop) ``time``, ``call_at``, ``call_later`` and ``call_soon`` as methods of its own. Here
    the class's functions (this module's, set in its body) stay as they are; the compiled twin
    replaces them with C methods of the class (method descriptors, as a built-in class's), which
    the interpreter calls with no function object between, accepting and raising the same.

    Raises:
        TypeError: ``cls`` is not a subclass of ``asyncio.BaseEventLoop``.
    """
    if not (isinstance(cls, type) and issubclass(cls, asyncio.BaseEventLoop)):
        raise TypeError(f"install_methods() takes a subclass of asyncio.BaseEventLoop, not {cls!r}")

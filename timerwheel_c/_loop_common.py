"""What both twins of the event loop's timer store share: the handle's repr, the report of a
callback's exception, the argument checks of ``call_at``/``call_later``, the due order of
deadlines, the read-only view ``loop._scheduled``, and a ``time`` patched on asyncio's loop classes.

All of it follows asyncio's ``events.Handle``/``TimerHandle`` and ``BaseEventLoop.call_at``
(CPython ``Lib/asyncio/events.py``, ``base_events.py``), so that a timer on the wheel reads,
logs and fails as asyncio's does. Neither twin imports the other; the compiled one
(``src/_loop.pyx``) calls these on its slow paths only.
"""
from __future__ import annotations

import asyncio
import math
import numbers
import sys
from asyncio import base_events, format_helpers
from collections.abc import Sequence
from typing import Any, cast, overload

from ._aio_common import MAX_DUE_MS, floor_ms

__all__ = ["ASYNCIO_TIME", "MAX_DUE_MS", "MAX_SELECT_S", "ScheduledView", "check_when", "due_limit", "handle_repr",
           "handle_run_hook", "later_through_call_at", "loop_ms", "order_key", "patched_asyncio_time",
           "report_exception"]

# asyncio's cap on one select() wait, in seconds (one day).
MAX_SELECT_S: float = base_events.MAXIMUM_SELECT_TIMEOUT  # type: ignore[attr-defined]
# 3.13's callback format shortens a callback's repr unless the loop is in debug mode.
_FORMAT_TAKES_DEBUG = sys.version_info >= (3, 13)


# asyncio's own BaseEventLoop.time, as imported: what the class EventLoop derives from inherits
# unless a test patched it there.
ASYNCIO_TIME = base_events.BaseEventLoop.time


def patched_asyncio_time(loop: Any, own_time: Any) -> Any:
    """The ``time`` that asyncio's selector loop class (``asyncio.SelectorEventLoop``, the class
    EventLoop derives from) has instead of ``BaseEventLoop.time``, bound to ``loop`` as
    ``loop.time`` would bind it (a function is bound, a Mock is called as it is); None when it has
    asyncio's own, or EventLoop's ``own_time``.

    EventLoop's ``time`` stands for asyncio's (the same clock, read in C), so a patch of asyncio's
    loop classes reaches it as it reaches asyncio's loop: freezegun's ``real_asyncio=True`` sets
    the real clock on ``type(asyncio.new_event_loop())`` while it freezes ``time.monotonic``, and
    tests set a fake clock on ``asyncio.BaseEventLoop.time``."""
    for klass in asyncio.SelectorEventLoop.__mro__:
        found = klass.__dict__.get("time")
        if found is not None:
            break
    if found is None or found is ASYNCIO_TIME or found is own_time:
        return None
    get = getattr(type(found), "__get__", None)
    return found if get is None else get(found, loop, type(loop))


def _format_callback(handle: Any, debug: bool) -> str:
    if _FORMAT_TAKES_DEBUG:
        return format_helpers._format_callback_source(  # type: ignore[call-arg,unused-ignore]
            handle._callback, handle._args, debug=debug)
    return format_helpers._format_callback_source(handle._callback, handle._args)


def loop_ms(t_s: float) -> int:
    """The ms a loop time ``t_s`` (seconds) lies in: the largest ``n`` with ``n / 1000 <= t_s``,
    clamped to [-1, 2**62] (a real clock is far inside it; the wheel's last ms holds every later
    deadline, held by its own value)."""
    if not t_s * 1000.0 < MAX_DUE_MS:
        return MAX_DUE_MS
    if not t_s * 1000.0 >= 0.0:
        return -1
    return floor_ms(t_s)


def due_limit(now_s: float, resolution_s: Any) -> float:
    """The latest deadline (seconds) due at loop time ``now_s``: the last float before
    ``now_s + resolution_s`` (``loop._clock_resolution``), as asyncio's ``_run_once`` moves every
    timer before that sum; ``now_s`` itself where the sum does not exceed it (a resolution of 0,
    negative or NaN, or one lost to rounding at a large loop time).

    A deadline is a sum, the loop's time plus a delay, rounded: a virtual clock that moves in whole
    ticks (looptime's 1 us) stops on the tick, which may be a float below that sum (0.3 for
    0.1 + 0.2), and a timer due there would wait one more tick where asyncio's loop runs it.

    Raises:
        TypeError: ``resolution_s`` is not a number a float adds to (asyncio's loop fails so too).
    """
    limit = now_s + resolution_s
    if limit > now_s:
        return math.nextafter(float(limit), -math.inf)
    return now_s


def check_when(when: Any, name: str) -> float:
    """``when`` (``call_at``) or ``delay`` (``call_later``), in seconds, as a float.

    asyncio takes anything that adds to a float (``loop.time() + delay``); so does this: a
    ``numbers.Real``, or another object ``0.0 + when`` takes (a numpy 0-d array or scalar), as
    the float that sum gives. ``inf`` (and anything beyond the wheel's 2**62 ms) is kept, shown
    in ``loop._scheduled`` and never run before the loop's time reaches it (``inf`` never), as
    on asyncio's heap. NaN passes: on
    asyncio's heap a NaN deadline is never after the loop's time, so the timer runs at the next
    iteration (``asyncio.sleep(nan)`` returns at once, ``asyncio.timeout(nan)`` expires), and the
    stores arm it due now.

    Raises:
        TypeError: it is None (with asyncio's message), or neither a real number nor anything a
            float adds to (a str, a complex, a Decimal), naming it.
        OverflowError: a ``delay`` that is an int beyond a float's range (``10**400``), as
            ``loop.time() + delay`` raises it on asyncio's loop. A ``when`` that is one is kept as
            ``inf`` (or ``-inf``, due now), since asyncio's heap compares it as it is: never reached
            (or already passed); its ``when()`` is then that float, not the int.
    """
    if when is None:
        raise TypeError("when cannot be None" if name == "when" else "delay must not be None")
    if not isinstance(when, numbers.Real):
        try:
            return float(0.0 + when)
        except (TypeError, ValueError):  # as float + when fails on asyncio's loop
            raise TypeError(f"{name} must be a real number of seconds, got {when!r}") from None
    try:
        return float(when)
    except OverflowError:
        if name == "when":
            return math.inf if cast(int, when) > 0 else -math.inf
        raise OverflowError(f"{name} must be seconds in a float's range: int too large to convert to float "
                            f"({cast(int, when).bit_length()} bits)") from None


def later_through_call_at(loop: Any, delay: Any, callback: Any, args: tuple, context: Any) -> Any:
    """``call_later`` on a loop whose class overrides ``call_at`` (a subclass, a class patch), or
    with a ``call_at`` set on the loop itself (``mock.patch.object``): as
    asyncio's ``BaseEventLoop.call_later``, ``loop.call_at(loop.time() + delay, ...)``, so that the
    override sees every timer, ``asyncio.sleep``'s included.

    Raises:
        TypeError: ``delay`` is None (asyncio's message); whatever ``loop.call_at`` raises.
    """
    if delay is None:
        raise TypeError("delay must not be None")
    return loop.call_at(loop.time() + delay, callback, *args, context=context)


def order_key(when_s: float, now_s: float) -> float:
    """A deadline's place in due order (seconds, never NaN): ``when_s``, or for a NaN deadline the
    loop time ``now_s`` it was armed at, as ``call_later(0)`` then.

    asyncio's heap gives a NaN deadline no order (every comparison with it is false): heappush
    leaves it where it lands, behind the entries pushed before it, and it runs once it reaches
    the top. Placed at its arming time, it runs after the due timers armed before it and before
    those armed after it with a later deadline, as on asyncio's heap in the cases that have an
    answer there (the heap empty of other timers, or every timer due)."""
    if when_s == when_s:
        return when_s
    return now_s if now_s == now_s else -math.inf


class ScheduledView(Sequence):
    """``loop._scheduled`` of an EventLoop: a read-only view of the armed timer handles, ordered
    by ``when()`` (so ``[0]`` is the earliest, as on asyncio's heap), for the test helpers and
    libraries that read asyncio's heap.

    Unlike asyncio's heap, it never holds a cancelled handle: a cancel takes the timer off the
    wheel at once, where asyncio's heap keeps it until it reaches the top or a sweep. ``len()``
    is O(1); indexing and iterating list the handles, O(n log n).

    Args:
        timers: the loop's timer store.
    """

    __slots__ = ("_timers",)

    def __init__(self, timers: Any) -> None:
        self._timers = timers

    def __len__(self) -> int:
        return int(self._timers.active_count())

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list: ...

    def __getitem__(self, index: Any) -> Any:
        return self._timers.scheduled()[index]

    def __iter__(self) -> Any:
        return iter(self._timers.scheduled())

    def __repr__(self) -> str:
        return f"<ScheduledView {self._timers.scheduled()!r}>"

    def clear(self) -> None:
        """Nothing: asyncio's ``BaseEventLoop.close()`` empties its heap through this, and
        EventLoop's ``close()`` drops the wheel's timers itself."""


def handle_repr(handle: Any, debug: bool) -> str:
    """``repr`` of a wheel timer handle, in asyncio's ``TimerHandle`` format:
    ``<TimerHandle [cancelled] when=W callback(args) [at file:line] [created at file:line]>``."""
    if handle._repr is not None:
        return handle._repr
    info = ["TimerHandle"]
    if handle._cancelled:
        info.append("cancelled")
    info.append(f"when={handle.when()}")
    if handle._callback is not None:
        info.append(_format_callback(handle, debug))
    if handle._source_traceback:
        frame = handle._source_traceback[-1]
        info.append(f"created at {frame[0]}:{frame[1]}")
    return "<{}>".format(" ".join(info))


def report_exception(handle: Any, loop: Any, exc: BaseException) -> None:
    """Hand a callback's exception to ``loop.call_exception_handler``, as ``Handle._run`` does."""
    cb = _format_callback(handle, loop.get_debug())
    context = {"message": f"Exception in callback {cb}", "exception": exc, "handle": handle}
    if handle._source_traceback:
        context["source_traceback"] = handle._source_traceback
    loop.call_exception_handler(context)


# (asyncio.TimerHandle._run as last looked at, the hook to run the wheel's handles through or None):
# a tool that replaces asyncio's Handle._run, a slow-callback hook (aiodebug, logfire), before or
# after the loop module is imported, is given the loop's timer handles too, as asyncio's loop gives
# it its own. asyncio's own is known by its code's file, since a hook may wrap it (functools.wraps).
_hook: tuple = (None, None)


def handle_run_hook() -> Any:
    """The replacement of asyncio's ``Handle._run`` in place now, or None while it is asyncio's own."""
    global _hook
    run = asyncio.TimerHandle._run
    if run is not _hook[0]:
        own = getattr(getattr(run, "__code__", None), "co_filename", None) == asyncio.events.__file__
        _hook = (run, None if own else run)
    return _hook[1]

"""A drop-in asyncio event loop whose every timer lives on the timing wheel.

``EventLoop`` is asyncio's own selector loop (``asyncio.SelectorEventLoop``: the same sockets,
transports, signals, subprocesses) with one change: ``call_at``/``call_later``, and so everything
built on them (``asyncio.sleep``, ``wait_for``, ``asyncio.timeout``/``timeout_at`` and their
``reschedule``, stream timeouts, the timeouts of aiohttp, asyncpg, websockets...), arm a timer on
a :class:`timerwheel_c.TimerWheel` instead of pushing onto a heap. Arming and cancelling are O(1),
and a cancel frees the timer at once, where asyncio's heap keeps cancelled handles until they
reach its top or a sweep (aiohttp#8608). The per-iteration timer work (the selector's timeout,
moving due handles to the ready queue) is compiled: ``timerwheel_c._loop`` (``src/_loop.pyx``),
or its pure twin :mod:`timerwheel_c.pure.loop`, chosen as the other cores are
(:mod:`timerwheel_c._impl`); the twin's docstring gives the clock and order rules.

Semantics are asyncio's, checked by running CPython's own ``test.test_asyncio`` suites on it
(``tests/conformance/asyncio_conformance.py``): never early on ``loop.time()`` by more than
``loop._clock_resolution``; due callbacks in deadline
order, equal deadlines in scheduling order; they run after the callbacks already ready, and what
they ``call_soon`` runs on the next iteration. Each iteration moves every timer whose deadline
is at or before ``loop.time()``, or in its ms before ``loop.time() + loop._clock_resolution``, as
asyncio's ``_run_once`` does: a deadline already due when it
is armed (``call_later(0)``, ``call_later(-1)``, ``call_at(loop.time())``) runs at the next
iteration, between the callbacks already ready and the ones they queue, and any other timer once
the clock reaches its deadline, plus the selector's wake-up. A NaN delay or deadline is due at
once too, as on asyncio's heap (where it is never after the loop's time): ``asyncio.sleep(nan)``
returns at once, ``wait_for(x, nan)`` and ``asyncio.timeout(nan)`` expire (uvloop refuses NaN
instead); it runs in the place of the loop time it was armed at, as ``call_later(0)`` then (the
heap gives NaN no order: see docs/DESIGN.md).

The clock is ``loop.time()``, followed wherever it is patched, as asyncio's loop follows it:
``mock.patch.object(loop, "time", ...)``, ``mock.patch("time.monotonic", ...)``, a ``time`` set
on asyncio's loop classes (``asyncio.BaseEventLoop``, ``SelectorEventLoop``: freezegun's
``real_asyncio=True`` sets one) or ``asyncio.base_events.time`` replaced, and the virtual clocks
built on them (looptime, aiotools' VirtualClock) move these timers too (with looptime,
``await asyncio.sleep(3600)`` ends at once). ``time``, ``call_at``, ``call_later`` and ``call_soon``
are methods of the class, compiled, never bound onto the instance: a patch of ``type(loop)`` sees
every call. A ``call_at``, ``call_later`` or ``call_soon`` patched on asyncio's own classes is not
seen (EventLoop's own replace theirs, as uvloop's do); ``call_soon`` is asyncio's, and calls the
``_call_soon``, ``_check_closed`` and ``get_debug`` patched there or on the loop, as asyncio's does.

The handles answer ``when()``, ``cancel()``, ``cancelled()``, ``get_context()``, compare and hash
as asyncio's ``TimerHandle`` do (ordered by ``when()``), have asyncio's ``_when`` and ``_scheduled``
(True while armed) for the code that reads the heap, and print as asyncio's do (debug mode's
slow-callback report, through ``asyncio.base_events.logger`` as in asyncio's ``_run_once``, and
source tracebacks included), but ``isinstance(h, asyncio.TimerHandle)`` is False, as it is for
uvloop's (uvloop#482, #704). ``loop._scheduled`` is a read-only view of the armed handles, ordered
by ``when()``; unlike asyncio's heap it holds no cancelled handle (a cancel frees the timer at once),
so ``loop._timer_cancelled_count``, which counts those, is 0. A slow-callback hook that replaces
asyncio's ``Handle._run`` (aiodebug, logfire) is given these handles too. The run loop cannot be
replaced on the class: nest_asyncio's ``apply()`` raises ValueError, as for uvloop's loop.

Use it as uvloop is used::

    asyncio.run(main(), loop_factory=timerwheel_c.aio.new_event_loop)   # 3.12+
    with asyncio.Runner(loop_factory=timerwheel_c.aio.new_event_loop) as runner:   # 3.11+
        runner.run(main())
    timerwheel_c.aio.run(main())                                       # 3.9+
    timerwheel_c.aio.install(); asyncio.run(main())                    # 3.9-3.13

Event loop policies are deprecated from Python 3.14 (removal planned for 3.16): there
``EventLoopPolicy`` and ``install()`` do not exist (AttributeError, saying what to use instead).

Windows: ``EventLoop`` is the selector loop there too (no subprocesses or pipes, as asyncio's
``SelectorEventLoop`` on Windows); ``new_event_loop()`` and ``run()`` warn and fall back to
asyncio's default proactor loop, whose timers stay on the heap.
"""
from __future__ import annotations

import abc
import asyncio
import collections
import sys
import warnings
from asyncio import base_events, format_helpers
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Optional, TypeVar

from . import _impl
from ._loop_common import ScheduledView, handle_run_hook

if TYPE_CHECKING:  # type checkers see the pure twin, as aio-libs does
    from .pure import loop as _core
else:
    _core = _impl.load("loop")
LoopTimers = _core.LoopTimers
TimerHandle = _core.TimerHandle

__all__ = ["EventLoop", "EventLoopType", "TimerHandle", "new_event_loop", "run"]

_T = TypeVar("_T")
# How asyncio's debug mode names a handle in its slow-callback report.
_format_handle: Callable[[Any], str] = base_events._format_handle  # type: ignore[attr-defined]
_WINDOWS = sys.platform == "win32"
# Event loop policies are deprecated from 3.14 on.
HAS_POLICIES = sys.version_info < (3, 14)
# The methods that make up the run loop, which a replacement written for asyncio's heap cannot be.
_RUN_LOOP = frozenset({"run_forever", "run_until_complete", "_run_once"})

class EventLoopType(abc.ABCMeta):
    """EventLoop's metaclass, which refuses a replacement of its run loop on the class (nest_asyncio's
    ``apply()`` sets its own ``run_forever``, ``run_until_complete`` and ``_run_once`` there, whose
    iteration pops asyncio's heap, ``loop._scheduled``): a ValueError before anything is replaced,
    the error nest_asyncio gives for uvloop's loop and which the libraries that apply it catch.
    A subclass may still define its own; an instance's attributes are not the class's. It derives
    from :class:`abc.ABCMeta`, so a subclass may mix in an ABC; a subclass with a metaclass of its
    own derives that metaclass from this one."""

    def __setattr__(cls, name: str, value: Any) -> None:
        if name in _RUN_LOOP:
            raise ValueError(f"Can't patch loop of type {cls.__qualname__}: its {name} runs the timers of a "
                             f"timing wheel, which a run loop written for asyncio's heap cannot drive")
        super().__setattr__(name, value)


class EventLoop(asyncio.SelectorEventLoop, metaclass=EventLoopType):
    """asyncio's selector event loop with every timer on the timing wheel (see the module docstring).

    Args:
        selector: a :mod:`selectors` selector, as ``asyncio.SelectorEventLoop`` takes
            (default: ``selectors.DefaultSelector()``).
    """

    # The timer store's class: the compiled core, or its pure twin (the tests run both).
    _timers_class: Callable[[Any], LoopTimers] = LoopTimers
    # asyncio's own state that _run_once reads, as BaseEventLoop keeps it (typeshed declares none).
    _debug: bool
    _ready: collections.deque
    _selector: Any
    _stopping: bool
    _current_handle: Any
    _process_events: Callable[[Any], None]

    def __init__(self, selector: Any = None) -> None:
        # Before the base __init__, which calls set_debug() and sets _scheduled.
        self._timers = self._timers_class(self)
        self._scheduled_view = ScheduledView(self._timers)
        super().__init__(selector)

    # The timer store's functions (the pure twin's, or the compiled ones, which install_methods below
    # makes C methods of the class): see their docstrings.
    time = _core.time
    call_at = _core.call_at  # type: ignore[assignment]
    call_later = _core.call_later  # type: ignore[assignment]
    call_soon = _core.call_soon

    @property
    def _scheduled(self) -> ScheduledView:
        """The armed timer handles, read-only, ordered by ``when()`` (see ScheduledView)."""
        return self._scheduled_view

    @_scheduled.setter
    def _scheduled(self, value: Any) -> None:
        # asyncio's BaseEventLoop.__init__ starts its heap empty here; nothing else may set it.
        if value != []:
            raise AttributeError(f"EventLoop._scheduled is a read-only view of the wheel's timers, not {value!r}")

    @property
    def _timer_cancelled_count(self) -> int:
        """asyncio's count of the cancelled handles its heap still holds (``BaseEventLoop`` adds
        one in ``_timer_handle_cancelled`` and takes one off as each leaves the heap): always 0
        here, since a cancel takes the timer off the wheel at once. So it agrees with
        ``loop._scheduled`` as on asyncio's loop: it counts the cancelled handles listed there, and
        ``len(loop._scheduled) - loop._timer_cancelled_count`` is the number of live timers."""
        return 0

    @_timer_cancelled_count.setter
    def _timer_cancelled_count(self, value: int) -> None:
        # asyncio's BaseEventLoop.__init__ starts the count at 0 here; any other count would lie.
        if value != 0:
            raise AttributeError(
                f"EventLoop._timer_cancelled_count counts the cancelled handles the wheel holds, always 0, not {value!r}")

    def _call_later_checked(self, delay, callback, args, context, depth):
        """``call_later`` off the compiled path (debug mode, or another timer store class)."""
        if not self._debug:
            return self._timers.call_later(delay, callback, *args, context=context)
        if delay is None:
            raise TypeError("delay must not be None")
        return self._call_at_checked(self.time() + delay, callback, args, context, depth + 1)

    def _call_at_checked(self, when, callback, args, context, depth):
        """``call_at`` off the compiled path: in debug mode with its checks and the stack of the
        caller ``depth`` frames up, as asyncio's."""
        if not self._debug:
            return self._timers.call_at(when, callback, *args, context=context)
        if when is None:
            raise TypeError("when cannot be None")
        self._check_closed()
        self._check_thread()
        self._check_callback(callback, "call_at")
        timer = self._timers.call_at(when, callback, *args, context=context)
        timer._source_traceback = format_helpers.extract_stack(sys._getframe(depth))
        return timer

    def set_debug(self, enabled: bool) -> None:
        super().set_debug(enabled)
        self._timers.debug = bool(enabled)

    def close(self) -> None:
        super().close()  # raises while running, before anything is dropped
        self._timers.close()

    def _run_once(self) -> None:
        """One iteration, as asyncio's ``BaseEventLoop._run_once`` with the wheel for the heap:
        wait for I/O at most until the earliest timer, move the due timers to the ready queue,
        run what was ready (the timer store's ``poll`` and ``run_ready``, compiled)."""
        timers = self._timers
        ready = self._ready
        timers.poll(self._selector, timers.select_timeout(bool(ready) or self._stopping))
        timers.move_due(ready)
        # Only what is ready now runs: what these callbacks schedule waits for the next poll. The
        # compiled run and the checked one (debug mode) hand the rest over as the mode changes.
        left = timers.run_ready(ready, len(ready))
        while left:
            left = timers.run_ready(ready, self._run_ready_checked(ready, left))

    def _run_ready_checked(self, ready: collections.deque, ntodo: int) -> int:
        """The next ``ntodo`` callbacks of ``ready`` while debug mode is on: each timed, and
        reported through ``asyncio.base_events.logger`` when slow, with ``loop._current_handle``
        set while it runs, as asyncio's ``_run_once`` does.

        Returns:
            0; or, found out of debug mode before a callback, how many are left, the first of them
            put back at the head of ``ready``, for the store's ``run_ready``.
        """
        hooked = handle_run_hook()
        for i in range(ntodo):
            handle = ready.popleft()
            if handle._cancelled:
                continue
            if not self._debug:
                ready.appendleft(handle)
                return ntodo - i
            try:
                self._current_handle = handle
                t0 = self.time()
                # Inline, not through a helper taking the handle: a callee's frame kept by a
                # traceback (the task's exception) would keep the handle, and so the task, alive.
                if hooked is None or isinstance(handle, asyncio.Handle):
                    handle._run()
                else:  # a timer handle of the wheel, through asyncio's replaced Handle._run
                    hooked(handle)
                dt = self.time() - t0
                if dt >= self.slow_callback_duration:
                    # The module global, looked up now, as asyncio's _run_once: tests replace it.
                    base_events.logger.warning(  # type: ignore[attr-defined]
                        "Executing %s took %.3f seconds", _format_handle(handle), dt)
            finally:
                self._current_handle = None
        handle = None  # breaks cycles when an exception occurs
        return 0


# time, call_at, call_later and call_soon as C methods of the class where the core is compiled (see install_methods).
_core.install_methods(EventLoop)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new :class:`EventLoop`; for ``asyncio.run(..., loop_factory=)`` and ``asyncio.Runner``.

    On Windows, asyncio's default (proactor) loop, with a RuntimeWarning: see the module docstring.
    """
    if _WINDOWS:
        warnings.warn("timerwheel_c.aio: on Windows the event loop is asyncio's default proactor loop, "
                      "whose timers stay on asyncio's heap", RuntimeWarning, stacklevel=2)
        return asyncio.ProactorEventLoop()  # type: ignore[attr-defined,unused-ignore]
    return EventLoop()


def run(main: Coroutine[Any, Any, _T], *, debug: Optional[bool] = None, **run_kwargs: Any) -> _T:
    """Run coroutine ``main`` on a new event loop from :func:`new_event_loop` and close it, as
    ``asyncio.run(main, debug=...)`` (and ``uvloop.run``): the loop is made, set as the current
    loop, and after ``main`` its tasks are cancelled, async generators and the default executor
    shut down.

    Returns:
        ``main``'s result.
    Raises:
        RuntimeError: called from a running event loop. What ``main`` raises.
    """
    if sys.version_info >= (3, 12):
        return asyncio.run(main, debug=debug, loop_factory=new_event_loop, **run_kwargs)
    if sys.version_info >= (3, 11):
        with asyncio.Runner(debug=debug, loop_factory=new_event_loop, **run_kwargs) as runner:
            return runner.run(main)
    if run_kwargs:
        raise TypeError(f"run() got unexpected keyword arguments {sorted(run_kwargs)} on Python 3.9/3.10")
    return _run_before_runner(main, debug)


def _run_before_runner(main: Coroutine[Any, Any, _T], debug: Optional[bool]) -> _T:
    """``asyncio.run`` of CPython 3.9/3.10 (``Lib/asyncio/runners.py``) on :func:`new_event_loop`."""
    from asyncio import coroutines, events, runners

    if events._get_running_loop() is not None:
        raise RuntimeError("asyncio.run() cannot be called from a running event loop")
    if not coroutines.iscoroutine(main):
        raise ValueError(f"a coroutine was expected, got {main!r}")
    loop = new_event_loop()
    try:
        events.set_event_loop(loop)
        if debug is not None:
            loop.set_debug(debug)
        return loop.run_until_complete(main)
    finally:
        try:
            runners._cancel_all_tasks(loop)  # type: ignore[attr-defined]
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            events.set_event_loop(None)
            loop.close()


if HAS_POLICIES:
    class EventLoopPolicy(asyncio.DefaultEventLoopPolicy):  # type: ignore[misc,valid-type,name-defined,unused-ignore]
        """asyncio's default policy making :class:`EventLoop` loops (Python 3.9-3.13)."""

        def new_event_loop(self) -> asyncio.AbstractEventLoop:
            return new_event_loop()

    def install() -> None:
        """``asyncio.set_event_loop_policy(EventLoopPolicy())``: from then on ``asyncio.run``,
        ``asyncio.new_event_loop`` and ``asyncio.Runner`` make :class:`EventLoop` loops
        (Python 3.9-3.13; policies are deprecated from 3.14)."""
        asyncio.set_event_loop_policy(EventLoopPolicy())

    __all__ += ["EventLoopPolicy", "install"]


def __getattr__(name: str) -> Any:
    if name in ("EventLoopPolicy", "install"):
        raise AttributeError(
            f"timerwheel_c.aio.{name} does not exist on Python {sys.version_info[0]}.{sys.version_info[1]}: "
            "event loop policies are deprecated from 3.14; use timerwheel_c.aio.run(main()) or "
            "asyncio.run(main(), loop_factory=timerwheel_c.aio.new_event_loop)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The timer implementations the bench puts side by side, and how each one is driven.

Two families, so that every implementation is timed through its own native calls
with no adapter layer between the loop and the call:

- **wheel API** (``family="wheel"``): ``schedule(after_ms, token) -> id``,
  ``cancel(id)``, ``advance(now_ms, out) -> out`` and, where it exists,
  ``reschedule(id, after_ms)``. That is the C wheel, the pure twin, the empty
  compiled floor (:mod:`.floor`) and :class:`HeapqTimers`.
- **loop API** (``family="loop"``): an event loop's ``call_later(delay_s, callback,
  token) -> handle`` and ``handle.cancel()``. That is asyncio's timer heap and
  uvloop's libuv timers, both driven by a :class:`LoopDriver`.

How asyncio's heap is isolated: :class:`_SimClockLoop` is asyncio's own
``SelectorEventLoop`` with two overrides: ``time()`` returns a clock the bench sets
(seconds, from integer ms), and the selector's ``select()`` returns at once with no
events. ``LoopDriver.tick(now_ms)`` sets the clock and calls the loop's private
``_run_once()``: asyncio's real heap maintenance (compaction of cancelled handles,
popping due handles) and its real callback dispatch, with no I/O wait and no wall
clock. So ticks run as fast as the heap allows and the fired set is deterministic.

uvloop's clock is libuv's cached ``uv_now`` and cannot be set, so uvloop is timed
without ticking for schedule/cancel work, plus one real loop iteration at the end
(``flush``), where libuv's close callbacks free the cancelled timers, and through a real run of the loop (CPU
time of the loop's thread, not wall time) for expiry. Workloads that need a
simulated clock (mixed RTO, long gap) list it as not applicable.
"""
from __future__ import annotations

import asyncio
import heapq
import selectors
from dataclasses import dataclass
from typing import Any, Callable

import timerwheel_c
from timerwheel_c import pure

from . import floor
from .harness import NotAvailable

__all__ = ["HeapqTimers", "Impl", "LoopDriver", "available"]

# The floor row's label, used by the goals and the tables.
FLOOR = "empty Cython method"
C_WHEEL = "C wheel"
PURE_WHEEL = "pure twin"
ASYNCIO = "asyncio heap"
UVLOOP = "uvloop"
HEAPQ = "heapq lazy"


class HeapqTimers:
    """A binary heap with lazy deletion: the textbook baseline, asyncio's own strategy.

    Units: integer ms, like the wheel. An entry is a list ``[due_ms, seq, token]``;
    ``schedule`` returns it as the handle. ``cancel`` overwrites the token with
    ``None`` and leaves the entry in the heap until it reaches the top, or until a
    compaction: once more than 100 entries are cancelled and they are over half the
    heap, ``advance`` rebuilds it without them (asyncio's ``_run_once`` rule).
    ``seq`` breaks ties in scheduling order. There is no ``reschedule``: a re-arm is
    ``cancel`` plus ``schedule``, which is what heapq users write.
    """

    __slots__ = ("_heap", "_now_ms", "_seq", "_cancelled")

    def __init__(self, now_ms: int = 0) -> None:
        self._heap: list[list] = []
        self._now_ms = now_ms
        self._seq = 0
        self._cancelled = 0

    def schedule(self, after_ms: int, token: int) -> list:
        if after_ms < 1:
            after_ms = 1
        self._seq += 1
        entry = [self._now_ms + after_ms, self._seq, token]
        heapq.heappush(self._heap, entry)
        return entry

    def cancel(self, entry: list) -> bool:
        # A fired or cancelled entry has token None: cancelling it again is a no-op.
        if entry[2] is None:
            return False
        entry[2] = None
        self._cancelled += 1
        return True

    def advance(self, now_ms: int, out: list | None = None) -> list:
        if out is None:
            out = []
        heap = self._heap
        if self._cancelled > 100 and 2 * self._cancelled > len(heap):
            heap = self._heap = [e for e in heap if e[2] is not None]
            heapq.heapify(heap)
            self._cancelled = 0
        pop = heapq.heappop
        while heap and heap[0][0] <= now_ms:
            entry = pop(heap)
            token = entry[2]
            if token is None:
                self._cancelled -= 1
            else:
                entry[2] = None
                out.append(token)
        self._now_ms = now_ms
        return out


class _NoWaitSelector(selectors.DefaultSelector):
    """A real selector (the loop's self-pipe registers on it) whose select never waits."""

    def select(self, timeout=None):
        return []


class _SimClockLoop(asyncio.SelectorEventLoop):
    """asyncio's SelectorEventLoop on a clock the bench sets (``_sim_now_s``, seconds)."""

    _sim_now_s = 0.0

    def time(self) -> float:
        return self._sim_now_s


class LoopDriver:
    """One event loop's timers, plus the list its callbacks append fired tokens to.

    ``call_later`` and ``callback`` are the loop's own bound ``call_later`` and the
    ``list.append`` every timer is armed with, so a fired timer costs one real
    callback dispatch. ``tick(now_ms)`` exists only when ``sim_clock`` is True.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, sim_clock: bool) -> None:
        # Any: a simulated-clock loop (a subclass of the asyncio loop) adds _sim_now_s.
        self.loop: Any = loop
        self.sim_clock = sim_clock
        self.fired: list[int] = []
        self.call_later = loop.call_later
        self.callback = self.fired.append

    def tick(self, now_ms: int) -> None:
        """Set the simulated clock to ``now_ms`` (ms) and run one loop iteration."""
        loop = self.loop
        loop._sim_now_s = now_ms / 1000
        loop._run_once()

    def flush(self) -> None:
        """Run one real loop iteration: uvloop frees cancelled timers only there (libuv's close callbacks)."""
        self.loop.run_until_complete(asyncio.sleep(0))

    def close(self, handles=()) -> None:
        """Cancel ``handles``, let the loop free them, and close it (so no timer outlives the run)."""
        for handle in handles:
            handle.cancel()
        if not self.sim_clock:
            self.flush()
        self.loop.close()


@dataclass(frozen=True)
class Impl:
    """One row of the tables.

    ``make()`` returns a fresh timer structure at time 0: a wheel-API object, or a
    :class:`LoopDriver`. ``reschedule`` says whether a native in-place re-arm exists;
    ``batch`` whether ``schedule_many``/``advance_array`` exist; ``sim_clock``
    whether the bench can set its clock (all wheel-API rows can).
    """

    name: str
    family: str
    make: Callable[[], object]
    reschedule: bool = False
    batch: bool = False
    sim_clock: bool = True
    floor: bool = False


def _compiled() -> bool:
    """Whether the compiled rows run: the process's one selection (:mod:`timerwheel_c._impl`) chose C."""
    return timerwheel_c.IMPLEMENTATION == "c"


def _wheel_impl(name: str, cls: type) -> Impl:
    return Impl(name, "wheel", lambda: cls(0), reschedule=True, batch=hasattr(cls, "schedule_many"))


def _asyncio_impl() -> Impl | None:
    if not hasattr(asyncio.BaseEventLoop, "_run_once"):
        return None
    return Impl(ASYNCIO, "loop", lambda: LoopDriver(_SimClockLoop(_NoWaitSelector()), True))


def _uvloop_impl() -> Impl | None:
    try:
        import uvloop
    except ImportError:
        return None
    return Impl(UVLOOP, "loop", lambda: LoopDriver(uvloop.new_event_loop(), False), sim_clock=False)


def _floor_impl() -> Impl | None:
    if not _compiled():
        return None
    empty_wheel = floor.load().EmptyWheel
    return Impl(FLOOR, "wheel", lambda: empty_wheel(0), reschedule=True, floor=True)


def available() -> tuple[list[Impl], dict[str, str]]:
    """Return the implementations that import here, C wheel first, and why others are missing.

    The first list is in table order; the dict maps a missing row's name to the reason.
    """
    found: list[Impl] = []
    missing: dict[str, str] = {}
    candidates = [
        (C_WHEEL, lambda: _wheel_impl(C_WHEEL, timerwheel_c.TimerWheel) if _compiled() else None,
         "timerwheel_c._wheel is not in use (IMPLEMENTATION is 'pure')"),
        (PURE_WHEEL, lambda: _wheel_impl(PURE_WHEEL, pure.TimerWheel), ""),
        (ASYNCIO, _asyncio_impl, "this asyncio has no BaseEventLoop._run_once"),
        (UVLOOP, _uvloop_impl, "uvloop is not installed (pip install 'timerwheel_c[uvloop]')"),
        (HEAPQ, lambda: Impl(HEAPQ, "wheel", HeapqTimers), ""),
        (FLOOR, _floor_impl, "the compiled cores are not in use (IMPLEMENTATION is 'pure')"),
    ]
    for name, factory, reason in candidates:
        try:
            impl = factory()
        except NotAvailable as exc:
            impl, reason = None, str(exc)
        if impl is None:
            missing[name] = reason
        else:
            found.append(impl)
    return found, missing

"""Unchanged asyncio code on timerwheel_c's EventLoop, against asyncio's default loop and uvloop.

The same code runs on each loop, with ``handles`` timers armed 30 s out (one per connection, as
a server holds them); per operation, CPU time of the bench thread, ns, median of the repeats:

- ``call_later+cancel``: ``loop.call_later(30.0, cb).cancel()``;
- ``random re-arm``: ``handle.cancel()`` + ``loop.call_later(30.0, cb)`` of each connection, in
  a random order (a server's traffic touches connections at random; a sequential order lets the
  prefetcher hide the cache misses);
- ``timeout``: ``async with asyncio.timeout(30.0): pass`` (3.11+);
- ``wait_for``: ``await asyncio.wait_for(fut, 30.0)`` of a future already done.

Each of the two async phases runs :func:`phase_ops` operations and gives the loop an iteration every
:data:`YIELD_EVERY` of them, as a server's loop runs between its requests, so that each phase pays
for the loop's own deferred work: asyncio's default loop leaves a cancelled handle on its heap and
removes them all in one pass (over the whole heap) once they outnumber the live ones. A phase of
10 % more operations than there are timers armed holds one such pass, as the steady state of a
server with that many timers has one per that many cancellations. The synchronous phases never
yield, and the untimed iteration after them clears what they left: their pass counts nowhere, which
favours the default loop. Before, the async phases ran 20,000 operations with no iteration between
them, so no pass fell in ``timeout``'s window, and ``wait_for``'s first iteration paid for the passes
of every phase before it (1.7 to 1.9 us per ``wait_for``).

The ratios the goals judge are the default loop's cost over EventLoop's, in one run. Two floors,
measured on EventLoop, bound what any loop could reach: the random re-arm's Python code with no
timer work (each handle read, a method of it called, its bound callback made, in the same order),
and ``asyncio.timeout`` with the loop's ``call_at`` replaced by a Python function that arms nothing
(its handle's ``cancel`` a C no-op). The default loop's cost over a floor is about the most a loop
whose timers cost nothing could show.

The timeout floor replaces ``call_at`` on the loop's class for its phase, and puts it back; no
phase reads or sets a loop object's ``__dict__``. On CPython 3.11+ an object keeps its attributes
inline until its ``__dict__`` is asked for, and asyncio's Python code then reads them through the
dict: the default loop's own ``call_later`` + ``cancel`` costs 13% more, its ``asyncio.timeout``
6%. And a name set on a loop object joins the keys its class's instances share for good: every
``loop.call_at`` that asyncio's ``Timeout`` looked up on an EventLoop then went unspecialized,
about 230 more instructions per block (callgrind).
"""
from __future__ import annotations

import asyncio
import gc
import random
from time import thread_time_ns
from typing import Any, Callable, Optional

from .aio_micro import _Conn, _keep, _stats, _timed
from .goals import Goal

__all__ = ["LOOPS", "OPS", "YIELD_EVERY", "goals", "loop_factories", "phase_ops", "run"]

DELAY_S = 30.0
# A loop iteration every this many operations of an async phase (see the module docstring).
YIELD_EVERY = 100
LOOPS = ("asyncio", "EventLoop", "uvloop")
OPS = ("call_later+cancel", "random re-arm", "timeout", "wait_for")
# The goals: the default loop's cost over EventLoop's, at least this (and under uvloop's for the
# first two: uvloop's cost over EventLoop's above 1).
TARGETS = {"call_later+cancel": 5.0, "random re-arm": 4.0, "timeout": 1.5, "wait_for": 1.3}
UVLOOP_BEATEN = ("call_later+cancel", "random re-arm")
# Each floor's operation: the same Python code with no timer work (see the module docstring).
FLOORS = {"random re-arm": "re-arm floor", "timeout": "timeout floor"}


def phase_ops(handles: int) -> int:
    """The operations of each async phase with ``handles`` timers armed: 10 % more than ``handles``
    (one pass of the default loop's cancelled-handle removal; see the module docstring), rounded up
    to a whole number of :data:`YIELD_EVERY`."""
    return -(-(handles + handles // 10) // YIELD_EVERY) * YIELD_EVERY


def loop_factories() -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The loops measured, by name: asyncio's default, EventLoop, and uvloop when it imports."""
    from timerwheel_c.aio import new_event_loop

    out: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": asyncio.new_event_loop, "EventLoop": new_event_loop}
    try:
        import uvloop
    except ImportError:
        return out
    out["uvloop"] = uvloop.new_event_loop
    return out


class _NoTimer:
    """The handle of a timer never armed: ``cancel()`` is a C call that does nothing."""

    cancel = staticmethod(int)


_NO_TIMER = _NoTimer()


def _arm_nothing(loop: Any, when: float, callback: Callable[..., object], *args: Any,
                 context: Any = None) -> _NoTimer:
    return _NO_TIMER


class _Loop:
    """One loop's side of the bench: ``n`` connections with a timer each, armed ``DELAY_S`` out
    on ``loop`` (which need not run), and one measured round of every operation."""

    def __init__(self, loop: asyncio.AbstractEventLoop, n: int, seed: int, floors: bool = False) -> None:
        self.loop, self.n, self.async_ops, self.floors = loop, n, phase_ops(n), floors
        self.conns = [_Conn() for _ in range(n)]
        for c in self.conns:
            c.handle = loop.call_later(DELAY_S, c.on_idle)
        self.shuffled = self.conns[:]
        random.Random(seed).shuffle(self.shuffled)
        self.samples: dict[str, list[float]] = {}

    def call_cancel(self) -> None:
        call_later = self.loop.call_later
        for c in self.conns:
            call_later(DELAY_S, c.on_idle).cancel()

    def rearm(self) -> None:
        call_later = self.loop.call_later
        for c in self.shuffled:
            c.handle.cancel()
            c.handle = call_later(DELAY_S, c.on_idle)

    def rearm_floor(self) -> None:
        for c in self.shuffled:
            handle = c.handle
            handle.cancelled()
            c.handle = handle
            c.on_idle  # noqa: B018 -- made and dropped, as the re-arm makes its callback

    async def async_timed(self, kind: str) -> float:
        timeout, rounds, sleep = getattr(asyncio, "timeout", None), self.async_ops // YIELD_EVERY, asyncio.sleep
        done = self.loop.create_future()
        done.set_result(None)
        cls = type(self.loop)
        own_call_at = cls.__dict__.get("call_at")
        if kind == "timeout floor":
            cls.call_at = _arm_nothing  # type: ignore[method-assign,assignment]  # the class's: see the module docstring
        gc.disable()
        try:
            t0 = thread_time_ns()
            if kind != "wait_for":
                for _ in range(rounds):
                    for _ in range(YIELD_EVERY):
                        async with timeout(DELAY_S):  # type: ignore[misc]
                            pass
                    await sleep(0)
            else:
                wait_for = asyncio.wait_for
                for _ in range(rounds):
                    for _ in range(YIELD_EVERY):
                        await wait_for(done, DELAY_S)
                    await sleep(0)
            return (thread_time_ns() - t0) / self.async_ops
        finally:
            gc.enable()
            if kind == "timeout floor":
                if own_call_at is None:
                    del cls.call_at
                else:
                    cls.call_at = own_call_at  # type: ignore[method-assign]

    async def _round(self) -> dict[str, float]:
        phases = {"call_later+cancel": _timed(self.call_cancel, self.n), "random re-arm": _timed(self.rearm, self.n)}
        await asyncio.sleep(0)  # untimed: the loop clears what the synchronous phases left
        if hasattr(asyncio, "timeout"):
            phases["timeout"] = await self.async_timed("timeout")
        phases["wait_for"] = await self.async_timed("wait_for")
        if self.floors:
            phases["re-arm floor"] = _timed(self.rearm_floor, self.n)
            if hasattr(asyncio, "timeout"):
                phases["timeout floor"] = await self.async_timed("timeout floor")
        return phases

    def round(self, keep: bool) -> None:
        """Measure every operation on this loop, twice, and record the second round if ``keep``: the
        first brings this loop's handles back into the caches the other loops' turns evicted."""
        self.loop.run_until_complete(self._round())
        phases = self.loop.run_until_complete(self._round())
        if keep:
            _keep(self.samples, phases)

    def close(self) -> dict:
        for c in self.conns:
            c.handle.cancel()
        self.loop.close()
        ops = {"call_later+cancel": self.n, "random re-arm": self.n, "timeout": self.async_ops, "wait_for": self.async_ops,
               "re-arm floor": self.n, "timeout floor": self.async_ops}
        return _stats(self.samples, ops)


def run(handles: int, repeats: int, seed: int = 6,
        progress: Optional[Callable[[int], None]] = None) -> dict:
    """Measure each loop of :func:`loop_factories`; returns ``{loop: {op: Stats JSON}}``
    (ns per operation, the operations of the module docstring; :func:`phase_ops` each async phase).

    The loops take turns, one round of every operation each (after a round that warms the caches
    up again), in an order reversed every other turn: a shared machine's slow spells (another
    guest's CPU steal) then fall on every loop alike, where measuring one loop's repeats and then
    the next's put a spell on one loop's side of the ratio."""
    benches = {}
    try:
        for name, factory in loop_factories().items():
            benches[name] = _Loop(factory(), handles, seed, floors=name == "EventLoop")
        for i in range(repeats + 1):  # the first round warms up and is dropped
            for bench in (list(benches.values()) if i % 2 else list(benches.values())[::-1]):
                bench.round(keep=i > 0)
                if progress:
                    progress(1)
        return {name: bench.close() for name, bench in benches.items()}
    finally:
        for bench in benches.values():
            if not bench.loop.is_closed():
                bench.loop.close()


def _median(cell: Any) -> Optional[float]:
    return cell["median_ns_per_op"] if isinstance(cell, dict) else None


def speedups(results: dict, reference: str) -> dict[str, Optional[float]]:
    """Per operation: ``reference``'s cost over EventLoop's (None where either is missing)."""
    ours, theirs = results.get("EventLoop", {}), results.get(reference, {})
    out = {}
    for op in OPS:
        cost, ref = _median(ours.get(op)), _median(theirs.get(op))
        out[op] = ref / cost if cost and ref else None
    return out


def goals(figures: dict) -> list[tuple[Goal, Optional[float]]]:
    """EventLoop against the default loop, unchanged code: call_later + cancel at least 5x
    cheaper, the random re-arm 4x, asyncio.timeout 1.5x, wait_for 1.3x; and the first two
    cheaper than uvloop's (uvloop's cost over EventLoop's above 1)."""
    results = figures["results"]
    default, uv = speedups(results, "asyncio"), speedups(results, "uvloop")
    out = [(Goal("loop", f"asyncio / EventLoop, {op}", TARGETS[op], at_most=False), default[op]) for op in OPS]
    out += [(Goal("loop", f"uvloop / EventLoop, {op}", 1.0, at_most=False), uv[op]) for op in UVLOOP_BEATEN]
    return out


def table(rep, figures: dict) -> None:
    """The loops side by side: ns per operation, and the default loop's and uvloop's cost over
    EventLoop's."""
    from .report import fmt

    results = figures["results"]
    default, uv = speedups(results, "asyncio"), speedups(results, "uvloop")
    rows = []
    for op in OPS:
        cells = [op]
        for name in LOOPS:
            cells.append(fmt(_median(results.get(name, {}).get(op))))
        cells += [f"{default[op]:.2f}x" if default[op] else "-", f"{uv[op]:.2f}x" if uv[op] else "-"]
        rows.append(cells)
    notes = ["ns: CPU time of the bench thread per operation, median of the repeats; X/EventLoop: that loop's "
             "cost over EventLoop's (above 1: EventLoop is cheaper)"]
    for op, ceiling in ceilings(results).items():
        notes.append(f"{FLOORS[op]}: {fmt(_median(results['EventLoop'].get(FLOORS[op])))} ns, the same code with no "
                     f"timer work; asyncio / floor = {ceiling:.2f}x, about the most a loop whose timers cost "
                     f"nothing could show for {op}")
    rep.table(f"loop: unchanged asyncio code on EventLoop, {figures['handles']:,} timers armed "
              f"(see bench/loop.py)",
              ["operation"] + [f"{name} ns" for name in LOOPS] + ["asyncio/EventLoop", "uvloop/EventLoop"], rows, notes)


def ceilings(results: dict) -> dict[str, float]:
    """Per operation with a floor: the default loop's cost over the floor's (the ratio a loop whose
    timers cost nothing would show); operations whose floor or cost is missing are left out."""
    out = {}
    for op, floor in FLOORS.items():
        cost, ref = _median(results.get("EventLoop", {}).get(floor)), _median(results.get("asyncio", {}).get(op))
        if cost and ref:
            out[op] = ref / cost
    return out

"""The asyncio layer's costs, per operation, with ``handles`` armed: WheelScheduler (compiled and
pure) and KeyedTimers against asyncio's own timers, on the default loop and on uvloop.

Operations (CPU time of the bench thread, ns per operation, median of the repeats):

- ``re-arm``: ``WheelHandle.reschedule(30.0)``; asyncio: ``TimerHandle.cancel()`` + ``loop.call_later(30.0, cb)``;
- ``call_later+cancel``: a new handle armed 30 s out and cancelled at once;
- ``timeout``: ``async with sched.timeout(30.0): pass``; asyncio: ``async with asyncio.timeout(30.0)``;
- ``keyed re-arm``: ``KeyedTimers.arm(key, 30.0)`` of an armed key;

and memory per armed timer (bytes, at ``handles`` timers): a handle whose callback is a bound
method (the handle, its bound method, its context copy and the scheduler's share: the wheel entry,
or asyncio's heap slot), and a key (every allocation ``arm`` makes: table slot and wheel entry).
Every row runs on a loop of its own with ``handles`` handles armed 30 s out, one per connection.
Re-arms visit the connections (and keys) in one seeded random order, the same for every row, as
real traffic does: in arming order the CPU's prefetcher would hide the cache misses of a re-arm.
"""
from __future__ import annotations

import asyncio
import gc
import importlib
import random
import sys
import tracemalloc
from time import thread_time_ns
from typing import Any, Callable, Optional

from .goals import Goal
from .harness import Stats

__all__ = ["ROWS", "goals", "run"]

DELAY_S = 30.0
# (row name, scheduler module or None for the loop's own timers, loop)
ROWS = (
    ("WheelScheduler (C)", "timerwheel_c._aio", "asyncio"),
    ("WheelScheduler (pure)", "timerwheel_c.pure.aio", "asyncio"),
    ("asyncio", None, "asyncio"),
    ("uvloop WheelScheduler (C)", "timerwheel_c._aio", "uvloop"),
    ("uvloop", None, "uvloop"),
)


class _Conn:
    """A connection: its idle callback is a bound method, as a server's would be."""

    __slots__ = ("handle",)

    handle: Any

    def on_idle(self) -> None:
        pass


def _loop_factory(name: str) -> Optional[Callable[[], asyncio.AbstractEventLoop]]:
    if name == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _timed(kernel: Callable[[], None], ops: int) -> float:
    gc.disable()
    try:
        t0 = thread_time_ns()
        kernel()
        return (thread_time_ns() - t0) / ops
    finally:
        gc.enable()


def _keep(samples: dict[str, list[float]], phases: dict[str, float]) -> None:
    """Append one measured run's ns per operation, phase by phase, to ``samples``."""
    for phase, ns in phases.items():
        samples.setdefault(phase, []).append(ns)


def _stats(samples: dict[str, list[float]], ops: dict[str, int]) -> dict:
    """``{phase: Stats JSON}`` of ``samples`` (ns per operation); ``ops``: each phase's operations per run."""
    return {phase: Stats(values, ops[phase]).to_json() for phase, values in samples.items()}


async def _measure_row(module: Optional[str], n: int, timeout_ops: int, repeats: int, step, seed: int) -> dict:
    loop = asyncio.get_running_loop()
    conns = [_Conn() for _ in range(n)]
    order = list(range(n))
    random.Random(seed).shuffle(order)
    shuffled = [conns[k] for k in order]
    sched = importlib.import_module(module).WheelScheduler(loop) if module else None
    timers = sched if sched is not None else loop
    for c in conns:
        c.handle = timers.call_later(DELAY_S, c.on_idle)
    keys = sched.keyed(lambda key: None) if sched is not None else None
    if keys is not None:
        for k in range(n):
            keys.arm(k, DELAY_S)
    timeout = sched.timeout if sched is not None else getattr(asyncio, "timeout", None)

    def rearm() -> None:
        if sched is not None:
            for c in shuffled:
                c.handle.reschedule(DELAY_S)
        else:
            call_later = loop.call_later
            for c in shuffled:
                c.handle.cancel()
                c.handle = call_later(DELAY_S, c.on_idle)

    def call_cancel() -> None:
        call_later = timers.call_later
        for c in conns:
            call_later(DELAY_S, c.on_idle).cancel()

    def keyed_rearm() -> None:
        assert keys is not None
        arm = keys.arm
        for k in order:
            arm(k, DELAY_S)

    samples: dict[str, list[float]] = {}
    for i in range(repeats + 1):  # the first run warms up and is dropped
        phases = {"re-arm": _timed(rearm, n), "call_later+cancel": _timed(call_cancel, n)}
        if keys is not None:
            phases["keyed re-arm"] = _timed(keyed_rearm, n)
        if timeout is not None:
            gc.disable()
            try:
                t0 = thread_time_ns()
                for _ in range(timeout_ops):
                    async with timeout(DELAY_S):
                        pass
                phases["timeout"] = (thread_time_ns() - t0) / timeout_ops
            finally:
                gc.enable()
        step()
        if i:
            _keep(samples, phases)
    for c in conns:
        c.handle.cancel()
    if sched is not None:
        sched.close()
    ops = {"re-arm": n, "call_later+cancel": n, "keyed re-arm": n, "timeout": timeout_ops}
    return _stats(samples, ops)


async def _memory_row(module: Optional[str], n: int) -> dict:
    """Bytes per armed handle (and per armed key) at ``n``: tracemalloc's count of the Python
    objects plus the growth of the scheduler's own C memory (``sys.getsizeof``, which covers its
    wheel and key tables)."""
    loop = asyncio.get_running_loop()
    conns = [_Conn() for _ in range(n)]
    sched = importlib.import_module(module).WheelScheduler(loop) if module else None
    timers = sched if sched is not None else loop
    compiled = module is not None and module.endswith("._aio")
    own = (lambda: sys.getsizeof(sched)) if compiled else (lambda: 0)
    out = {}
    gc.collect()
    tracemalloc.start()
    try:
        base, own0 = tracemalloc.get_traced_memory()[0], own()
        for c in conns:
            c.handle = timers.call_later(DELAY_S, c.on_idle)
        out["bytes_per_handle"] = (tracemalloc.get_traced_memory()[0] - base + own() - own0) / n
        if sched is not None:
            keys = sched.keyed(lambda key: None)
            keyed_own = (lambda: sys.getsizeof(keys)) if compiled else (lambda: 0)
            base, own0 = tracemalloc.get_traced_memory()[0], keyed_own()
            for k in range(n):
                keys.arm(k, DELAY_S)
            out["bytes_per_key"] = (tracemalloc.get_traced_memory()[0] - base + keyed_own() - own0) / n
    finally:
        tracemalloc.stop()
    for c in conns:
        c.handle.cancel()
    if sched is not None:
        sched.close()
    return out


def run(handles: int, timeout_ops: int, repeats: int, progress=None, seed: int = 20261129) -> dict:
    """Measure every row of :data:`ROWS` whose loop imports; returns ``{row: figures}``. ``seed``
    seeds the re-arm order.

    Figures per row: ``{op: Stats JSON}`` for the operations above (ns per operation), and
    ``bytes_per_handle`` / ``bytes_per_key`` (bytes per armed timer at ``handles``).
    """
    results = {}
    for name, module, loop_name in ROWS:
        factory = _loop_factory(loop_name)
        if factory is None:
            continue
        loop = factory()
        try:
            figures = loop.run_until_complete(
                _measure_row(module, handles, timeout_ops, repeats, lambda: progress and progress(1), seed))
            figures.update(loop.run_until_complete(_memory_row(module, handles)))
        finally:
            loop.close()
        results[name] = figures
    return results


def goals(figures: dict) -> list[tuple[Goal, Optional[float]]]:
    """The asyncio layer's goals, on the default loop, each with its measured value: the compiled
    scheduler's re-arm at most 150 ns and at least 30x faster than asyncio's cancel + call_later;
    call_later + cancel at most 500 ns; timeout() enter + exit at most 1 us and at least 8x faster
    than asyncio.timeout; a keyed re-arm at most 120 ns and at least 40x faster than asyncio's
    re-arm; at most 240 B per armed handle and 80 B per armed key."""
    results = figures["results"]
    ours, theirs = results.get("WheelScheduler (C)", {}), results.get("asyncio", {})

    def ns(row: dict, op: str) -> Optional[float]:
        cell = row.get(op)
        return cell["median_ns_per_op"] if isinstance(cell, dict) else None

    def speedup(op: str, asyncio_op: str) -> Optional[float]:
        cost, reference = ns(ours, op), ns(theirs, asyncio_op)
        return reference / cost if cost and reference else None

    return [
        (Goal("aio", "WheelHandle.reschedule", 150, at_most=True, unit="ns"), ns(ours, "re-arm")),
        (Goal("aio", "asyncio cancel+call_later / WheelHandle.reschedule", 30, at_most=False),
         speedup("re-arm", "re-arm")),
        (Goal("aio", "call_later + cancel", 500, at_most=True, unit="ns"), ns(ours, "call_later+cancel")),
        (Goal("aio", "timeout() enter + exit", 1000, at_most=True, unit="ns"), ns(ours, "timeout")),
        (Goal("aio", "asyncio.timeout / timeout()", 8, at_most=False), speedup("timeout", "timeout")),
        (Goal("aio", "KeyedTimers.arm (re-arm)", 120, at_most=True, unit="ns"), ns(ours, "keyed re-arm")),
        (Goal("aio", "asyncio cancel+call_later / KeyedTimers.arm", 40, at_most=False),
         speedup("keyed re-arm", "re-arm")),
        (Goal("aio", "bytes per armed handle", 240, at_most=True, unit="B"), ours.get("bytes_per_handle")),
        (Goal("aio", "bytes per armed key", 80, at_most=True, unit="B"), ours.get("bytes_per_key")),
    ]

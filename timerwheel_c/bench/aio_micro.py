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
"""
from __future__ import annotations

import asyncio
import gc
import importlib
import sys
import tracemalloc
from time import thread_time_ns
from typing import Callable, Optional

from .harness import Stats

__all__ = ["ROWS", "run", "targets"]

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


async def _measure_row(module: Optional[str], n: int, timeout_ops: int, repeats: int, step) -> dict:
    loop = asyncio.get_running_loop()
    conns = [_Conn() for _ in range(n)]
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
            for c in conns:
                c.handle.reschedule(DELAY_S)
        else:
            call_later = loop.call_later
            for c in conns:
                c.handle.cancel()
                c.handle = call_later(DELAY_S, c.on_idle)

    def call_cancel() -> None:
        call_later = timers.call_later
        for c in conns:
            call_later(DELAY_S, c.on_idle).cancel()

    def keyed_rearm() -> None:
        arm = keys.arm
        for k in range(n):
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
            for phase, ns in phases.items():
                samples.setdefault(phase, []).append(ns)
    for c in conns:
        c.handle.cancel()
    if sched is not None:
        sched.close()
    ops = {"re-arm": n, "call_later+cancel": n, "keyed re-arm": n, "timeout": timeout_ops}
    return {phase: Stats(values, ops[phase]).to_json() for phase, values in samples.items()}


async def _memory_row(module: Optional[str], n: int) -> dict:
    """Bytes per armed handle (and per armed key) at ``n``: tracemalloc's count of the Python
    objects plus the growth of the scheduler's own C memory (``sys.getsizeof``, which covers its
    wheel and key tables)."""
    loop = asyncio.get_running_loop()
    conns = [_Conn() for _ in range(n)]
    sched = importlib.import_module(module).WheelScheduler(loop) if module else None
    timers = sched if sched is not None else loop
    own = (lambda: sys.getsizeof(sched)) if sched is not None and module.endswith("._aio") else (lambda: 0)
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
            keyed_own = (lambda: sys.getsizeof(keys)) if module.endswith("._aio") else (lambda: 0)
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


def run(handles: int, timeout_ops: int, repeats: int, progress=None) -> dict:
    """Measure every row of :data:`ROWS` whose loop imports; returns ``{row: figures}``.

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
                _measure_row(module, handles, timeout_ops, repeats, lambda: progress and progress(1)))
            figures.update(loop.run_until_complete(_memory_row(module, handles)))
        finally:
            loop.close()
        results[name] = figures
    return results


def targets(results: dict) -> dict:
    """The asyncio layer's targets, each ``{"value", "target", "at_most", "met"}``; ratios are
    asyncio's cost over the compiled scheduler's, on the default loop."""
    ours, theirs = results.get("WheelScheduler (C)"), results.get("asyncio")
    if not ours:
        return {}

    def ns(row, op):
        cell = (row or {}).get(op)
        return cell["median_ns_per_op"] if isinstance(cell, dict) else None

    out = {}

    def add(name, value, target, at_most):
        if value is not None:
            out[name] = {"value": value, "target": target, "at_most": at_most,
                         "met": value <= target if at_most else value >= target}

    add("re-arm ns", ns(ours, "re-arm"), 150, True)
    add("call_later+cancel ns", ns(ours, "call_later+cancel"), 500, True)
    add("timeout enter+exit ns", ns(ours, "timeout"), 1000, True)
    add("keyed re-arm ns", ns(ours, "keyed re-arm"), 120, True)
    add("bytes per armed handle", ours.get("bytes_per_handle"), 240, True)
    add("bytes per armed key", ours.get("bytes_per_key"), 80, True)
    if theirs:
        for name, op, target in (("asyncio cancel+call_later / re-arm", "re-arm", 30),
                                 ("asyncio cancel+call_later / keyed re-arm", "keyed re-arm", 40),
                                 ("asyncio.timeout / timeout", "timeout", 8)):
            a, b = ns(theirs, "re-arm" if op == "keyed re-arm" else op), ns(ours, op)
            if a and b:
                add(name, a / b, target, False)
    return out

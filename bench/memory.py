"""Bytes per pending timer, for each implementation, at ``memory_timers`` timers.

Three measures are taken for every implementation, one is reported as primary:

- ``tracemalloc``: every Python-allocator byte (object, raw and numpy domains) the
  structure holds after scheduling, with the handles the loop keeps. Exact for
  Python-object structures (pure twin, asyncio, heapq, uvloop's handles), and
  primary for them.
- ``own``: growth of the structure's own byte count, ``nbytes()`` where it has one
  (the C wheel's entry pool and slot tables), else ``sys.getsizeof`` when the type
  reports its buffers through ``__sizeof__``. Primary for the C
  wheel when it reports, since its arrays may come from ``malloc``, which
  tracemalloc does not see.
- ``rss``: growth of the process's resident set (Linux ``/proc/self/statm``, else
  psutil). Coarse (freed pages may be reused), the C wheel's primary only when
  neither of the above sees its memory.

Timers are scheduled 1..30000 ms out (seeded) so they spread over slots and overflow.
The user's copies of the returned ids are not counted: they live on the user's
connection objects either way.
"""
from __future__ import annotations

import gc
import os
import sys
import tracemalloc
from typing import Any

import numpy as np

from .impls import C_WHEEL, Impl

__all__ = ["memory", "rss_bytes"]


def rss_bytes() -> int | None:
    """The process's resident set size in bytes, or None where it cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        pass
    try:
        import psutil
    except ImportError:
        return None
    return psutil.Process().memory_info().rss


def _own_size(obj) -> int | None:
    """The structure's own byte count: its ``nbytes()`` (the C wheel's), else ``sys.getsizeof(obj)``
    if its type defines ``__sizeof__`` itself, else None."""
    if callable(getattr(obj, "nbytes", None)):
        return obj.nbytes()
    for cls in type(obj).__mro__:
        if "__sizeof__" in vars(cls):
            return sys.getsizeof(obj) if cls is not object else None
    return None


def memory(impls: list[Impl], n: int, seed: int, bar) -> dict:
    """Return ``{impl: {"bytes_per_timer", "method", "tracemalloc", "own", "rss"}}`` (bytes/timer)."""
    afters = np.random.default_rng(seed).integers(1, 30_001, size=n).tolist()
    out: dict = {}
    for impl in impls:
        if impl.floor:
            continue
        # Allocated before tracing starts, so only the handles it will point to are counted.
        handles: list = [None] * n if impl.family == "loop" else []
        gc.collect()
        rss0 = rss_bytes()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        timers: Any = impl.make()
        own0 = _own_size(timers)
        if impl.family == "loop":
            call_later, callback = timers.call_later, timers.callback
            for token, after in enumerate(afters):
                handles[token] = call_later(after / 1000, callback, token)
        else:
            schedule = timers.schedule
            for token, after in enumerate(afters):
                schedule(after, token)
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        own = _own_size(timers)
        rss1 = rss_bytes()
        figures = {
            "tracemalloc": traced / n,
            "own": None if own is None or own0 is None else (own - own0) / n,
            "rss": None if rss0 is None or rss1 is None else (rss1 - rss0) / n,
        }
        if impl.name == C_WHEEL:
            method = "own" if figures["own"] else ("tracemalloc" if traced > n else "rss")
        else:
            method = "tracemalloc"
        out[impl.name] = {"bytes_per_timer": figures[method], "method": method, **figures}
        if impl.family == "loop":
            timers.close(handles)
        del timers, handles
        bar.step()
    return out

"""Durable timers by name and recurring schedules: what the names and the schedule rows cost.

- ``by_name_fired_per_s``: :data:`NAMED_TIMERS` timers scheduled by name with
  ``if_exists="replace"``, each re-armed 3 times before it fires (the idle-timeout pattern: a timer
  pushed back on every user action, jobrunr#60), then drained by repeated :func:`run_due` calls as
  in :mod:`.durable`'s ``fired_per_s``; timed on the monotonic clock. ``rearm_per_s`` is the rate
  of the 4 by-name writes per timer (a store read and a guarded batch each).
- ``schedule_us_per_occurrence``: the runner's cost of one occurrence of a 1 s schedule (an
  ``Every(1)`` started :data:`OCCURRENCES` s in the past, misfire ``"all"``, so each
  :func:`run_due` fires one occurrence and commits the move to the next), in µs, beside
  ``reschedule_chain_us_per_fire``: the same loop over the hand-made alternative, a handler that
  returns ``Reschedule(due + 1 s)``. Their difference is what a schedule adds per occurrence (the
  state row's read, guard and rewrite).
"""
from __future__ import annotations

import time
from typing import Callable, Optional

from timerwheel_c.durable import Done, Every, Reschedule, TimerHandler, TimerKind, TimerRegistry, add_schedule, run_due, schedule
from timerwheel_c.durable.timers.runner import Pace
from timerwheel_c.durable.storage.store import Store
from .stores import dispose

__all__ = ["NAMED_TIMERS", "OCCURRENCES", "drain", "named_figures"]

NAMED_TIMERS = 10_000
OCCURRENCES = 300
_KIND = TimerKind(2)
_CHAIN = TimerKind(3)
_P = "named"


class _Noop(TimerHandler):
    kind = _KIND

    def fire(self, ctx, timer):
        return Done()


class _Chain(TimerHandler):
    """The hand-made recurring timer that a schedule replaces: each fire reschedules itself 1 s on."""

    kind = _CHAIN

    def fire(self, ctx, timer):
        return Reschedule(timer.due_at_ms + 1000, b"")


def drain(store: Store, partition: str, registry: TimerRegistry, now_ms: int, n: int, what: str,
          progress: Optional[Callable[[int], None]]) -> float:
    """Call :func:`run_due` (with one :class:`Pace`) on ``partition`` at ``now_ms`` until ``n`` rows
    have fired, reporting each call's fired count to ``progress``; returns the seconds it took.

    Raises:
        RuntimeError: a call fired nothing while rows were left (``what`` names them).
    """
    fired, pace = 0, Pace()
    t0 = time.perf_counter()
    while fired < n:
        report = run_due(store, partition, registry, now_ms, pace=pace)
        if not report.fired:
            raise RuntimeError(f"run_due fired nothing with {n - fired} {what} left: {report}")
        fired += report.fired
        if progress is not None:
            progress(report.fired)
    return time.perf_counter() - t0


def _by_name(store: Store, n: int, progress) -> dict:
    now_ms = time.time_ns() // 1_000_000
    t0 = time.perf_counter()
    for arm in range(4):  # the first arm and 3 re-arms, each further out; the last one is due
        due_ms = now_ms - 60_000 if arm == 3 else now_ms + 3_600_000 * (arm + 1)
        for i in range(n):
            schedule(store, _P, due_ms + i % 1000, _KIND, b"session-%08d" % i, if_exists="replace")
    rearm_s = time.perf_counter() - t0
    drain_s = drain(store, _P, TimerRegistry().register(_Noop()), now_ms, n, "named timers", progress)
    return {"by_name_fired_per_s": n / drain_s, "rearm_per_s": 4 * n / rearm_s}


def _one_per_tick(store: Store, registry: TimerRegistry, now_ms: int, n: int) -> float:
    """µs per run_due call that fires one row, over ``n`` calls."""
    t0 = time.perf_counter()
    for _ in range(n):
        if run_due(store, _P, registry, now_ms).fired != 1:
            raise RuntimeError("a tick did not fire exactly one row")
    return (time.perf_counter() - t0) / n * 1e6


def _per_occurrence(make_store: Callable[[], Store], n: int) -> dict:
    registry = TimerRegistry().register(_Noop())
    now_ms = time.time_ns() // 1_000_000
    store = make_store()
    try:
        add_schedule(store, _P, "every-second", Every(1, start=now_ms - n * 1000 - 500), _KIND, misfire="all",
                     catchup_window_s=n + 10)
        schedule_us = _one_per_tick(store, registry, now_ms, n)
    finally:
        dispose(store)
    store = make_store()
    try:
        schedule(store, _P, now_ms - n * 1000, _CHAIN, b"chain")
        chain_us = _one_per_tick(store, TimerRegistry().register(_Chain()), now_ms, n)
    finally:
        dispose(store)
    return {"schedule_us_per_occurrence": schedule_us, "reschedule_chain_us_per_fire": chain_us}


def named_figures(make_store: Callable[[], Store], progress: Optional[Callable[[int], None]] = None,
                  n_timers: int = NAMED_TIMERS, occurrences: int = OCCURRENCES) -> dict:
    """The figures of the module docstring for one backend (``make_store`` makes an empty store)."""
    store = make_store()
    try:
        figures = _by_name(store, n_timers, progress)
    finally:
        dispose(store)
    return {**figures, **_per_occurrence(make_store, occurrences)}

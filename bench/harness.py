"""Timing method, the one summary of samples, and the fired-set check shared by every workload.

Method: each measurement builds its input state fresh (untimed), times one kernel
on the calling thread's CPU clock (``time.thread_time_ns``), and is repeated
``repeats + 1`` times; the first run is the warm-up and is discarded. Every kernel
is single-threaded and never blocks (the simulated clock sees to that), so on an
idle machine its CPU time is its wall time; on a shared machine the CPU clock
leaves out the time other processes held the core, which wall time would charge
to whichever implementation was unlucky. The
cyclic garbage collector is off inside a timed kernel, as in ``timeit``: that spares
the object-heavy implementations (asyncio, heapq, the pure twin) their collections,
so the ratios in favour of the C wheel are, if anything, understated.

Every percentile the bench reports, in any unit and from any workload, comes from
:func:`summary`: numpy's ``percentile`` with its default (linear interpolation
between closest ranks), so two entry points never report different p99s for the
same samples.

A fast wrong answer must not win: every run's fired timers are checked against the
model the inputs define (which token fires, at which tick, in which order), and a
mismatch raises :class:`FiredMismatch`, which aborts the bench.
"""
from __future__ import annotations

import gc
import hashlib
from dataclasses import dataclass
from time import thread_time_ns
from typing import Callable, Sequence

import numpy as np

__all__ = ["FiredMismatch", "Fired", "NotAvailable", "Stats", "check_fired", "repeat", "set_digest", "summary",
           "timed"]


class FiredMismatch(AssertionError):
    """An implementation fired a different set of timers, at other ticks, or out of order."""


class NotAvailable(Exception):
    """A workload cannot run here (a missing optional dependency or server); the message says why."""


def summary(values) -> dict:
    """``{"n", "min", "p50", "p95", "p99", "max"}`` of ``values``, in their unit; ``{"n": 0}`` when empty.

    The bench's only percentile definition: numpy's default (linear interpolation).
    """
    arr = np.asarray(values, dtype=np.float64)
    if not len(arr):
        return {"n": 0}
    p50, p95, p99 = np.percentile(arr, [50, 95, 99])
    return {"n": int(len(arr)), "min": float(arr.min()), "p50": float(p50), "p95": float(p95), "p99": float(p99),
            "max": float(arr.max())}


@dataclass
class Stats:
    """Per-operation cost over the repeats: ``samples`` in ns/op (warm-up excluded)."""

    samples: list[float]
    ops: int

    @property
    def median(self) -> float:
        return float(np.percentile(self.samples, 50))

    def to_json(self) -> dict:
        q = np.percentile(self.samples, [25, 75]) if self.samples else [float("nan")] * 2
        return {
            "median_ns_per_op": self.median,
            "min_ns_per_op": min(self.samples),
            "max_ns_per_op": max(self.samples),
            "q1_ns_per_op": float(q[0]),
            "q3_ns_per_op": float(q[1]),
            "samples_ns_per_op": list(self.samples),
            "ops": self.ops,
        }


@dataclass
class Fired:
    """What one run fired: ``tokens`` in fire order, split into the advance calls.

    ``marks[i]`` is ``len(tokens)`` after the i-th advance, which ran at ``ticks[i]`` (ms).
    ``ticks`` is None for a real-clock run, where only the set is checked.
    """

    tokens: Sequence[int]
    marks: Sequence[int] = ()
    ticks: Sequence[int] | None = None


def timed(kernel: Callable[[], object]) -> tuple[int, object]:
    """Run ``kernel()`` with the GC off; return (thread CPU ns it took, its result)."""
    gc.collect()
    gc.disable()
    try:
        t0 = thread_time_ns()
        result = kernel()
        elapsed = thread_time_ns() - t0
    finally:
        gc.enable()
    return elapsed, result


def repeat(run_once: Callable[[], dict], repeats: int, step: Callable[[], None]) -> dict[str, Stats]:
    """Call ``run_once()`` ``repeats + 1`` times, dropping the warm-up; return Stats per phase.

    ``run_once`` returns ``{phase: (elapsed_ns, ops)}``, e.g. ``{"schedule": ..., "advance": ...}``.
    """
    stats: dict[str, Stats] = {}
    for i in range(repeats + 1):
        phases = run_once()
        step()
        if not i:
            continue
        for phase, (elapsed, ops) in phases.items():
            stats.setdefault(phase, Stats([], ops)).samples.append(elapsed / ops)
    return stats


def check_fired(where: str, fired: Fired, due_ms: np.ndarray, expected_tick: np.ndarray) -> str:
    """Check one run's fired timers against the model; return a digest of (tick, token) pairs.

    ``due_ms[token]`` is each token's due time and ``expected_tick[token]`` the tick
    (ms) of the advance call that must fire it, or -1 if it must never fire (it was
    cancelled). With ``fired.ticks`` None the digest is :func:`set_digest`'s. The check: every token that must fire fired exactly once, nothing
    else fired, each at its expected tick and, within one advance call, in
    non-decreasing due time. With ``fired.ticks`` None only the set is checked.

    Raises:
        FiredMismatch: naming ``where`` and the first offending token.
    """
    tokens = np.asarray(fired.tokens, dtype=np.int64)
    n = len(due_ms)
    if len(tokens) and (tokens.min() < 0 or tokens.max() >= n):
        raise FiredMismatch(f"{where}: fired a token that was never scheduled")
    must = expected_tick >= 0
    counts = np.bincount(tokens, minlength=n)
    if np.any(counts > 1):
        raise FiredMismatch(f"{where}: token {int(np.argmax(counts > 1))} fired {int(counts.max())} times")
    wrong = np.nonzero((counts == 1) != must)[0]
    if len(wrong):
        t = int(wrong[0])
        what = "fired but was cancelled" if counts[t] else "never fired"
        raise FiredMismatch(f"{where}: {len(wrong)} tokens differ from the model; token {t} {what}")
    if fired.ticks is None:
        return set_digest(tokens)
    else:
        marks = np.asarray(fired.marks, dtype=np.int64)
        if len(marks) != len(fired.ticks) or (len(marks) and marks[-1] != len(tokens)):
            raise FiredMismatch(f"{where}: advance marks do not cover the fired tokens")
        call = np.searchsorted(marks, np.arange(len(tokens)), side="right")
        ticks = np.asarray(fired.ticks, dtype=np.int64)[call]
        late_or_early = np.nonzero(ticks != expected_tick[tokens])[0]
        if len(late_or_early):
            i = int(late_or_early[0])
            raise FiredMismatch(
                f"{where}: token {int(tokens[i])} fired at tick {int(ticks[i])} ms, "
                f"the model says {int(expected_tick[tokens[i]])} ms"
            )
        due = due_ms[tokens]
        out_of_order = np.nonzero((np.diff(due) < 0) & (np.diff(call) == 0))[0]
        if len(out_of_order):
            i = int(out_of_order[0])
            raise FiredMismatch(
                f"{where}: within one advance, token {int(tokens[i + 1])} (due {int(due[i + 1])} ms) "
                f"fired after token {int(tokens[i])} (due {int(due[i])} ms)"
            )
        order = np.lexsort((tokens, ticks))
        pairs = np.stack([ticks[order], tokens[order]])
    return hashlib.sha256(np.ascontiguousarray(pairs).tobytes()).hexdigest()[:16]


def set_digest(tokens) -> str:
    """A digest of the set of fired tokens, order and ticks ignored (for real-clock runs)."""
    arr = np.sort(np.asarray(tokens, dtype=np.int64))
    return hashlib.sha256(arr.tobytes()).hexdigest()[:16]

"""The workloads ``timerwheel-c bench`` runs, in order: how each is measured and printed.

Each :class:`Workload` turns a :class:`Context` into JSON-ready figures
(``measure``), and prints a table from those figures alone (``table``). The CLI
measures every selected workload first, then prints and writes ``--json`` from the
same figures, so nothing is computed while printing.

How to add one is in the package docstring (:mod:`timerwheel_c.bench`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import durable, lateness, network, tables, workloads
from .harness import summary
from .impls import ASYNCIO, C_WHEEL, FLOOR, PURE_WHEEL, Impl
from .memory import memory
from .report import Reporter, Task
from .workloads import Sizes

__all__ = ["BY_NAME", "Context", "WORKLOADS", "Workload", "targets"]

LATENESS_DELAY_MS = 2.0


@dataclass(frozen=True)
class Context:
    """What every workload is measured with: the rows, the sizes, ``--repeat``, ``--seed``, ``--pg-dsn``."""

    impls: list[Impl]
    sizes: Sizes
    repeats: int
    seed: int
    pg_dsn: str | None = None


@dataclass(frozen=True)
class Workload:
    """One name of ``--only``.

    ``steps(ctx)`` is its progress total (None: open-ended), ``measure(ctx, bar)``
    returns its figures (a JSON-ready dict with a ``"results"`` key), and
    ``table(rep, figures)`` prints them.
    """

    name: str
    measure: Callable[[Context, Task], dict]
    table: Callable[[Reporter, dict], None]
    steps: Callable[[Context], float | None]


def _timer_workload(run: Callable[..., workloads.Result]) -> Workload:
    """A workload of :mod:`.workloads`, named by its function (churn, expiry, rto, gap)."""
    name = run.__name__

    def measure(ctx: Context, bar: Task) -> dict:
        return run(ctx.impls, ctx.sizes, ctx.repeats, ctx.seed, bar).to_json()

    return Workload(name, measure, tables.timer_table, lambda ctx: workloads.steps(name, ctx.impls, ctx.repeats))


def _memory(ctx: Context, bar: Task) -> dict:
    n = ctx.sizes.memory_timers
    return {"timers": n, "results": memory(ctx.impls, n, ctx.seed, bar)}


def _lateness(ctx: Context, bar: Task) -> dict:
    series = lateness.run(ctx.sizes.lateness_samples, delay_ms=LATENESS_DELAY_MS, progress=bar)
    return {"delay_ms": LATENESS_DELAY_MS, "results": {
        name: {"summary_us": summary(np.asarray(ns, dtype=np.float64) / 1000), "lateness_ns": [int(x) for x in ns]}
        for name, ns in series.items()
    }}


def _durable(ctx: Context, bar: Task) -> dict:
    stores = durable.run(ctx.sizes.durable_timers, dsn=ctx.pg_dsn, progress=bar)
    figures = {"results": {
        store: {**fig, "lateness_summary_ms": summary(fig.get("lateness_ms", [])),
                "wakeup_lateness_summary_ms": summary(fig.get("wakeup_lateness_ms", []))}
        for store, fig in stores.items()
    }}
    if "postgres" in stores:  # a DSN was given and psycopg is installed
        from . import fleet

        assert ctx.pg_dsn is not None
        figures["fleet"] = fleet.run(ctx.pg_dsn, ctx.sizes.durable_timers, progress=bar)
    return figures


def _network(ctx: Context, bar: Task) -> dict:
    runs = network.run(ctx.sizes.network_connections, ctx.sizes.network_seconds, progress=bar)
    return {"results": {
        name: {**fig, "latency_summary_us": summary(fig.get("latency_us", [])),
               "idle_close_lateness_summary_ms": summary(fig.get("idle_close_lateness_ms", []))}
        for name, fig in runs.items()
    }}


WORKLOADS: tuple[Workload, ...] = (
    *(_timer_workload(run) for run in (workloads.churn, workloads.expiry, workloads.rto, workloads.gap)),
    Workload("memory", _memory, tables.memory_table, lambda ctx: sum(not i.floor for i in ctx.impls)),
    Workload("lateness", _lateness, tables.lateness_table,
             lambda ctx: float(ctx.sizes.lateness_samples * len(lateness.SERIES))),
    Workload("durable", _durable, tables.durable_table, lambda ctx: None),
    Workload("network", _network, tables.network_table,
             lambda ctx: float(network.UNITS_PER_SCHEDULER * len(network.scheduler_names()))),
)
BY_NAME = {w.name: w for w in WORKLOADS}


def targets(workload_figures: dict) -> dict:
    """The churn targets, from the churn figures: each ``{"ratio", "target", "met"}``, ratio = cost / reference.

    Targets: a C ``reschedule`` (and cancel + schedule) at most 1.5x an empty compiled
    method called the same way; the pure twin at least 10x slower than C; asyncio's
    ``handle.cancel()`` + ``call_later`` at least 20x a C re-arm. Empty when churn did
    not run or the C wheel is not built.
    """
    rows = workload_figures.get("churn", {}).get("results", {})
    if C_WHEEL not in rows:
        return {}

    def median(impl: str, variant: str) -> float | None:
        cell = rows.get(impl, {}).get(variant)
        return cell["median_ns_per_op"] if isinstance(cell, dict) else None

    out = {}
    for key, (impl, variant), (ref_impl, ref_variant), target, higher_is_better in (
        ("C reschedule / empty method", (C_WHEEL, "reschedule"), (FLOOR, "reschedule"), 1.5, False),
        ("C cancel+schedule / empty methods", (C_WHEEL, "cancel+schedule"), (FLOOR, "cancel+schedule"), 1.5, False),
        ("pure / C (reschedule)", (PURE_WHEEL, "reschedule"), (C_WHEEL, "reschedule"), 10.0, True),
        ("asyncio cancel+call_later / C reschedule", (ASYNCIO, "cancel+schedule"), (C_WHEEL, "reschedule"), 20.0,
         True),
        ("asyncio cancel+call_later / C cancel+schedule", (ASYNCIO, "cancel+schedule"), (C_WHEEL, "cancel+schedule"),
         20.0, True),
    ):
        cost, ref = median(impl, variant), median(ref_impl, ref_variant)
        if cost is not None and ref:
            value = cost / ref
            out[key] = {"ratio": value, "target": target,
                        "met": value >= target if higher_is_better else value <= target}
    return out

"""The workloads ``python bench/run.py`` runs, in order: how each is measured and printed.

Each :class:`Workload` turns a :class:`Context` into JSON-ready figures
(``measure``), prints a table from those figures alone (``table``), and may judge its
goals on them (``goals``, see :mod:`.goals`). The CLI measures every selected workload
first, then prints and writes ``--json`` from the same figures, so nothing is computed
while printing.

How to add one is in the package docstring (:mod:`bench`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import (aio_micro, durable, durable_api, durable_embedded, durable_fleet, durable_partitions, echo, http, lateness, loop,
               network, tables, workloads)
from .goals import Goal
from .harness import summary
from .impls import ASYNCIO, C_WHEEL, FLOOR, PURE_WHEEL, Impl
from .memory import memory
from .report import Reporter, Task
from .workloads import Sizes

__all__ = ["BY_NAME", "Context", "WORKLOADS", "Workload", "goals"]

LATENESS_DELAY_MS = 2.0


@dataclass(frozen=True)
class Context:
    """What every workload is measured with: the rows, the sizes, ``--repeat``, ``--seed``, ``--pg-dsn``."""

    impls: list[Impl]
    sizes: Sizes
    repeats: int
    seed: int
    pg_dsn: str | None = None


def _no_goals(figures: dict) -> list[tuple[Goal, float | None]]:
    return []


@dataclass(frozen=True)
class Workload:
    """One name of ``--only``.

    ``steps(ctx)`` is its progress total (None: open-ended), ``measure(ctx, bar)``
    returns its figures (a JSON-ready dict with a ``"results"`` key), and
    ``table(rep, figures)`` prints them. ``goals(figures)`` lists its goals, each with
    the value measured for it (None where it does not apply); the CLI judges and prints
    them the same way for every workload.
    """

    name: str
    measure: Callable[[Context, Task], dict]
    table: Callable[[Reporter, dict], None]
    steps: Callable[[Context], float | None]
    goals: Callable[[dict], list[tuple[Goal, float | None]]] = _no_goals
    # The sizes its goals are stated at: Sizes fields (at their defaults) and what each counts.
    # A run at other sizes (--quick, --scale) shows those goals as n/a, with what it measured.
    goal_sizes: tuple[tuple[str, str], ...] = ()


def _timer_workload(run: Callable[..., workloads.Result],
                    goals: Callable[[dict], list[tuple[Goal, float | None]]] = _no_goals,
                    goal_sizes: tuple[tuple[str, str], ...] = ()) -> Workload:
    """A workload of :mod:`.workloads`, named by its function (churn, expiry, rto, gap)."""
    name = run.__name__

    def measure(ctx: Context, bar: Task) -> dict:
        return run(ctx.impls, ctx.sizes, ctx.repeats, ctx.seed, bar).to_json()

    return Workload(name, measure, tables.timer_table, lambda ctx: workloads.steps(name, ctx.impls, ctx.repeats),
                    goals, goal_sizes)


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
                "wakeup_lateness_summary_ms": summary(fig.get("wakeup_lateness_ms", [])),
                **({"wakeup_lateness_16p_summary_ms": summary(fig["wakeup_lateness_16p_ms"])}
                   if "wakeup_lateness_16p_ms" in fig else {})}
        for store, fig in stores.items()
    }}
    if ctx.pg_dsn is not None and "postgres" in stores:  # psycopg is installed
        from . import peers

        figures["fleet"], figures["pgqueuer"] = peers.run(ctx.pg_dsn, ctx.sizes.durable_timers,
                                                           ctx.sizes.durable_rounds, progress=bar)
    else:
        from . import pgqueuer_peer, peers

        figures["pgqueuer"] = peers.unavailable(f"no PostgreSQL server (--pg-dsn); {pgqueuer_peer.INSTALL_HINT}")
    return figures


def _partitions(ctx: Context, bar: Task) -> dict:
    return durable_partitions.measure(durable_partitions.counts(ctx.sizes.partitions_max),
                                      ctx.sizes.partitions_timers, ctx.pg_dsn, ctx.sizes.partitions_effect_rows)


def _fleet(ctx: Context, bar: Task) -> dict:
    if ctx.pg_dsn is None:
        return durable_fleet.unavailable("no PostgreSQL server (--pg-dsn)")
    return durable_fleet.measure(ctx.pg_dsn, ctx.sizes.fleet_partitions)


def _bulk(ctx: Context, bar: Task) -> dict:
    return durable_api.measure(ctx.sizes.bulk_timers, ctx.sizes.durable_rounds, ctx.pg_dsn)


def _embedded(ctx: Context, bar: Task) -> dict:
    return durable_embedded.measure(max(10, ctx.sizes.durable_timers * 2), ctx.sizes.durable_rounds, ctx.pg_dsn)


def _network(ctx: Context, bar: Task) -> dict:
    runs = network.run(ctx.sizes.network_connections, ctx.sizes.network_seconds, progress=bar)
    return {"results": {
        name: {**fig, "latency_summary_us": summary(fig.get("latency_us", [])),
               "idle_close_lateness_summary_ms": summary(fig.get("idle_close_lateness_ms", []))}
        for name, fig in runs.items()
    }}


def _aio(ctx: Context, bar: Task) -> dict:
    return {"handles": ctx.sizes.aio_handles,
            "results": aio_micro.run(ctx.sizes.aio_handles, ctx.sizes.aio_timeout_ops, ctx.repeats, progress=bar,
                                     seed=ctx.seed)}


def _loop(ctx: Context, bar: Task) -> dict:
    return {"handles": ctx.sizes.aio_handles, "async_ops": loop.phase_ops(ctx.sizes.aio_handles),
            "results": loop.run(ctx.sizes.aio_handles, ctx.repeats, ctx.seed, progress=bar)}


def _http(ctx: Context, bar: Task) -> dict:
    return {"connections": ctx.sizes.http_connections, "repeats": ctx.sizes.http_repeats,
            "results": http.run(ctx.sizes.http_connections, ctx.sizes.http_seconds, ctx.sizes.http_repeats,
                                progress=bar)}


def _echo(ctx: Context, bar: Task) -> dict:
    return {"rate_per_s": echo.RATE_PER_S, "repeats": ctx.sizes.echo_repeats,
            "results": echo.run(ctx.sizes.echo_connections, ctx.sizes.echo_seconds, ctx.sizes.echo_repeats,
                                progress=bar)}


def _quotient(value: float | None, reference: float | None) -> float | None:
    return value / reference if value is not None and reference else None


def _churn_goals(figures: dict) -> list[tuple[Goal, float | None]]:
    """A C re-arm (``reschedule``, and cancel + schedule) at most 1.5x an empty compiled method
    called the same way; the pure twin at least 10x and asyncio's ``handle.cancel()`` +
    ``call_later`` at least 20x a C re-arm. Ratios of medians, cost / reference."""
    rows = figures["results"]

    def median(impl: str, variant: str) -> float | None:
        cell = rows.get(impl, {}).get(variant)
        return cell["median_ns_per_op"] if isinstance(cell, dict) else None

    return [
        (Goal("churn", name, bound, at_most=at_most), _quotient(median(*cost), median(*ref)))
        for name, cost, ref, bound, at_most in (
            ("C reschedule / empty method", (C_WHEEL, "reschedule"), (FLOOR, "reschedule"), 1.5, True),
            ("C cancel+schedule / empty methods", (C_WHEEL, "cancel+schedule"), (FLOOR, "cancel+schedule"), 1.5,
             True),
            ("pure / C (reschedule)", (PURE_WHEEL, "reschedule"), (C_WHEEL, "reschedule"), 10.0, False),
            ("asyncio cancel+call_later / C reschedule", (ASYNCIO, "cancel+schedule"), (C_WHEEL, "reschedule"), 20.0,
             False),
            ("asyncio cancel+call_later / C cancel+schedule", (ASYNCIO, "cancel+schedule"),
             (C_WHEEL, "cancel+schedule"), 20.0, False),
        )
    ]


def _lateness_goals(figures: dict) -> list[tuple[Goal, float | None]]:
    """The compiled release timer within 50 us of ``time.sleep`` at the median, and
    ``timerwheel_c.sleep`` at most half as late as ``asyncio.sleep``."""
    p50 = {name: fig["summary_us"].get("p50") for name, fig in figures["results"].items()}
    release, sleep = p50.get("ReleaseTimer (c)"), p50.get("time.sleep")
    return [
        (Goal("lateness", "C release p50 - time.sleep p50", 50.0, at_most=True, unit="us"),
         None if release is None or sleep is None else release - sleep),
        (Goal("lateness", "timerwheel_c.sleep p50 / asyncio.sleep p50", 0.5, at_most=True),
         _quotient(p50.get("timerwheel_c.sleep"), p50.get("asyncio.sleep"))),
    ]


# Fleet goals on PostgreSQL: fired/s by number of runner processes, and the seconds to take
# over a killed runner's share.
FLEET_FIRED_PER_S_GOALS = {1: 3000.0, 4: 8000.0}
TAKEOVER_GOAL_S = durable_fleet.TAKEOVER_GOAL_S
# Against pgqueuer on the same server (when compared): our fired/s over its at batch 100, by
# process count; the CPU per timer our single runner fires, the server's and the runner's (µs); and
# the cross-process wake-up p50 and p99 (ms) of a runner serving 16 partitions.
VERSUS_PGQUEUER_GOALS = {1: 1.5, 4: 1.8}
SERVER_CPU_GOAL_US = 20.0
RUNNER_CPU_GOAL_US = 25.0
WAKEUP_16P_GOALS_MS = (3.5, 15.0)


def _durable_goals(figures: dict) -> list[tuple[Goal, float | None]]:
    """Every store: at least 5,000 fired timers per second, due-to-committed p99 at most 20 ms,
    a cross-process wake-up p99 at most 50 ms and no duplicate effect with 20 ms handlers;
    SQLite: at least 500 fired/s with 20 ms handlers at concurrency 16 and an idle change
    watcher at most 1 % of a core; the PostgreSQL fleet (when measured):
    :data:`FLEET_FIRED_PER_S_GOALS` and a takeover after SIGKILL within :data:`TAKEOVER_GOAL_S`;
    against pgqueuer (when compared) :data:`VERSUS_PGQUEUER_GOALS`, :data:`SERVER_CPU_GOAL_US`, :data:`RUNNER_CPU_GOAL_US` and
    :data:`WAKEUP_16P_GOALS_MS` on PostgreSQL."""
    out: list[tuple[Goal, float | None]] = []
    for store, fig in figures["results"].items():
        out.append((Goal("durable", f"{store} fired timers per second", 5000.0, at_most=False, unit="fired/s"),
                    fig.get("fired_per_s")))
        out.append((Goal("durable", f"{store} lateness p99", 20.0, at_most=True, unit="ms"),
                    fig.get("lateness_summary_ms", {}).get("p99")))
        if "wakeup_lateness_ms" not in fig:  # the service figures were not measured
            continue
        out.append((Goal("durable", f"{store} wake-up p99, timer written by another process", 50.0, at_most=True,
                         unit="ms"), fig.get("wakeup_lateness_summary_ms", {}).get("p99")))
        io = fig.get("fired_per_s_20ms", {})
        duplicates = [f["duplicates"] for f in io.values() if "duplicates" in f]
        out.append((Goal("durable", f"{store} duplicate effects, 20 ms handlers", 0.0, at_most=True, unit="effects"),
                    float(sum(duplicates)) if duplicates else None))
        if store == "sqlite":
            out.append((Goal("durable", "sqlite 20 ms handlers at concurrency 16", 500.0, at_most=False,
                             unit="fired/s"), io.get("16", {}).get("fired_per_s")))
            out.append((Goal("durable", "sqlite idle change watcher", 1.0, at_most=True, unit="% of a core"),
                        fig.get("watcher_idle_cpu_pct")))
    wake16 = figures["results"].get("postgres", {}).get("wakeup_lateness_16p_summary_ms")
    if wake16 is not None:
        for q, bound_ms in zip(("p50", "p99"), WAKEUP_16P_GOALS_MS):
            out.append((Goal("durable", f"postgres wake-up {q}, timer written by another process, 16 partitions",
                             bound_ms, at_most=True, unit="ms"), wake16.get(q)))
    fleet = dict(figures.get("fleet", {}))
    for n, bound_x in VERSUS_PGQUEUER_GOALS.items():
        peer = figures.get("pgqueuer", {}).get("results", {}).get(f"workers_{n}_batch_100")
        if peer is not None:
            out.append((Goal("durable", f"fleet of {n} runner(s) / pgqueuer {n} worker(s) at batch 100, fired/s",
                             bound_x, at_most=False), peer["ours_over_pgqueuer"]))
    one = fleet.get("runners_1", {})
    if one:
        for side, bound_us in (("server", SERVER_CPU_GOAL_US), ("runner", RUNNER_CPU_GOAL_US)):
            out.append((Goal("durable", f"fleet of 1 runner, {side} CPU per fired timer", bound_us, at_most=True,
                             unit="us"), one.get(f"{side}_cpu_us_per_fired")))
    wakeup = fleet.pop("new_partition_wakeup", None)
    if wakeup is not None:
        out.append((Goal("durable", "fleet wake-up into a new partition, p99", 50.0, at_most=True, unit="ms"),
                     wakeup["lateness_p99_ms"]))
    for fig in fleet.values():
        bound = FLEET_FIRED_PER_S_GOALS.get(fig["runners"])
        if bound is not None and fig.get("budget") != "large":  # the goals are for timerwheel-c run's budget
            out.append((Goal("durable", f"fleet of {fig['runners']} runner process(es), fired timers per second",
                             bound, at_most=False, unit="fired/s"), fig.get("fired_per_s")))
        if "takeover_s" in fig:
            out.append((Goal("durable", f"fleet takeover after SIGKILL ({fig['runners']} runners)", TAKEOVER_GOAL_S,
                             at_most=True, unit="s"), fig["takeover_s"]))
    return out


WORKLOADS: tuple[Workload, ...] = (
    _timer_workload(workloads.churn, _churn_goals, (("churn_conns", "connections"), ("churn_ops", "ops"))),
    *(_timer_workload(run) for run in (workloads.expiry, workloads.rto, workloads.gap)),
    Workload("memory", _memory, tables.memory_table, lambda ctx: sum(not i.floor for i in ctx.impls)),
    Workload("lateness", _lateness, tables.lateness_table,
             lambda ctx: float(ctx.sizes.lateness_samples * len(lateness.SERIES)), _lateness_goals),
    Workload("durable", _durable, tables.durable_table, lambda ctx: None, _durable_goals,
             (("durable_timers", "timers"),)),
    Workload("partitions", _partitions, durable_partitions.table, lambda ctx: None, durable_partitions.goals,
             (("partitions_max", "partitions"),)),
    Workload("fleet", _fleet, durable_fleet.table, lambda ctx: None, durable_fleet.goals,
             (("fleet_partitions", "partitions"),)),
    Workload("embedded", _embedded, durable_embedded.table, lambda ctx: None, durable_embedded.goals),
    Workload("bulk", _bulk, durable_api.table, lambda ctx: None, durable_api.goals, (("bulk_timers", "timers"),)),
    Workload("network", _network, tables.network_table,
             lambda ctx: float(network.UNITS_PER_SCHEDULER * len(network.scheduler_names()))),
    Workload("aio", _aio, tables.aio_table, lambda ctx: float(len(aio_micro.ROWS) * (ctx.repeats + 1)),
             aio_micro.goals, (("aio_handles", "handles armed"),)),
    Workload("echo", _echo, tables.echo_table,
             lambda ctx: float(len(ctx.sizes.echo_connections) * len(echo.pairs()) * ctx.sizes.echo_repeats),
             echo.goals),
    Workload("loop", _loop, loop.table, lambda ctx: float(len(loop.loop_factories()) * (ctx.repeats + 1)), loop.goals),
    Workload("http", _http, http.table, lambda ctx: float(len(http.loops()) * ctx.sizes.http_repeats), http.goals),
)
BY_NAME = {w.name: w for w in WORKLOADS}


def goals(workload_figures: dict, sizes: dict) -> list[dict]:
    """The verdicts (:meth:`.goals.Goal.judge`) of every measured workload's goals, in run order;
    ``sizes`` are the run's (:class:`.workloads.Sizes` as a dict). A workload measured at other
    sizes than its goals are set for gets them as n/a, saying the size they are set for."""
    stated = Sizes().__dict__
    out = []
    for name, figures in workload_figures.items():
        workload = BY_NAME[name]
        differs = any(sizes.get(field) != stated[field] for field, _ in workload.goal_sizes)
        set_at = ", ".join(f"{stated[field]:,} {what}" for field, what in workload.goal_sizes) if differs else None
        out += [goal.judge(value, set_at) for goal, value in workload.goals(figures)]
    return out

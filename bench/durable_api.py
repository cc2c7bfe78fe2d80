"""What the durable API's convenience forms cost against the low-level ones.

    python bench/run.py -m bench.durable_api [--timers N] [--rounds R] [--pg-dsn DSN]

- ``fire``: µs per fired timer of a handler written as a plain function (``@registry.handler``)
  and as a :class:`TimerHandler` subclass, both returning ``Done()`` at once, each draining ``N``
  due rows with repeated :func:`run_due` calls on a SQLite file; rounds interleave, medians. The
  target: the function costs no more than the class (a ratio of about 1.0).
- ``bulk``: timers/s written into an empty store by one :func:`schedule_many` call of ``N`` new
  timers over 4 partitions, against a loop of :func:`schedule` (over ``min(N, 1000)`` timers,
  which is slow), and on PostgreSQL against pgqueuer's batch enqueue (``Queries.enqueue`` of ``N``
  jobs, its connect included) when it is installed (the ``peers`` extra). SQLite runs with its
  store's default (WAL, ``synchronous=NORMAL``), PostgreSQL with the server's ``synchronous_commit``
  (on: a WAL flush per commit). Target: >= 50,000 timers/s on both (:data:`BULK_GOAL_PER_S`). It is
  the ``bulk`` workload of ``python bench/run.py`` (100,000 timers; ``--quick``: 10,000).

On SQLite (and PostgreSQL with ``--pg-dsn``, or ``$TIMERWHEEL_C_STORE`` when that is a postgresql://
URL). Figures from a machine shared with other work swing from run to run: read the ratios.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from typing import Callable, Optional

from timerwheel_c.durable import Done, TimerHandler, TimerKind, TimerRegistry, schedule, schedule_many
from timerwheel_c.durable.storage.sqlite import SQLiteStore
from timerwheel_c.durable.storage.store import Store
from .durable_named import drain
from .goals import Goal, print_alone
from .report import Reporter, fmt
from .stores import add_pg_dsn, dispose, pg_dsn

__all__ = ["BULK_GOAL_PER_S", "bulk_figures", "fire_figures", "goals", "measure", "table"]

_KIND = TimerKind(7)
_P = "api"
_PARTITIONS = 4
_LOOP_MAX = 1000
BULK_GOAL_PER_S = 50_000.0  # timers/s of one schedule_many, on each backend


class _ClassNoop(TimerHandler):
    kind = _KIND

    def fire(self, ctx, timer):
        return Done()


def _function_noop(ctx, timer):
    return Done()


def _us_per_fire(store: Store, registry: TimerRegistry, n: int) -> float:
    now_ms = time.time_ns() // 1_000_000
    schedule_many(store, [(_P, now_ms - 60_000 + i % 1000, _KIND, b"%08d" % i) for i in range(n)])
    return drain(store, _P, registry, now_ms, n, "rows", None) / n * 1e6


def fire_figures(make_store: Callable[[], Store], n: int, rounds: int) -> dict:
    """``{"class_us", "function_us", "function_over_class"}``: medians of ``rounds`` interleaved rounds."""
    function_registry = TimerRegistry()
    function_registry.handler(_KIND)(_function_noop)
    variants = {"class_us": TimerRegistry().register(_ClassNoop()), "function_us": function_registry}
    samples: dict = {name: [] for name in variants}
    for _ in range(rounds):
        for name, registry in variants.items():
            store = make_store()
            try:
                samples[name].append(_us_per_fire(store, registry, n))
            finally:
                dispose(store)
    out = {name: statistics.median(values) for name, values in samples.items()}
    out["function_over_class"] = out["function_us"] / out["class_us"]
    return out


def _timers(n: int, tag: bytes) -> list:
    due_ms = time.time_ns() // 1_000_000 + 3_600_000
    return [(f"p{i % _PARTITIONS}", due_ms + i, _KIND, b"%s-%08d" % (tag, i), b"value") for i in range(n)]


def _rate(n: int, write: Callable, *args) -> float:
    t0 = time.perf_counter()
    write(*args)
    return n / (time.perf_counter() - t0)


def _one_by_one(store: Store, timers: list) -> None:
    for partition, due_ms, kind, reference, value in timers:
        schedule(store, partition, due_ms, kind, reference, value)


def bulk_figures(make_store: Callable[[], Store], n: int, rounds: int) -> dict:
    """``{"many_per_s", "loop_per_s", "many_over_loop"}``: medians of ``rounds`` rounds, each on a new store."""
    many, loop = [], []
    for r in range(rounds):
        store = make_store()
        try:
            many.append(_rate(n, schedule_many, store, _timers(n, b"m%d" % r)))
            looped = _timers(min(n, _LOOP_MAX), b"l%d" % r)
            loop.append(_rate(len(looped), _one_by_one, store, looped))
        finally:
            dispose(store)
    out = {"many_per_s": statistics.median(many), "loop_per_s": statistics.median(loop)}
    out["many_over_loop"] = out["many_per_s"] / out["loop_per_s"]
    return out


def pgqueuer_enqueue_per_s(dsn: str, n: int, rounds: int) -> Optional[float]:
    """Jobs/s of pgqueuer's batch enqueue of ``n`` jobs (median of ``rounds``), or None without pgqueuer."""
    from . import pgqueuer_peer

    if pgqueuer_peer.missing() is not None:
        return None
    rates = []
    for r in range(rounds):
        schema = f"timerwheel_bench_pgq_api_{os.getpid()}_{r}"
        asyncio.run(pgqueuer_peer._admin(dsn, schema, "install"))
        try:
            rates.append(_rate(n, asyncio.run, pgqueuer_peer._admin(dsn, schema, "enqueue", n, 3600.0)))
        finally:
            asyncio.run(pgqueuer_peer._admin(dsn, schema, "uninstall"))
    return statistics.median(rates)


def _stores(tmp: str, dsn: Optional[str]) -> dict:
    """``{backend: () -> a new empty store}``: SQLite files in ``tmp``, and PostgreSQL tables on ``dsn``."""
    counter = iter(range(1_000_000))
    stores: dict = {"sqlite": lambda: SQLiteStore(os.path.join(tmp, f"api{next(counter)}.db"))}
    if dsn:
        from timerwheel_c.durable.storage.postgres import PostgresStore

        stores["postgres"] = lambda: PostgresStore(dsn, table=f"tw_bench_api_{uuid.uuid4().hex[:12]}")
    return stores


def measure(n: int, rounds: int, dsn: Optional[str]) -> dict:
    """``{"timers", "rounds", "results": {backend: {...bulk_figures, "pgqueuer_per_s"}}}``: the
    ``bulk`` figures of ``n`` timers per backend (``"sqlite"``, and ``"postgres"`` on ``dsn``), with
    pgqueuer's batch enqueue beside PostgreSQL's (None when pgqueuer is not installed). JSON-ready."""
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="timerwheel-c-api-") as tmp:
        for backend, make_store in _stores(tmp, dsn).items():
            results[backend] = bulk_figures(make_store, n, rounds)
            if dsn and backend == "postgres":
                results[backend]["pgqueuer_per_s"] = pgqueuer_enqueue_per_s(dsn, n, rounds)
    return {"timers": n, "rounds": rounds, "results": results}


def goals(figures: dict) -> list[tuple[Goal, Optional[float]]]:
    """Per backend, ``schedule_many``'s timers/s: at least :data:`BULK_GOAL_PER_S`."""
    return [(Goal("bulk", f"{backend} schedule_many, new timers written per second", BULK_GOAL_PER_S,
                  at_most=False, unit="timers/s"), fig["many_per_s"]) for backend, fig in figures["results"].items()]


def table(rep: Reporter, figures: dict) -> None:
    """Timers/s of ``schedule_many`` and of a loop of ``schedule()``, and pgqueuer's batch enqueue."""
    rows = []
    for backend, fig in figures["results"].items():
        peer = fig.get("pgqueuer_per_s")
        rows.append([backend, fmt(fig["many_per_s"]), fmt(fig["loop_per_s"]), f"{fig['many_over_loop']:.1f}x",
                     "n/a" if peer is None else fmt(peer), "n/a" if peer is None else f"{fig['many_per_s'] / peer:.2f}x"])
    rep.table(f"bulk: {figures['timers']:,} new timers over {_PARTITIONS} partitions written by one schedule_many, "
              f"median of {figures['rounds']} round(s) (see bench/durable_api.py)",
              ["backend", "schedule_many /s", "schedule() loop /s", "many / loop", "pgqueuer enqueue /s",
               "many / pgqueuer"], rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python bench/run.py -m bench.durable_api", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--timers", type=int, default=20_000, help="timers per figure (default 20000)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per figure (median; default 3)")
    add_pg_dsn(p)
    args = p.parse_args(argv)
    dsn = pg_dsn(args.pg_dsn)
    with tempfile.TemporaryDirectory(prefix="timerwheel-c-api-") as tmp:
        fire = fire_figures(_stores(tmp, None)["sqlite"], min(args.timers, 5000), args.rounds)
    print(f"fire, SQLite, {min(args.timers, 5000)} rows drained by run_due, median of {args.rounds} rounds: "
          f"class handler {fire['class_us']:.1f} us, function handler {fire['function_us']:.1f} us "
          f"({fire['function_over_class']:.2f}x the class)")
    figures = measure(args.timers, args.rounds, dsn)
    print_alone(figures, [goal.judge(value) for goal, value in goals(figures)], table, as_json=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

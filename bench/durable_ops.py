"""What operating a durable runner costs: Prometheus metrics, and the async writer.

    python bench/run.py -m bench.durable_ops [--rounds N] [--pg-dsn DSN] [--only metrics|writer]

- ``metrics_overhead``: fired/s of a :class:`DurableTimerService` on SQLite firing
  :data:`TIMERS` rows already due (a handler returning Done at once, the case most sensitive to
  any overhead, and one sleeping 20 ms), without and with a ``/metrics`` server scraped over
  loopback HTTP every :data:`SCRAPE_EVERY_S` (a hundred times Prometheus' default rate),
  interleaved round by round so that the machine's drift hits both alike; the median of each and
  their ratio. Target: with metrics >= 0.95 x without.
- ``async_writer``: schedules/s of :data:`WRITES` writes, on SQLite (and PostgreSQL with ``--pg-dsn``,
  or ``$TIMERWHEEL_C_STORE`` when that is a postgresql:// URL): ``timerwheel_c.durable.schedule``
  called one after another, and from :data:`CONCURRENCY` threads at once; against
  ``await timerwheel_c.durable.aio.schedule`` awaited one after another, and from
  :data:`CONCURRENCY` tasks at once (``asyncio.gather``, each task writing in turn); the concurrent
  writers write to one partition, then (``spread``) each to a partition of its own. On SQLite the
  async writer is the sync one on the store's writer thread: its price is the thread hop. On
  PostgreSQL it awaits the writes on a pool per loop (up to 4 connections), where concurrent tasks
  overlap their round trips, while the sync writer's threads share the store's one connection; on
  one partition the commits still queue on the partition's advisory lock (each holds it through its
  commit's WAL flush), so the pool's gain shows with the writes spread over partitions.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Optional

from timerwheel_c.durable import aio, schedule
from timerwheel_c.durable.service.cli import STORE_ENV
from timerwheel_c.durable.service.exporter import serve
from timerwheel_c.durable.service.service import DurableTimerService
from timerwheel_c.durable.storage.sqlite import SQLiteStore
from timerwheel_c.durable.storage.store import Batch, Store
from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerKind, TimerRegistry
from .stores import dispose

__all__ = ["CONCURRENCY", "SCRAPE_EVERY_S", "TIMERS", "WRITES", "async_writer", "metrics_overhead"]

_KIND = TimerKind(3)
_P = "ops"
TIMERS = {"done_at_once": 20_000, "sleep_20ms": 2_000}  # rows per handler: a few seconds of work each
WRITES = 512
CONCURRENCY = 16  # writers at once: threads (sync) or tasks (async), WRITES / CONCURRENCY writes each
SCRAPE_EVERY_S = 0.1


class _Now(TimerHandler):
    kind = _KIND

    def __init__(self, sleep_s: float):
        self.sleep_s = sleep_s

    def fire(self, ctx, timer):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return Done()


def _fired_per_s(path: Path, n: int, sleep_s: float, scraped: bool) -> float:
    store = SQLiteStore(path)
    now_ms = time.time_ns() // 1_000_000
    store.apply_many(_P, [Batch().put(keys.timer(now_ms - 1000, _KIND, b"%06d" % i), b"") for i in range(n)])
    svc = DurableTimerService(store, TimerRegistry().register(_Now(sleep_s)), [_P], concurrency=16)
    server = serve(svc, 0) if scraped else None
    stop = threading.Event()
    scrapes = 0

    def scrape():
        nonlocal scrapes
        assert server is not None
        while not stop.wait(SCRAPE_EVERY_S):
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as r:
                r.read()
            scrapes += 1

    scraper = threading.Thread(target=scrape, daemon=True) if scraped else None
    try:
        t0 = time.perf_counter()
        if scraper is not None:
            scraper.start()
        with svc:
            deadline = time.monotonic() + 300
            while svc.fired < n and time.monotonic() < deadline:
                time.sleep(0.005)
            elapsed_s = time.perf_counter() - t0
        if svc.fired < n:
            raise RuntimeError(f"only {svc.fired} of {n} timers fired")
        if scraped and scrapes == 0:
            raise RuntimeError("the metrics server was never scraped: the run was too short to tell")
    finally:
        stop.set()
        if scraper is not None:
            scraper.join()
        if server is not None:
            server.close()
        store.close()
        path.unlink()
    return n / elapsed_s


def metrics_overhead(rounds: int, tmp: str) -> dict:
    """``{handler: {"without": fired/s, "with": fired/s, "ratio": with / without}}`` (medians)."""
    out = {}
    for label, sleep_s in (("done_at_once", 0.0), ("sleep_20ms", 0.020)):
        runs: dict = {False: [], True: []}
        for r in range(rounds):
            for scraped in ((False, True) if r % 2 == 0 else (True, False)):
                runs[scraped].append(_fired_per_s(Path(tmp) / f"m{r}{int(scraped)}.db", TIMERS[label], sleep_s, scraped))
        without, with_ = statistics.median(runs[False]), statistics.median(runs[True])
        out[label] = {"without": without, "with": with_, "ratio": with_ / without}
    return out


def _writes_per_s(store: Store, rounds: int) -> dict:
    due = time.time_ns() // 1_000_000 + 3_600_000
    each = WRITES // CONCURRENCY

    def sync_run(tag: bytes) -> float:
        t0 = time.perf_counter()
        for i in range(WRITES):
            schedule(store, _P, due, _KIND, tag + b"%d" % i)
        return WRITES / (time.perf_counter() - t0)

    def sync_threads(tag: bytes, spread: bool) -> float:
        def writes(t: int):
            partition = f"{_P}{t}" if spread else _P
            for i in range(each):
                schedule(store, partition, due, _KIND, tag + b"%d/%d" % (t, i))

        threads = [threading.Thread(target=writes, args=(t,)) for t in range(CONCURRENCY)]
        t0 = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return each * CONCURRENCY / (time.perf_counter() - t0)

    async def sequential(tag: bytes) -> float:
        await aio.schedule(store, _P, due, _KIND, tag + b"warm")  # the loop's pool (PostgreSQL) is made here
        t0 = time.perf_counter()
        for i in range(WRITES):
            await aio.schedule(store, _P, due, _KIND, tag + b"%d" % i)
        return WRITES / (time.perf_counter() - t0)

    async def tasks(tag: bytes, spread: bool) -> float:
        async def writes(t: int):
            partition = f"{_P}{t}" if spread else _P
            for i in range(each):
                await aio.schedule(store, partition, due, _KIND, tag + b"%d/%d" % (t, i))

        await aio.schedule(store, _P, due, _KIND, tag + b"warm")
        t0 = time.perf_counter()
        await asyncio.gather(*(writes(t) for t in range(CONCURRENCY)))
        return each * CONCURRENCY / (time.perf_counter() - t0)

    runs: dict = {"sync": [], "sync_concurrent": [], "sync_spread": [], "async_sequential": [],
                  "async_concurrent": [], "async_spread": []}
    for r in range(rounds):
        runs["sync"].append(sync_run(b"s%d/" % r))
        runs["sync_concurrent"].append(sync_threads(b"t%d/" % r, False))
        runs["sync_spread"].append(sync_threads(b"u%d/" % r, True))
        runs["async_sequential"].append(asyncio.run(sequential(b"a%d/" % r)))
        runs["async_concurrent"].append(asyncio.run(tasks(b"g%d/" % r, False)))
        runs["async_spread"].append(asyncio.run(tasks(b"h%d/" % r, True)))
    med = {k: statistics.median(v) for k, v in runs.items()}
    med["async_sequential_ratio"] = med["async_sequential"] / med["sync"]
    med["async_concurrent_ratio"] = med["async_concurrent"] / med["sync_concurrent"]
    med["async_spread_ratio"] = med["async_spread"] / med["sync_spread"]
    return med


def async_writer(rounds: int, tmp: str, dsn: Optional[str]) -> dict:
    """``{backend: {"sync": schedules/s, "sync_concurrent": ..., "sync_spread": ..., "async_sequential": ...,
    "async_concurrent": ..., "async_spread": ..., and each async / sync ratio ("async_sequential_ratio",
    "async_concurrent_ratio", "async_spread_ratio")}}``."""
    store: Store = SQLiteStore(Path(tmp) / "w.db")
    try:
        out = {"sqlite": _writes_per_s(store, rounds)}
    finally:
        store.close()
    if dsn:
        from timerwheel_c.durable.storage.postgres import PostgresStore

        store = PostgresStore(dsn, table=f"tw_bench_ops_{uuid.uuid4().hex[:12]}")
        try:
            out["postgres"] = _writes_per_s(store, rounds)
        finally:
            dispose(store)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python bench/run.py -m bench.durable_ops", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per figure (median; default 5)")
    p.add_argument("--pg-dsn", default=None, help=f"also the async writer on PostgreSQL (default: ${STORE_ENV} "
                                                  "when that is a postgresql:// URL)")
    p.add_argument("--only", choices=("metrics", "writer"), default=None, help="one of the two figures (default: both)")
    args = p.parse_args(argv)
    dsn = args.pg_dsn
    if dsn is None and os.environ.get(STORE_ENV, "").startswith(("postgresql://", "postgres://")):
        dsn = os.environ[STORE_ENV]
    logging.getLogger("timerwheel_c.durable").setLevel(logging.ERROR)  # backlogs are deliberate here
    with tempfile.TemporaryDirectory(prefix="timerwheel-c-ops-") as tmp:
        over = metrics_overhead(args.rounds, tmp) if args.only != "writer" else {}
        writes = async_writer(args.rounds, tmp, dsn) if args.only != "metrics" else {}
    if over:
        _print_metrics(over, args.rounds)
    if writes:
        _print_writes(writes, args.rounds)
    return 0


def _print_metrics(over: dict, rounds: int) -> None:
    print(f"metrics overhead: fired/s of {TIMERS} due timers by handler, concurrency 16, SQLite; /metrics scraped every "
          f"{SCRAPE_EVERY_S} s; median of {rounds} interleaved rounds (target: with / without >= 0.95)")
    for label, f in over.items():
        print(f"  {label:14s} without {f['without']:9.0f}/s  with {f['with']:9.0f}/s  with/without {f['ratio']:.3f}")


def _print_writes(writes: dict, rounds: int) -> None:
    print(f"async writer: schedules/s of {WRITES} writes, median of {rounds} rounds; concurrent: {CONCURRENCY} "
          "threads (sync) or tasks (async) at once, on one partition or each on its own (spread)")
    for backend, f in writes.items():
        print(f"  {backend:9s}" + "  ".join(
            f"{label}: sync {f[s]:6.0f}/s async {f[a]:6.0f}/s ({f[a + '_ratio']:.2f}x)"
            for label, s, a in (("one at a time", "sync", "async_sequential"),
                                ("concurrent", "sync_concurrent", "async_concurrent"),
                                ("spread", "sync_spread", "async_spread"))))


if __name__ == "__main__":
    raise SystemExit(main())

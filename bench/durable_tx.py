"""What writing a timer in the caller's own transaction (``conn=``) costs against the store's own writer.

    python bench/run.py -m bench.durable_tx [--rounds N] [--pg-dsn DSN]

Schedules/s of :data:`WRITES` timers, each in a transaction of its own, so that every variant pays
one commit per timer:

- ``own``: ``schedule(store, ...)``, the store's own connection and transaction;
- ``conn``: ``schedule(store, ..., conn=c)`` then ``c.commit()`` on the caller's connection (sqlite3's
  default mode, psycopg's non-autocommit), the write inside a savepoint of that transaction;
- ``conn_async`` (PostgreSQL): ``await aio.schedule(store, ..., conn=ac)`` then ``await ac.commit()``
  on a psycopg ``AsyncConnection``;
- ``conn_one_tx``: all :data:`WRITES` in one caller's transaction and one commit, what an application
  writing many timers with its rows pays per timer.

On SQLite (and PostgreSQL with ``--pg-dsn``, or ``$TIMERWHEEL_C_STORE`` when that is a postgresql://
URL); the variants interleave round by round so that the machine's drift hits all alike; medians,
and each as a ratio of ``own`` within the run.
"""
from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable, Optional

from timerwheel_c.durable import aio, schedule
from timerwheel_c.durable.storage.sqlite import SQLiteStore
from timerwheel_c.durable.storage.store import Store
from timerwheel_c.durable.timers.registry import TimerKind
from .stores import add_pg_dsn, dispose, pg_dsn

__all__ = ["WRITES", "tx_writes"]

_KIND = TimerKind(4)
_P = "tx"
WRITES = 500


def _rate(run: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    run()
    return WRITES / (time.perf_counter() - t0)


def _variants(store: Store, connect: Callable, aconnect: Optional[Callable]) -> dict:
    """``{variant: callable(tag) -> schedules/s}`` for ``store``; ``connect()`` opens a caller's
    connection, ``aconnect()`` (or None) an async one."""
    due = time.time_ns() // 1_000_000 + 3_600_000
    conn = connect()

    def own(tag: bytes) -> float:
        def run():
            for i in range(WRITES):
                schedule(store, _P, due, _KIND, tag + b"%d" % i)
        return _rate(run)

    def each(tag: bytes) -> float:
        def run():
            for i in range(WRITES):
                schedule(store, _P, due, _KIND, tag + b"%d" % i, conn=conn)
                conn.commit()
        return _rate(run)

    def one_tx(tag: bytes) -> float:
        def run():
            for i in range(WRITES):
                schedule(store, _P, due, _KIND, tag + b"%d" % i, conn=conn)
            conn.commit()
        return _rate(run)

    out = {"own": own, "conn": each, "conn_one_tx": one_tx}
    if aconnect is not None:
        async def each_async(tag: bytes) -> float:
            async with await aconnect() as aconn:
                t0 = time.perf_counter()
                for i in range(WRITES):
                    await aio.schedule(store, _P, due, _KIND, tag + b"%d" % i, conn=aconn)
                    await aconn.commit()
                return WRITES / (time.perf_counter() - t0)

        out["conn_async"] = lambda tag: asyncio.run(each_async(tag))
    return out


def _sqlite_connect(path: Path) -> sqlite3.Connection:
    """The caller's connection, with the store's own durability: a new sqlite3 connection runs
    ``synchronous=FULL`` (an fsync per commit in WAL mode), where the store runs NORMAL; that is the
    caller's setting, not the write's cost, so the bench sets it as the store does."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def _medians(variants: dict, rounds: int) -> dict:
    runs: dict = {name: [] for name in variants}
    for r in range(rounds):
        names = list(variants) if r % 2 == 0 else list(reversed(variants))
        for name in names:
            runs[name].append(variants[name](b"%s%d/" % (name.encode(), r)))
    med = {name: statistics.median(v) for name, v in runs.items()}
    return {name: (rate, rate / med["own"]) for name, rate in med.items()}


def tx_writes(rounds: int, tmp: str, dsn: Optional[str]) -> dict:
    """``{backend: {variant: (schedules/s, ratio to own)}}`` (medians of ``rounds``)."""
    path = Path(tmp) / "tx.db"
    store: Store = SQLiteStore(path)
    try:
        out = {"sqlite": _medians(_variants(store, lambda: _sqlite_connect(path), None), rounds)}
    finally:
        store.close()
    if dsn:
        import psycopg

        from timerwheel_c.durable.storage.postgres import PostgresStore

        store = PostgresStore(dsn, table=f"tw_bench_tx_{uuid.uuid4().hex[:12]}")
        try:
            out["postgres"] = _medians(_variants(store, lambda: psycopg.connect(dsn),
                                                 lambda: psycopg.AsyncConnection.connect(dsn)), rounds)
        finally:
            dispose(store)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python bench/run.py -m bench.durable_tx", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per figure (median; default 5)")
    add_pg_dsn(p)
    args = p.parse_args(argv)
    dsn = pg_dsn(args.pg_dsn)
    with tempfile.TemporaryDirectory(prefix="timerwheel-c-tx-") as tmp:
        figures = tx_writes(args.rounds, tmp, dsn)
    print(f"schedules/s of {WRITES} writes, a commit each (conn_one_tx: one commit for all), median of "
          f"{args.rounds} interleaved rounds; x = ratio to the store's own writer in this run")
    for backend, variants in figures.items():
        print(f"  {backend}: " + "  ".join(f"{name} {rate:8.0f}/s ({ratio:.2f}x)"
                                           for name, (rate, ratio) in variants.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

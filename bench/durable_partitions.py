"""Wake-up lateness against the number of partitions: a pass must cost the same with 100,000 idle
partitions as with one, since it reads by shard (docs/DESIGN.md, "Shards").

For each partition count, this fills a new store with that many partitions, each holding one timer a
day away, and :data:`EFFECT_ROWS` effect rows of an application spread over them (bulk,
``apply_across``; keys that begin with ``T``, once the timer rows' first byte), then measures as the
service bench's cross-process wake-up does (:func:`bench.durable_service.wakeup_lateness_ms`): a
runner *process* serving the whole store idles, and this process writes ``timers`` timers, one every
60 ms, each due 50 ms after its write; lateness is the wall time from each due time to the start of
its ``fire`` (ms). The goal: p99 at most 20 ms at 100,000 partitions and 1,000,000 effect rows, per
backend. On SQLite, and on PostgreSQL too with ``--pg-dsn``.

It is the ``partitions`` workload of ``python bench/run.py`` (1, 1,000, 10,000 and 100,000
partitions, 30 timers each, 1,000,000 effect rows in each store; ``--quick``: 1, 1,000 and 10,000
partitions, 10 timers each, 10,000 effect rows, so its goal shows as n/a), and runs alone at any counts, the default 1 and 100,000 (or ``$TIMERWHEEL_C_STORE``
for the server)::

    python bench/run.py -m bench.durable_partitions [--partitions 1 100000] [--timers 100] [--effect-rows 1000000]
        [--pg-dsn DSN] [--json]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Optional

from timerwheel_c.durable import Batch
from timerwheel_c.durable.timers import keys
from .durable_service import WAKEUP_TIMERS, _open, wakeup_lateness_ms
from .goals import Goal, print_alone
from .report import Reporter, fmt
from .stores import add_pg_dsn, pg_dsn

GOAL_AT = 100_000  # partitions the goal is set for
LADDER = (1, 1_000, 10_000, GOAL_AT)  # the counts a run measures, up to its largest
FILL_CHUNK = 10_000
EFFECT_ROWS = 1_000_000  # an application's effect rows beside the idle timers, the goal's store
# Effect rows named as an application may name them, here with a "T" as the first byte, the byte the
# timer rows began with before the library's rows had a key space of their own.
EFFECT_PREFIX = b"Ticket/"
_IDLE_KIND = keys.TimerKind(2)  # a kind the bench runner does not handle: the idle timers never fire


def _fill(target: str, dsn: Optional[str], partitions: int, effect_rows: int) -> None:
    far_ms = time.time_ns() // 1_000_000 + 86_400_000  # a day away: never due during the bench
    store = _open(target, dsn)
    try:
        for start in range(0, partitions, FILL_CHUNK):
            store.apply_across([(f"idle-{i}", Batch().put(keys.timer(far_ms + i, _IDLE_KIND, b"%d" % i), b""))
                                for i in range(start, min(start + FILL_CHUNK, partitions))])
        for start in range(0, effect_rows, FILL_CHUNK):
            batches: dict = {}
            for i in range(start, min(start + FILL_CHUNK, effect_rows)):
                batches.setdefault(f"idle-{i % partitions}", Batch()).put(EFFECT_PREFIX + b"%d" % i, b"")
            store.apply_across(list(batches.items()))
    finally:
        store.close()


def counts(top: int) -> list[int]:
    """The partition counts measured up to ``top``: :data:`LADDER` below it, then ``top``."""
    return [n for n in LADDER if n < top] + [top]


def measure(partition_counts: list, timers: int = WAKEUP_TIMERS, dsn: Optional[str] = None,
            effect_rows: int = 0) -> dict:
    """``{"timers": int, "effect_rows": int, "results": {backend: {str(partitions): {"p50_ms", "p99_ms",
    "lateness_ms"}}}}`` for SQLite (``"sqlite"``), and PostgreSQL on ``dsn`` (``"postgresql"``);
    lateness in ms, from each due time to the start of its ``fire``. Each store also holds
    ``effect_rows`` application rows (keys ``b"Ticket/<n>"``) spread over its partitions. JSON-ready:
    the counts are string keys.

    Raises:
        RuntimeError: timers did not fire (a broken build).
    """
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="timerwheel_c-partitions-") as tmp:
        backends = [("sqlite", lambda n: f"sqlite:{os.path.join(tmp, f'p{n}.db')}")]
        if dsn is not None:
            backends.append(("postgresql", lambda n: f"postgres:timerwheel_bench_partitions_{n}_{os.getpid()}"))
        for backend, target_of in backends:
            figures = results[backend] = {}
            for n in partition_counts:
                target = target_of(n)
                _fill(target, dsn, n, effect_rows)
                lateness = sorted(wakeup_lateness_ms(target, dsn, timers, None))
                figures[str(n)] = {"p50_ms": statistics.median(lateness),
                                   "p99_ms": lateness[min(len(lateness) - 1, int(0.99 * len(lateness)))],
                                   "lateness_ms": lateness}
    return {"timers": timers, "effect_rows": effect_rows, "results": results}


def goals(figures: dict) -> list[tuple[Goal, Optional[float]]]:
    """Per backend, the wake-up p99 (ms) at the largest count measured, against at most 20 ms at
    :data:`GOAL_AT` partitions (a run that stops below it is not judged: see :mod:`.goals`)."""
    return [(Goal("partitions", f"{backend} wake-up p99 at {GOAL_AT:,} idle partitions", 20, at_most=True,
                  unit="ms"), by_count[max(by_count, key=int)]["p99_ms"] if by_count else None)
            for backend, by_count in figures["results"].items()]


def table(rep: Reporter, figures: dict) -> None:
    """The p50 and p99 wake-up per backend and partition count."""
    rows = [[backend, f"{int(n):,}", fmt(f["p50_ms"]), fmt(f["p99_ms"])]
            for backend, by_count in figures["results"].items() for n, f in by_count.items()]
    rep.table(f"partitions: cross-process wake-up among idle partitions and {figures.get('effect_rows', 0):,} "
              f"effect rows, {figures['timers']:,} timers per count (see bench/durable_partitions.py)", ["backend", "partitions", "p50 ms", "p99 ms"], rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[1, GOAL_AT], help="partition counts")
    parser.add_argument("--timers", type=int, default=WAKEUP_TIMERS, help="timers measured per count")
    parser.add_argument("--effect-rows", type=int, default=EFFECT_ROWS,
                        help="application rows in each store, beside its idle timers")
    parser.add_argument("--json", action="store_true", help="print JSON (with every lateness) instead of a table")
    add_pg_dsn(parser)
    args = parser.parse_args(argv)
    partition_counts = sorted(set(args.partitions))
    if args.effect_rows < 0:
        parser.error(f"--effect-rows must be 0 or more, got {args.effect_rows}")
    figures = measure(partition_counts, args.timers, pg_dsn(args.pg_dsn), args.effect_rows)
    set_at = None if partition_counts[-1] == GOAL_AT else f"{GOAL_AT:,} partitions"
    verdicts = [goal.judge(value, set_at) for goal, value in goals(figures)]
    print_alone(figures, verdicts, table, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

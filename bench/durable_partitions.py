"""Wake-up lateness against the number of partitions: a pass must cost the same with 100,000 idle
partitions as with one, since it reads by shard (docs/DESIGN.md, "Shards").

For each count in ``--partitions`` (default 1 and 100,000), this fills a new store with that many
partitions, each holding one timer a day away (bulk, ``apply_across``), then measures as the service
bench's cross-process wake-up does (:func:`bench.durable_service.wakeup_lateness_ms`): a runner
*process* serving the whole store idles, and this process writes ``--timers`` timers, one every
60 ms, each due 50 ms after its write; lateness is the wall time from each due time to the start of
its ``fire`` (ms). It prints, per backend and count, the p50 and p99 lateness, and the goal: p99 at
most 20 ms at 100,000 partitions, the same as with one. On SQLite, and on PostgreSQL too with
``--pg-dsn`` (or ``$TIMERWHEEL_C_STORE``)::

    python bench/run.py -m bench.durable_partitions [--partitions 1 100000] [--timers 100] [--pg-dsn DSN] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Optional

from timerwheel_c.durable import Batch
from timerwheel_c.durable.timers import keys
from .durable_service import WAKEUP_TIMERS, _open, wakeup_lateness_ms
from .goals import Goal, line
from .stores import add_pg_dsn, pg_dsn

GOAL_AT = 100_000  # partitions the goal is set for
GOAL = Goal("durable", f"wake-up p99 at {GOAL_AT:,} idle partitions", 20, at_most=True, unit="ms")
FILL_CHUNK = 10_000
_IDLE_KIND = keys.TimerKind(2)  # a kind the bench runner does not handle: the idle timers never fire


def _fill(target: str, dsn: Optional[str], partitions: int) -> None:
    far_ms = time.time_ns() // 1_000_000 + 86_400_000  # a day away: never due during the bench
    store = _open(target, dsn)
    try:
        for start in range(0, partitions, FILL_CHUNK):
            store.apply_across([(f"idle-{i}", Batch().put(keys.timer(far_ms + i, _IDLE_KIND, b"%d" % i), b""))
                                for i in range(start, min(start + FILL_CHUNK, partitions))])
    finally:
        store.close()


def measure(counts: list, timers: int = WAKEUP_TIMERS, dsn: Optional[str] = None) -> dict:
    """``{backend: {partitions: {"p50_ms", "p99_ms", "lateness_ms"}}}`` for SQLite (and PostgreSQL on
    ``dsn``), plus ``"goals"``: the verdicts (see :mod:`.goals`).

    Raises:
        RuntimeError: timers did not fire (a broken build).
    """
    out: dict = {}
    verdicts = []
    with tempfile.TemporaryDirectory(prefix="timerwheel_c-partitions-") as tmp:
        backends = [("sqlite", lambda n: f"sqlite:{os.path.join(tmp, f'p{n}.db')}")]
        if dsn is not None:
            backends.append(("postgresql", lambda n: f"postgres:timerwheel_bench_partitions_{n}_{os.getpid()}"))
        for backend, target_of in backends:
            figures = out[backend] = {}
            for n in counts:
                target = target_of(n)
                _fill(target, dsn, n)
                lateness = sorted(wakeup_lateness_ms(target, dsn, timers, None))
                figures[n] = {"p50_ms": statistics.median(lateness),
                              "p99_ms": lateness[min(len(lateness) - 1, int(0.99 * len(lateness)))],
                              "lateness_ms": lateness}
            top = max(counts)
            verdicts.append({**GOAL.judge(figures[top]["p99_ms"], None if top == GOAL_AT else f"{GOAL_AT:,} partitions"),
                             "backend": backend})
    out["goals"] = verdicts
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[1, GOAL_AT], help="partition counts")
    parser.add_argument("--timers", type=int, default=WAKEUP_TIMERS, help="timers measured per count")
    parser.add_argument("--json", action="store_true", help="print JSON (with every lateness) instead of a table")
    add_pg_dsn(parser)
    args = parser.parse_args(argv)
    figures = measure(sorted(set(args.partitions)), args.timers, pg_dsn(args.pg_dsn))
    if args.json:
        print(json.dumps({k: v if k == "goals" else {str(n): f for n, f in v.items()} for k, v in figures.items()}))
        return 0
    print(f"{'backend':>10}  {'partitions':>10}  {'p50 ms':>7}  {'p99 ms':>7}")
    for backend, by_count in figures.items():
        if backend == "goals":
            continue
        for n, f in sorted(by_count.items()):
            print(f"{backend:>10}  {n:>10,}  {f['p50_ms']:>7.1f}  {f['p99_ms']:>7.1f}")
    for verdict in figures["goals"]:
        print(f"{verdict['backend']}: {line(verdict)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Wake-up lateness of a SQLite runner as stored rows accumulate: a pass must cost the same at 1M stored
rows as at 1k.

Effect rows accumulate by design (a handler's batch writes them beside the timer rows), so a store
serving for months holds far more rows than timers. For each size in ``--rows`` (default 1,000 and
1,000,000), this fills a new SQLite file with that many effect rows spread over 16 partitions, then
measures as the service bench's cross-process wake-up does
(:func:`timerwheel_c.bench.durable_service.wakeup_lateness_ms`): a runner *process* serving every
partition idles, and this process writes ``--timers`` timers, one every 60 ms, each due 50 ms after
its write; lateness is the wall time from each due time to the start of its ``fire`` (ms). It prints,
per size, the p50 and p99 lateness and the ratio of the p50s (largest size over smallest), the figure
that must stay near 1::

    python -m timerwheel_c.bench.durable_stored_rows [--rows 1000 1000000] [--timers 100] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

from timerwheel_c.durable import Batch, SQLiteStore
from .durable_service import WAKEUP_TIMERS, wakeup_lateness_ms

PARTITIONS = ["bench"] + [f"stored-{i:02d}" for i in range(15)]
FILL_BATCH = 20_000


def _fill(path: str, rows: int) -> None:
    with SQLiteStore(path) as store:
        for start in range(0, rows, FILL_BATCH):
            by_partition: dict = {}
            for i in range(start, min(start + FILL_BATCH, rows)):
                by_partition.setdefault(PARTITIONS[i % len(PARTITIONS)], Batch()).put(b"stored/%010d" % i, b"x" * 32)
            for partition, batch in by_partition.items():
                store.apply(partition, batch)


def measure(rows_list: list, timers: int = WAKEUP_TIMERS) -> dict:
    """``{rows: {"p50_ms", "p99_ms", "lateness_ms"}}`` for each stored-row count, plus ``"p50_ratio"``.

    Raises:
        RuntimeError: timers did not fire (a broken build).
    """
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="timerwheel_c-rows-") as tmp:
        for rows in rows_list:
            path = os.path.join(tmp, f"rows{rows}.db")
            _fill(path, rows)
            lateness = sorted(wakeup_lateness_ms(f"sqlite:{path}", None, timers, None))
            out[rows] = {"p50_ms": statistics.median(lateness),
                         "p99_ms": lateness[min(len(lateness) - 1, int(0.99 * len(lateness)))],
                         "lateness_ms": lateness}
    p50s = [out[r]["p50_ms"] for r in sorted(out)]
    out["p50_ratio"] = max(p50s[-1], 0.5) / max(p50s[0], 0.5)  # 0.5 ms floor: the clock's resolution is 1 ms
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000, 1_000_000], help="stored row counts")
    parser.add_argument("--timers", type=int, default=WAKEUP_TIMERS, help="timers measured per row count")
    parser.add_argument("--json", action="store_true", help="print JSON (with every lateness) instead of a table")
    args = parser.parse_args(argv)
    figures = measure(sorted(args.rows), args.timers)
    if args.json:
        print(json.dumps({str(k): v for k, v in figures.items()}))
        return 0
    print(f"{'stored rows':>12}  {'p50 ms':>7}  {'p99 ms':>7}")
    for rows in sorted(r for r in figures if r != "p50_ratio"):
        print(f"{rows:>12,}  {figures[rows]['p50_ms']:>7.1f}  {figures[rows]['p99_ms']:>7.1f}")
    print(f"p50 at {max(args.rows):,} rows / p50 at {min(args.rows):,} rows: {figures['p50_ratio']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

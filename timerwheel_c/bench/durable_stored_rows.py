"""Wake-up lateness of a SQLite runner as stored rows accumulate: a pass must cost the same at 1M stored
rows as at 1k.

Effect rows accumulate by design (a handler's batch writes them beside the timer rows), so a store
serving for months holds far more rows than timers. For each size in ``--rows`` (default 1,000 and
1,000,000), this script fills a new SQLite file with that many effect rows spread over 16 partitions,
starts a runner *process* (a :class:`DurableTimerService` with default settings, serving every
partition), then writes ``--timers`` timers from this process with
:func:`timerwheel_c.durable.schedule`, one every 60 ms, each due 50 ms after its write, and records the
wall time from each due time to the start of its ``fire`` in the runner (ms). It prints, per size, the
p50 and p99 lateness and the ratio of the p50s (largest size over smallest), the figure that must stay
near 1. Only the public API is used, so the same script measures any installed version:

    python -m timerwheel_c.bench.durable_stored_rows [--rows 1000 1000000] [--timers 100] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timerwheel_c.durable import Batch, Done, DurableTimerService, SQLiteStore, TimerHandler, TimerKind, TimerRegistry, schedule

KIND = TimerKind(2)
PARTITION = "bench"
PARTITIONS = [PARTITION] + [f"stored-{i:02d}" for i in range(15)]
LEAD_MS = 50
GAP_MS = 60
FILL_BATCH = 20_000


class _Stamp(TimerHandler):
    """Records the fire's wall ms in an effect row keyed by the timer's reference."""

    kind = KIND

    def fire(self, ctx, timer):
        return Done(Batch().put(b"fired/" + timer.reference, b"%d" % (time.time_ns() // 1_000_000)))


def _fill(path: str, rows: int) -> None:
    with SQLiteStore(path) as store:
        for start in range(0, rows, FILL_BATCH):
            n = min(FILL_BATCH, rows - start)
            by_partition: dict = {}
            for i in range(start, start + n):
                by_partition.setdefault(PARTITIONS[i % len(PARTITIONS)], Batch()).put(b"effect/%010d" % i, b"x" * 32)
            for partition, batch in by_partition.items():
                store.apply(partition, batch)


def _lateness_ms(path: str, timers: int) -> list:
    with tempfile.TemporaryDirectory(prefix="timerwheel_c-rows-") as tmp:
        ready, log_path = Path(tmp) / "ready", Path(tmp) / "runner.log"
        with open(log_path, "wb") as log_file:
            runner = subprocess.Popen([sys.executable, "-I", __file__, "--serve", path, str(ready)],
                                      stdout=subprocess.DEVNULL, stderr=log_file)
        store = SQLiteStore(path)
        try:
            deadline = time.monotonic() + 60
            while not ready.exists():
                if runner.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the runner did not start: {log_path.read_text(errors='replace')[-2000:]}")
                time.sleep(0.01)
            time.sleep(0.5)  # let it go idle
            dues = {}
            for i in range(timers):
                ref = b"w%04d" % i
                dues[ref] = time.time_ns() // 1_000_000 + LEAD_MS
                schedule(store, PARTITION, dues[ref], KIND, ref)
                time.sleep(GAP_MS / 1000)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                fired = {k[len(b"fired/"):]: int(v) for k, v in store.scan(PARTITION, b"fired/", b"fired0", limit=timers + 1).entries}
                if len(fired) >= timers:
                    break
                time.sleep(0.05)
        finally:
            runner.kill()
            runner.wait(10)
            store.close()
    if len(fired) < timers:
        raise RuntimeError(f"only {len(fired)} of {timers} timers fired within 60 s")
    return [float(fired[ref] - due) for ref, due in dues.items()]


def measure(rows_list: list, timers: int) -> dict:
    """``{rows: {"p50_ms", "p99_ms", "lateness_ms"}}`` for each stored-row count, plus ``"p50_ratio"``."""
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="timerwheel_c-rows-") as tmp:
        for rows in rows_list:
            path = os.path.join(tmp, f"rows{rows}.db")
            _fill(path, rows)
            lateness = sorted(_lateness_ms(path, timers))
            out[rows] = {"p50_ms": statistics.median(lateness),
                         "p99_ms": lateness[min(len(lateness) - 1, int(0.99 * len(lateness)))],
                         "lateness_ms": lateness}
    p50s = [out[r]["p50_ms"] for r in sorted(out)]
    out["p50_ratio"] = max(p50s[-1], 0.5) / max(p50s[0], 0.5)  # 0.5 ms floor: the clock's resolution is 1 ms
    return out


def _serve(path: str, ready: str) -> None:
    DurableTimerService(SQLiteStore(path), TimerRegistry().register(_Stamp())).start()
    Path(ready).touch()
    while True:
        time.sleep(1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000, 1_000_000], help="stored row counts")
    parser.add_argument("--timers", type=int, default=100, help="timers measured per row count")
    parser.add_argument("--json", action="store_true", help="print JSON (with every lateness) instead of a table")
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _serve(*args.serve)
        return 0
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

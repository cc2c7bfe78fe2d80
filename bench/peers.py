"""The PostgreSQL fleet side by side with a peer on the same server: pgqueuer (:mod:`.pgqueuer_peer`).

Each round runs our fleet of 1 runner, then pgqueuer with 1 worker at each batch size, then our
fleet of 4 runners, then pgqueuer with 4 workers at each batch size (:func:`.fleet.run` with a
``peer``), the same ``n_timers`` no-op items all due at one instant, every item checked to have
run exactly once. Each figure is the median of the rounds; the ratio is ours over pgqueuer's,
within one run. Without pgqueuer (or without a server) the figures say how to get it
(:data:`.pgqueuer_peer.INSTALL_HINT`).

The default run measures this as part of ``--only durable --pg-dsn``; on its own, with the fleet's
tables and an optional JSON file of the figures:

    python bench/run.py -m bench.peers --pg-dsn DSN [--timers N] [--rounds N] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, Optional

from timerwheel_c.durable.service.cli import STORE_ENV
from . import fleet, pgqueuer_peer, tables
from .report import Reporter

__all__ = ["BATCH_SIZES", "run", "unavailable"]

# pgqueuer's QueueManager.run batch sizes: a larger batch, and its default.
BATCH_SIZES = (100, pgqueuer_peer.DEFAULT_BATCH)


def unavailable(reason: str) -> dict:
    """The peer figures of a run without the comparison: ``{"missing": reason}``."""
    return {"missing": reason}


def run(dsn: str, n_timers: int, rounds: int, progress: Optional[Callable[[int], None]] = None,
        runner_counts=(1, 4), batch_sizes=BATCH_SIZES) -> tuple[dict, dict]:
    """Measure the fleet (:func:`.fleet.run`, ``rounds`` interleaved rounds) and, when pgqueuer is
    installed, pgqueuer between its runs; returns ``(fleet_figures, pgqueuer_figures)``.

    ``pgqueuer_figures`` is ``{"version": str, "driver": "asyncpg", "rounds": int, "results":
    {"workers_1_batch_100": {..., "ours_over_pgqueuer": float}, ...}}``: each result is
    :func:`.pgqueuer_peer.run`'s, the median of the rounds (:func:`.fleet.median_run`), with our
    fleet's fired/s at the same process count over its own. Without pgqueuer it is
    :func:`unavailable`'s, and the fleet runs one round.

    Raises:
        ValueError: ``rounds`` < 1, or sizes :func:`.fleet.run` or :func:`.pgqueuer_peer.run` refuse.
        RuntimeError: a run failed its bounds or an item did not run exactly once.
    """
    reason = pgqueuer_peer.missing()
    if reason is not None:
        return fleet.run(dsn, n_timers, runner_counts, progress), unavailable(reason)
    runs: dict = {}

    def peer(workers: int) -> None:
        for batch in batch_sizes:
            runs.setdefault((workers, batch), []).append(
                pgqueuer_peer.run(dsn, n_timers, workers, batch, progress=progress))

    ours = fleet.run(dsn, n_timers, runner_counts, progress, rounds=rounds, peer=peer)
    results = {}
    for (workers, batch), peer_runs in runs.items():
        median = fleet.median_run(peer_runs)
        median["ours_over_pgqueuer"] = ours[f"runners_{workers}"]["fired_per_s"] / median["fired_per_s"]
        results[f"workers_{workers}_batch_{batch}"] = median
    return ours, {"version": pgqueuer_peer.version(), "driver": "asyncpg", "rounds": rounds, "results": results}


def main(argv=None) -> int:
    """``python bench/run.py -m bench.peers``: the comparison alone; returns the exit status."""
    p = argparse.ArgumentParser(prog="python bench/run.py -m bench.peers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pg-dsn", default=os.environ.get(STORE_ENV) if os.environ.get(STORE_ENV, "").startswith(
        ("postgresql://", "postgres://")) else None, help=f"the PostgreSQL server (default: ${STORE_ENV})")
    p.add_argument("--timers", type=int, default=10_000, help="no-op items per run (default 10,000)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds, median (default 3)")
    p.add_argument("--json", metavar="FILE", help="write the figures to FILE")
    args = p.parse_args(argv)
    if args.pg_dsn is None:
        p.error(f"no PostgreSQL server: give --pg-dsn or set ${STORE_ENV}")
    ours, pgq = run(args.pg_dsn, args.timers, args.rounds)
    rep = Reporter(use_rich=False, show_progress=False)
    tables.fleet_table(rep, ours)
    tables.pgqueuer_table(rep, ours, pgq)
    if args.json is not None:
        with open(args.json, "w") as f:
            json.dump({"fleet": ours, "pgqueuer": pgq}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

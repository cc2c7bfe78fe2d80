"""The PostgreSQL fleet side by side with a peer on the same server: pgqueuer (:mod:`.pgqueuer_peer`).

Each round runs our fleet of 1 runner, then pgqueuer with 1 worker at each batch size, then our
fleet of 4 runners, then pgqueuer with 4 workers at each batch size (:func:`.fleet.run` with a
``peer``), the same ``n_timers`` no-op items all due at one instant, every item checked to have
run exactly once. Each figure is the median of the rounds; the ratio is ours over pgqueuer's,
within one run. Without pgqueuer (or without a server) the figures say how to get it
(:data:`.pgqueuer_peer.INSTALL_HINT`).
"""
from __future__ import annotations

from typing import Callable, Optional

from . import fleet, pgqueuer_peer

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

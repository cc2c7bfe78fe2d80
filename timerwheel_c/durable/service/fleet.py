"""The state of a fleet as one store tells it: its live runners (PostgreSQL) and, per partition, the
owner, due backlog, oldest due time and parked count, and the kinds' names the store records. ``timerwheel-c fleet status`` prints it and the
status page shows it; the shape is the JSON object that ``fleet status --json`` prints (its module
docstring, :mod:`.fleet_cli`, gives every field).
"""
from __future__ import annotations

from typing import Optional

from ..storage.shards import shard_of
from ..storage.sqlite import SQLiteStore
from ..timers.kind_names import kind_names
from .cli_text import utc_iso
from .metrics import BACKLOG_CAP, due_backlog, parked_count

__all__ = ["kinds_text", "owned_text", "status"]


def kinds_text(kinds) -> str:
    """Sorted kind numbers as runs: ``1-3,7``."""
    runs: list = []
    for k in kinds:
        if runs and runs[-1][1] == k - 1:
            runs[-1][1] = k
        else:
            runs.append([k, k])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "-"


def owned_text(runner: dict) -> str:
    """What a runner of :func:`status` owns, as text: its partitions, or ``shards 0-31`` when it owns
    shards of a store it serves whole, or ``-``."""
    if runner["partitions"]:
        return ", ".join(runner["partitions"])
    return f"shards {kinds_text(runner['shards'])}" if runner.get("shards") else "-"


def status(store, now_ms: int, max_partitions: Optional[int] = None) -> dict:
    """The fleet's state as the JSON object ``fleet status --json`` prints (see the module docstring):
    every partition, or the first ``max_partitions`` in name order (the status page's bound: each
    costs two scans, and a store may hold a million); ``partitions_total`` counts them all.

    Raises:
        StoreError: the store failed.
    """
    runners: Optional[list] = None
    owners: dict = {}
    shard_owners: dict = {}  # a fleet over the whole store owns shards, and so each partition in them
    if not isinstance(store, SQLiteStore):
        from ..storage.postgres.ownership import runners as live_runners

        runners = []
        for r in live_runners(store):
            runners.append({"backend_pid": r.backend_pid, "name": r.application_name, "client_addr": r.client_addr,
                            "since": None if r.since_ms is None else utc_iso(r.since_ms), "since_ms": r.since_ms,
                            "kinds": list(r.kinds), "partitions": list(r.partitions), "shards": list(r.shards)})
            for p in r.partitions:
                owners.setdefault(p, []).append(r.backend_pid)
            for shard in r.shards:
                shard_owners.setdefault(shard, []).append(r.backend_pid)
    partitions = []
    names = store.partitions()
    shard_count = store.refresh_shard_count()  # read now: another process may have resharded meanwhile
    for p in names if max_partitions is None else names[:max_partitions]:
        backlog, oldest_ms = due_backlog(store, p, now_ms)
        parked = parked_count(store, p)
        held = owners.get(p, []) + shard_owners.get(shard_of(p, shard_count), [])
        partitions.append({"partition": p, "owners": None if runners is None else held,
                           "due_backlog": backlog, "due_backlog_capped": backlog >= BACKLOG_CAP,
                           "oldest_due_at": None if oldest_ms is None else utc_iso(oldest_ms),
                           "oldest_due_at_ms": oldest_ms, "parked": parked, "parked_capped": parked >= BACKLOG_CAP})
    return {"backend": "sqlite" if runners is None else "postgresql", "now_ms": now_ms, "runners": runners,
            "partitions": partitions, "partitions_total": len(names),
            "kind_names": {str(k): v for k, v in sorted(kind_names(store).items())}}

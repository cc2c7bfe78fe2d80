"""Fleet wake-up into a new partition: how late a timer fires when it is the first row of a
partition that no runner of the fleet owns yet.

Two runner processes serve every partition of one PostgreSQL table as a fleet
(``DurableTimerService(partitions=None)``), after they have divided 16 anchored partitions.
Then, one at a time, a timer is written into a brand-new partition, due 200 ms later; its
handler stamps the wall ms of the fire into an effect row. Lateness is that stamp minus the
due time (ms). A fleet runner re-checks ownership when the change signal reports a write, so
the target is the same as for any partition (p99 <= 50 ms), not the ownership's 1 s re-check.
"""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from typing import Callable, Optional

from timerwheel_c.durable.storage.store import Batch
from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerRegistry
from .run import command
from .stores import dispose
from .procs import stop as procs_stop

__all__ = ["run"]

_KIND = keys.TimerKind(1)
_ANCHORED = [f"anchor{i:02d}" for i in range(16)]
_DSN_ENV = "TIMERWHEEL_C_FLEET_DSN"
_RUNNERS = 2
_DUE_IN_MS = 200
_START_S = 60.0


class _Stamp(TimerHandler):
    kind = _KIND

    def fire(self, ctx, timer):
        return Done(Batch().put(b"E" + timer.reference, b"%d" % (time.time_ns() // 1_000_000)))


def _runner(dsn: str, table: str) -> None:
    """Process entry: serve every partition of ``table`` as a fleet member until SIGTERM."""
    from timerwheel_c.durable.service.process import StopSignals
    from timerwheel_c.durable.service.service import DurableTimerService
    from timerwheel_c.durable.storage.postgres import PostgresStore

    with StopSignals((signal.SIGTERM,)) as stop:
        store = PostgresStore(dsn, table=table)
        with DurableTimerService(store, TimerRegistry().register(_Stamp()), None, fleet=True):
            while stop.wait(1) is None:
                pass
        store.close()


def _nearest_rank(values: list, q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def run(dsn: str, n_partitions: int = 20, progress: Optional[Callable[[int], None]] = None) -> dict:
    """Measure the lateness of ``n_partitions`` timers, each the first row of a new partition, on a
    fleet of 2 runners on the PostgreSQL server of ``dsn``; returns ``{"runners": 2, "timers": n,
    "lateness_p50_ms": float, "lateness_p99_ms": float, "lateness_max_ms": float}``.

    Raises:
        ValueError: ``n_partitions`` < 1.
        RuntimeError: the runners did not start and divide the anchored partitions within 60 s,
            or a timer did not fire within 10 s.
        psycopg.Error: the server cannot be reached.
    """
    from timerwheel_c.durable.storage.postgres.ownership import holders
    from timerwheel_c.durable.storage.postgres import PostgresStore

    if isinstance(n_partitions, bool) or not isinstance(n_partitions, int) or n_partitions < 1:
        raise ValueError(f"n_partitions must be an int >= 1, got {n_partitions!r}")
    table = f"timerwheel_fleet_wakeup_{os.getpid()}"
    store = PostgresStore(dsn, table=table)
    far_ms = time.time_ns() // 1_000_000 + 3_600_000
    for p in _ANCHORED:
        store.apply(p, Batch().put(keys.timer(far_ms, _KIND, b"anchor"), b""))
    env = dict(os.environ, **{_DSN_ENV: dsn})
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    procs = [subprocess.Popen(command("bench.fleet_wakeup", "runner", table), env=env,
                              cwd=package_parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(_RUNNERS)]
    try:
        deadline = time.monotonic() + _START_S
        while len(set(holders(store, None, kinds=[_KIND.get()]).values())) < _RUNNERS:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"fleet wake-up bench: {_RUNNERS} runners did not divide the partitions")
            time.sleep(0.05)
        time.sleep(1.5)  # settled: every runner has done its periodic check at least once since
        lateness: list = []
        for i in range(n_partitions):
            partition, ref = f"new{i:03d}", b"t%03d" % i
            due_ms = time.time_ns() // 1_000_000 + _DUE_IN_MS
            store.apply(partition, Batch().put(keys.timer(due_ms, _KIND, ref), b""))
            deadline = time.monotonic() + 10
            while (stamp := store.get(partition, b"E" + ref)) is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"fleet wake-up bench: the timer in new partition {partition!r} never fired")
                time.sleep(0.005)
            lateness.append(int(stamp) - due_ms)
            if progress is not None:
                progress(1)
            time.sleep(0.3)
        return {"runners": _RUNNERS, "timers": n_partitions, "lateness_p50_ms": float(_nearest_rank(lateness, 0.5)),
                "lateness_p99_ms": float(_nearest_rank(lateness, 0.99)), "lateness_max_ms": float(max(lateness))}
    finally:
        procs_stop(procs)
        dispose(store)


if __name__ == "__main__":
    if sys.argv[1:2] != ["runner"] or len(sys.argv) != 3 or _DSN_ENV not in os.environ:
        sys.exit(f"usage: {_DSN_ENV}=postgresql://... python bench/run.py -m bench.fleet_wakeup runner TABLE")
    _runner(os.environ[_DSN_ENV], sys.argv[2])

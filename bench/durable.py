"""Durable-timer benchmark: fired timers per second and fire lateness on SQLite (and PostgreSQL).

- ``fired_per_s``: a no-op handler draining ``n_timers`` already-due rows with repeated
  :func:`run_due` calls under the default :class:`TickBudget` (each fire is two guarded
  commits: the claim and the handler's Done), timed on the monotonic clock.
- Both backends run without a flush per commit (SQLite WAL ``synchronous=NORMAL``,
  PostgreSQL ``synchronous_commit=off``), both crash-consistent.
- ``lateness_ms``: for timers coming due spread over ~1.5 s while a
  :class:`DurableTimerService` runs, the wall time from each timer's due time to the
  commit of its Done batch (Unix epoch ms, measured in ms with ns resolution).

The figures of timers by name and of recurring schedules come from :mod:`.durable_named`; the service
figures of a fleet member (cross-process wake-ups, concurrent 20 ms handlers,
the SQLite watcher's idle CPU) come from :mod:`.durable_service`.

Contract for the bench CLI: ``run(n_timers=5000, dsn=None, progress=None) -> dict``.
"""
from __future__ import annotations

import os
import tempfile
import threading
import time
from typing import Callable, Optional

from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerKind, TimerRegistry
from timerwheel_c.durable.service.service import DurableTimerService
from timerwheel_c.durable.storage.sqlite import SQLiteStore
from timerwheel_c.durable.storage.store import Batch, Committed, Store
from .stores import Delegating, dispose
from .durable_named import drain, named_figures
from .durable_service import service_figures
from .harness import NotAvailable

__all__ = ["run"]

_KIND = TimerKind(1)
_P = "bench"
_SPREAD_MS = 1500
_LEAD_MS = 300  # time to start the service before the first timer is due


class _Noop(TimerHandler):
    kind = _KIND

    def fire(self, ctx, timer):
        return Done()


class _CommitClock(Delegating):
    """Delegates to a store and, when a batch deleting a claimed timer row commits, records
    due -> commit lateness in ms for that timer."""

    def __init__(self, inner: Store):
        super().__init__(inner)
        self.lateness_ms: list = []
        self.lock = threading.Lock()

    def _apply_many(self, partition, batches):
        results = self.inner.apply_many(partition, batches)
        committed_ns = time.time_ns()
        for batch, result in zip(batches, results):
            if not (isinstance(result, Committed) and batch.guards):
                continue
            # The runner's Done batch deletes the claimed (backed-off) row it is guarded on.
            for key, value in batch.writes:
                if value is None and keys.is_timer_key(key):
                    tk = keys.parse(key)
                    if tk.attempt:
                        with self.lock:
                            self.lateness_ms.append(committed_ns / 1e6 - tk.original_due_at_ms)
        return results


def _fill(store: Store, dues_ms) -> None:
    for start in range(0, len(dues_ms), 1000):
        batch = Batch()
        for i in range(start, min(start + 1000, len(dues_ms))):
            batch.put(keys.timer(dues_ms[i], _KIND, b"%08d" % i), b"")
        store.apply(_P, batch)


def _fired_per_s(make_store, n_timers: int, progress) -> float:
    store = make_store()
    try:
        now_ms = time.time_ns() // 1_000_000
        _fill(store, [now_ms - 60_000 + i % 1000 for i in range(n_timers)])
        return n_timers / drain(store, _P, TimerRegistry().register(_Noop()), now_ms, n_timers, "rows", progress)
    finally:
        dispose(store)


def _lateness(make_store, n_timers: int, progress) -> list:
    store = _CommitClock(make_store())
    try:
        first_ms = time.time_ns() // 1_000_000 + _LEAD_MS
        _fill(store.inner, [first_ms + (i * _SPREAD_MS) // n_timers for i in range(n_timers)])
        with DurableTimerService(store, TimerRegistry().register(_Noop()), [_P]):
            deadline = time.monotonic() + (_LEAD_MS + _SPREAD_MS) / 1000 + 30
            seen = 0
            while seen < n_timers and time.monotonic() < deadline:
                time.sleep(0.05)
                with store.lock:
                    now_seen = len(store.lateness_ms)
                if progress is not None and now_seen > seen:
                    progress(now_seen - seen)
                seen = now_seen
        if seen < n_timers:
            raise RuntimeError(f"only {seen} of {n_timers} timers fired within the bound")
        return list(store.lateness_ms)
    finally:
        dispose(store.inner)


def run(n_timers: int = 5000, dsn: Optional[str] = None, progress: Optional[Callable[[int], None]] = None) -> dict:
    """Measure the durable layer; returns ``{"sqlite": {"fired_per_s": float, "lateness_ms": list[float],
    ...}}`` plus, per store, the service figures of :func:`.durable_service.service_figures`.

    ``n_timers`` rows are drained for fired/s; ``min(n_timers, 2000)`` timers spread over
    1.5 s measure lateness (ms, due -> committed). ``progress(k)`` is called with the number
    of items just completed. With ``dsn`` (a ``postgresql://`` URL) a ``"postgres"`` entry is
    added.

    Raises:
        ValueError: ``n_timers`` < 1.
        NotAvailable: a ``dsn`` without psycopg installed (the message gives the install command).
        RuntimeError: timers did not fire (a broken build).
    """
    if isinstance(n_timers, bool) or not isinstance(n_timers, int) or n_timers < 1:
        raise ValueError(f"n_timers must be an int >= 1, got {n_timers!r}")
    backends: dict[str, Callable[[], Store]] = {}
    with tempfile.TemporaryDirectory(prefix="timerwheel_c-bench-") as tmp:
        counter = iter(range(1_000_000))
        backends["sqlite"] = lambda: SQLiteStore(os.path.join(tmp, f"bench{next(counter)}.db"))
        if dsn is not None:
            try:
                from timerwheel_c.durable.storage.postgres import PostgresStore
            except ImportError as exc:  # the PostgreSQL figures were asked for: never drop them silently
                raise NotAvailable("a PostgreSQL DSN needs psycopg 3, which is not installed: "
                                   "pip install 'timerwheel_c[postgres]'") from exc
            # synchronous_commit=off matches SQLite's synchronous=NORMAL: no flush per commit, crash-consistent.
            backends["postgres"] = lambda: PostgresStore(
                dsn, table=f"timerwheel_bench_{os.getpid()}_{next(counter)}", synchronous_commit="off")
        results = {}
        for name, make_store in backends.items():
            results[name] = {
                "fired_per_s": _fired_per_s(make_store, n_timers, progress),
                "lateness_ms": _lateness(make_store, min(n_timers, 2000), progress),
                **service_figures(name, tmp, dsn, progress, max_timers=n_timers),
                # As many named timers as drained rows (10,000 in a full run), outside the progress count.
                **named_figures(make_store, None, n_timers=n_timers, occurrences=min(n_timers, 300)),
            }
    return results

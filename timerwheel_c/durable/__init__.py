"""Durable timers: a store, a handler registry keyed by kind, a runner and a service.

Timers live as rows of an ordered key-value store and survive a restart; handlers keyed
by timer kind fire them, committing their effects atomically with the row's removal
(the guarded-commit pattern of APScheduler's and procrastinate's job stores, on a
key-value contract). Due times are Unix epoch ms; every in-process wait is on the
monotonic clock. ``docs/DESIGN.md`` ("Durable timers") gives the design.

- :mod:`.store`: the contract (:class:`Store`, :class:`Batch`, guards, :class:`Page`).
- :mod:`.sqlite`: :class:`SQLiteStore`, the embedded default backend.
- :mod:`.postgres`: ``PostgresStore``, the backend to scale out (needs psycopg 3, the ``postgres`` extra).
- :mod:`.keys`: the timer-row key encoding.
- :mod:`.registry`: :class:`TimerKind`, :class:`TimerHandler`, :class:`TimerRegistry`, outcomes.
- :mod:`.runner`: :func:`run_due`, :class:`TickBudget`, :class:`RunReport`.
- :mod:`.service`: :class:`DurableTimerService`.
- :mod:`.sleep`: :class:`DurableContext`, :class:`TimerId`, :class:`SleepHandler`.
- :mod:`.url`: :func:`open_store` for ``sqlite:///PATH`` and ``postgresql://`` URLs, and
  ``redact``, which keeps their passwords out of every output; :mod:`.cli`: ``timerwheel-c run``.
"""
from .registry import Done, DueTimer, Reschedule, Retry, TimerContext, TimerHandler, TimerKind, TimerRegistry
from .runner import RunReport, TickBudget, run_due
from .service import DurableTimerService
from .sleep import DurableContext, SleepHandler, TimerId
from .sqlite import SQLiteStore
from .store import Absent, Batch, Committed, Equals, Page, PreconditionFailed, Store
from .url import open_store

__all__ = [
    "Absent", "Batch", "Committed", "Done", "DueTimer", "DurableContext", "DurableTimerService", "Equals",
    "Page", "PreconditionFailed", "Reschedule", "Retry", "RunReport", "SQLiteStore", "SleepHandler", "Store",
    "TickBudget", "TimerContext", "TimerHandler", "TimerId", "TimerKind", "TimerRegistry", "open_store", "run_due",
]

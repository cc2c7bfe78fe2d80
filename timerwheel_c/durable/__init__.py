"""Durable timers: a store, a handler registry keyed by kind, a runner and a service.

Timers live as rows of an ordered key-value store and survive a restart; handlers keyed
by timer kind fire them, committing their effects atomically with the row's removal
(the guarded-commit pattern of APScheduler's and procrastinate's job stores, on a
key-value contract). ``docs/DESIGN.md`` ("Durable timers") gives the design.

Due times are Unix epoch ms; every in-process wait is on the monotonic clock. A store is
split into partitions, the unit of ordering, atomicity and ownership: on PostgreSQL, N
runner processes divide the partitions among themselves (:mod:`.ownership`).

- :mod:`.store`: the contract (:class:`Store`, :class:`Batch`, guards, :class:`Page`).
- :mod:`.sqlite`: :class:`SQLiteStore`, the embedded default backend.
- :mod:`.postgres`: ``PostgresStore``, the fleet backend (needs the ``postgres`` extra).
- :mod:`.ownership`: ``PartitionOwnership``, partitions divided among live runners.
- :mod:`.keys`: the timer-row key encoding and :class:`TimerKind`.
- :mod:`.registry`: :class:`TimerHandler`, :class:`TimerRegistry`, outcomes.
- :mod:`.runner`: :func:`run_due` and its phases, :class:`TickBudget`, :class:`RunReport`.
- :mod:`.service`: :class:`DurableTimerService`.
- :mod:`.sleep`: :class:`DurableContext`, :class:`TimerId`, :class:`SleepHandler`.
- :mod:`.writer`: :func:`schedule` and :func:`cancel`, for processes that write timers but do not fire them.
- :mod:`.watch`: the store's change signal (:class:`Watcher`), which wakes runners on writes from any process.
- :mod:`.url`: :func:`open_store` for ``sqlite:///PATH`` and ``postgresql://`` URLs, and
  ``redact``, which keeps their passwords out of every output; :mod:`.cli`: ``timerwheel-c run``.
"""
from .keys import TimerKind
from .registry import Done, DueTimer, Reschedule, Retry, TimerContext, TimerHandler, TimerRegistry
from .runner import RunReport, TickBudget, run_due
from .service import DurableTimerService
from .sleep import DurableContext, SleepHandler, TimerId
from .sqlite import SQLiteStore
from .store import Absent, Batch, Committed, Equals, Page, PreconditionFailed, SchemaVersionError, Store
from .url import open_store
from .watch import Watcher
from .writer import cancel, schedule

__all__ = [
    "Absent", "Batch", "Committed", "Done", "DueTimer", "DurableContext", "DurableTimerService", "Equals",
    "Page", "PreconditionFailed", "Reschedule", "Retry", "RunReport", "SQLiteStore", "SchemaVersionError", "SleepHandler",
    "Store", "TickBudget", "TimerContext", "TimerHandler", "TimerId", "TimerKind", "TimerRegistry", "Watcher", "cancel",
    "open_store", "run_due", "schedule",
]

"""Durable timers: a store, a handler registry keyed by kind, a runner and a service.

Timers live as rows of an ordered key-value store and survive a restart; handlers keyed
by timer kind fire them, committing their effects atomically with the row's removal
(the guarded-commit pattern of APScheduler's and procrastinate's job stores, on a
key-value contract). ``docs/DESIGN.md`` ("Durable timers") gives the design.

Due times are Unix epoch ms; every in-process wait is on the monotonic clock. A store is
split into partitions, the unit of ordering, atomicity and ownership, each in one of the store's
shards: on PostgreSQL, N runner processes divide the shards among themselves, or a list of
partitions they are given (:mod:`.storage.postgres.ownership`).

The package reads bottom-up in three layers, each importing only the ones below it:

- :mod:`.storage`: the contract (:mod:`.storage.store`: :class:`Store`, :class:`Batch`, guards,
  :class:`Page`), :class:`SQLiteStore` (the embedded default), ``PostgresStore`` (the fleet
  backend, the ``postgres`` extra), the change signal (:class:`Watcher`), :func:`open_store` for
  ``sqlite:///PATH`` and ``postgresql://`` URLs, and ``redact``, which keeps their passwords out
  of every output. It knows nothing of timers.
- :mod:`.timers`: the timer-row key encoding and :class:`TimerKind`, handlers and their
  :class:`TimerRegistry`, :func:`run_due` and its phases (the claim phase in :mod:`.timers.claim`),
  timers by name (:func:`schedule`, :func:`cancel`, :func:`reschedule`, :func:`requeue`,
  :func:`get_timer`, :func:`list_timers`; :func:`schedule_many` in bulk; the writers also in the caller's own transaction, ``conn=``,
  whose contract :mod:`.storage.joined` gives), parking after a handler's ``max_attempts``, recurring
  schedules (:func:`add_schedule` with :class:`Every` or
  :class:`Cron`, :mod:`.timers.schedules`) and durable sleep (:class:`DurableContext`).
- :mod:`.service`: :class:`DurableTimerService` (the loop, composing the claim passes, an
  executor and a committer), partition ownership in a fleet, and ``timerwheel-c run``.

:mod:`.aio` gives the writer to asyncio code (``await aio.schedule(...)``) without blocking its loop.
"""
from typing import TYPE_CHECKING, Any

from .storage.open import open_store
from .storage.sqlite import SQLiteStore
from .storage.store import Absent, Batch, Committed, Equals, Page, PreconditionFailed, SchemaVersionError, Store
from .storage.watch import Watcher
from .timers.bulk import schedule_many
from .timers.codecs import JSON, Codec
from .timers.keys import TimerKind
from .timers.kind_names import KindNameMismatch
from .timers.registry import Done, DueTimer, FunctionHandler, Reschedule, Retry, TimerContext, TimerHandler, TimerRegistry
from .timers.runner import RunReport, TickBudget, run_due
from .timers.tick import Backoff
from .timers.schedules import (ScheduleInfo, add_schedule, get_schedule, list_schedules, pause_schedule,
                               remove_schedule, resume_schedule)
from .timers.sleep import DurableContext, SleepHandler, TimerId
from .timers.triggers import Cron, Every
from .timers.writer import PendingTimer, TimerExists, cancel, get_timer, list_timers, requeue, reschedule, schedule

if TYPE_CHECKING:
    from .service.service import DurableTimerService

__all__ = [
    "Absent", "Backoff", "Batch", "Codec", "Committed", "Cron", "Done", "DueTimer", "DurableContext", "DurableTimerService", "Equals", "Every", "FunctionHandler", "JSON", "KindNameMismatch",
    "Page", "PendingTimer", "PreconditionFailed", "Reschedule", "Retry", "RunReport", "SQLiteStore", "ScheduleInfo", "SchemaVersionError", "SleepHandler",
    "Store", "TickBudget", "TimerContext", "TimerExists", "TimerHandler", "TimerId", "TimerKind", "TimerRegistry",
    "Watcher", "add_schedule", "cancel", "get_schedule", "get_timer", "list_schedules", "list_timers", "open_store",
    "pause_schedule", "remove_schedule", "requeue", "reschedule", "resume_schedule", "run_due", "schedule", "schedule_many",
]


def __getattr__(name: str) -> Any:
    # The service (and asyncio, its threads and its metrics) loads on first use (PEP 562): a program
    # that only schedules timers, and every ``timerwheel-c`` command but ``run``, never pays for it.
    if name == "DurableTimerService":
        from .service.service import DurableTimerService

        return DurableTimerService
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))

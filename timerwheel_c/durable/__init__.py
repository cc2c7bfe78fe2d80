"""Durable timers: a store, a handler registry keyed by kind, a runner and a service (issue 4).

Seeds: mkit_server/timers (mod.rs ``run_due``, registry.rs) and zeph-durable
(DurableTimerService, ``sleep_until``). Due times are Unix epoch ms; every in-process wait
is on the monotonic clock.

- :mod:`.store`: the contract (:class:`Store`, :class:`Batch`, guards, :class:`Page`).
- :mod:`.sqlite`: :class:`SQLiteStore`, the embedded default backend.
- :mod:`.keys`: the timer-row key encoding.
- :mod:`.registry`: :class:`TimerKind`, :class:`TimerHandler`, :class:`TimerRegistry`, outcomes.
- :mod:`.runner`: :func:`run_due`, :class:`TickBudget`, :class:`RunReport`.
- :mod:`.service`: :class:`DurableTimerService`.
- :mod:`.sleep`: :class:`DurableContext`, :class:`TimerId`, :class:`SleepHandler`.
- :mod:`.url`: :func:`open_store` for ``sqlite:///PATH`` URLs; :mod:`.cli`: ``timerwheel-c run``.
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

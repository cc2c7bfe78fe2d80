"""Writing durable timers from asyncio code (FastAPI, Django async, aiohttp) without blocking the loop.

``await aio.schedule(store, ...)``, ``cancel``, ``reschedule``, ``requeue``, ``get_timer`` and
``add_schedule`` take the same arguments, return the same values and raise the same exceptions
as the functions of those names in :mod:`timerwheel_c.durable`: each *is* the sync function, run on a thread of the
store's own (one per store, created on first use, a daemon that idles at no cost), while the
event loop goes on serving other tasks. A write waiting on a lock (SQLite's ``busy_timeout``
while another process writes, a PostgreSQL row lock) waits on that thread, never on the loop.
Arguments are checked by the sync function itself, so a bad argument raises from the
``await``, exactly as the sync call would.

Why a thread, and not psycopg's ``AsyncConnection`` on PostgreSQL: a write is a guarded batch
(:class:`~timerwheel_c.durable.storage.store.Batch`) that the store commits in one transaction
under its own connection, retry and error wrapping
(:class:`~timerwheel_c.durable.storage.errors.TransientStoreError`); an async twin of each store
would repeat all of that, and of the writer, for a gain that does not show at a web app's
rates (a round trip's cost is the database's, not the thread hop's: see the bench's
``durable_aio`` figures). One thread per store also keeps a store's single connection used by
one thread at a time, as the stores expect. This is the approach of asyncio's own
``loop.run_in_executor`` / ``asyncio.to_thread`` for blocking libraries.

With ``conn=``, ``schedule``, ``cancel`` and ``reschedule`` write in the caller's own transaction
instead, as the sync functions do (:mod:`timerwheel_c.durable.storage.joined` gives the contract):
on a psycopg ``AsyncConnection`` each statement is awaited on the caller's connection, on the loop,
with no thread, since the transaction, its error handling and its commit are the caller's; a
``sqlite3.Connection`` is used synchronously on the loop's thread, the one it belongs to.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
import weakref
from typing import Callable, Optional, TypeVar

from .storage.joined import ajoined
from .storage.store import Store, check_store
from .timers import schedules, writer
from .timers.steps import Steps, arun_steps
from .timers.triggers import Trigger

__all__ = ["add_schedule", "cancel", "get_timer", "requeue", "reschedule", "schedule"]

T = TypeVar("T")

_executors: "weakref.WeakKeyDictionary[Store, concurrent.futures.ThreadPoolExecutor]" = weakref.WeakKeyDictionary()
_executors_lock = threading.Lock()


def _executor(store: Store) -> concurrent.futures.ThreadPoolExecutor:
    """The store's writer thread (created on first use; it ends with the store object)."""
    with _executors_lock:
        pool = _executors.get(store)
        if pool is None:
            pool = _executors[store] = concurrent.futures.ThreadPoolExecutor(1, "timerwheel-c-aio-writer")
            weakref.finalize(store, pool.shutdown, wait=False)
        return pool


async def _off_loop(fn: Callable[..., T], store: Store, *args, **kwargs) -> T:
    check_store(store)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_executor(store), functools.partial(fn, store, *args, **kwargs))


async def _joined(store: Store, partition: str, steps: Steps[T], conn) -> T:
    """Run a writer's ``steps`` through the caller's connection ``conn`` inside its open transaction,
    as :func:`timerwheel_c.durable.timers.writer.write` does: a ``psycopg.AsyncConnection`` for a
    ``PostgresStore``, every statement awaited on it on this loop (no thread); or a
    ``sqlite3.Connection`` for a :class:`SQLiteStore`, run synchronously on this loop's thread, since
    a sqlite3 connection belongs to the thread that opened it (it blocks the loop for the write, and
    for up to the connection's busy timeout while another connection holds the file's write lock).
    The contract (what ``conn`` must be, commit and rollback, locks, wake-ups) is
    :mod:`timerwheel_c.durable.storage.joined`'s."""
    async with ajoined(store, conn, partition) as tx:
        return await arun_steps(steps, tx.get, tx.apply)


async def schedule(store: Store, partition: str, due_at_ms, kind, reference: bytes, value: bytes = b"", *,
                   if_exists: str = "replace", conn=None) -> bytes:
    """Await :func:`timerwheel_c.durable.schedule` (same arguments, return value and exceptions)
    on the store's writer thread, or with ``conn`` on the caller's connection inside its open
    transaction (see :func:`_joined`). Returns the pending timer row's key (bytes)."""
    if conn is None:
        return await _off_loop(writer.schedule, store, partition, due_at_ms, kind, reference, value,
                               if_exists=if_exists)
    return await _joined(store, partition, writer.schedule_steps(store, partition, due_at_ms, kind, reference, value,
                                                                 if_exists), conn)


async def cancel(store: Store, partition: str, kind, reference: bytes, *, conn=None) -> bool:
    """Await :func:`timerwheel_c.durable.cancel` (same arguments, return value and exceptions) on
    the store's writer thread, or with ``conn`` on the caller's connection inside its open
    transaction (see :func:`_joined`). True if this call removed the timer."""
    if conn is None:
        return await _off_loop(writer.cancel, store, partition, kind, reference)
    return await _joined(store, partition, writer.cancel_steps(store, partition, kind, reference), conn)


async def reschedule(store: Store, partition: str, kind, reference: bytes, due_at_ms, *, conn=None) -> bool:
    """Await :func:`timerwheel_c.durable.reschedule` (same arguments, return value and exceptions)
    on the store's writer thread, or with ``conn`` on the caller's connection inside its open
    transaction (see :func:`_joined`). True if this call moved the pending timer."""
    if conn is None:
        return await _off_loop(writer.reschedule, store, partition, kind, reference, due_at_ms)
    return await _joined(store, partition, writer.reschedule_steps(store, partition, kind, reference, due_at_ms), conn)


async def requeue(store: Store, partition: str, kind, reference: bytes, due_at=None) -> bool:
    """Await :func:`timerwheel_c.durable.requeue` (same arguments, return value and exceptions) on
    the store's writer thread. True if the timer existed and is now scheduled."""
    return await _off_loop(writer.requeue, store, partition, kind, reference, due_at)


async def get_timer(store: Store, partition: str, kind, reference: bytes) -> Optional[writer.PendingTimer]:
    """Await :func:`timerwheel_c.durable.get_timer` (same arguments, return value and exceptions)
    on the store's writer thread: the pending timer of that name, or None."""
    return await _off_loop(writer.get_timer, store, partition, kind, reference)


async def add_schedule(store: Store, partition: str, name: str, trigger: Trigger, kind, value: bytes = b"", *,
                       misfire: str = "once", misfire_grace_s: float = 60.0,
                       catchup_window_s: Optional[float] = None) -> schedules.ScheduleInfo:
    """Await :func:`timerwheel_c.durable.add_schedule` (same arguments, return value and
    exceptions) on the store's writer thread."""
    return await _off_loop(schedules.add_schedule, store, partition, name, trigger, kind, value, misfire=misfire,
                           misfire_grace_s=misfire_grace_s, catchup_window_s=catchup_window_s)

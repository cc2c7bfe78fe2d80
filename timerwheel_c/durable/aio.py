"""Writing durable timers from asyncio code (FastAPI, Django async, aiohttp) without blocking the loop.

``await aio.schedule(store, ...)``, ``schedule_many``, ``cancel``, ``reschedule``, ``requeue``,
``get_timer`` and ``add_schedule`` take the same arguments, return the same values and raise the
same exceptions as the functions of those names in :mod:`timerwheel_c.durable`. Each writer but
``schedule_many`` (which runs the sync one on the thread below, on both backends) is written once,
as steps (:mod:`timerwheel_c.durable.timers.steps`); its arguments are checked on the loop, when the
steps are made, so a bad argument raises from the ``await`` exactly as the sync call would; then:

- **PostgreSQL**: the steps are awaited on a connection of a ``psycopg_pool.AsyncConnectionPool``
  that the store keeps per event loop (:mod:`timerwheel_c.durable.storage.postgres.pool`: made on the
  loop's first write, closed with the loop or the store; :func:`configure` sizes it), with no
  thread. The statements are the store's own (the same ``<table>_apply_many`` call, advisory lock
  on the partition and guards), on an autocommit connection, so each apply is its own transaction
  as in the sync writer and errors are the same :class:`~timerwheel_c.durable.storage.errors.StoreError`
  types. A write waiting on a lock (another transaction holding the partition's advisory lock)
  waits in an ``await``; the loop serves other tasks meanwhile. Unlike the sync writer, the first
  write does not declare the change signal's key patterns (``keys.declare_signals``): declaring them
  may rebuild the table's trigger, a blocking DDL statement on the store's own connection that waits
  for every lock on the table, on the loop. Until some process declares them (every runner does when
  it starts), every write signals: more wake-ups, none missed. Without ``psycopg_pool`` installed
  (the ``postgres`` extra installs it), the writes fall back to the thread below, with one WARNING.
- **SQLite**: the sync writer runs on a thread of the store's own (one per store, created on first
  use, a daemon that idles at no cost), as asyncio's ``loop.run_in_executor`` / ``asyncio.to_thread``
  serve blocking libraries: ``sqlite3`` blocks, and a connection belongs to one thread at a time, so
  no awaitable driver would do better. A write waiting on the file's lock (``busy_timeout``) waits
  on that thread, never on the loop.

With ``conn=``, ``schedule``, ``cancel`` and ``reschedule`` write in the caller's own transaction
instead, as the sync functions do (:mod:`timerwheel_c.durable.storage.joined` gives the contract):
on a psycopg ``AsyncConnection`` each statement is awaited on the caller's connection, on the loop,
with no thread, since the transaction, its error handling and its commit are the caller's; a
``sqlite3.Connection`` is used synchronously on the loop's thread, the one it belongs to.

A write that is cancelled (``asyncio.timeout``, ``wait_for``, a task cancel, a client gone) raises
CancelledError, and its outcome is then unknown, as for any awaited database write: on the pool it
may have committed (the cancel landed after the server applied it), on SQLite the thread finishes it,
and joined to a caller's transaction it may be part of it (the cancel landed while its savepoint was
released), so that the caller's commit commits it. Where that matters, read it back (``get_timer``),
or roll the caller's transaction back on the cancel. A writer's retry by name is safe either way
(``schedule`` again leaves one timer of the name). A loop's first writes await the opening of its
pool with ``asyncio.wait``, which never loses a cancel; later, a cancel that lands just as
psycopg_pool hands a connection over can still be lost (a race in the pool's own wait for a
connection): the write then completes and returns.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
import weakref
from typing import Callable, Iterable, Optional, TypeVar

from .storage.joined import ajoined
from .storage.store import Store, check_store
from .timers import bulk, schedules, writer
from .timers.due import due_or_delay
from .timers.kind_names import unconfirmed
from .timers.partitions import partition_of
from .timers.steps import Steps, arun_steps
from .timers.triggers import Trigger

__all__ = ["add_schedule", "cancel", "configure", "get_timer", "requeue", "reschedule", "schedule", "schedule_many"]

T = TypeVar("T")
log = logging.getLogger("timerwheel_c.durable")

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


def _postgres(store: Store) -> bool:
    """True when ``store`` is a PostgresStore: the backend whose class offers ``async_pools``, asked
    of the store itself, so that no module is looked up and psycopg is never imported for another."""
    return callable(getattr(store, "async_pools", None))


@functools.lru_cache(maxsize=None)
def _has_pool(kind: type) -> bool:
    """True when the PostgresStore class ``kind`` can make async pools (``psycopg_pool`` imports);
    else False, with one WARNING per process."""
    error = kind.async_pools_error()  # type: ignore[attr-defined]
    if error is not None:
        log.warning("async writes to PostgreSQL run on a thread per store: %s (install timerwheel-c[postgres] "
                    "for psycopg_pool)", error)
        return False
    return True


async def _on_store(store: Store, partition: str, steps: Steps[T], run: Callable[[Store, str, Steps[T]], T]) -> T:
    """Run ``steps`` on ``partition`` of ``store`` off the loop: awaited on the store's pooled
    connection of this loop (PostgreSQL), else ``run(store, partition, steps)`` on its writer thread."""
    if _postgres(store) and _has_pool(type(store)):
        return await store.keeping_cancels(_pooled(store, partition, steps))  # type: ignore[attr-defined]
    return await asyncio.get_running_loop().run_in_executor(_executor(store), run, store, partition, steps)


async def _pooled(store: Store, partition: str, steps: Steps[T]) -> T:
    async with store.async_pools().connection() as conn:  # type: ignore[attr-defined]
        return await arun_steps(steps, store.statements_on(conn, partition))  # type: ignore[attr-defined]


async def _write(store: Store, partition: str, steps: Steps[T], conn) -> T:
    """Run a writer's ``steps``: with no ``conn`` as :func:`_on_store` does, each apply its own
    transaction; with ``conn`` through the caller's connection inside its open transaction, as
    :func:`timerwheel_c.durable.timers.writer.write` does: a ``psycopg.AsyncConnection`` for a
    ``PostgresStore``, every statement awaited on it on this loop (no thread); or a
    ``sqlite3.Connection`` for a :class:`SQLiteStore`, run synchronously on this loop's thread, since
    a sqlite3 connection belongs to the thread that opened it (it blocks the loop for the write, and
    for up to the connection's busy timeout while another connection holds the file's write lock).
    The contract (what ``conn`` must be, commit and rollback, locks, wake-ups) is
    :mod:`timerwheel_c.durable.storage.joined`'s."""
    if conn is None:
        return await _on_store(store, partition, steps, writer.write)
    if _postgres(store):
        return await store.keeping_cancels(_joined(store, partition, steps, conn))  # type: ignore[attr-defined]
    return await _joined(store, partition, steps, conn)


async def _joined(store: Store, partition: str, steps: Steps[T], conn) -> T:
    async with ajoined(store, conn, partition) as tx:
        return await arun_steps(steps, tx)


def configure(store: Store, *, min_size: int = 1, max_size: int = 4, timeout_s: float = 10.0) -> None:
    """Size the async connection pools of the PostgresStore ``store`` made after this call (one per
    event loop, on its first write: call this before): ``min_size`` connections kept open (>= 0),
    ``max_size`` at most (>= max(1, min_size)), and ``timeout_s`` seconds (> 0) that a write waits
    for one before raising :class:`~timerwheel_c.durable.storage.errors.TransientStoreError`.
    ``timeout_s`` bounds the wait for a connection, not a write on one the network then drops
    without a word (a vanished host): that ends when TCP gives up, minutes later on Linux, unless
    the store's URL bounds it with libpq's ``tcp_user_timeout`` (ms) or ``keepalives_idle``.

    Raises:
        TypeError: ``store`` is not a PostgresStore (a SQLite store writes on a thread), or a
            non-int size. ValueError: a size or timeout out of range, naming it.
        ImportError: ``psycopg_pool`` is not installed (install ``timerwheel-c[postgres]``).
    """
    check_store(store)
    if not _postgres(store):
        raise TypeError(f"configure sizes the async connection pools of a PostgresStore, got {store!r} "
                        "(whose async writes run on a thread)")
    store.async_pools().configure(min_size, max_size, timeout_s)  # type: ignore[attr-defined]


async def _check_kind_name(store: Store, kind, conn=None) -> None:
    """:func:`~timerwheel_c.durable.timers.writer.check_kind_name` on the store's writer thread (it
    reads and records in the store with blocking calls), skipped with no thread once this process
    has checked ``kind``'s name against ``store``, and with ``conn`` as the sync one skips it."""
    if conn is None and unconfirmed(store, [kind]):
        await asyncio.get_running_loop().run_in_executor(_executor(store), writer.check_kind_name, store, kind)


async def schedule(store: Store, partition: Optional[str], due_at_ms, kind, reference: bytes, value: object = b"", *,
                   if_exists: str = "replace", conn=None, delay=None) -> bytes:
    """Await :func:`timerwheel_c.durable.schedule` (same arguments, return value and exceptions:
    a named kind the store records under another name raises KindNameMismatch, checked without
    ``conn``), or with ``conn`` on the caller's connection inside its open transaction (see
    :func:`_write`). Returns the pending timer row's key (bytes)."""
    partition = partition_of(partition, reference)
    steps = writer.schedule_steps(store, partition, due_or_delay(due_at_ms, delay), kind, reference, value, if_exists)
    await _check_kind_name(store, kind, conn)
    return await _write(store, partition, steps, conn)


async def schedule_many(store: Store, timers: Iterable[tuple], *, if_exists: str = "replace") -> None:
    """Await :func:`timerwheel_c.durable.schedule_many` (same arguments and exceptions; every timer
    checked before any is written, a named kind checked against the store's name for it).

    ``timers`` is read on the loop; the writes then run on the store's writer thread on both
    backends, as the sync call does them (on PostgreSQL, the store's own connection and its
    ``COPY`` of new rows): a transaction per chunk of timers of a partition, each a blocking
    statement of thousands of rows that no pooled connection would make shorter for the loop."""
    check_store(store)
    bulk.check_timers(timers)
    rows = list(timers)
    await asyncio.get_running_loop().run_in_executor(
        _executor(store), functools.partial(bulk.schedule_many, store, rows, if_exists=if_exists))


async def cancel(store: Store, partition: Optional[str], kind, reference: bytes, *, conn=None) -> bool:
    """Await :func:`timerwheel_c.durable.cancel` (same arguments, return value and exceptions), or
    with ``conn`` on the caller's connection inside its open transaction (see :func:`_write`). True
    if this call removed the timer."""
    partition = partition_of(partition, reference)
    steps = writer.cancel_steps(store, partition, kind, reference)
    await _check_kind_name(store, kind, conn)
    return await _write(store, partition, steps, conn)


async def reschedule(store: Store, partition: Optional[str], due_at_ms=None, kind=None, reference: Optional[bytes] = None, *,
                     conn=None, delay=None) -> bool:
    """Await :func:`timerwheel_c.durable.reschedule` (same arguments, in :func:`schedule`'s order, the
    former order accepted with a DeprecationWarning; same return value and exceptions), or with
    ``conn`` on the caller's connection inside its open transaction (see :func:`_write`). True if
    this call moved the pending timer."""
    due_at_ms, kind, reference = writer.in_schedule_order(due_at_ms, kind, reference)
    partition = partition_of(partition, reference)
    steps = writer.reschedule_steps(store, partition, kind, reference, due_or_delay(due_at_ms, delay))
    await _check_kind_name(store, kind, conn)
    return await _write(store, partition, steps, conn)


async def requeue(store: Store, partition: str, due_at=None, kind=None, reference: Optional[bytes] = None) -> bool:
    """Await :func:`timerwheel_c.durable.requeue` (same arguments, in :func:`schedule`'s order, the
    former order accepted with a DeprecationWarning; same return value and exceptions). True if the
    timer existed and is now scheduled."""
    due_at, kind, reference = writer.in_schedule_order(due_at, kind, reference, function="requeue", due="due_at")
    steps = writer.requeue_steps(store, partition, kind, reference, due_at)
    await _check_kind_name(store, kind)
    return await _write(store, partition, steps, None)


async def get_timer(store: Store, partition: Optional[str], kind, reference: bytes) -> Optional[writer.PendingTimer]:
    """Await :func:`timerwheel_c.durable.get_timer` (same arguments, return value and exceptions):
    the pending timer of that name, or None."""
    partition = partition_of(partition, reference)
    return await _on_store(store, partition, writer.get_timer_steps(store, partition, kind, reference),
                           writer.on_store)


async def add_schedule(store: Store, partition: str, name: str, trigger: Trigger, kind, value: object = b"", *,
                       misfire: str = "once", misfire_grace_s: float = 60.0,
                       catchup_window_s: Optional[float] = None,
                       paused: Optional[bool] = None) -> schedules.ScheduleInfo:
    """Await :func:`timerwheel_c.durable.add_schedule` (same arguments, return value and
    exceptions: a named kind the store records under another name raises KindNameMismatch)."""
    steps = schedules.add_schedule_steps(store, partition, name, trigger, kind, value, misfire=misfire,
                                         misfire_grace_s=misfire_grace_s, catchup_window_s=catchup_window_s,
                                         paused=paused)
    await _check_kind_name(store, kind)
    return await _write(store, partition, steps, None)

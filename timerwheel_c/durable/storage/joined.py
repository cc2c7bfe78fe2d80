"""Writes through the caller's own connection, inside the caller's open transaction.

An application that writes its own rows and a timer for them ("the order and its expiry timer commit
together") passes its connection as ``conn=`` to :func:`timerwheel_c.durable.schedule`, ``cancel`` or
``reschedule`` (River's ``InsertTx``, procrastinate's ``connection=``). The write then joins the
caller's transaction: it reads and writes on that connection only (nothing of it runs on the store's
own), takes the locks the store's own write takes, and is never committed or rolled back by
timerwheel_c. The timer exists if and only if the
caller commits; a rollback leaves nothing.

What the caller's connection must be:

- **SQLite**: a ``sqlite3.Connection`` to the store's own database file (checked: another file, or a
  ``":memory:"`` store, which no second connection can share, raises ValueError), from the thread
  that opened it unless it was opened with ``check_same_thread=False``.
- **PostgreSQL**: a ``psycopg.Connection`` (``psycopg.AsyncConnection`` in
  :mod:`timerwheel_c.durable.aio`) to the store's database, whose ``search_path`` finds the store's
  table by its unqualified name, as the store's own connection does. A connection to another database
  fails on the missing table (:class:`~.errors.PermanentStoreError`), unless that database holds a
  store of the same table name, which then receives the timer: that is not checked.
- **Both**: the store was opened once with this database (a :class:`~.store.Store` object creates its
  schema when it is made), and the write is visible to runners only once the caller commits.

The caller's transaction, and what is done when there is none:

- A transaction in progress (psycopg ``INTRANS``; sqlite3 ``in_transaction``) is joined.
- A connection that begins transactions by itself (psycopg's default, non-autocommit; sqlite3's default
  legacy mode with an ``isolation_level`` other than None; sqlite3 ``autocommit=False`` on Python
  3.12+, which keeps one always open) gets the transaction that its own next statement would have
  begun: psycopg's implicit ``BEGIN``, and on SQLite ``BEGIN IMMEDIATE``. IMMEDIATE, not the
  DEFERRED that sqlite3 would issue: the write reads the timer's identity row and then writes, and
  a deferred transaction that has read cannot take the write lock after another connection's commit
  (SQLITE_BUSY at once, the busy timeout not applying), so taking it first is what makes the write
  wait its turn instead. The transaction is then the caller's, to commit or to roll back.
- A connection in autocommit mode with no transaction open (psycopg ``autocommit=True`` outside a
  ``with conn.transaction():`` block; sqlite3 ``isolation_level=None`` or ``autocommit=True`` with
  no ``BEGIN`` issued) is refused with ValueError: the write would commit on its own at once, which
  is never what passing ``conn=`` asks for. Pass no ``conn`` for that.
- A psycopg transaction that already failed (``INERROR``), or a closed connection, is refused with
  ValueError.

Each write runs inside a ``SAVEPOINT`` of its own, released when it ends: one that fails (a refused
guard such as :class:`~timerwheel_c.durable.timers.writer.TimerExists`, a server error) rolls back
to it, so it undoes only itself and leaves the caller's transaction usable, on PostgreSQL too.

Locks, held until the caller's transaction ends: on PostgreSQL the write takes the partition's
transaction-level advisory lock that every guarded commit on that partition takes (the store's
``<table>_apply_many``), so no runner's claim or outcome interleaves with the guards it judged;
runners wait to commit on that partition until the caller commits or rolls back. Writes to several
partitions in one transaction should take them in one order everywhere, or PostgreSQL breaks the
deadlock by failing one transaction (a :class:`~.errors.TransientStoreError`). On SQLite the caller's
transaction holds the file's write lock, as any SQLite write does. Either way, commit soon after.

Wake-ups come with the commit, never before and never for a rollback: on PostgreSQL the table's
trigger calls ``pg_notify`` inside the caller's transaction, which PostgreSQL delivers on commit only;
on SQLite the runners' watcher sees ``PRAGMA data_version`` change when the caller's commit lands
(:mod:`.watch`). Until then the rows are invisible to every runner, due or not.

Errors from the caller's connection are raised as :class:`~.errors.StoreError`, classified as the
store's own are.
"""
from __future__ import annotations

from typing import Any

from .savepoint import Joined
from .store import Store, check_store

__all__ = ["Joined", "ajoined", "joined"]


def joined(store: Store, conn: Any, partition: str) -> Joined:
    """The :class:`Joined` write to ``partition`` of ``store`` through the caller's sync connection
    ``conn`` (a ``sqlite3.Connection`` for a ``SQLiteStore``, a ``psycopg.Connection`` for a
    ``PostgresStore``), its state checked now: the store's own :meth:`~.store.Store.joined`.

    Raises:
        TypeError: ``store`` takes no caller's connection, or ``conn`` is of the wrong type for it
            (named by its type, never its repr, which may hold a DSN).
        ValueError: ``conn`` is closed, to another SQLite file, in autocommit mode with no
            transaction open, or in a failed transaction.
    """
    return check_store(store).joined(conn, partition)


def ajoined(store: Store, conn: Any, partition: str) -> Any:
    """:func:`joined` for asyncio code: an async context manager whose ``get`` and ``apply`` are
    coroutine functions. With a ``psycopg.AsyncConnection`` (a ``PostgresStore``) every statement is
    awaited on it, on the caller's loop, with no thread. With a ``sqlite3.Connection`` (a
    ``SQLiteStore``) the write runs synchronously on the loop's thread: sqlite3 connections
    belong to the thread that opened them, so it cannot move to another; it blocks the loop for the
    write's few statements, and for up to the connection's busy timeout while another writer holds
    the file's lock.

    Raises:
        TypeError / ValueError: as :func:`joined` (a sync ``psycopg.Connection`` is a TypeError here).
    """
    return check_store(store).ajoined(conn, partition)

"""Writes through the caller's psycopg connection, sync or async, inside its open transaction: the
PostgreSQL half of :mod:`.joined`, which documents the contract.

The statements and their parameters are the store's own (:meth:`PostgresStore.query`,
:meth:`PostgresStore.apply_call`, :func:`~.results.apply_results`): a write here calls the same
``<table>_apply_many`` function as the store's own ``apply``, taking the same advisory lock on the
partition and judging the guards the same way. Only where the statements run differs: on the
caller's connection, inside a ``SAVEPOINT``, on cursors of its own that bind ``%s`` and return
tuples whatever ``cursor_factory`` (``psycopg.RawCursor`` takes ``$1``) and ``row_factory`` the
caller's connection has, and (:class:`AsyncPgJoined`) awaited. The awaited
statements alone (:class:`AsyncPgStatements`) also carry :mod:`timerwheel_c.durable.aio`'s writes on
an autocommit connection of the store's pool (:mod:`.pool`), where each apply is its own
transaction, as the store's own ``apply`` is.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Optional, Union

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from ..errors import wrap_exceptions
from ..savepoint import OPEN, Joined, ending, type_name, unless_failing
from ..store import Batch, Committed, PreconditionFailed, through
from .results import RESHARD_RETRIES, apply_results, resharded_meanwhile, store_error

if TYPE_CHECKING:
    from .store import PostgresStore

__all__ = ["AsyncPgJoined", "AsyncPgStatements", "PgJoined"]

_WRAP = wrap_exceptions(psycopg.Error, store_error)


def _check(store: PostgresStore, conn: Any, want: Any, other: Any, other_hint: str) -> None:
    """Raise TypeError unless ``conn`` is a ``want``, ValueError unless it can join a transaction now."""
    if isinstance(conn, other):
        raise TypeError(f"conn is a {type_name(conn)}: {other_hint}")
    if not isinstance(conn, want):
        raise TypeError(f"conn must be a psycopg.{want.__qualname__} for {store!r}, got {type_name(conn)}")
    if conn.closed or conn.broken:
        raise ValueError(f"conn is a closed {type_name(conn)}")
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise ValueError("conn's transaction has already failed (INERROR): roll it back before writing through it")
    if status == TransactionStatus.IDLE and conn.autocommit:
        raise ValueError("conn is in autocommit mode with no transaction open, so the write would commit on its own: "
                         "write inside `with conn.transaction():`, or pass no conn")
    if status not in (TransactionStatus.IDLE, TransactionStatus.INTRANS):
        raise ValueError(f"conn cannot start a statement now (its transaction status is {status.name})")


# The caller's isolation level, read in the round trip that opens the write's savepoint.
_OPEN_READING_LEVEL = f"SELECT current_setting('transaction_isolation'); {OPEN}"
_REPEATABLE_READ = "repeatable read"
_LEVEL_REFUSED = (
    "conn's transaction is REPEATABLE READ: a write's guards must see the rows committed while it waits for its "
    "partition's lock, which that level hides (a guarded write could commit on a value another writer had changed "
    "meanwhile): write in a READ COMMITTED transaction (PostgreSQL's default) or a SERIALIZABLE one")


def _level(row: Optional[tuple]) -> str:
    """The isolation level in the row :data:`_OPEN_READING_LEVEL` returns."""
    assert row is not None  # current_setting() returns one row
    return str(row[0])


def _value(row: Optional[tuple]) -> Optional[bytes]:
    return None if row is None else bytes(row[0])


class _OnConnection:
    """The store, a connection and the partition of a write."""

    def __init__(self, store: PostgresStore, conn: Any, partition: str):
        self._store = store
        self._conn = conn
        self._partition = partition


class _Joining(_OnConnection):
    """A write through the caller's connection, checked to be a ``_want`` that can join a transaction now."""

    _want: Any
    _other: Any
    _other_hint: str

    def __init__(self, store: PostgresStore, conn: Any, partition: str):
        _check(store, conn, self._want, self._other, self._other_hint)
        super().__init__(store, conn, partition)


class PgJoined(_Joining, Joined):
    """:class:`Joined` on a ``psycopg.Connection``. In psycopg's default (non-autocommit) mode with
    no transaction yet, the savepoint's statement is the one that makes psycopg begin it."""

    _want = psycopg.Connection
    _other = psycopg.AsyncConnection
    _other_hint = "await timerwheel_c.durable.aio's writers with it, or pass a psycopg.Connection here"

    def __enter__(self) -> "PgJoined":
        with _WRAP, psycopg.Cursor(self._conn, row_factory=tuple_row) as cur:
            level = _level(cur.execute(_OPEN_READING_LEVEL).fetchone())
        if level == _REPEATABLE_READ:
            self.__exit__(None, None, None)
            raise ValueError(_LEVEL_REFUSED)
        return self

    def __exit__(self, typ, exc, tb) -> None:
        for statement in ending(exc):
            with unless_failing(exc, _WRAP):
                self._conn.execute(statement)

    def get(self, key: bytes) -> Optional[bytes]:
        with _WRAP, psycopg.Cursor(self._conn, row_factory=tuple_row) as cur:
            return _value(cur.execute(self._store.query("get"), (self._partition, key)).fetchone())

    def get_through(self, key: bytes) -> tuple:
        with _WRAP, psycopg.Cursor(self._conn, row_factory=tuple_row) as cur:
            return through(cur.execute(self._store.query("get_through"), (self._partition, key)).fetchone())

    def scan(self, start: bytes, end: bytes, limit: int) -> list:
        with _WRAP, psycopg.Cursor(self._conn, row_factory=tuple_row) as cur:
            return cur.execute(self._store.query("scan_from"), (self._partition, start, end, limit), binary=True).fetchall()

    def apply(self, batch: Batch) -> Union[Committed, PreconditionFailed]:
        # No row: the store's shard count is not the one the transaction reads (a reshard), which
        # PostgresStore.joined_miss judges: the write runs again at that count, or the transaction
        # must be run again whole.
        for _ in range(RESHARD_RETRIES):
            query, args = self._store.apply_call(self._partition, [batch], False)
            with _WRAP, psycopg.Cursor(self._conn, row_factory=tuple_row) as cur:
                row = cur.execute(query, args).fetchone()
                if row is not None:
                    return apply_results(*row)[0]
                recorded = cur.execute(self._store.query("shard_count")).fetchone()
            self._store.joined_miss(recorded)
        raise resharded_meanwhile(self._store.table)


class AsyncPgStatements(_OnConnection):
    """:meth:`PgJoined.get`, :meth:`PgJoined.scan` and :meth:`PgJoined.apply` on a ``psycopg.AsyncConnection``, awaited;
    in whatever transaction state the connection is (autocommit: each statement its own)."""

    async def get(self, key: bytes) -> Optional[bytes]:
        with _WRAP:
            async with psycopg.AsyncCursor(self._conn, row_factory=tuple_row) as cur:
                return _value(await (await cur.execute(self._store.query("get"), (self._partition, key))).fetchone())

    async def get_through(self, key: bytes) -> tuple:
        with _WRAP:
            async with psycopg.AsyncCursor(self._conn, row_factory=tuple_row) as cur:
                return through(await (await cur.execute(self._store.query("get_through"), (self._partition, key))).fetchone())

    async def scan(self, start: bytes, end: bytes, limit: int) -> list:
        with _WRAP:
            async with psycopg.AsyncCursor(self._conn, row_factory=tuple_row) as cur:
                query, args = self._store.query("scan_from"), (self._partition, start, end, limit)
                return await (await cur.execute(query, args, binary=True)).fetchall()

    async def apply(self, batch: Batch) -> Union[Committed, PreconditionFailed]:
        for _ in range(RESHARD_RETRIES):  # as PgJoined.apply; the store's own read in a thread
            query, args = self._store.apply_call(self._partition, [batch], False)
            with _WRAP:
                async with psycopg.AsyncCursor(self._conn, row_factory=tuple_row) as cur:
                    row = await (await cur.execute(query, args)).fetchone()
                    if row is not None:
                        return apply_results(*row)[0]
                    recorded = await (await cur.execute(self._store.query("shard_count"))).fetchone()
            await asyncio.to_thread(self._store.joined_miss, recorded)
        raise resharded_meanwhile(self._store.table)


class AsyncPgJoined(_Joining, AsyncPgStatements):
    """:class:`PgJoined` on a ``psycopg.AsyncConnection``: the same statements, awaited."""

    _want = psycopg.AsyncConnection
    _other = psycopg.Connection
    _other_hint = "it would block the event loop: pass a psycopg.AsyncConnection, or call the sync writer"

    async def __aenter__(self) -> "AsyncPgJoined":
        with _WRAP:
            async with psycopg.AsyncCursor(self._conn, row_factory=tuple_row) as cur:
                level = _level(await (await cur.execute(_OPEN_READING_LEVEL)).fetchone())
        if level == _REPEATABLE_READ:
            await self.__aexit__(None, None, None)
            raise ValueError(_LEVEL_REFUSED)
        return self

    async def __aexit__(self, typ, exc, tb) -> None:
        for statement in ending(exc):
            with unless_failing(exc, _WRAP):
                await self._conn.execute(statement)

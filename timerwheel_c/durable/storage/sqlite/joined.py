"""Writes through the caller's ``sqlite3.Connection``, inside its open transaction: the SQLite half
of :mod:`..joined`, which documents the contract. The statements are the store's own
(:mod:`.rows`), run on a cursor of the caller's connection inside a ``SAVEPOINT``.
"""
from __future__ import annotations

import functools
import os
import sqlite3
from typing import TYPE_CHECKING, Any, Optional, Union

from ..errors import wrap_exceptions
from ..savepoint import OPEN, Joined, ending, type_name, unless_failing
from ..shards import partition_hash
from ..store import Batch, Committed, PreconditionFailed
from .errors import store_error
from .rows import OnCursor

if TYPE_CHECKING:
    from .store import SQLiteStore

__all__ = ["OnTheLoop", "SQLiteJoined"]


class SQLiteJoined(OnCursor, Joined):
    """:class:`Joined` on a ``sqlite3.Connection`` to the store's own database file. A connection
    that begins transactions by itself, with none open yet, gets ``BEGIN IMMEDIATE`` (:mod:`..joined`
    says why not DEFERRED)."""

    def __init__(self, store: "SQLiteStore", conn: Any, partition: str):
        if not isinstance(conn, sqlite3.Connection):
            raise TypeError(f"conn must be a sqlite3.Connection to {store.path!r} for {store!r}, "
                            f"got {type_name(conn)}")
        if store.path == ":memory:":
            raise ValueError(f"{store!r} is private to its own connection; conn= needs a store on a database file")
        try:
            in_transaction = conn.in_transaction
            # A cursor of its own, returning plain tuples whatever row_factory the caller's connection
            # has; its text_factory may still make the names bytes.
            cursor = conn.cursor()
            cursor.row_factory = None
            files = {os.fsdecode(name): os.fsdecode(file)
                     for _, name, file in cursor.execute("PRAGMA database_list")}
        except sqlite3.ProgrammingError as exc:  # closed, or used from another thread
            raise ValueError(f"conn cannot be used: {exc}") from None
        if not _same_file(files.get("main"), store.path):
            raise ValueError(f"conn is a connection to {files.get('main') or ':memory:'!r}, not to the database "
                             f"file of {store!r}")
        autocommit = getattr(conn, "autocommit", -1)  # Python >= 3.12; -1 is LEGACY_TRANSACTION_CONTROL
        if not in_transaction and (autocommit is True or (autocommit == -1 and conn.isolation_level is None)):
            raise ValueError("conn is in autocommit mode (isolation_level=None or autocommit=True) with no transaction "
                             "open, so the write would commit on its own: execute BEGIN on it first, or pass no conn")
        OnCursor.__init__(self, cursor, partition, partition_hash(partition),
                          wrap_exceptions(sqlite3.Error, functools.partial(store_error, store.path)))
        self._begin = not in_transaction

    def __enter__(self) -> "SQLiteJoined":
        with self._wrap:
            if self._begin:
                self._cursor.execute("BEGIN IMMEDIATE")
            self._cursor.execute(OPEN)
        return self

    def __exit__(self, typ, exc, tb) -> None:
        for statement in ending(exc):
            with unless_failing(exc, self._wrap):
                self._cursor.execute(statement)


def _same_file(opened: Optional[str], path: str) -> bool:
    """True when SQLite's name of a connection's main database, ``opened`` (absolute, or empty for a
    private one), is the file at ``path``: compared as written first, and only then through symbolic
    links (a few system calls, which would otherwise cost more than the write itself)."""
    if not opened:
        return False
    return opened == os.path.abspath(path) or os.path.realpath(opened) == os.path.realpath(path)


class OnTheLoop:
    """A sync :class:`Joined` behind the async interface of :meth:`~.store.SQLiteStore.ajoined`, run where it is awaited."""

    def __init__(self, tx: Joined):
        self._tx = tx

    async def __aenter__(self) -> "OnTheLoop":
        self._tx.__enter__()
        return self

    async def __aexit__(self, typ, exc, tb) -> None:
        self._tx.__exit__(typ, exc, tb)

    async def get(self, key: bytes) -> Optional[bytes]:
        return self._tx.get(key)

    async def get_through(self, key: bytes) -> tuple:
        return self._tx.get_through(key)

    async def scan(self, start: bytes, end: bytes, limit: int) -> list:
        return self._tx.scan(start, end, limit)

    async def apply(self, batch: Batch) -> Union[Committed, PreconditionFailed]:
        return self._tx.apply(batch)

"""New rows in bulk through ``COPY``: how :class:`~.store.PostgresStore` applies a large batch that
only inserts.

A batch of :func:`~timerwheel_c.durable.timers.bulk.schedule_many` puts thousands of new rows, each
guarded by ``Absent`` on a key the batch itself puts. Through ``<table>_apply_sets`` every row costs
an element in each of a dozen arrays, a join to judge its guard and an ``ON CONFLICT`` check. Here
the rows go in with one ``COPY ... FROM STDIN (FORMAT BINARY)`` instead, in the transaction that
holds the partition's advisory lock as every guarded commit does, and the primary key judges the
guards: a key already present aborts the ``COPY`` (SQLSTATE 23505), the transaction rolls back with
nothing written, and the caller applies the batch the ordinary way, which names the guard that
failed (or overwrites the unguarded row the batch puts). PostgreSQL's binary ``COPY`` layout: a
signature and two header words, then per row a field count and a length word before each field,
and a -1 trailer (``src/backend/commands/copyfromparse.c``); the payload is built in one
``bytes.join``, as :mod:`.arrays` builds its arrays.
"""
from __future__ import annotations

import struct
from typing import Optional

import psycopg
from psycopg import sql

from ..store import Absent, Batch

__all__ = ["MIN_ROWS", "copy_new_rows", "copyable", "payload"]

MIN_ROWS = 256  # below this many puts the set-based apply costs about as little, in one round trip

_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)  # signature, flags, no header extension
_TRAILER = struct.pack(">h", -1)
_ROW = struct.Struct(">hi").pack  # the field count (3), then the partition's length word
_LEN = struct.Struct(">i").pack


def copyable(batch: Batch) -> bool:
    """True when ``batch`` is at least :data:`MIN_ROWS` puts of distinct keys and nothing else, its
    guards all ``Absent`` on keys it puts: then writing every row, or none where some key exists,
    is what :meth:`~.store.Store.apply` would do whenever the keys are new."""
    writes = batch.writes
    if len(writes) < MIN_ROWS:
        return False
    put = {key for key, value in writes if value is not None}
    return (len(put) == len(writes) and all(isinstance(g, Absent) for g in batch.guards)
            and all(g.key in put for g in batch.guards))


def payload(partition: str, writes: list) -> bytes:
    """The binary ``COPY`` data of rows ``(partition, key, value)`` for each ``(key, value)`` of ``writes``."""
    part = partition.encode()
    head = _ROW(3, len(part)) + part
    return _HEADER + b"".join([head + _LEN(len(k)) + k + _LEN(len(v)) + v for k, v in writes]) + _TRAILER


def copy_new_rows(conn: psycopg.Connection, lock: sql.Composed, lock_args: tuple, statement: sql.Composed,
                  partition: str, writes: list) -> Optional[bool]:
    """Insert ``writes`` (``(key, value)`` pairs of new keys) into ``partition`` with ``statement``
    (``copy_rows`` of ``postgres/sql/queries.sql``) in one transaction holding the advisory lock that
    ``lock`` (``lock_shard`` there) takes with ``lock_args``; True once committed, False (nothing
    written) when some key was present, None (nothing written) when the store's shard count is no
    longer the one the lock's key is of.

    Raises:
        psycopg.Error: any other failure (the caller wraps it into a StoreError).
    """
    try:
        with conn.transaction():
            locked = conn.execute(lock, lock_args).fetchone()
            if not (locked and locked[0]):
                raise psycopg.Rollback()
            with conn.cursor() as cur, cur.copy(statement) as copy:
                copy.write(payload(partition, writes))
                return True
    except psycopg.errors.UniqueViolation:
        return False
    return None

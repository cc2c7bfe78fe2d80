"""Store helpers of the benchmarks and the tests, never used by the library itself.

- :class:`Delegating`: a store that passes every call on to another, to observe or alter some.
- :func:`add_pg_dsn`, :func:`pg_dsn`: a bench module's `--pg-dsn`, defaulting to `$TIMERWHEEL_C_STORE`.
- :func:`dispose`: close a benchmark's or a test's store, dropping a PostgreSQL store's table and
  the functions and meta table made with it first.
"""
from __future__ import annotations

import os
from typing import Callable, Optional, Union

from timerwheel_c.durable.storage.store import Batch, Committed, Page, PreconditionFailed, Store, check_store
from timerwheel_c.durable.storage.watch import Watcher

__all__ = ["OWNED_BY_TABLE", "TABLE_FUNCTIONS", "Delegating", "add_pg_dsn", "dispose", "drop", "pg_dsn"]

# Every object a PostgresStore makes (storage/postgres/sql/) is named after its table: the table
# itself or "<table>_<suffix>", in the current schema. A condition on an object's name and schema
# columns; %(t)s is the table's name. TABLE_FUNCTIONS reads a store's functions from the catalog
# rather than from a list kept here, so that a function a new schema version adds is dropped too.
OWNED_BY_TABLE = "(({name}) = %(t)s OR starts_with({name}, %(t)s || '_')) AND {space} = current_schema()::regnamespace"
TABLE_FUNCTIONS = ("SELECT p.oid::regprocedure::text FROM pg_proc p WHERE "
              + OWNED_BY_TABLE.format(name="p.proname", space="p.pronamespace"))


class Delegating(Store):
    """A store passing every call on to ``inner`` (any :class:`Store`); subclass it and override a
    hook (``_scan``, ``_get``, ``_apply``, ``_apply_many``, ``_scan_shards``, ``_partitions``) to observe or alter
    those calls, as the benchmarks and tests do. The public methods still validate first.

    Raises:
        TypeError: ``inner`` is not a Store (a DSN's password masked).
    """

    def __init__(self, inner: Store):
        self.inner = check_store(inner, "inner")

    def __repr__(self):
        return f"{type(self).__name__}({self.inner!r})"

    def _scan(self, partition: str, start: bytes, end: bytes, after: Optional[bytes], limit: int) -> Page:
        return self.inner.scan(partition, start, end, after, limit)

    def _get(self, partition: str, key: bytes) -> Optional[bytes]:
        return self.inner.get(partition, key)

    def _scan_shards(self, shards: list, start: bytes, end: bytes, limit) -> list:
        return self.inner.scan_shards(shards, start, end, limit)

    @property
    def shard_count(self) -> int:  # type: ignore[override]  # as the store it wraps
        return self.inner.shard_count

    def refresh_shard_count(self) -> int:
        return self.inner.refresh_shard_count()

    def _apply(self, partition: str, batch: Batch) -> Union[Committed, PreconditionFailed]:
        return self._apply_many(partition, [batch])[0]

    def _apply_many(self, partition: str, batches: list) -> list:
        return self.inner.apply_many(partition, batches)

    def _record_labels(self, labels: dict) -> dict:
        return self.inner.record_labels(labels)

    def _labels(self, prefix: str) -> dict:
        return self.inner.labels(prefix)

    def _partitions(self) -> list:
        return self.inner.partitions()

    @property
    def reads_many_at_once(self) -> bool:  # type: ignore[override]  # as the store it wraps
        return self.inner.reads_many_at_once

    def watch(self, callback: Callable[[], None]) -> Watcher:
        """``inner``'s change signal: a wrapper sees the same writes its store does."""
        return self.inner.watch(callback)

    def _signal_writes(self, patterns: list) -> None:
        self.inner.signal_writes(patterns)


def drop(store: Store) -> None:
    """Drop a PostgresStore's table, its timers' view, meta table and functions (any other store: nothing); the store
    is unusable afterwards.

    Raises:
        StoreError: the server cannot be reached.
    """
    table = getattr(store, "table", None)
    if table is None or not hasattr(store, "new_connection"):
        return
    from psycopg import sql

    with store.new_connection() as conn:
        conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(sql.Identifier(f"{table}_timers")))  # it reads the table
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))  # its trigger too
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(f"{table}_meta")))
        for (function,) in conn.execute(TABLE_FUNCTIONS, {"t": table}).fetchall():
            conn.execute(sql.SQL("DROP FUNCTION IF EXISTS {}").format(sql.SQL(function)))


def dispose(store: Store) -> None:
    """:func:`drop` then close ``store``."""
    drop(store)
    store.close()


def add_pg_dsn(parser) -> None:
    """Add ``--pg-dsn`` to a bench module's argparse ``parser``: the figures on PostgreSQL too."""
    from timerwheel_c.durable.service.cli import STORE_ENV

    parser.add_argument("--pg-dsn", default=None, help=f"also on PostgreSQL (default: ${STORE_ENV} when that is a "
                                                       "postgresql:// URL)")


def pg_dsn(given: Optional[str]) -> Optional[str]:
    """The PostgreSQL DSN of a bench run: ``given`` (``--pg-dsn``), else ``$TIMERWHEEL_C_STORE`` when
    that is a postgresql:// URL, else None."""
    from timerwheel_c.durable.service.cli import STORE_ENV

    found = os.environ.get(STORE_ENV, "")
    if given is None and found.startswith(("postgresql://", "postgres://")):
        return found
    return given

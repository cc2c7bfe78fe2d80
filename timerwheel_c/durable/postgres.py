"""PostgresStore: the durable-timer store contract on PostgreSQL, with psycopg 3.

One table, ``(partition text, key bytea, value bytea, PRIMARY KEY (partition, key))``;
PostgreSQL orders bytea by memcmp, then length, which is Python's bytes order, so the
primary-key index serves the scans.

``apply`` is one round trip: a call of a PL/pgSQL function created with the table
(``<table>_apply``), which runs in the call's own transaction. It first takes
``pg_advisory_xact_lock`` on the partition (a 64-bit hash of the table and partition
names), then checks the guards, writes, and commits. The lock serializes guarded
commits on a partition across every connection, the way SQLite's ``BEGIN IMMEDIATE``
does, so an ``Absent`` guard cannot be defeated by a concurrent insert (row locks
cannot lock a row that does not exist).

The change signal (:meth:`PostgresStore.watch`): a row trigger created with the table
(:data:`NOTIFY_DDL`, ``<table>_wake``) calls ``pg_notify('<table>_wake', '')`` for every
insert or update of a timer row (a key starting with ``b"T"``), in the writing
transaction, however the row was written; PostgreSQL folds equal notifications of one
transaction into one. A :class:`timerwheel_c.durable.pg_listen.PgListener` receives them.

One connection per store, shared by threads under a lock; a broken connection
(server restart, network) is replaced on the next call, and the error of the failed
call propagates (``psycopg.OperationalError``) for the caller to retry.
"""
from __future__ import annotations

import hashlib
import re
import threading
from typing import Callable, Optional, Union

import psycopg
from psycopg import sql

from .pg_listen import PgListener
from .store import Absent, Batch, Committed, Page, PreconditionFailed, Store, check_bytes, check_partition
from .watch import Watcher

__all__ = ["PostgresStore"]

_TABLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,56}$")  # room for the "_apply" suffix


# Returns the key of the first guard that failed (nothing written), or NULL once all writes are done.
_APPLY_FUNCTION = """
CREATE OR REPLACE FUNCTION {fn}(p text, lock_key bigint, gk bytea[], gv bytea[], absent boolean[],
                                wk bytea[], wv bytea[]) RETURNS bytea LANGUAGE plpgsql AS $$
DECLARE
  i int;
  cur bytea;
BEGIN
  PERFORM pg_advisory_xact_lock(lock_key);
  FOR i IN 1 .. coalesce(array_length(gk, 1), 0) LOOP
    SELECT value INTO cur FROM {t} WHERE partition = p AND key = gk[i];
    IF absent[i] THEN
      IF FOUND THEN RETURN gk[i]; END IF;
    ELSIF NOT FOUND OR cur <> gv[i] THEN
      RETURN gk[i];
    END IF;
  END LOOP;
  FOR i IN 1 .. coalesce(array_length(wk, 1), 0) LOOP
    IF wv[i] IS NULL THEN
      DELETE FROM {t} WHERE partition = p AND key = wk[i];
    ELSE
      INSERT INTO {t} (partition, key, value) VALUES (p, wk[i], wv[i])
        ON CONFLICT (partition, key) DO UPDATE SET value = EXCLUDED.value;
    END IF;
  END LOOP;
  RETURN NULL;
END
$$
"""

# The change signal: a trigger function and a row trigger, both named {wake} (the table name
# plus "_wake", also the NOTIFY channel). The trigger is created only when missing, so a second
# store opening the table takes no lock on it. Deletes do not notify: they never make a timer due sooner.
NOTIFY_DDL = r"""
CREATE OR REPLACE FUNCTION {wake}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify({channel}, '');
  RETURN NULL;
END
$$;
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = {table_name}::regclass AND tgname = {channel}) THEN
    CREATE TRIGGER {wake} AFTER INSERT OR UPDATE ON {t} FOR EACH ROW
      WHEN (substr(NEW.key, 1, 1) = '\x54'::bytea) EXECUTE FUNCTION {wake}();
  END IF;
END
$$
"""


def notify_ddl(table: str) -> sql.Composed:
    """:data:`NOTIFY_DDL` for ``table`` (a checked lower-case identifier), ready to execute."""
    wake = f"{table}_wake"
    return sql.SQL(NOTIFY_DDL).format(wake=sql.Identifier(wake), channel=sql.Literal(wake),
                                      table_name=sql.Literal(table), t=sql.Identifier(table))


class PostgresStore(Store):
    """The store contract on PostgreSQL (>= 12) through psycopg 3.

    Args:
        dsn: a libpq connection string or ``postgresql://`` URL.
        table: the table name (lower-case identifier, default ``timerwheel_kv``); created if missing.
        synchronous_commit: this store's session ``synchronous_commit`` ("on", "off", "local",
            "remote_write", "remote_apply"), or None for the server's setting. "off" skips the
            WAL flush wait per commit, like SQLite's ``synchronous=NORMAL`` in WAL mode: a
            server crash may lose the last commits, each one whole, never half of one.

    Raises:
        TypeError / ValueError: a bad argument.
        psycopg.Error: the server cannot be reached or the table cannot be created.
    """

    def __init__(self, dsn: str, *, table: str = "timerwheel_kv", synchronous_commit: Optional[str] = None):
        if not isinstance(dsn, str):
            raise TypeError(f"dsn must be a str, got {type(dsn).__name__}")
        if not isinstance(table, str) or not _TABLE_NAME.match(table):
            raise ValueError(f"table must be a lower-case SQL identifier, got {table!r}")
        if synchronous_commit not in (None, "on", "off", "local", "remote_write", "remote_apply"):
            raise ValueError(f"synchronous_commit must be None or a PostgreSQL setting, got {synchronous_commit!r}")
        self.dsn = dsn
        self.synchronous_commit = synchronous_commit
        self.table = table
        self._lock = threading.Lock()
        t = sql.Identifier(table)
        self._sql_scan_from = sql.SQL(
            "SELECT key, value FROM {} WHERE partition = %s AND key >= %s AND key < %s ORDER BY key LIMIT %s").format(t)
        self._sql_scan_after = sql.SQL(
            "SELECT key, value FROM {} WHERE partition = %s AND key > %s AND key < %s ORDER BY key LIMIT %s").format(t)
        self._sql_get = sql.SQL("SELECT value FROM {} WHERE partition = %s AND key = %s").format(t)
        self._sql_partitions = sql.SQL("SELECT DISTINCT partition FROM {} ORDER BY partition").format(t)
        fn = sql.Identifier(f"{table}_apply")
        self._sql_apply = sql.SQL("SELECT {}(%s, %s, %s::bytea[], %s::bytea[], %s::boolean[], %s::bytea[], %s::bytea[])").format(fn)
        self._conn: Optional[psycopg.Connection] = None
        with self._lock:
            conn = self._connection()
            with conn.transaction():
                conn.execute(sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (partition text NOT NULL, key bytea NOT NULL,"
                    " value bytea NOT NULL, PRIMARY KEY (partition, key))").format(t))
                conn.execute(sql.SQL(_APPLY_FUNCTION).format(fn=fn, t=t))
                conn.execute(notify_ddl(table))

    def __repr__(self):
        return f"PostgresStore(table={self.table!r})"

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn, autocommit=True)
            if self.synchronous_commit is not None:
                self._conn.execute(sql.SQL("SET synchronous_commit = {}").format(sql.Literal(self.synchronous_commit)))
        return self._conn

    def _lock_key(self, partition: str) -> int:
        digest = hashlib.blake2b(f"{self.table}\0{partition}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big", signed=True)

    def scan(self, partition: str, start: bytes, end: bytes, after: Optional[bytes] = None, limit: int = 64) -> Page:
        self.check_scan_args(partition, start, end, after, limit)
        query, lower = (self._sql_scan_after, after) if after is not None and after >= start else (self._sql_scan_from, start)
        with self._lock:
            rows = self._connection().execute(query, (partition, lower, end, limit + 1)).fetchall()
        return Page.from_rows(rows, limit)

    def get(self, partition: str, key: bytes) -> Optional[bytes]:
        check_partition(partition)
        check_bytes("key", key)
        with self._lock:
            row = self._connection().execute(self._sql_get, (partition, key)).fetchone()
        return None if row is None else bytes(row[0])

    def apply(self, partition: str, batch: Batch) -> Union[Committed, PreconditionFailed]:
        check_partition(partition)
        self.check_batch(batch)
        guards = batch.guards
        args = (
            partition,
            self._lock_key(partition),
            [g.key for g in guards],
            [None if isinstance(g, Absent) else g.value for g in guards],
            [isinstance(g, Absent) for g in guards],
            [k for k, _ in batch.writes],
            [v for _, v in batch.writes],
        )
        with self._lock:
            failed = self._connection().execute(self._sql_apply, args).fetchone()[0]
        return Committed() if failed is None else PreconditionFailed(bytes(failed))

    def watch(self, callback: Callable[[], None]) -> Watcher:
        """The change signal (see :meth:`Store.watch`): a :class:`PgListener` on the channel
        ``<table>_wake``, on a connection of its own that reconnects after any loss."""
        return PgListener(self.dsn, f"{self.table}_wake", callback)

    def partitions(self) -> list:
        with self._lock:
            return [r[0] for r in self._connection().execute(self._sql_partitions).fetchall()]

    def drop(self) -> None:
        """Drop this store's table (for tests and benchmarks); the store is unusable afterwards."""
        with self._lock:
            conn = self._connection()
            conn.execute(sql.SQL("DROP FUNCTION IF EXISTS {}").format(sql.Identifier(f"{self.table}_apply")))
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(self.table)))
            conn.execute(sql.SQL("DROP FUNCTION IF EXISTS {}").format(sql.Identifier(f"{self.table}_wake")))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()

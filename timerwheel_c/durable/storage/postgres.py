"""PostgresStore: the durable-timer store contract on PostgreSQL, with psycopg 3.

One table, ``(partition text, key bytea, value bytea, PRIMARY KEY (partition, key))``;
PostgreSQL orders bytea by memcmp, then length, which is Python's bytes order, so the
primary-key index serves the scans.

``apply`` and ``apply_many`` are one round trip each: a call of a PL/pgSQL function
created with the table (``<table>_apply_many``) that takes the batches flattened into
arrays and runs in the call's own transaction, so a list of batches costs one commit
(one WAL flush with ``synchronous_commit`` on). It first takes ``pg_advisory_xact_lock``
on the partition (a 64-bit hash of the table and partition names), then, batch by
batch, checks the guards and, if all hold, writes. The lock serializes guarded commits
on a partition across every connection, the way SQLite's ``BEGIN IMMEDIATE`` does, so
an ``Absent`` guard cannot be defeated by a concurrent insert (row locks cannot lock a
row that does not exist).

The schema (table, function, and the ``<table>_meta`` row holding the schema version)
is created or upgraded once, inside a transaction holding an advisory lock, so any
number of processes can open the store at the same moment; a schema written by a newer
version raises :class:`~timerwheel_c.durable.store.SchemaVersionError`.

The change signal (:meth:`PostgresStore.watch`): a row trigger created with the table
(:data:`NOTIFY_DDL`, ``<table>_wake``) calls ``pg_notify('<table>_wake', '')`` for every
insert or update of a scheduled timer row (a key starting with ``b"T"``, in the
scheduled layout) or of a durable-sleep mark (``b"S"``), in the writing transaction, however the row was written;
PostgreSQL folds equal notifications of one transaction into one. A
:class:`timerwheel_c.durable.pg_listen.PgListener` receives them. Backed-off rows do not
notify (see :data:`NOTIFY_DDL`): a second runner serving the same partition in parallel
(not a fleet, which gives each partition one owner) finds a row that another runner
claimed and abandoned on its next pass, within its ``max_sleep_s``.

One connection per store, shared by threads under a lock; a broken connection
(server restart, network) is replaced on the next call, and the error of the failed
call propagates (``psycopg.OperationalError``) for the caller to retry. Fleet
ownership (:meth:`PostgresStore.ownership`) holds its locks on a connection of its own.
"""
from __future__ import annotations

import hashlib
import re
import threading
from typing import Callable, Optional, Union

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from .pg_listen import PgListener
from .store import Absent, Batch, Committed, Page, PreconditionFailed, SchemaVersionError, Store
from .redact import redact
from .watch import Watcher

__all__ = ["SCHEMA_VERSION", "PostgresStore", "lock_key"]

_TABLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,51}$")  # room for the "_apply_many" suffix
# Each version's DDL replaces the previous one's functions (see _create_schema):
# 1: the table and a one-batch ``<table>_apply`` (databases from before the version row);
# 2: the version row and ``<table>_apply_many`` over flattened batches;
# 3: ``<table>_apply_many`` takes ``consume`` (a guarded delete checks its own guard);
# 4: the change-signal trigger ``<table>_wake`` (NOTIFY_DDL).
SCHEMA_VERSION = 4
_OLD_FUNCTIONS = (
    "{table}_apply",
    "{table}_apply_many(text, bigint, int[], bytea[], bytea[], boolean[], int[], bytea[], bytea[])",
)


def lock_key(*parts: str) -> int:
    """A signed 64-bit advisory-lock key for the names ``parts`` (a blake2b hash), as
    ``pg_advisory_lock(bigint)`` takes it."""
    digest = hashlib.blake2b("\0".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


# Batch b owns guards g_end[b-1]+1 .. g_end[b] and writes w_end[b-1]+1 .. w_end[b] (1-based,
# g_end[0] = 0). consume[b] > 0 says that batch b's last guard is Equals(K, V) and that its
# write number consume[b] is K's first write, a delete: then one "DELETE ... AND value = V"
# both checks that guard and does that write (every claim and every Done of the runner has
# this shape), one statement instead of two. Being the last guard, nothing checked after it
# can fail and leave the delete to undo. Returns one element per batch: the key of its first
# failed guard (nothing of that batch written), or NULL once its writes are done.
_APPLY_MANY_FUNCTION = """
CREATE OR REPLACE FUNCTION {fn}(p text, lock_key bigint, g_end int[], gk bytea[], gv bytea[],
                                absent boolean[], w_end int[], wk bytea[], wv bytea[], consume int[])
RETURNS bytea[] LANGUAGE plpgsql AS $$
DECLARE
  b int;
  i int;
  g0 int := 0;
  w0 int := 0;
  last int;
  cur bytea;
  failed bytea;
  result bytea[] := '{{}}';
BEGIN
  PERFORM pg_advisory_xact_lock(lock_key);
  FOR b IN 1 .. coalesce(array_length(g_end, 1), 0) LOOP
    failed := NULL;
    last := CASE WHEN consume[b] > 0 THEN g_end[b] - 1 ELSE g_end[b] END;
    FOR i IN g0 + 1 .. last LOOP
      SELECT value INTO cur FROM {t} WHERE partition = p AND key = gk[i];
      IF absent[i] THEN
        IF FOUND THEN failed := gk[i]; EXIT; END IF;
      ELSIF NOT FOUND OR cur <> gv[i] THEN
        failed := gk[i]; EXIT;
      END IF;
    END LOOP;
    IF failed IS NULL AND consume[b] > 0 THEN
      DELETE FROM {t} WHERE partition = p AND key = gk[g_end[b]] AND value = gv[g_end[b]];
      IF NOT FOUND THEN failed := gk[g_end[b]]; END IF;
    END IF;
    IF failed IS NULL THEN
      FOR i IN w0 + 1 .. w_end[b] LOOP
        IF i = consume[b] THEN
          CONTINUE;
        ELSIF wv[i] IS NULL THEN
          DELETE FROM {t} WHERE partition = p AND key = wk[i];
        ELSE
          INSERT INTO {t} (partition, key, value) VALUES (p, wk[i], wv[i])
            ON CONFLICT (partition, key) DO UPDATE SET value = EXCLUDED.value;
        END IF;
      END LOOP;
    END IF;
    result := result || failed;
    g0 := g_end[b];
    w0 := w_end[b];
  END LOOP;
  RETURN result;
END
$$
"""


# The change signal: a trigger function and a row trigger, both named {wake} (the table name
# plus "_wake", also the NOTIFY channel). It runs only when the schema is created or upgraded
# (under the schema lock), so replacing the trigger there costs its brief table lock once.
# Timer rows notify only in the scheduled layout (variant byte 0x00, the 11th byte): a write
# that schedules or reschedules a timer. Deletes never make a timer due sooner, and backed-off
# rows (a claim, a retry) are known to the runner that wrote them, so the firing itself does not
# wake every runner of the table once per commit. Durable-sleep marks (keys starting "S", see
# timerwheel_c.durable.sleep) notify too: their change to "fired" is what a sleep waits for.
NOTIFY_DDL = r"""
CREATE OR REPLACE FUNCTION {wake}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify({channel}, '');
  RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS {wake} ON {t};
CREATE TRIGGER {wake} AFTER INSERT OR UPDATE ON {t} FOR EACH ROW
  WHEN ((substr(NEW.key, 1, 1) = '\x54'::bytea AND substr(NEW.key, 11, 1) = '\x00'::bytea)
        OR substr(NEW.key, 1, 1) = '\x53'::bytea)
  EXECUTE FUNCTION {wake}()
"""


def notify_ddl(table: str) -> sql.Composed:
    """:data:`NOTIFY_DDL` for ``table`` (a checked lower-case identifier), ready to execute."""
    wake = f"{table}_wake"
    return sql.SQL(NOTIFY_DDL).format(wake=sql.Identifier(wake), channel=sql.Literal(wake), t=sql.Identifier(table))


class PostgresStore(Store):
    """The store contract on PostgreSQL (>= 12) through psycopg 3.

    Args:
        dsn: a libpq connection string or ``postgresql://`` URL.
        table: the table name (lower-case identifier of at most 52 characters, default
            ``timerwheel_kv``); created if missing, with ``<table>_meta`` and ``<table>_apply_many``.
        synchronous_commit: this store's session ``synchronous_commit`` ("on", "off", "local",
            "remote_write", "remote_apply"), or None for the server's setting. "off" skips the
            WAL flush wait per commit, like SQLite's ``synchronous=NORMAL`` in WAL mode: a
            server crash may lose the last commits, each one whole, never half of one.

    Raises:
        TypeError / ValueError: a bad argument.
        SchemaVersionError: the table was created by a newer timerwheel_c.
        psycopg.Error: the server cannot be reached or the table cannot be created; its
            message never holds the DSN's password (see :func:`.url.redact`).

    The DSN is kept private: ``repr`` names user, host, port and database only.
    """

    def __init__(self, dsn: str, *, table: str = "timerwheel_kv", synchronous_commit: Optional[str] = None):
        if not isinstance(dsn, str):
            raise TypeError(f"dsn must be a str, got {type(dsn).__name__}")
        if not isinstance(table, str) or not _TABLE_NAME.match(table):
            raise ValueError(f"table must be a lower-case SQL identifier of at most 52 characters, got {table!r}")
        if synchronous_commit not in (None, "on", "off", "local", "remote_write", "remote_apply"):
            raise ValueError(f"synchronous_commit must be None or a PostgreSQL setting, got {synchronous_commit!r}")
        self._dsn = dsn
        self.synchronous_commit = synchronous_commit
        self.table = table
        self._lock = threading.Lock()
        t = sql.Identifier(table)
        self._sql_scan_from = sql.SQL(
            "SELECT key, value FROM {} WHERE partition = %s AND key >= %s AND key < %s ORDER BY key LIMIT %s").format(t)
        self._sql_scan_after = sql.SQL(
            "SELECT key, value FROM {} WHERE partition = %s AND key > %s AND key < %s ORDER BY key LIMIT %s").format(t)
        self._sql_get = sql.SQL("SELECT value FROM {} WHERE partition = %s AND key = %s").format(t)
        # A loose index scan: one index probe per partition instead of a walk over every row.
        self._sql_partitions = sql.SQL(
            "WITH RECURSIVE p AS ((SELECT partition FROM {t} ORDER BY partition LIMIT 1) UNION ALL"
            " SELECT (SELECT partition FROM {t} WHERE partition > p.partition ORDER BY partition LIMIT 1)"
            " FROM p WHERE p.partition IS NOT NULL) SELECT partition FROM p WHERE partition IS NOT NULL").format(t=t)
        fn = sql.Identifier(f"{table}_apply_many")
        self._sql_apply_many = sql.SQL(
            # %b: binary parameters, so bytea arrays travel without text escaping.
            "SELECT {}(%s, %s, %b::int[], %b::bytea[], %b::bytea[], %b::boolean[], %b::int[], %b::bytea[], %b::bytea[],"
            " %b::int[])"
        ).format(fn)
        self._conn: Optional[psycopg.Connection] = None
        with self._lock:
            self._create_schema()

    def __repr__(self):
        return f"PostgresStore({describe_dsn(self._dsn)}, table={self.table!r})"

    def _create_schema(self) -> None:
        """Create or upgrade the schema once: every opener takes the same transaction-level
        advisory lock first, so concurrent DDL (which PostgreSQL does not serialize for
        ``CREATE OR REPLACE FUNCTION``) never runs twice at once."""
        t = sql.Identifier(self.table)
        meta = sql.Identifier(f"{self.table}_meta")
        conn = self._connection()
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(self.table, "schema"),))
            conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (name text PRIMARY KEY, value text NOT NULL)").format(meta))
            row = conn.execute(sql.SQL("SELECT value FROM {} WHERE name = 'schema_version'").format(meta)).fetchone()
            found = int(row[0]) if row is not None else None
            if found == SCHEMA_VERSION:
                return
            if found is not None and found > SCHEMA_VERSION:
                raise SchemaVersionError(f"PostgreSQL table {self.table!r}", found, SCHEMA_VERSION)
            conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (partition text NOT NULL, key bytea NOT NULL,"
                " value bytea NOT NULL, PRIMARY KEY (partition, key))").format(t))
            for old in _OLD_FUNCTIONS:
                name, _, signature = old.format(table=self.table).partition("(")
                conn.execute(sql.SQL("DROP FUNCTION IF EXISTS {}" + (f"({signature}" if signature else "")).format(
                    sql.Identifier(name)))
            conn.execute(sql.SQL(_APPLY_MANY_FUNCTION).format(fn=sql.Identifier(f"{self.table}_apply_many"), t=t))
            conn.execute(notify_ddl(self.table))
            conn.execute(sql.SQL(
                "INSERT INTO {} (name, value) VALUES ('schema_version', %s)"
                " ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value").format(meta), (str(SCHEMA_VERSION),))

    def new_connection(self) -> psycopg.Connection:
        """A new autocommit connection to this store's database, for callers that hold session
        state of their own (the fleet's ownership locks); the caller closes it.

        Raises:
            psycopg.Error: the server cannot be reached (the message never holds the password).
        """
        return connect(self._dsn)

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self._dsn, self.synchronous_commit)
        return self._conn

    def _scan(self, partition: str, start: bytes, end: bytes, after: Optional[bytes], limit: int) -> Page:
        query, lower = (self._sql_scan_from, start) if after is None else (self._sql_scan_after, after)
        with self._lock:
            rows = self._connection().execute(query, (partition, lower, end, limit + 1)).fetchall()
        return Page.from_rows(rows, limit)

    def _get(self, partition: str, key: bytes) -> Optional[bytes]:
        with self._lock:
            row = self._connection().execute(self._sql_get, (partition, key)).fetchone()
        return None if row is None else bytes(row[0])

    def _apply(self, partition: str, batch: Batch) -> Union[Committed, PreconditionFailed]:
        return self._apply_in_one_transaction(partition, [batch])[0]

    def _apply_many(self, partition: str, batches: list) -> list:
        return self._apply_in_one_transaction(partition, batches)

    def _apply_in_one_transaction(self, partition: str, batches: list) -> list:
        wk: list  # (mypy infers no element type for it from the unpacking below)
        g_end, gk, gv, absent, w_end, wk, wv, consume = [], [], [], [], [], [], [], []
        for batch in batches:
            for g in batch.guards:
                gk.append(g.key)
                is_absent = isinstance(g, Absent)
                gv.append(None if is_absent else g.value)
                absent.append(is_absent)
            consumed = 0
            if batch.guards and not absent[-1]:
                last_key = gk[-1]
                for i, (k, v) in enumerate(batch.writes):
                    if k == last_key:
                        consumed = len(wk) + i + 1 if v is None else 0
                        break
            for k, v in batch.writes:
                wk.append(k)
                wv.append(v)
            g_end.append(len(gk))
            w_end.append(len(wk))
            consume.append(consumed)
        args = (partition, lock_key(self.table, partition), g_end, gk, gv, absent, w_end, wk, wv, consume)
        with self._lock:
            (failed,) = self._connection().execute(self._sql_apply_many, args).fetchall()[0]
        return [Committed() if f is None else PreconditionFailed(bytes(f)) for f in failed]

    def watch(self, callback: Callable[[], None]) -> Watcher:
        """The change signal (see :meth:`Store.watch`): a :class:`PgListener` on the channel
        ``<table>_wake``, on a connection of its own that reconnects after any loss."""
        return PgListener(lambda: connect(self._dsn), f"{self.table}_wake", callback)

    def _partitions(self) -> list:
        with self._lock:
            return [r[0] for r in self._connection().execute(self._sql_partitions).fetchall()]

    def ownership(self, partitions: Optional[list] = None, **kwargs):
        """A :class:`~timerwheel_c.durable.ownership.PartitionOwnership` dividing ``partitions``
        (None: every partition of this store) among the runners asking for the same ones;
        ``kwargs`` (``check_interval_s``) go to its constructor."""
        from ..service.ownership import PartitionOwnership

        return PartitionOwnership(self, partitions, **kwargs)

    def drop(self) -> None:
        """Drop this store's table, meta table and function (for tests and benchmarks); the store
        is unusable afterwards."""
        with self._lock:
            conn = self._connection()
            conn.execute(sql.SQL("DROP FUNCTION IF EXISTS {}").format(sql.Identifier(f"{self.table}_apply_many")))
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(f"{self.table}_meta")))
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(self.table)))
            conn.execute(sql.SQL("DROP FUNCTION IF EXISTS {}").format(sql.Identifier(f"{self.table}_wake")))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()


def connect(dsn: str, synchronous_commit: Optional[str] = None) -> psycopg.Connection:
    """An autocommit psycopg connection to ``dsn``, with the session's ``synchronous_commit``
    set unless it is None.

    Raises:
        psycopg.Error: the server cannot be reached; the message never holds the password.
    """
    try:
        conn = psycopg.connect(dsn, autocommit=True)
    except psycopg.Error as exc:
        message = str(exc)
        if redact(message, dsn) == message:
            raise
        # libpq quotes a malformed connection string back: re-raise without the password.
        raise type(exc)(redact(message, dsn)) from None
    if synchronous_commit is not None:
        conn.execute(sql.SQL("SET synchronous_commit = {}").format(sql.Literal(synchronous_commit)))
    return conn


def describe_dsn(dsn: str) -> str:
    """``user@host:port/dbname`` of a libpq DSN or URL, for reprs and logs: never the password
    (or any other parameter); ``'?'`` for a DSN that does not parse."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error:
        return "'?'"
    user = params.get("user")
    where = f"{params.get('host') or 'localhost'}:{params.get('port') or 5432}/{params.get('dbname') or ''}"
    return repr(f"{user}@{where}" if user else where)

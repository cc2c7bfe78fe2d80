"""PostgresStore: the durable-timer store contract on PostgreSQL, with psycopg 3.

One table, ``(partition text, key bytea, value bytea, PRIMARY KEY (partition, key))``;
PostgreSQL orders bytea by memcmp, then length, which is Python's bytes order, so the
primary-key index serves the scans.

``apply`` and ``apply_many`` are one round trip each: a call of a PL/pgSQL function
created with the table that takes the batches flattened into arrays and runs in the
call's own transaction, so a list of batches costs one commit (one WAL flush with
``synchronous_commit`` on). It first takes ``pg_advisory_xact_lock`` on the partition's shard
(a 64-bit hash of the table name and the shard, :mod:`.shards`), then judges the guards and
writes. The lock serializes guarded commits on a shard's partitions across every connection,
the way SQLite's ``BEGIN IMMEDIATE`` does, so an ``Absent`` guard cannot be defeated by a
concurrent insert (row locks cannot lock a row that does not exist). It is per shard, not per
partition, so that a transaction never holds more of the server's lock table than the shard
count, however many partitions it writes: a claim over 20,000 partitions once took 20,000 locks
and ran the server out of shared memory. Guarded commits on two partitions of one shard thus
wait for each other; a fleet gives each shard one runner, so only writers meet there. Batches of which no two touch the same
key (the runner's claims and outcomes) go to ``<table>_write_sets`` when there are at least
:data:`SETS_FROM` of them: it judges every guard and does every write of the list in a few
set-based statements (one per kind of step instead of a statement per row), each batch still
failing alone on its own guards; a row the store read or wrote last is fetched where it was seen
(its ctid, :class:`_Places`), not looked up by key. Other lists, and every single batch (a by-name ``schedule`` or
``cancel``), go to ``<table>_apply_many``, which applies them batch by batch in order.
A large batch that only puts new keys, guarded by ``Absent`` on them (a chunk of ``schedule_many``),
goes in with one ``COPY`` instead (:mod:`.copy`), the primary key judging its guards.

The schema (table, functions, and the ``<table>_meta`` row holding the schema version)
is created or upgraded once, inside a transaction holding an advisory lock, so any
number of processes can open the store at the same moment: the numbered migrations in
``postgres/sql/`` above the recorded version run in order. A schema written by a newer
version raises :class:`~timerwheel_c.durable.storage.store.SchemaVersionError`.

The change signal (:meth:`PostgresStore.watch`): a row trigger (``<table>_wake``, in
``postgres/sql/queries.sql``) calls ``pg_notify('<table>_wake', '')`` in the writing
transaction for every insert or update of a key matching the patterns the timer layer
declared (:meth:`~timerwheel_c.durable.storage.store.Store.signal_writes`: scheduled timer
rows and durable-sleep marks, not the backed-off rows a claim writes), and for every one
until some process has declared them. The store never reads the keys itself: the
patterns are data, kept in the meta table, and the trigger is rebuilt only when they
change. One :class:`~timerwheel_c.durable.storage.postgres.listen.PgListener` per store and
process receives the notifications for every waiter. A second runner serving the same
partition in parallel (not a fleet, which gives each partition one owner) finds a row that
another runner claimed and abandoned on its next pass, within its ``max_sleep_s``.

Rows come back in PostgreSQL's binary format (psycopg's ``binary=True``): a bytea arrives as its
bytes, never as hex text to decode, which more than halves the client's CPU time per row read.

Every psycopg error is raised as a :class:`~.errors.StoreError`, transient or permanent
by its SQLSTATE class. One connection per store, shared by threads under a lock; a
broken connection (server restart, network) is replaced on the next call, and the failed
call raises :class:`~.errors.TransientStoreError` for the caller to retry (a write lost with its
commit on the way may have committed: see :mod:`~timerwheel_c.durable.storage.errors`). Fleet
ownership (:meth:`~timerwheel_c.durable.storage.store.Store.ownership`: :mod:`.ownership`)
holds its locks on a connection of :meth:`PostgresStore.new_connection`. asyncio code
writes on a pool of connections per event loop (:meth:`PostgresStore.async_pools`, :mod:`.pool`).
"""
from __future__ import annotations

import copy
import functools
import hashlib
import logging
import re
import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar, Union

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from .. import forks
from ..errors import PermanentStoreError, StoreError, TransientStoreError, wrap_exceptions
from .arrays import ByteaArray, Int4Array, Int8Array, TextArray, TidArray, register as register_arrays
from .cancels import keeping_cancels
from .copy import copy_new_rows, copyable
from .listen import PgListener
from .joined import AsyncPgJoined, AsyncPgStatements, PgJoined
from .ownership import PartitionOwnership, live_runners
from .results import RESHARD_RETRIES, apply_results, resharded_meanwhile, session_is_stale, store_error
from .session import SESSION_SETUP, open_session
from .pooler import refuse_shared_sessions
from ..redact import remember
from ..shards import DEFAULT_SHARD_COUNT, check_shard_count, shard_of
from ..sqlfiles import migrations, queries, rewrite_versions
from ..upgrades import rewritten_rows
from ..store import (COMMITTED, SHARD_SPACE, Absent, Batch, Committed, Equals, Page, PreconditionFailed, RowConsume, RowMove,
                    SchemaError, SchemaVersionError, Store, check_lock_wait_ms, check_readable_version, consumed_index,
                    consumed_write, schema_version_of, through)
from ..watch import Watcher

if TYPE_CHECKING:
    from .pool import AsyncPools

__all__ = ["DEFAULT_LOCK_WAIT_MS", "SCHEMA_VERSION", "SETS_FROM", "PostgresStore", "lock_key", "set_synchronous_commit"]

#: How long a store's own call waits for a lock by default, ms (see PostgresStore's ``lock_wait_ms``).
DEFAULT_LOCK_WAIT_MS = 5_000

log = logging.getLogger("timerwheel_c.durable")
T = TypeVar("T")

# The fewest batches that go to ``<table>_write_sets`` (measured on ``<table>_apply_sets``, its predecessor). The set-based statement has a fixed cost
# the batch-by-batch loop has not (about 300 us of server CPU for one batch against 150 us, on
# PostgreSQL 15 and a small table) and a lower cost per batch (15-40 us against 25-70 us), and the
# two meet at about 8 batches; bench/durable_named.py's re-arms by name are single batches.
SETS_FROM = 8

_TABLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,51}$")  # room for the "_apply_many" suffix
# The versions (postgres/sql/NNNN_*.sql bring a database to version NNNN):
# 1: the table and a one-batch ``<table>_apply`` (databases from before the version row);
# 2: the version row and ``<table>_apply_many`` over flattened batches;
# 3: ``<table>_apply_many`` takes ``consume`` (a guarded delete checks its own guard);
# 4: the change-signal trigger ``<table>_wake`` (NOTIFY_DDL);
# 5: ``<table>_apply_one``, and ``<table>_apply_many`` reports a refused batch alone;
# 6: the rows the layers above derive from the stored ones (storage/upgrades.py);
# 7: ``<table>_apply_sets``: independent batches of any partitions, set-based in one statement;
# 8: the generated ``shard`` column and its index ``<table>_shard`` (storage/shards.py);
# 9: the rows the layers above rewrite (storage/upgrades.py);
# 10: the view ``<table>_timers`` of the pending timers in typed columns, for operators' SQL;
# 11: a batch that consumes a row and puts its value under a free key moves the row (one UPDATE);
# 12: no table changes: a first claim leaves the identity row (a version no earlier process reads);
# 13: ``<table>_apply_sets`` takes each partition beside its row and each move's key beside its batch.
# 15: a write runs only at the shard count its lock keys are of (``<table>_lock_shards``, through
# ``<table>_apply_many_at`` and ``<table>_apply_sets_at``), read once its locks are held;
# 16: the index by shard keeps only the rows passes read by shard (``SHARD_SPACE``);
# 17: ``<table>_write_sets`` (through ``<table>_write_sets_at``) in place of ``<table>_apply_sets``: a
# consumed row is fetched at the place the store last read or wrote it (:class:`_Places`).
_MIGRATIONS = migrations("postgres")
_ROW_REWRITES = rewrite_versions(_MIGRATIONS)  # versions that must find their declared rewrite
SCHEMA_VERSION = _MIGRATIONS[-1][0]
_SHARDS_VERSION = 8  # the migration that adds the shard column (reshard runs it again)
_TIMERS_VIEW_VERSION = 10  # the migration that makes the timers' view, which reads the shard column
_SHARD_INDEX_VERSION = 16  # the migration that narrows the index by shard (reshard runs it after version 8)
_QUERIES = queries("postgres")
def lock_key(*parts: str) -> int:
    """A signed 64-bit advisory-lock key for the names ``parts`` (a blake2b hash), as
    ``pg_advisory_lock(bigint)`` takes it."""
    digest = hashlib.blake2b("\0".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def shard_locks(table: str, shard_count: int) -> list:
    """The transaction-level advisory lock key of each shard of ``table``, by shard number."""
    return [lock_key(table, "shard", str(n)) for n in range(shard_count)]


class _Shards:
    """The shard count of a store's table and the advisory lock key of each shard, as one pair:
    shared by a store and its siblings (:meth:`PostgresStore.open_sibling`), so that a count one of
    them reads (:meth:`PostgresStore.adopt_shard_count`) is the one all of them lock and read by."""

    __slots__ = ("table", "state")

    def __init__(self, table: str, shard_count: int):
        self.table = table
        self.state = (shard_count, shard_locks(table, shard_count))

    def set(self, shard_count: int) -> None:
        if shard_count != self.state[0]:  # one tuple: a reader in another thread sees both or neither
            self.state = (shard_count, shard_locks(self.table, shard_count))


class _Places:
    """Where this store (and its siblings, which share this object) last read or wrote rows: the ctid
    of each (tidsend's 6 bytes), per partition and key, noted by :meth:`PostgresStore.scan_many` and by
    the moves of ``<table>_write_sets``, and taken by the next write that consumes the row there, which
    then fetches it at that place (a TID scan) instead of descending the primary key for it. Only a
    hint: the write checks that the row found there is still the guarded one, and reads by key when it
    is not (another writer moved the row, a reshard or VACUUM FULL rewrote the table). Rows read and
    never consumed are forgotten all at once after :data:`LIMIT` places."""

    __slots__ = ("by_partition", "count")

    #: The places noted before all are forgotten and noting starts over.
    LIMIT = 1 << 16

    def __init__(self) -> None:
        self.by_partition: dict = {}  # partition -> {key: place}
        self.count = 0  # places noted since the last forgetting (taken ones included)

    def note(self, partition: str, keys: list, places: list) -> None:
        """The rows of ``partition`` at ``keys`` are at ``places`` (aligned lists)."""
        self._room(len(keys))
        self._of(partition).update(zip(keys, places))

    def note_moved(self, bp: list, mt: list, moved: list, places: list) -> None:
        """Batch ``moved[i]`` (1-based, of ``bp`` and ``mt``, as ``<table>_write_sets`` numbers them)
        moved its row to ``mt[b - 1]`` of partition ``bp[b - 1]``, now at ``places[i]``."""
        self._room(len(moved))
        of = self._of
        for b, place in zip(moved, places):
            of(bp[b - 1])[mt[b - 1]] = place

    def _room(self, more: int) -> None:
        """Count ``more`` places to note; past :data:`LIMIT`, forget every place noted so far."""
        self.count += more
        if self.count > self.LIMIT:
            self.by_partition.clear()
            self.count = more

    def _of(self, partition: str) -> dict:
        known = self.by_partition.get(partition)
        if known is None:
            known = self.by_partition[partition] = {}
        return known

    def take(self, partition: str, key: bytes) -> Optional[bytes]:
        """The place noted for ``key`` of ``partition``, forgotten here (None: none noted)."""
        known = self.by_partition.get(partition)
        return None if known is None else known.pop(key, None)


def when_clause(patterns: Optional[list]) -> sql.Composable:
    """The trigger's WHEN condition for the :class:`KeyPattern` list ``patterns`` (None: every write).

    Evaluated for every row a write inserts or updates (twice per fired timer), so it is spelled for
    the server's cheapest work: a prefix as a range of keys (two comparisons of the key as it is, where
    ``substr`` copied a slice of it per pattern), and the patterns of one prefix and position as one
    ``get_byte ... IN (...)``, behind a ``CASE`` on the key's length (``get_byte`` raises past the end,
    and a CASE is evaluated in its order, where an AND may not be)."""
    if patterns is None:
        return sql.SQL("true")
    if not patterns:
        return sql.SQL("false")
    groups: dict = {}  # (prefix, at) -> the bytes any of which the key holds at ``at``
    for p in patterns:
        groups.setdefault((p.prefix, p.at), []).append(p.byte)
    alternatives = []
    for (prefix, at), values in groups.items():
        parts: list = []
        if prefix:
            parts.append(sql.SQL("NEW.key >= {}").format(sql.Literal(prefix)))
            after = prefix_end(prefix)
            if after is not None:
                parts.append(sql.SQL("NEW.key < {}").format(sql.Literal(after)))
        if at is not None:
            parts.append(sql.SQL("CASE WHEN octet_length(NEW.key) > {} THEN get_byte(NEW.key, {}) IN ({}) ELSE false END").format(
                sql.Literal(at), sql.Literal(at), sql.SQL(", ").join(sql.Literal(v) for v in sorted(set(values)))))
        alternatives.append(sql.SQL("({})").format(sql.SQL(" AND ").join(parts or [sql.SQL("true")])))
    return sql.SQL(" OR ").join(alternatives)


def prefix_end(prefix: bytes) -> Optional[bytes]:
    """The least key above every key that starts with ``prefix`` (bytea orders as Python's bytes): its
    last byte below 0xff incremented, what follows it dropped; None when every byte is 0xff."""
    stripped = prefix.rstrip(b"\xff")
    return stripped[:-1] + bytes([stripped[-1] + 1]) if stripped else None


def patterns_text(patterns: list) -> str:
    """A canonical text of ``patterns``, kept in the meta table to compare declarations."""
    return ";".join(p.prefix.hex() + ("" if p.at is None else f"@{p.at}={p.byte:02x}") for p in patterns)


class PostgresStore(Store):
    """The store contract on PostgreSQL (>= 12) through psycopg 3.

    Args:
        dsn: a libpq connection string or ``postgresql://`` URL.
        table: the table name (lower-case identifier of at most 52 characters, default
            ``timerwheel_kv``); created if missing, with its index ``<table>_shard``, ``<table>_meta``,
            the view ``<table>_timers``, the functions ``<table>_apply_one``, ``<table>_apply_many``,
            ``<table>_apply_many_at``, ``<table>_apply_sets``, ``<table>_apply_sets_at``, ``<table>_write_sets``,
            ``<table>_write_sets_at`` and ``<table>_lock_shards``, and the trigger ``<table>_wake`` with
            its function.
        synchronous_commit: this store's session ``synchronous_commit`` ("on", "off", "local",
            "remote_write", "remote_apply"), or None for the server's setting. "off" skips the
            WAL flush wait per commit, like SQLite's ``synchronous=NORMAL`` in WAL mode: a
            server crash may lose the last commits, each one whole, never half of one.
        lock_wait_ms: how long one of this store's own calls waits for a lock (its session's
            ``lock_timeout``, ms, at most INT_MAX, the server's limit; None: for ever),
            :data:`DEFAULT_LOCK_WAIT_MS` (5 s, SQLiteStore's busy timeout) by default; past it the call
            raises TransientStoreError (SQLSTATE 55P03). A write waits for its partition's lock, which a
            caller's open transaction holds after a write joined to it (``conn=``): without a bound, a
            write of the same partition on the store, in the same request, waited for ever, and every
            call of the store (which has one connection) behind it. The schema's creation or upgrade waits as long as it takes.
        read_only: for the commands that only read: no DDL runs (the schema is neither created
            nor upgraded) and the session is ``default_transaction_read_only``, so a role with
            SELECT alone on the table and ``<table>_meta`` can open it; a write fails (SQLSTATE
            25006).
        create: False for a command that writes rows but must not create a store: no DDL runs, as
            with ``read_only``, but the session may write.
        shard_count: the number of shards (1..4096, see :mod:`.shards`) of a store this open creates,
            or upgrades from before shards; a store that has them keeps its own (:attr:`shard_count`).

    Raises:
        TypeError / ValueError: a bad argument.
        TransientStoreError: the server cannot be reached now; PermanentStoreError: it refuses
            this DSN, the table cannot be created, or the DSN leads to a connection pooler in
            transaction or statement mode (:mod:`.pooler`). The message never holds the DSN's password.
        SchemaError / SchemaVersionError: the meta table holds an unusable or newer schema version
            (with ``read_only``, an older one too: a read-only open does not upgrade it); or, unless
            ``read_only``, the database's ``server_encoding`` is neither UTF8 nor SQL_ASCII.
        NoStoreError: with ``read_only`` or ``create=False``, the database has no such table ("no
            timerwheel_c store here").

    The DSN is kept private: ``repr`` names user, host, port and database only.
    """

    reads_many_at_once = True
    ownership_type = PartitionOwnership
    _shards: _Shards

    @property
    def shard_count(self) -> int:
        """The number of shards: the one recorded in the store when this object (or a sibling) last
        read it (see :meth:`adopt_shard_count`)."""
        return self._shards.state[0]

    @shard_count.setter
    def shard_count(self, shard_count: int) -> None:
        shards = self.__dict__.get("_shards")
        if shards is None:
            self.__dict__["_shards"] = _Shards(self.table, shard_count)
        else:
            shards.set(shard_count)

    def __init__(self, dsn: str, *, table: str = "timerwheel_kv", synchronous_commit: Optional[str] = None,
                 read_only: bool = False, create: bool = True, shard_count: int = DEFAULT_SHARD_COUNT,
                 lock_wait_ms: Optional[int] = DEFAULT_LOCK_WAIT_MS):
        check_shard_count(shard_count)
        lock_wait_ms = check_lock_wait_ms(lock_wait_ms)
        if not isinstance(dsn, str):
            raise TypeError(f"dsn must be a str, got {type(dsn).__name__}")
        if not isinstance(table, str) or not _TABLE_NAME.match(table):
            raise ValueError(f"table must be a lower-case SQL identifier of at most 52 characters, got {table!r}")
        if synchronous_commit not in (None, "on", "off", "local", "remote_write", "remote_apply"):
            raise ValueError(f"synchronous_commit must be None or a PostgreSQL setting, got {synchronous_commit!r}")
        self._dsn = dsn
        remember(dsn)  # its password is masked wherever this process prints it, a handler's error included
        self.synchronous_commit = synchronous_commit
        self.table = table
        self.read_only = bool(read_only)
        self.shard_count = shard_count
        self._lock = threading.Lock()
        # The StoreError of a psycopg error, its password masked: not a bound method, which the store's
        # own attributes would refer back to itself through (a store freed only by the cyclic
        # collector, and a program that dropped one per request held their connections until then).
        self._error: Callable[[psycopg.Error], StoreError] = functools.partial(store_error, dsn=dsn)
        self._wrap = _Wrap(self._error, weakref.ref(self))
        self._names = {
            "t": sql.Identifier(table), "meta": sql.Identifier(f"{table}_meta"),
            "apply_many": sql.Identifier(f"{table}_apply_many"), "apply_one": sql.Identifier(f"{table}_apply_one"),
            "apply_sets": sql.Identifier(f"{table}_apply_sets"), "shard_index": sql.Identifier(f"{table}_shard"),
            "lock_shards": sql.Identifier(f"{table}_lock_shards"), "apply_many_at": sql.Identifier(f"{table}_apply_many_at"),
            "apply_sets_at": sql.Identifier(f"{table}_apply_sets_at"),
            "write_sets": sql.Identifier(f"{table}_write_sets"), "write_sets_at": sql.Identifier(f"{table}_write_sets_at"),
            "timers_view": sql.Identifier(f"{table}_timers"),
            "old_apply": sql.Identifier(f"{table}_apply"), "wake": sql.Identifier(f"{table}_wake"),
            "channel": sql.Literal(f"{table}_wake"), "default_shard_count": sql.Literal(str(DEFAULT_SHARD_COUNT)),
        }
        self._sql = {name: sql.SQL(text).format(**self._names) for name, text in _QUERIES.items() if name != "wake_trigger"}
        self._signalled: Optional[str] = None  # the patterns this store has seen in force
        self._places = _Places()  # shared with its siblings (open_sibling copies the reference)
        self._lock_wait_ms: Optional[int] = None  # the session's lock_timeout (open_sibling), None: none
        self._conn: Optional[psycopg.Connection] = None
        self._closed = False  # close() ends the store: a later call raises instead of opening a session
        # Before any SET that a pooler would pass on; the check's own session, if it made one, becomes the
        # store's, set up as any of its sessions.
        checked = refuse_shared_sessions(dsn, describe_dsn(dsn))
        try:
            with self._lock, self._wrap:
                if checked is not None:
                    self._conn = self._set_up(checked)
                    checked = None
                if not self.read_only:
                    self._check_encoding()
                if self.read_only or not create:
                    self._check_schema()
                else:
                    self._create_schema()
        except BaseException:
            for session in (checked, self._conn):  # a store that failed to open holds no session
                if session is not None:
                    session.close()
            raise
        forks.track(self)
        # After the schema step, whose DDL may wait its turn: from here the waits are a write's.
        self._lock_wait_ms = lock_wait_ms
        if lock_wait_ms is not None and self._conn is not None and not self._conn.closed:
            with self._wrap:
                self._conn.execute(_set_lock_timeout(lock_wait_ms))

    def __del__(self):
        # A store dropped without close() ends its session at once: psycopg before 3.3 keeps a
        # connection that has sent a list parameter in a reference cycle, which only the cyclic
        # collector frees (a store per request piled up sessions). Nothing may raise from here, nor
        # look up a module global: at interpreter exit they may be None already (contextlib was).
        conn = self.__dict__.get("_conn")
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    def _after_fork(self) -> None:
        """In a forked child: forget the parent's connections (:mod:`..forks`); the next call opens
        this process's own. The lock is new: a parent's thread may have held it at the fork."""
        self._lock = threading.Lock()
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            forks.silence(conn.fileno())
        pools = self.__dict__.pop("_async_pools", None)
        if pools is not None:
            forks.keep(pools)

    def __repr__(self):
        return f"PostgresStore({describe_dsn(self._dsn)}, table={self.table!r})"

    def _check_encoding(self) -> None:
        """Refuse a database whose text is neither UTF-8 nor raw bytes (``SQL_ASCII``): there the
        server's ``md5(partition)``, which files each row under its shard, hashes another encoding
        than the UTF-8 that runners and writers hash (storage/shards.py), so a non-ASCII partition's
        timers would sit in a shard no runner scans for them, and never fire."""
        encoding = self._connection().info.parameter_status("server_encoding")
        if encoding is not None and encoding not in ("UTF8", "SQL_ASCII"):
            raise SchemaError(
                f"PostgreSQL database of {describe_dsn(self._dsn)} has server_encoding {encoding}: "
                "timerwheel_c needs a UTF8 database, since the server hashes partition names to their shards "
                "(CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0)")

    def _stored_version(self, conn: psycopg.Connection) -> Optional[int]:
        """The recorded schema version, 0 for a table from before versions, None for no table;
        ``to_regclass`` looks the tables up on the search path without needing a privilege on them."""
        has_table, has_meta = conn.execute("SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
                                           (self.table, f"{self.table}_meta")).fetchall()[0]
        if not has_table:
            return None
        row = conn.execute(self._sql["schema_version"]).fetchone() if has_meta else None
        return 0 if row is None else schema_version_of(f"PostgreSQL table {self.table!r}", row[0])

    def _check_schema(self) -> None:
        """Read the schema version for a read-only open (see :func:`check_readable_version`)."""
        conn = self._connection()
        check_readable_version(f"PostgreSQL table {self.table!r}", self._stored_version(conn), SCHEMA_VERSION)
        self.shard_count = self._recorded_shard_count(conn)

    def _create_schema(self) -> None:
        """Create or upgrade the schema once: every opener takes the same transaction-level
        advisory lock first, so concurrent DDL (which PostgreSQL does not serialize for
        ``CREATE OR REPLACE FUNCTION``) never runs twice at once; then the migrations numbered
        above the recorded version run in that one transaction. A store already at this version is
        only read, with no DDL: an application role with no CREATE privilege opens a store its
        owner made."""
        conn = self._connection()
        if self._stored_version(conn) == SCHEMA_VERSION:
            self.shard_count = self._recorded_shard_count(conn)
            return
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(self.table, "schema"),))
            conn.execute(self._sql["create_meta"])
            row = conn.execute(self._sql["schema_version"]).fetchone()
            where = f"PostgreSQL table {self.table!r}"
            found = 0 if row is None else schema_version_of(where, row[0])
            if found > SCHEMA_VERSION:
                raise SchemaVersionError(where, found, SCHEMA_VERSION)
            if found != SCHEMA_VERSION:
                conn.execute(self._sql["set_shard_count"], (str(self.shard_count),))
            self.shard_count = self._recorded_shard_count(conn)
            if found == SCHEMA_VERSION:
                return
            for version, text in _MIGRATIONS:
                if version > found:
                    conn.execute(sql.SQL(text).format(**self._names, shard_count=sql.Literal(self.shard_count)))
            deletes, puts = rewritten_rows(found, conn.execute(self._sql["all_rows"]).fetchall(), _ROW_REWRITES,
                                           target=SCHEMA_VERSION)
            with conn.cursor() as cur:
                if deletes:
                    cur.executemany(self._sql["delete_row"], deletes)
                if puts:
                    cur.executemany(self._sql["put_row"], puts)
            self._create_wake_trigger(conn, None)
            conn.execute(self._sql["set_schema_version"], (str(SCHEMA_VERSION),))

    def _reshard(self, shard_count: int) -> None:
        """The generated column is rebuilt with the new count (version 8's statements), which rewrites
        the table and its shard index, under the schema lock, the index then narrowed to the rows read
        by shard again (version 16's statements); the timers' view, which reads the column,
        is dropped first and made again (version 10's statements), with the privileges granted on it.
        Refused while fleet runners hold the store's locks: each owns and reads shards by the count it
        opened with, and would leave the rows of the shards it does not know unread until it restarts."""
        shards_sql, index_sql, view_sql = (next(text for version, text in _MIGRATIONS if version == wanted)
                                           for wanted in (_SHARDS_VERSION, _SHARD_INDEX_VERSION, _TIMERS_VIEW_VERSION))
        with self._lock, self._wrap:
            conn = self._connection()
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(self.table, "schema"),))
                live = live_runners(conn, self.table)
                if live:
                    raise RuntimeError(f"{live} fleet runner(s) of table {self.table!r} are running: stop them before "
                                       f"changing its shard count (each owns and reads shards by number); nothing changed")
                view = sql.Identifier(f"{self.table}_timers")
                grants = conn.execute(self._sql["view_grants"], (view.as_string(conn),)).fetchall()
                conn.execute(self._sql["drop_timers_view"])
                conn.execute(self._sql["drop_shard_column"])
                conn.execute(sql.SQL(shards_sql).format(**self._names, shard_count=sql.Literal(shard_count)))
                conn.execute(sql.SQL(index_sql).format(**self._names))
                conn.execute(sql.SQL(view_sql).format(**self._names))
                for role, privilege, grantable in grants:
                    conn.execute(sql.SQL("GRANT {} ON {} TO {}{}").format(
                        sql.SQL(privilege), view, sql.SQL("PUBLIC") if role is None else sql.Identifier(role),
                        sql.SQL(" WITH GRANT OPTION" if grantable else "")))
                conn.execute(self._sql["change_shard_count"], (str(shard_count),))

    def adopt_shard_count(self, conn: Optional[psycopg.Connection] = None) -> int:
        """The shard count recorded now, read on ``conn`` (a runner's ownership connection; None: this
        store's own) and kept as :attr:`shard_count` by this store and its siblings: another process's
        :meth:`reshard` changes it, and a runner that opened the store while a reshard was under way
        read the count from before it, by which it would own and read shards, leaving the rows of the
        others unread until it restarted.

        Raises:
            SchemaError: the recorded count is not a shard count.
            StoreError: the server failed (with ``conn``: psycopg's own error, for its owner to wrap).
        """
        if conn is None:
            with self._lock, self._wrap:
                self.shard_count = self._recorded_shard_count(self._connection())
        else:
            self.shard_count = self._recorded_shard_count(conn)
        return self.shard_count

    def refresh_shard_count(self) -> int:
        return self.adopt_shard_count()

    def joined_miss(self, recorded: Optional[tuple]) -> None:
        """After a write in a caller's transaction ran at no shard count (no row: this store's count is
        not the one that transaction reads): ``recorded``, the row of the ``shard_count`` statement on
        the caller's connection, is adopted when it is the count recorded now (read on this store's
        own connection), so that the write runs again by it. Otherwise the transaction's snapshot
        (SERIALIZABLE) predates a reshard, and no write in it can lock as the others do.

        Raises:
            TransientStoreError: the caller's transaction reads the count from before a reshard: roll it
                back and run it again.
            StoreError: the store's own read failed.
        """
        if self.shard_count_of(recorded) != self.adopt_shard_count():
            raise TransientStoreError(f"PostgreSQL table {self.table!r} was resharded after the caller's transaction "
                                      "took its snapshot: roll it back and run it again")

    def _recorded_shard_count(self, conn: psycopg.Connection) -> int:
        """The shard count recorded in the meta table (the default for a store from before shards,
        which a read-only open does not upgrade).

        Raises:
            SchemaError: the recorded count is not a shard count, naming it.
        """
        return self.shard_count_of(conn.execute(self._sql["shard_count"]).fetchone())

    def shard_count_of(self, row: Optional[tuple]) -> int:
        """The shard count the row of the ``shard_count`` statement records (None: no row, a store from
        before shards, which has the default).

        Raises:
            SchemaError: the recorded count is not a shard count, naming it.
        """
        if row is None:
            return DEFAULT_SHARD_COUNT
        try:
            return check_shard_count(int(row[0]))
        except ValueError:
            raise SchemaError(f"PostgreSQL table {self.table!r} records shard_count {row[0]!r}, which is not a "
                              "shard count: the meta table was edited or not made by timerwheel_c") from None

    def _create_wake_trigger(self, conn: psycopg.Connection, patterns: Optional[list]) -> None:
        conn.execute(sql.SQL(_QUERIES["wake_trigger"]).format(when=when_clause(patterns), **self._names))
        if patterns is None:
            conn.execute(self._sql["forget_signal_patterns"])
        else:
            conn.execute(self._sql["set_signal_patterns"], (patterns_text(patterns),))

    def _signal_writes(self, patterns: list) -> None:
        """Rebuild the trigger's WHEN condition from ``patterns``, once per database: the patterns in
        force are kept in the meta table, so a store that finds them there (one read, once per
        store object) changes nothing, and a second runner never rebuilds the trigger again."""
        text = patterns_text(patterns)
        if self._signalled == text:
            return
        with self._lock, self._wrap:
            conn = self._connection()
            row = conn.execute(self._sql["signal_patterns"]).fetchone()
            if row is None or row[0] != text:
                try:
                    with conn.transaction():
                        conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(self.table, "schema"),))
                        row = conn.execute(self._sql["signal_patterns"]).fetchone()
                        if row is None or row[0] != text:
                            self._create_wake_trigger(conn, patterns)
                except psycopg.errors.InsufficientPrivilege:
                    # A role that may write rows but not own the table: the trigger keeps signalling
                    # every write, which wakes the runners as promptly, only more often.
                    log.warning("%r: this role cannot narrow the wake trigger to the timer rows (it does not own "
                                "table %r); it keeps signalling every write. Schedule a timer or start a runner once "
                                "as its owner to narrow it (opening the store does not, nor a write through conn= "
                                "or timerwheel_c.durable.aio).", self, self.table)
        self._signalled = text

    def new_connection(self) -> psycopg.Connection:
        """A new autocommit connection to this store's database, for callers that hold session
        state of their own (the fleet's ownership locks); the caller closes it.

        Raises:
            StoreError: the server cannot be reached (the message never holds the password).
        """
        return connect(self._dsn)  # the caller's, closed by the caller: a closed store may still give one

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._refuse_if_closed()
            self._conn = self._set_up(open_session(self._dsn))
        return self._conn

    def _set_up(self, session: psycopg.Connection) -> psycopg.Connection:
        """``session`` (as :func:`.session.open_session` opens one) set up as this store's connection."""
        conn = register_arrays(connect(self._dsn, self.synchronous_commit, self._lock_wait_ms, session))
        if self.read_only:  # a write of this store fails, whatever path it takes
            conn.execute("SET default_transaction_read_only = on")
        return conn

    def _scan(self, partition: str, start: bytes, end: bytes, after: Optional[bytes], limit: int) -> Page:
        query, lower = (self._sql["scan_from"], start) if after is None else (self._sql["scan_after"], after)
        with self._lock, self._wrap:
            rows = self._connection().execute(query, (partition, lower, end, limit + 1), binary=True).fetchall()
        return Page.from_rows(rows, limit)

    def _get(self, partition: str, key: bytes) -> Optional[bytes]:
        with self._lock, self._wrap:
            row = self._connection().execute(self._sql["get"], (partition, key), binary=True).fetchone()
        return None if row is None else bytes(row[0])

    def _get_through(self, partition: str, key: bytes) -> tuple:
        with self._lock, self._wrap:
            row = self._connection().execute(self._sql["get_through"], (partition, key), binary=True).fetchone()
        return through(row)

    def _apply(self, partition: str, batch: Batch) -> Union[Committed, PreconditionFailed]:
        if copyable(batch):
            def copy_rows() -> Optional[bool]:
                shard_count, lock = self.shard_lock_of(partition)
                with self._lock, self._wrap:
                    return copy_new_rows(self._connection(), self._sql["lock_shard"], (lock, str(shard_count)),
                                         self._sql["copy_rows"], partition, batch.writes)
            if self.at_recorded_count(copy_rows):
                return COMMITTED
        return self._apply_in_one_transaction(partition, [batch], protect=False)[0]

    def _apply_many(self, partition: str, batches: list) -> list:
        try:
            sets = _independent_sets([(partition, b) for b in batches], self._places) if len(batches) >= SETS_FROM else None
            if sets is not None:
                return self._apply_sets(sets)
            return self._apply_in_one_transaction(partition, batches, protect=False)
        except PermanentStoreError:
            # Nothing was written. Again, each batch in a subtransaction of its own: the server's
            # refusal is then scoped to the batch that caused it.
            return self._apply_in_one_transaction(partition, batches, protect=True)

    def _apply_in_one_transaction(self, partition: str, batches: list, protect: bool) -> list:
        def call() -> Optional[tuple]:
            query, args = self.apply_call(partition, batches, protect)
            with self._lock, self._wrap:
                return self._connection().execute(query, args).fetchone()
        return apply_results(*self.at_recorded_count(call))

    def at_recorded_count(self, call: Callable[[], Optional[T]]) -> T:
        """``call()``, a write whose lock keys are of this store's shard count and that runs only while
        that count is the recorded one (None when not: nothing written), made again after the new
        count is read (:meth:`adopt_shard_count`), as often as another process reshards meanwhile.

        Raises:
            TransientStoreError: the count changed under RESHARD_RETRIES calls in a row.
            StoreError: as the call or the read of the count raises.
        """
        for _ in range(RESHARD_RETRIES):
            done = call()
            if done is not None:
                return done
            self.adopt_shard_count()
        raise resharded_meanwhile(self.table)

    def query(self, name: str) -> sql.Composed:
        """The statement ``name`` of ``postgres/sql/queries.sql`` on this store's table, for running on
        any psycopg connection to its database, sync or async (a caller's: :mod:`.joined`)."""
        return self._sql[name]

    def apply_call(self, partition: str, batches: list, protect: bool) -> tuple:
        """``(statement, parameters)`` of one ``<table>_apply_many`` call applying ``batches`` (checked
        Batch objects) to ``partition``; :func:`apply_results` reads its one row, or there is none
        when the store's shard count is no longer this object's (see :meth:`at_recorded_count`). The
        store's own ``apply`` runs it on its connection, a write in a caller's transaction
        (:mod:`.joined`) on theirs, so both take the same lock and judge the guards the same way."""
        wk: list  # (mypy infers no element type for it from the unpacking below)
        g_end, gk, gv, absent, w_end, wk, wv, consume = [], [], [], [], [], [], [], []
        for batch in batches:
            guards, writes = batch.guards, batch.writes  # each read once: a batch may build them at each read
            for g in guards:
                gk.append(g.key)
                is_absent = isinstance(g, Absent)
                gv.append(None if is_absent else g.value)
                absent.append(is_absent)
            consumed = consumed_index(guards, writes)
            consume.append(len(wk) + consumed + 1 if consumed >= 0 else 0)
            for k, v in writes:
                wk.append(k)
                wv.append(v)
            g_end.append(len(gk))
            w_end.append(len(wk))
        shard_count, lock = self.shard_lock_of(partition)
        args = (str(shard_count), partition, lock, g_end, gk, gv, absent, w_end, wk, wv, consume, protect)
        return self._sql["apply_many"], args

    def _apply_across(self, items: list) -> list:
        sets = _independent_sets(items, self._places)
        if sets is not None:
            try:
                return self._apply_sets(sets)
            except PermanentStoreError:
                pass  # nothing was written: each partition on its own, each batch refused alone
        return super()._apply_across(items)

    def _scan_many(self, requests: list) -> list:
        """Every request in one statement: a LATERAL index scan per request (see ``scan_many`` in
        ``postgres/sql/queries.sql``)."""
        parts, lows, highs, inclusive, limits = TextArray(), ByteaArray(), ByteaArray(), [], Int8Array()
        for partition, start, end, after, limit in requests:
            parts.append(partition)
            lows.append(start if after is None else after)
            highs.append(end)
            inclusive.append(after is None)
            limits.append(limit + 1)
        with self._lock, self._wrap:
            rows = self._connection().execute(self._sql["scan_many"], (parts, lows, highs, inclusive, limits),
                                              binary=True).fetchall()
        note = self._places.note
        pages = []
        for (ks, vs, places), request in zip(rows, requests):
            if ks is None:
                pages.append(Page.from_rows([], request[4]))
            else:
                note(request[0], ks, places)
                pages.append(Page.from_rows(list(zip(ks, vs)), request[4]))
        return pages

    def shard_lock(self, partition: str) -> int:
        """The transaction-level advisory lock key that every guarded commit on ``partition`` takes:
        its shard's (see the module docstring)."""
        return self.shard_lock_of(partition)[1]

    def shard_lock_of(self, partition: str) -> tuple:
        """``(shard count, lock key)``: :meth:`shard_lock` with the count it is of, read together."""
        shard_count, locks = self._shards.state
        return shard_count, locks[shard_of(partition, shard_count)]

    def _scan_shards(self, shards: list, start: bytes, end: bytes, limit: Union[int, list]) -> list:
        """Every shard in one statement: a LATERAL range scan of the shard index per shard, each with its
        limit (see ``scan_shards`` in ``postgres/sql/queries.sql``); for a range outside
        :data:`SHARD_SPACE`, which that index does not hold, one scan of the table (``scan_shards_elsewhere``)."""
        limits = Int8Array(limit if isinstance(limit, list) else [limit] * len(shards))
        query = self._sql["scan_shards" if SHARD_SPACE[0] <= start <= end <= SHARD_SPACE[1] else "scan_shards_elsewhere"]
        with self._lock, self._wrap:
            rows = self._connection().execute(query, (Int4Array(shards), limits, start, end), binary=True).fetchall()
        out: list = [[] for _ in shards]
        for i, partition, key, value in rows:
            out[i - 1].append((partition, key, value))
        return out

    def _apply_sets(self, sets: "_Sets") -> list:
        """Independent batches (:func:`_independent_sets`), set-based in one call of ``<table>_write_sets``;
        the places of the rows it moved are noted for the writes that consume them next."""
        def call() -> Optional[tuple]:
            shard_count, locks = self._shards.state
            lock_keys = Int8Array(sorted({locks[shard_of(p, shard_count)] for p in set(sets.bp)}))
            args = (str(shard_count), lock_keys, sets.bp, sets.ck, sets.cv, sets.mt, sets.at, sets.g_b, sets.g_p,
                    sets.g_k, sets.g_v, sets.d_b, sets.d_p, sets.d_k, sets.u_b, sets.u_p, sets.u_k, sets.u_v)
            with self._lock, self._wrap:
                return self._connection().execute(self._sql["write_sets"], args, binary=True).fetchone()
        failed, moved, places = self.at_recorded_count(call)
        self._places.note_moved(sets.bp, sets.mt, moved, places)
        return [COMMITTED if f is None else PreconditionFailed(bytes(f)) for f in failed]

    def _watch(self, callback: Callable[[], None]) -> Watcher:
        """The change signal (see :meth:`Store.watch`): a :class:`PgListener` on the channel
        ``<table>_wake``, on a connection of its own that reconnects after any loss."""
        self._refuse_if_closed()
        return PgListener(lambda: connect(self._dsn), f"{self.table}_wake", callback)

    def _partitions(self) -> list:
        with self._lock, self._wrap:
            return [r[0] for r in self._connection().execute(self._sql["partitions"]).fetchall()]

    def _record_labels(self, labels: dict) -> dict:
        with self._lock, self._wrap:
            conn = self._connection()
            with conn.transaction():
                with conn.cursor() as cur:
                    cur.executemany(self._sql["record_label"], list(labels.items()))
                recorded: dict = dict(conn.execute(self._sql["labels"], ("",)).fetchall())
        return {name: recorded[name] for name in labels}

    def _labels(self, prefix: str) -> dict:
        with self._lock, self._wrap:
            return dict(self._connection().execute(self._sql["labels"], (prefix,)).fetchall())

    @staticmethod
    def async_pools_error() -> Optional[ImportError]:
        """None when :meth:`async_pools` can make pools, else why not: the ImportError of
        ``psycopg_pool``, which is not installed (the ``postgres`` extra installs it)."""
        try:
            import psycopg_pool  # noqa: F401
        except ImportError as exc:
            return exc
        return None

    def async_pools(self) -> "AsyncPools":
        """This store's asyncio connection pools, one per event loop (:mod:`.pool`), created on
        first call; they close with the store.

        Raises:
            ImportError: ``psycopg_pool`` is not installed (the ``postgres`` extra installs it).
        """
        pools = self.__dict__.get("_async_pools")
        if pools is None:
            self._refuse_if_closed()
            from .pool import AsyncPools

            pools = self.__dict__.setdefault("_async_pools", AsyncPools(
                self._dsn, self._error,
                None if self.synchronous_commit is None else set_synchronous_commit(self.synchronous_commit)))
        return pools

    #: ``await store.keeping_cancels(write)``: an async write through psycopg whose cancel is never
    #: lost (:mod:`.cancels`: psycopg before 3.3 on Python before 3.12 may lose one).
    keeping_cancels = staticmethod(keeping_cancels)

    def joined(self, conn: Any, partition: str) -> PgJoined:
        """The write to ``partition`` through the caller's ``psycopg.Connection`` ``conn``, inside its
        transaction (:mod:`..joined` gives the contract).

        Raises:
            TypeError: ``conn`` is no ``psycopg.Connection`` (an ``AsyncConnection`` is named as such).
            ValueError: ``conn`` is closed, in a failed transaction, or in autocommit mode with no
                transaction open.
        """
        return PgJoined(self, conn, partition)

    def ajoined(self, conn: Any, partition: str) -> AsyncPgJoined:
        """:meth:`joined` on a ``psycopg.AsyncConnection``, every statement awaited on it.

        Raises:
            TypeError / ValueError: as :meth:`joined` (a sync ``psycopg.Connection`` is a TypeError here).
        """
        return AsyncPgJoined(self, conn, partition)

    def statements_on(self, conn: psycopg.AsyncConnection, partition: str) -> AsyncPgStatements:
        """This store's ``get`` and ``apply`` on ``partition``, awaited on ``conn``, an autocommit
        connection of :meth:`async_pools` (each apply its own transaction, as :meth:`apply` is)."""
        return AsyncPgStatements(self, conn, partition)

    def clock_ns(self) -> int:
        """The server's ``clock_timestamp()`` (the time at the call, not at the transaction's start),
        Unix epoch ns at PostgreSQL's resolution of 1 µs.

        Raises:
            StoreError: the server cannot be reached (transient).
        """
        with self._lock, self._wrap:
            (micros,) = self._connection().execute(self._CLOCK).fetchall()[0]
        return int(micros) * 1000

    _CLOCK = sql.SQL("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8")

    def open_sibling(self, *, lock_wait_ms: Optional[int] = None) -> "PostgresStore":
        """The same table, statements and settings over a connection of its own (opened on first
        use); the schema is in place already, so nothing is read or created here. ``lock_wait_ms``
        (see :meth:`Store.open_sibling`) is the session's ``lock_timeout``, which bounds the waits
        for a partition's advisory lock and for row locks alike (SQLSTATE 55P03, transient).

        Raises:
            TypeError / ValueError: ``lock_wait_ms`` is not None or an int from 1 to INT_MAX (``MAX_WAIT_MS``).
        """
        sibling = copy.copy(self)
        sibling.__dict__.update(_lock=threading.Lock(), _conn=None, _lock_wait_ms=check_lock_wait_ms(lock_wait_ms))
        sibling._wrap = _Wrap(self._error, weakref.ref(sibling))  # its own connection, closed on its errors
        sibling.__dict__.pop("_async_pools", None)
        return sibling

    def close(self) -> None:
        self._closed = True
        pools = self.__dict__.pop("_async_pools", None)
        if pools is not None:
            pools.close()
        with self._lock:
            if self._conn is not None:
                self._conn.close()

    def _refuse_if_closed(self) -> None:
        """Raise once :meth:`close` was called: a closed store opens no session of its own again (one it
        opened would stay open, unowned, until the process ends), as a closed SQLite store raises; a
        :meth:`new_connection` is its caller's, to close.

        Raises:
            PermanentStoreError: naming the store.
        """
        if self._closed:
            raise PermanentStoreError(f"{self!r} is closed: open a new store to use its table again")



class _Wrap(wrap_exceptions):
    """The store's :class:`wrap_exceptions`, which also closes the store's own connection after an
    error that no retry on that session ends (:func:`.results.session_is_stale`): its next call opens a
    new session, with the server's current defaults. Weakly: the store's attribute, not a cycle."""

    def __init__(self, error: Callable[[psycopg.Error], StoreError], store: "weakref.ref[PostgresStore]"):
        super().__init__(psycopg.Error, error)
        self._store = store

    def __exit__(self, typ, exc, tb):
        if exc is not None and session_is_stale(exc):
            store = self._store()
            # A read_only store's own setting refuses its writes: a new session would only do the same.
            conn = None if store is None or store.read_only else store._conn
            if conn is not None:
                conn.close()
        return super().__exit__(typ, exc, tb)


@dataclass
class _Sets:
    """``(partition, batch)`` pairs flattened into the arrays of ``<table>_write_sets`` (see
    ``postgres/sql/0013_apply_sets_flat.sql`` and ``0017_write_sets.sql``): one entry per batch in ``bp``,
    ``ck``, ``cv``, ``mt`` (the key its consumed row may move to) and ``at`` (where that row was last
    seen, :class:`_Places`); one per guard but the consuming one in ``g_*``; one per key finally deleted
    (``d_*``) or put (``u_*``) but the move's, each with its partition."""

    bp: list = field(default_factory=TextArray)
    ck: list = field(default_factory=ByteaArray)
    cv: list = field(default_factory=ByteaArray)
    mt: list = field(default_factory=ByteaArray)
    at: list = field(default_factory=TidArray)
    g_b: list = field(default_factory=Int4Array)
    g_p: list = field(default_factory=TextArray)
    g_k: list = field(default_factory=ByteaArray)
    g_v: list = field(default_factory=ByteaArray)
    d_b: list = field(default_factory=Int4Array)
    d_p: list = field(default_factory=TextArray)
    d_k: list = field(default_factory=ByteaArray)
    u_b: list = field(default_factory=Int4Array)
    u_p: list = field(default_factory=TextArray)
    u_k: list = field(default_factory=ByteaArray)
    u_v: list = field(default_factory=ByteaArray)


def _independent_sets(items: list, places: Optional[_Places] = None) -> Optional[_Sets]:
    """``items`` (``(partition, batch)`` pairs) as :class:`_Sets`, or None when two batches touch the
    same key of a partition (a guard or a write), or a batch puts back the key its last guard
    consumes: only then does judging every guard against the state before the call, as the
    set-based statement does, give each batch the result the batch-by-batch loop would.

    A batch that consumes a row and puts the row's value under another key (its first such put, in
    the order of the keys' first writes) names that key in ``mt`` instead of ``u_*``: the statement
    moves the row there with one ``UPDATE`` when the key is free, and puts it otherwise. The consumed
    row's place is taken from ``places`` (a list that turns out dependent leaves the places taken: a
    write by key finds the rows all the same). A :class:`~..store.RowMove` or :class:`~..store.RowConsume`
    (a runner's claim or outcome) is read off its consumed row's fields, its guards never built."""
    sets = _Sets()
    # Bound once: this runs for every batch a runner claims or commits.
    bp, ck, cv, mt, at = sets.bp.append, sets.ck.append, sets.cv.append, sets.mt.append, sets.at.append
    take = places.take if places is not None else (lambda partition, key: None)
    g_b, g_p, g_k, g_v = sets.g_b.append, sets.g_p.append, sets.g_k.append, sets.g_v.append
    d_b, d_p, d_k = sets.d_b.append, sets.d_p.append, sets.d_k.append
    u_b, u_p, u_k, u_v = sets.u_b.append, sets.u_p.append, sets.u_k.append, sets.u_v.append
    # partition -> the keys its batches touch, each batch's once: a key two batches touch shows as a
    # list longer than its set, judged once at the end (one set per partition, not one per batch).
    touched: dict = {}
    for b, (partition, batch) in enumerate(items, 1):
        keys = touched.get(partition)
        if keys is None:
            keys = touched[partition] = []
        if isinstance(batch, RowMove) and batch.key != batch.to:
            # A runner's claim of a first attempt, read off its fields: building its guards and writes
            # to take them apart again was most of this function's time per claim.
            key, to = batch.key, batch.to
            keys.append(key)
            keys.append(to)
            ck(key)
            cv(batch.value)
            at(take(partition, key))
            bp(partition)
            mt(to)
            continue
        if isinstance(batch, RowConsume):
            # A runner's outcome, read off its consumed row's fields and its writes in one pass: no guard
            # built to be taken apart, no dict of the writes. A key written twice (or the consumed one
            # written again) is found below as a key touched twice, and the list goes the general way.
            key, held = batch.key, batch.value
            keys.append(key)
            ck(key)
            cv(held)
            at(take(partition, key))
            bp(partition)
            target = None
            consumed = False
            for k, v in batch.writes:
                if v is None:
                    if k == key and not consumed:
                        consumed = True
                        continue
                    d_b(b)
                    d_p(partition)
                    d_k(k)
                elif v == held and target is None:
                    target = k
                else:
                    u_b(b)
                    u_p(partition)
                    u_k(k)
                    u_v(v)
                keys.append(k)
            if not consumed:  # not the shape it promises: judged by the general steps, batch by batch
                return None
            mt(target)
            continue
        writes = batch.writes
        guards = batch.guards
        final = dict(writes)  # key -> its last write (None: a delete), in first-write order
        if len(final) == len(writes):
            # No key written twice (every claim and outcome of a runner): consumed_write's rule, read
            # off the one write to the last guard's key (False: a key the batch does not write).
            consumes = bool(guards) and isinstance(guards[-1], Equals) and final.get(guards[-1].key, False) is None
        else:
            consumes = consumed_write(batch) >= 0
        if len(guards) > (1 if consumes else 0):
            mine = set(final)
            mine.update([g.key for g in guards])
            keys.extend(mine)
        else:  # the guard, if any, is on a key the batch writes: the writes' keys are all it touches
            keys.extend(final)
        move: object = None  # the consumed value while its move's key is still to find
        target = None  # the key the consumed row moves to
        if consumes:
            last = guards[-1]
            if final.pop(last.key) is not None:
                return None
            guards = guards[:-1] if len(guards) > 1 else ()  # a runner's outcome has the one guard
            ck(last.key)
            cv(last.value)
            at(take(partition, last.key))
            move = last.value
        else:
            ck(None)
            cv(None)
            at(None)
        bp(partition)
        for g in guards:
            g_b(b)
            g_p(partition)
            g_k(g.key)
            g_v(None if isinstance(g, Absent) else g.value)
        for k, v in final.items():
            if v is None:
                d_b(b)
                d_p(partition)
                d_k(k)
            elif v == move:
                target = k
                move = None
            else:
                u_b(b)
                u_p(partition)
                u_k(k)
                u_v(v)
        mt(target)
    for keys in touched.values():
        if len(set(keys)) != len(keys):  # a key two batches touch
            return None
    # One entry per batch in each per-batch array: the statement zips them, so one short would pair a
    # batch with another's consumed row, place or move.
    assert len(sets.ck) == len(sets.cv) == len(sets.mt) == len(sets.at) == len(sets.bp), "per-batch arrays differ"
    return sets


def connect(dsn: str, synchronous_commit: Optional[str] = None, lock_wait_ms: Optional[int] = None,
            session: Optional[psycopg.Connection] = None) -> psycopg.Connection:
    """An autocommit psycopg connection to ``dsn`` set up as every connection of a store is
    (:mod:`.session`), with the session's ``synchronous_commit`` set unless it is None,
    and its ``lock_timeout`` to ``lock_wait_ms`` (a checked int, ms) unless that is None;
    ``session``: one already open to ``dsn`` (:func:`.session.open_session`) to set up, else a new one.

    Raises:
        StoreError: the server cannot be reached (transient) or refuses the DSN (permanent);
            the message never holds the password (``session`` is closed then).
    """
    conn = open_session(dsn) if session is None else session
    try:
        conn.execute(SESSION_SETUP)
        if synchronous_commit is not None:
            conn.execute(set_synchronous_commit(synchronous_commit))
        if lock_wait_ms is not None:
            conn.execute(_set_lock_timeout(lock_wait_ms))
    except psycopg.Error as exc:
        conn.close()
        raise store_error(exc, dsn) from exc
    return conn


def _set_lock_timeout(lock_wait_ms: int) -> sql.Composed:
    return sql.SQL("SET lock_timeout = {}").format(sql.Literal(f"{lock_wait_ms}ms"))


def set_synchronous_commit(value: str) -> sql.Composed:
    """The statement that sets a session's ``synchronous_commit`` to ``value`` (a checked setting)."""
    return sql.SQL("SET synchronous_commit = {}").format(sql.Literal(value))


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

"""SQLiteStore: the embedded default backend of the durable-timer store contract.

One table, ``timerwheel_kv(partition TEXT, key BLOB, value BLOB, PRIMARY KEY(partition,
key)) WITHOUT ROWID``: the clustered primary key is the ordered index the scans walk.
SQLite compares BLOBs with memcmp, then by length, which is exactly Python's bytes order.

- WAL journal mode, so readers in other processes never block the writer.
- ``synchronous=NORMAL`` by default: in WAL mode a process crash (SIGKILL) loses nothing
  committed; a power cut may lose the last transactions, but each one whole (a claim,
  or a handler batch together with its delete), never half of one.
- ``apply`` is ``BEGIN IMMEDIATE`` (take the write lock first, so guards are checked
  under it), check the guards, write, ``COMMIT``. That serializes guarded commits across
  processes sharing the file, which is what lets two services on one file fire each
  timer's batch effects once. ``apply_many`` does all its batches in one such
  transaction, each inside its own ``SAVEPOINT`` so a failed guard undoes only its batch (a list
  of one batch needs none: its transaction is rolled back instead).
- The schema is created once, under ``BEGIN IMMEDIATE``: the numbered migrations of
  ``sqlite/sql/`` above the version kept in the ``timerwheel_meta`` table run in that one
  transaction. A file written by a newer version raises
  :class:`~timerwheel_c.durable.storage.store.SchemaVersionError` on open; a file whose tables of
  these names another program made raises :class:`~timerwheel_c.durable.storage.store.SchemaError`
  before anything is written to it.
- Every sqlite3 error is raised as a :class:`~.errors.StoreError`, transient or permanent by its
  result code (SQLITE_BUSY and SQLITE_LOCKED are transient, SQLITE_FULL permanent).
- Checkpoints run off the commit path: the store's connection disables WAL auto-checkpoint,
  and a small daemon thread with its own connection runs ``PRAGMA wal_checkpoint(PASSIVE)``
  every ``checkpoint_interval_s``. A passive checkpoint never blocks writers, so the
  checkpoint's fsyncs no longer land inside a timer's commit (they were the p99 lateness).
  Past :data:`WAL_RESTART_FRAMES` frames it starts the WAL over, which under a steady stream of
  commits a passive checkpoint never lets happen: in place while commits keep coming (the next
  ones overwrite the file's pages rather than extend it), and it truncates a long file once they
  have (nearly) stopped (:data:`WAL_QUIET_FRAMES`).
- New files get 1 kB pages (:data:`DEFAULT_PAGE_SIZE`), not SQLite's 4 kB: a commit writes every
  page it changed, whole, into the WAL, and a timer's write changes about five (the leaves of its
  old and new rows, of its name's row and of the index by shard), so the page's size is most of a
  commit's cost. A file keeps the page size it was made with.
- ``busy_timeout`` makes a second writer wait for the lock instead of failing at once.
- The change signal (:meth:`SQLiteStore.watch`) is ``PRAGMA data_version`` read every
  ``watch_interval_s`` (20 ms) on a connection of its own: the value changes whenever another
  connection, in this process or another, commits to the file. One read is a few
  microseconds with no I/O (the WAL index is shared memory), so an idle watcher costs well
  under 1 % of a core.
- One connection per store, shared by all threads under a lock: the simplest correct
  choice, and the only one for ``":memory:"`` (each connection would be its own database).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import sqlite3
import threading
import time
import urllib.parse
import weakref
from typing import Any, Callable, Iterator, Optional, Union

from .. import forks
from ..errors import PermanentStoreError, StoreError, TransientStoreError, wrap_exceptions
from ..printable import printable
from ..redact import redact
from ..shards import DEFAULT_SHARD_COUNT, check_shard_count, partition_hash, shard_of
from ..sqlfiles import migrations, rewrite_versions, statements
from ..store import (COMMITTED, SHARD_SPACE, Batch, Committed, NoStoreError, Page, PreconditionFailed, Refused, SchemaError,
                    SchemaVersionError, Store, check_partition, check_readable_version, check_wait_ms,
                    schema_version_of)
from ..upgrades import rewritten_rows
from ..watch import PollingWatcher, Watcher, check_interval_s
from .errors import result_code, store_error
from .joined import OnTheLoop, SQLiteJoined
from .rows import (QUERIES as _QUERIES, OnCursor, apply_batch, first_in_shards, has_puts, occupied_shards, read_through,
                   read_value, shard_count_of)

__all__ = ["CHECKPOINT_WARN_S", "FILE_CHECK_S", "SCHEMA_VERSION", "WAL_QUIET_FRAMES", "WAL_RESTART_FRAMES",
           "WAL_RESTART_WAIT_MS", "SQLiteStore"]

log = logging.getLogger("timerwheel_c.durable")

_MIGRATIONS = migrations("sqlite")
_ROW_REWRITES = rewrite_versions(_MIGRATIONS)  # versions that must find their declared rewrite
# 1: the key-value table alone (files from before the version row); 2: the version row; 6: the rows
# the layers above derive; 8: each row's shard, and the index that scans a shard; 9: the rows the
# layers above rewrite (storage/upgrades.py); 10: the view timerwheel_timers, for operators' SQL;
# 14: the index by shard kept to SHARD_SPACE.
SCHEMA_VERSION = _MIGRATIONS[-1][0]
_SCHEMA_TEXT = str(SCHEMA_VERSION)  # as the meta table records it
# The WAL's length, in frames (a page each: 1 kB in a file a store made, 4 kB in older ones), past which
# the checkpoint thread starts it over (:func:`_restart_wal`): 10-40 MB, a few seconds of the busiest
# commits. A round that finds fewer frames than this in a file longer than this many truncates the file.
WAL_RESTART_FRAMES = 10_000
# How long a restart waits for the writer and for readers, in ms: new writers wait while it runs.
WAL_RESTART_WAIT_MS = 20
# At most this many frames written since the checkpoint thread's previous round, and the WAL file longer
# than WAL_RESTART_FRAMES frames: it truncates the file (a burst of commits has ended). Freeing a long
# file holds the writers up for a while (tens of ms for 100 MB), which a quiet round barely feels.
WAL_QUIET_FRAMES = WAL_RESTART_FRAMES // 10
# The page size, in bytes, of a database file a store creates: the most a commit writes per row it
# changes. bench/durable_named.py's re-arms by name cost about a sixth less CPU with 1 kB pages than with
# SQLite's 4 kB. A row longer than about 230 bytes (key and value) then spills into an overflow page:
# re-arms of timers with 200-300 byte values cost up to a tenth more, of 1 kB values about 30 % less.
DEFAULT_PAGE_SIZE = 1024
# Seconds of checkpoints failing in a row before a WARNING says so (and between two such warnings).
CHECKPOINT_WARN_S = 60.0
# Seconds between two looks, at a write, at whether the file at the store's path is still the one it opened.
FILE_CHECK_S = 1.0

# The columns of each table, as any version made them (ALTER TABLE appends a column).
_TABLES = {"timerwheel_kv": (("partition", "key", "value"), ("partition", "key", "value", "shard")),
           "timerwheel_meta": (("name", "value"),)}
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


class SQLiteStore(Store):
    """The store contract on a SQLite database (stdlib :mod:`sqlite3`).

    Args:
        path: a file path (str or os.PathLike; created if missing) or ``":memory:"``.
        busy_timeout_ms: how long a write waits for another connection's lock, in ms (0 to
            :data:`~..store.MAX_WAIT_MS`, the most SQLite's C int holds).
        synchronous: SQLite's ``PRAGMA synchronous``: "OFF", "NORMAL" (default) or "FULL".
        checkpoint_interval_s: seconds (finite, > 0, at most a day: :data:`~..watch.MAX_INTERVAL_S`)
            between background WAL checkpoints of a file database, or None to leave checkpoints to
            SQLite's auto-checkpoint on commit.
        watch_interval_s: seconds (finite, > 0, at most a day) between two reads of ``PRAGMA
            data_version`` by :meth:`watch`; the worst-case delay before a runner sees another
            process's write.
        read_only: open the file read-only (SQLite's ``mode=ro``) for the commands that only read:
            nothing is created, upgraded or written, so a file this process may not write (or in a
            directory it may not write) can be read, and what writers commit later is read too. Only a
            file without a ``-wal`` beside it (no connection has it open) in a directory this process
            may not write is read as ``immutable``, which needs no lock or shared-memory file: as it is
            when opened. A write fails (SQLITE_READONLY).
        create: False for a command that writes rows but must not create a store: no file is
            created (SQLite's ``mode=rw``) and no DDL runs, as with ``read_only``, but it may write.
        shard_count: the number of shards (1..4096, see :mod:`.shards`) of a store this open creates,
            or upgrades from before shards; a store that has them keeps its own (:attr:`shard_count`).
        page_size: the page size in bytes (a power of two, 512..65536) of a database file this open
            creates (:data:`DEFAULT_PAGE_SIZE`); a file that exists keeps its own, which WAL mode fixes.

    Raises:
        TypeError / ValueError: a bad argument, or a URL given as the path (use
            :func:`timerwheel_c.durable.storage.open.open_store` for URLs).
        PermanentStoreError: the database cannot be opened; the message names the path and why
            (a missing directory, a directory, a read-only filesystem, no write permission, not a
            database file).
        TransientStoreError: the file stayed locked by another process for ``busy_timeout_ms``.
        SchemaError: the file holds tables of the same names that timerwheel_c did not make
            (nothing is written to it), or a ``schema_version`` that is not an integer.
        SchemaVersionError: the file was written by a newer timerwheel_c.
        NoStoreError: with ``read_only`` or ``create=False``, the file holds no timerwheel_c store; SchemaError: one of
            an older version, which a read-only open does not upgrade.
    """

    def __init__(self, path, *, busy_timeout_ms: int = 5000, synchronous: str = "NORMAL",
                 checkpoint_interval_s: Optional[float] = 1.0, watch_interval_s: float = 0.02,
                 read_only: bool = False, create: bool = True, shard_count: int = DEFAULT_SHARD_COUNT,
                 page_size: int = DEFAULT_PAGE_SIZE):
        check_shard_count(shard_count)
        if (isinstance(page_size, bool) or not isinstance(page_size, int) or not 512 <= page_size <= 65536
                or page_size & (page_size - 1)):
            raise ValueError(f"page_size must be a power of two from 512 to 65536 bytes, got {page_size!r}")
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__} {path!r}")
        check_wait_ms("busy_timeout_ms", busy_timeout_ms, 0)
        if synchronous not in _SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {_SYNCHRONOUS}, got {synchronous!r}")
        if checkpoint_interval_s is not None:
            checkpoint_interval_s = check_interval_s("checkpoint_interval_s", checkpoint_interval_s)
        watch_interval_s = check_interval_s("watch_interval_s", watch_interval_s)
        self.path = os.fspath(path)
        if isinstance(self.path, bytes):
            raise TypeError(f"path must be a str path, got bytes {self.path!r}")
        # The path as messages and the repr show it: a path that is a mistyped URL keeps its password out.
        self._named = repr(redact(self.path, self.path))
        if "://" in self.path:
            raise ValueError(f"SQLiteStore takes a file path, not the URL {self._named}; "
                             "open a URL with open_store()")
        if not self.path:
            # SQLite opens "" as a private temporary database, another one per connection: the
            # watcher would never see a write, and nothing would outlive the process.
            raise ValueError("path must name a SQLite file (or be ':memory:'), got ''")
        if "\x00" in self.path:  # no file name holds one: sqlite3 and os raise a bare "embedded null byte"
            raise ValueError(f"path must not contain NUL, got {self._named}")
        # The file the store's later connections (checkpoint, watcher) open, resolved now: a relative
        # path read after the process changed directory named another file, where the checkpoints
        # and the change signal went while the store's own WAL grew and its timers fired late.
        self._file = self.path if self.path == ":memory:" else os.path.abspath(self.path)
        self.synchronous = synchronous
        self.watch_interval_s = watch_interval_s
        self._busy_timeout_s = busy_timeout_ms / 1000
        self._lock = threading.Lock()
        self._wrap = wrap_exceptions(sqlite3.Error, self._error)
        self.read_only = bool(read_only)
        if not create and self.path != ":memory:" and not os.path.exists(self.path):
            raise NoStoreError(f"no timerwheel_c store here: SQLite database {self._named} does not exist "
                               "(this command never creates it)")
        self.shard_count = shard_count
        # (connection, PRAGMA data_version, the count then recorded) of _shard_count_for_writes: the
        # count a write transaction binds its puts' shards by while no other connection has committed.
        self._counted: tuple = (None, None, None)
        # isolation_level=None: no implicit transactions; apply() opens its own. Kept for a forked
        # child, which opens its own connection (_after_fork).
        self._connect = functools.partial(
            sqlite3.connect, self._read_only_uri() if read_only else self.path if create else self._existing_uri(),
            timeout=busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False,
            uri=bool(read_only) or not create)
        try:
            self._db = self._connect()
        except sqlite3.Error as exc:
            raise self._open_error(exc) from exc
        try:
            # Checked before anything is written: a foreign file must come out as it went in.
            self._while_busy(self._refuse_foreign_tables)
            if read_only or not create:
                self._while_busy(self._check_schema)
            else:
                # Before anything is written: it sets the size of a new, empty file only.
                self._db.execute(f"PRAGMA page_size={page_size}")
                if self.path != ":memory:":
                    self._while_busy(lambda: self._db.execute("PRAGMA journal_mode=WAL"))
                self._db.execute(f"PRAGMA synchronous={synchronous}")
                self._while_busy(self._create_schema)
            if not create and not read_only:  # writes without DDL: the store's WAL mode is the file's own already
                self._db.execute(f"PRAGMA synchronous={synchronous}")
        except sqlite3.Error as exc:
            self._db.close()
            raise self._open_error(exc) from exc
        except BaseException:
            self._db.close()
            raise
        self._checkpointer = None
        try:
            self._opened_file = _file_identity(self._file)
        except OSError:  # cannot be looked at now: never looked at again (no check rather than a false one)
            self._opened_file = None
        self._file_checked_s = time.monotonic()
        self._file_replaced = False  # once found deleted or replaced, every later write is refused
        # A store dropped without close() closes its connection when collected, as close() would,
        # instead of leaving it to sqlite3's own collection, which warns (ResourceWarning, 3.13+).
        self._closes_db = self._close_when_collected()
        forks.track(self)
        if self.path != ":memory:" and checkpoint_interval_s is not None and not read_only:
            self._db.execute("PRAGMA wal_autocheckpoint=0")
            self._closing = threading.Event()
            # A function of the file, not a method: a thread holding the store kept a store dropped
            # without close() alive for ever, with its thread and connections (a leak per store);
            # the store's collection stops the thread instead.
            self._checkpointer = threading.Thread(
                target=_checkpoint_loop, args=(self._file, self._closing, checkpoint_interval_s, busy_timeout_ms),
                name="sqlite-checkpoint", daemon=True,
            )
            self._checkpointer.start()
            weakref.finalize(self, self._closing.set)

    def _after_fork(self) -> None:
        """In a forked child: keep the parent's connection, unused and unclosed (:mod:`..forks`); the
        store's first use here opens this process's own (not at the fork: another thread of the
        parent may have held SQLite's own mutexes then, and a store the child never uses must not
        wait on them). One forked inside a transaction (the store's lock held, or the connection's
        transaction open) leaves the child's copy of SQLite's per-file lock records claiming locks no
        connection here will release: a new connection to the file would wait on them, so every use
        raises instead, saying to open the store after the fork. The parent's checkpoint thread does
        not exist here. An in-memory database is the child's own copy, used as it is."""
        held = self._lock.locked()
        self._lock = threading.Lock()
        self._checkpointer = None
        inherited = self._db
        try:
            busy = held or inherited.in_transaction
        except sqlite3.ProgrammingError:  # closed in the parent: nothing inherited to keep or replace
            return
        if self._file == ":memory:":
            return
        self._closes_db.detach()
        forks.keep(inherited)
        self._db = _Inherited(self, busy)  # type: ignore[assignment]  # a Connection opened at first use

    def _reopen(self) -> sqlite3.Connection:
        """This process's own connection, in place of the inherited one (see :meth:`_after_fork`)."""
        db = self._connect()
        if not self.read_only:
            db.execute(f"PRAGMA synchronous={self.synchronous}")
        self._db = db
        self._closes_db = self._close_when_collected()
        return db

    def _close_when_collected(self) -> weakref.finalize:
        """Close the connection once the store is collected, and never at interpreter exit (a
        finalizer's default): a store still alive then may be in use by a service's daemon thread,
        and closing the connection under it crashed the process (SIGSEGV in sqlite3_changes)."""
        closes = weakref.finalize(self, self._db.close)
        closes.atexit = False
        return closes

    def _while_busy(self, step: Callable[[], object]) -> None:
        """Run ``step``, again while SQLite says the database is locked or busy, for up to the busy
        timeout. SQLite returns SQLITE_BUSY at once, without its busy handler, where waiting could
        deadlock: while another process switches a new file to WAL or recovers its WAL index, which
        is exactly when many processes open one new file at the same moment."""
        deadline = time.monotonic() + self._busy_timeout_s
        delay_s = 0.001
        while True:
            try:
                step()
                return
            except sqlite3.OperationalError as exc:
                if result_code(exc)[0] not in (5, 6) or time.monotonic() >= deadline:  # BUSY, LOCKED
                    raise
            time.sleep(delay_s)
            delay_s = min(delay_s * 2, 0.05)

    def _open_error(self, exc: sqlite3.Error) -> StoreError:
        """The error to raise when the file cannot be opened: it names the path and, where the
        cause is visible from here, says it (SQLite itself only says "unable to open")."""
        error = self._error(exc)
        if result_code(exc)[0] in (5, 6) or self.path == ":memory:":  # busy or locked: worth retrying
            return error
        path = os.path.abspath(self.path)
        parent = os.path.dirname(path)
        if os.path.isdir(path):
            why = "it is a directory"
        elif not os.path.isdir(parent):
            why = f"its directory {parent!r} does not exist"
        elif os.statvfs(parent).f_flag & os.ST_RDONLY:
            why = f"its filesystem is mounted read-only ({exc})"
        elif os.path.exists(path) and not os.access(path, os.W_OK):
            why = f"this process may not write {path!r} ({exc})"
        elif not os.access(parent, os.W_OK):
            # The file may be writable: WAL mode creates its -wal and -shm files beside it.
            why = (f"this process may not create files in its directory {parent!r}, where SQLite keeps the "
                   f"database's -wal and -shm files ({exc})")
        else:
            why = str(exc)
        # The whole message: a path that is a mistyped URL leaves its password in the directory named too.
        return PermanentStoreError(redact(f"cannot open SQLite database {self.path!r}: {why}", self.path), error.code)

    def _refuse_foreign_tables(self) -> None:
        """Raise SchemaError when the file has a table of this store's names with other columns: a
        table some other program made, which this store must neither use nor write into."""
        for table, columns in _TABLES.items():
            found = tuple(row[1] for row in self._db.execute(f"PRAGMA table_info({table})"))
            if found and found not in columns:
                raise SchemaError(
                    f"SQLite database {self._named} has a table {table} with columns {found}, not {columns[-1]}: "
                    "it was not made by timerwheel_c; refusing to use it (nothing was written)")

    def _read_only_uri(self) -> str:
        """The ``file:`` URI that opens :attr:`path` read-only: ``mode=ro``, which reads what writers
        commit, under the shared-memory locks, for as long as the store stays open (the status page
        does). Only where it cannot work, no connection having the file open (no ``-wal``) and this
        process unable to make the ``-shm`` in its directory, is the file read as ``immutable``: SQLite
        then takes no lock and makes no file, and reads the file as it is (a later writer's commits
        are seen by the next open, not by this one)."""
        if self.path == ":memory:":
            return "file::memory:?mode=ro"
        path = os.path.abspath(self.path)
        shared = os.path.exists(path + "-wal") or os.access(os.path.dirname(path), os.W_OK)
        mode = "mode=ro" if shared else "mode=ro&immutable=1"
        return f"file:{urllib.parse.quote(path)}?{mode}"

    def _existing_uri(self) -> str:
        """The ``file:`` URI that opens :attr:`path` for writing only if it exists (``mode=rw``)."""
        if self.path == ":memory:":
            return "file::memory:"
        return _existing_file_uri(os.path.abspath(self.path))

    def _check_schema(self) -> None:
        """Read the schema version for an open that runs no DDL (see :func:`check_readable_version`)."""
        tables = {row[0] for row in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        found: Optional[int] = None
        where = f"table timerwheel_kv of SQLite database {self._named}"
        if "timerwheel_kv" in tables:
            row = self._db.execute(_QUERIES["schema_version"]).fetchone() if "timerwheel_meta" in tables else None
            found = self._unversioned(self._db, where) if row is None else schema_version_of(where, row[0])
        check_readable_version(where, found, SCHEMA_VERSION)
        self.shard_count = self._recorded_shard_count(self._db)

    def _create_schema(self) -> None:
        """Create or upgrade the schema under the write lock, once, even when many processes open
        the file at the same moment; raise SchemaVersionError for a file from a newer version."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(_QUERIES["create_meta"])
            row = db.execute(_QUERIES["schema_version"]).fetchone()
            where = f"SQLite database {self._named}"
            found = self._unversioned(db, where) if row is None else schema_version_of(where, row[0])
            if found > SCHEMA_VERSION:
                raise SchemaVersionError(where, found, SCHEMA_VERSION)
            db.execute(_QUERIES["set_shard_count"], (str(self.shard_count),))
            count = self.shard_count = self._recorded_shard_count(db)
            if found != SCHEMA_VERSION:
                with _shard_function(db, count):
                    for version, text in _MIGRATIONS:
                        if version > found:
                            for statement in statements(text):
                                db.execute(statement)
                deletes, puts = rewritten_rows(found, db.execute(_QUERIES["all_rows"]).fetchall(), _ROW_REWRITES,
                                               target=SCHEMA_VERSION)
                db.executemany(_QUERIES["delete"], deletes)
                db.executemany(_QUERIES["put"], [(p, k, v, partition_hash(p)) for p, k, v in puts])
                db.execute(_QUERIES["set_schema_version"], (str(SCHEMA_VERSION),))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    @staticmethod
    def _unversioned(db: sqlite3.Connection, where: str) -> int:
        """0, the version of a file from before the version row (the key-value table alone), for a
        file whose meta table records no version, read on ``db``.

        Raises:
            SchemaError: the key-value table has a later version's column: the version row was
                deleted or its page damaged, where upgrading from 0 would fail half way through.
        """
        if "shard" in {row[1] for row in db.execute("PRAGMA table_info(timerwheel_kv)")}:
            raise SchemaError(f"{where} records no schema_version, but its tables are of a later version: the "
                              "meta table was edited or is damaged (PRAGMA integrity_check)")
        return 0

    def _reshard(self, shard_count: int) -> None:
        with self._lock, self._wrap:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                with _shard_function(db, shard_count):
                    db.execute(_QUERIES["reshard"])
                db.execute(_QUERIES["change_shard_count"], (str(shard_count),))
                # This connection's own commit leaves its data_version as it was: the count is read again.
                self._counted = (None, None, None)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    def adopt_shard_count(self, db: Union[sqlite3.Connection, sqlite3.Cursor]) -> int:
        """The shard count recorded now, read on ``db`` before a pass reads shards, and kept as
        :attr:`shard_count`: another process's :meth:`reshard` changes it. Writes take it inside their
        own statement (queries.sql's ``put``), so a row never lies in a shard no pass reads.

        Raises:
            SchemaError: the recorded count is not a shard count.
        """
        self.shard_count = self._recorded_shard_count(db)
        return self.shard_count

    def refresh_shard_count(self) -> int:
        with self._lock, self._wrap:
            return self.adopt_shard_count(self._db)

    def _shard_count_for_writes(self, db: sqlite3.Cursor) -> Optional[int]:
        """The shard count recorded now, for the puts of the write transaction open on ``db`` (a cursor
        of the store's connection, after ``BEGIN IMMEDIATE``: no other connection commits until it
        ends), or None when the meta table records no shard count (the puts then take it in their
        own statement, queries.sql's ``put``, which refuses the write as it always did). Read again
        only when another connection has committed since it was last read (``PRAGMA data_version``,
        which this connection's own commits leave as it is; its own reshard forgets the count): a
        reshard another process committed before this transaction began is never missed, and a
        transaction's puts cost no read of the meta table each."""
        connection = db.connection
        version = db.execute("PRAGMA data_version").fetchone()[0]
        counted_on, counted_at, count = self._counted
        if counted_on is not connection or counted_at != version:
            text, schema = db.execute(_QUERIES["write_meta"]).fetchone()
            self.check_written_version(schema)
            count = shard_count_of(text)
            self._counted = (connection, version, count)
        return count

    def check_written_version(self, text: object) -> None:
        """Refuse a write on this store's own connection once the meta table records a schema version
        (``text``, as read inside the write's transaction) newer than this code's: a newer timerwheel_c
        upgraded the file after this store opened it, and its rows may no longer be where this code
        writes and reads them (an earlier layout's rows written after an upgrade are never read by the
        newer code, or fire a second time). SQLite runs no code of the newer version's to stop this
        process's statements, as PostgreSQL's functions can, so each write checks for itself.

        Raises:
            SchemaVersionError: the recorded version is newer than :data:`SCHEMA_VERSION`, naming both.
        """
        if text != _SCHEMA_TEXT and isinstance(text, str) and text.isdigit() and int(text) > SCHEMA_VERSION:
            raise SchemaVersionError(f"SQLite database {self._named}", int(text), SCHEMA_VERSION)

    def _recorded_shard_count(self, db: Union[sqlite3.Connection, sqlite3.Cursor]) -> int:
        """The shard count recorded in the meta table (the default for a store from before shards,
        which a read-only open does not upgrade).

        Raises:
            SchemaError: the recorded count is not a shard count, naming it.
        """
        row = db.execute(_QUERIES["shard_count"]).fetchone()
        if row is None:
            return DEFAULT_SHARD_COUNT
        try:
            return check_shard_count(int(row[0]))
        except ValueError:
            raise SchemaError(f"SQLite database {self._named} records shard_count {row[0]!r}, which is not a "
                              "shard count: the meta table was edited or not made by timerwheel_c") from None

    def own_write(self, partition: str) -> "_OwnWrite":
        """A writer's reads and batches of ``partition`` in one ``BEGIN IMMEDIATE`` transaction on the
        store's connection (see :meth:`Store.own_write`), committed when the block ends and rolled
        back when it raises. Its reads then need no read transaction of their own, each a lock and an
        unlock of the WAL index (two ``fcntl`` calls), and no other writer can move a row between a
        read and the batch guarded on it. For writes only: the file's write lock is held throughout.

        Raises:
            TypeError / ValueError: a bad partition.
            TransientStoreError: another connection held the write lock past the busy timeout.
        """
        return _OwnWrite(self, check_partition(partition))

    def joined(self, conn: Any, partition: str) -> SQLiteJoined:
        """The write to ``partition`` through the caller's ``sqlite3.Connection`` ``conn`` to this
        store's file, inside its transaction (:mod:`..joined` gives the contract).

        Raises:
            TypeError: ``conn`` is no ``sqlite3.Connection``.
            ValueError: ``conn`` is closed or of another thread, to another file (or this store is
                ``":memory:"``), or in autocommit mode with no transaction open.
        """
        return SQLiteJoined(self, conn, partition)

    def ajoined(self, conn: Any, partition: str) -> OnTheLoop:
        """:meth:`joined` behind the async interface, run synchronously where it is awaited: a
        sqlite3 connection belongs to the thread that opened it.

        Raises:
            TypeError / ValueError: as :meth:`joined`.
        """
        return OnTheLoop(SQLiteJoined(self, conn, partition))

    def _error(self, exc: sqlite3.Error) -> StoreError:
        return store_error(self.path, exc)

    def __repr__(self):
        return f"SQLiteStore({self._named}, synchronous={self.synchronous!r})"

    def _scan(self, partition: str, start: bytes, end: bytes, after: Optional[bytes], limit: int) -> Page:
        query, lower = (_QUERIES["scan_from"], start) if after is None else (_QUERIES["scan_after"], after)
        with self._lock, self._wrap:
            self._check_same_file()
            # Bound as bytearray: see rows.COPIED_VALUE_BYTES.
            rows = self._db.execute(query, (partition, bytearray(lower), bytearray(end), limit + 1)).fetchall()
        return Page.from_rows(rows, limit)

    def _scan_shards(self, shards: list, start: bytes, end: bytes, limit: Union[int, list]) -> list:
        limits = limit if isinstance(limit, list) else [limit] * len(shards)
        with self._lock, self._wrap:
            self._check_same_file()
            # A pass after another process's reshard() reads these shards by the count it was given,
            # and the next pass by the new one (a runner reads store.shard_count at each pass).
            self.adopt_shard_count(self._db)
            low, high = bytearray(start), bytearray(end)  # see rows.COPIED_VALUE_BYTES
            if not SHARD_SPACE[0] <= start <= end <= SHARD_SPACE[1]:
                # A range the partial index by shard does not hold: a scan of the table per shard.
                return [self._db.execute(_QUERIES["scan_shard_elsewhere"], (shard, low, high, n)).fetchall()
                        for shard, n in zip(shards, limits)]
            # One statement finds the shards holding a row in the range (an index probe each), then
            # one index range scan reads each of those: an idle pass over 64 shards costs one
            # statement, not 64 (about 40 us rather than 400). The first row of each (a pass's look
            # for its next wake-up) is one statement too, however many shards hold rows.
            if all(n == 1 for n in limits):
                first = first_in_shards(self._db, shards, low, high)
                return [[first[shard]] if shard in first else [] for shard in shards]
            held = occupied_shards(self._db, shards, low, high)
            return [self._db.execute(_QUERIES["scan_shard"], (shard, low, high, n)).fetchall() if shard in held
                    else [] for shard, n in zip(shards, limits)]

    def _get(self, partition: str, key: bytes) -> Optional[bytes]:
        with self._lock, self._wrap:
            self._check_same_file()
            return read_value(self._db, partition, key)

    def _get_through(self, partition: str, key: bytes) -> tuple:
        with self._lock, self._wrap:
            self._check_same_file()
            return read_through(self._db, partition, key)

    def _apply(self, partition: str, batch: Batch) -> Union[Committed, PreconditionFailed]:
        return self._apply_in_one_transaction([(partition, batch)], nested=False)[0]

    def _apply_many(self, partition: str, batches: list) -> list:
        return self._apply_in_one_transaction([(partition, b) for b in batches], nested=True)

    def _apply_across(self, items: list) -> list:
        return self._apply_in_one_transaction(items, nested=True)

    def _check_same_file(self) -> None:
        """Raise once the file at the store's path is no longer the one it opened
        (:meth:`_file_was_replaced`): its writes would go to a file no other process opens, and its
        reads, a runner's passes among them, would never see the new file's timers.

        Raises:
            PermanentStoreError: naming the path; the store must be opened again (the process restarted).
        """
        if self._file_was_replaced():
            raise PermanentStoreError(f"SQLite database {self._named} was deleted or replaced since this store opened "
                                      "it: its reads and writes would use a file no other process opens; open the store again "
                                      "(restart the process)")

    def _file_was_replaced(self) -> bool:
        """True once the file at the store's path is not the one it opened (deleted, or replaced by
        another: an operator's restore). Looked at once per :data:`FILE_CHECK_S` at most, by reads,
        writes and the change signal's thread alike; the verdict stays, so that a later call (a
        service's retry) never lands in the orphaned file either."""
        if self._opened_file is None or self._file_replaced:
            return self._file_replaced
        now_s = time.monotonic()
        if now_s - self._file_checked_s < FILE_CHECK_S:
            return False
        self._file_checked_s = now_s
        try:
            found = _file_identity(self._file)
        except OSError:  # no verdict (a passing ESTALE or EIO): looked at again at a later call
            return False
        self._file_replaced = found != self._opened_file
        return self._file_replaced

    def _apply_in_one_transaction(self, items: list, nested: bool) -> list:
        # One transaction for the whole list of (partition, batch) items; ``nested`` (apply_many,
        # apply_across) runs each batch in its own savepoint, so that a failed guard or a refused
        # batch rolls back that batch alone.
        results: list = []
        # A list of one batch needs no savepoint: its transaction undoes it alone (two statements fewer
        # per claim and per outcome committed alone, as a runner's tick of one timer commits them).
        savepoints = nested and len(items) > 1
        with self._lock, self._wrap:
            self._check_same_file()
            # One cursor for every statement: each Connection.execute makes a cursor of its own, and
            # the connection a weak reference to it, a handful of the collector's objects per batch.
            db = self._db.cursor()
            db.execute("BEGIN IMMEDIATE")
            try:
                count = self._shard_count_for_writes(db) if any(has_puts(batch) for _, batch in items) else None
                for partition, batch in items:
                    if savepoints:
                        db.execute("SAVEPOINT batch")
                    try:
                        failed = apply_batch(db, partition, batch, partition_hash(partition), shard_count=count)
                    except sqlite3.Error as exc:
                        error = self._error(exc)
                        if not nested or isinstance(error, TransientStoreError):
                            raise error from exc
                        if not savepoints:  # the list's one batch: refused, and nothing written
                            if self._db.in_transaction:
                                db.execute("ROLLBACK")
                            return [Refused(error)]
                        db.execute("ROLLBACK TO batch")
                        db.execute("RELEASE batch")
                        results.append(Refused(error))
                        continue
                    if failed is None:
                        results.append(COMMITTED)
                    else:
                        results.append(PreconditionFailed(failed))
                        db.execute("ROLLBACK TO batch" if savepoints else "ROLLBACK")
                        if not savepoints:
                            return results
                    if savepoints:
                        db.execute("RELEASE batch")
                db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        return results

    def _watch(self, callback: Callable[[], None]) -> Watcher:
        """The change signal (see :meth:`Store.watch`): ``PRAGMA data_version`` on a dedicated
        connection every ``watch_interval_s``. A ``":memory:"`` database is private to this
        store's connection, which data_version does not count, so there it is the connection's
        own ``total_changes`` (rows written through it), read as often.

        Raises:
            StoreError: the watcher's connection cannot be opened.
        """
        if self.path == ":memory:":
            return self._watch_own_connection(callback)
        with self._wrap:
            db = sqlite3.connect(self._file, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False)
            last = [db.execute("PRAGMA data_version").fetchone()[0]]
        store = weakref.ref(self)
        told = [False]

        def changed() -> bool:
            # A file replaced at the path (a restore) changes nothing this connection sees: signalled once,
            # with the store's verdict kept, so that an idle runner's next pass reads and raises.
            found = store()
            if not told[0] and found is not None and found._file_was_replaced():
                told[0] = True
                return True
            version = db.execute("PRAGMA data_version").fetchone()[0]
            if version == last[0]:
                return False
            last[0] = version
            return True

        return PollingWatcher(changed, callback, self.watch_interval_s, name="sqlite-watcher", release=db.close)

    def _watch_own_connection(self, callback: Callable[[], None]) -> Watcher:
        """:meth:`watch` of a ``":memory:"`` store: every write goes through ``self._db``, whose
        ``total_changes`` grows with each row it writes (Python's sqlite3 docs)."""
        with self._lock:
            last = [self._db.total_changes]

        def changed() -> bool:
            with self._lock:
                total = self._db.total_changes
            if total == last[0]:
                return False
            last[0] = total
            return True

        return PollingWatcher(changed, callback, self.watch_interval_s, name="sqlite-watcher")


    def _partitions(self) -> list:
        with self._lock, self._wrap:
            self._check_same_file()
            rows = self._db.execute(_QUERIES["partitions"]).fetchall()
        return [r[0] for r in rows]

    def _record_labels(self, labels: dict) -> dict:
        with self._lock, self._wrap:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(_QUERIES["record_label"], list(labels.items()))
                recorded = dict(db.execute(_QUERIES["labels"], ("",)).fetchall())
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        return {name: recorded[name] for name in labels}

    def _labels(self, prefix: str) -> dict:
        with self._lock, self._wrap:
            return {k: v for k, v in self._db.execute(_QUERIES["labels"], (prefix,)).fetchall() if k.startswith(prefix)}

    def close(self) -> None:
        if self._checkpointer is not None:
            self._closing.set()
            self._checkpointer.join()
            self._checkpointer = None
        with self._lock:
            self._db.close()


class _OwnWrite:
    """The context manager :meth:`SQLiteStore.own_write` returns: the store's lock taken and ``BEGIN
    IMMEDIATE`` run on entry, which yields an :class:`~.rows.OnCursor` of the transaction; ``COMMIT``
    when the block ends, ``ROLLBACK`` when it raises, the lock released either way, and a sqlite3
    error from the block or from these statements raised as the store's :class:`StoreError`. A class
    rather than a generator's context manager: a re-arm by name enters one per call, and a
    generator's costs about a microsecond more."""

    __slots__ = ("_store", "_partition", "_cursor", "_lock")

    def __init__(self, store: "SQLiteStore", partition: str):
        self._store = store
        self._partition = partition

    def __enter__(self) -> OnCursor:
        store = self._store
        lock = self._lock = store._lock  # the one released at the end (a fork meanwhile gives the store another)
        lock.acquire()
        try:
            store._check_same_file()
            db = self._cursor = store._db.cursor()
            tx = OnCursor(db, self._partition, partition_hash(self._partition), store._wrap, locked=True,
                          shard_count=self._shard_count, schema_version=store.check_written_version)
            db.execute("BEGIN IMMEDIATE")
        except BaseException as exc:
            lock.release()
            if isinstance(exc, sqlite3.Error):
                raise store._error(exc) from exc
            raise
        return tx

    def _shard_count(self) -> Optional[int]:
        return self._store._shard_count_for_writes(self._cursor)

    def __exit__(self, typ, exc, tb) -> None:
        store = self._store
        try:
            if exc is None:
                try:
                    self._cursor.execute("COMMIT")
                except BaseException:
                    if store._db.in_transaction:
                        self._cursor.execute("ROLLBACK")
                    raise
            elif store._db.in_transaction:
                self._cursor.execute("ROLLBACK")
        except sqlite3.Error as failed:
            raise store._error(failed) from failed
        finally:
            self._lock.release()
        if isinstance(exc, sqlite3.Error) and not isinstance(exc, StoreError):
            raise store._error(exc) from exc


class _Inherited:
    """Where a forked child's store had its parent's connection (see :meth:`SQLiteStore._after_fork`):
    its first use opens the child's own and goes on with it, or raises if the fork came inside a
    transaction; ``close()`` of a store never used in the child does nothing."""

    def __init__(self, store: "SQLiteStore", busy: bool):
        self._store = store
        self._busy = busy

    def close(self) -> None:
        pass

    def __getattr__(self, name: str):
        if self._busy:
            raise PermanentStoreError(
                f"SQLiteStore {self._store._file!r} was forked (os.fork) while it was inside a transaction: "
                "SQLite's connections do not survive a fork (sqlite.org/howtocorrupt.html, 2.6); open the store "
                "again in this process")
        db = self._store._db
        if db is self:  # held as ``db = self._db`` by a caller: its later uses go to the one reopened
            db = self._store._reopen()
        return getattr(db, name)


def _file_identity(file: str) -> Optional[tuple]:
    """``(device, inode)`` of the database file ``file``, ``()`` when there is none, None in memory.

    Raises:
        OSError: the file cannot be looked at (other than missing).
    """
    if file == ":memory:":
        return None
    try:
        st = os.stat(file)
    except FileNotFoundError:
        return ()
    return st.st_dev, st.st_ino


def _checkpoint_loop(file: str, closing: threading.Event, interval_s: float, busy_timeout_ms: int) -> None:
    """The checkpoint thread of the store of ``file`` (an absolute path): a passive checkpoint every
    ``interval_s`` seconds, and the WAL started over once long (:func:`_restart_wal`), until
    ``closing`` is set: in place while commits keep filling it, truncated once a round finds it
    long and at most :data:`WAL_QUIET_FRAMES` frames written since the round before. Its connection
    is opened at its first round and again after a failure to open it (no descriptor left, the
    directory unreadable for a while): nothing else checkpoints the store's WAL, which grows until a
    checkpoint succeeds. Failures all through :data:`CHECKPOINT_WARN_S` are logged at WARNING, at
    most once per that span."""
    db: Optional[sqlite3.Connection] = None
    failing_since: Optional[float] = None  # monotonic s of the first failed round in a row
    warned_at = 0.0
    longest = 0  # the bytes of a WAL of WAL_RESTART_FRAMES frames, for the page size of ``file``
    last = 0  # the WAL's frames at the previous round
    try:
        while not closing.wait(interval_s):
            try:
                if db is None:
                    db = _checkpoint_connection(file, busy_timeout_ms)
                    longest = WAL_RESTART_FRAMES * (db.execute("PRAGMA page_size").fetchone()[0] + 24)
                frames = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
                added = frames if frames < last else frames - last  # since the last round (fewer: it started over)
                if frames > WAL_RESTART_FRAMES and added:
                    _restart_wal(db, busy_timeout_ms)  # commits keep filling it: over again, in place
                elif added <= WAL_QUIET_FRAMES and _wal_bytes(file) > longest:
                    # Few commits since the last round, or none: the disk back, the writers it holds up few.
                    _restart_wal(db, busy_timeout_ms, truncate=True)
                last = frames
                failing_since = None
            except sqlite3.Error as exc:  # busy, vanished, no descriptor: the next round (or the next commit) retries
                log.debug("WAL checkpoint of %s failed", file, exc_info=True)
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since >= CHECKPOINT_WARN_S and now - warned_at >= CHECKPOINT_WARN_S:
                    warned_at = now
                    log.warning("WAL checkpoints of %s have failed for %.0f s (%s): its -wal file grows until one "
                                "succeeds", file, now - failing_since, printable(str(exc)))
    finally:
        if db is not None:
            db.close()


def _checkpoint_connection(file: str, busy_timeout_ms: int) -> sqlite3.Connection:
    # Only if it exists: a file gone meanwhile is an error to retry, never a new empty database at its path.
    return sqlite3.connect(_existing_file_uri(file), timeout=busy_timeout_ms / 1000, isolation_level=None,
                           check_same_thread=False, uri=True)


def _existing_file_uri(file: str) -> str:
    """The ``file:`` URI that opens the database file ``file`` (an absolute path) for writing only if
    it exists (``mode=rw``)."""
    return f"file:{urllib.parse.quote(file)}?mode=rw"


def _restart_wal(db: sqlite3.Connection, busy_timeout_ms: int, truncate: bool = False) -> None:
    """Copy the rest of the WAL into the database so that the next commit starts it over from its
    first frame, and with ``truncate`` cut the file to nothing, waiting at most
    :data:`WAL_RESTART_WAIT_MS` for the writer and the readers of older snapshots, on ``db`` (the
    checkpoint thread's connection, whose busy timeout is ``busy_timeout_ms`` otherwise).

    A WAL starts over only when a writer finds every frame copied back; while commits arrive faster
    than a passive checkpoint copies, none ever does: one timer rescheduling itself in a loop grew
    the file by about 100 MB a second, for good, and every commit cost more as the WAL index grew.
    A RESTART checkpoint leaves the file as long as it was, so that the commits that go on write
    over its pages: truncated instead (TRUNCATE), the file was freed each round only for them to
    extend it again, page by page (the kernel's allocation of each new page, and the freeing of
    them all under the checkpoint's lock while writers waited: 4-5 % of a re-arm by name's time and
    CPU, bench/durable_named.py). Either makes new writers wait while it runs, hence its short wait:
    a busy one gives up, and the next round tries again."""
    db.execute(f"PRAGMA busy_timeout={WAL_RESTART_WAIT_MS}")
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)" if truncate else "PRAGMA wal_checkpoint(RESTART)").fetchall()
    finally:
        db.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")


def _wal_bytes(file: str) -> int:
    """The length of the WAL file of the database ``file``, 0 when there is none or it cannot be
    looked at (the checkpoint thread's round goes on: its truncation waits for a round that can)."""
    try:
        return os.stat(file + "-wal").st_size
    except OSError:
        return 0


@contextlib.contextmanager
def _shard_function(db: sqlite3.Connection, shard_count: int) -> Iterator[None]:
    """``timerwheel_shard(partition)``, :func:`~.shards.shard_of` under ``shard_count``, registered on
    ``db`` for the statements that fill the shard column (``0008_shards.sql``, ``reshard``) and taken
    away after them: a function of ours must not outlive them on a connection others may share."""
    db.create_function("timerwheel_shard", 1, lambda partition: shard_of(partition, shard_count), deterministic=True)
    try:
        yield
    finally:
        db.create_function("timerwheel_shard", 1, None)

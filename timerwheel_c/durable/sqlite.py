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
  timer's batch effects once.
- Checkpoints run off the commit path: the store's connection disables WAL auto-checkpoint,
  and a small daemon thread with its own connection runs ``PRAGMA wal_checkpoint(PASSIVE)``
  every ``checkpoint_interval_s``. A passive checkpoint never blocks writers, so the
  checkpoint's fsyncs no longer land inside a timer's commit (they were the p99 lateness).
- ``busy_timeout`` makes a second writer wait for the lock instead of failing at once.
- The change signal (:meth:`SQLiteStore.watch`) is ``PRAGMA data_version`` read every
  ``watch_interval_s`` (10 ms) on a connection of its own: the value changes whenever another
  connection, in this process or another, commits to the file. One read is a few
  microseconds with no I/O (the WAL index is shared memory), so an idle watcher costs well
  under 1 % of a core.
- One connection per store, shared by all threads under a lock: the simplest correct
  choice, and the only one for ``":memory:"`` (each connection would be its own database).
"""
from __future__ import annotations

import logging
import os
import sqlite3
import threading
from typing import Callable, Optional, Union

from .store import Absent, Batch, Equals, Committed, Page, PreconditionFailed, Store, check_bytes, check_partition
from .watch import PollingWatcher, Watcher

__all__ = ["SQLiteStore"]

log = logging.getLogger("timerwheel_c.durable")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS timerwheel_kv ("
    " partition TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL,"
    " PRIMARY KEY (partition, key)) WITHOUT ROWID"
)
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


class SQLiteStore(Store):
    """The store contract on a SQLite database (stdlib :mod:`sqlite3`).

    Args:
        path: a file path (str or os.PathLike; created if missing) or ``":memory:"``.
        busy_timeout_ms: how long a write waits for another connection's lock, in ms (>= 0).
        synchronous: SQLite's ``PRAGMA synchronous``: "OFF", "NORMAL" (default) or "FULL".
        checkpoint_interval_s: seconds (> 0) between background WAL checkpoints of a file
            database, or None to leave checkpoints to SQLite's auto-checkpoint on commit.
        watch_interval_s: seconds (> 0) between two reads of ``PRAGMA data_version`` by
            :meth:`watch`; the worst-case delay before a runner sees another process's write.

    Raises:
        TypeError / ValueError: a bad argument.
        sqlite3.Error: the database cannot be opened.
    """

    def __init__(self, path, *, busy_timeout_ms: int = 5000, synchronous: str = "NORMAL",
                 checkpoint_interval_s: Optional[float] = 1.0, watch_interval_s: float = 0.01):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__} {path!r}")
        if isinstance(busy_timeout_ms, bool) or not isinstance(busy_timeout_ms, int) or busy_timeout_ms < 0:
            raise ValueError(f"busy_timeout_ms must be an int >= 0, got {busy_timeout_ms!r}")
        if synchronous not in _SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {_SYNCHRONOUS}, got {synchronous!r}")
        if checkpoint_interval_s is not None and not (isinstance(checkpoint_interval_s, (int, float)) and checkpoint_interval_s > 0):
            raise ValueError(f"checkpoint_interval_s must be > 0 seconds or None, got {checkpoint_interval_s!r}")
        if isinstance(watch_interval_s, bool) or not (isinstance(watch_interval_s, (int, float)) and watch_interval_s > 0):
            raise ValueError(f"watch_interval_s must be > 0 seconds, got {watch_interval_s!r}")
        self.path = os.fspath(path)
        self.watch_interval_s = float(watch_interval_s)
        self._busy_timeout_s = busy_timeout_ms / 1000
        self._lock = threading.Lock()
        # isolation_level=None: no implicit transactions; apply() opens its own.
        self._db = sqlite3.connect(
            self.path, timeout=busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False
        )
        try:
            if self.path != ":memory:":
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.execute(_SCHEMA)
        except BaseException:
            self._db.close()
            raise
        self._checkpointer = None
        if self.path != ":memory:" and checkpoint_interval_s is not None:
            self._db.execute("PRAGMA wal_autocheckpoint=0")
            self._closing = threading.Event()
            self._checkpointer = threading.Thread(
                target=self._checkpoint_loop, args=(checkpoint_interval_s, busy_timeout_ms),
                name="sqlite-checkpoint", daemon=True,
            )
            self._checkpointer.start()

    def _checkpoint_loop(self, interval_s: float, busy_timeout_ms: int) -> None:
        db = sqlite3.connect(self.path, timeout=busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False)
        try:
            while not self._closing.wait(interval_s):
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error:  # busy or vanished: the next round (or the next commit) retries
                    log.debug("WAL checkpoint of %s failed", self.path, exc_info=True)
        finally:
            db.close()

    def __repr__(self):
        return f"SQLiteStore({self.path!r})"

    def scan(self, partition: str, start: bytes, end: bytes, after: Optional[bytes] = None, limit: int = 64) -> Page:
        self.check_scan_args(partition, start, end, after, limit)
        lower, op = (after, ">") if after is not None and after >= start else (start, ">=")
        with self._lock:
            rows = self._db.execute(
                f"SELECT key, value FROM timerwheel_kv WHERE partition = ? AND key {op} ? AND key < ?"
                " ORDER BY key LIMIT ?",
                (partition, lower, end, limit + 1),
            ).fetchall()
        return Page.from_rows(rows, limit)

    def get(self, partition: str, key: bytes) -> Optional[bytes]:
        check_partition(partition)
        check_bytes("key", key)
        with self._lock:
            row = self._db.execute(
                "SELECT value FROM timerwheel_kv WHERE partition = ? AND key = ?", (partition, key)
            ).fetchone()
        return None if row is None else bytes(row[0])

    def apply(self, partition: str, batch: Batch) -> Union[Committed, PreconditionFailed]:
        check_partition(partition)
        self.check_batch(batch)
        # An Equals guard on a key whose first write is a delete (every claim and every Done of
        # the runner) is checked by the delete itself, "DELETE ... AND value = ?", one statement
        # instead of two; the skipped write is that first delete. Any failed guard rolls back.
        first_is_delete: dict = {}
        for key, value in batch.writes:
            first_is_delete.setdefault(key, value is None)
        consumed: dict = {}
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                for guard in batch.guards:
                    key = guard.key
                    if key in consumed:
                        held = not isinstance(guard, Absent) and guard.value == consumed[key]
                    elif isinstance(guard, Equals) and first_is_delete.get(key):
                        held = db.execute(
                            "DELETE FROM timerwheel_kv WHERE partition = ? AND key = ? AND value = ?",
                            (partition, key, guard.value),
                        ).rowcount == 1
                        if held:
                            consumed[key] = guard.value
                    else:
                        row = db.execute(
                            "SELECT value FROM timerwheel_kv WHERE partition = ? AND key = ?", (partition, key)
                        ).fetchone()
                        held = row is None if isinstance(guard, Absent) else row is not None and row[0] == guard.value
                    if not held:
                        db.execute("ROLLBACK")
                        return PreconditionFailed(key)
                for key, value in batch.writes:
                    if key in consumed:
                        del consumed[key]  # its first write, the delete, is done
                    elif value is None:
                        db.execute("DELETE FROM timerwheel_kv WHERE partition = ? AND key = ?", (partition, key))
                    else:
                        db.execute(
                            "INSERT OR REPLACE INTO timerwheel_kv (partition, key, value) VALUES (?, ?, ?)",
                            (partition, key, value),
                        )
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        return Committed()

    def watch(self, callback: Callable[[], None]) -> Watcher:
        """The change signal (see :meth:`Store.watch`): ``PRAGMA data_version`` on a dedicated
        connection every ``watch_interval_s``. A ``":memory:"`` database is private to its
        connection, so it falls back to the generic once-a-second callback.

        Raises:
            sqlite3.Error: the watcher's connection cannot be opened.
        """
        if self.path == ":memory:":
            return super().watch(callback)
        db = sqlite3.connect(self.path, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False)
        last = [db.execute("PRAGMA data_version").fetchone()[0]]

        def changed() -> bool:
            version = db.execute("PRAGMA data_version").fetchone()[0]
            if version == last[0]:
                return False
            last[0] = version
            return True

        return PollingWatcher(changed, callback, self.watch_interval_s, name="sqlite-watcher", release=db.close)

    def partitions(self) -> list:
        with self._lock:
            rows = self._db.execute("SELECT DISTINCT partition FROM timerwheel_kv ORDER BY partition").fetchall()
        return [r[0] for r in rows]

    def close(self) -> None:
        if self._checkpointer is not None:
            self._closing.set()
            self._checkpointer.join()
            self._checkpointer = None
        with self._lock:
            self._db.close()

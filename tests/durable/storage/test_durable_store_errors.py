"""The storage layer's errors: every backend raises StoreError itself, transient or permanent by
SQLSTATE class or SQLite result code, and apply_many scopes a refused batch to that batch."""
from __future__ import annotations

import sqlite3

import pytest

from timerwheel_c.durable.storage.errors import PermanentStoreError, TransientStoreError, is_transient
from timerwheel_c.durable.storage.sqlite import SQLiteStore
from timerwheel_c.durable.storage.store import Batch, Committed, Equals, PreconditionFailed, Refused
from bench.stores import dispose

P = "p"
REFUSED = b"\xde\xad"  # the value the server is made to refuse


def _refuse_writes_of(store, value: bytes) -> None:
    """Install a trigger that makes the server itself refuse any write of ``value`` to ``store``'s
    table: SQLite's RAISE(ABORT) (SQLITE_CONSTRAINT), PostgreSQL's SQLSTATE 54000 (program limit
    exceeded, the class of an index row too large), both permanent."""
    if isinstance(store, SQLiteStore):
        if store.path == ":memory:":
            pytest.skip("a trigger needs a second connection to the same database")
        with sqlite3.connect(store.path) as db:
            db.execute(f"CREATE TRIGGER refuse BEFORE INSERT ON timerwheel_kv WHEN NEW.value = x'{value.hex()}'"
                       " BEGIN SELECT RAISE(ABORT, 'this value is refused'); END")
        return
    import psycopg
    from psycopg import sql

    with psycopg.connect(store._dsn, autocommit=True) as conn:
        fn = sql.Identifier(f"{store.table}_refuse")
        conn.execute(sql.SQL("CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                             " RAISE EXCEPTION 'this value is refused' USING ERRCODE = '54000'; END $$").format(fn))
        conn.execute(sql.SQL("CREATE TRIGGER {} BEFORE INSERT OR UPDATE ON {} FOR EACH ROW WHEN (NEW.value = {})"
                             " EXECUTE FUNCTION {}()").format(fn, sql.Identifier(store.table), sql.Literal(value), fn))


def test_a_refused_batch_fails_alone_and_the_others_apply_as_if_it_were_absent(durable_store):
    """apply_many: a batch the server refuses is Refused(PermanentStoreError) and writes nothing; the
    batches before and after it are judged and applied as if it were absent (a later guard on its key
    sees the key absent). A lone apply of the same batch raises the PermanentStoreError."""
    _refuse_writes_of(durable_store, REFUSED)
    durable_store.apply(P, Batch().put(b"a", b"1"))
    results = durable_store.apply_many(P, [
        Batch().require(Equals(b"a", b"1")).delete(b"a").put(b"a2", b"1"),
        Batch().put(b"x", b"first").put(b"bad", REFUSED),
        Batch().require(Equals(b"x", b"first")).put(b"y", b"2"),
        Batch().put(b"z", b"3"),
    ])
    assert results[0] == Committed() and results[3] == Committed()
    assert isinstance(results[1], Refused) and isinstance(results[1].error, PermanentStoreError)
    assert "refused" in str(results[1].error) and not is_transient(results[1].error)
    assert results[2] == PreconditionFailed(b"x")  # batch 1's put of x never happened
    rows = dict(durable_store.scan(P, b"", b"\xff", limit=100).entries)
    assert rows == {b"a2": b"1", b"z": b"3"}
    with pytest.raises(PermanentStoreError, match="refused") as raised:
        durable_store.apply(P, Batch().put(b"bad", REFUSED))
    assert raised.value.__cause__ is not None
    assert durable_store.get(P, b"bad") is None


def test_sqlite_busy_is_a_transient_store_error_with_its_result_code(tmp_path):
    """A write that finds the file locked by another connection past busy_timeout raises
    TransientStoreError coded SQLITE_BUSY (a result code, not message text), the driver's error chained."""
    path = tmp_path / "t.db"
    with SQLiteStore(path, busy_timeout_ms=0) as store:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(TransientStoreError) as raised:
                store.apply(P, Batch().put(b"k", b"v"))
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert raised.value.code == "SQLITE_BUSY" and is_transient(raised.value)
        assert isinstance(raised.value.__cause__, sqlite3.OperationalError)
        assert store.apply(P, Batch().put(b"k", b"v")) == Committed()


def test_a_file_that_is_not_a_database_is_a_permanent_error_naming_it(tmp_path):
    """Opening a file that is not a SQLite database raises PermanentStoreError (SQLITE_NOTADB) naming the
    path; the file is left as it was."""
    path = tmp_path / "notes.txt"
    path.write_bytes(b"not a database, just some text that is long enough to hold a header" * 10)
    before = path.read_bytes()
    with pytest.raises(PermanentStoreError, match=rf"{path}'.*not a database") as raised:
        SQLiteStore(path)
    assert raised.value.code == "SQLITE_NOTADB" and path.read_bytes() == before


@pytest.mark.parametrize("sqlstate, transient", [
    ("08006", True), ("08001", True), ("40001", True), ("40P01", True), ("57P01", True), ("57P02", True),
    ("57P03", True), ("57014", True), ("53300", True), ("53200", True), ("55P03", True),
    ("53100", True), ("25006", True), ("57P04", False), ("54000", False), ("54001", False), ("22001", False), ("23505", False),
    ("42P01", False), ("XX000", False), ("58030", False), ("28P01", False), (None, True),
])
def test_postgres_errors_are_classified_by_sqlstate_class(sqlstate, transient):
    """Transient exactly for connection exceptions (08), transaction rollbacks (40), insufficient
    resources (53, a full disk too), operator intervention (57) but a dropped database, lock waits
    and a read-only transaction (25006: a standby, or a server set read-only);
    a program limit (54, an index row too large) and every data or integrity error are permanent."""
    pytest.importorskip("psycopg")
    from timerwheel_c.durable.storage.postgres.results import is_transient_sqlstate

    assert is_transient_sqlstate(sqlstate) is transient


def test_postgres_lost_connection_is_transient_and_the_store_reconnects():
    """A store whose connection the server terminates raises TransientStoreError on its next call (the
    driver's error chained), and the call after that reconnects and succeeds."""
    import os
    import uuid

    dsn = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
    if not dsn:
        pytest.skip("set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to test PostgresStore")
    import psycopg
    from timerwheel_c.durable.storage.postgres import PostgresStore

    store = PostgresStore(dsn, table=f"timerwheel_test_{uuid.uuid4().hex[:16]}")
    try:
        (pid,) = store._connection().execute("SELECT pg_backend_pid()").fetchone()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(TransientStoreError) as raised:
            store.get(P, b"k")
        assert isinstance(raised.value.__cause__, psycopg.Error)
        assert store.apply(P, Batch().put(b"k", b"v")) == Committed()
    finally:
        dispose(store)


def test_a_foreign_sqlite_database_is_refused_and_left_unwritten(tmp_path):
    """A database whose timerwheel_kv table has other columns (another program's) raises SchemaError
    naming the table and its columns; the file is byte-for-byte as it was (no meta table, no WAL switch)."""
    from timerwheel_c.durable.storage.store import SchemaError

    path = tmp_path / "foreign.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE timerwheel_kv (id INTEGER PRIMARY KEY, payload TEXT)")
        db.execute("INSERT INTO timerwheel_kv (payload) VALUES ('theirs')")
    db.close()
    before = path.read_bytes()
    with pytest.raises(SchemaError, match=r"timerwheel_kv with columns \('id', 'payload'\).*nothing was written"):
        SQLiteStore(path)
    assert path.read_bytes() == before and not (tmp_path / "foreign.db-wal").exists()


def test_a_bad_schema_version_is_a_clear_error_naming_it(tmp_path):
    """A meta row whose schema_version is not a version number raises SchemaError naming the value and the
    file, not a bare int() error."""
    from timerwheel_c.durable.storage.store import SchemaError

    path = tmp_path / "t.db"
    SQLiteStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE timerwheel_meta SET value = 'two' WHERE name = 'schema_version'")
    db.close()
    with pytest.raises(SchemaError, match=rf"{path}'.*schema_version 'two'.*not a version number"):
        SQLiteStore(path)


def test_a_sqlite_file_on_a_read_only_filesystem_says_so(tmp_path):
    """Opening a store on a filesystem mounted read-only (a tmpfs mounted ro in a private mount namespace)
    raises PermanentStoreError whose message says the filesystem is read-only."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        pytest.skip("needs unshare -rm (user and mount namespaces) to mount a read-only filesystem")
    ro = tmp_path / "ro"
    ro.mkdir()
    code = ("from timerwheel_c.durable.storage.sqlite import SQLiteStore\n"
            "from timerwheel_c.durable.storage.errors import PermanentStoreError\n"
            f"try:\n    SQLiteStore({str(ro / 'x.db')!r})\n"
            "except PermanentStoreError as exc:\n    print(exc)\n")
    script = f"mount -t tmpfs -o ro tmpfs {ro} && exec {sys.executable} -I -c \"$0\""
    out = subprocess.run(["unshare", "-rm", "sh", "-c", script, code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "x.db" in out.stdout and "read-only" in out.stdout, out.stdout


def test_postgres_bad_schema_version_is_a_clear_error_naming_it():
    """PostgreSQL: the same SchemaError for a meta row that is not a version number."""
    import os
    import uuid

    dsn = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
    if not dsn:
        pytest.skip("set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to test PostgresStore")
    import psycopg
    from timerwheel_c.durable.storage.postgres import PostgresStore
    from timerwheel_c.durable.storage.store import SchemaError

    table = f"timerwheel_test_{uuid.uuid4().hex[:16]}"
    store = PostgresStore(dsn, table=table)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"UPDATE {table}_meta SET value = '5x' WHERE name = 'schema_version'")
        with pytest.raises(SchemaError, match=rf"{table}'.*schema_version '5x'"):
            PostgresStore(dsn, table=table)
    finally:
        dispose(store)


def test_a_file_whose_directory_is_not_writable_is_refused_naming_the_directory(tmp_path, monkeypatch):
    """A writable database file in a directory this process may not write: SQLite's WAL needs its -wal
    and -shm files there, and the error says so, naming the directory. It named the file, which was
    writable. (os.access is replaced: the tests may run as root, whom no permission bit stops.)"""
    import os
    import sqlite3

    from timerwheel_c.durable.storage.sqlite import SQLiteStore

    path = tmp_path / "t.db"
    store = SQLiteStore(path)
    store.close()
    monkeypatch.setattr(os, "access", lambda p, mode: os.fspath(p) != str(tmp_path))
    message = str(store._open_error(sqlite3.OperationalError("unable to open database file")))
    assert f"directory {str(tmp_path)!r}" in message and "-wal" in message and "unable to open" in message


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_sqlite_file_deleted_or_replaced_under_an_open_store_fails_its_writes_by_name(tmp_path, monkeypatch, how):
    """The database file deleted, or replaced by another (an operator's restore), under an open store:
    its writes raise PermanentStoreError naming the path and the cause, so a runner stops claiming and
    its health turns, instead of serving the old file that no other process opens. It went on
    writing there, and the timers written to the new file by other processes never fired."""
    import os

    from timerwheel_c.durable.storage.errors import PermanentStoreError
    from timerwheel_c.durable.storage.sqlite import SQLiteStore, store as sqlite_store
    from timerwheel_c.durable.storage.store import Batch

    monkeypatch.setattr(sqlite_store, "FILE_CHECK_S", 0.0)
    path = tmp_path / "t.db"
    store = SQLiteStore(path)
    try:
        store.apply("p", Batch().put(b"k", b"before"))
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(f"{path}{suffix}"):
                os.unlink(f"{path}{suffix}")
        if how == "replaced":
            SQLiteStore(path).close()
        with pytest.raises(PermanentStoreError, match="deleted or replaced"):
            store.apply("p", Batch().put(b"k", b"after"))
        # The verdict stays: a retry within the next look's interval is refused too, never written
        # to the orphaned file (it was, for a second after each verdict).
        monkeypatch.setattr(sqlite_store, "FILE_CHECK_S", 3600.0)
        for _ in range(3):
            with pytest.raises(PermanentStoreError, match="deleted or replaced"):
                store.apply("p", Batch().put(b"k", b"after"))
        with pytest.raises(PermanentStoreError, match="deleted or replaced"):
            with store.own_write("p") as tx:
                tx.get(b"k")
    finally:
        store.close()



def test_a_sqlite_file_moved_away_under_an_idle_reader_is_found_by_its_reads_and_change_signal(tmp_path, monkeypatch):
    """The files moved away (a restore, an operator's mv) while a runner is idle: it only reads, and
    its change signal polls the old file, so the timers written at the path never fired and nothing
    said why. Now its reads raise PermanentStoreError naming the path, as its writes do, and its change
    signal rings once, with the verdict, so that the pass it starts raises even if the store's own
    look, at most once a second, is not due yet."""
    import os
    import threading

    from timerwheel_c.durable.storage.errors import PermanentStoreError
    from timerwheel_c.durable.storage.sqlite import SQLiteStore, store as sqlite_store
    from timerwheel_c.durable.storage.store import Batch
    from timerwheel_c.durable.timers import keys

    def move_away(path, to) -> None:
        to.mkdir()
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(f"{path}{suffix}"):
                os.rename(f"{path}{suffix}", to / f"{path.name}{suffix}")
        SQLiteStore(path).close()  # a new file at the path

    def reads(store) -> list:
        return [lambda: store.scan("p", b"", b"\xff", None, 10), lambda: store.get("p", b"k"),
                lambda: store.scan_shards([0], *keys.timer_range(), 10), store.partitions]

    monkeypatch.setattr(sqlite_store, "FILE_CHECK_S", 0.0)
    reader = SQLiteStore(tmp_path / "r.db")
    reader.apply("p", Batch().put(b"k", b"v"))
    move_away(tmp_path / "r.db", tmp_path / "r-moved")
    for read in reads(reader):
        with pytest.raises(PermanentStoreError, match="deleted or replaced"):
            read()
    reader.close()

    path = tmp_path / "t.db"
    store = SQLiteStore(path)
    rang = threading.Event()
    watcher = store.watch(rang.set)
    try:
        store.apply("p", Batch().put(b"k", b"v"))
        assert rang.wait(10)  # its own write, seen by the change signal
        rang.clear()
        move_away(path, tmp_path / "moved")
        assert rang.wait(10), "the change signal did not ring for the file moved away"
        monkeypatch.setattr(sqlite_store, "FILE_CHECK_S", 3600.0)  # the store's own look not due
        for read in reads(store):
            with pytest.raises(PermanentStoreError, match="deleted or replaced"):
                read()
    finally:
        watcher.close()
        store.close()


def test_a_sqlite_file_that_cannot_be_looked_at_for_a_moment_is_not_taken_for_replaced(tmp_path, monkeypatch):
    """A stat of the database file that fails for a moment (ESTALE on NFS, EIO) is no verdict: the
    write goes on, and the next look sees the same file. It was reported deleted or replaced."""
    import errno
    import os

    from timerwheel_c.durable.storage.sqlite import SQLiteStore, store as sqlite_store
    from timerwheel_c.durable.storage.store import Batch

    monkeypatch.setattr(sqlite_store, "FILE_CHECK_S", 0.0)
    store = SQLiteStore(tmp_path / "t.db")
    real_stat = os.stat

    def stale(path, *args, **kwargs):
        if os.fspath(path) == str(tmp_path / "t.db"):
            raise OSError(errno.ESTALE, "Stale file handle")
        return real_stat(path, *args, **kwargs)

    try:
        monkeypatch.setattr(os, "stat", stale)
        store.apply("p", Batch().put(b"k", b"1"))
        monkeypatch.setattr(os, "stat", real_stat)
        store.apply("p", Batch().put(b"k", b"2"))
        assert store.get("p", b"k") == b"2"
    finally:
        store.close()


@pytest.mark.parametrize("how", ["refused", "guard"])
def test_an_apply_many_of_one_batch_that_fails_writes_nothing_and_the_store_writes_on(durable_store, how):
    """apply_many of a single batch (how a runner commits one claim, or one outcome): a batch the
    server refuses is Refused, one whose guard fails PreconditionFailed, and none of its writes stays
    (on SQLite its transaction is rolled back whole, in place of a savepoint's); the next write
    commits as usual."""
    durable_store.apply(P, Batch().put(b"a", b"1"))
    if how == "refused":
        _refuse_writes_of(durable_store, REFUSED)
        (result,) = durable_store.apply_many(P, [Batch().require(Equals(b"a", b"1")).delete(b"a").put(b"x", b"1")
                                                 .put(b"bad", REFUSED)])
        assert isinstance(result, Refused) and isinstance(result.error, PermanentStoreError)
    else:
        (result,) = durable_store.apply_many(P, [Batch().put(b"x", b"1").require(Equals(b"a", b"2")).delete(b"a")])
        assert result == PreconditionFailed(b"a")
    assert dict(durable_store.scan(P, b"", b"\xff", limit=10).entries) == {b"a": b"1"}
    assert durable_store.apply_many(P, [Batch().require(Equals(b"a", b"1")).delete(b"a").put(b"y", b"2")]) == [Committed()]
    assert dict(durable_store.scan(P, b"", b"\xff", limit=10).entries) == {b"y": b"2"}

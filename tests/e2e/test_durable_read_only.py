"""The commands that only read (``timers list``, ``timers show``, ``schedules list``, ``fleet
status``) only read: no DDL, a PostgreSQL role with SELECT alone suffices, a database without a
store is refused with one line, and a SQLite file is opened read-only, so a file (and directory)
nobody may write can be listed and comes out unchanged."""
from __future__ import annotations

import os
import stat
import uuid

import pytest

from timerwheel_c.cli import main
from timerwheel_c.durable import Every, add_schedule, schedule
from timerwheel_c.durable.storage.open import open_store

DUE_MS = 4_102_444_800_000  # 2100-01-01: pending for the whole test
READ_COMMANDS = [["timers", "list", "--json"],
                 ["timers", "show", "--partition", "p", "--kind", "1", "--reference", "ro-timer"],
                 ["schedules", "list"], ["fleet", "status"]]


def _fill(url: str) -> None:
    with open_store(url) as store:
        schedule(store, "p", DUE_MS, 1, b"ro-timer", b"v")
        add_schedule(store, "p", "ro-schedule", Every(3600), 2)


def _snapshot(directory) -> dict:
    """Every file of ``directory`` by name, with its bytes and its mtime."""
    return {name: ((directory / name).read_bytes(), os.stat(directory / name).st_mtime_ns)
            for name in sorted(os.listdir(directory))}


def _python_as_unprivileged() -> tuple:
    """``(argv prefix, subprocess keywords)`` that run this Python's ``timerwheel_c`` as a user the
    file modes bind: this user, or when root (whom modes do not bind) the user ``nobody`` with the
    system's Python of this version (this interpreter may sit where ``nobody`` cannot read), which
    imports the installed package from its directory."""
    import shutil
    import subprocess
    import sys

    import timerwheel_c

    if os.geteuid() != 0:
        return [sys.executable, "-m", "timerwheel_c"], {}
    python = shutil.which(f"python{sys.version_info[0]}.{sys.version_info[1]}", path="/usr/bin:/usr/local/bin")
    if python is None:
        pytest.skip(f"running as root, and no system python{sys.version_info[0]}.{sys.version_info[1]} to run as nobody")
    site = os.path.dirname(os.path.dirname(os.path.abspath(timerwheel_c.__file__)))
    how = {"user": "nobody", "cwd": "/", "env": {"PATH": "/usr/bin:/bin", "PYTHONPATH": site}}
    probe = subprocess.run([python, "-c", "import timerwheel_c.durable"], capture_output=True, text=True, timeout=60, **how)
    if probe.returncode != 0:
        pytest.skip(f"running as root, and nobody cannot import the installed package: {probe.stderr.strip()[-200:]}")
    return [python, "-m", "timerwheel_c"], how


def test_a_read_only_sqlite_file_in_a_read_only_directory_is_listed_and_left_unchanged():
    """With the store file 0444 in a 0555 directory, every read-only command, run by a user the modes
    bind, lists it (exit 0, the timer and the schedule shown), and afterwards the directory holds the
    same files with the same bytes and mtimes: no ``-wal``/``-shm`` made, no schema write."""
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    argv, how = _python_as_unprivileged()
    directory = Path(tempfile.mkdtemp(prefix="timerwheel-ro-"))  # not under tmp_path, which only root may enter
    try:
        url = f"sqlite:///{directory / 'timers.db'}"
        _fill(url)
        before = _snapshot(directory)
        assert list(before) == ["timers.db"], before  # the writer closed it: no -wal left
        os.chmod(directory / "timers.db", stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        os.chmod(directory, stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
        for command in READ_COMMANDS:
            out = subprocess.run([*argv, *command, "--store", url], capture_output=True, text=True, timeout=60, **how)
            assert out.returncode == 0, out.stderr
            assert ("ro-schedule" if command[0] == "schedules" else "ro-timer" if command[0] == "timers" else "p") in out.stdout
        assert _snapshot(directory) == before
    finally:
        os.chmod(directory, 0o755)
        shutil.rmtree(directory)


def test_a_read_only_sqlite_open_sees_what_a_connected_writer_committed(tmp_path):
    """While a writer keeps the file open (its ``-wal`` exists, holding commits not yet checkpointed),
    a read-only open reads them too."""
    url = f"sqlite:///{tmp_path / 'timers.db'}"
    from timerwheel_c.durable import SQLiteStore, list_timers

    with SQLiteStore(tmp_path / "timers.db", checkpoint_interval_s=None) as writer:
        schedule(writer, "p", DUE_MS, 1, b"in-the-wal")
        assert os.path.exists(tmp_path / "timers.db-wal")  # the situation arose
        with open_store(url, read_only=True) as reader:
            assert [t.reference for t in list_timers(reader, "p")] == [b"in-the-wal"]


def test_a_read_only_sqlite_store_opened_before_any_writer_reads_what_writers_commit_later(tmp_path):
    """A read-only store kept open (the status page's) that was opened while no connection had the
    file, then read, still reads what a writer commits afterwards, before and after that writer
    closes: it used to read the file as immutable, for ever as it was when opened."""
    from timerwheel_c.durable import SQLiteStore, cancel, list_timers

    path = tmp_path / "timers.db"
    with SQLiteStore(path) as writer:
        schedule(writer, "p", DUE_MS, 1, b"first")
    assert not os.path.exists(f"{path}-wal")  # no connection has the file: the case at hand
    with SQLiteStore(path, read_only=True) as reader:
        assert [t.reference for t in list_timers(reader, "p")] == [b"first"]
        with SQLiteStore(path) as writer:
            schedule(writer, "p", DUE_MS + 1, 1, b"second")
            cancel(writer, "p", 1, b"first")
            assert [t.reference for t in list_timers(reader, "p")] == [b"second"]
            schedule(writer, "p", DUE_MS + 2, 1, b"third")
        assert [t.reference for t in list_timers(reader, "p")] == [b"second", b"third"]


def test_a_sqlite_file_without_a_store_is_refused_in_one_line_and_left_unchanged(tmp_path, capsys):
    """A SQLite database that holds no timerwheel_c store (another program's, or a typo'd path that
    exists) is refused by every read-only command: exit 2, one line saying "no timerwheel_c store
    here"; nothing is written to it."""
    import sqlite3

    path = tmp_path / "other.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (body TEXT)")
    db.close()
    before = _snapshot(tmp_path)
    for command in READ_COMMANDS:
        assert main([*command, "--store", f"sqlite:///{path}"]) == 2
        err = capsys.readouterr().err
        assert "no timerwheel_c store here" in err and len(err.strip().splitlines()) == 1, err
    assert _snapshot(tmp_path) == before


def test_schedules_list_on_a_missing_sqlite_file_creates_none(tmp_path, capsys):
    """``schedules list`` on a path with no file says so (exit 2) and creates no file, as the other
    read-only commands do."""
    assert main(["schedules", "list", "--store", f"sqlite:///{tmp_path / 'typo.db'}"]) == 2
    assert "no SQLite store at" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


@pytest.fixture
def reader_url(schema_url):
    """``(owner_url, reader_url)``: a store in a fresh schema, and the URL of a new role that may
    only SELECT from its tables (USAGE on the schema, nothing else); the role is dropped afterwards."""
    import psycopg
    from urllib.parse import urlsplit, urlunsplit

    _fill(schema_url)
    role = f"tw_reader_{uuid.uuid4().hex[:10]}"
    schema = schema_url.rsplit("search_path%3D", 1)[1]
    with psycopg.connect(schema_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        conn.execute(f"GRANT SELECT ON {schema}.timerwheel_kv, {schema}.timerwheel_kv_meta TO {role}")
    parts = urlsplit(schema_url)
    host = parts.netloc.rsplit("@", 1)[-1]
    yield schema_url, urlunsplit(parts._replace(netloc=f"{role}@{host}"))
    with psycopg.connect(schema_url, autocommit=True) as conn:
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


def test_a_select_only_role_runs_every_read_only_command(reader_url, capsys):
    """A PostgreSQL role with SELECT on the store's tables and nothing else (no CREATE on the schema)
    runs every read-only command (exit 0, the timer and the schedule shown): none runs DDL. A write
    through that role is refused, which proves the role is what the test says."""
    from timerwheel_c.durable.storage.errors import StoreError

    _owner, url = reader_url
    for command in READ_COMMANDS:
        assert main([*command, "--store", url]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert ("ro-schedule" if command[0] == "schedules" else "ro-timer" if command[0] == "timers" else "p") in out
    from timerwheel_c.durable.storage.store import Batch

    store = open_store(url)  # a store at this version opens with no DDL, whatever the role may write
    try:
        with pytest.raises(StoreError, match="permission denied"):
            store.apply("p", Batch().put(b"app/key", b"value"))
    finally:
        store.close()


def test_a_postgresql_database_without_a_store_is_refused_and_left_empty(schema_url, capsys):
    """A database (here: a schema on the search path) without our tables, as a typo'd database name
    gives, is refused by every read-only command in one line, "no timerwheel_c store here", and no
    table is created in it."""
    import psycopg

    for command in READ_COMMANDS:
        assert main([*command, "--store", schema_url]) == 2
        err = capsys.readouterr().err
        assert "no timerwheel_c store here" in err and len(err.strip().splitlines()) == 1, err
    with psycopg.connect(schema_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()").fetchone()[0] == 0


def test_the_status_page_without_actions_opens_no_store_into_another_database(tmp_path, capsys):
    """``timerwheel-c web`` without ``--web-actions`` only reads, as the read-only commands: on a
    SQLite database holding no timerwheel_c store it is refused in one line and writes nothing."""
    import sqlite3

    from timerwheel_c.durable.service.cli import make_page

    path = tmp_path / "other.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (body TEXT)")
    db.close()
    before = _snapshot(tmp_path)
    assert make_page("web", f"sqlite:///{path}", "127.0.0.1", False) is None
    err = capsys.readouterr().err
    assert "no timerwheel_c store here" in err and len(err.strip().splitlines()) == 1, err
    assert _snapshot(tmp_path) == before


def test_a_select_only_role_serves_the_status_page(reader_url):
    """A role with SELECT on the store's tables and nothing else serves the page without actions:
    it shows the store's timer (no DDL on opening)."""
    from timerwheel_c.durable.service.cli import make_page

    _owner, url = reader_url
    page = make_page("web", url, "127.0.0.1", False)
    assert page is not None
    status, _headers, body = page.respond("GET", "/?reference=ro-timer", "127.0.0.1")
    assert status == 200 and b"ro-timer" in body


def test_the_status_page_with_actions_creates_no_sqlite_store(tmp_path, capsys):
    """``timerwheel-c web --web-actions`` writes rows but never makes a store: on a fresh path no file
    is created, and a SQLite database holding no timerwheel_c store is refused in one line, "no
    timerwheel_c store here", and comes out unchanged. On a store, the page opens and can act."""
    import sqlite3

    from timerwheel_c.durable import requeue
    from timerwheel_c.durable.service.cli import make_page
    from timerwheel_c.durable.storage.sqlite import SQLiteStore
    from timerwheel_c.durable.storage.store import NoStoreError

    fresh = tmp_path / "fresh.db"
    assert make_page("web", f"sqlite:///{fresh}", "127.0.0.1", True) is None
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and not os.path.exists(fresh), err
    with pytest.raises(NoStoreError, match="no timerwheel_c store here"):
        SQLiteStore(fresh, create=False)
    assert os.listdir(tmp_path) == []
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (body TEXT)")
    db.close()
    before = _snapshot(tmp_path)
    assert make_page("web", f"sqlite:///{path}", "127.0.0.1", True) is None
    err = capsys.readouterr().err
    assert "no timerwheel_c store here" in err and len(err.strip().splitlines()) == 1, err
    assert _snapshot(tmp_path) == before
    url = f"sqlite:///{tmp_path / 'store.db'}"
    _fill(url)
    page = make_page("web", url, "127.0.0.1", True)
    assert page is not None
    try:
        assert page.actions and requeue(page.store, "p", None, 1, b"ro-timer")  # its store writes
    finally:
        page.close()


def test_the_status_page_with_actions_creates_no_postgresql_store(schema_url, capsys):
    """On a PostgreSQL database without our tables, ``timerwheel-c web --web-actions`` is refused in
    one line, "no timerwheel_c store here", and creates no table there."""
    import psycopg

    from timerwheel_c.durable.service.cli import make_page

    assert make_page("web", schema_url, "127.0.0.1", True) is None
    err = capsys.readouterr().err
    assert "no timerwheel_c store here" in err and len(err.strip().splitlines()) == 1, err
    with psycopg.connect(schema_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()").fetchone()[0] == 0

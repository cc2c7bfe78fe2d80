"""The timers' view (migration 10): what an operator's plain SQL (psql, the sqlite3 shell) reads from
it agrees with list_timers() on every column, for scheduled, retrying, parked and schedule-occurrence
rows, and leaves malformed and application rows out, on SQLite and PostgreSQL; a store of version 9
gains the view when opened, and a resharded PostgreSQL store keeps it. Nothing here waits on time:
every due time is a fixed Unix epoch ms."""
from __future__ import annotations

import contextlib
import os
import sqlite3
import struct
import uuid
from datetime import datetime, timezone

import pytest

from timerwheel_c.durable.storage.shards import shard_of
from timerwheel_c.durable.storage.store import Batch
from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.writer import list_timers, schedule

P = "orders"
DUE = 1_700_000_000_123  # 2023-11-14T22:13:20.123Z
_PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
_COLUMNS = ("partition", "shard", "kind", "reference", "due_at_ms", "due_at", "attempt", "state", "is_schedule",
            "original_due_at_ms", "original_due_at", "parked_at_ms", "parked_at")


class _Backend:
    """A store and an operator's own connection to its database, with the view's name."""

    def __init__(self, store, query, view, meta):
        self.store, self.query, self.view, self.meta = store, query, view, meta

    def rows(self) -> list:
        """Every row of the view as a dict of the columns both backends share (times as UTC datetimes)."""
        out = []
        for row in self.query(f"SELECT {', '.join(_COLUMNS)} FROM {self.view} ORDER BY state, due_at_ms"):
            d = dict(zip(_COLUMNS, row))
            d["reference"] = bytes(d["reference"])
            d["is_schedule"] = bool(d["is_schedule"])
            for name in ("due_at", "original_due_at", "parked_at"):
                if isinstance(d[name], str):  # SQLite's ISO 8601 text
                    d[name] = datetime.fromisoformat(d[name].replace("Z", "+00:00"))
            out.append(d)
        return out


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.skipif(
    not _PG_DSN, reason="set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to test PostgresStore"))])
def backend(request, tmp_path):
    if request.param == "sqlite":
        from timerwheel_c.durable.storage.sqlite import SQLiteStore

        path = tmp_path / "timers.db"
        store = SQLiteStore(path, shard_count=16)

        def query(text):
            with sqlite3.connect(path) as db:
                return db.execute(text).fetchall()
        yield _Backend(store, query, "timerwheel_timers", "timerwheel_meta")
        store.close()
        return
    import psycopg

    from bench.stores import dispose
    from timerwheel_c.durable.storage.postgres import PostgresStore

    table = f"timerwheel_view_{uuid.uuid4().hex[:12]}"
    store = PostgresStore(_PG_DSN, table=table, shard_count=16)

    def query(text):
        with psycopg.connect(_PG_DSN, autocommit=True) as conn:
            cur = conn.execute(text)
            return cur.fetchall() if cur.description else []
    yield _Backend(store, query, f"{table}_timers", f"{table}_meta")
    dispose(store)


def _write_timers(store) -> None:
    """Two scheduled timers (one with a reference that is not UTF-8), a retrying one, a parked one and a
    schedule's pending occurrence, plus a malformed timer row and an application row the view leaves out."""
    schedule(store, P, DUE, 7, b"order-1", b"v1")
    schedule(store, P, DUE + 5_000, 8, b"\xff\xfe", b"v2")
    retry = keys.backoff(DUE + 60_000, 7, 3, DUE - 1_000, b"order-2")
    parked_tk = keys.TimerKey(DUE - 2_000, 9, b"order-3", 5, DUE - 2_000)
    batch = (Batch().put(retry, b"v3")
             .put(keys.parked(DUE + 1, parked_tk), keys.parked_value("ValueError: no such order", b"v4"))
             .put(keys.timer(DUE + 9_000, 10, b"nightly", occurrence=True), b"")
             .put(b"Ticket/42", b"app"))
    for malformed in (keys.TAG + b"\x01",  # shorter than the header
                      keys.TAG + struct.pack(">QBB", DUE, 0, 0) + b"kind-0",
                      keys.TAG + struct.pack(">QBB", DUE, 7, 4) + b"variant-4",
                      keys.TAG + struct.pack(">QBBIQ", DUE, 7, 1, 0, DUE) + b"attempt-0",
                      keys.TAG + struct.pack(">QBB", DUE, 7, 1) + b"short"):  # backed off, no attempt
        batch.put(malformed, b"")
    batch.put(keys.parked(DUE + 2, keys.TimerKey(DUE, 9, b"cut", 1, DUE)), b"\x00\x09cut")  # its error cut short
    store.apply(P, batch)


def test_the_view_agrees_with_list_timers_on_every_column(backend):
    """Each pending timer is one row of the view whose columns are list_timers()'s (due time, kind,
    reference, attempt, state, parked time), the original due time and the occurrence flag its key holds,
    and the shard the store computed; the malformed row and the application row are not timers."""
    _write_timers(backend.store)
    timers = list_timers(backend.store, P)
    assert len(timers) == 5  # every kind of row the view decodes was written
    shard = shard_of(P, 16)
    original = {b"order-2": DUE - 1_000, b"order-3": DUE - 2_000}
    want = []
    for t in timers:
        orig = original.get(t.reference, t.due_at_ms)
        want.append({
            "partition": t.partition, "shard": shard, "kind": int(t.kind), "reference": t.reference,
            "due_at_ms": t.due_at_ms, "due_at": datetime.fromtimestamp(t.due_at_ms / 1000, timezone.utc),
            "attempt": t.attempt, "state": t.state, "is_schedule": t.reference == b"nightly",
            "original_due_at_ms": orig, "original_due_at": datetime.fromtimestamp(orig / 1000, timezone.utc),
            "parked_at_ms": t.parked_at_ms,
            "parked_at": None if t.parked_at_ms is None else datetime.fromtimestamp(t.parked_at_ms / 1000, timezone.utc),
        })
    got = backend.rows()
    assert [{**r, "due_at_ms": int(r["due_at_ms"]), "original_due_at_ms": int(r["original_due_at_ms"]),
             "parked_at_ms": None if r["parked_at_ms"] is None else int(r["parked_at_ms"])} for r in got] == \
        sorted(want, key=lambda r: (r["state"], r["due_at_ms"]))
    assert {r["state"] for r in got} == {"scheduled", "retrying", "parked"}


def test_a_store_of_version_9_gains_the_view_when_opened(backend):
    """A store recorded at version 9 (its view dropped, as before this migration) is brought to the
    current version by the next open, and the view then lists the timers written before."""
    _write_timers(backend.store)
    backend.store.close()
    backend.query(f"DROP VIEW {backend.view}")
    backend.query(f"UPDATE {backend.meta} SET value = '9' WHERE name = 'schema_version'")
    with pytest.raises(Exception, match=backend.view):
        backend.query(f"SELECT count(*) FROM {backend.view}")  # the situation the upgrade must mend
    backend.store = _reopened(backend.store)
    [(version,)] = backend.query(f"SELECT value FROM {backend.meta} WHERE name = 'schema_version'")
    assert int(version) >= 10
    assert sorted(r["reference"] for r in backend.rows()) == sorted(t.reference for t in list_timers(backend.store, P))


def _reopened(store):
    """A new store object on ``store``'s (closed) database."""
    return type(store)(store.path) if hasattr(store, "path") else type(store)(_PG_DSN, table=store.table)


@pytest.mark.skipif(not _PG_DSN, reason="set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to test PostgresStore")
def test_a_resharded_postgres_store_keeps_its_view(backend):
    """reshard() drops the shard column the view reads and adds it again: the view is made again with
    it, and shows the new shards; reference_text is the reference where it is UTF-8, NULL where not."""
    if backend.view == "timerwheel_timers":
        pytest.skip("SQLite's reshard rewrites the column in place")
    _write_timers(backend.store)
    backend.store.reshard(3)
    assert {r["shard"] for r in backend.rows()} == {shard_of(P, 3)}
    texts = dict(backend.query(f"SELECT reference, reference_text FROM {backend.view}"))
    assert {bytes(k): v for k, v in texts.items()} == {
        b"order-1": "order-1", b"\xff\xfe": None, b"order-2": "order-2", b"order-3": "order-3", b"nightly": "nightly"}


@contextlib.contextmanager
def _monitoring_role(backend):
    """``(conn, role)``: an autocommit connection as the test's user and a new role without login,
    dropped with what it was granted when the block ends (after a RESET ROLE)."""
    import psycopg

    if backend.view == "timerwheel_timers":
        pytest.skip("SQLite has no roles")
    role = f"tw_monitor_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(_PG_DSN, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} NOLOGIN")
        try:
            yield conn, role
        finally:
            conn.execute("RESET ROLE")
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


@pytest.mark.skipif(not _PG_DSN, reason="set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to test PostgresStore")
def test_a_role_with_select_on_the_view_alone_reads_it(backend):
    """A monitoring role granted SELECT on the view, and nothing on the store's table, reads the
    timers through it (the view reads the table with its owner's rights), as the docs tell operators."""
    import psycopg

    _write_timers(backend.store)
    with _monitoring_role(backend) as (conn, role):
        conn.execute(f"GRANT SELECT ON {backend.view} TO {role}")
        conn.execute(f"SET ROLE {role}")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(f"SELECT count(*) FROM {backend.store.table}")  # the table itself is out of reach
        assert conn.execute(f"SELECT count(*) FROM {backend.view}").fetchone() == (5,)


@pytest.mark.skipif(not _PG_DSN, reason="set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to test PostgresStore")
def test_a_reshard_keeps_what_was_granted_on_the_view(backend):
    """reshard() makes the view again: a monitoring role's SELECT on it (and PUBLIC's, with the grant
    option kept) holds afterwards, where it used to be dropped with the old view."""
    _write_timers(backend.store)
    with _monitoring_role(backend) as (conn, role):
        conn.execute(f"GRANT SELECT ON {backend.view} TO {role} WITH GRANT OPTION")
        conn.execute(f"GRANT REFERENCES ON {backend.view} TO PUBLIC")
        backend.store.reshard(3)
        granted = conn.execute("SELECT has_table_privilege(%s, %s, 'SELECT WITH GRANT OPTION'), "
                               "has_table_privilege('public', %s, 'REFERENCES')",
                               (role, backend.view, backend.view)).fetchone()
        assert granted == (True, True)
        conn.execute(f"SET ROLE {role}")
        assert conn.execute(f"SELECT count(*) FROM {backend.view}").fetchone() == (5,)

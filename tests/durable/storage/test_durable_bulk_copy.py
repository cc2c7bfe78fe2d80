"""A large batch that only puts new keys (a chunk of schedule_many): every backend applies it as any
batch, all or nothing on its guards; PostgreSQL writes it with one COPY (storage/postgres/copy.py) and
falls back to its set-based apply when some key is present. Deterministic: one thread, no clock."""
from __future__ import annotations

import os
import uuid

import pytest

from timerwheel_c.durable.storage.store import Absent, Batch, Committed, PreconditionFailed

P = "p"
ROWS = 600  # timer-like rows: above pg_copy.MIN_ROWS, so PostgreSQL takes its COPY path


def _insert_only(n: int, tag: bytes = b"") -> Batch:
    """``n`` puts of rows ``k<i>`` and ``n`` of rows ``n<i>``, the ``n<i>`` guarded Absent, as a chunk
    of schedule_many guards its identity rows."""
    batch = Batch()
    for i in range(n):
        batch.require(Absent(b"n%05d" % i))
    for i in range(n):
        batch.put(b"k%05d" % i, b"v%s%d" % (tag, i))
    for i in range(n):
        batch.put(b"n%05d" % i, b"k%05d" % i)
    return batch


def _rows(store) -> dict:
    return dict(store.scan(P, b"", b"\xff", limit=100_000).entries)


def test_a_large_insert_only_batch_is_all_or_nothing_on_its_guards(durable_store):
    """New keys: every row is written. One guarded key present: PreconditionFailed naming it, nothing
    written. One unguarded key present (a stray timer row): it is overwritten, every row written."""
    assert durable_store.apply(P, _insert_only(ROWS)) == Committed()
    assert len(_rows(durable_store)) == 2 * ROWS
    other = "q"
    durable_store.apply(other, Batch().put(b"n00300", b"taken"))
    assert durable_store.apply(other, _insert_only(ROWS)) == PreconditionFailed(b"n00300")
    assert dict(durable_store.scan(other, b"", b"\xff", limit=100_000).entries) == {b"n00300": b"taken"}
    durable_store.apply(other, Batch().delete(b"n00300").put(b"k00300", b"stray"))
    assert durable_store.apply(other, _insert_only(ROWS, b"x")) == Committed()
    written = dict(durable_store.scan(other, b"", b"\xff", limit=100_000).entries)
    assert len(written) == 2 * ROWS and written[b"k00300"] == b"vx300"


def test_postgres_writes_a_large_insert_only_batch_with_one_copy_and_small_ones_without(monkeypatch):
    """PostgresStore.apply sends an insert-only batch of at least MIN_ROWS puts through COPY (True:
    committed there), a smaller one or one with another guard through its set-based apply; a COPY
    that meets a present key reports it (False), nothing written, and apply still answers rightly."""
    dsn = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
    if not dsn:
        pytest.skip("set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to test PostgresStore")
    from bench.stores import dispose
    from timerwheel_c.durable.storage.postgres import copy as pg_copy, store as postgres
    from timerwheel_c.durable.storage.store import Equals

    copies: list = []

    def spy(*args):
        copies.append(copied := pg_copy.copy_new_rows(*args))
        return copied

    monkeypatch.setattr(postgres, "copy_new_rows", spy)
    store = postgres.PostgresStore(dsn, table=f"timerwheel_test_{uuid.uuid4().hex[:16]}")
    try:
        assert not pg_copy.copyable(_insert_only(pg_copy.MIN_ROWS // 2 - 1))
        assert not pg_copy.copyable(_insert_only(ROWS).require(Equals(b"k00001", b"v1")))
        assert store.apply(P, _insert_only(ROWS)) == Committed() and copies == [True]
        assert store.apply(P, _insert_only(ROWS)) == PreconditionFailed(b"n00000") and copies == [True, False]
        assert len(_rows(store)) == 2 * ROWS
        assert store.apply("q", _insert_only(10)) == Committed() and copies == [True, False]
    finally:
        dispose(store)


def test_the_copy_payload_is_postgresql_binary_copy_format():
    """The payload: PostgreSQL's 11-byte signature, two zero header words, per row a field count of 3
    and each field's length word before its bytes, then the -1 trailer."""
    from timerwheel_c.durable.storage.postgres.copy import payload

    data = payload("pé", [(b"k", b""), (b"\x00\xff", b"vv")])
    signature = b"PGCOPY\n\xff\r\n\x00"
    rows = (b"\x00\x03" + b"\x00\x00\x00\x03p\xc3\xa9" + b"\x00\x00\x00\x01k" + b"\x00\x00\x00\x00"
            + b"\x00\x03" + b"\x00\x00\x00\x03p\xc3\xa9" + b"\x00\x00\x00\x02\x00\xff" + b"\x00\x00\x00\x02vv")
    assert data == signature + b"\x00" * 8 + rows + b"\xff\xff"


def test_a_copy_waits_for_the_lock_of_its_partitions_shard_as_every_guarded_commit_does():
    """The COPY of an insert-only batch takes the advisory lock every guarded commit on its partition
    takes (its shard's), so it cannot slip between another transaction's guard and its write: while
    another session holds that lock, the batch waits, and lands once the lock is let go."""
    dsn = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
    if not dsn:
        pytest.skip("set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to test PostgresStore")
    import threading

    import psycopg

    from bench.stores import dispose
    from timerwheel_c.durable.storage.postgres import PostgresStore
    from waiting import wait_until

    store = PostgresStore(dsn, table=f"tw_copy_{uuid.uuid4().hex[:12]}")
    try:
        with psycopg.connect(dsn) as holder:
            holder.execute("SELECT pg_advisory_xact_lock(%s)", (store.shard_lock(P),))
            results: list = []
            writer = threading.Thread(target=lambda: results.append(store.apply(P, _insert_only(ROWS))))
            writer.start()
            # only a wait on this holder counts: other tests (other xdist workers) share the server
            wait_until(lambda: holder.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND %s = ANY(pg_blocking_pids(pid))", (holder.info.backend_pid,)).fetchone()[0] >= 1,
                "the COPY waiting on the shard's lock")
            # read on the holder's session: the store's own connection is the one waiting
            assert results == [] and holder.execute(f"SELECT count(*) FROM {store.table}").fetchone() == (0,)
            holder.rollback()
        writer.join(30)
        assert results == [Committed()] and len(_rows(store)) == 2 * ROWS
    finally:
        dispose(store)

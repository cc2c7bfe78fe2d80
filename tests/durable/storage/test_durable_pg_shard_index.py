"""PostgreSQL's index by shard (schema version 16) holds only the rows passes read by shard
(``SHARD_SPACE``: the parked rows through the timer rows), as SQLite's does from its version 14: a
name's row, or an application's, is written without an entry in it. A store of version 15, whose
index held every row, is narrowed in place by its next open; a reshard narrows the rebuilt index
again; a read by shard within ``SHARD_SPACE`` is an index scan of it, as a generic plan too (the
statement's own terms imply the index's), and a read outside it is answered, by one scan of the
table. Needs TIMERWHEEL_C_TEST_PG_DSN."""
from __future__ import annotations

import os
import uuid

import pytest

psycopg = pytest.importorskip("psycopg")

PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
pytestmark = pytest.mark.skipif(not PG_DSN, reason="TIMERWHEEL_C_TEST_PG_DSN is not set")

DUE = 1_700_000_000_000
KIND = 0x31
PARTITIONS = ["orders/1", "orders/2", "users/7"]


@pytest.fixture
def store():
    from bench.stores import dispose
    from timerwheel_c.durable.storage.postgres import PostgresStore

    store = PostgresStore(PG_DSN, table=f"timerwheel_shardidx_{uuid.uuid4().hex[:12]}")
    yield store
    dispose(store)


def _index_def(store) -> str:
    return store._connection().execute("SELECT pg_get_indexdef(to_regclass(%s))",
                                       (f"{store.table}_shard",)).fetchone()[0]


def _index_entries(store) -> int:
    """The entries of the index by shard, counted by an index-only scan of it (a partial index holds
    no others): vacuumed first, so that the visibility map spares the heap."""
    conn = store._connection()
    conn.execute(f"VACUUM {store.table}")
    with conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")
        conn.execute("SET LOCAL enable_bitmapscan = off")
        plan = "\n".join(r[0] for r in conn.execute(
            f"EXPLAIN SELECT count(*) FROM {store.table} WHERE shard >= 0 "
            "AND key >= '\\x0050'::bytea AND key < '\\x0055'::bytea").fetchall())
        assert f"{store.table}_shard" in plan, plan
        return conn.execute(f"SELECT count(*) FROM {store.table} WHERE shard >= 0 "
                            "AND key >= '\\x0050'::bytea AND key < '\\x0055'::bytea").fetchone()[0]


def _fill(store) -> dict:
    """Named timers, a parked one, a schedule and an application's row in each partition; returns
    ``{partition: [timer keys]}`` of the timer rows written."""
    from timerwheel_c.durable.storage.store import Batch
    from timerwheel_c.durable.timers import keys
    from timerwheel_c.durable.timers.schedules import add_schedule
    from timerwheel_c.durable.timers.triggers import Every
    from timerwheel_c.durable.timers.writer import schedule

    for p in PARTITIONS:
        for i in range(5):
            schedule(store, p, DUE + i, KIND, b"r%d" % i, b"v")
        store.apply(p, Batch().put(b"Ticket/42", b"app"))
    add_schedule(store, PARTITIONS[0], "beat", Every(60, start=DUE), KIND)
    return {p: [k for k, _ in store.scan(p, *keys.timer_range(), None, 100).entries] for p in PARTITIONS}


def test_the_index_by_shard_holds_only_the_rows_read_by_shard(store):
    """Created at version 16: the index's own WHERE is SHARD_SPACE's bounds, and it holds the timer and
    schedule rows, not the identity rows nor the applications' (an index-only scan counts them)."""
    from timerwheel_c.durable.storage.store import SHARD_SPACE

    assert SHARD_SPACE == (b"\x00P", b"\x00U")  # the bounds the SQL files spell
    assert "WHERE ((key >= '\\x0050'::bytea) AND (key < '\\x0055'::bytea))" in _index_def(store)
    _fill(store)
    rows = store._connection().execute(f"SELECT key FROM {store.table}").fetchall()
    in_space = [k for (k,) in rows if SHARD_SPACE[0] <= bytes(k) < SHARD_SPACE[1]]
    assert 0 < len(in_space) < len(rows)  # identity rows and "Ticket/42" lie outside
    assert _index_entries(store) == len(in_space)


@pytest.mark.parametrize("generic", [False, True])
def test_a_read_by_shard_within_the_space_is_an_index_scan_of_it(store, generic):
    """The due read of a pass (scan_shards over the timer space) is an index scan of the partial index,
    with the server's custom plan and with a generic one (the parameters unknown when it plans: the
    statement's own terms imply the index's)."""
    from timerwheel_c.durable.storage.postgres.arrays import Int4Array, Int8Array
    from timerwheel_c.durable.timers import keys

    _fill(store)
    conn = store._connection()
    with conn.transaction():
        conn.execute("SET LOCAL plan_cache_mode = " + ("force_generic_plan" if generic else "force_custom_plan"))
        plan = "\n".join(r[0] for r in conn.execute(
            psycopg.sql.SQL("EXPLAIN ") + store.query("scan_shards"),
            (Int4Array([0, 1]), Int8Array([10, 10]), *keys.due_range(DUE + 10)), binary=True).fetchall())
    assert f"Index Scan using {store.table}_shard" in plan, plan
    assert "Seq Scan" not in plan, plan


def test_reads_by_shard_find_every_row_within_and_outside_the_space(store):
    """scan_shards answers the same rows as a partition's own reads, in the timer space (the index) and
    across the whole key space (a range outside SHARD_SPACE: one scan of the table), in key order per
    shard, each shard to its own limit."""
    from timerwheel_c.durable.storage.shards import shard_of
    from timerwheel_c.durable.timers import keys

    written = _fill(store)
    shards = sorted({shard_of(p, store.shard_count) for p in PARTITIONS}) + [
        s for s in range(store.shard_count) if s not in {shard_of(p, store.shard_count) for p in PARTITIONS}][:2]
    for start, end in (keys.timer_range(), (b"", b"\xff"), (b"Ticket/", b"Ticket0")):
        got = store.scan_shards(shards, start, end, 1000)
        for shard, rows in zip(shards, got):
            expect = sorted((bytes(k), p, bytes(v)) for p in PARTITIONS if shard_of(p, store.shard_count) == shard
                            for k, v in store.scan(p, start, end, None, 1000).entries)
            assert [(bytes(k), p, bytes(v)) for p, k, v in rows] == expect
        limits = [1 + i % 3 for i in range(len(shards))]
        assert store.scan_shards(shards, start, end, limits) == [rows[:n] for rows, n in zip(got, limits)]
    timers = store.scan_shards(shards, *keys.timer_range(), 1000)
    assert sorted(bytes(k) for rows in timers for _, k, _ in rows) == sorted(k for ks in written.values() for k in ks)


def test_a_store_of_version_15_narrows_its_index_when_opened_and_keeps_its_timers(store):
    """A store recorded at version 15, its index by shard over every row (as version 8 made it), is
    brought to version 16 (and on to the current one) by its next open, under the schema lock: the
    index then holds only the rows read by shard, and every timer is still read by shard, found by
    name and fired."""
    from psycopg import sql

    from timerwheel_c.durable.storage.postgres import SCHEMA_VERSION, PostgresStore
    from timerwheel_c.durable.storage.sqlfiles import migrations
    from timerwheel_c.durable.timers import keys
    from timerwheel_c.durable.timers.registry import Done, TimerRegistry
    from timerwheel_c.durable.timers.runner import run_due
    from timerwheel_c.durable.timers.writer import get_timer

    written = _fill(store)
    conn = store._connection()
    conn.execute(sql.SQL("DROP INDEX {}").format(store._names["shard_index"]))
    full = next(text for version, text in migrations("postgres") if version == 8)
    conn.execute(sql.SQL(full).format(**store._names, shard_count=sql.Literal(store.shard_count)))
    assert " WHERE " not in _index_def(store)  # the index as versions 8 to 15 have it
    conn.execute(f"UPDATE {store.table}_meta SET value = '15' WHERE name = 'schema_version'")
    upgraded = PostgresStore(PG_DSN, table=store.table)
    try:
        assert SCHEMA_VERSION >= 16
        assert upgraded._connection().execute(f"SELECT value FROM {store.table}_meta WHERE name = 'schema_version'"
                                              ).fetchone()[0] == str(SCHEMA_VERSION)
        assert " WHERE ((key >= '\\x0050'::bytea) AND (key < '\\x0055'::bytea))" in _index_def(upgraded)
        found = upgraded.scan_every_shard(*keys.timer_range(), 1000)
        assert sorted(bytes(k) for rows in found for _, k, _ in rows) == sorted(k for ks in written.values() for k in ks)
        assert get_timer(upgraded, "users/7", KIND, b"r3").due_at_ms == DUE + 3
        registry = TimerRegistry()
        registry.handler(KIND)(lambda ctx, timer: Done())
        assert run_due(upgraded, "users/7", registry, DUE + 10).fired == 5
        assert upgraded.get("users/7", b"Ticket/42") == b"app"
    finally:
        upgraded.close()


def test_a_reshard_keeps_the_index_narrow(store):
    """reshard() rebuilds the shard column and its index (version 8's statements), then narrows the
    index again (version 16's): every row is read by shard at the new count."""
    from timerwheel_c.durable.storage.shards import shard_of
    from timerwheel_c.durable.timers import keys

    written = _fill(store)
    store.reshard(7)
    assert " WHERE ((key >= '\\x0050'::bytea) AND (key < '\\x0055'::bytea))" in _index_def(store)
    found = store.scan_shards(list(range(7)), *keys.timer_range(), 1000)
    for shard, rows in enumerate(found):
        assert all(shard_of(p, 7) == shard for p, _, _ in rows)
    assert sorted(bytes(k) for rows in found for _, k, _ in rows) == sorted(k for ks in written.values() for k in ks)
    apps = store.scan_shards(list(range(7)), b"Ticket/", b"Ticket0", 10)  # outside SHARD_SPACE
    assert [[(p, bytes(k)) for p, k, _ in rows] for rows in apps] == [
        [(p, b"Ticket/42") for p in sorted(PARTITIONS) if shard_of(p, 7) == s] for s in range(7)]

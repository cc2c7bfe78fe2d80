"""The row writes a fired timer costs on PostgreSQL, counted by the server itself (pg_stat_user_tables'
n_tup_ins, n_tup_upd and n_tup_del of the store's tables): its claim moves the row to its backoff key
with one UPDATE of the key (no DELETE and INSERT) and leaves its identity row naming the scheduled key,
and its outcome deletes both rows: three row writes per fire, whether the partition is served alone
(run_due, apply_many) or with others in one statement (claim_due_across and commit_across, apply_sets).

Deterministic: it counts tuples, never time. The store's own connection flushes its counters
(pg_stat_force_next_flush, PostgreSQL 15) before the counts are read on that same connection, and
every due time is a fixed Unix epoch ms. Needs TIMERWHEEL_C_TEST_PG_DSN."""
from __future__ import annotations

import os

import pytest

from timerwheel_c.durable.timers.registry import Done, TimerRegistry
from timerwheel_c.durable.timers.runner import RunReport, claim_due_across, commit_across, fire, run_due
from timerwheel_c.durable.timers.tick import TickBudget
from timerwheel_c.durable.timers.writer import schedule

psycopg = pytest.importorskip("psycopg")

PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
pytestmark = pytest.mark.skipif(not PG_DSN, reason="TIMERWHEEL_C_TEST_PG_DSN is not set")

DUE = 1_700_000_000_000  # 2023-11-14T22:13:20Z
NOW = DUE + 60_000
KIND = 0x31
FIRES = 40  # per partition
WRITES_PER_FIRE = 3  # the claim's move, the outcome's two deletes
PER_FIRE = {"ins": 0, "upd": 1, "del": 2}


@pytest.fixture
def store():
    from pg_tables import counted_store

    with counted_store(PG_DSN, "timerwheel_writes") as store:
        yield store


def _row_writes(store) -> dict:
    """``{"ins": n, "upd": n, "del": n}`` of the store's tables, as the server counts them now."""
    conn = store._connection()
    # The counters of this backend's own writes reach the shared statistics when it next goes idle:
    # forced, they are there once this statement has returned, whatever the flush interval.
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute("SELECT sum(n_tup_ins), sum(n_tup_upd), sum(n_tup_del) FROM pg_stat_user_tables "
                       "WHERE relname = %s OR relname = %s", (store.table, f"{store.table}_meta")).fetchone()
    return dict(zip(("ins", "upd", "del"), (int(n or 0) for n in row)))


def _registry() -> TimerRegistry:
    registry = TimerRegistry()
    registry.handler(KIND)(lambda ctx, timer: Done())
    return registry


def _schedule(store, partitions) -> None:
    for partition in partitions:
        for i in range(FIRES):
            schedule(store, partition, DUE + i, KIND, b"r%03d" % i, b"v")


def _per_fire(before: dict, after: dict, fired: int) -> dict:
    return {what: (after[what] - before[what]) / fired for what in before}


def test_a_fired_timer_costs_three_row_writes_served_alone(store):
    """run_due on one partition (apply_many): every timer fires, and the server counted one UPDATE for
    the claim's move and two DELETEs per fire, no INSERT and no write to the identity row."""
    _schedule(store, ["p"])
    before = _row_writes(store)
    report = run_due(store, "p", _registry(), NOW, TickBudget(1000, 1000, 1000, 60_000))
    after = _row_writes(store)
    assert report.fired == FIRES
    per_fire = _per_fire(before, after, FIRES)
    assert per_fire == PER_FIRE, per_fire
    assert sum(per_fire.values()) <= WRITES_PER_FIRE


def test_a_fired_timer_costs_three_row_writes_served_across_partitions(store):
    """claim_due_across and commit_across over three partitions (one apply_sets statement each way, the
    path of a service's pass): the same writes per fire as a partition served alone."""
    partitions = ["a", "b", "c"]
    _schedule(store, partitions)
    registry, budget = _registry(), TickBudget(1000, 1000, 1000, 60_000)
    before = _row_writes(store)
    claims = claim_due_across(store, [(p, budget, None) for p in partitions], registry, NOW)
    assert [c.error for c in claims] == [None] * len(partitions)
    settled = {p: [(c, fire(store, p, NOW, c, RunReport())) for c in cl.timers] for p, cl in zip(partitions, claims)}
    reports = commit_across(store, settled)
    after = _row_writes(store)
    fired = sum(r.fired for r in reports.values())
    assert fired == FIRES * len(partitions)
    per_fire = _per_fire(before, after, fired)
    assert per_fire == PER_FIRE, per_fire
    assert sum(per_fire.values()) <= WRITES_PER_FIRE


def test_a_store_of_version_10_upgrades_to_moving_claims_when_opened(store):
    """A store recorded at version 10, its functions those of before (a claim deletes and inserts), is
    brought to the current version by the next open, under the schema lock, and a fire then costs the
    three writes; the timers written before the upgrade fire."""
    from psycopg import sql

    from timerwheel_c.durable.storage.postgres import PostgresStore
    from timerwheel_c.durable.storage.sqlfiles import migrations

    _schedule(store, ["p"])
    old = dict(migrations("postgres"))
    conn = store._connection()
    conn.execute(sql.SQL("DROP FUNCTION {}").format(store._names["apply_sets"]))  # a later signature
    for version in (5, 7):  # the functions as version 10 left them
        conn.execute(sql.SQL(old[version]).format(**store._names))
    conn.execute(f"UPDATE {store.table}_meta SET value = '10' WHERE name = 'schema_version'")
    before = _row_writes(store)
    assert run_due(store, "p", _registry(), NOW, TickBudget(1, 1000, 1000, 60_000)).fired == 1
    assert sum(_per_fire(before, _row_writes(store), 1).values()) == 4  # the situation the upgrade mends
    upgraded = PostgresStore(PG_DSN, table=store.table)
    try:
        assert _version(upgraded) == str(max(old))
        _assert_the_others_fire_at_three_writes(upgraded)
    finally:
        upgraded.close()


def test_a_store_of_version_11_upgrades_to_claims_that_keep_the_identity_row_when_opened(store):
    """A store recorded at version 11, one timer claimed the way version 11 claims (its identity row
    pointed at the claimed key, a fourth row write), is brought to the current version by the next
    open, under the schema lock (which a process of version 11 then refuses to open). That timer is
    still found and cancelled by name, and the others fire at three writes each."""
    from timerwheel_c.durable.storage.postgres import SCHEMA_VERSION, PostgresStore
    from timerwheel_c.durable.storage.store import Batch, Equals
    from timerwheel_c.durable.timers import keys
    from timerwheel_c.durable.timers.writer import cancel, get_timer

    _schedule(store, ["p"])
    store._connection().execute(f"UPDATE {store.table}_meta SET value = '11' WHERE name = 'schema_version'")
    scheduled = keys.timer(DUE, KIND, b"r000")
    claimed = keys.backoff(NOW + 5000, KIND, 1, DUE, b"r000")
    assert store.apply("p", Batch().require(Equals(scheduled, b"v")).delete(scheduled).put(claimed, b"v")
                       .put(keys.identity(KIND, b"r000"), claimed)).__class__.__name__ == "Committed"
    upgraded = PostgresStore(PG_DSN, table=store.table)
    try:
        assert _version(upgraded) == str(SCHEMA_VERSION)
        assert get_timer(upgraded, "p", KIND, b"r000").attempt == 1
        assert cancel(upgraded, "p", KIND, b"r000") is True
        _assert_the_others_fire_at_three_writes(upgraded)
    finally:
        upgraded.close()


def _assert_the_others_fire_at_three_writes(store) -> None:
    """Every timer but the one a test fired or cancelled fires in one pass, at :data:`PER_FIRE` each."""
    before = _row_writes(store)
    report = run_due(store, "p", _registry(), NOW, TickBudget(1000, 1000, 1000, 60_000))
    assert report.fired == FIRES - 1
    assert _per_fire(before, _row_writes(store), FIRES - 1) == PER_FIRE


def _version(store) -> str:
    return store._connection().execute(f"SELECT value FROM {store.table}_meta WHERE name = 'schema_version'"
                                       ).fetchone()[0]


@pytest.mark.parametrize("path", ["apply_many", "apply_across"])
def test_a_move_leaves_the_rows_a_delete_and_a_put_leave(store, path):
    """A batch that consumes a row and puts its value under another key leaves the rows the delete and
    the put would, on the loop (apply_many) and in the set-based statement (apply_across over two
    partitions): moved when the new key is free (one UPDATE, no INSERT), overwritten when a row holds
    it (the put's upsert, the consumed row deleted), and nothing written when the guard fails. The
    set-based statement takes every move's key on trust first: a key that holds a row fails the
    primary key and undoes that attempt, whose updates the server still counts, and the second
    attempt probes each key."""
    from timerwheel_c.durable.storage.store import Batch, Committed, Equals, PreconditionFailed

    for p in ("a", "b"):
        store.apply(p, Batch().put(b"K1", b"V").put(b"K2", b"V").put(b"X", b"old").put(b"K3", b"V"))
    batches = [Batch().require(Equals(b"K1", b"V")).delete(b"K1").put(b"M1", b"V"),  # a free key: moved
               Batch().require(Equals(b"K2", b"V")).delete(b"K2").put(b"X", b"V"),  # a taken key: overwritten
               Batch().require(Equals(b"K3", b"other")).delete(b"K3").put(b"M3", b"other")]  # its guard fails
    before = _row_writes(store)
    if path == "apply_many":
        results = [r for p in ("a", "b") for r in store.apply_many(p, batches)]
    else:
        results = store.apply_across([(p, b) for p in ("a", "b") for b in batches])
    after = _row_writes(store)
    assert [type(r) for r in results] == [Committed, Committed, PreconditionFailed] * 2
    for p in ("a", "b"):
        assert dict(store.scan(p, b"", b"\xff", limit=10).entries) == {b"M1": b"V", b"X": b"V", b"K3": b"V"}
    # per partition: the move (an update), the overwrite (an update) and the consumed row's delete; in the
    # set-based statement also the undone attempt's moves (one or two per partition, as far as the server
    # got before the taken key)
    writes = {what: n / 2 for what, n in _per_fire(before, after, 1).items()}
    if path == "apply_many":
        assert writes == {"ins": 0, "upd": 2, "del": 1}
    else:
        assert writes["ins"] == 0 and writes["del"] == 1 and 2 < writes["upd"] <= 4, writes

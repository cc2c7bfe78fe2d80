"""The PostgreSQL tables the tests borrow (tests/pg_tables.py) isolate them as a table of their own did:
a table given back is lent again empty, with the meta rows and wake trigger of a new store, and one
whose schema a test changed is dropped instead, never lent again. These run on the server itself, on a
pool of their own, with no timing in them."""
from __future__ import annotations

import os

import pytest

from timerwheel_c.durable.storage.store import Batch
from timerwheel_c.durable.timers.keys import declare_signals

PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
pytestmark = pytest.mark.skipif(not PG_DSN, reason="set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to test PostgresStore")


@pytest.fixture
def pool():
    from pg_tables import TablePool

    pool = TablePool(PG_DSN)
    yield pool
    pool.close()


def _catalog(table: str) -> tuple:
    """(meta rows, wake trigger definitions, whether the table exists) of ``table``, read by the server."""
    import psycopg

    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] is None:
            return None, None, False
        meta = conn.execute(f"SELECT name, value FROM {table}_meta ORDER BY name").fetchall()
        triggers = conn.execute("SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = to_regclass(%s) "
                                "AND NOT tgisinternal ORDER BY tgname", (table,)).fetchall()
        return meta, triggers, True


def test_a_table_given_back_is_lent_again_empty_with_the_meta_and_trigger_of_a_new_store(pool):
    """Rows, labels and a declared change signal (which rewrites the wake trigger and adds a meta row)
    are all gone when the same table is lent again; first it is checked that each was really there."""
    from timerwheel_c.durable.storage.postgres import PostgresStore

    name = pool.take()
    new = _catalog(name)
    with PostgresStore(PG_DSN, table=name) as store:
        store.apply("p", Batch().put(b"k", b"v"))
        store.record_labels({"kind:1": "reminder"})
        declare_signals(store)
    used = _catalog(name)
    assert used[0] != new[0] and used[1] != new[1]  # the test left a label, patterns and another trigger
    pool.give_back(name)
    assert pool.take() == name
    assert _catalog(name) == new
    with PostgresStore(PG_DSN, table=name) as store:
        assert store.partitions() == [] and store.labels() == {}


@pytest.mark.parametrize("change", ["reshard", "own function", "grant", "dropped"])
def test_a_table_whose_schema_a_test_changed_is_dropped_and_never_lent_again(pool, change):
    """A reshard (a rebuilt column and view), a function named after the table, a grant, or the table
    dropped by the test: TRUNCATE would not undo it, so the next take makes a new table instead and the
    changed one is gone with everything named after it."""
    import psycopg

    from timerwheel_c.durable.storage.postgres import PostgresStore

    name = pool.take()
    with PostgresStore(PG_DSN, table=name) as store, psycopg.connect(PG_DSN, autocommit=True) as conn:
        if change == "reshard":
            store.reshard(3)
        elif change == "own function":
            conn.execute(f"CREATE FUNCTION {name}_own() RETURNS int LANGUAGE sql AS 'SELECT 1'")
        elif change == "grant":
            conn.execute(f"GRANT SELECT ON {name} TO PUBLIC")
        else:
            conn.execute(f"DROP TABLE {name} CASCADE")
    pool.give_back(name)
    assert pool.take() != name
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        left = conn.execute("SELECT relname FROM pg_class WHERE starts_with(relname, %s) UNION ALL "
                            "SELECT proname FROM pg_proc WHERE starts_with(proname, %s)", (name, name)).fetchall()
    assert left == []

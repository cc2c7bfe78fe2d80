"""The benchmarks' store helpers: ``dispose`` of a PostgresStore leaves nothing of it on the server,
whatever functions its schema version made. Needs TIMERWHEEL_C_TEST_PG_DSN."""
from __future__ import annotations

import os
import uuid

import pytest

pytest.importorskip("psycopg")

PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
pytestmark = pytest.mark.skipif(not PG_DSN, reason="TIMERWHEEL_C_TEST_PG_DSN is not set")


def test_dispose_drops_every_object_named_after_the_table():
    import psycopg

    from bench.stores import OWNED_BY_TABLE, dispose
    from timerwheel_c.durable import schedule
    from timerwheel_c.durable.storage.postgres import PostgresStore

    table = f"timerwheel_dispose_{uuid.uuid4().hex[:12]}"
    store = PostgresStore(PG_DSN, table=table)
    schedule(store, "p", 2_000_000_000_000, 1, b"ref")
    left = ("SELECT relname::text FROM pg_class WHERE " + OWNED_BY_TABLE.format(name="relname", space="relnamespace")
            + " UNION ALL SELECT proname::text FROM pg_proc WHERE "
            + OWNED_BY_TABLE.format(name="proname", space="pronamespace"))
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        made = [name for (name,) in conn.execute(left, {"t": table})]
        assert f"{table}_write_sets" in made and f"{table}_meta" in made
        dispose(store)
        assert conn.execute(left, {"t": table}).fetchall() == []

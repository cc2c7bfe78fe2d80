"""A PostgresStore behind a connection pooler (PgBouncer, the test's own, in front of the shared
server): refused at open, naming the cause, in transaction and statement mode, where a store's
sessions are not its own (a fleet's advisory locks, LISTEN, session settings and prepared statements
all broke: two runners owned every shard, or none did); served in session mode."""
from __future__ import annotations

import os
import uuid

import pytest

from pg_cluster import pgbouncer

PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
pytestmark = pytest.mark.skipif(not PG_DSN, reason="no TIMERWHEEL_C_TEST_PG_DSN")


@pytest.mark.parametrize("pool_mode", ["transaction", "statement"])
def test_a_store_behind_a_pooler_that_shares_sessions_is_refused_by_name(pool_mode):
    from timerwheel_c.durable.storage.errors import PermanentStoreError
    from timerwheel_c.durable.storage.postgres import PostgresStore

    with pgbouncer(PG_DSN, pool_mode) as url:
        for read_only in (False, True):
            with pytest.raises(PermanentStoreError, match="pooler in transaction or statement mode.*session mode"):
                PostgresStore(url, table=f"tw_pool_{uuid.uuid4().hex[:10]}", read_only=read_only, create=not read_only)


def test_a_store_behind_a_pooler_in_session_mode_is_served():
    from timerwheel_c.durable import get_timer, schedule
    from timerwheel_c.durable.storage.postgres import PostgresStore
    from bench.stores import dispose

    with pgbouncer(PG_DSN, "session") as url:
        store = PostgresStore(url, table=f"tw_pool_{uuid.uuid4().hex[:10]}")
        try:
            schedule(store, "p", 2_000_000_000_000, 1, b"pooled")
            assert get_timer(store, "p", 1, b"pooled").due_at_ms == 2_000_000_000_000
        finally:
            dispose(store)


def test_a_store_behind_a_full_session_pool_opens_unchecked(monkeypatch):
    """A session pool of one server session: the check's second connection gets no session (PgBouncer
    queues it, for minutes by default), so the check gives up after its wait and the store opens and
    writes. The open waited for the pool's query_wait_timeout, then failed. The next store opened on
    the same connection string is not checked again (each open waited the check's wait again)."""
    from timerwheel_c.durable import get_timer, schedule
    from timerwheel_c.durable.storage.postgres import PostgresStore, pooler
    from bench.stores import dispose

    checks: list = []
    real_open = pooler.open_session
    monkeypatch.setattr(pooler, "open_session", lambda dsn: checks.append(dsn) or real_open(dsn))
    table = f"tw_pool_{uuid.uuid4().hex[:10]}"
    try:
        with pgbouncer(PG_DSN, "session", pool_size=1) as url:
            with PostgresStore(url, table=table) as store:
                schedule(store, "p", 2_000_000_000_000, 1, b"one-session")
                assert get_timer(store, "p", 1, b"one-session") is not None
            assert len(checks) == 2  # the check's two sessions
            with PostgresStore(url, table=table) as store:
                assert get_timer(store, "p", 1, b"one-session") is not None
            assert len(checks) == 2
    finally:
        dispose(PostgresStore(PG_DSN, table=table))  # on the server itself: the pool's one session is the store's

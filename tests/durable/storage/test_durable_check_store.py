"""A DSN or URL passed where a store goes is a TypeError that says what to do, on every path that takes
a store, and never shows the password it carries."""
from __future__ import annotations

import pytest

from timerwheel_c.durable import DurableContext, DurableTimerService, SQLiteStore, TimerRegistry, cancel, schedule
from timerwheel_c.durable.storage.store import check_store

SECRET = "s3cr3t-pw"
DSNS = [f"postgresql://app:{SECRET}@db.example/timers", f"host=db user=app password={SECRET} dbname=timers",
        f"postgresql://app@db/timers?password={SECRET}".encode()]


def _ownership(store):
    pytest.importorskip("psycopg")
    from timerwheel_c.durable.storage.postgres.ownership import PartitionOwnership

    return PartitionOwnership(store)


def _holders(store):
    pytest.importorskip("psycopg")
    from timerwheel_c.durable.storage.postgres.ownership import holders

    return holders(store)


TAKERS = {
    "check_store": check_store,
    "DurableTimerService": lambda s: DurableTimerService(s, TimerRegistry(), ["p"]),
    "schedule": lambda s: schedule(s, "p", 1_700_000_000_000, 1, b"r"),
    "cancel": lambda s: cancel(s, "p", 1, b"r"),
    "DurableContext": lambda s: DurableContext(s, "execution"),
    "PartitionOwnership": _ownership,
    "holders": _holders,
}


@pytest.mark.parametrize("dsn", DSNS, ids=["url", "keywords", "bytes"])
@pytest.mark.parametrize("taker", list(TAKERS))
def test_a_dsn_where_a_store_goes_is_a_type_error_without_its_password(taker, dsn):
    """Each function and constructor that takes a store raises TypeError naming what it got, with the
    password masked, whatever form the DSN has."""
    with pytest.raises(TypeError, match="Store") as raised:
        TAKERS[taker](dsn)
    assert SECRET not in str(raised.value) and "***" in str(raised.value)


def test_a_url_given_to_sqlite_store_is_refused_without_its_password():
    """SQLiteStore(url) points at open_store and masks the URL's password."""
    with pytest.raises(ValueError, match="open_store") as raised:
        SQLiteStore(DSNS[0])
    assert SECRET not in str(raised.value)

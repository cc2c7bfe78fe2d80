"""A refusal of every write by the store as a whole (a PostgreSQL server set read-only, as during a
failover or maintenance; a full disk) is transient: the runner backs off the whole pass, logs one
WARNING for the episode, quarantines no row, and fires the timers within seconds of writes coming
back. Only a refusal of one row's own content quarantines that row.

Run on a real PostgreSQL cluster of this module's own, made read-only with ``ALTER SYSTEM SET
default_transaction_read_only`` (restored however the test ends): never on the shared test server,
whose other sessions (another pytest-xdist worker's tests) it would make read-only too. Timing
assertions are liveness bounds only; the service's time is a ManualClock the test advances."""
from __future__ import annotations

import logging
import threading

import pytest

from timerwheel_c.durable import DurableTimerService, TimerRegistry, list_timers, open_store, schedule
from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerKind
from timerwheel_c.durable.timers.timing import ManualClock, Timing
from pg_cluster import fresh_schema_url, throwaway_cluster
from waiting import LIVENESS_S, advance_until, wait_until

KIND = 0xE7


class Recorded(TimerHandler):
    """Done at once; records each reference with the ms it fired at by ``clock``'s wall clock."""

    kind = TimerKind(KIND)
    max_attempts = 1  # "fires at most once": a store-wide refusal must not use the one attempt up

    def __init__(self, clock: ManualClock):
        self.clock = clock
        self.fired: list = []
        self.lock = threading.Lock()

    def fire(self, ctx, timer):
        with self.lock:
            self.fired.append((timer.reference, self.clock.wall_ns() // 1_000_000))
        return Done()


@pytest.fixture(scope="module")
def own_server():
    """The DSN of this module's own PostgreSQL cluster (skips without the server binaries)."""
    with throwaway_cluster() as (dsn, _):
        yield dsn


@pytest.fixture
def schema_url(own_server):
    """A fresh schema on ``own_server`` and a URL whose sessions use it (dropped afterwards)."""
    with fresh_schema_url(own_server) as url:
        yield url


@pytest.fixture
def server_read_only(own_server):
    """``server_read_only(on)``: set ``own_server``'s ``default_transaction_read_only`` for every
    session (ALTER SYSTEM and a reload), waiting until a new session sees it; reset at teardown."""
    import psycopg

    def switch(on: bool) -> None:
        with psycopg.connect(own_server, autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET default_transaction_read_only = {'on' if on else 'off'}")
            conn.execute("SELECT pg_reload_conf()")
        want = "on" if on else "off"
        wait_until(lambda: _setting() == want, f"default_transaction_read_only = {want}")

    def _setting() -> str:
        with psycopg.connect(own_server, autocommit=True) as conn:
            return conn.execute("SHOW default_transaction_read_only").fetchone()[0]

    try:
        yield switch
    finally:
        with psycopg.connect(own_server, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET default_transaction_read_only")
            conn.execute("SELECT pg_reload_conf()")


def test_timers_due_while_the_server_refuses_writes_fire_once_writes_come_back(schema_url, server_read_only, caplog):
    """Five timers (one attempt each) fall due while the server refuses every write: none fires then
    (a claim is a write), the service logs one WARNING for its passes, and once writes come back all
    five fire at the end of the backoff, none parked or quarantined. Before, each was "neither
    claimed nor quarantined" and skipped for 600 s. Time is a ManualClock, and the backoff a minute:
    the due time, the failed passes and the backoff pass only as the test advances the clock, and
    nothing fires while writes are back but the backoff is not over."""
    clock = ManualClock()
    handler = Recorded(clock)
    store = open_store(schema_url)
    service = DurableTimerService(store, TimerRegistry().register(handler), ["p"], max_sleep_s=1.0, clock=clock,
                                  wall_ns=clock.wall_ns, timing=Timing(backoff_base_s=60.0, backoff_max_s=60.0))
    try:
        with caplog.at_level(logging.WARNING, logger="timerwheel_c.durable"):
            service.start()
            due_ms = clock.wall_ns() // 1_000_000 + 1000
            for i in range(5):
                schedule(store, "p", due_ms, KIND, b"t%d" % i)
            server_read_only(True)
            # Steps of the backoff: each wakes the next retry (steps of 1 s took 60 polls a retry).
            advance_until(clock, lambda: service.transient_errors >= 3, 60.0,
                          "three failed passes after the due time")  # the refusal arose, and was retried
            assert clock.wall_ns() // 1_000_000 > due_ms and handler.fired == []
            server_read_only(False)
            wait_until(lambda: clock.waiting >= 1, "the service asleep in its backoff")
            assert handler.fired == []  # writes are back, the backoff is not over
            clock.advance(60.0)
            wait_until(lambda: len(handler.fired) == 5, "all five timers to fire", LIVENESS_S)
        assert sorted(r for r, _ in handler.fired) == [b"t%d" % i for i in range(5)]
        assert all(fired_ms >= due_ms for _, fired_ms in handler.fired)
        warnings = [r.getMessage() for r in caplog.records
                    if r.levelno == logging.WARNING and "transient store error" in r.getMessage()]
        assert len(warnings) == 1 and "read-only transaction" in warnings[0], warnings
        assert "retrying in 60.00 s" in warnings[0], warnings  # the Timing's backoff, not the default 50 ms
        assert list_timers(store, "p", state="parked") == []
    finally:
        service.stop(timeout=10)
        store.close()


def test_a_commit_the_server_refuses_is_retried_after_its_backoff_on_the_clock(schema_url, server_read_only, caplog):
    """A handler's outcome reaches its commit while the server refuses writes: the commit fails as
    transient and backs off (a minute, by the Timing, on a ManualClock). Once writes are back nothing
    commits until the test advances the clock past that minute; then the outcome commits, once."""
    clock = ManualClock()
    release = threading.Event()

    class Held(Recorded):
        def fire(self, ctx, timer):
            release.wait(LIVENESS_S)
            return Recorded.fire(self, ctx, timer)

    handler = Held(clock)
    store = open_store(schema_url)
    schedule(store, "p", clock.wall_ns() // 1_000_000 - 10, KIND, b"c")
    service = DurableTimerService(store, TimerRegistry().register(handler), ["p"], max_sleep_s=1.0, clock=clock,
                                  wall_ns=clock.wall_ns, timing=Timing(backoff_base_s=60.0, backoff_max_s=60.0))
    try:
        with caplog.at_level(logging.WARNING, logger="timerwheel_c.durable"):
            service.start()
            wait_until(lambda: service.in_flight == 1, "the handler running")
            server_read_only(True)
            release.set()
            wait_until(lambda: any("commit on partition 'p' failed" in r.getMessage() for r in caplog.records),
                       "the commit refused")
        server_read_only(False)
        assert service.fired == 0 and handler.fired  # fired, its outcome waiting out the backoff
        clock.advance(59.0)
        wait_until(lambda: clock.waiting >= 1, "the service asleep on the clock")
        assert service.fired == 0  # writes are back, the backoff is not over
        clock.advance(1.0)
        wait_until(lambda: service.fired == 1, "the outcome committed", LIVENESS_S)
        assert list_timers(store, "p") == [] and len(handler.fired) == 1
    finally:
        release.set()
        service.stop(timeout=10)
        store.close()


def test_a_read_only_server_error_is_transient_and_refuses_no_single_batch(schema_url, server_read_only):
    """``apply_many`` on a read-only server raises TransientStoreError for the call as a whole (SQLSTATE
    25006), rather than a Refused result per batch, which the runner would take for the rows' own fault."""
    from timerwheel_c.durable.storage.errors import TransientStoreError
    from timerwheel_c.durable.storage.store import Batch

    store = open_store(schema_url)
    try:
        store.apply("p", Batch().put(b"k0", b"v"))
        server_read_only(True)
        with pytest.raises(TransientStoreError, match="25006"):
            store.apply_many("p", [Batch().put(b"k1", b"v"), Batch().put(b"k2", b"v")])
    finally:
        store.close()


def test_a_full_sqlite_database_is_transient_for_the_whole_call(tmp_path):
    """A SQLite database that cannot grow (SQLITE_FULL: a full disk, here its ``max_page_count``
    reached) fails ``apply_many`` as a whole with a TransientStoreError, not with a Refused result
    per batch, which the runner would take for the rows' own fault and quarantine them."""
    from timerwheel_c.durable import SQLiteStore
    from timerwheel_c.durable.storage.errors import TransientStoreError
    from timerwheel_c.durable.storage.store import Batch

    with SQLiteStore(tmp_path / "full.db") as store:
        store.apply("p", Batch().put(b"k0", b"v"))
        # The store's own connection: max_page_count is a setting of the connection that writes.
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(TransientStoreError, match="SQLITE_FULL"):
            store.apply_many("p", [Batch().put(b"k1", b"v" * 20_000), Batch().put(b"k2", b"v")])
        assert store.get("p", b"k2") is None  # the call as a whole wrote nothing

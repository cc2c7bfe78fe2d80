"""On PostgreSQL, a lock held on one partition holds up that partition alone: while a caller's open
transaction holds partition ``a`` (a ``schedule(..., conn=app)`` not yet committed), or another
session holds a row lock on the effect row that ``a``'s handler writes, the runner's claims and
commits of partition ``b`` go on, and ``a``'s timers fire once the lock is gone.

The property is an order of events, not a speed: every timer of ``b`` has fired and its outcome
committed (its row gone from the store) while the holder's transaction is still open. The hold
lasts far longer than the runner's bounded lock wait and its retries (``HOLD_S``), and the test
first checks that the situation arose (``a``'s due timer did not fire during the hold). The
service's time is a ManualClock: the timers fall due only as the test advances it, once the lock is
held and the runner has started, so no real time passes waiting for a due time.
A bound on lock waits that is not a positive int of ms is refused by name."""
from __future__ import annotations

import os
import threading
import time

import pytest

from timerwheel_c.durable import Batch, DurableTimerService, TimerRegistry, get_timer, schedule
from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerKind
from timerwheel_c.durable.timers.timing import ManualClock, Timing
from waiting import advance_until, wall_ms

PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
needs_pg = pytest.mark.skipif(not PG_DSN, reason="set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to test PostgresStore")

KIND = 0xE8
HOLD_S = 10.0  # how long the holder keeps partition a's lock: far above the runner's lock wait
STEP_S = 0.2  # the service's clock moves this far each time it sleeps: b's due times are 0.2 s apart
EFFECT = b"effect/a"
LOCK_WAIT_MS = 50  # the runner's bound on each lock wait, ms: far below HOLD_S


class Effects(TimerHandler):
    """Done with one effect row per partition (``effect/<partition>``); records what fired."""

    kind = TimerKind(KIND)

    def __init__(self):
        self.fired: list = []
        self.lock = threading.Lock()

    def fire(self, ctx, timer):
        with self.lock:
            self.fired.append((ctx.partition, timer.reference))
        return Done(Batch().put(b"effect/" + ctx.partition.encode(), timer.reference))


@pytest.fixture
def pg_store(pg_table):
    from timerwheel_c.durable.storage.postgres import PostgresStore

    store = PostgresStore(PG_DSN, table=pg_table)
    yield store
    store.close()


@needs_pg
@pytest.mark.parametrize("hold", ["caller_transaction", "effect_row_lock"])
@pytest.mark.parametrize("separate_commits", [False, True])
def test_a_lock_on_one_partition_holds_up_only_that_partition(pg_store, hold, separate_commits):
    """The runner has a store object of its own, as a runner process would: the test's reads never
    queue behind a call of the runner's that waits on the lock. Its lock waits are bounded at 50 ms
    (``Timing.lock_wait_ms``), not the default 250 ms: every pass waits that bound out on a in real
    time, twice a step of the clock (2.4 s a case at 250 ms), and the property holds whatever the bound."""
    import psycopg
    from timerwheel_c.durable.storage.postgres import PostgresStore

    store = pg_store
    handler = Effects()
    store.apply("a", Batch().put(EFFECT, b"before"))  # a's effect row exists, so a session can lock it
    clock = ManualClock()
    due = clock.wall_ns() // 1_000_000 + 1500  # comes only as the test advances the clock, lock held
    schedule(store, "a", due, KIND, b"a0")
    b_refs = [b"b%d" % i for i in range(5)]
    for i, ref in enumerate(b_refs):
        schedule(store, "b", due + 200 * i, KIND, ref)
    app = psycopg.connect(PG_DSN)  # not autocommit: its transaction stays open until commit()
    runner_store = PostgresStore(PG_DSN, table=store.table)
    try:
        if hold == "caller_transaction":
            schedule(store, "a", clock.wall_ns() // 1_000_000, KIND, b"in-tx", conn=app)
        else:
            app.execute(f"SELECT value FROM {store.table} WHERE partition = 'a' AND key = %s FOR UPDATE", (EFFECT,))
        held_until = time.monotonic() + HOLD_S
        with DurableTimerService(runner_store, TimerRegistry().register(handler), ["a", "b"], fleet=False,
                                 separate_commits=separate_commits, clock=clock, wall_ns=clock.wall_ns,
                                 timing=Timing(lock_wait_ms=LOCK_WAIT_MS)) as svc:
            # Both of the runner's connections (claims; commits, when apart) wait on a lock that long at most.
            assert svc.claimer.passes.store._lock_wait_ms == LOCK_WAIT_MS
            assert svc.committer._sibling is not None and svc.committer._sibling._lock_wait_ms == LOCK_WAIT_MS
            advance_until(clock, lambda: all(get_timer(store, "b", KIND, r) is None for r in b_refs), STEP_S,
                          "b's timers to fire and commit", timeout=max(0.0, held_until - time.monotonic()))
            assert time.monotonic() < held_until  # b committed while a's lock was still held
            assert clock.wall_ns() // 1_000_000 >= due  # a's timer was due during the hold
            assert get_timer(store, "a", KIND, b"a0") is not None  # a was held up: the situation arose
            assert store.get("b", b"effect/b") is not None
            app.commit()
            advance_until(clock, lambda: get_timer(store, "a", KIND, b"a0") is None, STEP_S,
                          "a's timer to fire once the lock is gone")
            if hold == "caller_transaction":
                advance_until(clock, lambda: get_timer(store, "a", KIND, b"in-tx") is None, STEP_S,
                              "the caller's timer to fire")
    finally:
        app.close()
        runner_store.close()
    fired = sorted(handler.fired)
    assert len(fired) == len(set(fired)), fired  # each timer's outcome committed once


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-5, ValueError), (True, TypeError), (0.5, TypeError),
                                        ("250ms", TypeError)])
def test_a_lock_wait_bound_that_is_no_positive_int_is_refused_by_name(tmp_path, bad, error):
    from timerwheel_c.durable import SQLiteStore

    with SQLiteStore(tmp_path / "t.db") as store, pytest.raises(error, match=f"lock_wait_ms .*{bad!r}"):
        store.open_sibling(lock_wait_ms=bad)


@needs_pg
def test_a_sibling_with_a_lock_wait_bound_gives_up_a_held_partition_with_a_transient_error(pg_store):
    """A write to a partition whose lock another transaction holds fails after the bound with a
    TransientStoreError (SQLSTATE 55P03) and writes nothing; the same write goes through once the
    lock is gone."""
    import psycopg
    from timerwheel_c.durable.storage.errors import TransientStoreError

    bounded = pg_store.open_sibling(lock_wait_ms=100)
    try:
        with psycopg.connect(PG_DSN) as app:
            schedule(pg_store, "a", wall_ms(), KIND, b"held", conn=app)
            with pytest.raises(TransientStoreError, match="55P03"):
                bounded.apply("a", Batch().put(b"k", b"v"))
            app.rollback()
        bounded.apply("a", Batch().put(b"k", b"v"))
        assert pg_store.get("a", b"k") == b"v"
    finally:
        bounded.close()

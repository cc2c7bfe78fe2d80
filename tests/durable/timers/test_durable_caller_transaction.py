"""Timers written in the caller's own transaction (``conn=``), on a real SQLite file and on the shared
PostgreSQL server: the timer exists if and only if the caller commits, together with the caller's own
row; a rollback leaves nothing and fires nothing; runners are woken by the commit and never see the
timer before it; a refused write (TimerExists, a store error) undoes only itself and leaves the
caller's transaction usable; the same through a psycopg AsyncConnection; every sqlite3 transaction
mode; and a connection that cannot carry the write is refused by name.

Timing assertions are only "not fired while the transaction is open" (checked after the runner has
done several passes, so it had the chance) and "fired within a generous liveness bound", never speeds.
"""
from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
import threading
import uuid

import pytest

from timerwheel_c.durable import (Batch, DurableTimerService, SQLiteStore, TimerExists, TimerRegistry, aio, cancel,
                                  get_timer, reschedule, schedule)
from timerwheel_c.durable.storage.errors import PermanentStoreError
from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerKind
from bench.stores import dispose
from timerwheel_c.durable.timers.timing import ManualClock
from waiting import LIVENESS_S, advance_until, wait_until, wall_ms

P = "tx"
KIND = 0xE7
PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
needs_pg = pytest.mark.skipif(not PG_DSN, reason="no TIMERWHEEL_C_TEST_PG_DSN")


class Recorder(TimerHandler):
    """Done at once; records each fired reference with the wall ms it fired at and its value."""

    kind = TimerKind(KIND)

    def __init__(self):
        self.fired: list = []

    def fire(self, ctx, timer):
        self.fired.append((timer.reference, wall_ms(), timer.value))
        return Done()


class Backend:
    """A store, a way to open the caller's own connections to its database, and the caller's
    ``orders`` table beside it (the application row that commits with the timer)."""

    def __init__(self, name: str, tmp_path):
        self.name = name
        self._conns: list = []
        if name == "sqlite":
            self.path = str(tmp_path / "tx.db")
            self.store = SQLiteStore(self.path)
            self.orders = "orders"
            with sqlite3.connect(self.path) as db:
                db.execute("CREATE TABLE orders (id TEXT PRIMARY KEY)")
        else:
            import psycopg

            from timerwheel_c.durable.storage.postgres import PostgresStore

            self.store = PostgresStore(PG_DSN, table=f"tw_tx_{uuid.uuid4().hex[:12]}")
            self.orders = f"{self.store.table}_orders"
            with psycopg.connect(PG_DSN, autocommit=True) as db:
                db.execute(f"CREATE TABLE {self.orders} (id text PRIMARY KEY)")

    def connect(self, **kwargs):
        """The caller's connection in its library's default mode (sqlite3's legacy implicit
        transactions; psycopg's non-autocommit), or as ``kwargs`` say."""
        if self.name == "sqlite":
            conn = sqlite3.connect(self.path, **kwargs)
        else:
            import psycopg

            conn = psycopg.connect(PG_DSN, **kwargs)
        self._conns.append(conn)
        return conn

    def insert_order(self, conn, order_id: str) -> None:
        mark = "?" if self.name == "sqlite" else "%s"
        conn.execute(f"INSERT INTO {self.orders} (id) VALUES ({mark})", (order_id,))

    def orders_committed(self) -> list:
        """The order ids committed, read on a fresh connection."""
        if self.name == "sqlite":
            with sqlite3.connect(self.path) as db:
                return sorted(r[0] for r in db.execute("SELECT id FROM orders"))
        import psycopg

        with psycopg.connect(PG_DSN, autocommit=True) as db:
            return sorted(r[0] for r in db.execute(f"SELECT id FROM {self.orders}"))

    def close(self) -> None:
        for conn in self._conns:
            conn.close()
        if self.name == "postgres":
            import psycopg

            with psycopg.connect(PG_DSN, autocommit=True) as db:
                db.execute(f"DROP TABLE IF EXISTS {self.orders}")
        dispose(self.store)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=needs_pg)])
def backend(request, tmp_path):
    b = Backend(request.param, tmp_path)
    yield b
    b.close()


def service(store, **kwargs) -> tuple:
    handler = Recorder()
    return DurableTimerService(store, TimerRegistry().register(handler), [P], **kwargs), handler


def test_commit_makes_the_timer_and_the_callers_row_exist_and_the_commit_wakes_the_runner(backend):
    """An idle runner (max_sleep_s an hour, so only the store's change signal can wake it); the
    caller inserts its order and schedules the order's timer, due 200 ms ahead, in one transaction
    and commits: both exist, and the timer fires within the liveness bound, never before its due."""
    svc, handler = service(backend.store, max_sleep_s=3600)
    with svc:
        # Its first pass done, the runner sleeps for the hour: the commit alone can wake it (the change
        # signal is open before the first pass, and a ring after it is never lost).
        wait_until(lambda: svc.passes >= 1, "the runner's first pass")
        conn = backend.connect()
        backend.insert_order(conn, "o1")
        due = wall_ms() + 200
        schedule(backend.store, P, due, KIND, b"o1", b"expire", conn=conn)
        conn.commit()
        assert backend.orders_committed() == ["o1"]
        # Pending, or on a loaded machine already past its 200 ms and fired (with its value, below).
        pending = get_timer(backend.store, P, KIND, b"o1")
        assert pending is not None and pending.value == b"expire" or handler.fired
        wait_until(lambda: handler.fired, "the committed timer to fire")
    ((reference, fired_at, value),) = handler.fired
    assert reference == b"o1" and value == b"expire" and fired_at >= due


def test_rollback_leaves_nothing_and_fires_nothing(backend):
    """The caller schedules a timer already due (and cancels none), with its order, then rolls back:
    neither exists, and a runner passing every 100 ms fires nothing over ten passes and more. The
    runner's time is a ManualClock the test advances 100 ms each time the runner sleeps on it."""
    clock = ManualClock()
    svc, handler = service(backend.store, max_sleep_s=0.1, clock=clock)
    with svc:
        conn = backend.connect()
        backend.insert_order(conn, "o1")
        schedule(backend.store, P, wall_ms() - 1_000, KIND, b"o1", conn=conn)
        conn.rollback()
        passes = svc.passes
        advance_until(clock, lambda: svc.passes >= passes + 10, 0.1, "ten more passes of the runner")
    assert handler.fired == []
    assert get_timer(backend.store, P, KIND, b"o1") is None
    assert backend.orders_committed() == []


def test_a_due_timer_never_fires_while_the_transaction_is_open_and_fires_after_commit(backend):
    """The caller schedules a timer already due and keeps its transaction open while the runner
    (passing every 100 ms) does several passes: it fires nothing. After the commit it fires."""
    svc, handler = service(backend.store, max_sleep_s=0.1)
    with svc:
        conn = backend.connect()
        schedule(backend.store, P, wall_ms() - 1_000, KIND, b"late", conn=conn)
        passes = svc.passes
        wait_until(lambda: svc.passes >= passes + 5, "five passes while the transaction is open")
        assert handler.fired == [], "a timer fired before its transaction committed"
        conn.commit()
        wait_until(lambda: handler.fired, "the timer to fire after the commit")
    assert [r for r, _, _ in handler.fired] == [b"late"]


def test_timer_exists_inside_the_callers_transaction_leaves_it_usable(backend):
    """With a timer of that name committed, ``if_exists="error"`` raises TimerExists inside the
    caller's transaction; the caller goes on in the same transaction (another order, a reschedule)
    and commits: its two orders and the move commit, the timer's value is the first one's."""
    due = wall_ms() + 3_600_000
    schedule(backend.store, P, due, KIND, b"o1", b"first")
    conn = backend.connect()
    backend.insert_order(conn, "o1")
    with pytest.raises(TimerExists) as raised:
        schedule(backend.store, P, due + 5, KIND, b"o1", b"second", if_exists="error", conn=conn)
    assert raised.value.timer.value == b"first"
    backend.insert_order(conn, "o2")
    assert reschedule(backend.store, P, due + 10, KIND, b"o1", conn=conn)
    conn.commit()
    assert backend.orders_committed() == ["o1", "o2"]
    timer = get_timer(backend.store, P, KIND, b"o1")
    assert (timer.value, timer.due_at_ms) == (b"first", due + 10)


def test_cancel_and_reschedule_commit_and_roll_back_with_the_caller(backend):
    """A rolled-back cancel and reschedule change nothing; committed ones take effect."""
    due = wall_ms() + 3_600_000
    schedule(backend.store, P, due, KIND, b"a")
    schedule(backend.store, P, due, KIND, b"b")
    conn = backend.connect()
    assert cancel(backend.store, P, KIND, b"a", conn=conn)
    assert reschedule(backend.store, P, due + 1, KIND, b"b", conn=conn)
    conn.rollback()
    assert get_timer(backend.store, P, KIND, b"a").due_at_ms == due
    assert get_timer(backend.store, P, KIND, b"b").due_at_ms == due
    assert cancel(backend.store, P, KIND, b"a", conn=conn)
    assert reschedule(backend.store, P, due + 1, KIND, b"b", conn=conn)
    conn.commit()
    assert get_timer(backend.store, P, KIND, b"a") is None
    assert get_timer(backend.store, P, KIND, b"b").due_at_ms == due + 1


def test_writes_see_the_callers_own_uncommitted_writes(backend):
    """Within one transaction a schedule, then a schedule with ``if_exists="keep"``, then a cancel,
    each see the one before (they read through the caller's connection): keep returns the first
    key, the cancel removes it, and after the commit nothing is pending."""
    conn = backend.connect()
    due = wall_ms() + 3_600_000
    key = schedule(backend.store, P, due, KIND, b"r", conn=conn)
    assert schedule(backend.store, P, due + 1, KIND, b"r", if_exists="keep", conn=conn) == key
    assert cancel(backend.store, P, KIND, b"r", conn=conn)
    conn.commit()
    assert get_timer(backend.store, P, KIND, b"r") is None


def test_the_callers_row_and_text_factories_do_not_reach_the_write(backend):
    """A caller's connection that returns rows as dicts (psycopg's ``dict_row``; a sqlite3
    ``row_factory`` building dicts, and ``text_factory=bytes``) still carries the write: it reads on
    cursors of its own."""
    if backend.name == "sqlite":
        conn = backend.connect()
        conn.row_factory = lambda cursor, row: {c[0]: v for c, v in zip(cursor.description, row)}
        conn.text_factory = bytes
    else:
        from psycopg.rows import dict_row

        conn = backend.connect(row_factory=dict_row)
    due = wall_ms() + 60_000
    key = schedule(backend.store, P, due, KIND, b"r", conn=conn)
    assert schedule(backend.store, P, due + 1, KIND, b"r", if_exists="keep", conn=conn) == key
    assert reschedule(backend.store, P, due + 2, KIND, b"r", conn=conn)
    conn.commit()
    assert get_timer(backend.store, P, KIND, b"r").due_at_ms == due + 2


@needs_pg
def test_a_psycopg_connection_with_raw_cursors_carries_the_write(tmp_path):
    """A caller's connection whose ``cursor_factory`` is ``psycopg.RawCursor`` (or
    ``AsyncRawCursor``), whose queries take ``$1`` placeholders, still carries the write, sync and
    async: the write's statements run on cursors of the kind they are written for."""
    import psycopg

    b = Backend("postgres", tmp_path)
    due = wall_ms() + 60_000

    async def on_async():
        async with await psycopg.AsyncConnection.connect(PG_DSN, cursor_factory=psycopg.AsyncRawCursor) as conn:
            await aio.schedule(b.store, P, due, KIND, b"a", conn=conn)
            assert await aio.reschedule(b.store, P, due + 1, KIND, b"a", conn=conn)
            await conn.commit()

    try:
        conn = b.connect(cursor_factory=psycopg.RawCursor)
        schedule(b.store, P, due, KIND, b"s", conn=conn)
        assert reschedule(b.store, P, due + 2, KIND, b"s", conn=conn)
        conn.commit()
        asyncio.run(on_async())
        assert get_timer(b.store, P, KIND, b"s").due_at_ms == due + 2
        assert get_timer(b.store, P, KIND, b"a").due_at_ms == due + 1
    finally:
        b.close()


@needs_pg
def test_a_store_error_inside_the_callers_postgres_transaction_undoes_only_the_write(tmp_path):
    """A search_path that cannot find the store's table makes the write fail on the server
    (PermanentStoreError); the caller's transaction, which would otherwise be aborted, is usable:
    it restores its search_path, writes its order and the timer, and commits both."""
    b = Backend("postgres", tmp_path)
    try:
        conn = b.connect()
        b.insert_order(conn, "o1")
        conn.execute("SET LOCAL search_path TO pg_catalog")
        with pytest.raises(PermanentStoreError, match="does not exist"):
            schedule(b.store, P, wall_ms() + 60_000, KIND, b"o1", conn=conn)
        conn.execute("SET LOCAL search_path TO DEFAULT")
        b.insert_order(conn, "o2")
        schedule(b.store, P, wall_ms() + 60_000, KIND, b"o2", conn=conn)
        conn.commit()
        assert b.orders_committed() == ["o1", "o2"]
        assert get_timer(b.store, P, KIND, b"o1") is None and get_timer(b.store, P, KIND, b"o2") is not None
    finally:
        b.close()


@needs_pg
def test_psycopg_autocommit_connection_joins_a_transaction_block(tmp_path):
    """An autocommit psycopg connection inside ``with conn.transaction():`` joins that block: a block
    that raises rolls the timer back with the order, one that ends normally commits both."""
    b = Backend("postgres", tmp_path)
    try:
        conn = b.connect(autocommit=True)
        due = wall_ms() + 60_000
        with pytest.raises(RuntimeError, match="undo"):
            with conn.transaction():
                b.insert_order(conn, "undone")
                schedule(b.store, P, due, KIND, b"undone", conn=conn)
                raise RuntimeError("undo")
        with conn.transaction():
            b.insert_order(conn, "done")
            schedule(b.store, P, due, KIND, b"done", conn=conn)
        assert b.orders_committed() == ["done"]
        assert get_timer(b.store, P, KIND, b"undone") is None and get_timer(b.store, P, KIND, b"done") is not None
    finally:
        b.close()


@needs_pg
def test_the_write_holds_the_partitions_lock_until_the_caller_commits(tmp_path):
    """The write takes the partition's advisory lock that every guarded commit takes: the store's
    own apply on that partition, from another thread, waits on that lock, held by the caller's open
    transaction (the server says so), and completes once it commits."""
    import psycopg

    b = Backend("postgres", tmp_path)
    try:
        conn = b.connect()
        schedule(b.store, P, wall_ms() + 60_000, KIND, b"r", conn=conn)
        done = threading.Event()
        other = threading.Thread(target=lambda: (b.store.apply(P, Batch().put(b"x", b"1")), done.set()))
        other.start()
        with psycopg.connect(PG_DSN, autocommit=True) as watcher:  # only a wait on the caller's session counts
            wait_until(lambda: watcher.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND %s = ANY(pg_blocking_pids(pid))", (conn.info.backend_pid,)).fetchone()[0] >= 1,
                "the store's apply waiting on the caller's lock")
        assert not done.is_set(), "a guarded commit on the partition ran while the caller held its lock"
        conn.commit()
        assert done.wait(LIVENESS_S)
        other.join()
    finally:
        b.close()


@needs_pg
def test_async_psycopg_connection_commit_and_rollback(tmp_path):
    """``aio.schedule(..., conn=AsyncConnection)``: committed with the caller's order, it exists;
    rolled back, it does not; TimerExists leaves the async transaction usable; cancel and
    reschedule through the same connection commit with it."""
    import psycopg

    b = Backend("postgres", tmp_path)
    due = wall_ms() + 3_600_000

    async def main():
        async with await psycopg.AsyncConnection.connect(PG_DSN) as conn:
            await conn.execute(f"INSERT INTO {b.orders} (id) VALUES ('o1')")
            await aio.schedule(b.store, P, due, KIND, b"o1", b"v", conn=conn)
            await conn.commit()
            await aio.schedule(b.store, P, due, KIND, b"o2", conn=conn)
            await conn.rollback()
            with pytest.raises(TimerExists):
                await aio.schedule(b.store, P, due, KIND, b"o1", if_exists="error", conn=conn)
            assert await aio.reschedule(b.store, P, due + 1, KIND, b"o1", conn=conn)
            await conn.execute(f"INSERT INTO {b.orders} (id) VALUES ('o3')")
            await conn.commit()
            assert await aio.cancel(b.store, P, KIND, b"o1", conn=conn)
            await conn.rollback()

    try:
        asyncio.run(main())
        assert b.orders_committed() == ["o1", "o3"]
        assert get_timer(b.store, P, KIND, b"o1").due_at_ms == due + 1
        assert get_timer(b.store, P, KIND, b"o2") is None
    finally:
        b.close()


def test_async_with_a_sqlite3_connection_commits_and_rolls_back_with_it(tmp_path):
    """In asyncio code a sqlite3.Connection is used on the loop's own thread: the write commits and
    rolls back with the caller's transaction."""
    b = Backend("sqlite", tmp_path)
    due = wall_ms() + 3_600_000

    async def main(conn):
        await aio.schedule(b.store, P, due, KIND, b"kept", conn=conn)
        conn.commit()
        await aio.schedule(b.store, P, due, KIND, b"dropped", conn=conn)
        assert await aio.reschedule(b.store, P, due + 1, KIND, b"kept", conn=conn)
        conn.rollback()

    try:
        asyncio.run(main(b.connect()))
        assert get_timer(b.store, P, KIND, b"kept").due_at_ms == due
        assert get_timer(b.store, P, KIND, b"dropped") is None
    finally:
        b.close()


_MODES = [
    pytest.param({}, None, id="legacy-default"),
    pytest.param({"isolation_level": "DEFERRED"}, None, id="legacy-deferred"),
    pytest.param({"isolation_level": None}, "BEGIN", id="legacy-autocommit-with-begin"),
    pytest.param({"autocommit": False}, None, id="pep249-autocommit-false",
                 marks=pytest.mark.skipif(sys.version_info < (3, 12), reason="sqlite3 autocommit is 3.12+")),
    pytest.param({"autocommit": True}, "BEGIN", id="pep249-autocommit-with-begin",
                 marks=pytest.mark.skipif(sys.version_info < (3, 12), reason="sqlite3 autocommit is 3.12+")),
]


@pytest.mark.parametrize("kwargs, begin", _MODES)
def test_sqlite3_connection_in_each_transaction_mode_joins_the_callers_transaction(tmp_path, kwargs, begin):
    """In every sqlite3 transaction mode (with an explicit BEGIN where the mode opens none itself)
    the write joins the caller's transaction: rolled back with it, and committed with it."""
    b = Backend("sqlite", tmp_path)
    try:
        conn = b.connect(**kwargs)
        due = wall_ms() + 3_600_000
        for outcome in ("rollback", "commit"):
            if begin:
                conn.execute(begin)
            b.insert_order(conn, outcome)
            schedule(b.store, P, due, KIND, outcome.encode(), conn=conn)
            assert conn.in_transaction
            conn.execute("ROLLBACK" if outcome == "rollback" else "COMMIT") if begin else getattr(conn, outcome)()
        assert b.orders_committed() == ["commit"]
        assert get_timer(b.store, P, KIND, b"rollback") is None
        assert get_timer(b.store, P, KIND, b"commit") is not None
    finally:
        b.close()


_AUTOCOMMIT = [pytest.param({"isolation_level": None}, id="legacy-isolation-level-none"),
               pytest.param({"autocommit": True}, id="pep249-autocommit",
                            marks=pytest.mark.skipif(sys.version_info < (3, 12), reason="sqlite3 autocommit is 3.12+"))]


@pytest.mark.parametrize("kwargs", _AUTOCOMMIT)
def test_sqlite3_autocommit_connection_outside_a_transaction_is_refused(tmp_path, kwargs):
    """An autocommit sqlite3 connection with no BEGIN would commit the write on its own: ValueError
    naming the mode, and nothing written."""
    b = Backend("sqlite", tmp_path)
    try:
        with pytest.raises(ValueError, match="autocommit mode"):
            schedule(b.store, P, wall_ms() + 60_000, KIND, b"r", conn=b.connect(**kwargs))
        assert get_timer(b.store, P, KIND, b"r") is None
    finally:
        b.close()


def test_connections_that_cannot_carry_the_write_are_refused_by_name(tmp_path):
    """A connection of another driver, to another file, closed, or for a ``":memory:"`` store:
    TypeError / ValueError naming what is wrong, and nothing written."""
    b = Backend("sqlite", tmp_path)
    try:
        due = wall_ms() + 60_000
        with pytest.raises(TypeError, match="must be a sqlite3.Connection .* got builtins.str"):
            schedule(b.store, P, due, KIND, b"r", conn="sqlite:///tx.db")
        with pytest.raises(ValueError, match="not to the database file"):
            schedule(b.store, P, due, KIND, b"r", conn=sqlite3.connect(tmp_path / "other.db"))
        closed = sqlite3.connect(b.path)
        closed.close()
        with pytest.raises(ValueError, match="closed"):
            cancel(b.store, P, KIND, b"r", conn=closed)
        with SQLiteStore(":memory:") as memory, pytest.raises(ValueError, match="private to its own connection"):
            schedule(memory, P, due, KIND, b"r", conn=b.connect())
        assert get_timer(b.store, P, KIND, b"r") is None
    finally:
        b.close()


@needs_pg
def test_psycopg_connections_that_cannot_carry_the_write_are_refused_without_their_password(tmp_path):
    """A psycopg connection (opened with a password in its DSN) for a SQLite store, a sqlite3 one
    for a PostgresStore, an autocommit connection outside a transaction, a failed transaction, a
    closed connection, and the sync/async mix-ups: each a TypeError / ValueError naming it, never
    the password."""
    import psycopg

    secret = "s3cr3t-not-shown"
    sqlite_backend = Backend("sqlite", tmp_path)
    b = Backend("postgres", tmp_path)
    try:
        with_password = psycopg.connect(PG_DSN, password=secret)
        due = wall_ms() + 60_000
        errors = []
        for store, conn, exc_type, match in [
            (sqlite_backend.store, with_password, TypeError, "must be a sqlite3.Connection .* got psycopg.Connection"),
            (b.store, sqlite_backend.connect(), TypeError, "must be a psycopg.Connection .* got sqlite3.Connection"),
            (b.store, b.connect(autocommit=True), ValueError, "autocommit mode with no transaction open"),
        ]:
            with pytest.raises(exc_type, match=match) as raised:
                schedule(store, P, due, KIND, b"r", conn=conn)
            errors.append(raised.value)
        failed = b.connect()
        with pytest.raises(psycopg.errors.DivisionByZero):
            failed.execute("SELECT 1/0")
        with pytest.raises(ValueError, match="INERROR") as raised:
            schedule(b.store, P, due, KIND, b"r", conn=failed)
        errors.append(raised.value)
        with_password.close()
        with pytest.raises(ValueError, match="closed") as raised:
            reschedule(b.store, P, due, KIND, b"r", conn=with_password)
        errors.append(raised.value)

        async def mixups():
            async with await psycopg.AsyncConnection.connect(PG_DSN, password=secret) as aconn:
                with pytest.raises(TypeError, match="await timerwheel_c.durable.aio") as raised:
                    schedule(b.store, P, due, KIND, b"r", conn=aconn)
                errors.append(raised.value)
            with pytest.raises(TypeError, match="would block the event loop") as raised:
                await aio.schedule(b.store, P, due, KIND, b"r", conn=b.connect())
            errors.append(raised.value)

        asyncio.run(mixups())
        assert len(errors) == 7
        assert not [e for e in errors if secret in str(e)]
        assert get_timer(b.store, P, KIND, b"r") is None
    finally:
        sqlite_backend.close()
        b.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_timer_claimed_for_its_first_attempt_is_cancelled_and_rescheduled_through_the_callers_connection(
        backend, mode):
    """A first attempt's claim leaves the identity row naming the scheduled key, so a write by name
    looks for the claimed row in the timer space: through the caller's connection too, sync and
    awaited (psycopg's AsyncConnection; a sqlite3 connection on the loop). The cancel and the
    reschedule commit with the caller, and the claimed attempts' outcomes then lose their guards
    while the untouched one fires. Driven by a fixed clock: nothing waits."""
    from timerwheel_c.durable.timers.claim import claim_due
    from timerwheel_c.durable.timers.runner import RunReport, commit_outcomes, fire

    due, later = 1_700_000_000_000, 1_800_000_000_000
    registry = TimerRegistry().register(Recorder())
    for reference in (b"a", b"b", b"c"):
        schedule(backend.store, P, due, KIND, reference)
    claimed = claim_due(backend.store, P, registry, due).timers
    assert len(claimed) == 3

    if mode == "sync":
        conn = backend.connect()
        assert cancel(backend.store, P, KIND, b"a", conn=conn) is True
        assert reschedule(backend.store, P, later, KIND, b"b", conn=conn) is True
        conn.commit()
    elif backend.name == "postgres":
        import psycopg

        async def main():
            async with await psycopg.AsyncConnection.connect(PG_DSN) as conn:
                assert await aio.cancel(backend.store, P, KIND, b"a", conn=conn) is True
                assert await aio.reschedule(backend.store, P, later, KIND, b"b", conn=conn) is True
                await conn.commit()

        asyncio.run(main())
    else:
        conn = backend.connect()

        async def main():
            assert await aio.cancel(backend.store, P, KIND, b"a", conn=conn) is True
            assert await aio.reschedule(backend.store, P, later, KIND, b"b", conn=conn) is True

        asyncio.run(main())
        conn.commit()
    report = RunReport()
    commit_outcomes(backend.store, P, [(c, fire(backend.store, P, due, c, report)) for c in claimed], report)
    assert (report.fired, report.raced) == (1, 2)
    assert get_timer(backend.store, P, KIND, b"a") is None
    assert get_timer(backend.store, P, KIND, b"b").due_at_ms == later
    assert get_timer(backend.store, P, KIND, b"c") is None

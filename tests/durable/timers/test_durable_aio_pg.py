"""The async writer on PostgreSQL (timerwheel_c.durable.aio over psycopg_pool): writes are awaited on a
pooled connection of the running loop, with no thread; the loop keeps serving other tasks while a write
waits on the partition's advisory lock held by another connection's open transaction; errors are the
sync writer's; the pool closes with its loop and with the store, and each new loop gets its own.

Timing is asserted only as liveness (a ticker ran while the write waited; the write landed within a
generous bound once the lock went), never as a speed. Needs the shared server
(TIMERWHEEL_C_TEST_PG_DSN). The tests that run a process of their own (a script's exit, a stopped
server) are in tests/e2e/test_durable_aio_pg_processes.py."""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import threading
import time
import uuid
import warnings

import pytest

psycopg = pytest.importorskip("psycopg")
pytest.importorskip("psycopg_pool")

from psycopg.conninfo import make_conninfo  # noqa: E402

from timerwheel_c.durable import TimerExists, aio, get_timer, schedule  # noqa: E402
from timerwheel_c.durable.storage.postgres import PostgresStore  # noqa: E402
from timerwheel_c.durable.storage.sqlite import SQLiteStore  # noqa: E402
from timerwheel_c.durable.timers import keys  # noqa: E402
from waiting import LIVENESS_S, wait_until, wall_ms, write_while_ticking  # noqa: E402

PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
pytestmark = pytest.mark.skipif(not PG_DSN, reason="TIMERWHEEL_C_TEST_PG_DSN is not set")

P = "aio-pg"
KIND = 0xD2


@pytest.fixture
def app():
    """A unique ``application_name``, so that the test counts its own connections on the shared server."""
    return f"tw_aio_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def store(app):
    from bench.stores import dispose

    s = PostgresStore(make_conninfo(PG_DSN, application_name=app), table=f"tw_aio_{uuid.uuid4().hex[:12]}")
    try:
        yield s
    finally:
        dispose(s)


def _connections(app: str) -> int:
    with psycopg.connect(PG_DSN, autocommit=True) as c:
        return c.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)).fetchone()[0]


def test_writes_on_postgres_start_no_thread(store):
    """Every async function, and 50 gathered schedules, run on the loop's pool: no thread starts (the
    SQLite path's writer thread, or any other); threads of earlier tests may end meanwhile."""
    due = wall_ms() + 3_600_000
    before = set(threading.enumerate())

    async def main():
        await aio.schedule(store, P, due, KIND, b"a")
        assert (await aio.get_timer(store, P, KIND, b"a")).due_at_ms == due
        assert await aio.reschedule(store, P, due + 1, KIND, b"a")
        assert await aio.requeue(store, P, due + 2, KIND, b"a")
        assert await aio.cancel(store, P, KIND, b"a")
        return await asyncio.gather(*(aio.schedule(store, P, due, KIND, b"%d" % i) for i in range(50)))

    got = asyncio.run(main())
    assert len(set(got)) == 50 and all(store.get(P, k) == b"" for k in got)
    started = set(threading.enumerate()) - before
    assert not started, f"threads started by the writes: {[t.name for t in started]}"


def test_loop_serves_other_tasks_while_a_write_waits_on_the_partitions_lock(store):
    """A second connection's open transaction holds the partition's advisory lock (a ``conn=`` write
    not yet committed); ``await aio.schedule`` on that partition waits for it while a ticker task
    keeps running every 10 ms; after the commit, both timers exist."""
    due = wall_ms() + 3_600_000
    holder = psycopg.connect(PG_DSN)
    try:
        schedule(store, P, due, KIND, b"held", conn=holder)  # the transaction stays open

        key = asyncio.run(write_while_ticking(aio.schedule(store, P, due, KIND, b"r", b"v"),
                                              "the partition's lock", holder.commit))
        assert key == keys.timer(due, KIND, b"r") and store.get(P, key) == b"v"
        assert get_timer(store, P, KIND, b"held") is not None
    finally:
        holder.close()


def test_timer_exists_and_bad_arguments_raise_as_the_sync_writer_does(store):
    """``if_exists="error"`` raises TimerExists with the sync writer's message and timer; a bad kind,
    reference or partition raises the sync writer's exception type and message."""
    due = wall_ms() + 3_600_000
    schedule(store, P, due, KIND, b"x")

    async def main():
        with pytest.raises(TimerExists) as sync_err:
            schedule(store, P, due, KIND, b"x", if_exists="error")
        with pytest.raises(TimerExists) as async_err:
            await aio.schedule(store, P, due, KIND, b"x", if_exists="error")
        assert str(async_err.value) == str(sync_err.value) and async_err.value.timer == sync_err.value.timer
        for call in (lambda f: f(store, P, due, KIND, b"x", if_exists="sometimes"),
                     lambda f: f(store, P, due, 256, b"x"), lambda f: f(store, "", due, KIND, b"x"),
                     lambda f: f(store, P, "tomorrow", KIND, b"x")):
            with pytest.raises((TypeError, ValueError)) as sync_err:
                call(schedule)
            with pytest.raises(sync_err.type) as async_err:
                await call(aio.schedule)
            assert str(async_err.value) == str(sync_err.value)

    asyncio.run(main())


def test_pool_closes_with_its_loop_and_with_the_store_and_each_loop_gets_its_own(store, app):
    """Two ``asyncio.run`` in sequence both write (the second on a pool of its own: the first's
    loop is gone); once a loop ends its pool's connections are gone, leaving the store's own; a
    store closed from a coroutine on the loop closes that loop's pool too; no ResourceWarning."""
    due = wall_ms() + 3_600_000
    own = _connections(app)
    assert own == 1, f"the store's own connection should be its one connection, found {own}"

    async def write(ref: bytes, close: bool = False):
        await aio.schedule(store, P, due, KIND, ref)
        assert _connections(app) > own, "the write should have opened a pooled connection"
        if close:
            store.close()  # schedules the pool's close on this loop: let the loop run it
            deadline = time.monotonic() + LIVENESS_S
            while _connections(app) != 0:
                assert time.monotonic() < deadline, "connections left after the store was closed"
                await asyncio.sleep(0.05)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(write(b"one"))
        wait_until(lambda: _connections(app) == own, "the first loop's pool closed with its loop")
        asyncio.run(write(b"two"))
        wait_until(lambda: _connections(app) == own, "the second loop's pool closed with its loop")
        assert get_timer(store, P, KIND, b"one") is not None and get_timer(store, P, KIND, b"two") is not None
        asyncio.run(write(b"three", close=True))
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]


# The bare close leaves the pool's tasks and coroutines to asyncio's and the collector's warnings.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("then", ["another loop writes", "the store closes"])
def test_a_pool_whose_loop_was_closed_bare_ends_its_sessions(store, app, then):
    """A loop closed with a bare ``loop.close()`` (no task cancelled, as ``asyncio.run`` would): its
    pool's sessions end at the next loop's first write, or at the store's close. They stayed open
    until the process ended, one server session per such loop."""
    due = wall_ms() + 3_600_000
    own = _connections(app)
    loop = asyncio.new_event_loop()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # asyncio's "Task was destroyed but it is pending", as for any task
        loop.run_until_complete(aio.schedule(store, P, due, KIND, b"bare"))
        assert _connections(app) > own
        loop.close()
        del loop
        gc.collect()
    if then == "another loop writes":
        asyncio.run(aio.schedule(store, P, due, KIND, b"next"))
        wait_until(lambda: _connections(app) == own, "the closed loop's sessions ended")
    else:
        store.close()
        wait_until(lambda: _connections(app) == 0, "every session ended with the store")
    gc.collect()  # the pool's coroutines, while this test's filter holds


def test_without_psycopg_pool_the_writes_fall_back_to_a_thread_with_one_warning(store, monkeypatch, caplog):
    """With ``psycopg_pool`` not importable, the async writer still writes, on the store's writer
    thread, and says once, at WARNING, which extra to install."""
    monkeypatch.setitem(sys.modules, "psycopg_pool", None)
    monkeypatch.delitem(sys.modules, "timerwheel_c.durable.storage.postgres.pool")
    aio._has_pool.cache_clear()
    try:
        due = wall_ms() + 3_600_000
        with caplog.at_level(logging.WARNING, "timerwheel_c.durable"):
            async def main():
                for ref in (b"a", b"b"):
                    await aio.schedule(store, P, due, KIND, ref)
                return [t.name for t in threading.enumerate()]

            names = asyncio.run(main())
        assert "timerwheel-c-aio-writer_0" in names
        assert get_timer(store, P, KIND, b"b") is not None
        warned = [r for r in caplog.records if "timerwheel-c[postgres]" in r.getMessage()]
        assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    finally:
        aio._has_pool.cache_clear()


def test_configure_checks_its_arguments(store, tmp_path):
    """configure names the bad argument; a SQLite store, which has no pool, is a TypeError."""
    with pytest.raises(TypeError, match="PostgresStore"):
        aio.configure(SQLiteStore(tmp_path / "s.db"), max_size=2)
    with pytest.raises(ValueError, match="max_size"):
        aio.configure(store, min_size=3, max_size=2)
    with pytest.raises(ValueError, match="min_size"):
        aio.configure(store, min_size=-1)
    with pytest.raises(TypeError, match="max_size"):
        aio.configure(store, max_size=2.5)
    with pytest.raises(ValueError, match="timeout_s"):
        aio.configure(store, timeout_s=0)
    aio.configure(store, min_size=0, max_size=2, timeout_s=5)


@pytest.mark.slow
def test_a_loop_whose_first_write_met_a_down_server_writes_once_it_is_back():
    """The loop's pool is made on its first write; when the server is down then, its open times out
    and psycopg_pool closes it for good. That write raises TransientStoreError, as documented, and
    the loop's writes once the server is back go through (they kept raising "pool has already been
    opened/closed and cannot be reused" until the process restarted)."""
    from pg_cluster import throwaway_cluster
    from timerwheel_c.durable.storage.errors import TransientStoreError

    with throwaway_cluster() as (dsn, pg_ctl):
        store = PostgresStore(dsn)
        try:
            aio.configure(store, timeout_s=1.0)
            pg_ctl("stop", "-m", "fast")

            async def main():
                with pytest.raises(TransientStoreError):
                    await aio.schedule(store, "p", wall_ms() + 60_000, 1, b"during")
                pg_ctl("start")
                await aio.schedule(store, "p", wall_ms() + 60_000, 1, b"after")
                await aio.schedule(store, "p", wall_ms() + 60_000, 1, b"again")

            asyncio.run(main())
        finally:
            store.close()
        with PostgresStore(dsn) as fresh:  # the first store's own connection died with the server
            assert get_timer(fresh, "p", 1, b"during") is None
            assert get_timer(fresh, "p", 1, b"after") is not None and get_timer(fresh, "p", 1, b"again") is not None


def test_cancelling_one_first_write_leaves_the_loops_other_first_writes_alone(store):
    """Two first writes on a fresh loop wait for its pool to open; one is cancelled (a request whose
    client left). The other lands (the cancelled opener closed the pool under it: "the pool is
    closed"), whatever the moment of the cancel, and the loop writes on afterwards."""
    due = wall_ms() + 3_600_000

    async def main(delay_s: float, n: int):
        cancelled = asyncio.ensure_future(aio.schedule(store, P, due, KIND, b"gone%d" % n))
        kept = asyncio.ensure_future(aio.schedule(store, P, due, KIND, b"kept%d" % n))
        await asyncio.sleep(delay_s)
        cancelled.cancel()
        outcomes = await asyncio.gather(cancelled, kept, return_exceptions=True)
        await aio.schedule(store, P, due, KIND, b"after%d" % n)
        return outcomes[1]

    for n, delay_s in enumerate((0, 0.0005, 0.001, 0.002, 0.005)):
        assert not isinstance(asyncio.run(main(delay_s, n)), BaseException), delay_s
        assert get_timer(store, P, KIND, b"kept%d" % n) is not None and get_timer(store, P, KIND, b"after%d" % n)


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["opening", "open"])
def test_a_cancel_landing_on_a_write_is_never_lost(store, pool):
    """A queue consumer's loop of writes, cancelled at a random instant of a write: of the loop's first
    (its pool opening), or of a later one (the pool open). The cancel ends it, every time. The pool's
    own wait lost one that landed as the connections came, about 1 in 100; and psycopg before 3.3 on
    Python before 3.12 (psycopg 3.2 is the newest on 3.9) lost most of those landing on a statement,
    since it waits with asyncio.wait_for: the write returned, the consumer went on, and asyncio.run
    after Ctrl-C never ended."""
    import random

    rng = random.Random(5)
    due = wall_ms() + 3_600_000

    async def consumer():
        i = 0
        while True:
            await aio.schedule(store, P, due, KIND, b"job-%d" % i)
            i += 1

    async def main(delay_s: float) -> bool:
        if pool == "open":
            await aio.schedule(store, P, due, KIND, b"warm")
        task = asyncio.ensure_future(consumer())
        await asyncio.sleep(delay_s)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=LIVENESS_S)
        if not done:
            task.cancel()
            await asyncio.wait([task], timeout=LIVENESS_S)
        return bool(done) and task.cancelled()

    logging.disable(logging.WARNING)  # psycopg_pool's "error connecting" of a cancelled connect
    try:
        ended = [asyncio.run(main(rng.uniform(0.0, 0.008))) for _ in range(300 if pool == "opening" else 100)]
    finally:
        logging.disable(logging.NOTSET)
    assert all(ended), ended.index(False)


@pytest.mark.parametrize("loses_cancels", [True, False])
def test_keeping_cancels_passes_on_a_cancel_that_the_awaited_call_would_swallow(monkeypatch, loses_cancels):
    """Where psycopg may lose a cancel, a write is awaited in a task of its own, so the caller's cancel
    is raised even when the write swallows the one passed on to it (as asyncio.wait_for did before
    Python 3.12), after the write has ended, a second cancel of the caller meanwhile included (it left
    the write running, its result never retrieved); elsewhere it is awaited as it is."""
    from timerwheel_c.durable.storage.postgres import cancels

    monkeypatch.setattr(cancels, "LOSES_CANCELS", loses_cancels)
    ended = []

    async def swallowing():
        try:
            await asyncio.sleep(LIVENESS_S)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # lost, as wait_for could lose it, and the write takes a while to end
        ended.append("write")
        return "written"

    async def caller():
        result = await cancels.keeping_cancels(swallowing())
        return result

    async def main():
        task = asyncio.ensure_future(caller())
        await asyncio.sleep(0.01)
        task.cancel()
        if loses_cancels:
            await asyncio.sleep(0.01)
            task.cancel()  # a second cancel while the write ends (a task group's, asyncio.run's at exit)
        await asyncio.wait([task], timeout=LIVENESS_S)
        assert ended == ["write"]  # the write had ended before its caller did, even so
        return task

    task = asyncio.run(main())
    assert ended == ["write"]
    if loses_cancels:
        assert task.cancelled()
    else:
        assert task.result() == "written"  # the cancel lost, as psycopg 3.3 never does
    assert asyncio.run(cancels.keeping_cancels(asyncio.sleep(0, "done"))) == "done"

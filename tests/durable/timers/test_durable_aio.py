"""The async writer (timerwheel_c.durable.aio): the loop keeps serving other tasks while a write waits
on a SQLite write lock held by another connection, and the async functions return and raise what
the sync ones do, on SQLite and on the shared PostgreSQL server. The lock test asserts only that
other tasks ran while the write waited, and that the write landed once the lock went: no speed."""
from __future__ import annotations

import asyncio
import os
import sqlite3
import time
import uuid

import pytest

from timerwheel_c.durable import Every, add_schedule, aio, cancel, get_schedule, get_timer, schedule
from timerwheel_c.durable.storage.sqlite import SQLiteStore
from timerwheel_c.durable.timers import keys
from waiting import wall_ms, write_while_ticking

P = "aio"
KIND = 0xD1
PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")


def test_loop_serves_other_tasks_while_a_write_waits_on_the_sqlite_lock(tmp_path):
    """Another connection holds the write lock (BEGIN IMMEDIATE); ``await aio.schedule`` waits on it
    while a ticker task keeps running every 10 ms; after the lock is released the write lands."""
    path = tmp_path / "lock.db"
    store = SQLiteStore(path, busy_timeout_ms=30_000)
    due = wall_ms() + 3_600_000
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")

    try:
        key = asyncio.run(write_while_ticking(aio.schedule(store, P, due, KIND, b"r", b"v"), "the held lock",
                                              lambda: holder.execute("COMMIT")))
        assert key == keys.timer(due, KIND, b"r")
        assert store.get(P, key) == b"v"
    finally:
        holder.close()
        store.close()


def _store(tmp_path, backend):
    if backend == "sqlite":
        return SQLiteStore(tmp_path / "same.db")
    from timerwheel_c.durable.storage.postgres import PostgresStore

    return PostgresStore(PG_DSN, table=f"tw_aio_{uuid.uuid4().hex[:12]}")


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_async_functions_return_and_raise_what_the_sync_ones_do(tmp_path, backend):
    """Each async function returns what its sync twin returns on the same rows (schedule's key,
    get_timer's PendingTimer, reschedule and cancel's bool, add_schedule's ScheduleInfo), and a
    bad argument raises the same exception type with the same message."""
    if backend == "postgres" and not PG_DSN:
        pytest.skip("TIMERWHEEL_C_TEST_PG_DSN is not set")
    store = _store(tmp_path, backend)
    try:
        due = wall_ms() + 3_600_000

        async def main():
            key = await aio.schedule(store, P, due, KIND, b"a")
            assert key == schedule(store, P, due, KIND, b"a")
            assert await aio.get_timer(store, P, KIND, b"a") == get_timer(store, P, KIND, b"a")
            assert await aio.reschedule(store, P, due + 1000, KIND, b"a") is True
            assert (await aio.get_timer(store, P, KIND, b"a")).due_at_ms == due + 1000
            assert await aio.cancel(store, P, KIND, b"a") is True
            assert await aio.cancel(store, P, KIND, b"a") is False
            assert cancel(store, P, KIND, b"a") is False
            assert await aio.get_timer(store, P, KIND, b"a") is None
            info = await aio.add_schedule(store, P, "hourly", Every(3600), KIND)
            assert info == get_schedule(store, P, "hourly")
            for bad in ((P, due, 0, b"a"), ("", due, KIND, b"a"), (P, due, KIND, "text")):
                with pytest.raises((TypeError, ValueError)) as sync_err:
                    schedule(store, *bad)
                with pytest.raises(sync_err.type) as async_err:
                    await aio.schedule(store, *bad)
                assert str(async_err.value) == str(sync_err.value)
            with pytest.raises(ValueError) as sync_err:
                add_schedule(store, P, "", Every(1), KIND)
            with pytest.raises(ValueError) as async_err:
                await aio.add_schedule(store, P, "", Every(1), KIND)
            assert str(async_err.value) == str(sync_err.value)
            with pytest.raises(TypeError, match="store"):
                await aio.schedule(object(), P, due, KIND, b"a")

        asyncio.run(main())
    finally:
        if backend == "postgres":
            from bench.stores import dispose

            dispose(store)
        else:
            store.close()


def test_many_concurrent_async_writes_all_land(tmp_path):
    """200 schedules gathered at once on one store (one writer thread) all land, keys distinct."""
    store = SQLiteStore(tmp_path / "many.db")
    due = wall_ms() + 3_600_000

    async def main():
        return await asyncio.gather(*(aio.schedule(store, P, due, KIND, b"%d" % i) for i in range(200)))

    try:
        t0 = time.monotonic()
        got = asyncio.run(main())
        assert len(set(got)) == 200 and time.monotonic() - t0 < 60
        assert all(store.get(P, k) == b"" for k in got)
    finally:
        store.close()


def _dispose(store, backend):
    if backend == "postgres":
        from bench.stores import dispose

        dispose(store)
    else:
        store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_async_schedule_many_writes_and_refuses_as_the_sync_one_does(tmp_path, backend):
    """aio.schedule_many leaves a partition as schedule_many leaves another given the same timers
    (a pending name replaced, kept or refused by if_exists, a name given twice: the last wins), takes
    any iterable, and raises the sync call's exception and message for a bad timer, writing nothing."""
    from timerwheel_c.durable import TimerExists, list_timers, schedule_many

    if backend == "postgres" and not PG_DSN:
        pytest.skip("TIMERWHEEL_C_TEST_PG_DSN is not set")
    store = _store(tmp_path, backend)
    due = wall_ms() + 3_600_000
    timers = [(due + i, KIND, b"r%d" % (i % 150), b"v%d" % i) for i in range(200)]  # 50 names given twice

    def state(partition):
        return [(t.reference, t.due_at_ms, t.value) for t in list_timers(store, partition)]

    async def main():
        for partition in ("sync", "async"):
            schedule(store, partition, due - 1, KIND, b"r0", b"old")
        schedule_many(store, [("sync", *t) for t in timers])
        await aio.schedule_many(store, (("async", *t) for t in timers))
        assert state("async") == state("sync") and len(state("sync")) == 150
        schedule_many(store, [("sync", due, KIND, b"r1", b"kept?")], if_exists="keep")
        await aio.schedule_many(store, [("async", due, KIND, b"r1", b"kept?")], if_exists="keep")
        assert state("async") == state("sync")
        with pytest.raises(TimerExists, match="reference b'r2'"):
            await aio.schedule_many(store, [("async", due, KIND, b"r2"), ("async", due, KIND, b"new")],
                                    if_exists="error")
        assert (await aio.get_timer(store, "async", KIND, b"new")).due_at_ms == due
        bad = [("async", due, KIND, b"fine"), ("async", due, KIND, "text")]
        with pytest.raises(TypeError) as sync_err:
            schedule_many(store, bad)
        with pytest.raises(TypeError) as async_err:
            await aio.schedule_many(store, bad)
        assert str(async_err.value) == str(sync_err.value) and "timers[1]" in str(sync_err.value)
        assert await aio.get_timer(store, "async", KIND, b"fine") is None
        with pytest.raises(TypeError, match="store"):
            await aio.schedule_many(object(), [])

    try:
        asyncio.run(main())
    finally:
        _dispose(store, backend)


@pytest.fixture(params=["sqlite", "postgres"])
def two_writers(request, tmp_path):
    """``(store, other)``: two store objects on one database, the second a process that has checked
    no kind's name yet."""
    backend = request.param
    if backend == "postgres" and not PG_DSN:
        pytest.skip("TIMERWHEEL_C_TEST_PG_DSN is not set")
    store = _store(tmp_path, backend)
    other = store.open_sibling() if backend == "postgres" else SQLiteStore(tmp_path / "same.db")
    try:
        yield store, other
    finally:
        other.close()
        _dispose(store, backend)


def test_async_writers_refuse_a_kind_the_store_names_otherwise(two_writers):
    """A second store object on the same database (a process that has checked nothing yet) whose
    name for kind 9 differs from the one recorded: aio.schedule and aio.schedule_many raise
    KindNameMismatch naming both names and write nothing; the recorded name writes on."""
    from timerwheel_c.durable import KindNameMismatch, TimerKind

    store, other = two_writers
    due = wall_ms() + 3_600_000

    async def main():
        await aio.schedule(store, P, due, TimerKind(9, "send-reminder"), b"a")
        with pytest.raises(KindNameMismatch, match="'expire-ticket' here but 'send-reminder'"):
            await aio.schedule(other, P, due, TimerKind(9, "expire-ticket"), b"b")
        with pytest.raises(KindNameMismatch, match="'expire-ticket' here but 'send-reminder'"):
            await aio.schedule_many(other, [(P, due, TimerKind(9, "expire-ticket"), b"c")])
        for reference in (b"b", b"c"):
            assert await aio.get_timer(store, P, 9, reference) is None
        await aio.schedule_many(other, [(P, due, TimerKind(9, "send-reminder"), b"d")])
        assert await aio.get_timer(store, P, 9, b"d") is not None

    asyncio.run(main())


def test_every_async_writer_refuses_a_kind_the_store_names_otherwise(two_writers):
    """aio.cancel, aio.reschedule, aio.requeue and aio.add_schedule, from a second store object on
    the same database whose name for kind 9 differs from the one recorded, raise KindNameMismatch
    naming both names and change nothing; with the recorded name they write on."""
    from timerwheel_c.durable import KindNameMismatch, TimerKind

    store, other = two_writers
    due = wall_ms() + 3_600_000
    wrong, right = TimerKind(9, "expire-ticket"), TimerKind(9, "send-reminder")

    async def main():
        await aio.schedule(store, P, due, right, b"a")
        for write in (aio.cancel(other, P, wrong, b"a"), aio.reschedule(other, P, due + 1, wrong, b"a"),
                      aio.requeue(other, P, due + 2, wrong, b"a"), aio.add_schedule(other, P, "hourly", Every(3600), wrong)):
            with pytest.raises(KindNameMismatch, match="'expire-ticket' here but 'send-reminder'"):
                await write
        assert (await aio.get_timer(store, P, 9, b"a")).due_at_ms == due
        assert get_schedule(store, P, "hourly") is None
        assert await aio.reschedule(other, P, due + 1, right, b"a")
        assert await aio.requeue(other, P, due + 2, right, b"a")
        assert await aio.cancel(other, P, right, b"a")
        assert (await aio.add_schedule(other, P, "hourly", Every(3600), right)).name == "hourly"

    asyncio.run(main())


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_async_writers_take_a_left_out_partition_from_the_reference_as_the_sync_ones_do(tmp_path, backend):
    """None for the partition: the async writers put the timer in the partition its reference names,
    where the sync get_timer finds it, and find, move and cancel it again by None."""
    if backend == "postgres" and not PG_DSN:
        pytest.skip("TIMERWHEEL_C_TEST_PG_DSN is not set")
    store = _store(tmp_path, backend)
    due = wall_ms() + 3_600_000

    async def main():
        await aio.schedule(store, None, due, 7, b"order-42", b"v")
        assert get_timer(store, None, 7, b"order-42").due_at_ms == due
        assert (await aio.get_timer(store, None, 7, b"order-42")).value == b"v"
        assert await aio.reschedule(store, None, due + 1, 7, b"order-42") is True
        assert get_timer(store, None, 7, b"order-42").due_at_ms == due + 1
        assert await aio.cancel(store, None, 7, b"order-42") is True
        assert await aio.get_timer(store, None, 7, b"order-42") is None
        with pytest.raises(TypeError, match="reference must be bytes, got str 'order-42'"):
            await aio.schedule(store, None, due, 7, "order-42")

    try:
        asyncio.run(main())
    finally:
        _dispose(store, backend)

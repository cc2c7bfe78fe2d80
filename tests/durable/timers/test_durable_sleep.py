"""Durable sleep in-process: deterministic timer ids, blocking and await forms, replay, timeout,
and a sleep fired once when two runners race for it."""
from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
import uuid

import pytest

from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.registry import TimerRegistry
from timerwheel_c.durable.timers.runner import run_due
from timerwheel_c.durable.service.service import DurableTimerService
from timerwheel_c.durable.timers.sleep import SLEEP_PARTITION, DurableContext, SleepHandler, TimerId
from timerwheel_c.durable.storage.sqlite import SQLiteStore
from timerwheel_c.durable.timers.timing import ManualClock
from waiting import LIVENESS_S, wait_until, wall_ms



def test_timer_id_is_deterministic_uuid5():
    """The n-th sleep of an execution always gets the same UUIDv5; other n or ids differ."""
    a = TimerId.for_call("exec", 0)
    assert a == TimerId.for_call("exec", 0) and a.uuid.version == 5 and len(a.bytes) == 16
    assert len({a, TimerId.for_call("exec", 1), TimerId.for_call("exec2", 0)}) == 3
    with pytest.raises(ValueError):
        TimerId.for_call("", 0)
    with pytest.raises(ValueError, match="-1"):
        TimerId.for_call("e", -1)
    with pytest.raises(TypeError):
        TimerId.for_call(uuid.uuid4(), 0)


def test_an_execution_id_that_is_no_utf8_is_a_value_error_naming_it(tmp_path):
    """An id with a lone surrogate (a file name or argv read with surrogateescape) has no UTF-8 for its
    sleeps' UUIDv5: a ValueError naming execution_id and the id, when the context is made, as a
    partition or a schedule name of no UTF-8 is; it was uuid5's bare UnicodeEncodeError, naming neither."""
    with pytest.raises(ValueError, match=r"execution_id must be encodable as UTF-8 .*'order-\\udcff'"):
        TimerId.for_call("order-\udcff", 0)
    with pytest.raises(ValueError, match="execution_id"):
        DurableContext(SQLiteStore(str(tmp_path / "t.db")), "order-\udcff")


def test_blocking_and_await_forms_and_replay(tmp_path):
    """Both forms return False after a real wait (not before the due time) and True, at once, when a
    new context of the same execution replays them; no second timer is journaled."""
    store = SQLiteStore(tmp_path / "s.db")
    registry = TimerRegistry().register(SleepHandler())
    with DurableTimerService(store, registry, [SLEEP_PARTITION]) as svc:
        ctx = DurableContext(store, "e1", service=svc)
        due0, due1 = wall_ms() + 100, wall_ms() + 200
        assert ctx.sleep_until(due0) is False and wall_ms() >= due0
        assert asyncio.run(ctx.sleep_until_async(due1)) is False and wall_ms() >= due1
        replay = DurableContext(store, "e1", service=svc)
        t0 = time.monotonic()
        assert replay.sleep_until(due0) is True
        assert asyncio.run(replay.sleep_until_async(due1)) is True
        assert time.monotonic() - t0 < 5
    assert store.scan(SLEEP_PARTITION, *keys.timer_range()).entries == []
    store.close()


def test_sleep_without_a_service_times_out(tmp_path):
    """With nobody firing it, a sleep with timeout_s raises TimeoutError (both forms)."""
    store = SQLiteStore(":memory:")
    ctx = DurableContext(store, "lonely")
    with pytest.raises(TimeoutError):
        ctx.sleep_until(wall_ms() - 1, timeout_s=0.05)
    with pytest.raises(TimeoutError):
        asyncio.run(ctx.sleep_until_async(wall_ms() - 1, timeout_s=0.05))


def test_two_runners_fire_a_sleep_once(tmp_path):
    """Two runners on two connections to one file: the first marks the sleep fired, the second finds
    no row (or loses its claim): the mark is written once and the timer row is gone."""
    path = tmp_path / "race.db"
    a, b = SQLiteStore(path), SQLiteStore(path)
    ctx = DurableContext(a, "race")
    due = wall_ms() - 1
    with pytest.raises(TimeoutError):
        ctx.sleep_until(due, timeout_s=0)  # journals, nobody fires yet
    ra = run_due(a, SLEEP_PARTITION, TimerRegistry().register(SleepHandler()), due + 1)
    rb = run_due(b, SLEEP_PARTITION, TimerRegistry().register(SleepHandler()), due + 1)
    assert ra.fired + rb.fired == 1
    assert DurableContext(b, "race").sleep_until(due) is True
    for s in (a, b):
        s.close()


FAR_SLEEPER = """
import sys
from timerwheel_c.durable import DurableContext, SQLiteStore
ctx = DurableContext(SQLiteStore(sys.argv[1]), "far")
print("sleeping", flush=True)
ctx.sleep_until(2**64 - 1)
"""


def test_a_sleep_centuries_ahead_waits_instead_of_overflowing(tmp_path):
    """A due time the keys allow (up to 2**64-1 ms) but beyond what time.sleep or the release timer
    take: the blocking form keeps waiting (its process is still alive, quietly, a second after it
    began; it is then killed), and the await form ends only at its timeout_s, with TimeoutError."""
    proc = subprocess.Popen([sys.executable, "-c", FAR_SLEEPER, str(tmp_path / "far.db")], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "sleeping"  # the situation arose: the call was made
        time.sleep(1.0)
        assert proc.poll() is None, proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    assert "Error" not in proc.stderr.read()
    ctx = DurableContext(SQLiteStore(":memory:"), "far-async")
    with pytest.raises(TimeoutError):
        asyncio.run(ctx.sleep_until_async(2**64 - 1, timeout_s=0.2))


def test_an_hours_sleep_both_forms_ends_when_the_services_manual_clock_passes_it(tmp_path):
    """A durable sleep of an hour, blocking and awaited, on a service given a ManualClock: the context
    takes the service's clock, so neither form has returned while the clock is a second short of the
    due time, and both return once it is advanced past it (the service fires the sleep's timer on
    the same clock). On the host's clock the hour would outlast the liveness bound."""
    import threading

    clock = ManualClock()
    store = SQLiteStore(tmp_path / "s.db")
    due = clock.wall_ns() // 1_000_000 + 3_600_000
    done: list = []
    with DurableTimerService(store, TimerRegistry().register(SleepHandler()), [SLEEP_PARTITION], clock=clock) as svc:
        ctx = DurableContext(store, "exec-clock", service=svc)
        assert ctx.clock is clock
        blocking = threading.Thread(target=lambda: done.append(("sync", ctx.sleep_until(due))))
        blocking.start()
        wait_until(lambda: ctx.calls == 1, "the blocking sleep journaled")
        loop = asyncio.new_event_loop()
        awaited = threading.Thread(target=lambda: done.append(("async", loop.run_until_complete(
            DurableContext(store, "exec-clock-2", service=svc).sleep_until_async(due)))))
        awaited.start()
        # The service and the awaited sleep asleep on the clock (the blocking one sleeps in a Condition).
        wait_until(lambda: clock.waiting >= 2, "the service and the awaited sleep asleep on the clock")
        clock.advance(3599.0)
        wait_until(lambda: clock.waiting >= 2, "asleep again a second short of the due time")
        assert done == []
        clock.advance(1.0)
        blocking.join(LIVENESS_S)
        awaited.join(LIVENESS_S)
        loop.close()
    store.close()
    assert sorted(done) == [("async", False), ("sync", False)]


def test_an_awaited_sleeps_timeout_runs_on_its_manual_clock():
    """An awaited sleep an hour away with a timeout of a minute, on a ManualClock nobody else moves: it
    has not given up while the clock is short of the minute, and raises TimeoutError once the clock is
    advanced past it (no real minute passes: on the host's clock it would outlast the liveness bound)."""
    import threading

    clock = ManualClock()
    ctx = DurableContext(SQLiteStore(":memory:"), "timeout-clock", clock=clock)
    due = clock.wall_ns() // 1_000_000 + 3_600_000
    raised: list = []
    loop = asyncio.new_event_loop()

    def sleep():
        try:
            loop.run_until_complete(ctx.sleep_until_async(due, timeout_s=60.0))
        except TimeoutError as exc:
            raised.append(exc)

    waiter = threading.Thread(target=sleep, daemon=True)
    waiter.start()
    wait_until(lambda: clock.waiting >= 2, "the sleep and its timeout asleep on the clock")
    clock.advance(59.0)
    wait_until(lambda: clock.waiting >= 2, "asleep again a second short of the timeout")
    assert raised == [] and waiter.is_alive()
    clock.advance(1.0)
    waiter.join(LIVENESS_S)
    loop.close()
    assert len(raised) == 1 and "within 60.0 s" in str(raised[0])


@pytest.mark.parametrize("bad, error", [(float("nan"), ValueError), ("5", TypeError), (True, TypeError)])
def test_a_sleeps_timeout_that_is_no_number_of_seconds_is_refused_by_name_before_it_is_journaled(bad, error):
    store = SQLiteStore(":memory:")
    ctx = DurableContext(store, "bad-timeout")
    with pytest.raises(error, match=f"timeout_s .*{re.escape(repr(bad))}"):
        ctx.sleep_until(wall_ms() + 60_000, timeout_s=bad)
    with pytest.raises(error, match=f"timeout_s .*{re.escape(repr(bad))}"):
        asyncio.run(ctx.sleep_until_async(wall_ms() + 60_000, timeout_s=bad))
    assert ctx.calls == 0 and store.scan(SLEEP_PARTITION, *keys.timer_range()).entries == []



def test_a_sleeps_timeout_past_the_range_of_due_times_is_no_timeout(tmp_path):
    """timeout_s=1e308 is finite, and its ns overflowed a float to inf (an OverflowError as the wait
    began): it is as good as no timeout, as infinity is, and so is an int past a float's range
    (10**309: its isnan check raised OverflowError). Both forms, already due, are fired by the
    service and return."""
    store = SQLiteStore(tmp_path / "s.db")
    with DurableTimerService(store, TimerRegistry().register(SleepHandler()), [SLEEP_PARTITION]) as svc:
        ctx = DurableContext(store, "far-timeout", service=svc)
        for far in (1e308, 10**309):
            assert ctx.sleep_until(wall_ms() - 1, timeout_s=far) is False
            assert asyncio.run(ctx.sleep_until_async(wall_ms() - 1, timeout_s=far)) is False
    store.close()


def test_an_awaited_sleeps_timeout_of_decades_is_a_deadline_not_a_timeout_at_once(tmp_path):
    """timeout_s of 4e8 s to 1e15 s (decades to millennia, below the range of due times) is a real
    deadline: the awaited sleep, due in an hour, is still waiting. The wait for the give-up time went
    to the release timer in one piece, which takes at most 10 years ahead: its ValueError ended that
    wait first, and was reported as the sleep's timeout, at once. The blocking form already waited."""
    store = SQLiteStore(tmp_path / "s.db")

    async def still_waiting(timeout_s: float) -> bool:
        sleeping = asyncio.ensure_future(
            DurableContext(store, f"decades-{timeout_s:g}").sleep_until_async(wall_ms() + 3_600_000, timeout_s=timeout_s))
        await asyncio.sleep(0.2)
        waiting = not sleeping.done()
        sleeping.cancel()
        await asyncio.gather(sleeping, return_exceptions=True)
        return waiting

    async def each_still_waiting(timeouts_s: tuple) -> dict:
        # At once, not one after another: each waits its 0.2 s beside the others.
        return dict(zip(timeouts_s, await asyncio.gather(*map(still_waiting, timeouts_s))))

    timeouts_s = (4e8, 1e9, 1e12, 1e15)
    assert asyncio.run(each_still_waiting(timeouts_s)) == dict.fromkeys(timeouts_s, True)
    store.close()


def test_a_sleep_whose_journal_write_failed_is_the_same_sleep_when_retried(tmp_path):
    """The store refuses the journal write (another process holds the SQLite write lock): nothing is
    journaled and the call does not count, so its retry is the same n-th sleep, and a replay of the
    execution finds each sleep where it looks: the second sleep of a replay, an hour away, waits. The
    failed call counted, the retry was journaled as the next sleep, and the replay's hour-long sleep
    found the retry's mark, fired, and returned at once."""
    import sqlite3

    from timerwheel_c.durable.storage.errors import TransientStoreError

    path = tmp_path / "wf.db"
    store = SQLiteStore(path, busy_timeout_ms=100)
    ctx = DurableContext(store, "wf")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    with pytest.raises(TransientStoreError):
        ctx.sleep_until(wall_ms() + 3_600_000, timeout_s=0)
    assert ctx.calls == 0
    other.execute("ROLLBACK")
    other.close()
    first_due = wall_ms() - 1
    with pytest.raises(TimeoutError):
        ctx.sleep_until(first_due, timeout_s=0)  # journaled as sleep 0; no service fires it here
    assert ctx.calls == 1
    run_due(store, SLEEP_PARTITION, TimerRegistry().register(SleepHandler()), wall_ms())  # sleep 0 fires
    replay = DurableContext(store, "wf")
    assert replay.sleep_until(first_due, timeout_s=LIVENESS_S) is True  # the replay of sleep 0
    with pytest.raises(TimeoutError):  # sleep 1 is new: it waits, an hour
        replay.sleep_until(wall_ms() + 3_600_000, timeout_s=0.05)
    store.close()


def test_a_relative_sleep_counts_from_the_services_clock():
    """A sleep of timedelta(hours=1) beside a service on a ManualClock set years ahead of the host: due an
    hour after the service's now, so it waits until the clock is advanced by the hour. It counted from
    the host's wall clock, years before the service's now, and returned at once."""
    import datetime

    clock = ManualClock(wall_ns=1_900_000_000_000_000_000)  # 2030
    store = SQLiteStore(":memory:")
    with DurableTimerService(store, TimerRegistry().register(SleepHandler()), [SLEEP_PARTITION], clock=clock) as svc:
        ctx = DurableContext(store, "relative", service=svc)
        with pytest.raises(TimeoutError):
            ctx.sleep_until(datetime.timedelta(hours=1), timeout_s=0)
        [(key, _)] = store.scan(SLEEP_PARTITION, *keys.timer_range()).entries
        assert keys.parse(key).due_at_ms == 1_900_000_000_000 + 3_600_000
    store.close()

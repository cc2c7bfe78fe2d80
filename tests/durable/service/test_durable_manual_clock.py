"""Injected time: a service given a ManualClock and a Timing sleeps, backs off and waits out the
unknown-kind grace on that clock, so a test drives an hour of them by hand in no real time, as tokio's
``time::pause()``/``advance()`` do. Each test waits for the service to be asleep on the clock before it
advances it (``clock.waiting``), and only liveness bounds are real time: none can flake on a loaded
machine, and none could pass on the host's clock, whose hour never passes within the bound."""
from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from timerwheel_c.durable.service.service import DurableTimerService
from timerwheel_c.durable.storage.store import Batch
from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerKind, TimerRegistry
from timerwheel_c.durable.timers.timing import ManualClock, Timing
from waiting import LIVENESS_S, wait_until

P = "clock"
KIND = 0xE9
UNKNOWN = 0xEA  # a kind no handler in these tests has
HOUR_S = 3600.0


class Noted(TimerHandler):
    """Done at once; records each reference."""

    kind = TimerKind(KIND)

    def __init__(self):
        self.fired: list = []

    def fire(self, ctx, timer):
        self.fired.append(timer.reference)
        return Done()


def test_advance_wakes_a_sleeping_thread_and_an_async_wait_at_their_deadline_and_not_before():
    """A blocking sleep and an async wait on a ManualClock end once advance() reaches their deadline,
    not at an advance short of it; the wall clock moves with the monotonic one."""
    clock = ManualClock(wall_ns=1_000_000_000, monotonic_ns=5)
    slept = threading.Event()
    sleeper = threading.Thread(target=lambda: (clock.sleep(10.0), slept.set()))
    sleeper.start()
    loop = asyncio.new_event_loop()
    waiter = threading.Thread(target=lambda: loop.run_until_complete(clock.sleep_until(5 + 10 * 10**9)))
    waiter.start()
    wait_until(lambda: clock.waiting == 1, "the async wait to register")
    clock.advance(9.999)
    assert not slept.wait(0.2) and waiter.is_alive()
    clock.advance(0.001)
    assert slept.wait(LIVENESS_S)
    waiter.join(LIVENESS_S)
    assert not waiter.is_alive() and clock.waiting == 0
    sleeper.join(LIVENESS_S)
    loop.close()
    assert clock.monotonic_ns() == 5 + 10 * 10**9
    assert clock.wall_ns() == 1_000_000_000 + 10 * 10**9


@pytest.mark.parametrize("seconds", [-1.0, float("nan"), float("inf")])
def test_a_manual_clock_refuses_to_advance_by_a_bad_amount_naming_it(seconds):
    with pytest.raises(ValueError, match=repr(seconds)):
        ManualClock().advance(seconds)


@pytest.mark.parametrize("field, value, error", [
    ("backoff_base_s", 0.0, ValueError), ("backoff_max_s", float("inf"), ValueError),
    ("stop_timeout_s", "10", TypeError), ("unknown_kind_grace_ms", -1, ValueError),
    ("unknown_kind_grace_ms", 1.5, ValueError), ("backoff_max_s", 0.01, ValueError),
    ("lock_wait_ms", 0, ValueError), ("lock_wait_ms", 2**31, ValueError), ("lock_wait_ms", 0.5, TypeError),
    ("lock_wait_ms", True, TypeError), ("lock_wait_ms", None, TypeError),
])
def test_a_bad_timing_is_refused_naming_the_field_and_value(field, value, error):
    with pytest.raises(error, match=field) as info:
        Timing(**{field: value})
    assert repr(value) in str(info.value)


def test_timing_backoff_doubles_from_its_base_to_its_max():
    timing = Timing(backoff_base_s=1.0, backoff_max_s=5.0)
    assert [timing.backoff_s(n) for n in (1, 2, 3, 4, 100)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert Timing().backoff_s(1) == 0.05 and Timing().backoff_s(100) == 5.0  # the service's long-standing values


def test_the_unknown_kind_grace_is_timing_s_and_waited_out_on_the_manual_clock(store, caplog):
    """A row of a kind no handler has stays in place through a grace of an hour (Timing) and is backed off
    once the ManualClock is advanced past it: the service slept on the injected clock, and judged the
    row's due time by its wall clock. On the host's clocks (before the injection) nothing moved in time."""
    clock = ManualClock()
    due_ms = clock.wall_ns() // 1_000_000
    key = keys.timer(due_ms, UNKNOWN, b"orphan")
    store.apply(P, Batch().put(key, b""))
    timing = Timing(unknown_kind_grace_ms=int(HOUR_S * 1000))
    service = DurableTimerService(store, TimerRegistry().register(Noted()), [P], max_sleep_s=HOUR_S,
                                  clock=clock, timing=timing)
    with caplog.at_level(logging.WARNING, logger="timerwheel_c.durable"), service:
        wait_until(lambda: service.passes >= 1 and clock.waiting >= 1, "the service asleep on the clock")
        clock.advance(HOUR_S - 1)
        wait_until(lambda: service.passes >= 2 and clock.waiting >= 1, "a pass within the grace, then sleep")
        assert store.get(P, key) == b""  # within its grace: left for a runner that has the kind
        clock.advance(1.0)
        wait_until(lambda: store.get(P, key) is None, "the row backed off past its grace", LIVENESS_S)
    assert service.died is None
    assert any("no handler for timer kind %d" % UNKNOWN in r.getMessage() and "3600000 ms" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_stop_waits_timing_s_stop_timeout_by_default_for_a_handler_in_flight(store):
    """stop() with no timeout gives a hung handler Timing.stop_timeout_s (here 0.2 s), not 10 s: the
    stop returns within the liveness bound, far below the 10 s default it replaced, with the handler
    abandoned."""
    release = threading.Event()

    class Hung(Noted):
        def fire(self, ctx, timer):
            release.wait(LIVENESS_S)
            return Done()

    store.apply(P, Batch().put(keys.timer(1, KIND, b"hung"), b""))
    service = DurableTimerService(store, TimerRegistry().register(Hung()), [P], timing=Timing(stop_timeout_s=0.2))
    service.start()
    try:
        wait_until(lambda: service.in_flight == 1, "the handler running")
        stopper = threading.Thread(target=service.stop)
        stopper.start()
        stopper.join(5.0)
        assert not stopper.is_alive(), "stop() waited past its Timing's 0.2 s (and the 1 s teardown)"
    finally:
        release.set()
        service.stop()


@pytest.mark.parametrize("how", ["timing", "argument"])
def test_stop_with_a_timeout_longer_than_a_thread_can_wait_stops(store, how):
    """A stop timeout of 1e10 s (a finite number, above threading.TIMEOUT_MAX) waits as long as it
    can: stop() returns once the thread ends, and raises no OverflowError from the join."""
    timing = Timing(stop_timeout_s=1e10) if how == "timing" else None
    service = DurableTimerService(store, TimerRegistry().register(Noted()), [P], timing=timing)
    service.start()
    if how == "timing":
        service.stop()
    else:
        service.stop(timeout=1e10)
    assert not service.running and service.died is None


def test_a_sleep_of_millennia_on_the_host_clock_sleeps_and_does_not_spin(store):
    """max_sleep_s=1e12 s is finite, but its deadline is past the host clock's int64 ns: the idle
    thread sleeps (a day at most, then again) rather than failing that wait at once and passing
    again, thousands of times a second. Holds on a loaded machine: a sleeping thread makes no pass
    in the half second, a spinning one hundreds."""
    service = DurableTimerService(store, TimerRegistry().register(Noted()), [P], max_sleep_s=1e12,
                                  summary_interval_s=1e12)
    with service:
        wait_until(lambda: service.passes >= 1, "the first pass")
        threading.Event().wait(0.5)
        assert service.passes < 20 and service.died is None


def test_a_claims_time_budget_runs_on_the_services_clock():
    """A claim's ``max_elapsed_ms`` is judged on the service's clock: with a store whose every write
    round trip takes an hour of that clock (it advances the ManualClock), a pass over 2,000 due rows
    stops on its budget after the first claim round trip (64 rows), where the host's clock, on which
    those round trips take microseconds, would let it claim up to the kind's cap (256)."""
    from timerwheel_c.durable.service.activity import Activity
    from timerwheel_c.durable.service.metrics import Recorder
    from timerwheel_c.durable.service.passes import Passes
    from timerwheel_c.durable.storage.sqlite import SQLiteStore
    from timerwheel_c.durable.timers.claim import PAGE
    from timerwheel_c.durable.timers.runner import TickBudget

    clock = ManualClock()

    class HourLongWrites(SQLiteStore):
        def apply_many(self, partition, batches):
            clock.advance(HOUR_S)
            return super().apply_many(partition, batches)

        def apply_across(self, items):
            clock.advance(HOUR_S)
            return super().apply_across(items)

    store = HourLongWrites(":memory:")
    now_ms = clock.wall_ns() // 1_000_000
    batch = Batch()
    for i in range(2_000):
        batch.put(keys.timer(now_ms - 10, TimerKind(KIND), b"r%04d" % i), b"")
    store.apply(P, batch)
    passes = Passes(store, TimerRegistry().register(Noted()), TickBudget(), lambda: [P], None, Recorder(Activity(60.0)),
                    lambda: now_ms, Timing(), lambda: clock.monotonic_ns() / 1e9)
    result = passes.run(1_000, {}, lambda: False)
    assert len(result.jobs) == PAGE
    store.close()


def test_a_relative_due_time_given_to_the_service_counts_from_its_clock(store):
    """``delay=`` and a timedelta given to the service's schedule and reschedule count from the clock
    it judges due times by, here a ManualClock a decade ahead of the host: stored at that clock's now
    plus the delay, fired once it has passed and not before. Counted from the host's clock, the
    timers were years overdue by the service's and fired at once."""
    import datetime
    import time

    from timerwheel_c.durable import get_timer

    clock = ManualClock(wall_ns=time.time_ns() + 10 * 365 * 86_400 * 10**9, monotonic_ns=10**12)
    noted = Noted()
    with DurableTimerService(store, TimerRegistry().register(noted), [P], max_sleep_s=HOUR_S, clock=clock) as service:
        wait_until(lambda: service.passes >= 1 and clock.waiting >= 1, "the service asleep on the clock")
        passes = service.passes
        now_ms = clock.wall_ns() // 1_000_000
        service.schedule(P, None, KIND, b"delay", delay=60)
        service.schedule(P, datetime.timedelta(seconds=60), KIND, b"timedelta")
        service.schedule(P, now_ms + 1000, KIND, b"moved")
        assert service.reschedule(P, None, KIND, b"moved", delay=60.0)
        assert {r: get_timer(store, P, KIND, r).due_at_ms for r in (b"delay", b"timedelta", b"moved")} == \
            dict.fromkeys((b"delay", b"timedelta", b"moved"), now_ms + 60_000)
        # A pass after the writes (their wake-ups may all share one), then asleep.
        wait_until(lambda: service.passes > passes and clock.waiting >= 1, "a pass after the writes, then sleep")
        clock.advance(59.999)
        wait_until(lambda: clock.waiting >= 1, "the service asleep again")
        assert noted.fired == []
        clock.advance(0.001)
        wait_until(lambda: len(noted.fired) == 3, "the three timers fired", LIVENESS_S)
    assert sorted(noted.fired) == [b"delay", b"moved", b"timedelta"]


def test_a_service_loop_that_fails_at_once_backs_off_and_logs_a_few_lines(store, monkeypatch, caplog):
    """A service whose event loop fails as it starts (no file descriptor left for a new one: EMFILE),
    6 times in a row, waits longer after each (Timing's backoff, on the ManualClock), logs the first
    failure with its traceback and then only the 2nd and 4th, one line each; then it runs and fires.
    It restarted every 50 ms, each time with a traceback at ERROR, about 20 a second."""
    from timerwheel_c.durable.service.thread import ServiceThread

    main = ServiceThread._main
    failed = []

    async def no_descriptor_at_first(self):
        if len(failed) < 6:
            failed.append(self.clock.monotonic_ns())
            raise OSError(24, "Too many open files")
        return await main(self)

    monkeypatch.setattr(ServiceThread, "_main", no_descriptor_at_first)
    clock = ManualClock()
    noted = Noted()
    store.apply(P, Batch().put(keys.timer(clock.wall_ns() // 1_000_000, KIND, b"after"), b""))
    with caplog.at_level(logging.ERROR, logger="timerwheel_c.durable"):
        with DurableTimerService(store, TimerRegistry().register(noted), [P], clock=clock) as service:
            # Each poll moves the clock 1 s: past each backoff (at most 1.6 s here) within two polls.
            wait_until(lambda: clock.advance(1.0) or len(failed) == 6, "six failed starts, each after its backoff")
            wait_until(lambda: clock.advance(1.0) or noted.fired == [b"after"], "the timer fired once the loop ran")
    gaps = [b - a for a, b in zip(failed, failed[1:])]
    assert all(gap > 0 for gap in gaps)  # each restart waited on the clock
    lines = [r for r in caplog.records if "service loop failed" in r.getMessage()]
    assert [(bool(r.exc_info), "%d time(s)" % n in r.getMessage()) for r, n in zip(lines, (1, 2, 4))] == \
        [(True, True), (False, True), (False, True)]
    assert len(lines) == 3 and service.died is None


def test_stop_ends_the_backoff_of_a_failed_service_loop_at_once(store, monkeypatch):
    """stop() while the service waits out the backoff before restarting its failed event loop: the
    wait ends at once and the thread is gone when stop() returns. The backoff (up to backoff_max_s,
    on a ManualClock no one advances here: for ever) outlived stop()'s timeout, and stop() returned
    with the service still running."""
    from timerwheel_c.durable.service.thread import ServiceThread

    failed = []

    async def no_descriptor(self):
        failed.append(self.clock.monotonic_ns())
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(ServiceThread, "_main", no_descriptor)
    clock = ManualClock()
    service = DurableTimerService(store, TimerRegistry().register(Noted()), [P], clock=clock)
    service.start()
    wait_until(lambda: len(failed) == 1, "the loop's first failure")
    service.stop(timeout=LIVENESS_S)
    assert not service.running and len(failed) == 1 and service.died is None


def test_a_timer_written_before_the_second_read_of_the_servers_clock_fires_at_its_due_time(tmp_path):
    """A service that judges due times by its store server's clock carries that time from its first
    read only once a second read, FIRST_REFRESH_S later, has measured the clocks' rates; until then the
    time stands still. A sleep converted to a monotonic deadline meanwhile ends late by as much as it
    stood still (a fresh runner fired its first timers 170 ms late), unless the service wakes for that
    read. Here a timer written 100 ms after the first read fires at its due time and not before. The
    ManualClock is both the host's and the server's clock, so a late or early fire is the service's
    doing; without the wake for the read, the advance to the due time fires nothing (liveness bound)."""
    from timerwheel_c.durable.service.clock import FIRST_REFRESH_S
    from timerwheel_c.durable.storage.sqlite import SQLiteStore

    clock = ManualClock(wall_ns=1_800_000_000_000 * 1_000_000)  # a whole ms: each advance below lands on one

    class ServerClocked(SQLiteStore):
        reads = 0

        def clock_ns(self):
            ServerClocked.reads += 1
            return clock.wall_ns()

    store = ServerClocked(tmp_path / "clocked.db")
    noted = Noted()
    try:
        with DurableTimerService(store, TimerRegistry().register(noted), [P], max_sleep_s=HOUR_S, clock=clock) as service:
            wait_until(lambda: service.passes >= 1 and clock.waiting >= 1, "the service asleep on the clock")
            clock.advance(FIRST_REFRESH_S / 2)
            passes = service.passes
            due_ms = clock.wall_ns() // 1_000_000 + 1000
            service.schedule(P, due_ms, KIND, b"t")
            wait_until(lambda: service.passes > passes and clock.waiting >= 1, "a pass after the write, then sleep")
            assert ServerClocked.reads == 1  # the pass that saw the timer came before the second read
            clock.advance(0.999)  # 1 ms before the due time
            wait_until(lambda: ServerClocked.reads == 2 and clock.waiting >= 1, "the second read, then sleep")
            assert noted.fired == []
            clock.advance(0.001)
            wait_until(lambda: noted.fired == [b"t"], "the timer fired at its due time", LIVENESS_S)
    finally:
        store.close()


def test_a_service_whose_first_read_of_the_servers_clock_fails_claims_nothing_by_its_hosts_clock(tmp_path):
    """A runner whose host clock runs an hour ahead, and whose first read of its store server's clock
    fails (the server restarting as the runner starts, its claim connection cut) while its claims then
    succeed: a pass judged by the host's clock would fire every timer due within that hour early. Here
    the timer is due a minute ahead by the server's clock and must not fire before it; once the clock
    is read, it fires at its due time (liveness bound)."""
    from timerwheel_c.durable import schedule
    from timerwheel_c.durable.storage.errors import TransientStoreError
    from timerwheel_c.durable.storage.sqlite import SQLiteStore

    clock = ManualClock(wall_ns=1_800_000_000_000 * 1_000_000)
    hour_ns = int(HOUR_S * 1e9)

    class ServerClocked(SQLiteStore):
        reads = 0

        def clock_ns(self):
            ServerClocked.reads += 1
            if ServerClocked.reads == 1:
                raise TransientStoreError("the server is restarting")
            return clock.wall_ns() - hour_ns

    store = ServerClocked(tmp_path / "clocked.db")
    noted = Noted()
    due_ms = (clock.wall_ns() - hour_ns) // 1_000_000 + 60_000
    try:

        schedule(store, P, due_ms, KIND, b"t")
        with DurableTimerService(store, TimerRegistry().register(noted), [P], max_sleep_s=HOUR_S, clock=clock):
            wait_until(lambda: clock.waiting >= 1, "the service asleep on the clock")
            while ServerClocked.reads < 3:  # the failed read, its retry after the loop's backoff, the second read
                clock.advance(1.0)
                wait_until(lambda: clock.waiting >= 1, "the service asleep on the clock again")
            assert noted.fired == [], "fired by the host's clock, an hour ahead of the server's"
            clock.advance(60.0)
            wait_until(lambda: noted.fired == [b"t"], "the timer fired at its due time", LIVENESS_S)
    finally:
        store.close()

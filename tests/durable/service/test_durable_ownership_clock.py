"""Fleet ownership on the injected clock, on the real PostgreSQL server: its check interval and its
lease run on the clock it is given (the service's), so a test drives a frozen runner's lease by hand
with a :class:`ManualClock` instead of sitting it out, and a Timing with a bad interval or lease is
refused by name. Real time appears only in liveness bounds; none could pass on the host's clock,
whose lease (minutes here) never passes within the bound."""
from __future__ import annotations

import contextlib
import os

import pytest

from timerwheel_c.durable.service.service import DurableTimerService
from timerwheel_c.durable.storage.store import Batch
from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.registry import Done, TimerKind, TimerRegistry
from timerwheel_c.durable.timers.timing import ManualClock, Timing
from waiting import wait_until

PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
needs_pg = pytest.mark.skipif(not PG_DSN, reason="set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to test the fleet")

SHARDS = 16
KIND = 0xEB
INTERVAL_S = 60.0  # ownership interval on the manual clock: no real minute passes in these tests
LEASE_S = 600.0


@pytest.mark.parametrize("field, value, error", [
    ("ownership_interval_s", 0.0, ValueError), ("ownership_interval_s", "1", TypeError),
    ("ownership_lease_s", float("inf"), ValueError), ("ownership_lease_s", 0.5, ValueError),
    ("ownership_lease_s", True, TypeError),
])
def test_a_bad_ownership_timing_is_refused_naming_the_field_and_value(field, value, error):
    with pytest.raises(error, match=field) as info:
        Timing(**{field: value})
    assert repr(value) in str(info.value)


@pytest.mark.parametrize("host", ["db-runner-1", "h" * 100, "\u00e9" * 40])
def test_a_runner_name_keeps_its_pid_and_token_within_postgresql_s_63_bytes(monkeypatch, host):
    """The name a runner's lock sessions give themselves names it across reconnects by its token, so
    a long host name is what is cut short, never the OS pid or the token; the status page still reads
    its host and pid from it."""
    import socket

    from timerwheel_c.durable.storage.runner_name import parse_runner_name, runner_name

    monkeypatch.setattr(socket, "gethostname", lambda: host)
    name = runner_name("0a1b2c3d")
    assert len(name.encode()) <= 63 and name.endswith(f" pid {os.getpid()} #0a1b2c3d")
    who = parse_runner_name(name)
    assert who and host.startswith(who[0]) and who[1] == os.getpid()
    assert parse_runner_name(f"timerwheel_c runner on {host} pid 7") == (host, 7)  # before tokens
    assert parse_runner_name("psql") is None and parse_runner_name(None) is None


@needs_pg
@pytest.mark.parametrize("lease_s, max_elapsed_ms", [(5.0, 10_000), (10.0, 10_000), (20.0, 60_000)])
def test_a_fleet_lease_a_pass_can_outlast_is_refused_naming_both(schema_url, lease_s, max_elapsed_ms):
    """A pass makes no ownership evaluation, the runner's heartbeat: with a lease no longer than the
    longest pass (the budget's max_elapsed_ms), the other runners would end a live runner mid-pass
    and take its share over. Refused at construction, naming both values; the same lease is fine
    where no fleet is formed (pinned partitions)."""
    from timerwheel_c.durable.storage.postgres import PostgresStore
    from timerwheel_c.durable.timers.tick import TickBudget

    timing = Timing(ownership_interval_s=1.0, ownership_lease_s=lease_s)
    budget = TickBudget(max_elapsed_ms=max_elapsed_ms)
    with PostgresStore(schema_url, shard_count=SHARDS) as store:
        with pytest.raises(ValueError, match=f"ownership_lease_s \\({lease_s!r} s\\).*max_elapsed_ms \\({max_elapsed_ms!r} ms"):
            DurableTimerService(store, TimerRegistry(), timing=timing, budget=budget)
        DurableTimerService(store, TimerRegistry(), ["p"], timing=timing, budget=budget).stop()


def _ownership(store, clock, kinds=None):
    return store.ownership(None, kinds=kinds, check_interval_s=INTERVAL_S, lease_s=LEASE_S,
                           monotonic_ns=clock.monotonic_ns)


@contextlib.contextmanager
def _two_runners(store, clock):
    """Two ownerships that have divided the shards (each evaluated after seeing the other); both
    closed at the end."""
    first, second = _ownership(store, clock), _ownership(store, clock)
    try:
        first.owned()
        second.owned()
        clock.advance(INTERVAL_S)
        first.owned()
        second.owned()
        yield first, second
    finally:
        first.close()
        second.close()


@needs_pg
def test_ownership_re_evaluates_when_its_clock_passes_the_interval_and_not_before(schema_url):
    """Two runners over 16 shards: the first takes them all; the second, joining, gets none while the
    first's cached ownership holds; once the clock passes the interval the first gives up its surplus
    and the second takes it: eight each."""
    from timerwheel_c.durable.storage.postgres import PostgresStore

    clock = ManualClock()
    with PostgresStore(schema_url, shard_count=SHARDS) as store:
        a, b = _ownership(store, clock), _ownership(store, clock)
        try:
            assert a.owned() == list(range(SHARDS))
            assert b.owned() == []
            clock.advance(INTERVAL_S - 1)
            assert len(a.owned()) == SHARDS and b.owned() == []  # neither re-evaluated: cached
            clock.advance(1.0)
            assert len(a.owned()) == SHARDS // 2
            assert len(b.owned()) == SHARDS // 2
            assert sorted(a.owned() + b.owned()) == list(range(SHARDS))
        finally:
            a.close()
            b.close()


@needs_pg
def test_a_frozen_runner_is_ended_once_the_clock_passes_its_lease_and_its_shards_are_taken_over(schema_url):
    """Of two runners dividing 16 shards, one stops evaluating (frozen, its connection open). The other
    ends its lock session only once the clock has carried it past the lease from the frozen runner's
    last query, not a second before, then takes over every shard and reports them taken over."""
    from timerwheel_c.durable.storage.postgres import PostgresStore

    clock = ManualClock()
    with PostgresStore(schema_url, shard_count=SHARDS) as store, _two_runners(store, clock) as (frozen, live):
        # frozen's last query was _two_runners' last: it is frozen from here on
        frozen_shards = frozen.last_owned()
        assert len(frozen_shards) == len(live.last_owned()) == SHARDS // 2  # the situation arose
        for _ in range(int(LEASE_S // INTERVAL_S) - 1):
            clock.advance(INTERVAL_S)
            assert len(live.owned()) == SHARDS // 2 and live.members == 2
        clock.advance(INTERVAL_S)  # the lease from the frozen runner's last query has passed

        def all_taken() -> bool:
            clock.advance(INTERVAL_S)  # the server ends the session a moment after it is asked to
            return live.owned() == list(range(SHARDS))

        wait_until(all_taken, "the live runner to take every shard over")
        assert live.members == 1
        # Reported once the frozen runner has not come back for the grace, two intervals.
        assert live.taken_over() == []
        for _ in range(3):
            clock.advance(INTERVAL_S)
            live.owned()
        assert sorted(live.taken_over()) == frozen_shards


@needs_pg
def test_a_runner_whose_lock_session_is_ended_takes_its_own_shards_back_not_over(schema_url):
    """A runner's lock session ends under it (a server restart, pg_terminate_backend, a network cut)
    and it reconnects with a new backend pid: its shards are its own again, never taken over from
    a runner that died (that released its rows in flight to fire again while their handlers ran, and
    lost their outcomes)."""
    import psycopg

    from timerwheel_c.durable.storage.errors import StoreError
    from timerwheel_c.durable.storage.postgres import PostgresStore

    clock = ManualClock()
    with PostgresStore(schema_url, shard_count=SHARDS) as store:
        runner = _ownership(store, clock)
        try:
            assert runner.owned() == list(range(SHARDS))
            assert runner.taken_over() == []
            with psycopg.connect(schema_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (runner._pid,))
            clock.advance(INTERVAL_S)

            def back() -> bool:
                clock.advance(INTERVAL_S)
                try:
                    return runner.owned() == list(range(SHARDS))
                except StoreError:  # the ended session, seen at the first evaluation after it
                    return False

            wait_until(back, "the runner to reconnect and own every shard again")
            assert runner.taken_over() == []
        finally:
            runner.close()


@needs_pg
def test_a_runner_whose_session_ended_but_who_came_back_is_not_taken_over_from(schema_url):
    """Of two runners, one loses its lock session (pg_terminate_backend here; a dropped connection)
    and reconnects under the same name within the grace: the other takes its shards (it held none a
    moment) but reports none taken over, so the returning runner's rows in flight are not released
    to fire again while its handlers run. One that does not come back (closed) is reported once the
    grace has passed."""
    import psycopg

    from timerwheel_c.durable.storage.errors import StoreError
    from timerwheel_c.durable.storage.postgres import PostgresStore

    clock = ManualClock()
    with PostgresStore(schema_url, shard_count=SHARDS) as store, _two_runners(store, clock) as (a, b):
        assert len(b.last_owned()) == SHARDS // 2 and len(a.last_owned()) == SHARDS // 2
        with psycopg.connect(schema_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (a._pid,))
        wait_until(lambda: b.owned() == list(range(SHARDS)) or clock.advance(INTERVAL_S),
                   "the other runner to take every shard")
        with pytest.raises(StoreError):
            a.owned()
        a.recheck()
        a.owned()  # back, under the same name
        for _ in range(4):
            clock.advance(INTERVAL_S)
            a.owned()
            b.owned()
        assert b.taken_over() == [] and a.taken_over() == []
        assert sorted(a.last_owned() + b.last_owned()) == list(range(SHARDS))
        gone = a.last_owned()
        a.close()  # this time for good
        wait_until(lambda: b.owned() == list(range(SHARDS)) or clock.advance(INTERVAL_S),
                   "the other runner to take every shard")
        for _ in range(3):
            clock.advance(INTERVAL_S)
            b.owned()
        assert sorted(b.taken_over()) == gone


@needs_pg
def test_a_fleet_service_takes_its_timing_and_clock_into_its_ownership_and_fires_a_frozen_runners_timer(schema_url):
    """A fleet service given a ManualClock and a Timing: its ownership evaluates on that clock with that
    interval and lease. A frozen runner (an ownership that stopped evaluating) holds every shard; a
    timer due now fires only after the service's clock is advanced past the lease, exactly once."""
    from timerwheel_c.durable.storage.postgres import PostgresStore

    clock = ManualClock()
    timing = Timing(ownership_interval_s=INTERVAL_S, ownership_lease_s=LEASE_S)
    fired: list = []
    registry = TimerRegistry()

    @registry.handler(KIND)
    def note(ctx, timer):
        fired.append(timer.reference)
        return Done()

    with PostgresStore(schema_url, shard_count=SHARDS) as store:
        store.apply("p", Batch().put(keys.timer(clock.wall_ns() // 1_000_000, TimerKind(KIND), b"due"), b""))
        frozen = _ownership(store, clock, kinds=[KIND])
        try:
            assert frozen.owned() == list(range(SHARDS))
            with DurableTimerService(store, registry, fleet=True, clock=clock,
                                     timing=timing) as svc:
                assert (svc.ownership.check_interval_s, svc.ownership.lease_s) == (INTERVAL_S, LEASE_S)
                wait_until(lambda: clock.waiting >= 1, "the service asleep on the clock")
                clock.advance(LEASE_S - INTERVAL_S)
                wait_until(lambda: clock.waiting >= 1, "the service asleep again, short of the lease")
                assert fired == [] and svc.ownership.last_owned() == []

                def fired_once() -> bool:
                    clock.advance(INTERVAL_S)
                    return fired == [b"due"]

                wait_until(fired_once, "the frozen runner's timer to fire")
                assert svc.ownership.last_owned() == list(range(SHARDS))
        finally:
            frozen.close()
    assert fired == [b"due"]

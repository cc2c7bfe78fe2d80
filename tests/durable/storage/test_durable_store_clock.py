"""StoreClock, driven by hand (injected host, monotonic and server clocks): it carries the server's
time on the monotonic clock from a reading whose offset is the lowest the round trip allows, so it
is never ahead of the server; a step of the host's wall clock moves nothing; a host clock more than
1 s off is logged at WARNING once per episode; a store without a server clock (SQLite) keeps the host's."""
from __future__ import annotations

import logging
import re

from timerwheel_c.durable.service.clock import StoreClock

S = 1_000_000_000  # ns per s


class FakeServer:
    """A store whose server clock is ``server_ns``; each read advances the monotonic clock by ``rtt_ns``,
    the reading taken at the end of the round trip (the latest it can be: the worst case for the clock)."""

    def __init__(self, clocks, server_minus_mono_ns, rtt_ns):
        self.clocks = clocks
        self.offset = server_minus_mono_ns
        self.rtt_ns = rtt_ns
        self.reads = 0

    def clock_ns(self):
        self.reads += 1
        self.clocks.mono += self.rtt_ns
        return self.clocks.mono + self.offset


class Clocks:
    def __init__(self, mono, host):
        self.mono = mono
        self.host = host

    def clock(self, **kw):
        return StoreClock(host_ns=lambda: self.host + self.mono, monotonic_ns=lambda: self.mono, **kw)


def test_the_clock_follows_the_server_never_ahead_and_ignores_a_host_step(caplog):
    clocks = Clocks(mono=10 * S, host=1_700_000_000 * S + 5 * S)  # the host runs 5 s ahead of the server
    server = FakeServer(clocks, 1_700_000_000 * S, rtt_ns=2_000_000)
    clock = clocks.clock(refresh_s=5.0)
    with caplog.at_level(logging.WARNING, logger="timerwheel_c.durable"):
        clock.refresh(server)
        clocks.mono += S // 2
        clock.refresh(server)  # FIRST_REFRESH_S later: the second read, which measures the clocks' rates
        clocks.mono += S
        clock.refresh(server)  # within refresh_s: no read
    assert server.reads == 2 and clock.rate == 1.0
    server_now = clocks.mono + server.offset
    assert server_now - 2_000_000 <= clock.now_ns() <= server_now
    clocks.host -= 3600 * S  # the host's wall clock stepped back an hour
    assert clock.now_ns() <= clocks.mono + server.offset
    assert clocks.mono + server.offset - clock.now_ns() <= 2_000_000
    warned = [r.getMessage() for r in caplog.records if "off the store server's" in r.getMessage()]
    assert len(warned) == 1 and "+4.999 s" in warned[0], warned  # the host read mid-trip, the server at its end


def test_the_warning_comes_again_only_after_the_host_clock_came_back(caplog):
    clocks = Clocks(mono=10 * S, host=2 * S)
    server = FakeServer(clocks, 0, rtt_ns=0)
    clock = clocks.clock(refresh_s=0.0)
    with caplog.at_level(logging.INFO, logger="timerwheel_c.durable"):
        for host_off_s in (2, 3, 0, -2):
            clocks.host = host_off_s * S
            clocks.mono += S
            clock.refresh(server)
    said = [r.getMessage() for r in caplog.records]
    assert [(r.levelname, re.search(r"\(?([+-][0-9.]+) s", r.getMessage()).group(1)) for r in caplog.records] == [
        ("WARNING", "+2.000"), ("INFO", "+0.000"), ("WARNING", "-2.000")], said


def test_a_store_without_a_server_clock_keeps_the_host_clock(tmp_path):
    from timerwheel_c.durable import SQLiteStore

    clocks = Clocks(mono=10 * S, host=1_700_000_000 * S)
    clock = clocks.clock()
    with SQLiteStore(tmp_path / "t.db") as store:
        clock.refresh(store)
        clocks.mono += 60 * S
        clock.refresh(store)
    assert clock.offset_ns is None and clock.now_ns() == clocks.host + clocks.mono


def test_a_slow_round_trip_is_not_taken_for_a_host_clock_gone_wrong(caplog):
    """A read of the server's clock that took 4 s (a stalled network) knows the skew to 2 s only: a host
    clock in step with the server's is not warned about (it was: "-2.000 s off"), one 6 s ahead is,
    and a warning is withdrawn only once a read shows the clock back within 1 s."""
    clocks = Clocks(mono=10 * S, host=0)
    server = FakeServer(clocks, 0, rtt_ns=4 * S)
    clock = clocks.clock(refresh_s=0.0)
    with caplog.at_level(logging.INFO, logger="timerwheel_c.durable"):
        clock.refresh(server)
        assert not caplog.records, [r.getMessage() for r in caplog.records]
        clocks.host = 6 * S
        clock.refresh(server)
        clocks.host = 0
        clock.refresh(server)  # in step, but the slow trip cannot show it: still warned
        server.rtt_ns = 0
        clock.refresh(server)
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"], [r.getMessage() for r in caplog.records]


class _Skewed:
    """The server's clock and a host whose monotonic clock runs ``speed`` times as fast: ``real`` is
    ns of the server's time since the start; each read of the server takes a 1 ms round trip."""

    def __init__(self, speed: int):
        self.speed = speed
        self.real = 0

    def clock_ns(self) -> int:
        self.real += 1_000_000
        return self.server_ns()

    def server_ns(self) -> int:
        return 1_800_000_000 * S + self.real

    def clock(self) -> StoreClock:
        return StoreClock(host_ns=lambda: 1_800_000_000 * S + self.speed * self.real,
                          monotonic_ns=lambda: self.speed * self.real)


def test_a_monotonic_clock_running_fast_never_carries_the_clock_ahead_of_the_server():
    """libfaketime's ``x4`` (or a broken clock source): the host's monotonic clock runs 4 times as
    fast as the server's. Carried on it at face value, the clock ran up to 3 x REFRESH_S ahead
    (timers fired 3.7 s early): measured between reads, the rate carries it at the server's pace,
    never ahead of the server's clock at any instant, and within a few ms of it once measured. A
    clock running at the server's pace is carried as it is."""
    for speed in (4, 1):
        server = _Skewed(speed)
        clock = server.clock()
        worst_behind_ns = 0
        for step in range(3000):  # 30 s of the server's time, a pass every 10 ms
            clock.refresh(server)
            assert clock.now_ns() <= server.server_ns(), (speed, step, clock.now_ns() - server.server_ns())
            if step > 300:
                worst_behind_ns = max(worst_behind_ns, server.server_ns() - clock.now_ns())
            server.real += 10_000_000
        assert worst_behind_ns < 20_000_000, (speed, worst_behind_ns)
        assert abs(clock.rate - 1 / speed) < 0.01, (speed, clock.rate)


def test_a_read_is_due_for_a_sleep_only_while_the_time_is_not_carried_at_the_servers_pace():
    """Until its second read the clock stands still, so a sleep converted by it must end by that read:
    next_read_ns() names it, FIRST_REFRESH_S after the first. Once that read was tried and failed it names
    none (the caller's own store errors pace the next try, not a wake at once in a loop), nor once the
    second read has measured the clocks' pace."""
    from timerwheel_c.durable.service.clock import FIRST_REFRESH_S

    clocks = Clocks(mono=10 * S, host=1_700_000_000 * S)
    server = FakeServer(clocks, 1_700_000_000 * S, rtt_ns=1_000_000)
    clock = clocks.clock()
    assert clock.next_read_ns() is None  # never read: the host's clock, carried as it is
    clock.refresh(server)
    read_at = clocks.mono
    assert clock.next_read_ns() == read_at + int(FIRST_REFRESH_S * S)
    clocks.mono += int(FIRST_REFRESH_S * S)
    failing = FakeServer(clocks, 0, rtt_ns=0)
    failing.clock_ns = lambda: 1 / 0
    clock.refresh(failing)
    assert clock.next_read_ns() is None
    clock.refresh(server)
    assert clock.rate == 1.0 and clock.next_read_ns() is None

"""The host's clocks of the durable layer (timers/timing.py)."""
from __future__ import annotations

import time

import pytest

from timerwheel_c.durable.timers.timing import SYSTEM_CLOCK


def test_the_system_clock_reads_a_patched_time_module(monkeypatch):
    """SystemClock looks ``time.time_ns`` and ``time.monotonic_ns`` up at each read, as asyncio's
    loop looks up ``time.monotonic``: a test tool that patches the module's attributes (freezegun,
    ``unittest.mock.patch``) moves a service built on the system clock, as it moves the loop."""
    monkeypatch.setattr(time, "time_ns", lambda: 1_700_000_000_000_000_000)
    monkeypatch.setattr(time, "monotonic_ns", lambda: 42)
    assert SYSTEM_CLOCK.wall_ns() == 1_700_000_000_000_000_000
    assert SYSTEM_CLOCK.monotonic_ns() == 42


@pytest.mark.parametrize("name", ["backoff_base_s", "backoff_max_s", "stop_timeout_s", "ownership_interval_s",
                                  "ownership_lease_s"])
def test_a_timing_past_the_range_of_due_times_is_refused_naming_it(name):
    """Each span of a Timing is finite and at most the range of Unix epoch ms: a finite 1e308 s
    turned into an infinite ms or ns count where the service waits by it (an OverflowError in a
    pass), so it is refused when the Timing is made, naming the field and the value."""
    from timerwheel_c.durable.timers.timing import Timing

    with pytest.raises(ValueError, match=f"Timing.{name} must be finite .*1e\\+308"):
        Timing(**{name: 1e308})


@pytest.mark.parametrize("offset_s", [-3600.0, 5e10])
def test_the_system_clocks_sleep_follows_a_patched_clock_that_stands_still_without_spinning(monkeypatch, offset_s):
    """A test tool's clock that stands still, an hour behind the host's or at a reading the release
    timer would take for 1,600 years ahead (freezegun's, a wall-clock time): a sleep on it waits for as
    long as that clock says and then a ms at a time, yielding to the loop; it neither ends early nor
    spins. It spun at full CPU without yielding, and the loop's other tasks starved (the 0.3 s
    wait_for never fired); before the chunked waits, the far reading raised ValueError."""
    import asyncio

    frozen_ns = time.monotonic_ns() + int(offset_s * 1e9)
    monkeypatch.setattr(time, "monotonic_ns", lambda: frozen_ns)

    async def main() -> tuple:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        other = asyncio.ensure_future(ticker())
        cpu_s = time.process_time()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(SYSTEM_CLOCK.sleep_until(frozen_ns + 50_000_000), 0.3)
        other.cancel()
        return ticks, time.process_time() - cpu_s

    ticks, cpu_s = asyncio.run(main())
    assert ticks >= 5  # the loop ran its other task meanwhile
    assert cpu_s < 0.25, cpu_s  # a liveness bound: waiting, not spinning (a spin takes the whole 0.3 s)

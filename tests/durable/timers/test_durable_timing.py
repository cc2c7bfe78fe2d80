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

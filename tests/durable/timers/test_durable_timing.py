"""The host's clocks of the durable layer (timers/timing.py)."""
from __future__ import annotations

import time

from timerwheel_c.durable.timers.timing import SYSTEM_CLOCK


def test_the_system_clock_reads_a_patched_time_module(monkeypatch):
    """SystemClock looks ``time.time_ns`` and ``time.monotonic_ns`` up at each read, as asyncio's
    loop looks up ``time.monotonic``: a test tool that patches the module's attributes (freezegun,
    ``unittest.mock.patch``) moves a service built on the system clock, as it moves the loop."""
    monkeypatch.setattr(time, "time_ns", lambda: 1_700_000_000_000_000_000)
    monkeypatch.setattr(time, "monotonic_ns", lambda: 42)
    assert SYSTEM_CLOCK.wall_ns() == 1_700_000_000_000_000_000
    assert SYSTEM_CLOCK.monotonic_ns() == 42

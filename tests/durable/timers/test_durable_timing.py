"""The host's clocks of the durable layer (timers/timing.py)."""
from __future__ import annotations

import time

from timerwheel_c.durable.timers.timing import SYSTEM_CLOCK, SystemClock


def test_the_system_clock_reads_are_times_own_functions():
    """A service reads its clocks a few times per fired timer: SystemClock's ``wall_ns`` and
    ``monotonic_ns`` are :func:`time.time_ns` and :func:`time.monotonic_ns` themselves, no Python
    frame around each read, and read as they do. Deterministic: identity, and a monotonic reading
    bracketed by time's own."""
    assert SystemClock.wall_ns is time.time_ns and SystemClock.monotonic_ns is time.monotonic_ns
    before = time.monotonic_ns()
    assert before <= SYSTEM_CLOCK.monotonic_ns() <= time.monotonic_ns()
    assert isinstance(SYSTEM_CLOCK.wall_ns(), int)

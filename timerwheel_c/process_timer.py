"""The process-wide release timer and precise asyncio sleeps on it.

``arm_at(at)`` arms a deadline on one ReleaseTimer per process, started lazily on the
first deadline still in the future; ``sleep_until(at)`` and ``sleep(delay)`` await
such deadlines. Times are float seconds on ``time.monotonic()``, the clock asyncio's
loops use. One release thread serves the whole process, as one timer driver serves
a tokio runtime.

Fork safety: ``os.register_at_fork`` drops the process-wide timer in a forked child,
whose copy of the parent's thread does not run, so the child starts its own on first
use; the parent's timer is untouched.
"""
from __future__ import annotations

import asyncio
import os
import threading
import time
from numbers import Real

from . import _impl
from ._release_common import FAR_AHEAD_NS, _seconds_to_ns as seconds_to_ns

# The same core as the package's ReleaseTimer: _impl.load returns the module already chosen.
_core = _impl.load("release")

__all__ = ["arm_at", "release_timer_started", "sleep", "sleep_until"]

_lock = threading.Lock()
_timer = None
# sleep()'s longest step, in seconds: well inside the release timer's 10-year limit.
_STEP_S = FAR_AHEAD_NS / 2e9


def _after_fork_in_child() -> None:
    global _timer, _lock
    _timer = None
    _lock = threading.Lock()  # the parent may have held it while forking


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _process_timer():
    global _timer
    timer = _timer
    if timer is None:
        with _lock:
            if _timer is None:
                _timer = _core.ReleaseTimer()
            timer = _timer
    return timer


def arm_at(at: float):
    """Arm a deadline at ``at`` (float seconds on time.monotonic()) on the process-wide timer.

    A deadline already due comes back released without starting the timer.

    Raises:
        TypeError: ``at`` is not a real number (or is a bool).
        ValueError: ``at`` is NaN, infinite or out of the int64 ns range, or more than 10 years
            ahead (wall-clock seconds from ``time.time()`` by mistake), as ``ReleaseTimer.arm``.
    """
    d = _core.past_deadline(at)
    if d is not None:
        return d
    return _process_timer().arm(at)


def release_timer_started() -> bool:
    """True once this process's release timer has started (in a forked child: its own)."""
    return _timer is not None


async def sleep_until(at: float, result=None):
    """Sleep until ``at`` (float seconds on time.monotonic()), released by the release timer.

    Never wakes before ``at``; returns ``result``. An ``at`` already past yields to the loop once,
    as ``asyncio.sleep(0)`` does. Raises as :func:`arm_at`.
    """
    await _released(arm_at(at))
    return result


async def _released(deadline) -> None:
    """Await ``deadline``, yielding to the loop once if it is released already: an await of a
    done deadline does not suspend, and a loop of sleeps that each came due by the time they were
    armed (a delay of a few µs) would starve every other task, where asyncio.sleep never does."""
    if deadline.done():
        await asyncio.sleep(0)
    else:
        await deadline


async def sleep(delay: float, result=None):
    """Like ``asyncio.sleep(delay)`` (``delay`` in seconds, any ``numbers.Real``: int,
    float, Fraction, numpy scalars, and bool as asyncio accepts it), but released precisely.

    A ``delay`` <= 0 yields to the loop once, as asyncio.sleep(0) does. A delay longer than the
    release timer takes in one deadline (10 years: a further one is refused as wall-clock time by
    mistake) is slept in steps, as asyncio sleeps any finite delay.

    Raises:
        TypeError: ``delay`` is not a real number.
        ValueError: ``delay`` is NaN, +infinite, or so large its deadline leaves the int64 ns range.
    """
    if not isinstance(delay, Real):
        raise TypeError(f"delay must be a real number of seconds, got {delay!r}")
    if delay <= 0:
        await asyncio.sleep(0)
        return result
    try:
        at = time.monotonic() + delay
        seconds_to_ns(at)
    except (OverflowError, ValueError):  # OverflowError: an int or Fraction beyond the float range
        raise ValueError(f"delay={delay!r} s is NaN, infinite or beyond the int64 nanosecond range") from None
    while True:
        step_at = min(at, time.monotonic() + _STEP_S)
        await _released(arm_at(step_at))
        if step_at >= at:
            return result

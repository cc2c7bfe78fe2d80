"""What both asyncio scheduler twins share: argument checks, the ms rounding of the loop clock,
and the loop clock's lag behind real time.

Neither twin imports the other (after aio-libs' neutral ``_helpers`` modules); the compiled
scheduler (``src/_aio.pyx``) calls these on its slow paths only, inlines the fast ones, and
takes every constant it shares with the pure twin from here (``tests/cores/test_twin_parity.py``).
"""
from __future__ import annotations

import inspect
import math
import numbers
import operator
import sys
import time
from typing import Any

# The wheel refuses due times beyond 2**62 ms.
from ._common import MAX_DUE_MS as MAX_DUE_MS

# Wake-up sentinels for the scheduler's ``_wake_ms`` (an int64 ms otherwise): no wake-up is
# armed, so any due time arms one; a fire batch is running and re-arms once at its end, so no due
# time arms one (both are plain ``due_ms < _wake_ms`` comparisons). Both twins take these values
# from here; the compiled one holds them in int64 C variables.
NO_WAKE = (1 << 63) - 1
IN_BATCH = -1
# Keyed timers take int keys in the int64 range (a connection id, a file descriptor).
KEY_MIN = -(1 << 63)
KEY_LIMIT = 1 << 63
# A scheduler holds its keyed sets weakly while no key is armed, so a dropped one is freed; keyed()
# sweeps the references of the freed ones once the list holds twice the live sets and this many.
KEYED_SWEEP_MIN = 16
# Linux's CLOCK_MONOTONIC_COARSE, which the time module does not name.
_CLOCK_MONOTONIC_COARSE = 6
# Task.uncancel() (3.11+) tells the timeout's own cancel from one sent from elsewhere.
HAS_UNCANCEL = sys.version_info >= (3, 11)


def floor_ms(now_s: float) -> int:
    """Largest integer ms ``n`` with ``n / 1000 <= now_s`` (float-exact, not assumed)."""
    now_ms = math.floor(now_s * 1000.0)
    if now_ms / 1000.0 > now_s:
        now_ms -= 1
    elif (now_ms + 1) / 1000.0 <= now_s:
        now_ms += 1
    return now_ms


def is_uvloop(loop: Any) -> bool:
    """True for a uvloop event loop, whose ``time()`` is libuv's whole-ms loop time."""
    return type(loop).__module__.partition(".")[0] == "uvloop"


def uvloop_clock_slack_s() -> float:
    """How far uvloop's ``loop.time()`` may trail the real monotonic time, in seconds.

    It is libuv's loop time: whole ms (floored: < 1 ms behind) read from libuv's "fast"
    clock, which on Linux is CLOCK_MONOTONIC_COARSE whenever that ticks every 1 ms or
    finer (then up to one tick more behind), else CLOCK_MONOTONIC (libuv uv__hrtime).
    """
    slack_s = 0.001
    if sys.platform.startswith("linux"):
        try:
            coarse_s = time.clock_getres(_CLOCK_MONOTONIC_COARSE)
        except OSError:
            coarse_s = 0.0
        if coarse_s <= 0.001:
            slack_s += coarse_s
    return slack_s


def default_clock_slack_s(loop: Any) -> float:
    """The default ``clock_slack_s`` for ``loop``: uvloop's clock lag, else 0."""
    return uvloop_clock_slack_s() if is_uvloop(loop) else 0.0


def check_seconds(value: Any, name: str = "delay") -> float:
    """``value`` in seconds as a finite float; TypeError / ValueError naming it otherwise.

    Any real number (int, float, numpy scalars) but bool is accepted, as asyncio does.
    """
    if type(value) is not float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a real number of seconds, got {value!r}")
        try:
            value = float(value)
        except OverflowError:
            raise ValueError(f"{name} must be finite, got {value!r} seconds") from None
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r} seconds")
    return value


# The largest clock_slack_s taken, in seconds: the slack covers a loop clock's lag (1 or 2 ms on
# uvloop); a larger value is a unit mistake, and would push every deadline out of the wheel's range.
MAX_CLOCK_SLACK_S = 1.0


def check_slack(clock_slack_s: Any) -> float:
    """``clock_slack_s`` as a float in [0, :data:`MAX_CLOCK_SLACK_S`] seconds; TypeError /
    ValueError naming it otherwise."""
    slack_s = check_seconds(clock_slack_s, "clock_slack_s")
    if not 0 <= slack_s <= MAX_CLOCK_SLACK_S:
        raise ValueError(f"clock_slack_s must be in [0, {MAX_CLOCK_SLACK_S}] seconds, got {clock_slack_s!r}")
    return slack_s


def check_callback(callback: Any, method: str) -> None:
    """TypeError unless ``callback`` is a plain callable (not a coroutine or coroutine function)."""
    if not callable(callback):
        raise TypeError(f"a callable object was expected by {method}(), got {callback!r}")
    if inspect.iscoroutinefunction(callback) or inspect.iscoroutine(callback):
        raise TypeError(f"coroutines cannot be used with {method}(), got {callback!r}")


def check_key(key: Any) -> int:
    """``key`` as an int in [-2**63, 2**63); TypeError (bool, float, str...) or ValueError naming it."""
    if type(key) is not int:
        if isinstance(key, bool):
            raise TypeError(f"key must be an int, got {key!r}")
        try:
            key = operator.index(key)
        except TypeError:
            raise TypeError(f"key must be an int, got {key!r}") from None
    if not KEY_MIN <= key < KEY_LIMIT:
        raise ValueError(f"key {key} is out of range [-2**63, 2**63)")
    return key


def deadline_error(when_s: float) -> ValueError:
    """The error for a deadline beyond the wheel's range."""
    return ValueError(f"deadline {when_s!r} s is beyond the wheel's range (2**62 ms)")

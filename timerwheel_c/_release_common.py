"""What both twins of the release timer share: constants, argument checks, conversions and the
asyncio await.

The compiled core (``src/_release.pyx``) and its pure twin (``timerwheel_c/pure/release.py``)
both import from here, and neither imports the other, so a traceback from the compiled core never
passes through the pure twin. One such module per core, as propcache keeps its helpers
(``timerwheel_c/_common.py`` is the wheel's, ``timerwheel_c/_aio_common.py`` the scheduler's).
The compiled core keeps its hot checks as typed C twins of the functions here, with the same
names and semantics; the values of the constants it compiles in are checked against these by the
test suite.
"""
from __future__ import annotations

import asyncio
import math
import os
import threading
import warnings
from numbers import Real
from typing import Any, Optional

from .errors import ReleaseTimerClosed

SLICE_NS = 500_000  # the sleep step: the release thread re-reads the heap at least this often
SWEEP_MIN_HEAP = 64  # sweep abandoned slots only once the heap holds more entries than this
SWEEP_EVERY_NS = 250_000_000  # ... and at most this often
WAIT_CHUNK_NS = 100_000_000  # blocking waits take the GIL back this often to let Ctrl-C through
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
# A deadline further ahead than this on the monotonic clock (10 years) is refused: the monotonic
# clock counts from boot, so such a value is almost surely wall-clock time (time.time(), about
# 1.7e9 s since 1970, i.e. some 55 years ahead) passed by mistake.
FAR_AHEAD_NS = 10 * 365 * 86_400 * 10**9
SLICE, CONDVAR = 0, 1  # backends
BACKEND_NAMES = ("slice", "condvar")


def _choose_backend(backend: Optional[str], stacklevel: int) -> int:
    """The backend named by ``backend`` (any case), else by ``$TIMERWHEEL_C_RELEASE_TIMER``, else slice.
    ``stacklevel``: the warning's, so that it names the line that made the ReleaseTimer (a compiled
    constructor adds no Python frame, the pure one does).

    Raises:
        TypeError / ValueError: ``backend`` is not a str or None, or names no backend. An unknown
            ``$TIMERWHEEL_C_RELEASE_TIMER`` is a RuntimeWarning naming it, and slice: the environment
            may be set for another version's names.
    """
    if backend is None:
        name = os.environ.get("TIMERWHEEL_C_RELEASE_TIMER", "slice")
        chosen = name.strip().lower()
        if chosen not in BACKEND_NAMES:
            warnings.warn(f"$TIMERWHEEL_C_RELEASE_TIMER={name!r} names no release timer backend ('slice' or "
                          "'condvar'): using 'slice'", RuntimeWarning, stacklevel=stacklevel)
            return SLICE
        return BACKEND_NAMES.index(chosen)
    if not isinstance(backend, str):
        raise TypeError(f"backend must be 'slice', 'condvar' or None, got {backend!r}")
    chosen = backend.strip().lower()
    if chosen not in BACKEND_NAMES:
        raise ValueError(f"backend must be 'slice', 'condvar' or None, got {backend!r}")
    return BACKEND_NAMES.index(chosen)


def _check_at_ns(at_ns: Any) -> int:
    """``at_ns`` as an int64 of ns; TypeError for non-int or bool, ValueError out of int64."""
    if isinstance(at_ns, bool) or not isinstance(at_ns, int):
        raise TypeError(f"at_ns must be an int of nanoseconds on time.monotonic_ns(), got {at_ns!r}")
    if not INT64_MIN <= at_ns <= INT64_MAX:
        raise ValueError(f"at_ns={at_ns!r} is out of the int64 nanosecond range")
    return at_ns


def _far_ahead_error(at_ns: int, now_ns: int) -> str:
    """The message refusing a deadline more than FAR_AHEAD_NS ahead of ``now_ns``."""
    years = (at_ns - now_ns) / (365 * 86_400 * 10**9)
    return (f"deadline at_ns={at_ns} is {years:.1f} years ahead of time.monotonic_ns() "
            f"(now {now_ns}): more than 10 years ahead on the monotonic clock, which counts from "
            f"boot, is almost surely wall-clock time (time.time()) by mistake; arm() takes float "
            f"seconds on time.monotonic(), arm_ns() int ns on time.monotonic_ns()")


def _seconds_to_ns(at: Any) -> int:
    """``at`` (float s on time.monotonic()) as int ns, rounded up so a release is never early."""
    if isinstance(at, bool) or not isinstance(at, Real):
        raise TypeError(f"at must be a number of seconds on time.monotonic(), got {at!r}")
    try:
        seconds = float(at)
    except OverflowError:  # an int or Fraction beyond the float range
        raise ValueError(f"at={at!r} s is out of the int64 nanosecond range") from None
    if not math.isfinite(seconds):
        raise ValueError(f"at={at!r} is not a finite number of seconds")
    scaled = seconds * 1e9  # checked as a float first: 1e300 s would overflow to inf
    if not -9.2e18 <= scaled <= 9.2e18:
        raise ValueError(f"at={at!r} s is out of the int64 nanosecond range")
    return _ceil_ns(seconds)


def _ceil_ns(seconds: float) -> int:
    """The least int ns at or after ``seconds`` exactly: ``math.ceil(seconds * 1e9)`` rounds the
    product first, to the nearest float, and so came out 1 ns below it for some values (0.8 % of
    deadlines near a machine's uptime), a release a hair before ``at``. The float is a ratio of
    ints (its denominator a power of 2), so the ceiling is exact in integers."""
    numerator, denominator = seconds.as_integer_ratio()
    return -(-numerator * 1_000_000_000 // denominator)


def _timeout_ns(timeout: Any) -> int:
    """A wait timeout (float s, None = forever) as int ns; -1 means forever."""
    if timeout is None:
        return -1
    if isinstance(timeout, bool) or not isinstance(timeout, Real):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    if timeout <= 0:  # compared before float(): -2**1024 would overflow it
        return 0
    try:
        seconds = float(timeout)
    except OverflowError:  # a positive int or Fraction beyond the float range: forever
        return -1
    if math.isnan(seconds):
        raise ValueError(f"timeout={timeout!r} is not a number")
    return -1 if seconds * 1e9 >= INT64_MAX / 2 else _ceil_ns(seconds)


async def _await_release(deadline: Any, chan: Any, key: int, fut: Optional[asyncio.Future]) -> None:
    """What ``await deadline`` runs, given its subscription (``ReleaseTimer._subscribe``'s
    ``(channel, key, future)``): await the future, None for a deadline already released; a
    cancelled await drops its future from the channel. ``deadline`` is only held, since a
    Deadline nobody references is abandoned: the await keeps it. Raises ReleaseTimerClosed if the
    timer closes first (the channel sets it on the future)."""
    if fut is None:
        return
    try:
        await fut
    except asyncio.CancelledError:
        chan.forget(key, fut)
        raise


def _fallback_future(d: Any, loop: asyncio.AbstractEventLoop) -> asyncio.Future:
    """A future for the Deadline ``d`` on a second loop: a helper thread waits and posts the outcome."""
    fut = loop.create_future()

    def settle(exc: Optional[BaseException]) -> None:
        if not fut.done():
            if exc is None:
                fut.set_result(None)
            else:
                fut.set_exception(exc)

    def helper() -> None:
        exc: Optional[BaseException] = None
        try:
            # In steps: an await cancelled meanwhile (its future done), or its loop closed, ends
            # this thread within a step, where a wait to the deadline kept it, up to 10 years, for
            # each such await.
            while not d.wait(WAIT_CHUNK_NS / 1e9):
                if fut.done() or loop.is_closed():
                    return
        except ReleaseTimerClosed as e:
            exc = e
        try:
            loop.call_soon_threadsafe(settle, exc)
        except RuntimeError:  # the loop is closed: nobody is left to wake
            pass

    threading.Thread(target=helper, name="timerwheel_c-release-helper", daemon=True).start()
    return fut

"""Due times as the public API takes them: Unix epoch ms (an int), a timezone-aware ``datetime``, or
relative to now: a ``datetime.timedelta`` in the due time's place, or ``delay=`` seconds.

A relative due time becomes absolute when the write is prepared, on :func:`relative_base_ms`'s clock
(the host's wall clock) unless the caller gives its own: a :class:`DurableTimerService` counts from the
clock it judges due times by (its store server's on PostgreSQL, or the clock a test injects).

Two unit mistakes are easy to make and would otherwise pass silently:

- A naive ``datetime`` has no defined instant (local time? UTC?), so it is refused.
- ``int(time.time()) + 5`` is *seconds*; taken as ms it is a date in January 1970, and the
  timer fires at once. Every int below :data:`PLAUSIBLY_SECONDS_BELOW` (10**11 ms is
  1973-03-03) is accepted, since tests and replays use small times on purpose, but logged
  at WARNING through the ``timerwheel_c.durable`` logger, naming the value.
- ``time.time_ns()`` or a µs timestamp is the opposite mistake: taken as ms it is some
  millennia ahead, and the timer never fires in anyone's lifetime. Every int at or above
  :data:`PLAUSIBLY_FINER_FROM` (10**14 ms is the year 5138) is accepted for the same reason
  but logged at WARNING.
"""
from __future__ import annotations

import datetime as _dt
import logging
import math
import time
from typing import Callable, Optional

from .keys import MAX_DUE_MS

__all__ = ["MAX_SPAN_S", "PLAUSIBLY_FINER_FROM", "PLAUSIBLY_SECONDS_BELOW", "DueMs", "due_at_ms_of", "due_or_delay",
           "relative_base_ms", "span_ms"]

#: The longest span in seconds that due times tell apart: the whole range of Unix epoch ms. A longer
#: one is no later a due time, and a finite float past it (1e308) times 1000 is inf, which no int is.
MAX_SPAN_S = MAX_DUE_MS / 1000


def span_ms(seconds: float) -> int:
    """``seconds`` (finite, >= 0) in whole ms, rounded up, and at most the range of due times (MAX_DUE_MS + 1
    for a longer span), so that a delay, a retry or a backoff of 1e308 s is as far off as one can be, never
    an OverflowError."""
    return MAX_DUE_MS + 1 if seconds > MAX_SPAN_S else math.ceil(seconds * 1000)

log = logging.getLogger("timerwheel_c.durable")

PLAUSIBLY_SECONDS_BELOW = 10**11
PLAUSIBLY_FINER_FROM = 10**14
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_MS = _dt.timedelta(milliseconds=1)


class DueMs(int):
    """A due time :func:`due_at_ms_of` has checked and converted, Unix epoch ms. Taken again, it is
    returned as it is: a layer that passes it down is not checked, converted nor warned about twice
    (the service checks a due time at its edge, then hands it to the writer)."""

    __slots__ = ()


def relative_base_ms() -> int:
    """Now, Unix epoch ms, as relative due times count from it: the host's wall clock."""
    return time.time_ns() // 1_000_000


def _relative(delay_ms: int, shown: object, name: str, base_ms: Optional[Callable[[], int]]) -> int:
    if delay_ms < 0:
        raise ValueError(f"{name} must not be negative, got {shown!r}")
    due_ms = (relative_base_ms() if base_ms is None else base_ms()) + delay_ms
    if due_ms > MAX_DUE_MS:
        raise ValueError(f"{name} must end by the latest due time, 2**64-1 ms after 1970 UTC, got {shown!r}")
    return due_ms


def due_or_delay(due_at: object, delay: object, name: str = "due_at_ms",
                 base_ms: Optional[Callable[[], int]] = None) -> object:
    """``due_at`` as given when ``delay`` is None (for :func:`due_at_ms_of` to check and convert, as it
    would be without a delay), else the due time ``delay`` seconds from now (an int or a float >= 0,
    rounded up to the ms so that a timer never comes due before its delay has passed), Unix epoch ms,
    with ``due_at`` None. Now is ``base_ms()``, Unix epoch ms (None: :func:`relative_base_ms`'s).

    Raises:
        TypeError: both given; a delay that is not a number (a bool, a str, a timedelta...).
        ValueError: a negative or non-finite delay.
    """
    if delay is None:
        return due_at
    if due_at is not None:
        raise TypeError(f"give {name} or delay=, not both: got {name}={due_at!r} and delay={delay!r}")
    if isinstance(delay, bool) or not isinstance(delay, (int, float)):
        raise TypeError(f"delay must be a number of seconds, got {type(delay).__name__} {delay!r}")
    if not math.isfinite(delay):
        raise ValueError(f"delay must be a finite number of seconds, got {delay!r}")
    return _relative(span_ms(delay), delay, "delay", base_ms)


def due_at_ms_of(value: object, name: str = "due_at_ms", base_ms: Optional[Callable[[], int]] = None, *,
                 bound: bool = False) -> int:
    """Return ``value`` as Unix epoch ms (int; a :class:`DueMs` as it is, checked already).

    Args:
        value: an int (Unix epoch ms), a timezone-aware :class:`datetime.datetime` (converted
            exactly, rounded up to the ms unless ``bound``) or a :class:`datetime.timedelta` >= 0 (that long from
            ``base_ms()``, rounded up to the ms).
        name: the argument's name, for messages.
        bound: ``value`` bounds a trigger's occurrences (its start or end) instead of being a due time: a
            datetime is rounded down to the ms, since an occurrence, a whole ms, falls after it (or at or
            before it) exactly when it falls after (at or before) that ms.
        base_ms: now, Unix epoch ms, as a relative due time counts from it; None:
            :func:`relative_base_ms`, the host's wall clock.

    Raises:
        TypeError: neither an int (bool excluded), a datetime nor a timedelta (None: give a due time
            or a delay).
        ValueError: a naive datetime (no ``tzinfo``), one before 1970-01-01 UTC, a negative timedelta.

    Range checks of ints (0..2**64-1) stay with :func:`timerwheel_c.durable.timers.keys.timer`.
    """
    if type(value) is DueMs:
        return value
    if type(value) is int and PLAUSIBLY_SECONDS_BELOW <= value < PLAUSIBLY_FINER_FROM:  # the common case, no warning
        return value
    if isinstance(value, _dt.timedelta):
        whole_ms, part = divmod(value, _MS)  # not -(-value // _MS): -timedelta.max overflows
        return _relative(whole_ms + bool(part), value, name, base_ms)
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(
                f"{name} must be a timezone-aware datetime (e.g. datetime.now(timezone.utc)), got the naive {value!r}")
        if value < _EPOCH:
            raise ValueError(f"{name} must not be before 1970-01-01 UTC, got {value!r}")
        # A due time is rounded up, as a timedelta is: a datetime holds us, and its timer never fires
        # before it.
        whole_ms, part = divmod(value - _EPOCH, _MS)
        return whole_ms + (bool(part) and not bound)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int (Unix epoch ms), an aware datetime or a timedelta, got {type(value).__name__} {value!r}")
    if 0 <= value < PLAUSIBLY_SECONDS_BELOW:
        log.warning("%s=%d is before 1973 as Unix epoch ms: if it is in seconds, multiply by 1000", name, value)
    elif PLAUSIBLY_FINER_FROM <= value < 2**64:  # above 2**64-1 it is refused (keys.timer), never warned of first
        log.warning("%s=%d is after the year 5000 as Unix epoch ms: if it is in us or ns "
                    "(time.time_ns()), divide by 1000 or 1000000", name, value)
    return value

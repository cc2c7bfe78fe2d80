"""Due times as the public API takes them: Unix epoch ms (an int) or a timezone-aware ``datetime``.

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

__all__ = ["PLAUSIBLY_FINER_FROM", "PLAUSIBLY_SECONDS_BELOW", "due_at_ms_of"]

log = logging.getLogger("timerwheel_c.durable")

PLAUSIBLY_SECONDS_BELOW = 10**11
PLAUSIBLY_FINER_FROM = 10**14
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_MS = _dt.timedelta(milliseconds=1)


def due_at_ms_of(value: object, name: str = "due_at_ms") -> int:
    """Return ``value`` as Unix epoch ms (int).

    Args:
        value: an int (Unix epoch ms) or a timezone-aware :class:`datetime.datetime`
            (converted exactly, rounding down to the ms).
        name: the argument's name, for messages.

    Raises:
        TypeError: neither an int (bool excluded) nor a datetime.
        ValueError: a naive datetime (no ``tzinfo``), or one before 1970-01-01 UTC.

    Range checks of ints (0..2**64-1) stay with :func:`timerwheel_c.durable.keys.timer`.
    """
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(
                f"{name} must be a timezone-aware datetime (e.g. datetime.now(timezone.utc)), got the naive {value!r}")
        ms = (value - _EPOCH) // _MS
        if ms < 0:
            raise ValueError(f"{name} must not be before 1970-01-01 UTC, got {value!r}")
        return ms
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int (Unix epoch ms) or an aware datetime, got {type(value).__name__} {value!r}")
    if 0 <= value < PLAUSIBLY_SECONDS_BELOW:
        log.warning("%s=%d is before 1973 as Unix epoch ms: if it is in seconds, multiply by 1000", name, value)
    elif value >= PLAUSIBLY_FINER_FROM:
        log.warning("%s=%d is after the year 5000 as Unix epoch ms: if it is in us or ns "
                    "(time.time_ns()), divide by 1000 or 1000000", name, value)
    return value

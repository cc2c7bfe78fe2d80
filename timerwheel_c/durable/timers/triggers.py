"""Recurring triggers: when a schedule's occurrences fall, as pure functions of Unix epoch ms.

A schedule is data (APScheduler 4's model): a trigger computes occurrences, and the store
keeps the trigger (:meth:`Trigger.to_dict`) and the schedule's next fire time. Everything
here is a pure function of its arguments; nothing reads a clock except a default ``start``.

- :class:`Every`: ``start + k*interval`` for k >= 1, in ms, computed arithmetically.
- :class:`Cron`: a 5-field cron expression in an IANA time zone, strictly after ``start``.
- :func:`due_occurrences`: which missed occurrences fire after an outage, a pause or a
  backlog, under a misfire policy (``"once"``, ``"skip"``, ``"all"``).
- :meth:`Trigger.jittered`: an occurrence's fire time, nominal + uniform [0, ``jitter_s``].

Every time is an int, Unix epoch ms. An occurrence's *nominal* time is where it falls on the
trigger's grid; jitter and lateness never move the grid (no drift): the occurrence after
``o`` is always ``next_after(o)``.

DST follows cronie's rule (cron(8), "Daylight Saving Time and other time changes"), with the
job's hour field deciding which side of it a job is on:

- A job with a fixed hour (the hour field does not start with ``*``) lives on the wall clock.
  A wall time in the spring-forward gap fires once, at the first instant after the gap
  (``30 2 * * *`` in New York on 2026-03-08 fires at 03:00 EDT); a wall time in the repeated
  fall-back hour fires once, at its first occurrence (``30 1 * * *`` fires at 01:30 EDT, not
  again at 01:30 EST). Nothing is skipped for a day and no wall time fires twice. The wall
  times of one gap fire together, once; a wall time the gap ends on is no gap time and fires
  too, 1 ms after them (``0 2,3 * * *`` fires at 03:00:00.000 EDT for 02:00, and at
  03:00:00.001 for 03:00), since occurrences are distinct instants. Being due together, the two
  are one under ``misfire="once"`` for a runner more than 1 ms late (it fires the 03:00 one);
  ``"skip"`` and ``"all"`` fire both.
- A job whose hour field starts with ``*`` lives on real time: it fires in every real hour
  that matches, so twice in a repeated hour and not in the hour that does not exist.

Debian's cron and cronie decide this with the same flag (``HR_STAR``), but also put a job whose
*minute* field starts with ``*`` on real time (``*/20 1 * * *``): such a job then fires twice
for the wall times of a repeated hour, and not at all on a spring-forward day whose gap
covers its hour. This module keeps the hour field as the only switch, so that no fixed-hour
job is ever skipped for a day or fired twice for one wall time.
"""
from __future__ import annotations

import datetime as _dt
import heapq
import json
import math
import time
import warnings
from dataclasses import dataclass
from itertools import islice, takewhile
from typing import Iterator, Optional, Protocol, Tuple, Union
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

# cronsim, not croniter: cronsim follows Debian cron's DST handling (a fixed-hour job fires
# once in a repeated hour, and right after a gap), which is the rule above; croniter 7
# fires a fixed-hour job twice in the repeated fall-back hour (``0 1 * * *`` in London on
# 2026-10-25 at 00:00Z and 01:00Z). Even so, cronsim (like Debian's cron) skips `*/20 2 * * *`
# on New York's spring day and repeats `*/20 1 * * *` in its fall hour, so for a fixed-hour
# job cronsim only matches naive wall times, and which instant each fires at is decided here
# (:meth:`Cron._instant_ms`); the rule then does not move with the library's version.
from cronsim import CronSim, CronSimError

from .due import MAX_SPAN_S, due_at_ms_of
from .keys import MAX_DUE_MS
from .names import iso_utc

__all__ = [
    "FORMAT_VERSION", "MISFIRE_POLICIES", "Cron", "DueOccurrences", "Every", "RandomSource", "Trigger",
    "check_misfire", "due_occurrences", "trigger_from_bytes", "trigger_from_dict",
]

FORMAT_VERSION = 1
MISFIRE_POLICIES = ("once", "skip", "all")
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_MS = _dt.timedelta(milliseconds=1)
_TWO_DAYS_MS = 2 * 86_400_000
# The longest interval a timedelta holds (some 2.7 million years), so that every stored
# interval converts back (trigger_from_dict).
_MAX_INTERVAL_MS = _dt.timedelta.max // _MS
_LIMITS = ("end_ms", "max_runs")  # stored only when set, so a schedule without them reads as before
_CRON_FIELDS = ("minute", "hour", "day-of-month", "month", "day-of-week")
_CRON_RANGES = {"minute": "0-59", "hour": "0-23", "day-of-month": "1-31", "month": "1-12 or JAN-DEC",
                "day-of-week": "0-7 or SUN-SAT"}
_CRON_ALIASES = {"@hourly": "0 * * * *", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@weekly": "0 0 * * 0",
                 "@monthly": "0 0 1 * *", "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *"}


class RandomSource(Protocol):
    """Where jitter comes from: a :class:`random.Random`, or anything with ``random()`` in [0, 1)."""

    def random(self) -> float: ...


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _check_ms(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int (Unix epoch ms), got {type(value).__name__} {value!r}")
    if not 0 <= value <= MAX_DUE_MS:
        raise ValueError(f"{name} must be in 0..2**64-1 (Unix epoch ms), got {value}")
    return value


def _seconds(name: str, value: object) -> float:
    """``value`` as a finite float >= 0 (seconds), or a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__} {value!r}")
    # Compared, never converted first: float(10**400) raises OverflowError, and a window past the
    # ms range (float max, say) would overflow to inf where a pass turns it into ms.
    # The longest grace, window or jitter is the whole range of Unix epoch ms (MAX_SPAN_S).
    if (isinstance(value, float) and not math.isfinite(value)) or not 0 <= value <= MAX_SPAN_S:
        raise ValueError(f"{name} must be a finite number of seconds from 0 to {MAX_SPAN_S:g}, got {value!r}")
    return float(value)


class _StoredMs(int):
    """A Unix epoch ms read back from a stored trigger (its start or end). It was given, and warned
    of if it looked like seconds or ns, when the schedule was made; a read (every claim of an
    occurrence, every listing) takes it as it is, with no warning repeated."""


def _ms_of(name: str, value: object) -> int:
    """``value`` (Unix epoch ms, an aware datetime; a :class:`_StoredMs` as it is) as checked ms."""
    if type(value) is _StoredMs:
        return _check_ms(name, int(value))
    return _check_ms(name, due_at_ms_of(value, name, bound=True))


def _start_ms_of(start: object) -> int:
    if start is None:
        return _now_ms()
    return _ms_of("start", start)


def _jitter_ms_of(jitter_s: object) -> int:
    return round(_seconds("jitter_s", jitter_s) * 1000)


def _format_s(ms: int) -> str:
    return f"{ms // 1000} s" if ms % 1000 == 0 else f"{ms / 1000:g} s"


class Trigger:
    """When a schedule's occurrences fall: a strictly increasing sequence of Unix epoch ms,
    all strictly after ``start_ms``.

    Attributes:
        start_ms: occurrences fall strictly after it (Unix epoch ms).
        jitter_ms: each occurrence fires up to this many ms after its nominal time.
        default_start: True when the constructor was given no start (so ``start_ms`` is the time
            it ran); not stored, and not part of equality. A schedule added again with such a
            trigger keeps the start it has (see :func:`~.schedules.add_schedule`).
    """

    __slots__ = ("start_ms", "jitter_ms", "default_start", "end_ms", "max_runs")
    start_ms: int
    jitter_ms: int
    default_start: bool
    end_ms: Optional[int]
    max_runs: Optional[int]

    def _set_limits(self, end: object, max_runs: object) -> None:
        """``end`` (the last time an occurrence may fall, an aware datetime or Unix epoch ms, after the
        start) and ``max_runs`` (the most occurrences done, an int >= 1), each None for no limit, as
        APScheduler 4's triggers take ``end_time`` (and its schedules ``max_runs``)."""
        self.end_ms = None if end is None else _ms_of("end", end)
        if self.end_ms is not None and self.end_ms <= self.start_ms:
            raise ValueError(f"end must be after the start ({self.start_ms} ms), got {end!r}")
        if max_runs is not None and (isinstance(max_runs, bool) or not isinstance(max_runs, int)):
            raise TypeError(f"max_runs must be an int >= 1 or None, got {type(max_runs).__name__} {max_runs!r}")
        if max_runs is not None and max_runs < 1:
            raise ValueError(f"max_runs must be >= 1 or None, got {max_runs!r}")
        self.max_runs = max_runs

    def _refuse_no_occurrence(self, start: object) -> None:
        """Raise ValueError naming ``start`` when no occurrence falls after it (past the year 9999 for a
        cron expression, no datetime holds one; past 2**64-1 ms for an interval): such a schedule would be
        stored and never fire, as one of an expression that matches nothing, which is refused too. Checked
        when a trigger is made, not when a stored one is read."""
        if next(iter(self.occurrences(self.start_ms)), None) is None:
            raise ValueError(f"start={start!r} ({self.start_ms} ms) leaves {self!r} no occurrence to fire: "
                             "the last occurrence it can fire falls before it")

    def ended(self, nominal_ms: int, runs: int) -> bool:
        """True when no occurrence at ``nominal_ms`` (Unix epoch ms) may fire: past ``end_ms``, or
        ``runs`` occurrences done already reach ``max_runs``."""
        return (self.end_ms is not None and nominal_ms > self.end_ms) or \
            (self.max_runs is not None and runs >= self.max_runs)

    @property
    def jitter_s(self) -> float:
        """The jitter bound in seconds (ms resolution)."""
        return self.jitter_ms / 1000

    def next_after(self, after_ms: int) -> Optional[int]:
        """The first occurrence strictly after ``after_ms`` (Unix epoch ms), or None when there
        is none (past 2**64-1 ms, or a cron expression that matches nothing for 50 years).

        Raises:
            TypeError, ValueError: ``after_ms`` is not an int in 0..2**64-1.
        """
        return next(self.occurrences(after_ms), None)

    def occurrences(self, after_ms: int) -> Iterator[int]:
        """The occurrences strictly after ``after_ms`` (and after ``start_ms``), in increasing
        order (Unix epoch ms). The iterator may be long or endless: take what is needed.

        Raises:
            TypeError, ValueError: ``after_ms`` is not an int in 0..2**64-1.
        """
        raise NotImplementedError

    def last_at_or_before(self, at_ms: int, after_ms: int) -> Optional[int]:
        """The latest occurrence ``o`` with ``after_ms < o <= at_ms``, or None (Unix epoch ms).

        Bounded work whatever the gap: a bisection over :meth:`next_after` (which is monotone),
        about log2(``at_ms - after_ms``) calls, so a ten-year outage costs some 40 calls.
        """
        _check_ms("at_ms", at_ms)
        first = self.next_after(after_ms)
        if first is None or first > at_ms:
            return None
        # Invariant: next_after(lo) <= at_ms < next_after(hi).
        lo, hi = first, at_ms
        second = self.next_after(first)
        if second is None or second > at_ms:
            return first
        while hi - lo > 1:
            mid = (lo + hi) // 2
            found = self.next_after(mid)
            if found is not None and found <= at_ms:
                lo = mid
            else:
                hi = mid
        return self.next_after(lo)

    def jittered(self, nominal_ms: int, rng: RandomSource) -> int:
        """The fire time of the occurrence at ``nominal_ms``: nominal + a uniform random delay
        in [0, ``jitter_s``], in whole ms (Unix epoch ms). ``rng`` is a :class:`random.Random`
        (anything with ``random()`` in [0, 1)). The grid never moves: the next occurrence
        follows ``nominal_ms``, never the jittered time.
        """
        _check_ms("nominal_ms", nominal_ms)
        if self.jitter_ms == 0:
            return nominal_ms
        # random() is in [0, 1), so this is uniform over the whole ms 0..jitter_ms inclusive.
        return min(nominal_ms + int(rng.random() * (self.jitter_ms + 1)), MAX_DUE_MS)

    def to_dict(self) -> dict:
        """A JSON-able dict with a ``version`` field, from which :func:`trigger_from_dict`
        rebuilds an equal trigger."""
        limits = {name: getattr(self, name) for name in _LIMITS if getattr(self, name) is not None}
        return {"version": FORMAT_VERSION, "start_ms": self.start_ms, "jitter_ms": self.jitter_ms, **limits}

    def to_bytes(self) -> bytes:
        """:meth:`to_dict` as compact UTF-8 JSON with sorted keys: equal triggers give equal bytes."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()

    def canonical(self) -> dict:
        """:meth:`to_dict` with the fields that place the occurrences in one canonical form: two
        triggers whose canonical() are equal fire at the same times (however their text was spelled),
        and are equal (``==``)."""
        return self.to_dict()

    def _key(self) -> tuple:
        return tuple(sorted(self.canonical().items()))

    def __eq__(self, other):
        return type(other) is type(self) and other._key() == self._key()

    def __hash__(self):
        return hash(self._key())

    def _describe(self) -> str:
        raise NotImplementedError

    def __str__(self):
        jitter = f", jitter {_format_s(self.jitter_ms)}" if self.jitter_ms else ""
        until = "" if self.end_ms is None else f", until {iso_utc(self.end_ms)}"
        runs = "" if self.max_runs is None else f", at most {self.max_runs} run{'s' if self.max_runs > 1 else ''}"
        return f"{self._describe()}{jitter}{until}{runs}"

    def _limits_repr(self) -> str:
        return "".join(f", {name.replace('_ms', '')}={getattr(self, name)}" for name in _LIMITS
                       if getattr(self, name) is not None)


class Every(Trigger):
    """Occurrences at ``start + k * interval`` for k >= 1 (Unix epoch ms), in real time: a
    24-hour interval is 86,400 s on a DST day too (use :class:`Cron` for a wall-clock time).

    Args:
        interval: seconds (an int or float > 0, rounded to the ms) or a :class:`datetime.timedelta`;
            at least 1 ms.
        start: the grid's origin, an aware :class:`datetime.datetime` or Unix epoch ms;
            defaults to now. The first occurrence is one interval after it. A schedule added
            again with no start keeps the grid it has, so an application that adds its
            schedules at every start does not push each first occurrence an interval away.
        jitter_s: each occurrence fires up to this many seconds after its nominal time
            (ms resolution, default 0, less than the interval).
        end: no occurrence falls after it (an aware datetime or Unix epoch ms, after ``start``); None.
        max_runs: the schedule stops once this many occurrences are done (an int >= 1); None.

    Raises:
        TypeError: an argument of the wrong type, naming it.
        ValueError: an interval under 1 ms (``Every(0)``), a negative or non-finite jitter or
            one not under the interval, a naive datetime ``start``, a ``start`` after which no
            occurrence can fire (past 2**64-1 ms); the message names the argument and the value.
    """

    __slots__ = ("interval_ms",)

    def __init__(self, interval: Union[float, _dt.timedelta], *, start: object = None, jitter_s: float = 0.0,
                 end: object = None, max_runs: Optional[int] = None):
        self._init(interval, start, jitter_s, end, max_runs)
        self._refuse_no_occurrence(start)

    @classmethod
    def _stored(cls, interval: _dt.timedelta, start: object, jitter_s: float, end: object,
                max_runs: Optional[int]) -> "Every":
        """The Every a stored schedule names, without the refusal of a start that leaves nothing to fire:
        that is for a trigger being made, and a read (every claim of an occurrence) neither repeats it
        nor fails on a schedule stored before it existed, as :meth:`Cron._stored` reads a Cron."""
        every = cls.__new__(cls)
        every._init(interval, start, jitter_s, end, max_runs)
        return every

    def _init(self, interval: Union[float, _dt.timedelta], start: object, jitter_s: float, end: object,
              max_runs: Optional[int]) -> None:
        interval_ms: Optional[int]
        if isinstance(interval, _dt.timedelta):
            # At most the ms a timedelta holds: timedelta.max itself rounds up past them.
            interval_ms = min(round(interval / _MS), _MAX_INTERVAL_MS)
        elif isinstance(interval, bool) or not isinstance(interval, (int, float)):
            raise TypeError(f"interval must be seconds (int or float) or a timedelta, "
                            f"got {type(interval).__name__} {interval!r}")
        elif isinstance(interval, float) and not math.isfinite(interval):
            raise ValueError(f"interval must be a finite number of seconds, got {interval!r}")
        else:
            # Bounded before the product: 1e308 * 1000 is inf, and 10**400 no float at all.
            interval_ms = round(interval * 1000) if abs(interval) <= _MAX_INTERVAL_MS / 1000 else None
        if interval_ms is None or not 1 <= interval_ms <= _MAX_INTERVAL_MS:
            raise ValueError(f"interval must be from 1 ms to {_MAX_INTERVAL_MS} ms (timedelta.max), "
                             f"got {interval!r}" + ("" if interval_ms is None else f" ({interval_ms} ms)"))
        self.interval_ms = interval_ms
        self.start_ms = _start_ms_of(start)
        self.default_start = start is None
        self.jitter_ms = _jitter_ms_of(jitter_s)
        if self.jitter_ms >= interval_ms:
            # An occurrence could then fire after the next one's nominal time: they would
            # coalesce under "once", or fire out of order.
            raise ValueError(f"jitter_s must be less than the interval ({interval_ms} ms), got {jitter_s!r}")
        self._set_limits(end, max_runs)

    def next_after(self, after_ms: int) -> Optional[int]:
        _check_ms("after_ms", after_ms)
        k = 1 if after_ms < self.start_ms else (after_ms - self.start_ms) // self.interval_ms + 1
        due_ms = self.start_ms + k * self.interval_ms
        return due_ms if due_ms <= MAX_DUE_MS else None

    def occurrences(self, after_ms: int) -> Iterator[int]:
        due_ms = self.next_after(after_ms)
        while due_ms is not None and due_ms <= MAX_DUE_MS:
            yield due_ms
            due_ms += self.interval_ms

    def last_at_or_before(self, at_ms: int, after_ms: int) -> Optional[int]:
        # Arithmetic, so an Every(0.001) ten years behind costs the same as one on time.
        _check_ms("at_ms", at_ms)
        _check_ms("after_ms", after_ms)
        k = (at_ms - self.start_ms) // self.interval_ms
        due_ms = self.start_ms + k * self.interval_ms
        return due_ms if k >= 1 and due_ms > after_ms else None

    def to_dict(self) -> dict:
        return {**super().to_dict(), "trigger": "every", "interval_ms": self.interval_ms}

    def __repr__(self):
        return f"Every({self.interval_ms / 1000!r}, start={self.start_ms}, jitter_s={self.jitter_s!r}{self._limits_repr()})"

    def _describe(self) -> str:
        return f"every {_format_s(self.interval_ms)}"


# Zones without daylight saving time that are picked by mistake for a region's clock, and that clock.
_FIXED_BY_MISTAKE = {"EST": "America/New_York", "MST": "America/Denver"}


# Names a system's zone folder may hold that are not zones of their own but links to the host's
# setting (Debian: localtime -> /etc/localtime; posixrules, a link its maintainer picks): refused
# by Cron().
_HOST_ZONES = frozenset({"localtime", "posixrules"})


def _zone_of(tz: object) -> ZoneInfo:
    """``tz`` as a ZoneInfo with an IANA key, so that it can be stored by name."""
    if isinstance(tz, str):
        try:
            return ZoneInfo(tz)
        # zoneinfo reads the key as a path: an odd one raises whatever its lookup met (a name too long for
        # the filesystem, a directory, a NUL), and every one of those is a name that is no zone.
        except (ZoneInfoNotFoundError, ValueError, OSError):
            raise ValueError(f"tz: unknown IANA time zone {tz!r} (e.g. 'Europe/London', 'UTC')") from None
    if tz is _dt.timezone.utc:
        return ZoneInfo("UTC")
    if isinstance(tz, _dt.tzinfo):
        # A ZoneInfo has .key, a pytz zone .zone; a fixed offset or a zone read from a file has
        # no name to store.
        name = getattr(tz, "key", None) or getattr(tz, "zone", None)
        if isinstance(name, str):
            return _zone_of(name)
        raise ValueError(f"tz: {tz!r} has no IANA name to store; pass a name such as 'Europe/London' "
                         f"(a fixed offset is 'Etc/GMT-5' for UTC+5)")
    raise TypeError(f"tz must be an IANA time zone name or a tzinfo, got {type(tz).__name__} {tz!r}")


def _parses(fields: Tuple[str, ...]) -> bool:
    try:
        CronSim(" ".join(fields), _dt.datetime(2000, 1, 1))
    except CronSimError:
        return False
    return True


def _cron_fields(expression: object) -> Tuple[str, ...]:
    if not isinstance(expression, str):
        raise TypeError(f"a cron expression must be a str, got {type(expression).__name__} {expression!r}")
    text = expression.strip()
    if text.startswith("@"):
        if text.lower() not in _CRON_ALIASES:
            raise ValueError(f"cron expression {expression!r}: unknown alias, expected one of {', '.join(_CRON_ALIASES)}")
        text = _CRON_ALIASES[text.lower()]
    fields = tuple(text.split())
    if len(fields) != 5:
        raise ValueError(f"cron expression {expression!r}: expected 5 fields (minute hour day-of-month month "
                         f"day-of-week), got {len(fields)}")
    try:
        CronSim(" ".join(fields), _dt.datetime(2000, 1, 1))
    except CronSimError as e:
        # cronsim says "Bad minute", "Bad day-of-month"...: name the field and quote it.
        message = str(e)
        if message == "Bad day-of-month" and _parses(fields[:3] + ("*",) + fields[4:]):
            # cronsim says so too when each field is valid but no month of the expression has the day
            raise ValueError(f"cron expression {expression!r}: day-of-month field {fields[2]!r} falls in no month "
                             f"of month field {fields[3]!r}, so it would never fire") from None
        for i, field in enumerate(_CRON_FIELDS):
            if message == f"Bad {field}":
                raise ValueError(f"cron expression {expression!r}: bad {field} field {fields[i]!r} "
                                 f"({field} is {_CRON_RANGES[field]})") from None
        raise ValueError(f"cron expression {expression!r}: {message}") from None
    return fields


class Cron(Trigger):
    """Occurrences of a cron expression in a time zone, strictly after ``start`` (Unix epoch ms).

    Args:
        expression: 5 fields, minute hour day-of-month month day-of-week, in Vixie cron's
            syntax (lists, ranges, steps, month and day names; day-of-month and day-of-week
            match either when neither field starts with ``*``, both otherwise, so ``0 0 */2 * 1``
            is odd days that are Mondays, as Vixie cron reads it); or ``@hourly``, ``@daily`` (``@midnight``),
            ``@weekly``, ``@monthly``, ``@yearly`` (``@annually``). Parsed by cronsim, whose
            extensions (``L``, ``LW``, ``5L``, ``MON#2``) are accepted too.
        tz: an IANA zone name or a tzinfo that has one (a :class:`zoneinfo.ZoneInfo`,
            :data:`datetime.timezone.utc`); default ``"UTC"``. Zone data comes from the
            system or the ``tzdata`` package.
        start: an aware :class:`datetime.datetime` or Unix epoch ms; default now.
        jitter_s: each occurrence fires up to this many seconds after its nominal time; keep
            it under the shortest gap between occurrences, or an occurrence may fire after the
            next one's nominal time (and coalesce with it under ``"once"``).
        end, max_runs: as :class:`Every`'s.

    DST: see the module docstring (cronie's rule, keyed on the hour field).

    Raises:
        TypeError: an argument of the wrong type, naming it.
        ValueError: a bad expression, naming the field and its text (``Cron("61 * * * *")``:
            "bad minute field '61'"); an unknown zone, or ``"localtime"`` (each host's own); a
            negative jitter; a naive ``start``, or one after which no occurrence can fire (past the
            year 9999).

    Warns:
        UserWarning: ``tz`` is ``"EST"`` or ``"MST"``, fixed offsets without daylight saving time that
            are usually meant as ``"America/New_York"`` or ``"America/Denver"``.
    """

    __slots__ = ("expression", "tz", "_expr", "_on_wall_clock")

    def __init__(self, expression: str, tz: Union[str, _dt.tzinfo] = "UTC", *, start: object = None,
                 jitter_s: float = 0.0, end: object = None, max_runs: Optional[int] = None):
        # Refused when made, not when read: a schedule stored with one before still loads.
        if isinstance(tz, str) and tz in _HOST_ZONES:
            raise ValueError(f"tz: {tz!r} names whatever zone each host is set to, so a schedule would fire at "
                             f"different times on different runners; name the zone (e.g. 'Europe/London')")
        self._init(expression, tz, start, jitter_s, end, max_runs)
        self._refuse_no_occurrence(start)
        meant = _FIXED_BY_MISTAKE.get(self.tz.key)
        if meant is not None:
            warnings.warn(f"tz {self.tz.key!r} keeps one UTC offset all year, with no daylight saving time, so "
                          f"half the year it fires an hour off the local clock; for that clock use {meant!r}",
                          UserWarning, stacklevel=2)

    @classmethod
    def _stored(cls, expression: str, tz: str, start_ms: int, jitter_s: float, end: object,
                max_runs: Optional[int]) -> "Cron":
        """The Cron a stored schedule names, without the warning about its zone: that was given when
        the schedule was made, and a read (every claim of an occurrence) must not repeat it, nor fail
        under ``-W error``."""
        cron = cls.__new__(cls)
        cron._init(expression, tz, start_ms, jitter_s, end, max_runs)
        return cron

    def _init(self, expression: str, tz: Union[str, _dt.tzinfo], start: object, jitter_s: float, end: object,
              max_runs: Optional[int]) -> None:
        fields = _cron_fields(expression)
        self.expression = expression.strip()
        self._expr = " ".join(fields)
        self._on_wall_clock = not fields[1].startswith("*")
        self.tz = _zone_of(tz)
        self.start_ms = _start_ms_of(start)
        self.default_start = start is None
        self.jitter_ms = _jitter_ms_of(jitter_s)
        self._set_limits(end, max_runs)

    def occurrences(self, after_ms: int) -> Iterator[int]:
        _check_ms("after_ms", after_ms)
        after_ms = max(after_ms, self.start_ms)
        # Cron's resolution is the minute, so Python's datetime range (year 9999) is reached only
        # by an after_ms near the top of the u64 range: no occurrence can be found past it.
        try:
            local = (_EPOCH + _dt.timedelta(milliseconds=after_ms)).astimezone(self.tz)
        except OverflowError:
            return
        previous_ms = after_ms
        # cronsim stops (StopIteration) after 50 years without a match, which bounds the loop;
        # past the year 9999 no datetime, so no occurrence, can be represented.
        try:
            if self._on_wall_clock:
                # From 1 ms before after_ms's wall time: cronsim yields what is strictly after its start, and
                # the wall time after_ms reads may still have an occurrence of its own after after_ms (the
                # one that a gap's occurrence precedes by 1 ms, see _instant_ms).
                for wall in CronSim(self._expr, local.replace(tzinfo=None) - _MS):
                    due_ms = self._instant_ms(wall)
                    # Skipped: wall times of a repeated hour whose first occurrence is already
                    # past (after_ms in the hour's second pass; at most an hour of minutes), and
                    # wall times in a gap that all fire at the gap's end, once.
                    if due_ms > previous_ms:
                        if due_ms > MAX_DUE_MS:
                            return
                        yield due_ms
                        previous_ms = due_ms
            else:
                yield from self._real_time(after_ms, local)
        except OverflowError:
            return

    def _real_time(self, after_ms: int, local: _dt.datetime) -> Iterator[int]:
        """The occurrences of a job on real time after ``after_ms`` (whose reading in the zone is
        ``local``): every instant whose reading matches, a repeated reading at each of its instants and
        one in a gap at none. cronsim only matches naive wall times here: its own walk of aware times
        skips readings where a shift is not a whole hour at the top of one (Lord Howe's 30 minutes,
        Gaza's change at 00:01). An instant of a reading's second pass falls up to the shift after the
        first pass of later readings, so instants wait in a heap until no later reading can precede them."""
        start = local.replace(tzinfo=None) - _MS
        # A fall-back within the next two days repeats readings from before ``local``: start that much
        # earlier, so that their second pass, still to come, is found.
        now = local.utcoffset()
        try:
            ahead = self._offset_at(min(after_ms + _TWO_DAYS_MS, MAX_DUE_MS))
        except OverflowError:  # two days ahead is past the year 9999: no fall-back there to look back for
            ahead = None
        if now is not None and ahead is not None and ahead < now:
            start -= now - ahead
        pending: list = []
        try:
            for wall in CronSim(self._expr, start):
                instants = self._instants_of(wall)
                if not instants:
                    continue  # in a gap: no instant reads it
                while pending and pending[0] < instants[0]:
                    due_ms = heapq.heappop(pending)
                    if due_ms > after_ms:
                        yield due_ms
                for due_ms in instants:
                    heapq.heappush(pending, due_ms)
        except OverflowError:  # a reading past the year 9999: the instants found before it still come
            pass
        # cronsim found no match for 50 years, or the readings reached the year 9999's end. No instant
        # here passes MAX_DUE_MS: a datetime ends in the year 9999.
        yield from (due_ms for due_ms in sorted(pending) if due_ms > after_ms)

    def _instants_of(self, wall: _dt.datetime) -> list:
        """The instants (Unix epoch ms, ascending) whose reading in the zone is the naive ``wall``: two
        in a repeated hour (PEP 495's fold 0 and 1), none in a gap, else one."""
        found: list = []
        for fold in (0, 1):
            at_ms = (wall.replace(tzinfo=self.tz, fold=fold) - _EPOCH) // _MS
            if at_ms not in found and self._reading(at_ms).replace(tzinfo=None) == wall:
                found.append(at_ms)
        return sorted(found)

    def _instant_ms(self, wall: _dt.datetime) -> int:
        """The instant (Unix epoch ms) a naive wall time of this zone fires at: its first
        occurrence if it is repeated (fold=0 is the earlier, PEP 495), the end of the gap if
        it does not exist, and 1 ms after the end of a gap that ends on it when the expression
        names a wall time in that gap too (whose occurrence takes the gap's end)."""
        first = wall.replace(tzinfo=self.tz, fold=0)
        first_ms = (first - _EPOCH) // _MS
        if first.astimezone(_dt.timezone.utc).astimezone(self.tz).replace(tzinfo=None) == wall:
            return first_ms + self._gap_before(wall, first_ms)
        # In a gap, fold=0 reads the wall time with the offset from before the gap (an instant
        # after the gap) and fold=1 with the one from after it (an instant before the gap):
        # the transition lies between the two. Bisect to it in ms.
        lo = (wall.replace(tzinfo=self.tz, fold=1) - _EPOCH) // _MS
        hi = first_ms
        before = self._offset_at(lo)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._offset_at(mid) == before:
                lo = mid
            else:
                hi = mid
        return hi

    def _gap_before(self, wall: _dt.datetime, at_ms: int) -> int:
        """1 when a spring-forward gap ends at ``at_ms`` (the instant of the existing wall time
        ``wall``) and the expression names a wall time inside it, else 0."""
        after, before = self._offset_at(at_ms), self._offset_at(at_ms - 1)
        if after is None or before is None or after <= before:
            return 0
        try:  # the first wall time the expression names from the gap's first one on
            named = next(CronSim(self._expr, wall - (after - before) - _dt.timedelta(seconds=1)))
        except StopIteration:
            return 0
        return int(named < wall)

    def _reading(self, at_ms: int) -> _dt.datetime:
        """The zone's reading (an aware datetime) of the instant ``at_ms`` (Unix epoch ms)."""
        return (_EPOCH + _dt.timedelta(milliseconds=at_ms)).astimezone(self.tz)

    def _offset_at(self, at_ms: int) -> Optional[_dt.timedelta]:
        return self._reading(at_ms).utcoffset()

    def to_dict(self) -> dict:
        return {**super().to_dict(), "trigger": "cron", "expression": self.expression, "tz": self.tz.key}

    def canonical(self) -> dict:
        """The expression as the values each field matches, cronsim's reading of it: ``@daily``,
        ``0  0 * * *`` and ``0 0 * * 0-6`` are one schedule, and adding one again as another spelling
        keeps its place on the grid. The hour field's kind (``*`` or not) stays, as it picks the DST
        rule; the zone stays its name (a link and its target, ``US/Eastern`` and ``America/New_York``,
        are two names)."""
        sim = CronSim(self._expr, _dt.datetime(2000, 1, 1))
        # cronsim reads Sunday as 0 and as 7 (a "*" holds both); one of them here. A weekday is an int,
        # or (weekday, n) for "the n-th in the month".
        weekdays = frozenset((0, d[1]) if isinstance(d, tuple) and d[0] == 7 else 0 if d == 7 else d
                             for d in sim.weekdays)
        fields = (*map(frozenset, (sim.minutes, sim.hours, sim.days, sim.months)), weekdays)
        return {**self.to_dict(), "expression": (*fields, sim.day_and, self._on_wall_clock)}

    def __repr__(self):
        return (f"Cron({self.expression!r}, tz={self.tz.key!r}, start={self.start_ms}, jitter_s={self.jitter_s!r}"
                f"{self._limits_repr()})")

    def _describe(self) -> str:
        return f"cron {self.expression!r} {self.tz.key}"


def trigger_from_dict(data: object) -> Trigger:
    """Rebuild a trigger from :meth:`Trigger.to_dict`'s output, validating it as the
    constructors do.

    Raises:
        ValueError: not a dict, an unknown ``version`` or ``trigger``, a missing or extra key,
            or a value the constructor refuses; the message names the key and the value.
    """
    if not isinstance(data, dict):
        raise ValueError(f"a stored trigger must be a dict, got {type(data).__name__} {data!r}")
    version = data.get("version")
    if version != FORMAT_VERSION:
        raise ValueError(f"stored trigger version {version!r} is not one this timerwheel_c reads ({FORMAT_VERSION})")
    kind = data.get("trigger")
    if kind not in ("every", "cron"):
        raise ValueError(f"stored trigger type {kind!r} is unknown (expected 'every' or 'cron')")
    expected = {"version", "trigger", "start_ms", "jitter_ms"} | (
        {"interval_ms"} if kind == "every" else {"expression", "tz"}) | (set(_LIMITS) & set(data))
    if set(data) != expected:
        raise ValueError(f"stored {kind} trigger: missing keys {sorted(expected - set(data))}, "
                         f"unknown keys {sorted(set(data) - expected)}")
    try:
        for name in ("start_ms", "jitter_ms") + (("interval_ms",) if kind == "every" else ()):
            _check_ms(name, data[name])
        jitter_s = data["jitter_ms"] / 1000
        start = _StoredMs(data["start_ms"])
        end = data.get("end_ms")
        limits = {"end": None if end is None else _StoredMs(_check_ms("end_ms", end)), "max_runs": data.get("max_runs")}
        if kind == "every":
            return Every._stored(_dt.timedelta(milliseconds=data["interval_ms"]), start, jitter_s, **limits)
        return Cron._stored(data["expression"], data["tz"], start, jitter_s, **limits)
    except (TypeError, OverflowError) as e:
        raise ValueError(f"stored {kind} trigger: {e}") from None


def trigger_from_bytes(data: bytes) -> Trigger:
    """Rebuild a trigger from :meth:`Trigger.to_bytes`'s output.

    Raises:
        ValueError: not UTF-8 JSON, or anything :func:`trigger_from_dict` refuses.
    """
    try:
        decoded = json.loads(bytes(data).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"a stored trigger is not UTF-8 JSON ({e}): {bytes(data)[:80]!r}") from None
    return trigger_from_dict(decoded)


def check_misfire(misfire: str = "once", misfire_grace_s: float = 60.0,
                  catchup_window_s: Optional[float] = None) -> None:
    """Validate a misfire policy (see :func:`due_occurrences`), so that a schedule is refused
    when it is added, not when it first misfires.

    Raises:
        TypeError: a non-numeric grace or window.
        ValueError: an unknown policy; a negative or non-finite grace or window;
            ``catchup_window_s`` missing with ``"all"`` or given with another policy.
    """
    if misfire not in MISFIRE_POLICIES:
        raise ValueError(f"misfire must be one of {', '.join(map(repr, MISFIRE_POLICIES))}, got {misfire!r}")
    _seconds("misfire_grace_s", misfire_grace_s)
    if misfire == "all":
        if catchup_window_s is None:
            raise ValueError("misfire='all' needs catchup_window_s: how old (seconds) a missed occurrence "
                             "may be and still fire, so that an outage cannot queue unbounded work")
        _seconds("catchup_window_s", catchup_window_s)
    elif catchup_window_s is not None:
        raise ValueError(f"catchup_window_s applies to misfire='all' only, got {catchup_window_s!r} "
                         f"with misfire={misfire!r}")


@dataclass(frozen=True)
class DueOccurrences:
    """What a schedule does at ``now_ms`` (every field Unix epoch ms).

    Attributes:
        fire_ms: nominal times to fire now, oldest first, one at a time (never overlapping).
            When occurrence ``o`` is done, the schedule's last nominal time becomes ``o``.
        last_missed_ms: the latest occurrence at or before now and the trigger's end (fired or
            dropped), or None if none is due. When ``fire_ms`` is empty and this is not None, every due occurrence
            was dropped: the last nominal time becomes this, with nothing fired.
        next_ms: the first occurrence strictly after now (or None if the trigger has no more):
            where the schedule continues on its grid.
    """

    fire_ms: Tuple[int, ...]
    last_missed_ms: Optional[int]
    next_ms: Optional[int]


def due_occurrences(trigger: Trigger, last_nominal_ms: int, now_ms: int, misfire: str = "once",
                    misfire_grace_s: float = 60.0, catchup_window_s: Optional[float] = None, *,
                    limit: int = 1000) -> DueOccurrences:
    """Resolve the occurrences due at ``now_ms`` that follow ``last_nominal_ms`` (the nominal
    time of the last occurrence done or dropped; ``trigger.start_ms`` for a new schedule).

    Policies (APScheduler's coalescing and misfire grace time, Quartz's misfire instructions):

    - ``"once"``: a single occurrence for all that are due, the most recent one.

    Only occurrences at or before the trigger's ``end_ms`` are due, whatever the policy: a
    schedule whose end passed while no runner served it fires what it owed before the end.
    - ``"skip"``: drops every occurrence more than ``misfire_grace_s`` late and fires the
      others, oldest first.
    - ``"all"``: fires each due occurrence no older than ``catchup_window_s``, oldest first.

    Lateness counts from the end of an occurrence's jitter window (nominal + ``jitter_s``),
    so a jitter never makes an occurrence late by itself. Nothing here moves the grid: the
    schedule continues at ``next_ms`` (and after a fired ``o``, at ``trigger.next_after(o)``).

    Work is bounded whatever the gap: ``"once"`` costs some 40 trigger steps after ten years
    (arithmetic for :class:`Every`); ``"skip"`` and ``"all"`` return at most ``limit``
    occurrences (the runner asks again once they are done).

    Raises:
        TypeError, ValueError: a time that is not an int in 0..2**64-1, a ``limit`` under 1,
            or anything :func:`check_misfire` refuses.
    """
    check_misfire(misfire, misfire_grace_s, catchup_window_s)
    _check_ms("last_nominal_ms", last_nominal_ms)
    _check_ms("now_ms", now_ms)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an int >= 1, got {limit!r}")
    # Only occurrences up to the trigger's end are owed: an outage that outlasts the end still
    # owes the ones before it, and "once" coalesces them into the last of those, not into a grid
    # point past the end that would end the schedule with nothing fired.
    upto_ms = now_ms if trigger.end_ms is None else min(now_ms, trigger.end_ms)
    last_missed_ms = trigger.last_at_or_before(upto_ms, last_nominal_ms)
    next_ms = trigger.next_after(max(now_ms, last_nominal_ms))
    if last_missed_ms is None:
        return DueOccurrences((), None, next_ms)
    if misfire == "once":
        return DueOccurrences((last_missed_ms,), last_missed_ms, next_ms)
    window_s = misfire_grace_s if misfire == "skip" else catchup_window_s
    assert window_s is not None  # check_misfire requires it with "all"
    oldest_ms = now_ms - round(window_s * 1000) - trigger.jitter_ms
    after_ms = max(last_nominal_ms, min(oldest_ms - 1, MAX_DUE_MS))
    fire = tuple(islice(takewhile(lambda due_ms: due_ms <= upto_ms, trigger.occurrences(after_ms)), limit))
    return DueOccurrences(fire, last_missed_ms, next_ms)

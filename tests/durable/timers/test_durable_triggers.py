"""Recurring triggers: Every and Cron occurrences, cronie's DST rule in New York and London across
both 2026 transitions, a leap day, no drift when fired late, each misfire policy after a gap,
bounded work after a long outage, jitter bounds, the stored form, and bad input.

Every test here calls pure functions of Unix epoch ms with times it picks itself: no clock, no
sleep, nothing to flake. The zone data comes from the tzdata package (a dependency), so the
expected offsets hold on any machine.
"""
from __future__ import annotations

import datetime as dt
import functools
import itertools
import json
import random
import warnings
from zoneinfo import ZoneInfo

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from cronsim import CronSim

from timerwheel_c.durable.timers.triggers import (
    Cron, DueOccurrences, Every, check_misfire, due_occurrences, trigger_from_bytes, trigger_from_dict,
)

# cronsim resolves to 2.6 on CPython 3.9, 2.7 on 3.10 and the newest on 3.11+.
pytestmark = pytest.mark.every_python

UTC = dt.timezone.utc
MINUTE_MS = 60_000
HOUR_MS = 3_600_000
DAY_MS = 86_400_000


def at_ms(iso: str) -> int:
    """Unix epoch ms of an ISO 8601 time with its offset, e.g. "2026-03-08T03:00-04:00"."""
    return int(dt.datetime.fromisoformat(iso).timestamp() * 1000)


def local_iso(due_ms: int, tz: str) -> str:
    return dt.datetime.fromtimestamp(due_ms / 1000, ZoneInfo(tz)).isoformat(timespec="minutes")


def between(trigger, start_iso: str, end_iso: str) -> list:
    """The occurrences in (start, end], as local ISO times with their offsets."""
    end_ms = at_ms(end_iso)
    out = []
    for due_ms in trigger.occurrences(at_ms(start_iso)):
        if due_ms > end_ms:
            break
        out.append(local_iso(due_ms, trigger.tz.key))
    return out


def assert_next_after_agrees(trigger, expected_iso: list, start_iso: str, end_iso: str, step_ms=10 * MINUTE_MS):
    """next_after(x) is the first expected occurrence after x for every x in the window, including
    instants inside a repeated hour's second pass, so no start point re-fires a wall time."""
    expected = [at_ms(iso) for iso in expected_iso]
    for x in range(at_ms(start_iso), expected[-1], step_ms):
        assert trigger.next_after(x) == min(e for e in expected if e > x), local_iso(x, trigger.tz.key)


# (zone, expression, window start, window end, every occurrence in the window as local time).
# 2026 transitions: New York springs forward 2026-03-08 02:00 EST -> 03:00 EDT and falls back
# 2026-11-01 02:00 EDT -> 01:00 EST; London 2026-03-29 01:00 GMT -> 02:00 BST and
# 2026-10-25 02:00 BST -> 01:00 GMT.
DST_CASES = [
    pytest.param("America/New_York", "30 2 * * *", "2026-03-06T12:00-05:00", "2026-03-10T00:00-04:00",
                 ["2026-03-07T02:30-05:00", "2026-03-08T03:00-04:00", "2026-03-09T02:30-04:00"],
                 id="ny-daily-in-the-gap-runs-once-right-after-it"),
    pytest.param("America/New_York", "30 1 * * *", "2026-10-31T00:00-04:00", "2026-11-03T00:00-05:00",
                 ["2026-10-31T01:30-04:00", "2026-11-01T01:30-04:00", "2026-11-02T01:30-05:00"],
                 id="ny-daily-in-the-repeated-hour-runs-once-at-the-first"),
    pytest.param("America/New_York", "30 2 * * *", "2026-10-31T00:00-04:00", "2026-11-03T00:00-05:00",
                 ["2026-10-31T02:30-04:00", "2026-11-01T02:30-05:00", "2026-11-02T02:30-05:00"],
                 id="ny-daily-outside-the-repeated-hour-unchanged"),
    pytest.param("Europe/London", "0 1 * * *", "2026-03-27T12:00+00:00", "2026-03-31T00:00+01:00",
                 ["2026-03-28T01:00+00:00", "2026-03-29T02:00+01:00", "2026-03-30T01:00+01:00"],
                 id="london-daily-in-the-gap-runs-once-right-after-it"),
    pytest.param("Europe/London", "0 1 * * *", "2026-10-23T12:00+01:00", "2026-10-27T00:00+00:00",
                 ["2026-10-24T01:00+01:00", "2026-10-25T01:00+01:00", "2026-10-26T01:00+00:00"],
                 id="london-daily-in-the-repeated-hour-runs-once-at-the-first"),
    pytest.param("America/New_York", "30 2 * * 0", "2026-02-28T00:00-05:00", "2026-03-16T00:00-04:00",
                 ["2026-03-01T02:30-05:00", "2026-03-08T03:00-04:00", "2026-03-15T02:30-04:00"],
                 id="ny-sundays-in-the-gap"),
    pytest.param("America/New_York", "30 1 * * SUN", "2026-10-24T00:00-04:00", "2026-11-09T00:00-05:00",
                 ["2026-10-25T01:30-04:00", "2026-11-01T01:30-04:00", "2026-11-08T01:30-05:00"],
                 id="ny-sundays-in-the-repeated-hour"),
    pytest.param("Europe/London", "0 9 * * 1-5", "2026-03-26T12:00+00:00", "2026-03-31T00:00+01:00",
                 ["2026-03-27T09:00+00:00", "2026-03-30T09:00+01:00"],
                 id="london-weekdays-keep-their-wall-time-across-spring"),
    pytest.param("Europe/London", "30 1 * * 0", "2026-10-17T12:00+01:00", "2026-11-02T00:00+00:00",
                 ["2026-10-18T01:30+01:00", "2026-10-25T01:30+01:00", "2026-11-01T01:30+00:00"],
                 id="london-sundays-in-the-repeated-hour"),
    pytest.param("America/New_York", "0 * * * *", "2026-03-08T00:30-05:00", "2026-03-08T04:30-04:00",
                 ["2026-03-08T01:00-05:00", "2026-03-08T03:00-04:00", "2026-03-08T04:00-04:00"],
                 id="ny-hourly-runs-in-every-real-hour-spring"),
    pytest.param("America/New_York", "0 * * * *", "2026-11-01T00:30-04:00", "2026-11-01T02:30-05:00",
                 ["2026-11-01T01:00-04:00", "2026-11-01T01:00-05:00", "2026-11-01T02:00-05:00"],
                 id="ny-hourly-runs-in-every-real-hour-fall"),
    pytest.param("Europe/London", "15 * * * *", "2026-03-29T00:00+00:00", "2026-03-29T03:00+01:00",
                 ["2026-03-29T00:15+00:00", "2026-03-29T02:15+01:00"],
                 id="london-hourly-runs-in-every-real-hour-spring"),
    pytest.param("Europe/London", "15 * * * *", "2026-10-25T00:30+01:00", "2026-10-25T02:30+00:00",
                 ["2026-10-25T01:15+01:00", "2026-10-25T01:15+00:00", "2026-10-25T02:15+00:00"],
                 id="london-hourly-runs-in-every-real-hour-fall"),
    # The hour field alone decides: a fixed hour with a starred minute keeps the wall-clock rule
    # (Debian's cron would fire these wall times twice, and skip the spring day).
    pytest.param("America/New_York", "*/20 1-2 * * *", "2026-11-01T00:30-04:00", "2026-11-01T03:00-05:00",
                 ["2026-11-01T01:00-04:00", "2026-11-01T01:20-04:00", "2026-11-01T01:40-04:00",
                  "2026-11-01T02:00-05:00", "2026-11-01T02:20-05:00", "2026-11-01T02:40-05:00"],
                 id="ny-fixed-hour-starred-minute-runs-each-wall-time-once"),
    pytest.param("America/New_York", "*/20 2 * * *", "2026-03-07T12:00-05:00", "2026-03-09T02:30-04:00",
                 ["2026-03-08T03:00-04:00", "2026-03-09T02:00-04:00", "2026-03-09T02:20-04:00"],
                 id="ny-fixed-hour-starred-minute-not-skipped-for-the-spring-day"),
    # A wall time in the gap and the one the gap ends on are two occurrences (1 ms apart).
    pytest.param("America/New_York", "0 2-3 * * *", "2026-03-07T12:00-05:00", "2026-03-09T00:00-04:00",
                 ["2026-03-08T03:00-04:00", "2026-03-08T03:00-04:00"],
                 id="ny-gap-time-and-the-time-the-gap-ends-on-both-fire"),
    pytest.param("Europe/London", "0 1,2 * * *", "2026-03-28T12:00+00:00", "2026-03-30T00:00+01:00",
                 ["2026-03-29T02:00+01:00", "2026-03-29T02:00+01:00"],
                 id="london-gap-time-and-the-time-the-gap-ends-on-both-fire"),
]


@pytest.mark.parametrize("zone, expression, start, end, expected", DST_CASES)
def test_cron_follows_cronies_dst_rule(zone, expression, start, end, expected):
    """The occurrences in a window across a 2026 transition are exactly the expected local times:
    a fixed-hour time in the gap fires once right after it, one in the repeated hour once at the
    first pass, a starred-hour job in every real hour. Iterating and asking next_after from any
    instant of the window (the repeated hour's second pass included) agree."""
    cron = Cron(expression, zone, start=at_ms(start))
    assert between(cron, start, end) == expected
    assert_next_after_agrees(cron, expected, start, end)


EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
# Zones with unusual transitions: 30-minute DST (Lord Howe), a skipped day (Apia, 2011-12-30),
# transitions at midnight (Santiago, Havana, Tehran until 2022).
ZONES = ["America/New_York", "Europe/London", "Australia/Lord_Howe", "America/Santiago", "Pacific/Apia",
         "Asia/Tehran", "America/Havana", "Europe/Chisinau"]


@functools.lru_cache(maxsize=None)
def transitions_ms(zone: str, year: int) -> tuple:
    """The instants (Unix epoch ms, to the half hour) at which the zone's UTC offset changes in a year.
    Only a quarter day whose ends differ in offset is walked by the half hour (no zone changes its
    offset twice within six hours), about a sixth of the conversions of walking the whole year."""
    tz, start, out = ZoneInfo(zone), dt.datetime(year, 1, 1, tzinfo=UTC), []
    quarter, half = dt.timedelta(hours=6), dt.timedelta(minutes=30)
    while start.year == year:
        end = start + quarter
        if end.astimezone(tz).utcoffset() != start.astimezone(tz).utcoffset():
            t, previous = start, start.astimezone(tz).utcoffset()
            while t < end:
                t += half
                offset = t.astimezone(tz).utcoffset()
                if offset != previous and t.year == year:
                    out.append((t - EPOCH) // dt.timedelta(milliseconds=1))
                previous = offset
        start = end
    return tuple(out)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["0", "30", "15,45", "5-10", "0-59/20", "59"]),
       st.sampled_from(["0", "1", "2", "3", "0-3", "1,2", "23"]),
       st.sampled_from(["*", "1", "15", "29"]), st.sampled_from(["*", "0", "1-5", "6"]),
       st.sampled_from(ZONES), st.sampled_from([2011, 2016, 2026]), st.integers(0, 10), st.integers(0, 3 * 24 * 60))
def test_cron_agrees_with_cronsim_where_their_rules_coincide(minute, hour, dom, dow, zone, year, which, before_min):
    """Differential: for a fixed minute and hour (Debian's rule and ours coincide there), twelve occurrences
    from a few days before a transition are cronsim's, in zones with 30-minute DST, a skipped day
    and midnight transitions. Starts in a repeated hour's second pass are left out: cronsim drops
    the fold there and answers a time before the start (ours never does, as the DST cases show).
    Ours also fires the wall time a gap ends on when a gap time fired at that instant, 1 ms later
    (the only occurrences off a whole second), where cronsim merges the two: those are left out."""
    found = transitions_ms(zone, year)
    assume(found)
    start_ms = found[which % len(found)] - before_min * MINUTE_MS
    tz = ZoneInfo(zone)
    start = (EPOCH + dt.timedelta(milliseconds=start_ms)).astimezone(tz)
    assume(not start.fold)
    expression = f"{minute} {hour} {dom} * {dow}"
    ours = [o for o in itertools.islice(Cron(expression, zone, start=0).occurrences(start_ms), 24) if o % 1000 == 0][:12]
    theirs = [(d - EPOCH) // dt.timedelta(milliseconds=1) for d in itertools.islice(CronSim(expression, start), 12)]
    assert ours == theirs


def real_minutes_matching(expression: str, zone: str, start_ms: int, end_ms: int) -> list:
    """The reference for a job on real time: every whole minute in (start, end] (Unix epoch ms) whose
    reading in the zone matches ``expression``, matched by cronsim on the naive reading alone: the
    readings cronsim lists over the span the minutes read, one iteration (not a CronSim a minute)."""
    tz = ZoneInfo(zone)
    minutes = range(start_ms - start_ms % MINUTE_MS + MINUTE_MS, end_ms + 1, MINUTE_MS)
    walls = [(EPOCH + dt.timedelta(milliseconds=at)).astimezone(tz).replace(tzinfo=None) for at in minutes]
    if not walls:
        return []
    last, matching = max(walls), set()
    for wall in CronSim(expression, min(walls) - dt.timedelta(seconds=1)):
        if wall > last:
            break
        matching.add(wall)
    return [at for at, wall in zip(minutes, walls) if wall in matching]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["0", "30", "15,45", "0-59/20", "59"]), st.sampled_from(["*", "*/2", "*/3"]),
       st.sampled_from(["*", "1-5"]), st.sampled_from(ZONES + ["Asia/Gaza", "America/St_Johns"]),
       st.sampled_from([2011, 2016, 2026]), st.integers(0, 10), st.integers(-6 * 60, 6 * 60))
def test_a_starred_hour_job_fires_at_every_real_minute_whose_reading_matches(minute, hour, dow, zone, year, which,
                                                                              offset_min):
    """Differential against the definition: around a transition (30-minute DST, changes at 00:01 and
    at midnight, a skipped day), from any start, a repeated reading's second pass included, a job whose
    hour field starts with ``*`` fires at exactly the real minutes whose reading matches, each once
    and in order, and next_after from each start agrees."""
    found = transitions_ms(zone, year)
    assume(found)
    start_ms = found[which % len(found)] + offset_min * MINUTE_MS
    end_ms = start_ms + 8 * HOUR_MS
    expression = f"{minute} {hour} * * {dow}"
    cron = Cron(expression, zone, start=0)
    ours = list(itertools.takewhile(lambda d: d <= end_ms, cron.occurrences(start_ms)))
    expected = real_minutes_matching(expression, zone, start_ms, end_ms)
    assert ours == expected
    if expected:
        assert cron.next_after(start_ms) == expected[0]


@pytest.mark.parametrize("zone, expression, start, end, expected", [
    pytest.param("Australia/Lord_Howe", "30 * * * *", "2026-10-04T00:00+10:30", "2026-10-04T04:00+11:00",
                 ["2026-10-04T00:30+10:30", "2026-10-04T01:30+10:30", "2026-10-04T02:30+11:00",
                  "2026-10-04T03:30+11:00"], id="lord-howe-spring-a-reading-after-a-half-hour-gap"),
    pytest.param("Australia/Lord_Howe", "30 * * * *", "2026-04-05T00:00+11:00", "2026-04-05T03:00+10:30",
                 ["2026-04-05T00:30+11:00", "2026-04-05T01:30+11:00", "2026-04-05T01:30+10:30",
                  "2026-04-05T02:30+10:30"], id="lord-howe-fall-a-half-hour-read-twice"),
    pytest.param("Australia/Lord_Howe", "0 */2 * * *", "2026-04-04T23:00+11:00", "2026-04-05T05:00+10:30",
                 ["2026-04-05T00:00+11:00", "2026-04-05T02:00+10:30", "2026-04-05T04:00+10:30"],
                 id="lord-howe-fall-an-even-hour-after-the-repeat"),
    pytest.param("Asia/Gaza", "0 */2 * * *", "2011-03-31T22:30+02:00", "2011-04-01T04:30+03:00",
                 ["2011-04-01T00:00+02:00", "2011-04-01T02:00+03:00", "2011-04-01T04:00+03:00"],
                 id="gaza-2011-a-shift-at-00:01"),
])
def test_a_starred_hour_job_across_a_shift_off_the_hour(zone, expression, start, end, expected):
    """Each real hour that reads as the expression's fires, where a zone shifts by half an hour or at a
    minute past the hour, which a walk of zone-aware times by the hour misses."""
    cron = Cron(expression, zone, start=at_ms(start))
    assert between(cron, start, end) == expected
    assert_next_after_agrees(cron, expected, start, end)


@pytest.mark.parametrize("zone, day, hours", [
    ("America/New_York", "2026-03-08", 23), ("America/New_York", "2026-11-01", 25),
    ("Europe/London", "2026-03-29", 23), ("Europe/London", "2026-10-25", 25),
    ("Europe/London", "2026-10-24", 24),
])
def test_hourly_fires_once_per_real_hour_of_the_day(zone, day, hours):
    """`0 * * * *` fires as many times on a day as the day has real hours: 23 in spring, 25 in
    the fall, no two at the same instant."""
    tz = ZoneInfo(zone)
    midnight = dt.datetime.fromisoformat(day).replace(tzinfo=tz)
    start_ms = int(midnight.timestamp() * 1000) - 1
    end_ms = int((midnight + dt.timedelta(days=1)).timestamp() * 1000) - 1
    assert (end_ms - start_ms) == hours * HOUR_MS  # the day really has that many hours
    fired = list(itertools.takewhile(lambda d: d <= end_ms, Cron("@hourly", zone, start=start_ms).occurrences(start_ms)))
    assert len(fired) == len(set(fired)) == hours


def test_fixed_hour_jobs_fire_every_day_of_2026_in_both_zones():
    """Nothing is ever skipped for a day and no day fires twice: a daily job at each wall time of
    the two transition hours fires exactly once on each of the 365 local days of 2026."""
    for zone in ("America/New_York", "Europe/London"):
        tz = ZoneInfo(zone)
        for expression in ("0 1 * * *", "30 1 * * *", "0 2 * * *", "30 2 * * *"):
            start_ms = at_ms("2026-01-01T00:00+00:00") - DAY_MS
            cron = Cron(expression, zone, start=start_ms)
            days = []
            for due_ms in cron.occurrences(start_ms):
                local = dt.datetime.fromtimestamp(due_ms / 1000, tz)
                if local.year > 2026:
                    break
                if local.year == 2026:
                    days.append(local.date())
            assert len(days) == len(set(days)) == 365, (zone, expression)


def test_leap_day_expression_fires_on_february_29_only():
    """`0 0 29 2 *` from 2026 fires on 2028-02-29 and then 2032-02-29 (UTC midnight)."""
    cron = Cron("0 0 29 2 *", start=at_ms("2026-01-01T00:00+00:00"))
    first = cron.next_after(cron.start_ms)
    assert first == at_ms("2028-02-29T00:00+00:00")
    assert cron.next_after(first) == at_ms("2032-02-29T00:00+00:00")
    assert Cron("0 0 29 2 *", "Europe/London", start=0).next_after(at_ms("2026-06-01T00:00+00:00")) == \
        at_ms("2028-02-29T00:00+00:00")


def test_no_occurrence_past_the_representable_range_is_none():
    """Past the last representable occurrence (datetime's year 9999, or 2**64-1 ms) next_after is
    None, never an OverflowError: a schedule there simply has no next occurrence."""
    assert Cron("0 0 29 2 *", start=0).next_after(at_ms("9998-03-01T00:00+00:00")) is None
    assert Cron("0 * * * *", "Asia/Tokyo", start=0).next_after(at_ms("9999-12-31T23:58+00:00")) is None
    assert Cron("* * * * *", start=0).next_after(2**64 - 1) is None
    assert Every(dt.timedelta(days=10**6), start=0).next_after(2**64 - 2) is None
    assert Every(0.001, start=2**64 - 2).next_after(0) == 2**64 - 1


@pytest.mark.parametrize("expr, tz", [("0 * * * *", "UTC"), ("* * * * *", "UTC"), ("0 0-23 * * *", "UTC"),
                                       ("*/30 * * * *", "America/New_York"), ("15 * * * *", "Asia/Tokyo")])
def test_the_last_days_before_the_year_10000_keep_their_occurrences(expr, tz):
    """The occurrences up to the end of 9999-12-31 (UTC) are all found, in either DST rule (an hour
    field of ``*`` or not): the look two days ahead for a fall-back, and the walk past the last
    reading, end the search there, not before it. Checked against a walk minute by minute."""
    from cronsim import CronSim

    zone = ZoneInfo(tz)
    after = at_ms("9999-12-29T12:00+00:00")
    cron = Cron(expr, tz, start=0)
    found, at = [], after
    while (at := cron.next_after(at)) is not None:
        found.append(at)
    minute, last = after // 60_000 * 60_000 + 60_000, at_ms("9999-12-31T23:59+00:00")
    expected = []
    while minute <= last:
        try:
            wall = dt.datetime.fromtimestamp(minute / 1000, dt.timezone.utc).astimezone(zone).replace(tzinfo=None)
        except OverflowError:  # Tokyo's reading is in the year 10000 from 15:00 UTC on
            break
        try:
            if next(CronSim(expr, wall - dt.timedelta(minutes=1))) == wall:
                expected.append(minute)
        except OverflowError:  # the next match is past the year 9999: this minute is none
            pass
        minute += 60_000
    assert found == expected and expected


def test_aliases_and_strictly_after_start():
    """@hourly/@daily/@weekly/@monthly are their 5-field forms, and an occurrence at start itself
    is not included (occurrences are strictly after start)."""
    start = at_ms("2026-06-01T00:00+00:00")  # a Monday midnight
    assert Cron("@hourly", start=start).next_after(start) == start + HOUR_MS
    assert Cron("@daily", start=start).next_after(start) == start + DAY_MS
    assert Cron("@weekly", start=start).next_after(start) == at_ms("2026-06-07T00:00+00:00")  # Sunday
    assert Cron("@monthly", start=start).next_after(start) == at_ms("2026-07-01T00:00+00:00")
    assert Cron("@daily", start=start).next_after(0) == start + DAY_MS  # never before start


def test_every_falls_on_start_plus_k_intervals():
    """Every(interval) occurrences are start + k*interval for k >= 1, for seconds, a float and a
    timedelta; next_after is strictly after its argument."""
    start = at_ms("2026-06-01T00:00+00:00")
    every = Every(30, start=start)
    assert list(itertools.islice(every.occurrences(0), 3)) == [start + 30_000, start + 60_000, start + 90_000]
    assert every.next_after(start + 30_000) == start + 60_000
    assert every.next_after(start + 29_999) == start + 30_000
    assert Every(0.25, start=start).next_after(start) == start + 250
    assert Every(dt.timedelta(minutes=2), start=dt.datetime(2026, 6, 1, tzinfo=UTC)).next_after(start) == \
        start + 120_000


def test_default_start_is_now():
    """Without start, the grid starts at the wall clock's now (within a generous liveness bound)."""
    before = int(dt.datetime.now(UTC).timestamp() * 1000)
    every, cron = Every(1), Cron("* * * * *")
    after = int(dt.datetime.now(UTC).timestamp() * 1000)
    for trigger in (every, cron):
        assert before - 1 <= trigger.start_ms <= after + 1


def fire_late(trigger, last_ms, count, late_ms, **policy):
    """A runner that fires each occurrence `late_ms` after its nominal time: the nominal times fired."""
    fired = []
    for _ in range(count):
        nominal = trigger.next_after(last_ms)
        due = due_occurrences(trigger, last_ms, nominal + late_ms, **policy)
        assert due.fire_ms == (nominal,)
        fired.append(nominal)
        last_ms = due.fire_ms[-1]
    return fired


@pytest.mark.parametrize("trigger, grid_ms", [
    (Every(60, start=at_ms("2026-06-01T00:00+00:00")), 60_000),
    (Cron("*/5 * * * *", "Europe/London", start=at_ms("2026-06-01T00:00+00:00")), 5 * MINUTE_MS),
])
def test_twenty_occurrences_fired_late_do_not_drift(trigger, grid_ms):
    """Fired 7 s late twenty times, each occurrence is still start + k*grid: the next one follows
    the nominal time, never the fire time."""
    fired = fire_late(trigger, trigger.start_ms, 20, 7_000)
    assert fired == [trigger.start_ms + k * grid_ms for k in range(1, 21)]


def test_jitter_stays_in_bounds_and_does_not_move_the_grid():
    """jittered() is nominal + [0, jitter_s] in whole ms, covering the range (seeded draws, so
    deterministic), and 0 jitter is the nominal time itself; the grid follows the nominal time."""
    start = at_ms("2026-06-01T00:00+00:00")
    every = Every(60, start=start, jitter_s=5)
    rng = random.Random(1)
    nominal = every.next_after(start)
    delays = [every.jittered(nominal, rng) - nominal for _ in range(10_000)]
    assert all(isinstance(d, int) and 0 <= d <= 5_000 for d in delays)
    assert min(delays) < 100 and max(delays) > 4_900  # the whole range is used
    assert every.next_after(nominal) == nominal + 60_000  # whatever the fire time was
    assert Every(60, start=start).jittered(nominal, rng) == nominal
    assert Cron("0 9 * * *", jitter_s=0.5, start=start).jitter_s == 0.5


START = at_ms("2026-06-01T00:00+00:00")
GAP_NOW = START + 10 * MINUTE_MS + 30_000  # the runner comes back 10.5 min after the last occurrence


@pytest.mark.parametrize("trigger", [Every(60, start=START), Cron("* * * * *", "America/New_York", start=START)],
                         ids=["every", "cron"])
@pytest.mark.parametrize("policy, fired", [
    ({"misfire": "once"}, [10]),
    ({"misfire": "skip", "misfire_grace_s": 60}, [10]),
    ({"misfire": "skip", "misfire_grace_s": 100}, [9, 10]),
    ({"misfire": "skip", "misfire_grace_s": 10}, []),
    ({"misfire": "all", "catchup_window_s": 300}, [6, 7, 8, 9, 10]),
    ({"misfire": "all", "catchup_window_s": 3600}, list(range(1, 11))),
], ids=["once", "skip-60s", "skip-100s", "skip-drops-all", "all-5min", "all-1h"])
def test_misfire_policy_after_a_ten_minute_gap(trigger, policy, fired):
    """Ten occurrences (minutes 1..10) are missed when the runner comes back at 10:30: "once" fires
    the latest, "skip" those at most misfire_grace_s late, "all" those no older than
    catchup_window_s, oldest first; then the schedule continues at minute 11, on its grid."""
    due = due_occurrences(trigger, START, GAP_NOW, **policy)
    assert due == DueOccurrences(tuple(START + k * MINUTE_MS for k in fired), START + 10 * MINUTE_MS,
                                 START + 11 * MINUTE_MS)
    # A runner firing them one at a time, each Done moving the last nominal time, then asking again:
    # nothing fires twice, and what is left afterwards is the grid.
    last, seen = START, []
    while True:
        due = due_occurrences(trigger, last, GAP_NOW, **policy)
        if not due.fire_ms:
            last = due.last_missed_ms if due.last_missed_ms is not None else last
            break
        seen.append(due.fire_ms[0])
        last = due.fire_ms[0]
    assert seen == [START + k * MINUTE_MS for k in fired]
    assert due_occurrences(trigger, last, GAP_NOW, **policy) == DueOccurrences((), None, START + 11 * MINUTE_MS)
    assert trigger.next_after(last) == START + 11 * MINUTE_MS


def test_nothing_due_before_the_next_occurrence():
    """Asked early (a wake-up before the next occurrence), nothing fires and next_ms is the grid."""
    every = Every(60, start=START)
    assert due_occurrences(every, START, START + 59_999) == DueOccurrences((), None, START + 60_000)


def test_skip_measures_lateness_from_the_end_of_the_jitter_window():
    """An occurrence fired inside its jitter window is not late, whatever misfire_grace_s is."""
    every = Every(60, start=START, jitter_s=30)
    due = due_occurrences(every, START, START + 60_000 + 29_000, "skip", misfire_grace_s=1)
    assert due.fire_ms == (START + 60_000,)


class CountingCron(Cron):
    """A Cron that counts next_after calls: the bounded-work tests' measure of work done."""

    __slots__ = ("calls",)

    def next_after(self, after_ms):
        self.calls += 1
        return super().next_after(after_ms)


def test_once_after_ten_years_does_bounded_work():
    """A ten-year outage: Every(0.001) (some 3*10**11 missed occurrences) resolves arithmetically,
    and a every-minute Cron in under 100 trigger steps, not millions; both fire the latest."""
    ten_years_ms = 3653 * DAY_MS
    now = START + ten_years_ms + 123
    every = Every(0.001, start=START)
    assert due_occurrences(every, START, now) == DueOccurrences((now,), now, now + 1)
    cron = CountingCron("* * * * *", "Europe/London", start=START)
    cron.calls = 0
    due = due_occurrences(cron, START, now)
    latest = START + ten_years_ms  # START is a midnight, so this is a whole minute
    assert due == DueOccurrences((latest,), latest, latest + MINUTE_MS)
    assert 0 < cron.calls < 100


def test_catch_up_returns_at_most_limit_occurrences():
    """"all" over a window holding millions of occurrences returns the oldest `limit` of them."""
    every = Every(0.001, start=START)
    due = due_occurrences(every, START, START + DAY_MS, "all", catchup_window_s=3600, limit=500)
    oldest = START + DAY_MS - 3_600_000
    assert due.fire_ms == tuple(range(oldest, oldest + 500))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 4 * DAY_MS), st.integers(0, 3 * DAY_MS),
       st.sampled_from(["0 1 * * *", "*/7 * * * *", "30 1,2 * * *", "0 * * * *"]),
       st.sampled_from(["Europe/London", "America/New_York"]))
def test_cron_last_at_or_before_matches_a_scan(offset_ms, span_ms, expression, zone):
    """The bisection finds the same latest occurrence as walking every occurrence, on windows around
    the London fall-back day (the case where wall time runs backwards)."""
    cron = Cron(expression, zone, start=0)
    after_ms = at_ms("2026-10-23T00:00+00:00") + offset_ms
    at = after_ms + span_ms
    scanned = None
    for due_ms in cron.occurrences(after_ms):
        if due_ms > at:
            break
        scanned = due_ms
    assert cron.last_at_or_before(at, after_ms) == scanned


@st.composite
def everies(draw):
    interval_ms = draw(st.integers(1, 10**15))
    jitter_ms = draw(st.integers(0, min(interval_ms - 1, 10**9)))
    return Every(dt.timedelta(milliseconds=interval_ms), start=draw(st.integers(0, 2**60)), jitter_s=jitter_ms / 1000)


@settings(max_examples=300, deadline=None)
@given(everies())
def test_every_survives_its_stored_form(every):
    """to_dict/to_bytes and back give an equal trigger with the same grid, through JSON text."""
    assert trigger_from_dict(json.loads(json.dumps(every.to_dict()))) == every
    again = trigger_from_bytes(every.to_bytes())
    assert again == every and hash(again) == hash(every)
    assert (again.interval_ms, again.start_ms, again.jitter_ms) == (every.interval_ms, every.start_ms,
                                                                     every.jitter_ms)
    assert again.next_after(every.start_ms) == every.next_after(every.start_ms)


def test_stored_forms_are_stable():
    """The stored bytes are a fixed format (sorted compact JSON with a version), so a store written
    today reads the same tomorrow."""
    assert Every(30, start=1_780_000_000_000, jitter_s=1.5).to_bytes() == (
        b'{"interval_ms":30000,"jitter_ms":1500,"start_ms":1780000000000,"trigger":"every","version":1}')
    cron = Cron("0 9 * * 1-5", ZoneInfo("Europe/London"), start=1_780_000_000_000)
    assert cron.to_bytes() == (b'{"expression":"0 9 * * 1-5","jitter_ms":0,"start_ms":1780000000000,'
                               b'"trigger":"cron","tz":"Europe/London","version":1}')
    assert trigger_from_bytes(cron.to_bytes()) == cron
    assert trigger_from_dict(Cron("@daily", UTC, start=0).to_dict()) == Cron("@daily", "UTC", start=0)
    # Equal (the same occurrences), the text kept as written.
    assert Cron("@daily", start=0) == Cron("0 0 * * *", start=0)
    assert Cron("@daily", start=0).to_dict()["expression"] == "@daily"


def test_repr_and_str_for_a_table():
    """str() is the short form a CLI table prints; repr() shows every field."""
    assert str(Every(30, start=0)) == "every 30 s"
    assert str(Every(0.5, start=0)) == "every 0.5 s"
    assert str(Every(5, start=0, jitter_s=0.25)) == "every 5 s, jitter 0.25 s"
    assert str(Cron("0 9 * * 1-5", "Europe/London", start=0)) == "cron '0 9 * * 1-5' Europe/London"
    assert repr(Every(30, start=5)) == "Every(30.0, start=5, jitter_s=0.0)"
    assert repr(Cron("@daily", start=5)) == "Cron('@daily', tz='UTC', start=5, jitter_s=0.0)"


@pytest.mark.parametrize("make, error, words", [
    (lambda: Cron("61 * * * *"), ValueError, ["minute", "'61'"]),
    (lambda: Cron("0 24 * * *"), ValueError, ["hour", "'24'"]),
    (lambda: Cron("0 0 32 * *"), ValueError, ["day-of-month", "'32'"]),
    (lambda: Cron("0 0 30 2 *"), ValueError, ["day-of-month field '30'", "no month", "'2'", "never fire"]),
    (lambda: Cron("0 0 31 4,6 *"), ValueError, ["day-of-month field '31'", "no month", "'4,6'"]),
    (lambda: Cron("0 0 * 13 *"), ValueError, ["month", "'13'"]),
    (lambda: Cron("0 0 * * 8"), ValueError, ["day-of-week", "'8'"]),
    (lambda: Cron("0 0 * *"), ValueError, ["5 fields", "got 4"]),
    (lambda: Cron("0 0 0 * * *"), ValueError, ["5 fields", "got 6"]),
    (lambda: Cron("@fortnightly"), ValueError, ["@fortnightly", "@daily"]),
    (lambda: Cron(5), TypeError, ["str", "5"]),
    (lambda: Cron("0 0 * * *", "Mars/Olympus_Mons"), ValueError, ["tz", "Mars/Olympus_Mons"]),
    (lambda: Cron("0 0 * * *", "../../etc/passwd"), ValueError, ["tz", "../../etc/passwd"]),
    (lambda: Cron("0 0 * * *", dt.timezone(dt.timedelta(hours=5))), ValueError, ["tz", "Etc/GMT-5"]),
    (lambda: Cron("0 0 * * *", 3), TypeError, ["tz", "3"]),
    (lambda: Cron("0 0 * * *", "localtime"), ValueError, ["tz", "'localtime'", "each host"]),
    (lambda: Cron("0 0 * * *", "posixrules"), ValueError, ["tz", "'posixrules'", "each host"]),
    (lambda: Every(0), ValueError, ["interval", "0"]),
    (lambda: Every(0.0004), ValueError, ["interval", "0.0004"]),
    (lambda: Every(-1), ValueError, ["interval", "-1"]),
    (lambda: Every(float("nan")), ValueError, ["interval", "nan"]),
    (lambda: Every(dt.timedelta(0)), ValueError, ["interval", "0 ms"]),
    (lambda: Every(10**400), ValueError, ["interval", "1" + "0" * 400]),
    (lambda: Every(1e308), ValueError, ["interval", "1e+308"]),
    (lambda: Every(-1e308), ValueError, ["interval", "-1e+308"]),
    (lambda: Every(1, jitter_s=10**400), ValueError, ["jitter_s", "1" + "0" * 400]),
    (lambda: Cron("* * * * *", jitter_s=1e308), ValueError, ["jitter_s", "1e+308"]),
    (lambda: Every("60"), TypeError, ["interval", "'60'"]),
    (lambda: Every(True), TypeError, ["interval", "True"]),
    (lambda: Every(1, jitter_s=-0.5), ValueError, ["jitter_s", "-0.5"]),
    (lambda: Every(1, jitter_s=float("inf")), ValueError, ["jitter_s", "inf"]),
    (lambda: Every(1, jitter_s=1), ValueError, ["jitter_s", "less than the interval"]),
    (lambda: Cron("* * * * *", jitter_s=-1), ValueError, ["jitter_s", "-1"]),
    (lambda: Every(1, start=dt.datetime(2026, 6, 1)), ValueError, ["start", "naive"]),
    (lambda: Cron("* * * * *", start=dt.datetime(2026, 6, 1)), ValueError, ["start", "naive"]),
    (lambda: Every(1, start=-5), ValueError, ["start", "-5"]),
    (lambda: Every(1, start=0).next_after(-1), ValueError, ["after_ms", "-1"]),
    (lambda: Every(1, start=0).next_after(1.5), TypeError, ["after_ms", "1.5"]),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_input_names_the_field_and_value(make, error, words):
    """Each bad argument raises a specific exception whose message names the argument (or the cron
    field) and quotes the offending value."""
    with pytest.raises(error) as raised:
        make()
    for word in words:
        assert word in str(raised.value)


@pytest.mark.parametrize("args, words", [
    (("sometimes",), ["misfire", "'sometimes'"]),
    (("all",), ["catchup_window_s", "all"]),
    (("once", 60.0, 10.0), ["catchup_window_s", "'once'"]),
    (("skip", -1.0), ["misfire_grace_s", "-1"]),
    (("all", 60.0, float("nan")), ["catchup_window_s", "nan"]),
    # Finite, but past the ms range: a pass would turn them into an infinite ms count.
    (("skip", 1.7976931348623157e308), ["misfire_grace_s", "1.7976931348623157e+308"]),
    (("skip", 10**400), ["misfire_grace_s", "1" + "0" * 400]),
    (("all", 60.0, 1e308), ["catchup_window_s", "1e+308"]),
])
def test_bad_misfire_policy_is_refused(args, words):
    """A misfire policy is checked as a whole: unknown names, "all" without a catch-up window, a
    window with another policy, negative or non-finite seconds, or more seconds than the range of
    Unix epoch ms holds."""
    with pytest.raises(ValueError) as raised:
        check_misfire(*args)
    for word in words:
        assert word in str(raised.value)
    with pytest.raises(ValueError):
        due_occurrences(Every(1, start=0), 0, 10_000, *args)


@pytest.mark.parametrize("data, words", [
    ({"version": 2, "trigger": "every", "interval_ms": 1, "start_ms": 0, "jitter_ms": 0}, ["version", "2"]),
    ({"version": 1, "trigger": "rrule", "start_ms": 0, "jitter_ms": 0}, ["'rrule'"]),
    ({"version": 1, "trigger": "every", "start_ms": 0, "jitter_ms": 0}, ["missing", "interval_ms"]),
    ({"version": 1, "trigger": "every", "interval_ms": 0, "start_ms": 0, "jitter_ms": 0}, ["interval"]),
    ({"version": 1, "trigger": "every", "interval_ms": "1", "start_ms": 0, "jitter_ms": 0}, ["interval_ms"]),
    ({"version": 1, "trigger": "every", "interval_ms": 10**20, "start_ms": 0, "jitter_ms": 0}, ["interval_ms"]),
    ({"version": 1, "trigger": "cron", "expression": "61 * * * *", "tz": "UTC", "start_ms": 0, "jitter_ms": 0},
     ["minute", "61"]),
    ({"version": 1, "trigger": "cron", "expression": "* * * * *", "tz": "Nowhere/Town", "start_ms": 0,
      "jitter_ms": 0}, ["Nowhere/Town"]),
    ([1, 2], ["dict"]),
])
def test_a_bad_stored_trigger_is_refused(data, words):
    """A stored form from a newer version, of an unknown type, with keys missing or wrong, is a
    ValueError naming what is wrong, never a half-built trigger."""
    with pytest.raises(ValueError) as raised:
        trigger_from_dict(data)
    for word in words:
        assert word in str(raised.value)
    with pytest.raises(ValueError, match="JSON"):
        trigger_from_bytes(b"\xff{not json")


@pytest.mark.parametrize("tz", ["a" * 300, "Europe", "Europe/London/", "/etc/localtime", "../UTC", "a\x00b",
                                "\udcff", "Not/AZone", "."],
                         ids=["too long for a file name", "a directory", "a trailing slash", "absolute", "outside",
                              "NUL", "not UTF-8", "unknown", "dot"])
def test_any_name_that_is_no_zone_is_a_value_error_naming_it(tz):
    """zoneinfo reads a zone's name as a path below its zone directories, and an odd one raised
    whatever that lookup met (OSError: File name too long; IsADirectoryError) where a name that is no
    zone is a bad argument: each is a ValueError naming it, in a Cron and in a stored one alike."""
    with pytest.raises(ValueError, match="tz: unknown IANA time zone") as raised:
        Cron("* * * * *", tz=tz)
    assert repr(tz)[:40] in str(raised.value)
    stored = json.loads(Cron("* * * * *", tz="UTC").to_bytes())
    with pytest.raises(ValueError, match="tz: unknown IANA time zone"):
        trigger_from_dict({**stored, "tz": tz})


@pytest.mark.parametrize("tz, meant", [("EST", "America/New_York"), ("MST", "America/Denver")])
def test_a_fixed_offset_zone_picked_for_a_regions_clock_warns(tz, meant):
    """``"EST"`` keeps UTC-5 all year: a cron meant for New York's 09:00 would fire at 10:00 local half
    the year, so it warns, naming the zone meant; a zone with daylight saving time, or UTC, does not.
    The warning is the maker's: a stored schedule in that zone reads back without it (each claim of
    its occurrences reads it, and under ``-W error`` a warning there would make it unreadable)."""
    with pytest.warns(UserWarning, match=meant):
        cron = Cron("0 9 * * *", tz)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Cron("0 9 * * *", meant)
        Cron("0 9 * * *", "UTC")
        assert trigger_from_bytes(cron.to_bytes()) == cron


def test_a_gap_time_and_the_wall_time_the_gap_ends_on_are_two_occurrences():
    """``0 2,3 * * *`` in New York on 2026-03-08 names two hours: 02:00 does not exist and fires at
    the gap's end, 03:00 EDT exactly; 03:00 fires too, 1 ms later, never merged into it. A job on
    03:00 alone keeps its exact instant, and next_after from each occurrence gives the next."""
    gap_end = at_ms("2026-03-08T03:00-04:00")
    both = Cron("0 2,3 * * *", "America/New_York", start=at_ms("2026-03-07T12:00-05:00"))
    start = at_ms("2026-03-07T12:00-05:00")
    assert list(itertools.islice(both.occurrences(start), 3)) == [gap_end, gap_end + 1, at_ms("2026-03-09T02:00-04:00")]
    assert both.next_after(start) == gap_end and both.next_after(gap_end - 1) == gap_end
    assert both.next_after(gap_end) == gap_end + 1
    assert both.next_after(gap_end + 1) == at_ms("2026-03-09T02:00-04:00")
    only_three = Cron("0 3 * * *", "America/New_York", start=at_ms("2026-03-07T12:00-05:00"))
    assert only_three.next_after(at_ms("2026-03-08T00:00-05:00")) == gap_end


@pytest.mark.parametrize("make, start", [
    (lambda start: Cron("* * * * *", start=start), dt.datetime(9999, 12, 31, 23, 59, tzinfo=dt.timezone.utc)),
    (lambda start: Cron("0 0 1 1 *", start=start), 253_402_300_800_000),  # year 10000, in ms
    (lambda start: Cron("0 0 1 1 *", start=start), 2**62),
    (lambda start: Every(60, start=start), 2**64 - 1000),
], ids=["cron, the last minute of 9999", "cron, year 10000 ms", "cron, 2**62 ms", "every, past 2**64-1 ms"])
def test_a_start_after_which_nothing_can_fire_is_refused_naming_it(make, start):
    """A start past every occurrence the trigger can fire (a cron's are in years a datetime holds, an
    interval's below 2**64 ms) was stored as a schedule that never fires, where an expression that
    matches nothing is refused: it is a ValueError naming the start, as that is."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the "after the year 5000" hint, beside the point here
        with pytest.raises(ValueError, match=r"start=.* leaves .* no occurrence to fire"):
            make(start)


def test_a_stored_trigger_is_read_without_the_refusal_of_a_start_past_its_occurrences():
    """An Every schedule stored before that refusal existed, with a start after which nothing fires,
    still reads back as the trigger it is, as a Cron does (``Cron._stored``): the refusal is for a
    trigger being made, and a read (every claim of an occurrence) neither repeats it nor fails the
    schedule."""
    from timerwheel_c.durable.timers.triggers import trigger_from_bytes

    every = b'{"interval_ms":60000,"jitter_ms":0,"start_ms":18446744073709550615,"trigger":"every","version":1}'
    read = trigger_from_bytes(every)
    assert isinstance(read, Every) and read.start_ms == 2**64 - 1001 and read.interval_ms == 60_000
    assert trigger_from_bytes(read.to_bytes()) == read

"""Recurring schedules in the store, driven through run_due with the test's own clock (now_ms), on
every backend: each occurrence reaches its handler once with its nominal time, the misfire policies
after a 10-minute gap, replace on re-add, pause/resume/remove, jitter bounds, no drift. No test waits
on a real clock, so none can flake on timing."""
from __future__ import annotations

import time

import pytest

from timerwheel_c.durable import (Cron, Done, Every, Retry, TimerHandler, TimerKind, TimerRegistry, add_schedule,
                                  get_schedule, list_schedules, list_timers, pause_schedule, remove_schedule,
                                  resume_schedule, run_due)

P = "sched"
KIND = 0xF4
START = 1_800_000_000_000  # Unix epoch ms, a whole minute
MIN = 60_000


class Recording(TimerHandler):
    """Records (reference, due_at_ms, value, attempt) per fire; ``answers`` pops answers (default Done)."""

    kind = TimerKind(KIND)

    def __init__(self, answers=()):
        self.fired: list = []
        self.answers = list(answers)

    def fire(self, ctx, timer):
        self.fired.append((timer.reference, timer.due_at_ms, timer.value, timer.attempt))
        return self.answers.pop(0) if self.answers else Done()


def drive(store, registry, now_ms, rounds=50):
    """run_due at ``now_ms`` until a round fires nothing (a schedule's next occurrence may be due at once)."""
    for _ in range(rounds):
        if not run_due(store, P, registry, now_ms).fired and not run_due(store, P, registry, now_ms).moved:
            return
    raise AssertionError("still firing after 50 rounds")


def test_each_occurrence_fires_once_with_its_nominal_time_reference_and_value(durable_store):
    handler = Recording()
    registry = TimerRegistry().register(handler)
    info = add_schedule(durable_store, P, "tick", Every(60, start=START), KIND, b"payload")
    assert (info.name, info.kind, info.next_fire_ms, info.paused, info.last_fired_ms) == (
        "tick", KIND, START + MIN, False, None)
    drive(durable_store, registry, START + MIN - 1)
    assert handler.fired == []
    for k in range(1, 4):
        drive(durable_store, registry, START + k * MIN)
        drive(durable_store, registry, START + k * MIN)  # a second pass at the same time fires nothing more
    assert handler.fired == [(b"tick", START + k * MIN, b"payload", 1) for k in range(1, 4)]
    info = get_schedule(durable_store, P, "tick")
    assert (info.last_fired_ms, info.next_fire_ms) == (START + 3 * MIN, START + 4 * MIN)
    [pending] = list_timers(durable_store, P)  # an operator sees the pending occurrence too
    assert (pending.reference, pending.due_at_ms, pending.kind) == (b"tick", START + 4 * MIN, KIND)


@pytest.mark.parametrize("policy, kwargs, fired", [
    ("once", {}, [10]),
    ("skip", {"misfire_grace_s": 90}, [9, 10]),
    ("skip", {"misfire_grace_s": 30}, [10]),
    ("all", {"catchup_window_s": 300}, [6, 7, 8, 9, 10]),
])
def test_misfire_policy_after_a_ten_minute_gap(durable_store, policy, kwargs, fired):
    """Every minute from START; the runner comes back at START + 10 min + 1 s, so occurrence k (minute
    k) is (10 - k) min + 1 s late: "once" fires the latest, "skip" those within the grace, "all" those
    within the catch-up window, oldest first; then the schedule continues on its grid."""
    handler = Recording()
    registry = TimerRegistry().register(handler)
    add_schedule(durable_store, P, "m", Every(60, start=START), KIND, misfire=policy, **kwargs)
    drive(durable_store, registry, START + 10 * MIN + 1_000)
    assert [(due - START) // MIN for _, due, _, _ in handler.fired] == fired
    assert get_schedule(durable_store, P, "m").next_fire_ms == START + 11 * MIN


def test_re_adding_a_name_replaces_it_and_old_occurrences_never_fire(durable_store):
    handler = Recording()
    registry = TimerRegistry().register(handler)
    add_schedule(durable_store, P, "job", Every(60, start=START), KIND, b"old")
    add_schedule(durable_store, P, "job", Every(300, start=START), KIND, b"new")
    assert len(list_timers(durable_store, P)) == 1
    drive(durable_store, registry, START + 4 * MIN)
    assert handler.fired == []
    drive(durable_store, registry, START + 5 * MIN)
    assert handler.fired == [(b"job", START + 5 * MIN, b"new", 1)]
    [info] = list_schedules(durable_store, P)
    assert info.trigger == Every(300, start=START) and info.value == b"new"


def test_re_adding_an_equal_schedule_keeps_its_place_and_never_fires_a_done_occurrence_again(durable_store):
    """An application that adds its schedules at every start, with a fixed start in the past: the
    occurrence done before the restart is not fired again (it was, from the trigger's start, under
    "once"), and a changed value still takes effect; one that was in flight fires again, not lost."""
    handler = Recording()
    registry = TimerRegistry().register(handler)
    trigger = Every(3600, start=START)
    add_schedule(durable_store, P, "hourly", trigger, KIND, b"v1")
    drive(durable_store, registry, START + 60 * MIN)
    assert [(due - START) // MIN for _, due, _, _ in handler.fired] == [60]
    info = add_schedule(durable_store, P, "hourly", Every(3600, start=START), KIND, b"v2")  # the restart
    assert (info.last_fired_ms, info.next_fire_ms) == (START + 60 * MIN, START + 120 * MIN)
    drive(durable_store, registry, START + 90 * MIN)
    assert len(handler.fired) == 1
    drive(durable_store, registry, START + 120 * MIN)
    assert handler.fired[1:] == [(b"hourly", START + 120 * MIN, b"v2", 1)]
    # An occurrence in flight (here: its attempt failed, so it is backed off) when the same schedule is
    # added again is the next to fire; with a later start, the schedule starts afresh from it.
    failing = Recording([Retry()])
    run_due(durable_store, P, TimerRegistry().register(failing), START + 180 * MIN)
    assert [t.state for t in list_timers(durable_store, P)] == ["retrying"]
    add_schedule(durable_store, P, "hourly", trigger, KIND, b"v3")
    drive(durable_store, registry, START + 181 * MIN)
    assert handler.fired[2:] == [(b"hourly", START + 180 * MIN, b"v3", 1)]
    add_schedule(durable_store, P, "hourly", Every(3600, start=START + 600 * MIN), KIND)
    assert get_schedule(durable_store, P, "hourly").next_fire_ms == START + 660 * MIN


@pytest.mark.parametrize("changed", [{"jitter_s": 30}, {"max_runs": 100}, {"end": START + 600 * MIN}])
@pytest.mark.parametrize("trigger", [Every, Cron])
def test_changing_a_schedules_jitter_end_or_max_runs_keeps_its_place_on_the_grid(durable_store, trigger, changed):
    """Added again with a start in the past and another jitter, end or max_runs (the grid itself the
    same): the occurrence done is not fired again, the next one fires on the grid, and the change takes
    effect. Each such change used to start the schedule afresh from its start, and the misfire policy
    "once" fired the last occurrence done a second time."""
    handler = Recording()
    registry = TimerRegistry().register(handler)

    def make(**extra):
        if trigger is Every:
            return Every(3600, start=START, **extra)
        return Cron("0 * * * *", tz="UTC", start=START, **extra)

    add_schedule(durable_store, P, "hourly", make(), KIND)
    drive(durable_store, registry, START + 610 * MIN)
    assert [(due - START) // MIN for _, due, _, _ in handler.fired] == [600]
    info = add_schedule(durable_store, P, "hourly", make(**changed), KIND)
    assert info.last_fired_ms == START + 600 * MIN
    drive(durable_store, registry, START + 611 * MIN)
    assert len(handler.fired) == 1
    drive(durable_store, registry, START + 661 * MIN)
    fired = [(due - START) // MIN for _, due, _, _ in handler.fired]
    assert fired == ([600] if "end" in changed else [600, 660])
    stored = get_schedule(durable_store, P, "hourly").trigger
    assert (stored.jitter_s, stored.max_runs, stored.end_ms) == (
        changed.get("jitter_s", 0), changed.get("max_runs"), changed.get("end"))


@pytest.mark.parametrize("trigger", [Every(3600, start=START, end=START + 30 * MIN),
                                     Cron("0 0 1 1 *", start=START, end=START + 30 * MIN)])
def test_a_schedule_whose_end_comes_before_its_first_occurrence_is_refused_and_nothing_is_written(durable_store,
                                                                                                   trigger):
    """A trigger whose end comes before its first occurrence would be stored, reported ended at once and
    never fire, as a trigger whose start leaves no occurrence (which its constructor refuses). It is
    refused when added, naming the end and that first occurrence; nothing is written, and a schedule of
    that name that it would have replaced stays as it was."""
    with pytest.raises(ValueError, match=r"end .* leaves .* no occurrence to fire: its first, at .*, comes after it"):
        add_schedule(durable_store, P, "never", trigger, KIND)
    assert get_schedule(durable_store, P, "never") is None and list_timers(durable_store, P) == []
    add_schedule(durable_store, P, "kept", Every(60, start=START), KIND)
    with pytest.raises(ValueError, match="no occurrence to fire"):
        add_schedule(durable_store, P, "kept", trigger, KIND)
    kept = get_schedule(durable_store, P, "kept")
    assert kept.trigger == Every(60, start=START) and kept.next_fire_ms == START + MIN


def test_a_schedule_added_again_with_no_start_and_an_end_before_its_own_first_occurrence_keeps_its_grid(
        durable_store):
    """With no start, a trigger starts now, but a schedule added again keeps the grid it has: its end is
    judged on that grid, where an occurrence still comes before it, so it is added (an application that
    adds its schedules at every start is not refused); a new schedule of that trigger is refused. The
    grid's next occurrence is 10 minutes off and the end 30, so the real clock's progress cannot flake it."""
    now_ms = time.time_ns() // 1_000_000
    grid = Every(3600, start=now_ms - 50 * MIN)
    add_schedule(durable_store, P, "hourly", grid, KIND)
    info = add_schedule(durable_store, P, "hourly", Every(3600, end=now_ms + 30 * MIN), KIND)
    assert info.next_fire_ms == now_ms + 10 * MIN and not info.ended
    with pytest.raises(ValueError, match="no occurrence to fire"):
        add_schedule(durable_store, P, "new", Every(3600, end=now_ms + 30 * MIN), KIND)
    assert get_schedule(durable_store, P, "new") is None


@pytest.mark.parametrize("spelling", ["@daily", "@midnight", "0  0 * * *", "0 0 * * 0-6", "0 0 */1 * *",
                                      "0 0 1-31 1-12 *", "0 0 * jan-dec *", "0 0 * * 7,0-6"])
def test_re_adding_a_cron_spelled_another_way_keeps_its_place_on_the_grid(durable_store, spelling):
    """A cron added again, from a start in the past, as another spelling of the same occurrences: the
    midnights already done do not fire again (every one of them did, under misfire "all"), and it is
    equal to the first spelling, which the stored schedule keeps."""
    handler = Recording()
    registry = TimerRegistry().register(handler)
    day = 24 * 60 * MIN
    first = Cron("0 0 * * *", start=START)
    assert Cron(spelling, start=START) == first and hash(Cron(spelling, start=START)) == hash(first)
    add_schedule(durable_store, P, "nightly", first, KIND, misfire="all", catchup_window_s=7 * 86400)
    drive(durable_store, registry, START + 3 * day)
    done = [due for _, due, _, _ in handler.fired]
    assert len(done) == 3
    add_schedule(durable_store, P, "nightly", Cron(spelling, start=START), KIND, misfire="all", catchup_window_s=7 * 86400)
    drive(durable_store, registry, START + 3 * day + MIN)
    assert [due for _, due, _, _ in handler.fired] == done
    assert get_schedule(durable_store, P, "nightly").trigger.expression == "0 0 * * *"


@pytest.mark.parametrize("other", ["0 1 * * *", "0 0 * * 1-5", "0 0 1 * 1", "0 */1 * * *"])
def test_a_cron_of_other_occurrences_is_not_equal(other):
    """Spellings differ in what they match (an hour, weekdays only, day-of-month OR day-of-week, every
    hour), or in the hour field's kind, which picks the DST rule: not equal, so re-adding starts afresh."""
    assert Cron(other, start=START) != Cron("0 0 * * *", start=START)
    assert Cron("0 0 * * 7#2", start=START) == Cron("0 0 * * SUN#2", start=START) != Cron("0 0 * * 6#2", start=START)


@pytest.mark.parametrize("jitter_s", [0, 30])
def test_re_adding_an_unchanged_schedule_while_its_occurrence_runs_fires_that_occurrence_once(durable_store, jitter_s):
    """Another process of the application starts, and adds its schedules again, while a runner runs
    one of their occurrences: the schedule is as it was, so nothing is written and the occurrence
    commits, once (the rewrite failed its guard, and it fired again); with jitter too."""
    store = durable_store

    class ReAdding(Recording):
        def fire(self, ctx, timer):
            if not self.fired:  # meanwhile, the other process's start
                add_schedule(store, P, "hourly", Every(3600, start=START, jitter_s=jitter_s), KIND, b"v")
            return super().fire(ctx, timer)

    handler = ReAdding()
    registry = TimerRegistry().register(handler)
    add_schedule(store, P, "hourly", Every(3600, start=START, jitter_s=jitter_s), KIND, b"v")
    pending = get_schedule(store, P, "hourly").next_fire_ms
    drive(store, registry, START + 61 * MIN)
    assert [due for _, due, _, _ in handler.fired] == [START + 60 * MIN]
    info = get_schedule(store, P, "hourly")
    assert info.last_fired_ms == START + 60 * MIN and info.next_fire_ms >= START + 120 * MIN
    assert pending <= START + 61 * MIN


def test_re_adding_a_cron_schedule_with_the_default_start_keeps_the_occurrence_it_owed(durable_store):
    """No runner served the partition at 03:00; the application restarts at 09:00 and adds its nightly
    schedule again with the default start (now, which a cron start only bounds from below): the 03:00
    occurrence it owed still fires, once, then the next day's. (Days in the past, since the default
    start is the real now.)"""
    handler = Recording()
    registry = TimerRegistry().register(handler)
    day_ms = 24 * 60 * MIN
    midnight = (time.time_ns() // 1_000_000 // day_ms - 3) * day_ms  # a UTC midnight three days ago
    add_schedule(durable_store, P, "nightly", Cron("0 3 * * *", start=midnight), KIND)
    info = add_schedule(durable_store, P, "nightly", Cron("0 3 * * *"), KIND, b"v2")  # the restart
    assert info.next_fire_ms == midnight + 180 * MIN and info.value == b"v2"
    drive(durable_store, registry, midnight + 540 * MIN)
    assert handler.fired == [(b"nightly", midnight + 180 * MIN, b"v2", 1)]
    drive(durable_store, registry, midnight + day_ms + 180 * MIN)
    assert [due for _, due, _, _ in handler.fired] == [midnight + 180 * MIN, midnight + day_ms + 180 * MIN]
    # A start in the future is honoured: nothing before it fires.
    future = Cron("0 3 * * *", start=midnight + 10 * day_ms)
    assert add_schedule(durable_store, P, "nightly", future, KIND).next_fire_ms == midnight + 10 * day_ms + 180 * MIN


def test_re_adding_an_every_schedule_with_no_start_keeps_its_grid(durable_store):
    """An application that adds ``Every(7200)`` at every start, with no start: each add used to
    re-base the grid on that moment, so restarts more often than the interval pushed the first
    occurrence away for good and it never fired. Added again with no start it keeps its grid, and
    fires on it; a changed interval or an explicit start is still a new grid."""
    handler = Recording()
    registry = TimerRegistry().register(handler)
    first = add_schedule(durable_store, P, "sync", Every(7200), KIND, b"v1")
    time.sleep(0.01)  # a later default start: a re-based grid would have another next fire time
    again = add_schedule(durable_store, P, "sync", Every(7200), KIND, b"v2")
    assert again.next_fire_ms == first.next_fire_ms and again.trigger.start_ms == first.trigger.start_ms
    drive(durable_store, registry, first.next_fire_ms)
    assert handler.fired == [(b"sync", first.next_fire_ms, b"v2", 1)]
    assert add_schedule(durable_store, P, "sync", Every(3600), KIND).trigger.start_ms > first.trigger.start_ms
    explicit = add_schedule(durable_store, P, "sync", Every(3600, start=START), KIND)
    assert explicit.trigger.start_ms == START


def test_replacing_a_schedule_whose_occurrence_is_retrying_drops_that_occurrence(durable_store):
    handler = Recording([Retry()])
    registry = TimerRegistry().register(handler)
    add_schedule(durable_store, P, "job", Every(60, start=START), KIND, b"old")
    drive(durable_store, registry, START + MIN)
    assert [t.state for t in list_timers(durable_store, P)] == ["retrying"]
    add_schedule(durable_store, P, "job", Every(60, start=START + 10 * MIN), KIND, b"new")
    drive(durable_store, registry, START + 11 * MIN)
    assert [(due - START) // MIN for _, due, _, _ in handler.fired] == [1, 11]
    assert handler.fired[-1][2] == b"new"


def test_a_failed_occurrence_is_retried_and_the_next_waits_for_it(durable_store):
    handler = Recording([Retry(), Retry()])
    registry = TimerRegistry().register(handler)
    add_schedule(durable_store, P, "flaky", Every(60, start=START), KIND)
    drive(durable_store, registry, START + MIN)
    drive(durable_store, registry, START + 2 * MIN + 30_000)  # well past its backoff and the next nominal
    drive(durable_store, registry, START + 3 * MIN + 30_000)
    got = [((due - START) // MIN, attempt) for _, due, _, attempt in handler.fired]
    # The same occurrence (1) three times until Done, never two at once; then 3 ("once" coalesces 2 and 3).
    assert got[:3] == [(1, 1), (1, 2), (1, 3)] and got[3:] == [(3, 1)]


def test_pause_resume_and_remove(durable_store):
    handler = Recording()
    registry = TimerRegistry().register(handler)
    add_schedule(durable_store, P, "p", Every(60, start=START), KIND)
    assert pause_schedule(durable_store, P, "p") is True
    info = get_schedule(durable_store, P, "p")
    assert info.paused and info.next_fire_ms is None and list_timers(durable_store, P) == []
    drive(durable_store, registry, START + 5 * MIN)
    assert handler.fired == []
    assert resume_schedule(durable_store, P, "p") is True
    drive(durable_store, registry, START + 5 * MIN)
    assert [due for _, due, _, _ in handler.fired] == [START + 5 * MIN]  # the pause was a misfire: "once"
    assert remove_schedule(durable_store, P, "p") is True
    assert remove_schedule(durable_store, P, "p") is False
    assert pause_schedule(durable_store, P, "p") is False and resume_schedule(durable_store, P, "p") is False
    assert get_schedule(durable_store, P, "p") is None
    assert durable_store.scan(P, b"", b"\xff").entries == []
    drive(durable_store, registry, START + 60 * MIN)
    assert len(handler.fired) == 1


def test_re_adding_a_paused_schedule_keeps_it_paused_unless_told(durable_store):
    """An application adds its schedules at every start: an operator's pause outlives that (as
    Temporal's schedule update keeps its paused state). paused=False resumes it as resume_schedule
    does (the missed occurrences under the misfire policy), paused=True adds or pauses it."""
    handler = Recording()
    registry = TimerRegistry().register(handler)
    add_schedule(durable_store, P, "p", Every(60, start=START), KIND)
    assert pause_schedule(durable_store, P, "p") is True
    for trigger in (Every(60, start=START), Every(120, start=START)):  # added again as it was, or changed
        info = add_schedule(durable_store, P, "p", trigger, KIND, b"v2")
        assert info.paused and info.next_fire_ms is None and list_timers(durable_store, P) == []
        drive(durable_store, registry, START + 5 * MIN)
        assert handler.fired == [] and get_schedule(durable_store, P, "p").paused
    info = add_schedule(durable_store, P, "p", Every(120, start=START), KIND, b"v3", paused=False)
    assert not info.paused and info.next_fire_ms is not None
    drive(durable_store, registry, START + 5 * MIN)
    assert [(due, value) for _, due, value, _ in handler.fired] == [(START + 4 * MIN, b"v3")]  # misfire "once"
    assert add_schedule(durable_store, P, "p", Every(120, start=START), KIND, b"v3", paused=True).paused
    assert list_timers(durable_store, P) == []
    new = add_schedule(durable_store, P, "fresh", Every(60, start=START), KIND, paused=True)
    assert new.paused and get_schedule(durable_store, P, "fresh").paused and list_timers(durable_store, P) == []
    assert resume_schedule(durable_store, P, "fresh") is True and not get_schedule(durable_store, P, "fresh").paused
    assert not add_schedule(durable_store, P, "other", Every(60, start=START), KIND).paused
    for bad in (1, "yes", 0.0):
        with pytest.raises(TypeError, match="paused must be None, True or False, got " + repr(bad)):
            add_schedule(durable_store, P, "p", Every(60, start=START), KIND, paused=bad)


def test_an_occurrence_claim_holds_its_row_for_the_handlers_timeout(durable_store):
    """A schedule whose handler runs up to its timeout_s=120: the occurrence's claim holds it for
    122 s, so another runner passing a minute later does not start the same occurrence while the
    first call still runs (it did at 5 s, the backoff); after the lease it does, as attempt 2."""
    from timerwheel_c.durable.timers import keys
    from timerwheel_c.durable.timers.claim import claim_due
    from timerwheel_c.durable.timers.tick import LEASE_MARGIN_MS

    handler = Recording()
    handler.timeout_s = 120.0
    registry = TimerRegistry().register(handler)
    due = add_schedule(durable_store, P, "long", Every(600, start=START), KIND).next_fire_ms
    [claimed] = claim_due(durable_store, P, registry, due).timers
    assert keys.parse(claimed.timer.key).due_at_ms == due + 120_000 + LEASE_MARGIN_MS
    assert claim_due(durable_store, P, registry, due + 60_000).timers == []
    [again] = claim_due(durable_store, P, registry, due + 122_000).timers
    assert again.timer.attempt == 2 and again.timer.due_at_ms == due


def test_jitter_delays_each_occurrence_within_bounds_and_keeps_the_grid(durable_store):
    handler = Recording()
    registry = TimerRegistry().register(handler)
    add_schedule(durable_store, P, "j", Every(60, start=START, jitter_s=10), KIND)
    for k in range(1, 21):
        fire_ms = get_schedule(durable_store, P, "j").next_fire_ms
        assert START + k * MIN <= fire_ms <= START + k * MIN + 10_000
        drive(durable_store, registry, fire_ms - 1)
        assert len(handler.fired) == k - 1
        drive(durable_store, registry, fire_ms)
    assert [due for _, due, _, _ in handler.fired] == [START + k * MIN for k in range(1, 21)]


def test_twenty_occurrences_fired_late_do_not_drift(durable_store):
    handler = Recording()
    registry = TimerRegistry().register(handler)
    add_schedule(durable_store, P, "late", Every(60, start=START), KIND)
    for k in range(1, 21):
        drive(durable_store, registry, START + k * MIN + 7_000)  # each fired 7 s late
    assert [due for _, due, _, _ in handler.fired] == [START + k * MIN for k in range(1, 21)]
    assert get_schedule(durable_store, P, "late").next_fire_ms == START + 21 * MIN


def test_schedules_are_listed_across_partitions_and_bad_names_are_refused(durable_store):
    add_schedule(durable_store, "a", "x", Every(60, start=START), KIND)
    add_schedule(durable_store, "b", "y", Every(60, start=START), KIND)
    assert [(i.partition, i.name) for i in list_schedules(durable_store)] == [("a", "x"), ("b", "y")]
    with pytest.raises(ValueError, match="''"):
        add_schedule(durable_store, P, "", Every(60), KIND)
    with pytest.raises(TypeError, match="b'x'"):
        add_schedule(durable_store, P, b"x", Every(60), KIND)
    with pytest.raises(ValueError, match=r"a schedule name must be at most \d+ UTF-8 bytes, got 3000 bytes starting 'nnn"):
        add_schedule(durable_store, P, "n" * 3000, Every(60), KIND)
    with pytest.raises(ValueError, match="catchup_window_s"):
        add_schedule(durable_store, P, "z", Every(60), KIND, misfire="all")


def test_a_schedules_occurrence_is_listed_as_one_beside_a_one_off_timer_of_its_name(durable_store, tmp_path, capsys):
    """A one-off timer may share a schedule's kind and name: list_timers gives both, the occurrence
    with ``schedule`` True, and ``timerwheel-c timers list`` names it "schedule NAME" (and
    ``"schedule": true`` in --json), so that the two rows never read alike."""
    import json

    from timerwheel_c.cli import main
    from timerwheel_c.durable import SQLiteStore, schedule

    add_schedule(durable_store, P, "nightly", Every(60, start=START), KIND)
    schedule(durable_store, P, START + 60_000, KIND, b"nightly")
    listed = list_timers(durable_store, P)
    assert sorted((t.reference, t.schedule) for t in listed) == [(b"nightly", False), (b"nightly", True)]
    if not isinstance(durable_store, SQLiteStore) or durable_store.path == ":memory:":
        return  # the CLI opens the store by URL: one SQLite file shows it
    assert main(["timers", "list", "--store", f"sqlite:///{durable_store.path}", "--partition", P]) == 0
    table = capsys.readouterr().out
    rows = [line.split()[2:4] for line in table.splitlines()[1:]]
    assert sorted(rows) == [["nightly", "scheduled"], ["schedule", "nightly"]], table
    assert main(["timers", "list", "--store", f"sqlite:///{durable_store.path}", "--partition", P, "--json"]) == 0
    assert sorted(row["schedule"] for row in json.loads(capsys.readouterr().out)) == [False, True]

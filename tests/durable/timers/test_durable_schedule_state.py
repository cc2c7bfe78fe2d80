"""A schedule's stored state and the runner's pure steps on it: a served schedule stays on its
grid with jitter, each misfire policy after an outage, pause and resume as a misfire, a retried
occurrence keeps its nominal time, and the row's bytes round trip and refuse bad input.

The "runner" here is a loop over the pure steps with a clock the test sets: nothing sleeps,
nothing reads the wall clock, so nothing can flake.
"""
from __future__ import annotations

import dataclasses
import random

import pytest

from timerwheel_c.durable.timers.schedule_state import ScheduleState, done, new_state, paused, resumed, when_due
from timerwheel_c.durable.timers.triggers import Cron, Every

pytestmark = pytest.mark.every_python

START = 1_780_272_000_000  # 2026-06-01T00:00Z, Unix epoch ms
MINUTE_MS = 60_000
KIND = 0xF3


def serve(state, now_ms, rng):
    """One runner pass at `now_ms`: fire every occurrence whose row is due, one at a time, each
    Done moving the state on. Returns the new state and the nominal times fired."""
    fired = []
    while state.next_fire_ms is not None and state.next_fire_ms <= now_ms:
        step = when_due(state, now_ms, rng)
        if step.fire_ms is None:
            assert step.state != state  # due, so either fired or dropped: never left in place
            state = step.state
            continue
        fired.append(step.fire_ms)
        state = done(state, step.fire_ms, rng)
    return state, fired


def test_a_served_schedule_stays_on_its_grid_with_jitter():
    """Served whenever its row is due, 20 occurrences fire at start + k*60 s (the handler's
    due_at_ms), each row due within [nominal, nominal + 5 s], and the grid never moves."""
    rng = random.Random(7)
    state = new_state(Every(60, start=START, jitter_s=5), KIND, b"v", rng=rng)
    fired = []
    for _ in range(20):
        assert state.next_nominal_ms <= state.next_fire_ms <= state.next_nominal_ms + 5_000
        state, now_fired = serve(state, state.next_fire_ms + 1_234, rng)  # a little late too
        fired += now_fired
    assert fired == [START + k * MINUTE_MS for k in range(1, 21)]
    assert state.last_fired_ms == START + 20 * MINUTE_MS and state.next_nominal_ms == START + 21 * MINUTE_MS


@pytest.mark.parametrize("policy, fired_minutes", [
    ({"misfire": "once"}, [10]),
    ({"misfire": "skip", "misfire_grace_s": 100}, [9, 10]),
    ({"misfire": "skip", "misfire_grace_s": 10}, []),
    ({"misfire": "all", "catchup_window_s": 300}, [6, 7, 8, 9, 10]),
])
@pytest.mark.parametrize("trigger", [Every(60, start=START), Cron("* * * * *", "Europe/London", start=START)],
                         ids=["every", "cron"])
def test_an_outage_of_ten_minutes_resolves_by_policy(trigger, policy, fired_minutes):
    """No runner for 10.5 min: the pass that comes back fires what the policy says, oldest first,
    each once, and leaves the schedule pending at minute 11, on its grid."""
    rng = random.Random(1)
    state = new_state(trigger, KIND, rng=rng, **policy)
    state, fired = serve(state, START + 10 * MINUTE_MS + 30_000, rng)
    assert fired == [START + k * MINUTE_MS for k in fired_minutes]
    assert state.next_nominal_ms == START + 11 * MINUTE_MS
    assert state.last_nominal_ms == START + 10 * MINUTE_MS
    assert state.last_fired_ms == (fired[-1] if fired else None)


def test_pause_then_resume_is_a_misfire_like_any_other():
    """Paused at minute 1 for ten minutes: no occurrence is pending while paused; resumed, the
    missed ones resolve under "once" to the latest, then the grid goes on."""
    rng = random.Random(2)
    state, fired = serve(new_state(Every(60, start=START), KIND, rng=rng), START + MINUTE_MS, rng)
    assert fired == [START + MINUTE_MS]
    state = paused(state)
    assert (state.paused, state.next_nominal_ms, state.next_fire_ms) == (True, None, None)
    assert serve(state, START + 10 * MINUTE_MS, rng) == (state, [])
    state = resumed(state, rng)
    assert not state.paused and state.next_fire_ms == START + 2 * MINUTE_MS  # owed, so due at once
    state, fired = serve(state, START + 11 * MINUTE_MS + 5_000, rng)
    assert fired == [START + 11 * MINUTE_MS]
    assert state.next_nominal_ms == START + 12 * MINUTE_MS


def test_a_retried_occurrence_fires_its_own_nominal_time():
    """A handler that fails backs off; its retry, after the next occurrence has passed, still fires
    the occurrence the claim recorded, and the next one is then owed at once: occurrences never
    overlap and none is lost."""
    rng = random.Random(3)
    state = new_state(Every(60, start=START), KIND, rng=rng, misfire="all", catchup_window_s=600)
    step = when_due(state, START + MINUTE_MS, rng)
    assert step.fire_ms == START + MINUTE_MS and step.state == state  # claimed: the state is not moved
    # The retry runs 90 s later (past minute 2) and fires the recorded nominal time.
    state = done(state, step.fire_ms, rng)
    assert state.next_fire_ms == START + 2 * MINUTE_MS < START + MINUTE_MS + 90_000
    state, fired = serve(state, START + MINUTE_MS + 90_000, rng)
    assert fired == [START + 2 * MINUTE_MS]


def test_an_early_wake_leaves_the_state_in_place():
    """Asked before the pending occurrence is due, nothing fires and nothing is written."""
    rng = random.Random(4)
    state = new_state(Cron("0 9 * * *", "Europe/London", start=START), KIND, rng=rng)
    step = when_due(state, START + 1, rng)
    assert step.fire_ms is None and step.state is state


def test_the_row_round_trips_and_equal_states_give_equal_bytes():
    """to_bytes/from_bytes give back an equal state (the value kept raw after the JSON part), so a
    guard comparing the row's bytes compares the states."""
    rng = random.Random(5)
    for state in (
        new_state(Every(0.5, start=START, jitter_s=0.25), KIND, b"\x00\xffpayload", rng=rng),
        new_state(Cron("30 2 * * 1-5", "America/New_York", start=START), 1, rng=rng, misfire="all",
                  catchup_window_s=3600.5),
        paused(new_state(Every(60, start=START), 255, b"", rng=rng, misfire="skip", misfire_grace_s=0)),
    ):
        data = state.to_bytes()
        assert ScheduleState.from_bytes(data) == state
        assert ScheduleState.from_bytes(data).to_bytes() == data
        assert data.endswith(state.value)


def test_one_policy_written_two_ways_gives_equal_bytes():
    """60 and 60.0 s are one grace time: the rows' bytes are equal, so a guard on them holds."""
    a = new_state(Every(60, start=START), KIND, rng=random.Random(9), misfire="skip", misfire_grace_s=60)
    b = new_state(Every(60, start=START), KIND, rng=random.Random(9), misfire="skip", misfire_grace_s=60.0)
    assert a.to_bytes() == b.to_bytes()
    c = new_state(Every(60, start=START), KIND, rng=random.Random(9), misfire="all", catchup_window_s=600)
    assert c.to_bytes() == dataclasses.replace(c, catchup_window_s=600.0).to_bytes()


def test_bad_schedules_and_bad_rows_are_refused():
    """A bad kind, value or policy is refused when the schedule is made; a row from a newer
    format, a truncated one or one with a bad field is a ValueError naming what is wrong."""
    rng = random.Random(6)
    every = Every(60, start=START)
    with pytest.raises(ValueError, match="0"):
        new_state(every, 0, rng=rng)
    with pytest.raises(TypeError, match="value must be bytes"):
        new_state(every, KIND, "text", rng=rng)
    with pytest.raises(ValueError, match="catchup_window_s"):
        new_state(every, KIND, rng=rng, misfire="all")
    with pytest.raises(TypeError, match="trigger"):
        new_state("every 60 s", KIND, rng=rng)
    data = new_state(every, KIND, b"v", rng=rng).to_bytes()
    with pytest.raises(ValueError, match="version 2"):
        ScheduleState.from_bytes(b"\x02" + data[1:])
    with pytest.raises(ValueError, match="malformed"):
        ScheduleState.from_bytes(data[:20])
    with pytest.raises(ValueError, match="at least"):
        ScheduleState.from_bytes(b"\x01")
    bad_kind = dataclasses.replace(new_state(every, KIND, rng=rng), kind=300).to_bytes()
    with pytest.raises(ValueError, match="300"):
        ScheduleState.from_bytes(bad_kind)
    bad_time = dataclasses.replace(new_state(every, KIND, rng=rng), last_fired_ms=-1).to_bytes()
    with pytest.raises(ValueError, match="last_fired_ms"):
        ScheduleState.from_bytes(bad_time)


def test_a_row_read_again_gives_the_state_kept_from_its_first_read_and_a_bad_row_is_never_kept(monkeypatch):
    """An occurrence's claim and its outcome read the same row: the second read returns the first's
    frozen state instead of decoding again; a row that fails to decode raises at every read; the
    states kept are at most DECODED_STATES, and a full set is emptied, never grown."""
    from timerwheel_c.durable.timers import schedule_state

    rng = random.Random(7)
    data = new_state(Cron("*/5 * * * *", "Europe/Paris", start=START), KIND, b"v", rng=rng).to_bytes()
    first = ScheduleState.from_bytes(data)
    assert ScheduleState.from_bytes(bytearray(data)) is first
    assert ScheduleState.from_bytes(first.to_bytes()) is first
    bad = b"\x02" + data[1:]
    for _ in range(2):
        with pytest.raises(ValueError, match="version 2"):
            ScheduleState.from_bytes(bad)
    monkeypatch.setattr(schedule_state, "DECODED_STATES", 3)
    monkeypatch.setattr(schedule_state, "_DECODED", {})
    states = [new_state(Every(60 + i, start=START), KIND, rng=rng) for i in range(7)]
    for state in states:
        assert ScheduleState.from_bytes(state.to_bytes()) == state
        assert len(schedule_state._DECODED) <= 3

"""Attempts count handler calls, not claims, on SQLite and PostgreSQL: a timer with
``max_attempts=1`` still fires after a runner that lacks its kind moved it on (a rolling deploy),
and after a runner stopped with it queued but not started. A runner killed inside a handler
still has that attempt counted (tests/e2e/test_durable_parking_service.py proves the park that follows).

The claim test drives time by hand (``now_ms`` given to each claim); the service test waits only
for liveness, never on speed."""
from __future__ import annotations

import threading
import time

from timerwheel_c.durable import DurableTimerService, TimerHandler, TimerKind, TimerRegistry, get_timer, schedule
from timerwheel_c.durable.timers.claim import UNKNOWN_KIND_BACKOFF_MS, UNKNOWN_KIND_GRACE_MS, claim_due
from timerwheel_c.durable.timers.registry import Done
from waiting import wait_until, wall_ms

KIND = 0xF5
OTHER_KIND = 0xF6
P = "jobs"
SHIFT_NS = 60 * 1_000_000_000  # a runner's clock this far ahead finds a first backoff (5 s) long over


class Other(TimerHandler):
    """The only kind of the registry of a runner from before the deploy that adds KIND."""

    kind = TimerKind(OTHER_KIND)

    def fire(self, ctx, timer):
        return Done()


class Once(TimerHandler):
    """Kind KIND, at most once (max_attempts=1): records the references it fired."""

    kind = TimerKind(KIND)
    max_attempts = 1

    def __init__(self):
        self.refs: list = []
        self.lock = threading.Lock()

    def fire(self, ctx, timer):
        with self.lock:
            self.refs.append(timer.reference)
        return Done()


class HangsAfterWarmUp(TimerHandler):
    """Kind KIND, max_attempts=1: answers ``warm`` at once (so the service measures a cheap handler
    and queues rows behind a slot), and hangs on every other reference until ``gate`` is set."""

    kind = TimerKind(KIND)
    max_attempts = 1

    def __init__(self):
        self.gate = threading.Event()
        self.hung: list = []
        self.lock = threading.Lock()

    def fire(self, ctx, timer):
        if timer.reference != b"warm":
            with self.lock:
                self.hung.append(timer.reference)
            self.gate.wait(60)
        return Done()


def test_a_runner_lacking_the_kind_charges_no_attempt(runner_backend):
    """Three times a runner without KIND meets the due row after its grace and moves it on; then a
    runner with KIND and max_attempts=1 claims it to fire as attempt 1 of 1 (counting each move
    as an attempt parked it at that claim, unfired)."""
    _, store = runner_backend
    due = wall_ms()
    schedule(store, P, due, KIND, b"deploy", b"payload")
    lacking = TimerRegistry().register(Other())
    now = due
    for _ in range(3):
        now += UNKNOWN_KIND_BACKOFF_MS + UNKNOWN_KIND_GRACE_MS + 1
        claims = claim_due(store, P, lacking, now)
        assert claims.report.unknown == 1 and not claims.timers, claims.report  # the move the test needs
    assert get_timer(store, P, KIND, b"deploy").attempt == 0
    claims = claim_due(store, P, TimerRegistry().register(Once()), now + UNKNOWN_KIND_BACKOFF_MS + 1)
    assert claims.report.parked == 0, claims.report
    assert [(c.timer.reference, c.timer.attempt, c.timer.value) for c in claims.timers] == [(b"deploy", 1, b"payload")]


def test_stop_gives_the_attempt_back_to_rows_never_started(runner_backend):
    """A runner with one slot hangs in a handler with rows claimed behind it, and stops. Each row
    it never started is back at attempt 0, at its own due time, and a runner with max_attempts=1
    fires it; the row whose handler was running keeps its attempt, so that runner parks it
    instead of calling the handler a second time."""
    _, store = runner_backend
    hangs = HangsAfterWarmUp()
    schedule(store, P, wall_ms() - 1000, KIND, b"warm")
    first = DurableTimerService(store, TimerRegistry().register(hangs), [P], concurrency=1, fleet=False)
    first.start()
    try:
        wait_until(lambda: get_timer(store, P, KIND, b"warm") is None, "the warm-up timer to fire")
        due = wall_ms()
        refs = [b"r%d" % i for i in range(6)]
        for ref in refs:
            schedule(store, P, due, KIND, ref)
        wait_until(lambda: hangs.hung and all(get_timer(store, P, KIND, r).attempt == 1 for r in refs),
                   "every row claimed, one handler hung")
        first.stop(timeout=0.1)  # it abandons the hung call: how long it waits for it is beside the point
    finally:
        hangs.gate.set()
    assert not first.running
    assert len(hangs.hung) == 1, hangs.hung  # one slot: one call, the other rows never started
    started = hangs.hung[0]
    not_started = [r for r in refs if r != started]
    for ref in not_started:
        timer = get_timer(store, P, KIND, ref)
        assert (timer.attempt, timer.due_at_ms) == (0, due), timer
    assert get_timer(store, P, KIND, started).attempt == 1
    once = Once()
    with DurableTimerService(store, TimerRegistry().register(once), [P], fleet=False,
                             wall_ns=lambda: time.time_ns() + SHIFT_NS):
        wait_until(lambda: get_timer(store, P, KIND, started).state == "parked"
                   and all(get_timer(store, P, KIND, r) is None for r in not_started),
                   "the queued rows to fire and the started one to park")
    assert sorted(once.refs) == sorted(not_started)

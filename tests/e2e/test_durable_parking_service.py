"""Parking in a running service, on SQLite and PostgreSQL: a runner process SIGKILLed during a timer's
last attempt leaves a row that the next runner parks instead of firing again, and the service's
``timerwheel_parked_total`` counts every parking (a failed last attempt and a claim's park). The
tests wait only for liveness (something happened within a generous bound), never on speed."""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from timerwheel_c.durable import DurableTimerService, TimerHandler, TimerKind, TimerRegistry, get_timer, schedule
from timerwheel_c.durable.timers import keys
from waiting import wait_until, wall_ms
from locations import TESTS

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

RUNNER = TESTS / "durable_runner_proc.py"
KIND = 0xF5  # the kind tests/durable_runner_proc.py serves
P = "jobs"
SHIFT_NS = 60 * 1_000_000_000  # a runner's clock this far ahead finds a first backoff (5 s) long over


class Counting(TimerHandler):
    """Kind KIND with ``max_attempts``; counts its calls and raises (or answers None when ``forget``)."""

    kind = TimerKind(KIND)

    def __init__(self, max_attempts, forget=False):
        self.max_attempts = max_attempts
        self.forget = forget
        self.calls = 0
        self.lock = threading.Lock()

    def fire(self, ctx, timer):
        with self.lock:
            self.calls += 1
        if self.forget:
            return None  # a handler that forgot ``return Done()``
        raise RuntimeError("always fails")


def shifted_ns():
    return time.time_ns() + SHIFT_NS


def test_runner_killed_during_the_last_attempt_parks_instead_of_firing_again(runner_backend, tmp_path):
    """A runner process claims a timer (attempt 1) and is SIGKILLed inside its handler. A service
    whose handler allows one attempt (max_attempts=1: at most once), with its clock past the row's
    backoff, parks the row instead of calling the handler again: the parked timer says the runner
    stopped during attempt 1 of 1, and the park counts in timerwheel_parked_total."""
    target, store = runner_backend
    ready = tmp_path / "ready"
    due = wall_ms()
    schedule(store, P, due, KIND, b"victim", b"payload")
    proc = subprocess.Popen([sys.executable, str(RUNNER), "hang", target, str(ready)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: Path(f"{ready}.{b'victim'.hex()}").exists() or proc.poll() is not None,
                   "the handler to start in the runner process")
        assert proc.poll() is None, proc.stderr.read().decode()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    timer = get_timer(store, P, KIND, b"victim")
    assert (timer.state, timer.attempt) == ("retrying", 1), timer  # the situation the test needs
    handler = Counting(max_attempts=1)
    with DurableTimerService(store, TimerRegistry().register(handler), [P], fleet=False, wall_ns=shifted_ns) as svc:
        wait_until(lambda: get_timer(store, P, KIND, b"victim").state == "parked", "the timer to park")
        wait_until(lambda: svc.metrics(0).parked.get(KIND) == 1, "the park to be counted")
    parked = get_timer(store, P, KIND, b"victim")
    assert (parked.attempt, parked.value, parked.due_at_ms) == (1, b"payload", due)
    assert "stopped during attempt 1 of 1" in parked.last_error
    assert handler.calls == 0


@pytest.mark.parametrize("forget", [False, True])
def test_parked_total_counts_each_parked_timer_by_kind(runner_backend, forget):
    """Three timers whose handler raises (or returns no outcome) with max_attempts=1: each is parked
    after its one attempt, and timerwheel_parked_total reads 3 for the kind, next to 3 failed."""
    _, store = runner_backend
    for i in range(3):
        schedule(store, P, wall_ms() - 1, KIND, b"t%d" % i)
    handler = Counting(max_attempts=1, forget=forget)
    with DurableTimerService(store, TimerRegistry().register(handler), [P], fleet=False) as svc:
        wait_until(lambda: svc.metrics(0).parked.get(KIND) == 3, "three parks counted")
        metrics = svc.metrics(0)
    assert metrics.failed.get(KIND) == 3 and not metrics.fired.get(KIND)
    assert handler.calls == 3
    assert [get_timer(store, P, KIND, b"t%d" % i).state for i in range(3)] == ["parked"] * 3
    assert not store.scan(P, *keys.timer_range()).entries  # nothing left for a runner to scan

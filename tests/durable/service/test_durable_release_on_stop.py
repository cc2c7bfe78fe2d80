"""stop(release_claims=True): a runner stopping makes its unsettled claims (rows queued for a slot and
a handler abandoned at the timeout) due at once, so a second runner on the same store fires them
without waiting out their backoff. Proved on the store's rows (every row due by the stop's end, none
left at a future backoff key) rather than on how fast the second runner is; the default stop leaves
them at their backoff keys."""
from __future__ import annotations

import logging
import threading

import pytest

from timerwheel_c.durable.service.service import DurableTimerService
from timerwheel_c.durable.storage.sqlite import SQLiteStore
from timerwheel_c.durable.timers import keys, writer
from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerKind, TimerRegistry
from waiting import wait_until, wall_ms

P = "rel"
KIND = 0xC1
N = 12


class Hangs(TimerHandler):
    kind = TimerKind(KIND)

    def __init__(self):
        self.gate = threading.Event()
        self.started = threading.Event()

    def fire(self, ctx, timer):
        self.started.set()
        self.gate.wait(60)
        return Done()


class Fires(TimerHandler):
    kind = TimerKind(KIND)

    def __init__(self):
        self.refs = set()
        self.lock = threading.Lock()

    def fire(self, ctx, timer):
        with self.lock:
            self.refs.add(timer.reference)
        return Done()


def _rows(store, start, end):
    return store.scan(P, start, end, None, 1000).entries


@pytest.mark.parametrize("release", [True, False])
def test_stop_releases_unsettled_claims_for_another_runner(tmp_path, release):
    store = SQLiteStore(tmp_path / "rel.db")
    hangs = Hangs()
    try:
        now = wall_ms() - 1000
        for i in range(N):
            writer.schedule(store, P, now + i, KIND, b"%02d" % i)
        first = DurableTimerService(store, TimerRegistry().register(hangs), [P], concurrency=3, fleet=False)
        first.start()
        assert hangs.started.wait(30), "the first runner started a handler"
        wait_until(lambda: first.in_flight == 3, "three handlers hung on claimed rows")
        first.stop(timeout=0.2, release_claims=release)
        assert not first.running
        stop_ms = wall_ms()
        due = _rows(store, *keys.due_range(stop_ms))
        future = _rows(store, *keys.future_range(stop_ms))
        if not release:
            # The situation the option is for: claimed rows wait out a backoff in the future.
            assert future, "without release the claimed rows stay at future backoff keys"
            return
        assert len(due) == N and not future, (len(due), len(future))
        fires = Fires()
        with DurableTimerService(store, TimerRegistry().register(fires), [P], fleet=False):
            wait_until(lambda: len(fires.refs) == N, "the second runner fired every released row")
        assert fires.refs == {b"%02d" % i for i in range(N)}
    finally:
        hangs.gate.set()
        store.close()


@pytest.mark.parametrize("release", [True, False])
def test_the_stop_log_says_where_abandoned_rows_go(tmp_path, release, caplog):
    """The WARNING about handlers still running at the stop's timeout says what becomes of their rows:
    released for another runner now with ``release_claims=True``, else left to their backoff; it
    never says "after their backoff" for rows the stop then releases."""
    store = SQLiteStore(tmp_path / "log.db")
    hangs = Hangs()
    try:
        writer.schedule(store, P, wall_ms() - 1000, KIND, b"r")
        service = DurableTimerService(store, TimerRegistry().register(hangs), [P], fleet=False)
        service.start()
        assert hangs.started.wait(30), "the handler started"
        with caplog.at_level(logging.INFO, logger="timerwheel_c.durable"):
            service.stop(timeout=0.2, release_claims=release)
        [warning] = [r.getMessage() for r in caplog.records
                     if r.levelno == logging.WARNING and "still running" in r.getMessage()]  # the situation needed
        assert ("after their backoff" in warning) is not release, warning
        assert ("released" in warning) is release, warning
    finally:
        hangs.gate.set()
        store.close()

"""DurableTimerService with concurrent handlers: overlap, the limit, async handlers on the service's
loop, a slow handler not holding back the others, stop() with handlers in flight, store errors
counted by kind, and what the service logs. Timing assertions are only "never early" and
generous liveness bounds (seconds); overlap is proven by recorded intervals, never by a speed."""
from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from timerwheel_c.durable import schedule
from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.names import iso_utc
from timerwheel_c.durable.timers.registry import Done, Retry, TimerHandler, TimerKind, TimerRegistry
from timerwheel_c.durable.service.service import DEFAULT_CONCURRENCY, DurableTimerService
from timerwheel_c.durable.storage.errors import PermanentStoreError, TransientStoreError
from timerwheel_c.durable.storage.store import Absent, Batch, Store
from timerwheel_c.durable.timers.timing import ManualClock
from waiting import advance_until, wait_until, wall_ms

P = "conc"
KIND = 0xF6
LIVENESS_S = 20.0




class Sleepy(TimerHandler):
    """Sleeps ``sleep_s`` in fire and records (reference, start monotonic, end monotonic, thread name);
    Done with a guarded effect row per reference, so a double application cannot commit twice."""

    kind = TimerKind(KIND)

    def __init__(self, sleep_s):
        self.sleep_s = sleep_s
        self.lock = threading.Lock()
        self.calls = []

    def fire(self, ctx, timer):
        t0 = time.monotonic()
        time.sleep(self.sleep_s(timer) if callable(self.sleep_s) else self.sleep_s)
        with self.lock:
            self.calls.append((timer.reference, t0, time.monotonic(), threading.current_thread().name))
        k = b"effect/" + timer.reference
        return Done(Batch().require(Absent(k)).put(k, b"1"))


def max_overlap(intervals) -> int:
    """The largest number of (start, end) intervals open at one instant."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    open_now = best = 0
    for _, step in events:
        open_now += step
        best = max(best, open_now)
    return best


def effects(store):
    return [k for k, _ in store.scan(P, b"effect/", b"effect0", limit=10_000).entries]


def test_default_concurrency_is_more_than_one():
    assert DEFAULT_CONCURRENCY > 1


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-3, ValueError), (1.5, TypeError), (True, TypeError), ("4", TypeError),
                                     (1025, ValueError), (10**20, ValueError)])
def test_bad_concurrency_is_refused_naming_the_value(store, bad, exc):
    """Refused when the service is made: a slot is an OS thread started with it, so 10**20 used to
    hang start() starting threads."""
    with pytest.raises(exc, match=repr(bad) if exc is TypeError else str(bad)):
        DurableTimerService(store, TimerRegistry(), concurrency=bad)


def test_sleeping_handlers_overlap_up_to_the_limit_and_never_beyond(store):
    """12 due timers whose handlers sleep 300 ms, concurrency 4: the recorded fire intervals overlap
    (at least 2 at once, so the handlers did not run one after another) and never exceed 4 at once;
    each effect commits once and no timer row is left."""
    for i in range(12):
        schedule(store, P, wall_ms() - 1000, KIND, b"%02d" % i)
    h = Sleepy(0.3)
    with DurableTimerService(store, TimerRegistry().register(h), [P], concurrency=4):
        wait_until(lambda: len(effects(store)) == 12, "12 effects")
    overlap = max_overlap([(s, e) for _, s, e, _ in h.calls])
    assert 2 <= overlap <= 4, overlap
    assert all(name.startswith("durable-fire") for *_, name in h.calls)
    assert store.scan(P, *keys.timer_range()).entries == []


def test_async_handlers_run_on_the_service_loop_concurrently(store):
    """An ``async def fire`` is awaited on the service's own thread (no thread per call); ten of them
    awaiting asyncio.sleep(0.3) with concurrency 10 overlap, and all commit."""

    class AsyncSleepy(TimerHandler):
        kind = TimerKind(KIND)

        def __init__(self):
            self.calls = []

        async def fire(self, ctx, timer):
            t0 = time.monotonic()
            await asyncio.sleep(0.3)
            self.calls.append((t0, time.monotonic(), threading.current_thread().name))
            k = b"effect/" + timer.reference
            return Done(Batch().require(Absent(k)).put(k, b"1"))

    for i in range(10):
        schedule(store, P, wall_ms() - 1000, KIND, b"a%d" % i)
    h = AsyncSleepy()
    with DurableTimerService(store, TimerRegistry().register(h), [P], concurrency=10) as svc:
        wait_until(lambda: len(effects(store)) == 10, "10 effects")
        assert svc.fired == 10
    assert {name for *_, name in h.calls} == {"durable-timers"}
    assert max_overlap([(s, e) for s, e, _ in h.calls]) >= 2


def test_a_slow_handler_does_not_hold_back_the_others(store):
    """One handler blocks until the test releases it; three timers falling due while it runs fire and
    commit meanwhile, each not before its due time: the slow handler holds only its own slot. The
    service's time is a ManualClock the test advances, so no due time is waited for in real time."""
    clock = ManualClock()
    release = threading.Event()
    fired_ms = {}

    def hold(timer) -> float:
        fired_ms[timer.reference] = clock.wall_ns() // 1_000_000
        if timer.reference == b"slow":  # held past the test's own bound on the quick ones
            assert release.wait(3 * LIVENESS_S)
        return 0.0

    schedule(store, P, clock.wall_ns() // 1_000_000 - 10, KIND, b"slow")
    h = Sleepy(hold)
    with DurableTimerService(store, TimerRegistry().register(h), [P], concurrency=4, max_sleep_s=3600,
                             clock=clock, wall_ns=clock.wall_ns) as svc:
        wait_until(lambda: svc.in_flight == 1, "the slow handler to start")
        dues = {}
        for i in range(3):
            dues[b"q%d" % i] = due = clock.wall_ns() // 1_000_000 + 100 * (i + 1)
            svc.schedule(P, due, KIND, b"q%d" % i)
        try:
            advance_until(clock, lambda: len(effects(store)) == 3, 0.05,
                          "the quick ones' effects while the slow one runs", LIVENESS_S)
        finally:
            release.set()
        wait_until(lambda: len(effects(store)) == 4, "all four effects")
    ends = {ref: (s, e) for ref, s, e, _ in h.calls}
    assert all(ends[ref][1] < ends[b"slow"][1] for ref in dues), "the quick ones ended before the slow one"
    assert all(fired_ms[ref] >= due for ref, due in dues.items()), (fired_ms, dues)
    assert store.scan(P, *keys.timer_range()).entries == []


def test_stop_waits_for_handlers_in_flight_and_commits_their_outcomes(store):
    """stop(timeout=10) while a handler is blocked: it returns once the handler is released (0.5 s
    later), and the handler's outcome is committed (its effect exists, its row is gone)."""
    release, started = threading.Event(), threading.Event()
    # In its fire: a row in flight whose call has not begun yet is given back at stop(), never waited for.
    h = Sleepy(lambda t: started.set() or (release.wait(10) and 0.0))
    schedule(store, P, wall_ms() - 10, KIND, b"busy")
    svc = DurableTimerService(store, TimerRegistry().register(h), [P]).start()
    wait_until(started.is_set, "the handler to start")
    threading.Timer(0.5, release.set).start()
    svc.stop(timeout=10)
    assert not svc.running
    assert effects(store) == [b"effect/busy"] and store.scan(P, *keys.timer_range()).entries == []


def test_stop_gives_up_on_a_stuck_handler_and_leaves_its_row_claimed(store, caplog):
    """A handler stuck past stop()'s timeout is abandoned: stop() returns within seconds, says so at
    WARNING, and the row stays at its claimed backoff key (attempt 1, due later), so it fires again
    after that backoff; nothing was committed for it. The service's time is a ManualClock that never
    moves, so no stall of a loaded machine can bring the backoff's end before the test reads it."""
    clock = ManualClock()
    release, started = threading.Event(), threading.Event()
    h = Sleepy(lambda t: started.set() or (release.wait(3 * LIVENESS_S) and 0.0))
    schedule(store, P, clock.wall_ns() // 1_000_000 - 10, KIND, b"stuck")
    svc = DurableTimerService(store, TimerRegistry().register(h), [P], clock=clock, wall_ns=clock.wall_ns).start()
    try:
        wait_until(started.is_set, "the handler to start")  # in its fire, not only in flight
        t0 = time.monotonic()
        svc.stop(timeout=0.3)
        # A liveness bound: stop() waited for its timeout, not for the handler (held 3 * LIVENESS_S).
        # The thread's teardown (its warning, the release) may outlast stop()'s join on a loaded
        # machine: the thread ends within the bound, not within stop()'s second of grace.
        wait_until(lambda: not svc.running, "the service's thread to end")
        assert time.monotonic() - t0 < LIVENESS_S
        assert "still running" in caplog.text
        (key,) = [k for k, _ in store.scan(P, *keys.timer_range()).entries]
        row = keys.parse(key)
        assert row.attempt == 1 and row.due_at_ms > clock.wall_ns() // 1_000_000 and effects(store) == []
    finally:
        release.set()


def test_async_handler_stuck_at_stop_is_cancelled(store):
    """An async handler still awaiting at stop()'s timeout is cancelled (it sees CancelledError); its
    row stays claimed."""
    cancelled, started = threading.Event(), threading.Event()

    class Stuck(TimerHandler):
        kind = TimerKind(KIND)

        async def fire(self, ctx, timer):
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return Done()

    schedule(store, P, wall_ms() - 10, KIND, b"a")
    svc = DurableTimerService(store, TimerRegistry().register(Stuck()), [P]).start()
    wait_until(started.is_set, "the handler to start")  # awaiting in its fire, not only in flight
    svc.stop(timeout=0.2)
    assert cancelled.wait(5) and not svc.running
    assert keys.parse(store.scan(P, *keys.timer_range()).entries[0][0]).attempt == 1


def test_many_short_handlers_apply_each_effect_once(store):
    """300 due timers, 5 ms handlers, concurrency 16: every effect exactly once (guarded per
    reference, and counted: fired == 300) and no timer row left."""
    base = wall_ms() - 1000
    store.apply_many(P, [Batch().put(keys.timer(base + i, KIND, b"%03d" % i), b"") for i in range(300)])
    h = Sleepy(0.005)
    with DurableTimerService(store, TimerRegistry().register(h), [P], concurrency=16) as svc:
        wait_until(lambda: svc.fired == 300, "300 fired")
    assert len(effects(store)) == 300 and len(h.calls) == 300
    assert store.scan(P, *keys.timer_range()).entries == []


class Failing(Store):
    """Delegates to a real store; ``scan`` raises ``error`` while it is set."""

    def __init__(self, inner):
        self.inner = inner
        self.error = None

    def _scan(self, *a):
        if self.error is not None:
            raise self.error
        return self.inner.scan(*a)

    def _get(self, *a):
        return self.inner.get(*a)

    def _apply(self, *a):
        return self.inner.apply(*a)

    def _partitions(self):
        return self.inner.partitions()


@pytest.mark.parametrize("error, transient", [
    (TransientStoreError("database is locked", "SQLITE_BUSY"), True),
    (ConnectionResetError("peer reset"), True),
    (PermanentStoreError("no such table: timerwheel_kv", "SQLITE_ERROR"), False),
    (RuntimeError("a bug in a backend"), False),
])
def test_store_errors_are_retried_and_counted_by_kind(store, caplog, error, transient):
    """A store error ends the pass and is retried with backoff. A transient one (locked, connection
    lost) is logged at WARNING without a traceback and counted in transient_errors; anything else at
    ERROR with its traceback, in other_errors. Once healed, the due timer fires."""
    failing = Failing(store)
    failing.error = error
    schedule(store, P, wall_ms() - 1, KIND, b"e")
    h = Sleepy(0.0)
    with DurableTimerService(failing, TimerRegistry().register(h), [P]) as svc:
        wait_until(lambda: svc.errors >= 2, "two failed passes")
        assert svc.running and not h.calls
        failing.error = None
        svc.notify(P, wall_ms())
        wait_until(lambda: h.calls, "the fire after healing")
    counted = svc.transient_errors if transient else svc.other_errors
    assert counted >= 2 and (svc.other_errors if transient else svc.transient_errors) == 0
    records = [r for r in caplog.records if r.getMessage().startswith("durable timer pass")]
    assert records and all(r.levelno == (logging.WARNING if transient else logging.ERROR) for r in records)
    assert all((r.exc_info is None) == transient for r in records)


def test_logs_one_debug_line_per_fire_a_summary_and_a_warning_when_behind(store, caplog):
    """DEBUG: one line per fired timer naming it (partition, kind, reference, attempt, due time) with
    its lateness. INFO: a summary
    with fired / failed counts and lateness percentiles (summary_interval_s=0.2). WARNING: a first
    attempt fired more than a second late (it was due 5 s ago) means the service fell behind."""

    class Mixed(TimerHandler):
        kind = TimerKind(KIND)

        def fire(self, ctx, timer):
            return Retry() if timer.reference == b"no" else Done()

    due = wall_ms() - 5_000
    schedule(store, P, due, KIND, b"yes")
    schedule(store, P, due, KIND, b"no")
    with caplog.at_level(logging.DEBUG, logger="timerwheel_c.durable"):
        with DurableTimerService(store, TimerRegistry().register(Mixed()), [P], summary_interval_s=0.2) as svc:
            wait_until(lambda: svc.fired == 1 and svc.failed == 1, "one fired, one failed")
            wait_until(lambda: any("1 fired, 1 failed" in r.getMessage() for r in caplog.records), "the summary")
    lines = [r.getMessage() for r in caplog.records
             if r.levelno == logging.DEBUG and " fired " in r.getMessage() and " attempt 1 of " in r.getMessage()]
    assert len(lines) == 2 and all(f"partition {P!r} kind {KIND} (Mixed)" in m and f"due {iso_utc(due)}" in m
                                   and "ms late" in m for m in lines)
    summary = [r for r in caplog.records if r.levelno == logging.INFO and "1 fired, 1 failed" in r.getMessage()]
    assert summary and "p50" in summary[0].getMessage() and "p99" in summary[0].getMessage()
    assert any(r.levelno == logging.WARNING and "falling behind" in r.getMessage() for r in caplog.records)


def test_claims_run_ahead_of_free_slots_by_at_most_the_budget(store):
    """With 50 ms handlers, concurrency 2 and TickBudget(max_fired=5), rows claimed but not started
    (queued) never exceed 5, although the measured handler time would allow more (two slots' work
    within QUEUE_HORIZON_S); all 30 timers fire once. The queue is asserted to have been used."""
    from timerwheel_c.durable.timers.runner import TickBudget
    from timerwheel_c.durable.service.executor import QUEUE_HORIZON_S

    handler_s = 0.05
    assert 2 * QUEUE_HORIZON_S / handler_s > 5
    store.apply_many(P, [Batch().put(keys.timer(wall_ms() - 100, KIND, b"%02d" % i), b"") for i in range(30)])
    h = Sleepy(handler_s)
    seen = []
    with DurableTimerService(store, TimerRegistry().register(h), [P], concurrency=2, budget=TickBudget(max_fired=5)) as svc:
        deadline = time.monotonic() + LIVENESS_S
        while len(effects(store)) < 30 and time.monotonic() < deadline:
            seen.append(svc.queued)
            assert svc.in_flight <= 2
            time.sleep(0.005)
    assert len(effects(store)) == 30 and len(h.calls) == 30
    assert 0 < max(seen) <= 5, max(seen)


@pytest.mark.parametrize("bad", ["0", "-2", "many", "1.5", "1025", "99999999999999999999"])
def test_run_refuses_a_bad_concurrency_with_one_line_and_exit_2(tmp_path, bad):
    """`timerwheel-c run --concurrency N` takes an int 1..1024; anything else exits 2 naming the value,
    before any store is opened (no database file appears)."""
    from cli_run import run_cli

    db = tmp_path / "never.db"
    done = run_cli("run", "--store", f"sqlite:///{db}", "--handlers", "json:loads", "--concurrency", bad)
    assert done.returncode == 2 and "--concurrency" in done.stderr and bad in done.stderr, done.stderr
    assert not db.exists()


@pytest.mark.parametrize("bad, exc", [(float("nan"), ValueError), (-1, ValueError), ("10", TypeError), (True, TypeError)])
def test_stop_refuses_a_bad_timeout_naming_it_and_stops_nothing(store, bad, exc):
    """stop(timeout=nan) raised "Invalid value NaN" from deep in the clock, and stop(-1) returned with
    the thread still running: both, and a non-number, are refused naming the value, before anything
    stops; a timeout past what a thread can wait (1e308, inf) waits without a limit, as None does."""
    h = Sleepy(lambda t: 0.0)
    svc = DurableTimerService(store, TimerRegistry().register(h), [P]).start()
    try:
        with pytest.raises(exc, match=repr(bad)):
            svc.stop(timeout=bad)
        assert svc.running
    finally:
        svc.stop(timeout=1e308)
    assert not svc.running

"""DurableTimerService in-process: first pass after start, early wake on a nearer schedule, exact sleep,
prompt stop, two services on one database (store errors: test_durable_concurrency.py). Timing assertions are only
"not before the due time" and generous liveness bounds (seconds), never speeds."""
from __future__ import annotations

import logging
import os
import re
import threading
import time

import pytest

from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerKind, TimerRegistry
from timerwheel_c.durable.service.service import DurableTimerService
from timerwheel_c.durable.storage.sqlite import SQLiteStore
from timerwheel_c.durable.storage.store import Absent, Batch
from timerwheel_c.durable.timers.tick import BACKOFF_BASE_MS
from timerwheel_c.durable.timers.timing import ManualClock
from waiting import wait_until, wall_ms

P = "svc"
KIND = 0xF2
LIVENESS_S = 20.0



class Effect(TimerHandler):
    """Done with a guarded put of ``effect/<reference>/<tag>``; records (reference, wall ms at fire)."""

    kind = TimerKind(KIND)

    def __init__(self, tag=b"x"):
        self.tag = tag
        self.fired = []
        self.cond = threading.Condition()

    def fire(self, ctx, timer):
        with self.cond:
            self.fired.append((timer.reference, wall_ms(), timer.due_at_ms))
            self.cond.notify_all()
        k = b"effect/" + timer.reference + b"/" + self.tag
        return Done(Batch().require(Absent(k)).put(k, b"1"))

    def wait_for(self, n, timeout=LIVENESS_S):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.fired) >= n, timeout), f"only {len(self.fired)} of {n} fired"


def put_timer(store, due_at_ms, reference):
    store.apply(P, Batch().put(keys.timer(due_at_ms, KIND, reference), b""))


def test_timers_due_while_down_fire_on_first_pass(store):
    """Rows already due when the service starts fire on its first pass, with the default partitions
    (every partition in the store)."""
    for i in range(10):
        put_timer(store, wall_ms() - 60_000 + i, b"%d" % i)
    h = Effect()
    with DurableTimerService(store, TimerRegistry().register(h)):
        h.wait_for(10)
    assert sorted(r for r, _, _ in h.fired) == sorted(b"%d" % i for i in range(10))


@pytest.mark.parametrize("where", ["async handler", "sync handler", "to_thread of an async handler"])
def test_a_handler_may_stop_its_own_service_from_a_thread_that_runs_it(store, where):
    """stop() from an ``async def`` handler (on the service's thread), a sync one (on a worker thread the
    service waits for), or asyncio.to_thread in an async one, returns at once; the handler's outcome
    commits and the service stops. From the service's thread it raised RuntimeError ("cannot join
    current thread"); from the others it waited for the service, which waited for the handler: with no
    timeout for ever, else until its timeout abandoned the handler and discarded its outcome (the
    timeout here bounds that failure)."""
    import asyncio

    registry = TimerRegistry()
    outcome = []

    def stop():
        service.stop(5.0)
        outcome.append("stop() returned")

    if where == "async handler":
        @registry.handler(KIND)
        async def stopping(ctx, timer):
            stop()
            return Done(Batch().put(b"effect/" + timer.reference, b"1"))
    elif where == "sync handler":
        @registry.handler(KIND)
        def stopping(ctx, timer):
            stop()
            return Done(Batch().put(b"effect/" + timer.reference, b"1"))
    else:
        @registry.handler(KIND)
        async def stopping(ctx, timer):
            await asyncio.to_thread(stop)
            return Done(Batch().put(b"effect/" + timer.reference, b"1"))

    put_timer(store, wall_ms() - 10, b"s")
    service = DurableTimerService(store, registry, [P])
    service.start()
    wait_until(lambda: not service.running, "the service to stop", LIVENESS_S)
    assert outcome == ["stop() returned"] and service.died is None
    assert store.get(P, b"effect/s") == b"1" and service.failed == 0
    service.stop()


def test_stop_never_waits_for_a_start_under_way(store):
    """stop() while start() waits on the store (recording its kinds' names): it returns at once, and the
    start that then finishes leaves no service running. A lock shared with start() made it wait for
    the store (ignoring its own timeout), and deadlocked a signal handler that called it within start."""
    from bench.stores import Delegating

    gate, entered = threading.Event(), threading.Event()

    class SlowLabels(Delegating):
        def _record_labels(self, labels):
            entered.set()
            gate.wait(LIVENESS_S)
            return super()._record_labels(labels)

    class Named(Effect):
        kind = TimerKind(KIND, "named-kind")

    service = DurableTimerService(SlowLabels(store), TimerRegistry().register(Named()), [P])
    starting = threading.Thread(target=service.start)
    starting.start()
    try:
        assert entered.wait(LIVENESS_S)
        service.stop(0.1)
        assert starting.is_alive()  # stop() returned while start() still waits on the store
    finally:
        gate.set()
        starting.join(LIVENESS_S)
    wait_until(lambda: not service.running, "the started service to end: it was stopped", LIVENESS_S)
    service.stop()


def test_start_from_several_threads_at_once_starts_one_service(store):
    """start() called by 8 threads at once: one starts the service, the others raise RuntimeError
    naming it started; stop() then ends its one thread and every worker it made. Unguarded, every
    caller made a worker pool and the losers raised "threads can only be started once", their
    pools left running after stop()."""
    h = Effect()
    service = DurableTimerService(store, TimerRegistry().register(h), [P])
    barrier, errors = threading.Barrier(8), []

    def start():
        barrier.wait()
        try:
            service.start()
        except RuntimeError as exc:
            errors.append(str(exc))

    before = set(threading.enumerate())
    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(LIVENESS_S)
    assert errors == ["DurableTimerService already started"] * 7
    put_timer(store, wall_ms() - 10, b"one")
    h.wait_for(1)
    service.stop()
    assert not service.running
    wait_until(lambda: not [t for t in set(threading.enumerate()) - before if t.name.startswith("durable-")],
               "the service's threads to end", LIVENESS_S)


def test_sleeps_until_due_and_never_fires_early(store):
    """A timer scheduled 300 ms ahead fires not before its due time and within the liveness bound,
    with max_sleep_s far above, so only the exact sleep can have woken the thread."""
    h = Effect()
    with DurableTimerService(store, TimerRegistry().register(h), [P], max_sleep_s=3600) as svc:
        wait_until(lambda: svc.passes >= 1, "the first pass, after which the thread sleeps for an hour")
        due = wall_ms() + 300
        svc.schedule(P, due, KIND, b"t")
        h.wait_for(1)
    (_, fired_at, due_at) = h.fired[0]
    assert due_at == due and fired_at >= due


def test_nearer_schedule_wakes_the_thread_early(store):
    """With the thread asleep until a timer an hour away, scheduling one due in 100 ms through the
    service fires it within seconds: the schedule kicked the sleep."""
    h = Effect()
    with DurableTimerService(store, TimerRegistry().register(h), [P], max_sleep_s=7200) as svc:
        svc.schedule(P, wall_ms() + 3_600_000, KIND, b"far")
        wait_until(lambda: svc.wakeup.wake_ms is not None, "the thread asleep until the far timer")
        assert svc.passes >= 1 and svc.wakeup.wake_ms > wall_ms() + 3_000_000
        svc.schedule(P, wall_ms() + 100, KIND, b"near")
        h.wait_for(1)
    assert [r for r, _, _ in h.fired] == [b"near"]


class SlowFirstFailure(TimerHandler):
    """Attempt 1 outlives the first backoff, then fails; later attempts succeed. Time is the service's
    injected wall clock (``wall_ns``): attempt 1 moves it past the backoff, instead of sleeping the
    backoff out, and kicks a pass, which it waits for before failing. Records (attempt, clock ms at
    start, clock ms at end)."""

    kind = TimerKind(KIND)

    def __init__(self):
        self.attempts = []
        self.shift_ns = 0
        self.service = None

    def wall_ns(self):
        return time.time_ns() + self.shift_ns

    def fire(self, ctx, timer):
        started = self.wall_ns() // 1_000_000
        if timer.attempt == 1:
            passes = self.service.passes  # the pass that claimed the row counted before this call
            self.shift_ns += (BACKOFF_BASE_MS + 1000) * 1_000_000
            self.service.notify(P, timer.due_at_ms)
            wait_until(lambda: self.service.passes > passes, "a pass while attempt 1 runs")
            self.attempts.append((timer.attempt, started, self.wall_ns() // 1_000_000))
            raise RuntimeError("failed after its backoff had passed")
        self.attempts.append((timer.attempt, started, self.wall_ns() // 1_000_000))
        return Done()


def test_a_retry_due_while_its_slow_attempt_ran_fires_when_that_attempt_fails(store):
    """The first attempt's backoff (5 s from its claim) runs out while the handler still runs (on the
    service's clock, moved by hand), so a pass made meanwhile skips the row (in flight). When the
    attempt then fails, the retry fires within the liveness bound, not after max_sleep_s (an hour
    here), and not before the attempt ended."""
    h = SlowFirstFailure()
    with DurableTimerService(store, TimerRegistry().register(h), [P], max_sleep_s=3600, wall_ns=h.wall_ns) as svc:
        h.service = svc
        svc.schedule(P, h.wall_ns() // 1_000_000, KIND, b"slow")
        wait_until(lambda: len(h.attempts) >= 2, "the retry", LIVENESS_S)
    assert [a for a, _, _ in h.attempts] == [1, 2], h.attempts
    (_, first_start, first_end), (_, second_start, _) = h.attempts
    assert first_end - first_start > BACKOFF_BASE_MS  # the situation arose: the backoff ran out mid-attempt
    assert second_start >= first_end  # the row stayed in flight until its attempt failed


def test_stop_is_prompt_and_cancel_removes(store):
    """stop() ends a thread sleeping for an hour within seconds; cancel removes a scheduled row and
    reports whether it did."""
    svc = DurableTimerService(store, TimerRegistry().register(Effect()), [P], max_sleep_s=3600).start()
    due = wall_ms() + 3_600_000
    svc.schedule(P, due, KIND, b"c")
    assert svc.cancel(P, KIND, b"c") is True and svc.cancel(P, KIND, b"c") is False
    wait_until(lambda: svc.passes >= 1, "the first pass, after which the thread sleeps for an hour")
    t0 = time.monotonic()
    svc.stop()
    assert not svc.running and time.monotonic() - t0 < 5
    with pytest.raises(ValueError, match="not served"):
        svc.schedule("other", due, KIND, b"c")


def test_stop_ends_the_thread_when_an_async_handler_ignores_its_cancellation(store, caplog):
    """An ``async def`` handler that catches every CancelledError and goes on: stop(0.5) cancels it, and
    the thread still ends within stop()'s bound, the handler abandoned with its loop and named in a
    WARNING. The loop's end waited for every task it cancelled, as ``asyncio.run`` does, so the thread
    (its store connections, a fleet's partitions) outlived stop() for as long as the handler ran: for
    ever here, until the test released it."""
    import asyncio

    registry, released, started = TimerRegistry(), threading.Event(), threading.Event()

    @registry.handler(KIND)
    async def stubborn(ctx, timer):
        started.set()
        while not released.is_set():
            try:
                await asyncio.sleep(0.02)
            except asyncio.CancelledError:
                pass
        return Done()

    put_timer(store, wall_ms() - 10, b"stubborn")
    svc = DurableTimerService(store, registry, [P]).start()
    try:
        assert started.wait(LIVENESS_S)
        with caplog.at_level(logging.WARNING, logger="timerwheel_c.durable"):
            svc.stop(0.5)
            wait_until(lambda: not svc.running, "the thread to end with the handler still running", LIVENESS_S)
        assert not released.is_set() and svc.died is None
        assert any("ignored their cancellation" in r.getMessage() and "stubborn" in r.getMessage()
                   for r in caplog.records)
    finally:
        released.set()


PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.skipif(not PG_DSN, reason="no TIMERWHEEL_C_TEST_PG_DSN"))])
def shared_db(request, tmp_path):
    """A callable opening a new connection (store) to one shared database of the backend."""
    opened = []
    if request.param == "sqlite":
        def open_store():
            opened.append(SQLiteStore(tmp_path / "shared.db"))
            return opened[-1]
    else:
        from timerwheel_c.durable.storage.postgres import PostgresStore

        table = request.getfixturevalue("pg_table")

        def open_store():
            opened.append(PostgresStore(PG_DSN, table=table))
            return opened[-1]
    yield open_store
    for s in opened:
        s.close()


def test_two_services_on_one_database_fire_each_effect_once(shared_db):
    """Two services, each with its own connection to one database, serve 300 timers coming due
    while both run. Each timer's batch effect exists exactly once (an effect key per service tag, so
    a double fire would show as two keys), and every timer fired."""
    writer = shared_db()
    base = wall_ms() + 300
    for i in range(300):
        put_timer(writer, base + i % 50, b"%03d" % i)
    h1, h2 = Effect(b"one"), Effect(b"two")
    s1, s2 = shared_db(), shared_db()
    with DurableTimerService(s1, TimerRegistry().register(h1), [P]), DurableTimerService(s2, TimerRegistry().register(h2), [P]):
        wait_until(lambda: len(h1.fired) + len(h2.fired) >= 300, "300 fires", LIVENESS_S)
    effects = [k for k, _ in writer.scan(P, b"effect/", b"effect0", limit=10_000).entries]
    refs = sorted(k.split(b"/")[1] for k in effects)
    assert refs == sorted(b"%03d" % i for i in range(300))
    assert writer.scan(P, *keys.timer_range()).entries == []


def test_start_after_stop_raises_promptly():
    """The lifecycle is one-shot: ``start()`` after ``stop()`` (on a service that never started)
    raises RuntimeError promptly, never waits on an event no thread will set. Checked from a
    daemon thread with a 5 s bound, so a hang fails the test instead of the suite."""
    svc = DurableTimerService(SQLiteStore(":memory:"), TimerRegistry(), ["p"])
    svc.stop()
    outcome = []

    def go():
        try:
            svc.start()
            outcome.append("started")
        except Exception as exc:  # a clear RuntimeError is an acceptable fix
            outcome.append(type(exc).__name__)
        finally:
            svc.stop()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "start() after stop() hung"
    assert outcome == ["RuntimeError"], "the documented lifecycle is one-shot: start after stop raises"


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan"), 0, -1.0, 1e300])
def test_max_sleep_must_be_finite_and_positive(bad):
    """``max_sleep_s`` must be finite and > 0 seconds, and within the range of due times (1e300 s, a
    finite float, made the service's sleep an infinite ns count): a ValueError naming the value, at
    construction."""
    with pytest.raises(ValueError, match=r"max_sleep_s must be finite and > 0 seconds, at most .*, got " + re.escape(repr(bad))):
        DurableTimerService(SQLiteStore(":memory:"), TimerRegistry(), ["p"], max_sleep_s=bad)
    with pytest.raises(TypeError, match="max_sleep_s"):
        DurableTimerService(SQLiteStore(":memory:"), TimerRegistry(), ["p"], max_sleep_s="5")


class Blocking(TimerHandler):
    """Done with a put of the row ``blocked`` for the reference ``b"held"``, a plain effect row for any
    other; records each reference fired."""

    kind = TimerKind(KIND)

    def __init__(self):
        self.fired = []

    def fire(self, ctx, timer):
        self.fired.append(timer.reference)
        return Done(Batch().put(b"blocked" if timer.reference == b"held" else b"effect/" + timer.reference, b"1"))


@pytest.mark.skipif(not PG_DSN, reason="no TIMERWHEEL_C_TEST_PG_DSN")
def test_a_commit_waiting_on_a_lock_does_not_hold_up_the_claims_on_postgresql(pg_table):
    """With separate_commits on PostgreSQL, outcomes commit on a connection and thread of their own
    (Store.open_sibling): while one commit waits on a row lock another session holds, the service
    still claims and fires the timers that come due, in another partition too, and every outcome
    commits once the lock goes."""
    import psycopg
    from timerwheel_c.durable.storage.postgres import PostgresStore

    store = PostgresStore(PG_DSN, table=pg_table)
    writer = PostgresStore(PG_DSN, table=store.table)  # the test's own connection: never queued behind the service's
    try:
        writer.apply(P, Batch().put(b"blocked", b"0"))
        h = Blocking()
        with psycopg.connect(PG_DSN) as holder, psycopg.connect(PG_DSN, autocommit=True) as watcher:
            svc = DurableTimerService(store, TimerRegistry().register(h), [P, "other"], separate_commits=True).start()
            try:
                try:
                    holder.execute(f'SELECT 1 FROM "{store.table}" WHERE partition = %s AND key = %s FOR UPDATE',
                                   (P, b"blocked"))
                    put_timer(writer, wall_ms() - 1, b"held")

                    def commit_waiting() -> bool:  # (not on holder: its transaction keeps one snapshot of it)
                        return watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                               "AND query LIKE %s", (f"%{store.table}%",)).fetchone()[0] > 0

                    wait_until(commit_waiting, "the outcome's commit to wait on the held row", LIVENESS_S)
                    writer.apply("other", Batch().put(keys.timer(wall_ms() - 1, KIND, b"later"), b""))
                    # The other timer fires while the row is still held, so while the held outcome cannot
                    # commit: the fire did not wait for that commit. (Not asserted as "its commit waits on
                    # the lock now": the commit's lock wait is bounded, so on a loaded machine a look may
                    # fall between a lock timeout and its retry.)
                    wait_until(lambda: b"later" in h.fired, "a timer due while a commit waited to fire", LIVENESS_S)
                finally:
                    holder.rollback()  # before the stop, which would otherwise wait on the commit it holds up
                wait_until(lambda: writer.get("other", b"effect/later") is not None and writer.get(P, b"blocked") == b"1",
                           "the outcomes to commit once the lock was released", LIVENESS_S)
            finally:
                svc.stop()
        assert writer.scan(P, *keys.timer_range()).entries == [] and writer.scan("other", *keys.timer_range()).entries == []
    finally:
        writer.close()
        store.close()


def test_separate_commits_must_be_a_bool(store):
    with pytest.raises(TypeError, match="separate_commits must be a bool, got str 'yes'"):
        DurableTimerService(store, TimerRegistry().register(Effect()), separate_commits="yes")


def test_a_wall_clock_set_back_and_corrected_does_not_stall_the_sleep(store):
    """A pass that runs while the wall clock is set back an hour sees the timer an hour away and
    sleeps as long as it may (``max_sleep_s`` and the summary interval an hour here); once the
    clock is corrected, the sleep re-reads it a second later, ends, and the timer fires, not before
    its due time. Time is a ManualClock the test advances, and the wall clock the service's injected
    ``wall_ns`` on it: the real one is never changed, and no second is waited out in real time."""
    clock = ManualClock()
    shift_ns = [0]
    h = Effect()
    with DurableTimerService(store, TimerRegistry().register(h), [P], fleet=False, max_sleep_s=3600,
                             summary_interval_s=3600, clock=clock,
                             wall_ns=lambda: clock.wall_ns() + shift_ns[0]) as svc:
        wait_until(lambda: svc.passes >= 1 and clock.waiting >= 1, "the first pass, then its sleep")
        passes = svc.passes
        shift_ns[0] = -3600 * 10**9  # set back an hour
        due = clock.wall_ns() // 10**6 + 2000
        svc.schedule(P, due, KIND, b"t")  # a kick: the next pass runs under the clock set back
        # That pass has gone to sleep on its hour-long deadline and on the wall clock's next look.
        wait_until(lambda: svc.passes > passes and clock.waiting >= 2, "a pass under the clock set back, asleep")
        passes = svc.passes
        shift_ns[0] = 0  # corrected
        clock.advance(1.0)  # the look that sees the step
        wait_until(lambda: svc.passes > passes and clock.waiting >= 1, "a pass under the corrected clock, asleep")
        assert h.fired == []  # a second before its due time
        clock.advance(1.0)
        h.wait_for(1)
    (reference, _, due_at) = h.fired[0]
    assert reference == b"t" and due_at == due


def test_a_due_time_in_seconds_is_checked_and_warned_of_once_per_call(store, caplog):
    """A due time that reads as seconds (an int before 1973 as Unix epoch ms) is accepted, and logged
    at WARNING once per schedule() or reschedule(): by the service, which checks it at its edge, and
    not again by the writer it hands the checked value to. The timer is written at that due time.
    Deterministic: the service is never started, so nothing fires."""
    svc = DurableTimerService(store, TimerRegistry().register(Effect()), [P])
    with caplog.at_level(logging.WARNING, logger="timerwheel_c.durable"):
        svc.schedule(P, 1_000_000, KIND, b"secs")
        assert svc.reschedule(P, 2_000_000, KIND, b"secs")
    warned = [r.getMessage() for r in caplog.records if "before 1973" in r.getMessage()]
    assert len(warned) == 2 and "=1000000 " in warned[0] and "=2000000 " in warned[1], warned
    assert store.get(P, keys.timer(2_000_000, KIND, b"secs")) is not None

"""No row, handler or partition may stall the rest of a DurableTimerService: a store error stays with
the partition that raised it, a refused outcome fails alone, anything a handler raises (SystemExit
included) is its own failure, a row in flight is never claimed again by its own service, a handler's
timeout_s turns a hung call into a failure, and partitions are served fairly. Each runs on every
store backend (the ``durable_store`` fixture: SQLite and the real PostgreSQL). Timing assertions are
only liveness bounds (seconds) and orderings, never a speed."""
from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from timerwheel_c.durable import Backoff, get_timer, schedule
from timerwheel_c.durable.service.service import DurableTimerService
from timerwheel_c.durable.storage.errors import PermanentStoreError, TransientStoreError
from bench.stores import Delegating
from timerwheel_c.durable.storage.store import Absent, Batch, Refused
from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerKind, TimerRegistry
from timerwheel_c.durable.timers.timing import Timing
from waiting import wait_until, wall_ms

KIND = 0xF6
LIVENESS_S = 30.0
# The tests whose handler hangs past the service's life: stop() abandons it after 0.5 s, not the
# default 10 s, which they would otherwise sit out in real time (it asserts nothing of theirs).
SHORT_STOP = Timing(stop_timeout_s=0.5)


@pytest.fixture
def store(durable_store):
    return durable_store


class Recording(TimerHandler):
    """Records (partition, reference, attempt) per call; Done with a guarded effect row per reference.
    ``behave(timer)`` may raise or sleep first."""

    kind = TimerKind(KIND)

    def __init__(self, behave=None, timeout_s=None):
        self.behave = behave
        self.timeout_s = timeout_s
        self.lock = threading.Lock()
        self.calls: list = []

    def fire(self, ctx, timer):
        with self.lock:
            self.calls.append((ctx.partition, timer.reference, timer.attempt))
        if self.behave is not None:
            self.behave(timer)
        k = b"effect/" + timer.reference
        return Done(Batch().require(Absent(k)).put(k, b"1"))

    def refs(self, partition=None):
        with self.lock:
            return [r for p, r, _ in self.calls if partition is None or p == partition]


def effects(store, partition):
    return {k[len(b"effect/"):] for k, _ in store.scan(partition, b"effect/", b"effect0", limit=100_000).entries}


class FailingPartition(Delegating):
    """Scans of partition ``bad`` raise ``error`` while it is set (the real store underneath)."""

    def __init__(self, inner, bad, error):
        super().__init__(inner)
        self.bad = bad
        self.error = error

    def _scan(self, partition, *args):
        if partition == self.bad and self.error is not None:
            raise self.error
        return super()._scan(partition, *args)


@pytest.mark.parametrize("error", [TransientStoreError("connection lost"), PermanentStoreError("disk I/O error")])
def test_a_store_error_in_one_partition_neither_drops_claims_elsewhere_nor_starves_later_partitions(store, error):
    """Partition "b" raises on every scan. The rows of "a" (before it in order) and "c" (after it) all
    fire on their first attempt (so no claim was dropped and refired after a backoff) while "b" keeps
    failing (asserted: errors counted); once healed, "b" fires too."""
    failing = FailingPartition(store, "b", error)
    for p in "abc":
        for i in range(5):
            schedule(store, p, wall_ms() - 10, KIND, b"%s%d" % (p.encode(), i))
    h = Recording()
    with DurableTimerService(failing, TimerRegistry().register(h), ["a", "b", "c"]) as svc:
        wait_until(lambda: len(effects(store, "a")) == 5 and len(effects(store, "c")) == 5, "a and c", LIVENESS_S)
        assert svc.errors >= 1 and not h.refs("b")
        assert all(attempt == 1 for p, _, attempt in h.calls)
        failing.error = None
        svc.notify("b", wall_ms())
        wait_until(lambda: len(effects(store, "b")) == 5, "b after healing", LIVENESS_S)


class RefusingPoison(Delegating):
    """Refuses (per batch, as a backend does for a value it cannot hold) every batch writing a key that
    starts with b"poison"; passes the rest to the real store."""

    def _apply_many(self, partition, batches):
        bad = [any(k.startswith(b"poison") for k, _ in b.writes) for b in batches]
        results = iter(self.inner.apply_many(partition, [b for b, x in zip(batches, bad) if not x]))
        return [Refused(PermanentStoreError("value refused")) if x else next(results) for x in bad]


def test_a_refused_outcome_fails_alone_and_never_holds_back_other_commits(store):
    """One handler's outcome batch is refused by the store, every time. It is counted as failed and
    its row stays backed off; meanwhile all 20 timers of another partition commit (the refused batch is
    never requeued in front of them)."""
    class Poisoned(Recording):
        def fire(self, ctx, timer):
            if timer.reference == b"bad":
                return Done(Batch().put(b"poison/x", b"1"))
            return super().fire(ctx, timer)

    wrapped = RefusingPoison(store)
    schedule(store, "x", wall_ms() - 10, KIND, b"bad")
    for i in range(20):
        schedule(store, "y", wall_ms() - 5, KIND, b"y%02d" % i)
    with DurableTimerService(wrapped, TimerRegistry().register(Poisoned()), ["x", "y"]) as svc:
        wait_until(lambda: len(effects(store, "y")) == 20 and svc.failed >= 1, "y committed, bad failed", LIVENESS_S)
        assert svc.fired == 20
    assert store.get("x", b"poison/x") is None


@pytest.mark.parametrize("raised", [SystemExit(3), KeyboardInterrupt()])
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_system_exit_or_keyboard_interrupt_in_a_handler_is_its_failure_and_the_service_goes_on(store, raised, flavour):
    """A handler raising SystemExit or KeyboardInterrupt (sync or async) is counted as failed, like any
    exception; the service's thread keeps running and fires the next timer."""
    class Raising(TimerHandler):
        kind = TimerKind(KIND)

        def __init__(self):
            self.fired = []

        def fire(self, ctx, timer):
            if timer.reference == b"boom":
                raise raised
            self.fired.append(timer.reference)
            return Done()

    class AsyncRaising(Raising):
        async def fire(self, ctx, timer):
            return Raising.fire(self, ctx, timer)

    h = Raising() if flavour == "sync" else AsyncRaising()
    schedule(store, "p", wall_ms() - 10, KIND, b"boom")
    with DurableTimerService(store, TimerRegistry().register(h), ["p"]) as svc:
        wait_until(lambda: svc.failed >= 1, "the failure counted", LIVENESS_S)
        assert svc.running and svc.died is None
        schedule(store, "p", wall_ms(), KIND, b"next")
        svc.notify("p", wall_ms())
        wait_until(lambda: h.fired == [b"next"], "the next timer", LIVENESS_S)
        assert svc.running


def test_a_row_in_flight_is_never_claimed_again_by_its_own_service(store):
    """A handler hangs (concurrency 2). The service's wall clock is moved past the row's backoff (5 s),
    so the claimed row is due again: it is not claimed again beside itself (one call), and the other
    slot still fires every other timer."""
    release = threading.Event()
    shift_ms = [0]
    h = Recording(lambda t: release.wait(LIVENESS_S) if t.reference == b"hang" else None)
    schedule(store, "p", wall_ms() - 10, KIND, b"hang")
    try:
        with DurableTimerService(store, TimerRegistry().register(h), ["p"], concurrency=2, timing=SHORT_STOP,
                                 wall_ns=lambda: time.time_ns() + shift_ms[0] * 1_000_000) as svc:
            wait_until(lambda: h.refs() == [b"hang"], "the hung call", LIVENESS_S)
            shift_ms[0] = 60_000  # the hung row's backoff key is due now
            for i in range(10):
                schedule(store, "p", wall_ms() + 60_000, KIND, b"o%d" % i)
            svc.notify("p", wall_ms() + 60_000)
            wait_until(lambda: len(effects(store, "p")) == 10, "the other timers", LIVENESS_S)
            assert h.refs().count(b"hang") == 1 and svc.in_flight == 1
            release.set()  # before stop(), which would otherwise wait out its 0.5 s for the hung call
    finally:
        release.set()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_handler_past_its_timeout_is_a_failure_and_holds_only_its_own_slot(store, flavour):
    """timeout_s=0.2 on a handler that hangs: the call is counted failed (its row backs off, nothing
    committed) and, with concurrency 2, the other timers behind it fire."""
    release = threading.Event()

    class Hanging(Recording):
        async def afire(self, ctx, timer):
            if timer.reference == b"hang":
                await asyncio.sleep(LIVENESS_S)
            return Recording.fire(self, ctx, timer)

    h = Hanging(lambda t: release.wait(LIVENESS_S) if t.reference == b"hang" else None, timeout_s=0.2)
    if flavour == "async":
        h.fire = h.afire
    schedule(store, "p", wall_ms() - 10, KIND, b"hang")
    for i in range(10):
        schedule(store, "p", wall_ms() - 5, KIND, b"o%d" % i)
    try:
        with DurableTimerService(store, TimerRegistry().register(h), ["p"], concurrency=2, timing=SHORT_STOP) as svc:
            wait_until(lambda: svc.failed >= 1, "the timeout counted as a failure", LIVENESS_S)
            wait_until(lambda: len(effects(store, "p")) == 10, "the other timers", LIVENESS_S)
            assert b"hang" not in effects(store, "p")
            release.set()  # before stop(), which would otherwise wait out its 0.5 s for the hung call
    finally:
        release.set()


def test_an_async_handler_that_ignores_its_timeouts_cancel_fails_and_its_late_outcome_is_dropped(store):
    """An ``async def`` handler past its timeout_s that swallows the cancel and returns Done late: a
    failed attempt saying so, its effect never committed, as a sync call's late outcome is dropped. The
    late Done was committed, the timeout unseen."""
    class Swallows(Recording):
        max_attempts = 1

        async def fire(self, ctx, timer):
            try:
                await asyncio.sleep(LIVENESS_S)
            except asyncio.CancelledError:  # the timeout's, swallowed: Done follows it at once
                pass
            return Recording.fire(self, ctx, timer)

    h = Swallows(None, timeout_s=0.1)
    schedule(store, "p", wall_ms() - 10, KIND, b"swallow")
    with DurableTimerService(store, TimerRegistry().register(h), ["p"], timing=SHORT_STOP) as svc:
        def parked():  # its failure commits after the counter counts it
            pending = get_timer(store, "p", KIND, b"swallow")
            return pending is not None and pending.state == "parked"

        wait_until(parked, "the late return parked as a failure (max_attempts=1)", LIVENESS_S)
        assert svc.failed >= 1 and "ignored the cancel" in get_timer(store, "p", KIND, b"swallow").last_error
    assert svc.fired == 0 and effects(store, "p") == set()


def test_a_handler_whose_fire_fails_to_be_read_fails_its_own_attempt_and_the_loop_serves_on(store, caplog):
    """A handler whose ``fire`` raises when read (a property, a lazy proxy's ``__getattr__`` whose client
    fails to start): that attempt's failure, with its error kept, while the other timers fire on the
    same loop. The read raised on the service's loop, as it asked whether the handler was async: the
    loop failed and restarted, every row in flight with it, at each of the timer's attempts."""
    class Lazy(TimerHandler):
        kind = TimerKind(KIND)

        @property
        def fire(self):
            raise ConnectionError("the handler's client failed to start")

    other = Recording()
    other.kind = TimerKind(KIND + 1)
    schedule(store, "p", wall_ms() - 10, KIND, b"lazy")
    schedule(store, "p", wall_ms() - 10, KIND + 1, b"other")
    registry = TimerRegistry().register(Lazy()).register(other)
    with caplog.at_level(logging.ERROR, logger="timerwheel_c.durable"):
        with DurableTimerService(store, registry, ["p"]):
            def failed():
                pending = get_timer(store, "p", KIND, b"lazy")
                return pending is not None and pending.last_error is not None

            wait_until(failed, "the failure of the handler whose fire fails to be read", LIVENESS_S)
            wait_until(lambda: b"other" in effects(store, "p"), "the other timer's fire", LIVENESS_S)
    assert "client failed to start" in get_timer(store, "p", KIND, b"lazy").last_error
    assert not [r for r in caplog.records if "loop failed" in r.getMessage()]


def test_an_async_call_that_goes_on_past_its_timeouts_cancel_fails_while_it_runs_and_holds_an_overdue_slot(store):
    """An ``async def`` handler that catches its timeout's cancel and goes on running: within
    IGNORED_CANCEL_S of the cancel its failure commits (the pending timer shows it while the call runs)
    and its slot counts as overdue, as a sync call's past its timeout_s does, so /healthz reports a
    service whose every slot such calls hold; its late Done is dropped. Nothing was recorded until the
    call returned, for ever if it never did, and its slot read as merely busy."""
    release = threading.Event()

    class GoesOn(Recording):
        async def fire(self, ctx, timer):
            while not release.is_set():
                try:
                    await asyncio.sleep(0.02)
                except asyncio.CancelledError:  # the timeout's, and every other, swallowed
                    pass
            return Recording.fire(self, ctx, timer)

    h = GoesOn(None, timeout_s=0.1)
    schedule(store, "p", wall_ms() - 10, KIND, b"goes-on")
    try:
        with DurableTimerService(store, TimerRegistry().register(h), ["p"], concurrency=1, timing=SHORT_STOP) as svc:
            def failed_while_running():
                pending = get_timer(store, "p", KIND, b"goes-on")
                return pending is not None and pending.last_error is not None

            wait_until(failed_while_running, "the failure of the call that ignored its cancel", LIVENESS_S)
            assert "ignored the cancel" in get_timer(store, "p", KIND, b"goes-on").last_error
            assert svc.in_flight == 1 and svc.metrics(backlog_timeout_s=0).handlers_overdue == 1
            release.set()
            wait_until(lambda: svc.metrics(backlog_timeout_s=0).handlers_overdue == 0, "the call to return",
                       LIVENESS_S)
            assert svc.fired == 0 and effects(store, "p") == set()
    finally:
        release.set()


@pytest.mark.slow  # its call outlasts its timeout and then its backoff, in real time: about 2 s
def test_a_sync_call_past_its_timeout_keeps_its_error_and_is_retried_once_it_returns(store):
    """A sync call past its timeout_s: its failure commits at once (the pending timer shows the
    TimeoutError while the call still runs), the row is not fired again while that call runs, and
    once it returns the retry, due by then (backoff 0.1 s), runs without waiting out the claimer's
    longest sleep (max_sleep_s=120 s, past the liveness bound)."""
    release = threading.Event()
    h = Recording(lambda t: release.wait(LIVENESS_S) if t.attempt == 1 else None, timeout_s=0.2)
    h.backoff = Backoff(base_s=0.1, cap_s=0.1)
    schedule(store, "p", wall_ms() - 10, KIND, b"slow")
    try:
        with DurableTimerService(store, TimerRegistry().register(h), ["p"], max_sleep_s=120, timing=SHORT_STOP):
            def kept_error():
                pending = get_timer(store, "p", KIND, b"slow")
                return pending is not None and "TimeoutError" in (pending.last_error or "")
            wait_until(kept_error, "the timed-out attempt's error kept", LIVENESS_S)
            time.sleep(0.3)  # past the retry's due time: the call still runs, so the row stays in flight
            assert h.calls == [("p", b"slow", 1)]
            release.set()
            wait_until(lambda: len(h.calls) == 2, "the retry once the call returned", LIVENESS_S)
            wait_until(lambda: effects(store, "p") == {b"slow"}, "the retry's outcome", LIVENESS_S)
            assert h.calls[1] == ("p", b"slow", 2)
    finally:
        release.set()


def outlast_the_retrys_due_time(svc) -> None:
    """In a first attempt whose backoff is 0.1 s: return once the retry is due (0.1 s on) and the
    runner has passed again (its wake at that due time, which skips the row in flight) or, should it
    not wake, 0.5 s after the call began; a fixed 0.5 s sleep stood for both."""
    passes, began = svc.passes, time.monotonic()
    time.sleep(0.1)
    while svc.passes == passes and time.monotonic() - began < 0.5:
        time.sleep(0.005)


def test_a_call_that_fails_after_its_retry_came_due_is_retried_without_waiting_out_the_longest_sleep(store):
    """A sync call that runs past its backoff (0.1 s) and then raises: its retry is due by the time
    its failure commits, and the runner's last wake skipped the row (in flight then), so the commit
    must wake it once the row has left the rows in flight; the retry runs well before the claimer's
    longest sleep (max_sleep_s=120 s, past the liveness bound)."""
    def behave(timer):
        if timer.attempt == 1:
            outlast_the_retrys_due_time(svc)
            raise RuntimeError("first attempt fails late")

    h = Recording(behave)
    h.backoff = Backoff(base_s=0.1, cap_s=0.1)
    schedule(store, "p", wall_ms() - 10, KIND, b"late")
    svc = DurableTimerService(store, TimerRegistry().register(h), ["p"], max_sleep_s=120)
    with svc:
        wait_until(lambda: effects(store, "p") == {b"late"}, "the retry's outcome", LIVENESS_S)
    assert [attempt for _, _, attempt in h.calls] == [1, 2]


def test_an_outcome_whose_own_guard_fails_after_its_retry_came_due_is_retried_promptly(store):
    """A sync call that runs past its backoff (0.1 s) and returns Done with a batch whose own guard
    fails: the outcome fails, its row stays at its backoff key, due by then, and the commit wakes the
    runner for it as a failure's does; the retry runs well before max_sleep_s=120 s."""
    class GuardFailsFirst(Recording):
        def fire(self, ctx, timer):
            if timer.attempt > 1:
                return Recording.fire(self, ctx, timer)
            with self.lock:
                self.calls.append((ctx.partition, timer.reference, timer.attempt))
            outlast_the_retrys_due_time(svc)
            return Done(Batch().require(Absent(b"never-absent")))

    h = GuardFailsFirst()
    h.backoff = Backoff(base_s=0.1, cap_s=0.1)
    store.apply("p", Batch().put(b"never-absent", b"1"))
    schedule(store, "p", wall_ms() - 10, KIND, b"guarded")
    svc = DurableTimerService(store, TimerRegistry().register(h), ["p"], max_sleep_s=120)
    with svc:
        wait_until(lambda: effects(store, "p") == {b"guarded"}, "the retry's outcome", LIVENESS_S)
    assert [attempt for _, _, attempt in h.calls] == [1, 2]


def test_a_backlog_in_one_partition_does_not_starve_a_lone_timer_in_another(store):
    """3,000 rows due in "a" (each fire takes 1 ms, concurrency 2) and one timer due in "b": b fires
    before a third of a's backlog has (the passes share the slots across partitions)."""
    order: list = []
    lock = threading.Lock()

    class Slow(TimerHandler):
        kind = TimerKind(KIND)

        def fire(self, ctx, timer):
            time.sleep(0.001)
            with lock:
                order.append(ctx.partition)
            return Done()

    now = wall_ms()
    for start in range(0, 3000, 500):
        batch = Batch()
        for i in range(start, start + 500):
            from timerwheel_c.durable.timers import keys
            batch.put(keys.timer(now - 5000 + i % 1000, KIND, b"a%05d" % i), b"")
        store.apply("a", batch)
    schedule(store, "b", now, KIND, b"lone")
    with DurableTimerService(store, TimerRegistry().register(Slow()), ["a", "b"], concurrency=2):
        wait_until(lambda: "b" in order, "the lone timer in b", LIVENESS_S * 2)
        with lock:
            before_b = order.index("b")
    assert before_b < 1000, f"b fired after {before_b} rows of a"


def test_an_empty_registry_is_refused_at_start(store):
    """start() with a registry without handlers raises ValueError (such a runner would claim rows it
    cannot fire) and leaves nothing running."""
    svc = DurableTimerService(store, TimerRegistry(), ["p"])
    with pytest.raises(ValueError, match="no handler"):
        svc.start()
    assert not svc.running


def test_a_service_thread_that_ends_without_stop_says_why(store):
    """Should the service's own thread ever end without stop() (here the store's change signal raises
    SystemExit while the loop starts, outside any handler), ``running`` turns False and ``died`` holds
    the exception, which ``timerwheel-c run`` reports before exiting with status 1."""
    class Exiting(Delegating):
        def watch(self, callback):
            raise SystemExit(7)

    h = Recording()
    svc = DurableTimerService(Exiting(store), TimerRegistry().register(h), ["p"]).start()
    try:
        wait_until(lambda: not svc.running, "the thread to end", LIVENESS_S)
        assert isinstance(svc.died, SystemExit) and svc.died.code == 7
    finally:
        svc.stop()

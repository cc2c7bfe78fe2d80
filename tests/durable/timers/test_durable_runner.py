"""run_due and its phases, one test per branch. Every test drives run_due with an
explicit now_ms on a fresh store of each backend, so nothing depends on the wall clock or scheduling."""
from __future__ import annotations

import logging
import random
import sys

import pytest

from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.parking import RetryLater
from timerwheel_c.durable.timers.registry import Done, Reschedule, Retry, TimerHandler, TimerKind, TimerRegistry
from timerwheel_c.durable.timers.claim import UNKNOWN_KIND_BACKOFF_MS, UNKNOWN_KIND_GRACE_MS
from timerwheel_c.durable.timers.runner import (RunReport, TickBudget, backoff_ms, claim_due, commit_outcomes, next_wake,
                                               run_due, settle)
from timerwheel_c.durable.storage.sqlite import SQLiteStore
from bench.stores import Delegating
from timerwheel_c.durable.storage.errors import TransientStoreError
from timerwheel_c.durable.storage.store import Batch, Committed, Equals, PreconditionFailed

P = "timers"
NOW = 1_700_000_000_000
A, B = 0xF0, 0xF1


@pytest.fixture
def store(durable_store):
    """Every run_due branch runs on every store backend."""
    return durable_store


class Recorder(TimerHandler):
    """Records each fired timer; answers with ``outcome(timer)`` (default: Done with a marker put)."""

    def __init__(self, kind=A, outcome=None, max_per_tick=None):
        self.kind = TimerKind(kind)
        self.max_per_tick = max_per_tick
        self.seen = []
        self.outcome = outcome or (lambda ctx, t: Done(Batch().put(b"fired/" + t.reference, b"1")))

    def fire(self, ctx, timer):
        self.seen.append(timer)
        return self.outcome(ctx, timer)


def schedule(store, due_at_ms, kind=A, reference=b"r", value=b"v"):
    key = keys.timer(due_at_ms, kind, reference)
    assert store.apply(P, Batch().put(key, value)) == Committed()
    return key


def timer_rows(store):
    start, end = keys.timer_range()
    return [(keys.parse(k), v) for k, v in store.scan(P, start, end, limit=10_000).entries]


def test_done_commits_batch_and_removes_row(store):
    """Done: the handler's batch and the row's removal commit together; the handler saw the original
    due time, attempt 1 and the value."""
    schedule(store, NOW - 10, reference=b"x", value=b"payload")
    h = Recorder()
    report = run_due(store, P, TimerRegistry().register(h), NOW)
    assert (report.fired, report.failed, report.scanned) == (1, 0, 1)
    (t,) = h.seen
    assert (t.due_at_ms, t.kind, t.reference, t.value, t.attempt) == (NOW - 10, TimerKind(A), b"x", b"payload", 1)
    assert store.get(P, b"fired/x") == b"1"
    assert timer_rows(store) == []
    assert report.next_wake_ms is None


def test_run_due_runs_an_async_handler_and_refuses_one_inside_a_running_loop(store):
    """An ``async def`` handler is awaited by run_due (on a loop of its own), its Done committed; called
    from a thread whose loop runs, the attempt fails with a RuntimeError saying why, and no coroutine is
    left unawaited. run_due took the coroutine for the outcome: every attempt failed ("not Done") and
    the timer ended parked, its body never run."""
    import asyncio
    import warnings

    registry = TimerRegistry()
    ran = []

    @registry.handler(A)
    async def handler(ctx, timer):
        await asyncio.sleep(0)
        ran.append(timer.reference)
        return Done(Batch().put(b"fired/" + timer.reference, b"1"))

    schedule(store, NOW - 10, reference=b"x")
    current = asyncio.new_event_loop()
    asyncio.set_event_loop(current)
    try:
        report = run_due(store, P, registry, NOW)
        assert asyncio.get_event_loop() is current  # the thread's loop left as it was (asyncio.run unset it)
    finally:
        asyncio.set_event_loop(None)
        current.close()
    assert (report.fired, report.failed, ran) == (1, 0, [b"x"])
    assert store.get(P, b"fired/x") == b"1" and timer_rows(store) == []

    schedule(store, NOW - 10, reference=b"in-loop")

    async def inside():
        return run_due(store, P, registry, NOW)

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # "coroutine ... was never awaited"
        report = asyncio.run(inside())
    assert (report.fired, report.failed, ran) == (0, 1, [b"x"])
    [(tk, _)] = timer_rows(store)
    assert tk.attempt == 1 and tk.reference == b"in-loop"


def test_run_due_awaits_an_async_handler_as_the_service_does(store, caplog):
    """run_due's ``async def`` handler past its ``timeout_s`` is cancelled, a failed attempt saying so
    (the service's TimeoutError), and the tasks a handler leaves are cancelled as its loop ends, as
    asyncio.run cancels them. run_due awaited it to its end whatever its timeout_s, and left its tasks
    pending on a closed loop ("Task was destroyed but it is pending")."""
    import asyncio

    registry = TimerRegistry()
    seen: list = []

    @registry.handler(A, timeout_s=0.05)
    async def slow(ctx, timer):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return Done()

    @registry.handler(B)
    async def spawner(ctx, timer):
        seen.append(asyncio.get_running_loop().create_task(asyncio.sleep(3600)))
        return Done(Batch().put(b"fired/" + timer.reference, b"1"))

    schedule(store, NOW - 10, kind=A, reference=b"slow")
    report = run_due(store, P, registry, NOW)
    assert (report.fired, report.failed, seen) == (0, 1, ["cancelled"])
    assert "failed: TimeoutError: handler ran past its timeout_s=0.05 s; cancelled" in caplog.text
    seen.clear()
    schedule(store, NOW - 10, kind=B, reference=b"spawns")
    report = run_due(store, P, registry, NOW)
    (task,) = seen
    assert (report.fired, report.failed) == (1, 0) and task.cancelled()
    assert store.get(P, b"fired/spawns") == b"1"


def test_reschedule_moves_row_and_same_key_is_a_failure(store):
    """Reschedule moves the row to the new due time with the new value (attempt reset) and commits the
    batch; a Reschedule to the row's own scheduled key is a failure and the row backs off."""
    schedule(store, NOW - 1, reference=b"m")
    h = Recorder(outcome=lambda ctx, t: Reschedule(NOW + 1000, b"v2", Batch().put(b"eff", b"1")))
    report = run_due(store, P, TimerRegistry().register(h), NOW)
    assert report.fired == 1 and store.get(P, b"eff") == b"1"
    [(tk, v)] = timer_rows(store)
    assert (tk.due_at_ms, tk.attempt, tk.reference, v) == (NOW + 1000, 0, b"m", b"v2")
    assert report.next_wake_ms == NOW + 1000

    store.apply(P, Batch().delete(keys.timer(NOW + 1000, A, b"m")))
    schedule(store, NOW - 5, reference=b"same")
    h2 = Recorder(outcome=lambda ctx, t: Reschedule(t.due_at_ms, b"v", None))
    report = run_due(store, P, TimerRegistry().register(h2), NOW)
    assert (report.fired, report.failed) == (0, 1)
    [(tk, _)] = timer_rows(store)
    assert (tk.attempt, tk.due_at_ms, tk.original_due_at_ms) == (1, NOW + 5000, NOW - 5)


@pytest.mark.parametrize("how", ["retry", "raise", "bad-outcome"])
def test_failure_backoff_grows_and_caps(store, how, caplog):
    """Retry, an exception or an invalid outcome leave the row backed off: attempt n is due
    min(5 s * 2**(n-1), 600 s) after the failing tick, original due and payload kept. Run each tick at
    the row's retry time, so the test needs no waiting."""

    def outcome(ctx, t):
        if how == "raise":
            raise RuntimeError("boom")
        return Retry() if how == "retry" else "nonsense"

    schedule(store, NOW, reference=b"f", value=b"keep")
    registry = TimerRegistry().register(Recorder(outcome=outcome))
    now, delays = NOW, []
    with caplog.at_level(logging.CRITICAL, logger="timerwheel_c.durable"):
        for attempt in range(1, 12):
            report = run_due(store, P, registry, now)
            assert (report.fired, report.failed) == (0, 1)
            [(tk, v)] = timer_rows(store)
            assert (tk.attempt, tk.original_due_at_ms, v) == (attempt, NOW, b"keep")
            delays.append(tk.due_at_ms - now)
            assert report.next_wake_ms == tk.due_at_ms
            now = tk.due_at_ms
    assert delays == [5000, 10000, 20000, 40000, 80000, 160000, 320000, 600000, 600000, 600000, 600000]
    assert delays == [backoff_ms(a) for a in range(1, 12)]


def test_unknown_kind_waits_its_grace_then_is_backed_off_kept_and_warned_once(store, caplog):
    """Rows of an unregistered kind are left in place for UNKNOWN_KIND_GRACE_MS after their due time
    (for a runner that has the kind), the tick waking when the grace ends; after it they are counted,
    moved UNKNOWN_KIND_BACKOFF_MS later with no attempt counted (never fired, never dropped), and
    logged once per kind per registry."""
    for i in range(3):
        schedule(store, NOW - 3 + i, kind=0xFE, reference=b"u%d" % i)
    schedule(store, NOW - 1, kind=0xFD, reference=b"w")
    registry = TimerRegistry().register(Recorder())
    early = run_due(store, P, registry, NOW)
    assert (early.unknown_waiting, early.unknown, early.moved) == (4, 0, 0)
    assert early.next_wake_ms == NOW - 3 + UNKNOWN_KIND_GRACE_MS
    with caplog.at_level(logging.WARNING, logger="timerwheel_c.durable"):
        report = run_due(store, P, registry, NOW + UNKNOWN_KIND_GRACE_MS)
        later = max(tk.due_at_ms for tk, _ in timer_rows(store))
        report2 = run_due(store, P, registry, later + UNKNOWN_KIND_GRACE_MS)
    assert (report.unknown, report.fired, report2.unknown) == (4, 0, 4)
    warned = [r for r in caplog.records if "no handler for timer kind" in r.getMessage()]
    assert sorted(r.args[1] for r in warned) == [0xFD, 0xFE]
    rows = timer_rows(store)
    assert len(rows) == 4 and {(tk.attempt, tk.due_at_ms) for tk, _ in rows} == {
        (0, later + UNKNOWN_KIND_GRACE_MS + UNKNOWN_KIND_BACKOFF_MS)}


def test_malformed_rows_retained_and_counted(store):
    """Malformed keys in the due range are counted and kept, moved with their value to their
    quarantine key outside the timer space, so the next tick does not scan them again; the
    well-formed rows after them fire."""
    bad = [keys.TAG + b"\x00", keys.TAG + (NOW - 5).to_bytes(8, "big") + b"\xf0\x09junk"]
    for k in bad:
        store.apply(P, Batch().put(k, b"?"))
    schedule(store, NOW - 1)
    registry = TimerRegistry().register(Recorder())
    report = run_due(store, P, registry, NOW)
    assert (report.malformed, report.fired, report.scanned) == (2, 1, 3)
    assert all(store.get(P, k) is None and store.get(P, keys.quarantine(k)) == b"?" for k in bad)
    quarantined = store.scan(P, *keys.QUARANTINE_RANGE, limit=100).entries
    assert sorted(quarantined) == sorted((keys.quarantine(k), b"?") for k in bad)
    again = run_due(store, P, registry, NOW)
    assert (again.malformed, again.scanned) == (0, 0)


def test_malformed_row_kept_in_place_when_its_quarantine_key_is_taken(store):
    """The quarantine move is guarded with Absent: a row already quarantined under the same key is
    never overwritten; the new malformed row then stays where it is, still counted."""
    bad = keys.TAG + b"\x00"
    store.apply(P, Batch().put(bad, b"new").put(keys.quarantine(bad), b"old"))
    report = run_due(store, P, TimerRegistry(), NOW)
    assert report.malformed == 1
    assert (store.get(P, bad), store.get(P, keys.quarantine(bad))) == (b"new", b"old")


def test_raced_claim_and_raced_commit(store):
    """A row another runner takes between scan and claim counts as raced and is not fired; a handler
    whose claimed row is re-claimed before its commit counts as raced and its batch is not applied."""
    schedule(store, NOW - 2, reference=b"first")
    second = schedule(store, NOW - 1, reference=b"second")

    def steal(ctx, t):
        if t.reference == b"first":
            # another runner takes the second row (still in this tick's scanned page)
            ctx.store.apply(ctx.partition, Batch().delete(second))
            # and re-claims this one while we run
            ctx.store.apply(ctx.partition, Batch().require(Equals(t.key, t.value)).delete(t.key).put(b"elsewhere", t.value))
        return Done(Batch().put(b"effect/" + t.reference, b"1"))

    h = Recorder(outcome=steal)
    report = run_due(store, P, TimerRegistry().register(h), NOW)
    assert [t.reference for t in h.seen] == [b"first"]
    assert (report.raced, report.fired) == (2, 0)
    assert store.get(P, b"effect/first") is None


def test_handler_guard_failure_is_a_failed_commit(store):
    """A Done batch whose own guard fails is a failed commit: no effect, the row stays backed off."""
    schedule(store, NOW - 1)
    h = Recorder(outcome=lambda ctx, t: Done(Batch().require(Equals(b"missing", b"x")).put(b"eff", b"1")))
    report = run_due(store, P, TimerRegistry().register(h), NOW)
    assert (report.failed, report.fired) == (1, 0) and store.get(P, b"eff") is None
    [(tk, _)] = timer_rows(store)
    assert tk.attempt == 1


def test_per_kind_cap_defers_and_max_per_tick_lowers_it(store):
    """Rows over a kind's cap are deferred (left in place), other kinds are unaffected, and a handler's
    max_per_tick lowers its own kind's cap; deferred rows make the next wake now."""
    for i in range(5):
        schedule(store, NOW - 10 + i, kind=A, reference=b"a%d" % i)
        schedule(store, NOW - 10 + i, kind=B, reference=b"b%d" % i)
    ha, hb = Recorder(A), Recorder(B, max_per_tick=1)
    report = run_due(store, P, TimerRegistry().register(ha).register(hb), NOW, TickBudget(max_per_kind=3))
    assert (len(ha.seen), len(hb.seen)) == (3, 1)
    assert (report.fired, report.deferred, report.stopped_on_budget) == (4, 6, False)
    assert [t.reference for t in ha.seen] == [b"a0", b"a1", b"a2"]
    assert len(timer_rows(store)) == 6
    assert report.next_wake_ms == NOW


class CountingScans(Delegating):
    """Delegates to a real store and counts the rows its scans read."""

    def __init__(self, inner):
        super().__init__(inner)
        self.read = 0

    def _scan(self, partition, *args):
        page = super()._scan(partition, *args)
        self.read += len(page.entries)
        return page


def test_a_claim_whose_every_kind_is_capped_reads_no_further_page(store):
    """A backlog of one kind past its cap: the claim stops once the kind's cap is reached and the page
    it read is looked at, reading no page of rows it could only defer, and says it stopped on its
    budget (the next wake is now); the next claim takes the next rows. With two kinds, a page is read
    while one of them is under its cap."""
    from timerwheel_c.durable.timers.claim import SCAN_PAGE

    for i in range(SCAN_PAGE + 100):
        schedule(store, NOW - 1000 + i, reference=b"%04d" % i)
    counting = CountingScans(store)
    budget = TickBudget(max_per_kind=3)
    claims = claim_due(counting, P, TimerRegistry().register(Recorder()), NOW, budget)
    assert [c.timer.reference for c in claims.timers] == [b"0000", b"0001", b"0002"]
    assert counting.read == SCAN_PAGE, "one page, not the backlog up to max_scanned"
    assert (claims.report.deferred, claims.report.stopped_on_budget) == (SCAN_PAGE - 3, True)
    assert next_wake(store, P, NOW, claims.report) == NOW
    claims = claim_due(counting, P, TimerRegistry().register(Recorder()), NOW, budget)
    assert [c.timer.reference for c in claims.timers] == [b"0003", b"0004", b"0005"]
    counting.read = 0
    claims = claim_due(counting, P, TimerRegistry().register(Recorder()).register(Recorder(B)), NOW, budget)
    assert len(claims.timers) == 3 and counting.read == SCAN_PAGE + 100 - 6, "kind B may lie further on"


class CountingShardReads(Delegating):
    """Delegates to a real store; keeps the limits of each scan_shards of the due range and the rows it read."""

    def __init__(self, inner):
        super().__init__(inner)
        self.limits, self.read = [], 0

    def _scan_shards(self, shards, start, end, limit):
        rows = super()._scan_shards(shards, start, end, limit)
        if end == keys.due_range(NOW)[1]:
            self.limits.append(dict(zip(shards, limit if isinstance(limit, list) else [limit] * len(shards))))
            self.read += sum(len(r) for r in rows)
        return rows


def test_a_pass_by_shard_reads_a_shard_of_one_partition_a_page_deep(store):
    """By shard, a shard whose last read held rows of one partition is read a claim's first page deep
    (the kind's cap of 100 here), not the room's depth (250): the rows past it could not be claimed by
    that partition in this pass. A shard of two partitions is read two pages deep (within the room);
    an unknown one, the room's. The claims are the same. Deterministic: the clock is fixed."""
    from timerwheel_c.durable.service.metrics import Recorder as Counts
    from timerwheel_c.durable.service.passes import Passes
    from timerwheel_c.durable.storage.shards import shard_of
    from timerwheel_c.durable.timers.timing import Timing

    if store.shard_count < 4:
        pytest.skip("a store of fewer shards than the partitions below")
    by_shard: dict = {}
    for i in range(200):  # partitions in three shards: two alone in theirs, two in one
        p = f"s{i:03d}"
        by_shard.setdefault(shard_of(p, store.shard_count), []).append(p)
    alone = [ps[0] for ps in by_shard.values()][:2]
    pair = next(ps[:2] for ps in by_shard.values() if len(ps) >= 2 and ps[0] not in alone)
    for p in alone + pair:
        batch = Batch()
        for i in range(400):
            batch.put(keys.timer(NOW - 1000 + i, A, b"%s-%03d" % (p.encode(), i)), b"")
        store.apply(p, batch)
    counting = CountingShardReads(store)
    shards = [shard_of(p, store.shard_count) for p in alone + pair[:1]]
    passes = Passes(counting, TimerRegistry().register(Recorder()), TickBudget(max_per_kind=100), lambda: None, None,
                    Counts(), lambda: NOW, Timing(), shards=lambda: shards)
    claimed = [len(passes.run(250, {}, lambda: False, 1000).jobs) for _ in range(2)]
    assert claimed == [250, 250]
    first, second = counting.limits
    assert set(first.values()) == {250}, "nothing known of the shards yet"
    assert second == {shards[0]: 100, shards[1]: 100, shards[2]: 200}
    assert counting.read == 3 * 250 + 100 + 100 + 200


@pytest.mark.parametrize("limit", ["max_fired", "max_scanned", "max_elapsed_ms"])
def test_each_budget_limit_stops_the_tick(store, limit):
    """Each budget limit ends the tick with stopped_on_budget while due rows remain; the limit of 1
    (the clamp floor) lets exactly one row through. The runner's monotonic clock is a fake that
    only the handler advances (5 ms per fire), passed as run_due's clock, so the 1 ms elapsed limit is exceeded after exactly
    one row however slow the store's scan is (a real clock made this flaky on PostgreSQL)."""
    clock_s = [1000.0]

    def slow(ctx, t):
        clock_s[0] += 0.005
        return Done()

    for i in range(4):
        schedule(store, NOW - 10 + i, reference=b"%d" % i)
    budget = TickBudget(**{limit: 0})
    assert getattr(budget, limit) == 1
    h = Recorder(outcome=slow)
    report = run_due(store, P, TimerRegistry().register(h), NOW, budget, clock=lambda: clock_s[0])
    assert report.stopped_on_budget and report.fired == 1 and len(timer_rows(store)) == 3
    assert report.next_wake_ms == NOW


def test_budget_clamps_and_validates():
    """Every TickBudget limit is clamped to >= 1; non-ints are TypeErrors."""
    assert TickBudget(-5, 0, -1, 0) == TickBudget(1, 1, 1, 1)
    with pytest.raises(TypeError, match="max_fired"):
        TickBudget(max_fired=1.0)


class _AlwaysRaced:
    """A store whose every commit loses its guard, as if another runner always got there first."""

    def __init__(self, inner):
        self.scan = inner.scan
        self.get = inner.get

    def apply(self, partition, batch):
        return PreconditionFailed(batch.guards[0].key)

    def apply_many(self, partition, batches):
        return [self.apply(partition, b) for b in batches]


def test_next_wake_rules(store):
    """The four next-wake rules: pending with progress -> now; pending without progress -> now + 5 s;
    otherwise the earliest of the next future due and the earliest timer a commit put, never before
    now; nothing left -> None."""
    registry = TimerRegistry().register(Recorder())
    # pending without progress: the scanned budget is spent on a row another runner takes first
    schedule(store, NOW - 2, reference=b"first")
    schedule(store, NOW - 1)
    report = run_due(_AlwaysRaced(store), P, registry, NOW, TickBudget(max_scanned=1))
    assert report.stopped_on_budget and report.raced == 1 and report.fired == 0
    assert report.next_wake_ms == NOW + 5000
    # earliest future due
    schedule(store, NOW + 777, reference=b"later")
    assert run_due(store, P, registry, NOW).next_wake_ms == NOW + 777
    # earliest put by a commit, in the past: clamped to now
    schedule(store, NOW - 1, reference=b"again")
    back = Recorder(B, outcome=lambda ctx, t: Reschedule(NOW - 100, b""))
    schedule(store, NOW - 1, kind=B, reference=b"putter")
    report = run_due(store, P, TimerRegistry().register(Recorder()).register(back), NOW)
    assert report.fired == 2 and report.next_wake_ms == NOW
    # nothing left
    store.apply(P, Batch().delete(keys.timer(NOW - 100, B, b"putter")).delete(keys.identity(B, b"putter"))
                .delete(keys.timer(NOW + 777, A, b"later")))
    assert run_due(store, P, registry, NOW).next_wake_ms is None


class _CountingScans(Delegating):
    def __init__(self, inner):
        super().__init__(inner)
        self.scans: list = []

    def _scan(self, partition, start, end, after, limit):
        self.scans.append((start, end))
        return super()._scan(partition, start, end, after, limit)


def test_a_tick_that_put_a_row_due_already_wakes_now_without_reading_the_future(store):
    """A tick whose outcome put a timer due already (a Reschedule into the past: a chain catching up)
    wakes now whatever the future holds, so it reads no future row for its wake; one whose put lies
    ahead reads the next future due, as before, and wakes at the earlier of the two."""
    chain = Recorder(B, outcome=lambda ctx, t: Reschedule(t.due_at_ms + 1, b""))
    schedule(store, NOW - 10, kind=B, reference=b"chain")
    schedule(store, NOW + 500, reference=b"ahead")
    counting = _CountingScans(store)
    report = run_due(counting, P, TimerRegistry().register(Recorder()).register(chain), NOW)
    assert report.fired == 1 and report.next_wake_ms == NOW
    future_start = keys.future_range(NOW)[0]
    assert not [s for s in counting.scans if s[0] == future_start]
    ahead = Recorder(B, outcome=lambda ctx, t: Reschedule(NOW + 900, b""))
    counting.scans.clear()
    report = run_due(counting, P, TimerRegistry().register(Recorder()).register(ahead), NOW)
    assert report.fired == 1 and report.next_wake_ms == NOW + 500
    assert [s for s in counting.scans if s[0] == future_start]


def test_pending_with_progress_wakes_now(store):
    """Rows left after a tick that fired something: the next wake is now."""
    for i in range(3):
        schedule(store, NOW - 5 + i, reference=b"%d" % i)
    report = run_due(store, P, TimerRegistry().register(Recorder()), NOW, TickBudget(max_fired=1))
    assert report.stopped_on_budget and report.fired == 1 and report.next_wake_ms == NOW


def test_due_order_across_scheduled_and_backed_off_rows(store):
    """Rows fire in effective due order whatever the insertion order and layout, across several pages
    of 64; rows due after now are left alone."""
    rnd = random.Random(4)
    expected = []
    for i in range(150):
        due = NOW - rnd.randrange(1, 100_000)
        if i % 3:
            key = keys.timer(due, A, b"%03d" % i)
        else:
            key = keys.backoff(due, A, 2, due - 50_000, b"%03d" % i)
        store.apply(P, Batch().put(key, b"v"))
        expected.append((due, key))
    schedule(store, NOW + 1, reference=b"future")
    h = Recorder()
    report = run_due(store, P, TimerRegistry().register(h), NOW, TickBudget(1000, 1000, 1000, 60_000))
    assert report.fired == 150 and not report.stopped_on_budget
    assert [t.reference for t in h.seen] == [keys.parse(k).reference for _, k in sorted(expected)]
    assert report.next_wake_ms == NOW + 1


def test_bad_arguments(store):
    """run_due rejects a bad partition, registry, budget or now_ms with specific exceptions."""
    reg = TimerRegistry()
    with pytest.raises(TypeError, match="registry"):
        run_due(store, P, {}, NOW)
    with pytest.raises(TypeError, match="budget"):
        run_due(store, P, reg, NOW, budget=5)
    with pytest.raises(ValueError, match="now_ms"):
        run_due(store, P, reg, -1)
    with pytest.raises(ValueError, match="partition"):
        run_due(store, "", reg, NOW)


class _MarkDone(TimerHandler):
    """Done with one ``done/<reference>`` row."""

    kind = TimerKind(1)

    def fire(self, ctx, timer):
        return Done(Batch().put(b"done/" + timer.reference, b"1"))


def test_malformed_rows_do_not_starve_due_timers():
    """Never lost: malformed rows are kept and counted, and they never stop well-formed due timers
    from firing. With 600 malformed rows (kind byte 0) due before one real timer, more than one
    tick's max_scanned (512), each is counted once and moved to the quarantine range, so the
    timer fires. Deterministic: explicit now_ms, no threads."""
    store = SQLiteStore(":memory:")
    registry = TimerRegistry().register(_MarkDone())
    b = Batch()
    for i in range(600):
        b.put(keys.TAG + (1).to_bytes(8, "big") + b"\x00" + i.to_bytes(4, "big"), b"")
    b.put(keys.timer(2, 1, b"real"), b"v")
    store.apply("p", b)
    budget = TickBudget(max_scanned=512)
    first = run_due(store, "p", registry, 1_000, budget)
    assert first.stopped_on_budget and store.get("p", b"done/real") is None, "one tick could not reach the timer"
    malformed = first.malformed
    for tick in range(1, 20):
        malformed += run_due(store, "p", registry, 1_000 + tick * 10_000, budget).malformed
    assert malformed == 600, "each malformed row is counted once (then quarantined)"
    assert store.get("p", b"done/real") == b"1"
    kept = store.scan("p", *keys.QUARANTINE_RANGE, limit=1000).entries
    assert len(kept) == 600, "malformed rows are retained, not lost"


class Counting(Delegating):
    """Delegates to a real store and counts the round trips that write (every apply goes through apply_many)."""

    def __init__(self, inner):
        super().__init__(inner)
        self.writes = 0

    def _apply_many(self, partition, batches):
        self.writes += 1
        return self.inner.apply_many(partition, batches)


def test_claim_due_claims_a_page_per_round_trip_before_any_fire(store):
    """claim_due moves every due row to its attempt-1 backoff key, one apply_many per page of 64, and
    calls no handler: the attempt is counted before fire. Deterministic (explicit now_ms)."""
    for i in range(100):
        schedule(store, NOW - 100 + i, reference=b"%03d" % i)
    h = Recorder()
    counting = Counting(store)
    claims = claim_due(counting, P, TimerRegistry().register(h), NOW, TickBudget(1000, 1000, 1000, 60_000))
    assert len(claims.timers) == 100 and counting.writes == 2 and h.seen == []
    assert claims.report.scanned == 100 and claims.report.moved == 100
    assert [c.timer.reference for c in claims.timers] == [b"%03d" % i for i in range(100)]
    assert all(tk.attempt == 1 and tk.due_at_ms == NOW + backoff_ms(1) for tk, _ in timer_rows(store))


class Across(Delegating):
    """Delegates to a real store; counts apply_across calls; scans of ``bad_scan``, shared claims
    with a batch of ``bad_apply`` and that partition's own claims raise."""

    def __init__(self, inner, bad_scan=None, bad_apply=None):
        super().__init__(inner)
        self.bad_scan, self.bad_apply, self.across, self.many, self.scans = bad_scan, bad_apply, 0, 0, 0

    def _scan(self, partition, *args):
        self.scans += 1
        if partition == self.bad_scan:
            raise TransientStoreError(f"scan of {partition} failed")
        return super()._scan(partition, *args)

    def _apply_many(self, partition, batches):
        self.many += 1
        if partition == self.bad_apply:
            raise TransientStoreError(f"claim on {partition} failed")
        return super()._apply_many(partition, batches)

    def _apply_across(self, items):
        self.across += 1
        if any(p == self.bad_apply for p, _ in items):
            raise TransientStoreError("shared claim failed")
        return self.inner.apply_across(items)


def _schedule_in(store, partition, n):
    for i in range(n):
        store.apply(partition, Batch().put(keys.timer(NOW - 100 + i, A, b"%s%02d" % (partition.encode(), i)), b"v"))


def test_claim_due_across_shares_the_first_round_trip_and_keeps_errors_with_their_partition(store):
    """claim_due_across claims every row of every partition's first page that its budget lets fire in
    one apply_across (70 rows of one partition too, not 64 of them and the rest on a round trip of its
    own), each partition's rows under its own budget and only its own (a row of another partition is
    never claimed). A partition whose scan fails gets that error alone;
    when the shared claim fails (a lock on one partition, say), each partition that had rows in it
    claims them on its own, so only the partition whose own claim fails gets an error and has nothing
    claimed, while a partition with no due rows gets none. Deterministic (explicit now_ms)."""
    from timerwheel_c.durable.timers.runner import claim_due_across

    for partition, n in (("a", 3), ("b", 70), ("c", 2), ("d", 0)):
        _schedule_in(store, partition, n)
    registry = TimerRegistry().register(Recorder())
    wide, narrow = TickBudget(1000, 1000, 1000, 60_000), TickBudget(1, 1000, 1000, 60_000)
    across = Across(store, bad_scan="c")
    claims = claim_due_across(across, [("a", wide, None), ("b", wide, None), ("c", wide, None), ("d", narrow, None)],
                              registry, NOW)
    assert (across.across, across.many) == (1, 0)  # one shared claim round trip, b's 70 rows in it
    assert [sorted(t.timer.reference for t in cl.timers) for cl in claims[:2]] == [
        [b"a00", b"a01", b"a02"], [b"b%02d" % i for i in range(70)]]
    assert isinstance(claims[2].error, TransientStoreError) and claims[2].timers == []
    assert claims[3].error is None and claims[3].timers == []
    assert [c.error for c in claims[:2]] == [None, None]
    _schedule_in(store, "d", 2)
    failing = Across(store, bad_apply="d")
    claims = claim_due_across(failing, [("c", narrow, None), ("d", narrow, None), ("e", wide, None)], registry, NOW)
    assert (failing.across, failing.many) == (1, 2)  # the shared claim, then one of each partition's own
    assert [type(c.error) for c in claims] == [type(None), TransientStoreError, type(None)]
    assert [[t.timer.reference for t in c.timers] for c in claims] == [[b"c00"], [], []]
    assert len(store.scan("d", *keys.due_range(NOW), limit=10).entries) == 2  # d's rows still due, unclaimed
    claims = claim_due_across(store, [("c", narrow, None), ("d", narrow, None)], registry, NOW)
    assert [len(c.timers) for c in claims] == [1, 1]  # the budget of each, on its own rows


def test_a_transient_error_of_one_partitions_own_claim_is_its_shards_once_the_shared_claim_failed(store):
    """The shared claim failed, and one partition's own claim met a transient error (a lock wait past
    the store's bound: a writer's open transaction holds its shard's lock, which every write to the
    shard takes). The shard's partitions after it get that error without a round trip of their own,
    each of which would wait the bound out again; a partition of another shard is claimed, and a
    partition of the same shard tried before the error keeps its claims. Deterministic."""
    from timerwheel_c.durable.storage.shards import shard_of
    from timerwheel_c.durable.timers.runner import claim_due_across

    by_shard: dict = {}
    for i in range(1000):
        by_shard.setdefault(shard_of(f"p{i}", store.shard_count), []).append(f"p{i}")
    first, held, mate = next(ps for ps in by_shard.values() if len(ps) >= 3)[:3]
    other = next(ps[0] for shard, ps in by_shard.items() if shard != shard_of(held, store.shard_count))
    for partition in (first, held, mate, other):
        _schedule_in(store, partition, 2)
    registry = TimerRegistry().register(Recorder())
    budget = TickBudget(1000, 1000, 1000, 60_000)
    failing = Across(store, bad_apply=held)
    claims = claim_due_across(failing, [(p, budget, None) for p in (first, held, mate, other)], registry, NOW)
    assert (failing.across, failing.many) == (1, 3)  # the shared claim, then first's, held's, other's own
    assert [type(c.error) for c in claims] == [type(None), TransientStoreError, TransientStoreError, type(None)]
    assert claims[2].error is claims[1].error
    assert [len(c.timers) for c in claims] == [2, 0, 0, 2]
    assert len(store.scan(mate, *keys.due_range(NOW), limit=10).entries) == 2  # mate's rows still due, unclaimed


def test_a_claim_that_used_up_its_budget_reads_no_further_page(store):
    """A partition with more due rows than its budget, its first page read as a pass reads it (no more
    rows than the budget, :func:`due_request`): the claim claims that page and stops, rather than
    reading the next page only to find the budget used up."""
    from timerwheel_c.durable.timers.claim import due_request

    for i in range(600):
        schedule(store, NOW - 1000 + i, reference=b"%03d" % i)
    budget = TickBudget(64, 1000, 4096, 60_000)
    first = store.scan_many([due_request(P, NOW, budget, 64)])[0]
    counting = Across(store)
    claims = claim_due(counting, P, TimerRegistry().register(Recorder()), NOW, budget, first_page=first)
    assert len(claims.timers) == 64 and claims.report.stopped_on_budget
    assert counting.scans == 0


def test_settle_is_pure_and_commit_outcomes_fails_only_the_failed_guard(store):
    """settle turns outcomes into batches guarded on the claimed row (or counts a failure, whose batch
    only records its error) without touching the store; commit_outcomes commits them in one round trip, where one failed guard fails
    only its own outcome and a re-claimed row counts as raced. Deterministic."""
    for i in range(4):
        schedule(store, NOW - 10 + i, reference=b"%d" % i)
    claims = claim_due(store, P, TimerRegistry().register(Recorder()), NOW)
    report = claims.report
    c0, c1, c2, c3 = claims.timers
    before = timer_rows(store)
    settled = [
        (c0, settle(P, c0, report, Done(Batch().put(b"effect/0", b"1")))),
        (c1, settle(P, c1, report, Done(Batch().require(Equals(b"missing", b"x")).put(b"effect/1", b"1")))),
        (c2, settle(P, c2, report, error=RuntimeError("boom"))),
        (c3, settle(P, c3, report, Reschedule(NOW + 50, b"again"))),
    ]
    assert isinstance(settled[2][1], RetryLater) and report.failed == 1 and timer_rows(store) == before
    assert settled[0][1].guards[-1] == Equals(c0.timer.key, c0.timer.value)
    # another runner re-claims c3's row before the commit
    assert store.apply(P, Batch().delete(c3.timer.key)) == Committed()
    counting = Counting(store)
    commit_outcomes(counting, P, settled, report)
    assert counting.writes == 1
    assert (report.fired, report.failed, report.raced) == (1, 2, 1)
    assert store.get(P, b"effect/0") == b"1" and store.get(P, b"effect/1") is None
    assert store.get(P, keys.timer(NOW + 50, A, b"3")) is None
    assert next_wake(store, P, NOW, report) == report.next_wake_ms == NOW + backoff_ms(1)


def test_settle_of_a_done_fills_its_batch_without_batchs_checking_methods(store):
    """settle runs once per fire: the batch of a Done (its outcome's writes, the guard on the claimed
    row, the deletes of that row and of the identity row) holds what Batch's chained methods would
    build, but is filled without calling them (each would check again a key settle has checked or
    built as bytes), and the outcome's writes are checked for reserved keys without a call per write.
    Deterministic: a profile hook names the Python functions settle calls."""
    schedule(store, NOW - 10, reference=b"r")
    (claimed,) = claim_due(store, P, TimerRegistry().register(Recorder()), NOW).timers
    outcome = Done(Batch().put(b"effect/a", b"1").put(b"effect/b", b"2"))
    called: list = []

    def hook(frame, event, arg):
        if event == "call":
            called.append(frame.f_code.co_name)

    sys.setprofile(hook)
    try:
        batch = settle(P, claimed, RunReport(), outcome)
    finally:
        sys.setprofile(None)
    timer = claimed.timer
    assert batch.guards == [Equals(timer.key, timer.value)]
    assert batch.writes[:4] == [(b"effect/a", b"1"), (b"effect/b", b"2"), (timer.key, None),
                                (keys.identity(timer.kind, timer.reference), None)]
    assert "check_application_batch" in called  # the hook saw settle's calls
    assert not {"require", "delete", "extend", "put", "check_application_key"} & set(called)


def test_settle_reads_its_wall_clock_only_for_a_failure(store):
    """settle given a clock (``wall_ms``) and no ``now_ms`` reads it only to time a failure: a Done
    settles without a read (a service's clock costs a few calls per read, once per fire), and a
    Retry(delay=) moves the row to that clock's time plus the delay. Deterministic: the clock is a
    counter of reads that returns a fixed time."""
    schedule(store, NOW - 10, reference=b"done")
    schedule(store, NOW - 5, reference=b"retry")
    done, retried = claim_due(store, P, TimerRegistry().register(Recorder()), NOW).timers
    reads: list = []

    def wall_ms() -> int:
        reads.append(1)
        return NOW + 7

    batch = settle(P, done, RunReport(), Done(), wall_ms=wall_ms)
    assert batch.guards == [Equals(done.timer.key, done.timer.value)] and reads == []
    retry = settle(P, retried, RunReport(), Retry(delay=2), wall_ms=wall_ms)
    assert isinstance(retry, RetryLater) and reads == [1]
    moved = [k for k, v in retry.writes if v is not None and keys.is_timer_key(k)]
    assert [keys.parse(k).due_at_ms for k in moved] == [NOW + 7 + 2000]


def test_run_due_batches_claims_and_commits(store):
    """run_due over 200 due rows with a fast handler writes in a handful of round trips, not two per
    timer (the first chunk is one row, then pages of 64), and fires each row once."""
    for i in range(200):
        schedule(store, NOW - 1000 + i, reference=b"%03d" % i)
    h = Recorder()
    counting = Counting(store)
    report = run_due(counting, P, TimerRegistry().register(h), NOW, TickBudget(1000, 1000, 1000, 60_000))
    assert report.fired == 200 and len({t.reference for t in h.seen}) == 200
    assert counting.writes <= 2 * (1 + 200 // 64 + 2)
    assert timer_rows(store) == []


class RefusingKeys(Delegating):
    """Refuses (per batch, as a backend does for a row it cannot hold) every batch that writes a key for
    which ``refuse(key)`` is true; the other batches go to the real store."""

    def __init__(self, inner, refuse):
        super().__init__(inner)
        self.refuse = refuse

    def _apply_many(self, partition, batches):
        from timerwheel_c.durable.storage.errors import PermanentStoreError
        from timerwheel_c.durable.storage.store import Refused

        bad = [any(v is not None and self.refuse(k) for k, v in b.writes) for b in batches]
        results = iter(self.inner.apply_many(partition, [b for b, x in zip(batches, bad) if not x]))
        return [Refused(PermanentStoreError("row refused")) if x else next(results) for x in bad]


def test_a_row_whose_claim_is_refused_is_quarantined_and_counted_not_retried(store):
    """The store refuses the claim of one row (its backoff key): that row is moved to its quarantine
    key and counted unprocessable, in the same tick; the other rows fire; a second tick sees nothing."""
    schedule(store, NOW - 10, reference=b"bad")
    schedule(store, NOW - 5, reference=b"good")
    wrapped = RefusingKeys(store, lambda k: keys.is_timer_key(k) and k.endswith(b"bad") and keys.parse(k).attempt == 1)
    h = Recorder()
    report = run_due(wrapped, P, TimerRegistry().register(h), NOW)
    assert (report.fired, report.unprocessable, report.stuck) == (1, 1, 0)
    assert [t.reference for t in h.seen] == [b"good"] and timer_rows(store) == []
    assert store.get(P, keys.quarantine(keys.timer(NOW - 10, A, b"bad"))) == b"v"
    again = run_due(wrapped, P, TimerRegistry().register(h), NOW)
    assert (again.scanned, again.unprocessable) == (0, 0)


def test_a_row_that_can_be_neither_claimed_nor_quarantined_is_counted_stuck_and_skipped_when_excluded(store):
    """Claim and quarantine both refused: the row stays in place, counted stuck and listed once in
    stuck_keys (the tick does not loop on it); passed back as ``exclude`` it is skipped, so a caller
    never retries it in a loop, while the other rows fire."""
    bad_key = schedule(store, NOW - 10, reference=b"bad")
    schedule(store, NOW - 5, reference=b"good")
    wrapped = RefusingKeys(store, lambda k: k.endswith(b"bad"))
    h = Recorder()
    report = run_due(wrapped, P, TimerRegistry().register(h), NOW)
    assert (report.fired, report.stuck, report.stuck_keys) == (1, 1, [bad_key])
    again = claim_due(wrapped, P, TimerRegistry().register(h), NOW, exclude=set(report.stuck_keys))
    assert (again.timers, again.report.stuck, again.report.busy) == ([], 0, 1)


def test_release_claims_makes_first_attempt_claims_due_now_and_keeps_later_backoffs(store):
    """release_claims moves the rows claimed for their first attempt (attempt 1, retry within the
    first backoff) to due now, attempt kept, guarded; a row at attempt 2 keeps its backoff."""
    from timerwheel_c.durable.timers.runner import release_claims

    schedule(store, NOW - 10, reference=b"one")
    schedule(store, NOW - 10, reference=b"two")
    claims = claim_due(store, P, TimerRegistry().register(Recorder()), NOW)
    assert len(claims.timers) == 2
    [two] = [c for c in claims.timers if c.timer.reference == b"two"]
    retry = keys.backoff(NOW + 1000 + backoff_ms(2), A, 2, NOW - 10, b"two")
    store.apply(P, Batch().require(Equals(two.timer.key, b"v")).delete(two.timer.key).put(retry, b"v"))
    assert release_claims(store, P, NOW + 1000) == 1
    rows = {tk.reference: tk for tk, _ in timer_rows(store)}
    assert (rows[b"one"].due_at_ms, rows[b"one"].attempt) == (NOW + 1000, 1)
    assert (rows[b"two"].due_at_ms, rows[b"two"].attempt) == (NOW + 1000 + backoff_ms(2), 2)


def test_release_claims_finds_the_claims_of_a_handler_with_a_longer_first_backoff(store):
    """A handler whose Backoff waits 60 s before a retry has its first claims 60 s out: release_claims
    given the registry finds them (a fleet that took the partition over from a runner that died fires
    them at once); without it, it looks only within the default first backoff, 5 s, and they waited
    out their minute."""
    from timerwheel_c.durable import Backoff
    from timerwheel_c.durable.timers.claim import first_backoff_ms
    from timerwheel_c.durable.timers.runner import release_claims

    slow = Recorder()
    slow.backoff = Backoff(base_s=60)
    registry = TimerRegistry().register(slow)
    assert first_backoff_ms(registry) == 60_000 and first_backoff_ms() == backoff_ms(1)
    schedule(store, NOW - 10, reference=b"one")
    [claimed] = claim_due(store, P, registry, NOW).timers
    assert keys.parse(claimed.timer.key).due_at_ms >= NOW + 60_000
    assert release_claims(store, P, NOW + 1000) == 0
    assert release_claims(store, P, NOW + 1000, registry) == 1
    [(row, _)] = timer_rows(store)
    assert (row.due_at_ms, row.attempt) == (NOW + 1000, 1)


def test_a_claim_holds_the_row_for_the_handlers_timeout_and_a_failure_retries_a_backoff_after_it(store):
    """A handler with timeout_s=60 may run a minute: its claim holds the row for 62 s (timeout_s
    and LEASE_MARGIN_MS), so another runner passing 10 s or 61 s later claims nothing while the
    call still runs within its timeout (a visibility timeout), and claims it once the lease is over,
    as attempt 2. A call that fails at once is retried its backoff after the failure (5 s), not at
    the lease's end. A takeover's release_claims looks as far as the longest lease."""
    from timerwheel_c.durable.timers.claim import first_backoff_ms
    from timerwheel_c.durable.timers.tick import LEASE_MARGIN_MS, lease_ms

    assert lease_ms(1, None, 60.0) == 60_000 + LEASE_MARGIN_MS and lease_ms(1) == backoff_ms(1)
    assert lease_ms(1, None, 1.0) == backoff_ms(1) and lease_ms(3, None, 60.0) == 62_000
    assert lease_ms(1, None, 1e300) == keys.MAX_DUE_MS
    slow = Recorder()
    slow.timeout_s = 60.0
    registry = TimerRegistry().register(slow)
    assert first_backoff_ms(registry) == 62_000
    schedule(store, NOW - 10, reference=b"one")
    [claimed] = claim_due(store, P, registry, NOW).timers
    assert keys.parse(claimed.timer.key).due_at_ms == NOW + 62_000
    for later_ms in (10_000, 61_000):
        assert claim_due(store, P, registry, NOW + later_ms).timers == []
    [again] = claim_due(store, P, registry, NOW + 62_000).timers
    assert again.timer.attempt == 2 and again.timer.reference == b"one"

    def fail(ctx, timer):
        raise RuntimeError("boom")

    failing = Recorder(kind=B, outcome=fail)
    failing.timeout_s = 60.0
    schedule(store, NOW - 10, kind=B, reference=b"two")
    report = run_due(store, P, TimerRegistry().register(failing), NOW + 100_000)
    assert report.failed == 1
    [row] = [tk for tk, _ in timer_rows(store) if tk.reference == b"two"]
    assert (row.attempt, row.due_at_ms) == (1, NOW + 100_000 + backoff_ms(1))


class CountingReads(Delegating):
    """Delegates to a real store; counts scan_many and scan calls and the apply round trips; says it
    reads many partitions at once, or not, as ``at_once`` says."""

    def __init__(self, inner, at_once):
        super().__init__(inner)
        self.at_once = at_once
        self.calls = []

    @property
    def reads_many_at_once(self):
        return self.at_once

    def _scan_many(self, requests):
        self.calls.append(("scan_many", len(requests)))
        return self.inner.scan_many(requests)

    def _scan(self, partition, *args):
        self.calls.append(("scan", partition))
        return super()._scan(partition, *args)

    def _apply_across(self, items):
        self.calls.append(("apply_across", len({p for p, _ in items})))
        return self.inner.apply_across(items)


def test_a_pass_reads_and_claims_every_partition_in_shared_round_trips(store):
    """A service pass over 16 partitions, one with a due timer, reads their due rows in one scan_many,
    claims in one apply_across and reads their next due times in one more scan_many: no scan of its
    own for any partition. With a store that reads partitions one by one, none is read ahead: each
    reads its own as its turn comes. Deterministic: the clock is fixed."""
    from timerwheel_c.durable.service.metrics import Recorder as Counts
    from timerwheel_c.durable.service.passes import Passes
    from timerwheel_c.durable.timers.timing import Timing

    partitions = [f"p{i:02d}" for i in range(16)]
    for p in partitions:
        store.apply(p, Batch().put(keys.timer(NOW + 60_000, A, b"later"), b""))
    store.apply("p05", Batch().put(keys.timer(NOW - 5, A, b"due"), b""))
    for at_once in (True, False):
        counting = CountingReads(store, at_once)
        passes = Passes(counting, TimerRegistry().register(Recorder()), TickBudget(), lambda: partitions, None,
                        Counts(), lambda: NOW, Timing())
        result = passes.run(1000, {}, lambda: False)
        if at_once:
            assert [j.timer.reference for j in result.jobs] == [b"due"]
            assert result.wake_ms == NOW + backoff_ms(1)  # p05's claimed row, due again after its backoff
            assert counting.calls == [("scan_many", 16), ("apply_across", 1), ("scan_many", 16)]
        else:
            assert result.jobs == [] and result.wake_ms == NOW + backoff_ms(1)  # claimed already
            assert counting.calls[:2] == [("scan", partitions[0]), ("scan", partitions[1])]
            assert ("scan_many", 16) in counting.calls  # the wakes: one by one all the same, in the generic one


def test_a_pass_backs_a_shard_off_with_its_partition_after_a_transient_error(store):
    """A partition's claim meets a transient error (a lock wait past the store's bound: a writer's open
    transaction holds its shard's lock, which every write to the shard takes). The shard's other
    partitions back off with it: a later pass before the shard's retry time does not claim them, each
    of which would wait the bound out again while the pass stood still; a partition of another shard
    is claimed meanwhile, and the shard's partitions are claimed once the retry time has come.
    Deterministic: the clocks are fixed, and moved by hand."""
    from timerwheel_c.durable.service.metrics import Recorder as Counts
    from timerwheel_c.durable.service.passes import Passes
    from timerwheel_c.durable.storage.shards import shard_of
    from timerwheel_c.durable.timers.timing import Timing

    by_shard: dict = {}
    for i in range(1000):
        by_shard.setdefault(shard_of(f"s{i}", store.shard_count), []).append(f"s{i}")
    first, mate = next(ps for ps in by_shard.values() if len(ps) >= 2)[:2]
    other = next(ps[0] for shard, ps in by_shard.items() if shard != shard_of(first, store.shard_count))
    _schedule_in(store, first, 1)
    _schedule_in(store, other, 1)
    now_s = [100.0]
    failing = Across(store, bad_apply=first)
    passes = Passes(failing, TimerRegistry().register(Recorder()), TickBudget(), lambda: [first, mate, other], None,
                    Counts(), lambda: NOW, Timing(), clock=lambda: now_s[0])
    result = passes.run(1000, {}, lambda: False)
    assert sorted({j.partition for j in result.jobs}) == [other]  # first failed, transiently
    _schedule_in(store, mate, 1)
    failing.bad_apply = None  # a lock gone, or not: the shard is not asked again before its retry time
    result = passes.run(1000, {}, lambda: False)
    assert result.jobs == [] and result.wake_ms is not None and result.wake_ms > NOW
    now_s[0] += Timing().backoff_s(1) + 0.001
    result = passes.run(1000, {}, lambda: False)
    assert sorted(j.partition for j in result.jobs) == sorted([first, mate])


class CountingPages(CountingReads):
    """CountingReads that also keeps the row limit of each scan_many request and the rows it read."""

    def __init__(self, inner):
        super().__init__(inner, True)
        self.limits, self.read = [], 0

    def _scan_many(self, requests):
        self.limits.append([r[4] for r in requests])
        pages = super()._scan_many(requests)
        self.read += sum(len(page.entries) for page in pages)
        return pages


def test_a_pass_reads_ahead_only_as_far_as_its_room_reaches(store):
    """A backlog in each of 16 partitions, room for 250 rows: the pass reads a full page (its claim's
    size, here the kind's cap of 100) of the partitions whose pages the room may take, the room left
    of the next one and a row of the rest (which says whether they have due rows), and claims 250 rows
    in one apply_across: it reads 263 rows, not 16 full pages to claim from 3. A partition read short
    of the room left to it (one before it had fewer rows than expected) is read again, fully, in the
    next round's one read, even alone. Deterministic: the clock is fixed."""
    from timerwheel_c.durable.service.metrics import Recorder as Counts
    from timerwheel_c.durable.service.passes import Passes
    from timerwheel_c.durable.timers.timing import Timing

    def backlog(partition, rows):
        batch = Batch()
        for i in range(rows):
            batch.put(keys.timer(NOW - 1000 + i, A, b"%s-%03d" % (partition.encode(), i)), b"")
        store.apply(partition, batch)

    def one_pass(prefix, count, short_first):
        """A pass over ``count`` partitions with 150 due rows each, but the first's 10 if ``short_first``."""
        partitions = [f"{prefix}{i:02d}" for i in range(count)]
        for i, p in enumerate(partitions):
            backlog(p, 10 if short_first and i == 0 else 150)
        counting = CountingPages(store)
        passes = Passes(counting, TimerRegistry().register(Recorder()), TickBudget(max_per_kind=100),
                        lambda: partitions, None, Counts(), lambda: NOW, Timing())
        # min_share as a service's cheap handlers give it: a partition may take all the room.
        return passes.run(250, {}, lambda: False, 1000), counting, partitions

    result, counting, _ = one_pass("p", 16, short_first=False)
    assert len(result.jobs) == 250 and result.starved and result.wake_ms == NOW
    assert counting.limits == [[100, 100, 50] + [1] * 13]
    assert counting.read == 263 and counting.calls == [("scan_many", 16), ("apply_across", 3)]
    result, counting, partitions = one_pass("q", 4, short_first=True)
    assert len(result.jobs) == 250
    assert counting.limits == [[100, 100, 50, 1], [100, 40]]
    assert counting.calls == [("scan_many", 4), ("apply_across", 2), ("scan_many", 2), ("apply_across", 2)]
    assert sorted({j.partition: 0 for j in result.jobs}) == partitions
    # The one partition read short is read again alone, and claims its page in one round trip too.
    result, counting, _ = one_pass("r", 3, short_first=True)
    assert len(result.jobs) == 210
    assert counting.limits == [[100, 100, 50], [100]]
    # (then r00's next wake, its due rows all claimed: a read of its own, as one partition's is)
    assert counting.calls == [("scan_many", 3), ("apply_across", 2), ("scan_many", 1), ("apply_across", 1), ("scan", "r00")]


def test_a_retry_a_finite_1e308_seconds_away_is_as_far_as_a_due_time_goes(store):
    """Retry(delay=1e308) is finite, so accepted; its ms used to overflow a float to inf and
    run_due raised, losing the Done of the timer beside it in the chunk, whose handler then ran
    twice. Now the row waits at the latest due time, and its neighbour's effect commits once."""
    from timerwheel_c.durable.timers.runner import Pace

    schedule(store, NOW - 10, reference=b"a")
    schedule(store, NOW - 5, reference=b"b")
    h = Recorder(outcome=lambda ctx, t: Retry(delay=1e308) if t.reference == b"b" else
                 Done(Batch().put(b"fired/" + t.reference, b"1")))
    report = run_due(store, P, TimerRegistry().register(h), NOW, pace=Pace(fire_s=0.0))
    assert (report.fired, report.failed) == (1, 1)
    assert store.get(P, b"fired/a") == b"1"
    ((row, _),) = timer_rows(store)
    assert row.reference == b"b" and row.attempt == 1 and row.due_at_ms == keys.MAX_DUE_MS
    assert run_due(store, P, TimerRegistry().register(h), NOW + 60_000).fired == 0
    assert [t.reference for t in h.seen] == [b"a", b"b"]


def test_a_backoff_past_the_range_of_due_times_holds_up_no_other_timer(store):
    """A Backoff its checks accept (finite base_s and cap_s, 1e305 s) made the claim of the next
    attempt raise OverflowError, every pass on the partition with it, so no timer of the partition
    fired again. Now each claim's backoff key is the latest due time, and the partition's timers fire."""
    from timerwheel_c.durable.timers.tick import Backoff

    class Far(Recorder):
        backoff = Backoff(base_s=1e305, cap_s=1e306)

    schedule(store, NOW - 10, kind=A, reference=b"far")
    schedule(store, NOW + 1, kind=B, reference=b"other")
    far, other = Far(A, outcome=lambda ctx, t: Retry(delay=0)), Recorder(B)
    registry = TimerRegistry().register(far).register(other)
    for now in (NOW, NOW + 1, NOW + 2, NOW + 60_000):
        run_due(store, P, registry, now)
    assert [t.reference for t in other.seen] == [b"other"]
    assert [t.attempt for t in far.seen] == [1, 2, 3, 4]  # Retry(delay=0): again at each tick

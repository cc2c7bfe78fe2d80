"""The records the service's stages pass along: one per row in flight, from its claim to its commit."""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import gc
import sys
import threading
import time
import weakref

import pytest

from timerwheel_c.durable.service.executor import Executor
from timerwheel_c.durable.service.records import Chunk, InFlight, Job
from timerwheel_c.durable.service.service import DurableTimerService
from timerwheel_c.durable.storage.store import Batch, Equals, RowConsume
from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.claim import Claimer
from timerwheel_c.durable.timers.registry import Done, DueTimer, TimerHandler, TimerRegistry
from timerwheel_c.durable.timers.runner import ClaimedTimer, RunReport, TickBudget, claim_due, commit_records, settle

_KIND = keys.TimerKind(1)


class _Noop(TimerHandler):
    kind = _KIND

    def fire(self, ctx, timer):
        return Done()


def _job(partition: str, now_ms: int, handler, timer: DueTimer, schedule=None) -> Job:
    """The Job a claim makes of ``timer``'s row: of its fields, in DueTimer's order."""
    return Job(partition, now_ms, handler, timer.due_at_ms, timer.kind, timer.reference, timer.value, timer.attempt,
               timer.key, schedule)


def test_a_job_is_its_claimed_timer_so_a_row_in_flight_is_one_record():
    """A Job is the ClaimedTimer it was made from (handler, timer and schedule shared, still frozen),
    not a second object holding it: each object alive per row in flight costs the cyclic collector.
    Two jobs of one claim stay two rows (compared by identity), and the job settles as its claim
    would; deterministic, no store."""
    key = keys.timer(1_700_000_000_000, _KIND, b"ref")
    claimed = ClaimedTimer(_Noop(), DueTimer(1_700_000_000_000, keys.KINDS[1], b"ref", b"v", 1, key))
    job = _job("p", 1_700_000_000_005, claimed.handler, claimed.timer, claimed.schedule)
    assert isinstance(job, ClaimedTimer)
    assert (job.handler, job.timer, job.schedule) == (claimed.handler, claimed.timer, claimed.schedule)
    assert (job.partition, job.now_ms, job.key, job.batch, job.started, job.settled) == (
        "p", 1_700_000_000_005, key, None, False, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.timer = claimed.timer  # type: ignore[misc]
    twin = _job("p", 1_700_000_000_005, claimed.handler, claimed.timer, claimed.schedule)
    assert job != twin and len({job, twin}) == 2
    batch = settle(job.partition, job, RunReport(), Done())
    assert isinstance(batch, Batch) and batch.guards == [Equals(key, b"v")]
    assert batch.writes == settle("p", claimed, RunReport(), Done()).writes
    effect = Done(Batch().put(b"effect", b"1"))  # settled off the job's own fields, as off its timer's
    assert (settle("p", job, RunReport(), effect).guards, settle("p", job, RunReport(), effect).writes) == (
        settle("p", claimed, RunReport(), effect).guards, settle("p", claimed, RunReport(), effect).writes)


_NOW_MS = 1_700_000_000_000


def _write_due(store, partition: str, n: int) -> None:
    batch = Batch()
    for i in range(n):
        batch.put(keys.timer(_NOW_MS - 1000, _KIND, b"ref%04d" % i), b"v")
    store.apply(partition, batch)


def test_a_claim_makes_each_rows_job_itself(store):
    """A claim given ``claimed_as=Job`` returns the Jobs it made, one per row claimed, each with the
    claim's partition and time, its row claimed (attempt 1) and settling as a ClaimedTimer does: the
    service's pass makes no ClaimedTimer to wrap. Deterministic: an explicit now_ms on a SQLite file."""
    _write_due(store, "p", 3)
    claims = claim_due(store, "p", TimerRegistry().register(_Noop()), _NOW_MS, claimed_as=Job)
    assert [type(job) for job in claims.timers] == [Job] * 3
    assert {(job.partition, job.now_ms, job.timer.attempt, job.batch) for job in claims.timers} == {
        ("p", _NOW_MS, 1, None)}
    assert [job.timer.reference for job in claims.timers] == [b"ref0000", b"ref0001", b"ref0002"]
    job = claims.timers[0]
    assert settle("p", job, RunReport(), Done()).guards == [Equals(job.key, b"v")]


def _tracked_per_row(roots: list, shared: set) -> int:
    """The containers the collector tracks that are reachable from ``roots`` and not in ``shared``
    (by id), types excluded: what the rows hold of their own. An instance's own attribute dict,
    which Python makes for every instance before 3.11 and from 3.11 on once an instance's attributes
    leave the values its class's shared keys hold (which earlier tests in one process may bring
    about), is walked as part of its instance, not counted apart: the count is of the objects the
    library makes, on every version and in any order of tests."""
    seen: set = set()
    attribute_dicts: set = set()
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or id(obj) in shared or isinstance(obj, type) or not gc.is_tracked(obj):
            continue
        seen.add(id(obj))
        referents = gc.get_referents(obj)
        own = getattr(obj, "__dict__", None)
        if isinstance(own, dict) and any(r is own for r in referents):
            attribute_dicts.add(id(own))
        stack.extend(referents)
    return len(seen - attribute_dicts)


def test_the_rows_of_a_claim_hold_few_containers_through_its_round_trip(store):
    """Every row a pass claims lives through the claim's round trip, long enough for the collector's
    young passes to meet it and promote what it holds towards the full collections that walk an
    application's whole heap; a service embedded in an application (no prepare_process()) pays each
    of them. What Claimer.select hands the store for 64 rows holds at most 4 tracked containers per
    row (its record, which is its claim's Batch, with its two lists and its guard), once a collection
    has untracked the tuples of atomic values. Deterministic: it counts references, no timing."""
    _write_due(store, "p", 64)
    handler = _Noop()
    registry = TimerRegistry().register(handler)
    claimer = Claimer(store, "p", registry, _NOW_MS, TickBudget(1000, 1000, 1000, 60_000), claimed_as=Job)
    rows, batches = claimer.select(64)
    assert len(rows) == len(batches) == 64  # every row chosen to fire: the count is of fired rows
    gc.collect()
    shared = {id(handler), id(registry), *(id(kind) for kind in keys.KINDS)}
    assert _tracked_per_row(rows + batches, shared) <= 4 * 64


def test_a_claim_makes_no_due_timer_for_a_job(store):
    """A claim for the service (``claimed_as=Job``) makes each row's Job of the row's fields: the rows
    it chooses hold no DueTimer (a first attempt's record is its claim's batch alone, a later
    attempt's has its two lists and its guard), and the Jobs it returns hold none either, the one
    DueTimer of a fire being the handler's, made for the call with the claimed row's fields.
    Deterministic: an explicit now_ms on a SQLite file; it counts references, no timing."""
    _write_due(store, "p", 32)
    later = Batch()
    for i in range(32):
        tk = keys.parse(keys.timer(_NOW_MS - 1000, _KIND, b"later%04d" % i))
        later.put(keys.next_attempt(tk, _NOW_MS - 500, 2), b"w")
    store.apply("p", later)
    handler = _Noop()
    registry = TimerRegistry().register(handler)
    claimer = Claimer(store, "p", registry, _NOW_MS, TickBudget(1000, 1000, 1000, 60_000), claimed_as=Job)
    rows, batches = claimer.select(64)
    assert len(rows) == 64
    gc.collect()
    shared = {id(handler), id(registry), *(id(kind) for kind in keys.KINDS)}
    assert not [r for row in rows for r in gc.get_referents(row) if isinstance(r, DueTimer)]
    assert _tracked_per_row(rows + batches, shared) <= 1 * 32 + 4 * 32
    jobs = claimer.claimed(rows, store.apply_many("p", batches))
    assert len(jobs) == 64 and not [r for job in jobs for r in gc.get_referents(job) if isinstance(r, DueTimer)]
    by_ref = {job.reference: job for job in jobs}
    first, again = by_ref[b"ref0000"], by_ref[b"later0000"]
    assert (first.timer.due_at_ms, first.timer.attempt, first.timer.value) == (_NOW_MS - 1000, 1, b"v")
    assert (again.timer.due_at_ms, again.timer.attempt, again.timer.value) == (_NOW_MS - 1000, 3, b"w")
    assert store.get("p", first.timer.key) == b"v" and store.get("p", again.timer.key) == b"w"


def test_the_service_sets_a_jobs_own_fields_without_the_frozen_setattr(store):
    """A fired row's Job gets ``started``, ``settled`` and ``batch`` set by the executor, on the loop
    and a worker thread; ``job.name = value`` would call the frozen dataclass's ``__setattr__``, a
    Python call per assignment per fire. The executor sets them past it (``records.set_field``):
    a profile hook on every thread started with the service sees no such call while 20 rows fire.
    Deterministic: it counts calls, no timing; it first checks that the rows fired."""
    fired: list = []
    setattrs: list = []

    class _Recording(_Noop):
        def fire(self, ctx, timer):
            fired.append(timer.reference)
            return Done()

    def hook(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "__setattr__" and isinstance(frame.f_locals.get("self"), Job):
            setattrs.append(frame.f_locals.get("name"))

    _write_due(store, "p", 20)
    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        with DurableTimerService(store, TimerRegistry().register(_Recording()), ["p"]):
            deadline = time.monotonic() + 20
            while len(fired) < 20 and time.monotonic() < deadline:
                time.sleep(0.01)
            # Every outcome committed: no timer row is left (the deletes commit with the outcome).
            while store.scan("p", *keys.timer_range(), None, 1).entries and time.monotonic() < deadline:
                time.sleep(0.01)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    assert len(fired) == 20
    assert setattrs == []


def test_a_claims_guard_on_its_row_is_made_without_rechecking_it(store):
    """Claimer.select guards each row it claims on its key and value as read (Equals), made without
    Equals' checks of both (the key was parsed, both came from the store): a profile hook sees no
    call of Equals' ``__post_init__`` while 8 rows are chosen and their guards read (a first
    attempt's claim builds its guard as the store reads it), and each guard equals the checked
    Equals of its row. Deterministic: it names the calls, no timing."""
    _write_due(store, "p", 8)
    claimer = Claimer(store, "p", TimerRegistry().register(_Noop()), _NOW_MS, TickBudget(1000, 1000, 1000, 60_000))
    called: list = []

    def hook(frame, event, arg):
        if event == "call":
            owner = frame.f_locals.get("self")
            called.append((type(owner).__name__ if owner is not None else "", frame.f_code.co_name))

    sys.setprofile(hook)
    try:
        rows, batches = claimer.select(8)
        guards = [b.guards for b in batches]
    finally:
        sys.setprofile(None)
    assert len(rows) == 8 and ("", "equals_read") in called  # the rows' guards were made under the hook
    assert ("Equals", "__post_init__") not in called
    assert guards == [[Equals(row.key, row.value)] for row in rows]


def test_a_commit_discards_its_rows_in_flight_in_one_call():
    """The commit stage discards the rows of a commit's outcomes in one InFlight call, keyed by each
    job's partition and claimed row; a row not in flight (given up already) is no error, the others
    stay in flight, a row of the same key in another partition too. Deterministic, no store."""
    key_of = [keys.timer(_NOW_MS, _KIND, b"ref%d" % i) for i in range(3)]
    jobs = [_job("p", _NOW_MS, _Noop(), DueTimer(_NOW_MS, keys.KINDS[1], b"ref%d" % i, b"v", 1, key_of[i]))
            for i in range(3)]
    twin = _job("q", _NOW_MS, _Noop(), jobs[0].timer)
    busy = InFlight()
    for job in [*jobs, twin]:
        busy.add(job)
    busy.discard_jobs([jobs[0], jobs[2]])
    busy.discard_jobs([jobs[0]])
    assert busy.keys() == {"p": frozenset({key_of[1]}), "q": frozenset({key_of[0]})}
    assert busy.jobs["p", key_of[1]] is jobs[1] and busy.jobs["q", key_of[0]] is twin


def test_a_first_attempts_claim_holds_no_list_or_guard_until_the_store_reads_it(store):
    """A row chosen for its first attempt lives through the claim's round trip, and each container it
    holds is one more for the collector's passes to count and promote: its record is its claim's
    batch without lists or a guard of its own, built as the store reads them, equal to the move a
    Batch would spell out. Deterministic: it counts the tracked objects by type while 64 rows are
    chosen, the collector off (so that none is collected or untracked meanwhile)."""
    _write_due(store, "p", 64)
    claimer = Claimer(store, "p", TimerRegistry().register(_Noop()), _NOW_MS, TickBudget(1000, 1000, 1000, 60_000))
    claimer._take(store.scan("p", claimer.start, claimer.end, None, 64))  # the page read before the count
    gc.disable()
    try:
        before = collections.Counter(type(o).__name__ for o in gc.get_objects())
        rows, batches = claimer.select(64)
        new = collections.Counter(type(o).__name__ for o in gc.get_objects()) - before
    finally:
        gc.enable()
    assert len(rows) == 64
    assert new["Equals"] == 0 and new["list"] < 8  # two lists and a guard per row before
    for row in rows:
        assert row.guards == [Equals(row.key, row.value)]
        assert row.writes == Batch().delete(row.key).put(row.claimed_key, row.value).writes


def test_a_bare_dones_batch_holds_no_tracked_container_but_itself(store):
    """Nearly every fire's outcome, a bare Done of a plain timer, waits for its commit with the other
    rows in flight: its batch holds no list, guard or pair the collector tracks past its first pass,
    and reads as the Batch settle spells out for any other Done (the guard on the claimed row, the
    deletes of that row, of its identity row and, after a first attempt, of its kept last error).
    Deterministic: one young collection untracks the tuples of bytes, then the batch's referents are
    read."""
    _write_due(store, "p", 2)
    first, second = claim_due(store, "p", TimerRegistry().register(_Noop()), _NOW_MS).timers
    later = ClaimedTimer(second.handler, dataclasses.replace(
        second.timer, attempt=3, key=keys.next_attempt(keys.parse(second.timer.key), _NOW_MS + 9000, 3)))
    for claimed in (first, later):
        batch = settle("p", claimed, RunReport(), Done())
        spelled = settle("p", claimed, RunReport(), Done(Batch()))  # a Done with a batch: its writes spelled out
        assert isinstance(spelled, RowConsume) and isinstance(batch, RowConsume)
        gc.collect(0)
        assert [r for r in gc.get_referents(batch) if gc.is_tracked(r) and not isinstance(r, type)] == []
        assert (batch.guards, batch.writes) == (spelled.guards, spelled.writes)
    assert (keys.last_error_row(keys.identity(_KIND, later.timer.reference)), None) in batch.writes


class _Activity:
    def logs_each_fire(self) -> bool:
        return False

    def first_attempts(self, lateness_ms: list) -> None:
        pass


class _Recorder:
    activity = _Activity()

    def fires_ended(self, lateness_s: list, took_s: list) -> None:
        pass

    def count(self, report: RunReport) -> None:
        pass


class _Queued(list):
    add_all = list.extend


def test_a_settled_rows_job_is_the_one_container_it_keeps_until_its_commit(store):
    """A row in flight waits for its commit with every other, and each container it keeps is one more
    for the collector's passes to count and promote towards the full passes that walk an embedding
    application's heap: once its handler's bare Done is settled, the row keeps its Job alone, no
    DueTimer (made at each read of ``job.timer``, for the call) and no batch (made as the commit reads
    it), and the commit consumes the rows as settle's batches would. Deterministic: one full
    collection untracks the tuples of bytes, then the references from the jobs are walked."""
    _write_due(store, "p", 3)
    handler = _Noop()
    jobs = claim_due(store, "p", TimerRegistry().register(handler), _NOW_MS, claimed_as=Job).timers
    assert len(jobs) == 3 and jobs[0].timer == DueTimer(_NOW_MS - 1000, keys.KINDS[1], b"ref0000", b"v", 1, jobs[0].key)
    committer = _Queued()
    executor = Executor(1, None, lambda: _NOW_MS, 8, committer, _Recorder(), InFlight(), None)  # type: ignore[arg-type]
    executor._settle(jobs, [Done()] * 3, [None] * 3, [_NOW_MS] * 3, [0.0] * 3)
    assert committer == jobs and all(job.settled for job in jobs)
    gc.collect()
    shared = {id(handler), *(id(kind) for kind in keys.KINDS)}
    assert _tracked_per_row(jobs, shared) == len(jobs)
    assert {job.batch.__class__ for job in jobs} == {tuple}  # what this test counts: no batch kept
    assert commit_records(store, {"p": jobs})["p"].fired == 3
    assert store.scan("p", *keys.timer_range(), None, 10).entries == []


def test_a_rows_batch_refuses_a_change_it_would_lose(store):
    """A first attempt's claim and a bare Done's outcome build their guards and writes at each read,
    so a guard or write added to them would go to a list built for that read and be lost: each way
    to add one raises TypeError naming the record, and the record reads as before."""
    _write_due(store, "p", 1)
    claimer = Claimer(store, "p", TimerRegistry().register(_Noop()), _NOW_MS, TickBudget(1000, 1000, 1000, 60_000))
    claimer._take(store.scan("p", claimer.start, claimer.end, None, 1))
    (claim,), _ = claimer.select(1)
    (claimed,) = claim_due(store, "p", TimerRegistry().register(_Noop()), _NOW_MS).timers
    outcome = settle("p", claimed, RunReport(), Done())
    for record in (claim, outcome):
        read = (record.guards, record.writes)
        for method, argument in (("require", Equals(b"k", b"v")), ("put", b"k"), ("delete", b"k"),
                                 ("extend", Batch().delete(b"k"))):
            with pytest.raises(TypeError, match=f"a {type(record).__name__} is read-only"):
                getattr(record, method)(argument)
        assert (record.guards, record.writes) == read


def test_a_chunk_keeps_no_tuple_per_call_nor_a_handlers_bare_done():
    """A worker's chunk of sync calls lives until the loop settles it, and each object it keeps per
    call is one more for the collector's passes to count and promote: its calls come back as four
    lists (outcomes, errors, start times, durations), and a handler's bare Done is gone by then (the
    shared one stands in for it), while any other outcome is kept as returned. Deterministic: weak
    references to the handlers' outcomes, no store, no thread."""
    made: list = []
    kept = Done(Batch().put(b"effect", b"1"))

    class _Weak(TimerHandler):
        kind = _KIND

        def fire(self, ctx, timer):
            if timer.reference == b"kept":
                return kept
            outcome = Done()
            made.append(weakref.ref(outcome))
            return outcome

    handler = _Weak()
    jobs = [_job("p", _NOW_MS, handler, DueTimer(_NOW_MS, keys.KINDS[1], ref, b"v", 1, keys.timer(_NOW_MS, _KIND, ref)))
            for ref in (b"a", b"b", b"kept")]
    executor = Executor(1, None, lambda: _NOW_MS, 8, None, None, InFlight(), None)  # type: ignore[arg-type]
    ended = executor._call_chunk(Chunk(jobs))
    outcomes, errors, started_ms, took_s = ended
    assert len(made) == 2 and [ref() for ref in made] == [None, None]
    assert outcomes[2] is kept and [o.__class__ for o in outcomes] == [Done] * 3 and outcomes[0].batch is None
    assert errors == [None] * 3 and started_ms == [_NOW_MS] * 3 and len(took_s) == 3
    assert not any(isinstance(x, tuple) for column in ended for x in column)


def test_a_rows_twin_in_another_partition_committing_leaves_it_in_flight(store):
    """Rows in flight are told apart by partition as well as key: two timers of one kind, reference and
    due time in two partitions, claimed in one pass at one clock reading, have the same claimed key,
    and the commit of the fast one must not take the slow one out of the rows in flight, which a later
    pass would then claim again while its first call still runs. The slow call returns only after the
    clock has passed its claim's lease (1 s, its backoff) and a later pass claimed and fired another
    timer of its partition, due after it; it was called once, and both twins are gone. Deterministic:
    a ManualClock, advanced only while the slow call runs; the waits are liveness bounds."""
    from timerwheel_c.durable import get_timer
    from timerwheel_c.durable.timers.registry import Backoff
    from timerwheel_c.durable.timers.timing import ManualClock
    from waiting import LIVENESS_S, wait_until

    clock = ManualClock(wall_ns=_NOW_MS * 1_000_000, monotonic_ns=10**12)
    release = threading.Event()
    calls: list = []
    claimed_keys: dict = {}

    class _Twins(TimerHandler):
        kind = _KIND
        backoff = Backoff(base_s=1, jitter=0)

        async def fire(self, ctx, timer):  # async: the fast twin's outcome never waits in a chunk behind the slow one
            calls.append((ctx.partition, timer.reference, timer.attempt))
            claimed_keys.setdefault(timer.reference, set()).add(timer.key)
            if (ctx.partition, timer.reference) == ("slow", b"twin"):
                while not release.is_set():
                    await asyncio.sleep(0.01)
            return Done()

    for partition in ("slow", "fast"):
        store.apply(partition, Batch().put(keys.timer(_NOW_MS - 1000, _KIND, b"twin"), b""))
    with DurableTimerService(store, TimerRegistry().register(_Twins()), ["slow", "fast"], clock=clock,
                             max_sleep_s=3600.0) as service:
        wait_until(lambda: get_timer(store, "fast", _KIND, b"twin") is None and ("slow", b"twin", 1) in calls,
                   "the fast twin committed while the slow one runs")
        assert len(claimed_keys[b"twin"]) == 1  # one claimed key for both twins: the situation this test needs
        clock.advance(60.0)
        store.apply("slow", Batch().put(keys.timer(clock.wall_ns() // 1_000_000, _KIND, b"later"), b""))
        wait_until(lambda: ("slow", b"later", 1) in calls, "a later pass of the slow twin's partition", LIVENESS_S)
        release.set()
        wait_until(lambda: get_timer(store, "slow", _KIND, b"twin") is None, "the slow twin committed")
    assert service.died is None
    assert [c for c in calls if c[1] == b"twin"] in ([("slow", b"twin", 1), ("fast", b"twin", 1)],
                                                     [("fast", b"twin", 1), ("slow", b"twin", 1)])

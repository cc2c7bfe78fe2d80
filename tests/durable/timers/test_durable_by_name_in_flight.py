"""A timer in flight on its first attempt, written by name as a hostile caller would: its claim left
the identity row naming the scheduled key, so every by-name writer must find the claimed row in the
timer space (keys.first_claim) and never take it for another timer's, nor for gone. Each test claims
rows with the runner's own claim at a fixed now_ms and commits the attempt's outcome afterwards, as
the runner does: no thread waits on a clock, so none can flake on a loaded machine. The property
held throughout: never a lost or doubled fire, and cancel is True exactly when it prevented one."""
from __future__ import annotations

import threading

import pytest

from timerwheel_c.durable import (Done, Retry, TimerExists, TimerHandler, TimerKind, TimerRegistry, cancel,
                                  get_timer, reschedule, run_due, schedule)
from timerwheel_c.durable.storage.store import Batch
from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.claim import claim_due
from timerwheel_c.durable.timers.runner import RunReport, commit_outcomes, fire

P = "in-flight"
KIND = 0xE1
DUE = 1_800_000_000_000  # Unix epoch ms
# References that share prefixes and suffixes with each other, the key's separator bytes among them:
# a search that matched a key's start or end, not the whole of its tail, would take one for another.
NEIGHBOURS = [b"", b"a", b"ab", b"ba", b"a\x00", b"\x00a", b"a\xff", b"\xff", b"\x00", b"\x01\x00\x00\x00\x01"]


class Recording(TimerHandler):
    """Records each fire's (reference, value, attempt) and answers with ``answer(timer)``."""

    kind = TimerKind(KIND)

    def __init__(self, answer=lambda timer: Done()):
        self.fired: list = []
        self.answer = answer

    def fire(self, ctx, timer):
        self.fired.append((timer.reference, timer.value, timer.attempt))
        return self.answer(timer)


def _claim(store, registry, now_ms=DUE):
    claims = claim_due(store, P, registry, now_ms)
    assert claims.error is None
    return claims.timers


def _commit(store, claimed, now_ms=DUE):
    """Fire ``claimed`` and commit their outcomes, as the runner does after its claim; the RunReport."""
    report = RunReport()
    commit_outcomes(store, P, [(c, fire(store, P, now_ms, c, report)) for c in claimed], report)
    return report


def test_neighbouring_references_in_flight_are_each_found_as_themselves(durable_store):
    """Every name of NEIGHBOURS is claimed at once for its first attempt, all due at the same ms; a
    cancel of one removes that one alone (True once, then False), the others stay found by name with
    their own values, and only the cancelled one's attempt loses its commit."""
    handler = Recording()
    registry = TimerRegistry().register(handler)
    for ref in NEIGHBOURS:
        schedule(durable_store, P, DUE, KIND, ref, b"v" + ref)
    claimed = _claim(durable_store, registry)
    assert len(claimed) == len(NEIGHBOURS)
    for ref in NEIGHBOURS:  # the situation under test: every identity row still names the scheduled key
        assert durable_store.get(P, keys.identity(KIND, ref)) == keys.timer(DUE, KIND, ref)
    for gone in (b"a", b"\x00", b""):
        assert cancel(durable_store, P, KIND, gone) is True
        assert cancel(durable_store, P, KIND, gone) is False
        assert get_timer(durable_store, P, KIND, gone) is None
    kept = [ref for ref in NEIGHBOURS if ref not in (b"a", b"\x00", b"")]
    for ref in kept:
        pending = get_timer(durable_store, P, KIND, ref)
        assert (pending.reference, pending.value, pending.attempt, pending.state) == (ref, b"v" + ref, 1, "retrying")
    report = _commit(durable_store, claimed)
    assert (report.fired, report.raced) == (len(kept), 3)
    assert run_due(durable_store, P, registry, DUE + 3_600_000).fired == 0
    assert durable_store.scan(P, b"", b"\xff").entries == []


@pytest.mark.parametrize("if_exists", ["keep", "error", "replace"])
def test_schedule_of_a_name_in_flight_never_makes_a_second_timer(durable_store, if_exists):
    """schedule() of a name whose first attempt is claimed: "keep" returns the claimed row's key,
    "error" raises TimerExists naming it retrying, "replace" arms the new timer and the running
    attempt's Done no longer commits. Either way one timer of the name is pending afterwards, and
    the name fires once more at most (the replacement), never twice."""
    handler = Recording()
    registry = TimerRegistry().register(handler)
    schedule(durable_store, P, DUE, KIND, b"job", b"old")
    [claimed] = _claim(durable_store, registry)
    if if_exists == "error":
        with pytest.raises(TimerExists, match="retrying"):
            schedule(durable_store, P, DUE + 60_000, KIND, b"job", b"new", if_exists=if_exists)
    else:
        key = schedule(durable_store, P, DUE + 60_000, KIND, b"job", b"new", if_exists=if_exists)
        assert key == (claimed.timer.key if if_exists == "keep" else keys.timer(DUE + 60_000, KIND, b"job"))
    report = _commit(durable_store, [claimed])
    assert (report.fired, report.raced) == ((0, 1) if if_exists == "replace" else (1, 0))
    run_due(durable_store, P, registry, DUE + 3_600_000)
    expected = [(b"job", b"old", 1)] + ([(b"job", b"new", 1)] if if_exists == "replace" else [])
    assert handler.fired == expected
    assert durable_store.scan(P, b"", b"\xff").entries == []


def test_a_first_attempt_that_failed_is_cancelled_and_rescheduled_by_name(durable_store):
    """The first attempt fails (Retry, the default backoff): the row stays at its claimed key with
    the identity row naming the scheduled one. get_timer shows the error, reschedule moves it once,
    and a cancel then prevents every later fire."""
    handler = Recording(lambda timer: Retry())
    registry = TimerRegistry().register(handler)
    schedule(durable_store, P, DUE, KIND, b"flaky", b"v")
    report = run_due(durable_store, P, registry, DUE)
    assert report.failed == 1
    assert durable_store.get(P, keys.identity(KIND, b"flaky")) == keys.timer(DUE, KIND, b"flaky")
    pending = get_timer(durable_store, P, KIND, b"flaky")
    assert (pending.state, pending.attempt) == ("retrying", 1) and "Retry" in pending.last_error
    assert reschedule(durable_store, P, DUE + 10, KIND, b"flaky") is True
    assert get_timer(durable_store, P, KIND, b"flaky").due_at_ms == DUE + 10
    assert cancel(durable_store, P, KIND, b"flaky") is True
    assert run_due(durable_store, P, registry, DUE + 3_600_000).fired == 0
    assert len(handler.fired) == 1 and durable_store.scan(P, b"", b"\xff").entries == []


def test_concurrent_cancels_of_a_name_in_flight_agree_on_one_true(durable_store):
    """Eight threads cancel the same name, claimed for its first attempt, at once: exactly one is
    told True, none raises, and the attempt's Done loses its commit."""
    if getattr(durable_store, "path", None) == ":memory:":
        pytest.skip("an in-memory SQLite store has one connection: threads would only take turns")
    registry = TimerRegistry().register(Recording())
    schedule(durable_store, P, DUE, KIND, b"contended")
    for i in range(300):  # past a page of the search, so the threads' reads interleave with writes
        schedule(durable_store, P, DUE + 1 + i, KIND, b"later%03d" % i)
    claimed = [c for c in _claim(durable_store, registry) if c.timer.reference == b"contended"]
    assert len(claimed) == 1
    barrier, answers, errors = threading.Barrier(8), [], []

    def cancel_it():
        barrier.wait()
        try:
            answers.append(cancel(durable_store, P, KIND, b"contended"))
        except BaseException as exc:  # noqa: BLE001 - any exception is the failure to report
            errors.append(exc)

    threads = [threading.Thread(target=cancel_it) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == [] and sorted(answers) == [False] * 7 + [True]
    report = _commit(durable_store, claimed)
    assert (report.fired, report.raced) == (0, 1)
    assert get_timer(durable_store, P, KIND, b"contended") is None


@pytest.mark.parametrize("recovery", ["released", "waited out"])
def test_a_name_whose_runner_died_mid_fire_is_cancelled_once_and_never_fires_again(durable_store, recovery):
    """The runner that claimed the first attempt dies before its outcome: the partition's next owner
    either releases its claims (release_claims, which points the identity row at the moved row) or
    waits out the backoff and claims attempt 2. Cancelled by name in between, the timer is gone: the
    cancel is True once, no runner fires it later, and the dead runner's late Done loses its guard."""
    from timerwheel_c.durable.timers.claim import release_claims

    handler = Recording()
    registry = TimerRegistry().register(handler)
    schedule(durable_store, P, DUE, KIND, b"orphan", b"v")
    [dead] = _claim(durable_store, registry)
    if recovery == "released":
        assert release_claims(durable_store, P, DUE + 1) == 1
        assert get_timer(durable_store, P, KIND, b"orphan").due_at_ms == DUE + 1
    else:
        retry_at = keys.parse(dead.timer.key).due_at_ms
        [second] = _claim(durable_store, registry, retry_at)
        assert second.timer.attempt == 2
    assert cancel(durable_store, P, KIND, b"orphan") is True
    assert cancel(durable_store, P, KIND, b"orphan") is False
    assert run_due(durable_store, P, registry, DUE + 3_600_000).fired == 0
    report = _commit(durable_store, [dead])
    assert (report.fired, report.raced) == (0, 1)
    assert durable_store.scan(P, b"", b"\xff").entries == []


def test_a_name_parked_after_its_only_attempt_is_found_replaced_and_cancelled(durable_store):
    """max_attempts=1 and the first attempt fails: the timer is parked, its identity row pointed at
    the parked row. It is found parked, schedule(if_exists="error") replaces it (a parked timer is
    no pending one), and a cancel of the replacement is True once; nothing fires again."""
    handler = Recording(lambda timer: Retry())
    handler.max_attempts = 1
    registry = TimerRegistry().register(handler)
    schedule(durable_store, P, DUE, KIND, b"once", b"v")
    assert run_due(durable_store, P, registry, DUE).failed == 1
    assert get_timer(durable_store, P, KIND, b"once").state == "parked"
    schedule(durable_store, P, DUE + 10, KIND, b"once", b"again", if_exists="error")
    assert get_timer(durable_store, P, KIND, b"once").state == "scheduled"
    assert cancel(durable_store, P, KIND, b"once") is True
    assert cancel(durable_store, P, KIND, b"once") is False
    assert run_due(durable_store, P, registry, DUE + 3_600_000).fired == 0
    assert handler.fired == [(b"once", b"v", 1)] and durable_store.scan(P, b"", b"\xff").entries == []


def test_the_longest_reference_in_flight_is_found_by_name(durable_store):
    """A reference of MAX_REFERENCE_BYTES, whose claimed key is the longest key a store takes, beside
    one a byte shorter that is its prefix: each is found and cancelled as itself while claimed."""
    registry = TimerRegistry().register(Recording())
    longest = b"\xff" * keys.MAX_REFERENCE_BYTES
    for ref in (longest, longest[:-1]):
        schedule(durable_store, P, DUE, KIND, ref)
    claimed = _claim(durable_store, registry)
    assert len(claimed) == 2 and all(c.timer.attempt == 1 for c in claimed)
    assert get_timer(durable_store, P, KIND, longest).reference == longest
    assert cancel(durable_store, P, KIND, longest[:-1]) is True
    assert get_timer(durable_store, P, KIND, longest).state == "retrying"
    report = _commit(durable_store, claimed)
    assert (report.fired, report.raced) == (1, 1)


def test_a_name_cancelled_while_its_handler_hangs_is_not_fired_again(durable_store):
    """The handler of a first attempt blocks (a real runner in a thread) while the name is read,
    cancelled and scheduled anew with if_exists="keep" from the test's thread: the hung attempt is
    found retrying, the cancel is True, the new timer is armed, and the hung attempt's Done, once
    released, loses its guard, so the name fires once more only, as the new timer."""
    entered, release = threading.Event(), threading.Event()

    def hang(timer):
        if timer.value == b"hung":
            entered.set()
            assert release.wait(timeout=120)
        return Done()

    handler = Recording(hang)
    registry = TimerRegistry().register(handler)
    schedule(durable_store, P, DUE, KIND, b"stuck", b"hung")
    reports = []
    runner = threading.Thread(target=lambda: reports.append(run_due(durable_store, P, registry, DUE)))
    runner.start()
    try:
        assert entered.wait(timeout=120)
        assert get_timer(durable_store, P, KIND, b"stuck").state == "retrying"
        assert cancel(durable_store, P, KIND, b"stuck") is True
        schedule(durable_store, P, DUE + 10, KIND, b"stuck", b"new", if_exists="keep")
    finally:
        release.set()
        runner.join(timeout=120)
    assert (reports[0].fired, reports[0].raced) == (0, 1)
    run_due(durable_store, P, registry, DUE + 3_600_000)
    assert handler.fired == [(b"stuck", b"hung", 1), (b"stuck", b"new", 1)]
    assert durable_store.scan(P, b"", b"\xff").entries == []


def test_a_first_attempt_claimed_the_previous_way_is_found_by_name(durable_store):
    """A store whose runner claimed a first attempt before this version pointed the identity row at
    the claimed row: writers of this version find it there as well, and its outcome, committed by a
    runner of this version, removes both rows."""
    registry = TimerRegistry().register(Recording())
    schedule(durable_store, P, DUE, KIND, b"old-way", b"v")
    [claimed] = _claim(durable_store, registry)
    durable_store.apply(P, Batch().put(keys.identity(KIND, b"old-way"), claimed.timer.key))  # the old claim's write
    assert get_timer(durable_store, P, KIND, b"old-way").state == "retrying"
    report = _commit(durable_store, [claimed])
    assert (report.fired, report.raced) == (1, 0)
    assert durable_store.scan(P, b"", b"\xff").entries == []
    schedule(durable_store, P, DUE, KIND, b"old-way", b"v")
    [claimed] = _claim(durable_store, registry)
    durable_store.apply(P, Batch().put(keys.identity(KIND, b"old-way"), claimed.timer.key))
    assert cancel(durable_store, P, KIND, b"old-way") is True
    assert _commit(durable_store, [claimed]).raced == 1
    assert durable_store.scan(P, b"", b"\xff").entries == []

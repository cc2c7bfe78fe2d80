"""A claim of plain timers' first attempts, the rows a runner meets most: worked out once per kind and
claim, not once per row, and each row claimed exactly as the general look at a row
(``Claimer._choose``, which parses its key) claims it."""
from __future__ import annotations

import collections
import sys

from timerwheel_c.durable.storage.store import Batch, Equals
from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.claim import Claimer
from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerRegistry
from timerwheel_c.durable.timers.tick import Backoff, TickBudget

_NOW_MS = 1_700_000_000_000
_A, _B = keys.TimerKind(1), keys.TimerKind(2)
_BUDGET = TickBudget(1000, 1000, 1000, 60_000)


class _Noop(TimerHandler):
    def __init__(self, kind, backoff=None):
        self.kind = kind
        self.backoff = backoff

    def fire(self, ctx, timer):
        return Done()


def _write_due(store, kinds: list, n: int) -> None:
    batch = Batch()
    for kind in kinds:
        for i in range(n):
            batch.put(keys.timer(_NOW_MS - 1000 + i, kind, b"ref%d-%04d" % (kind, i)), b"v%d" % i)
    store.apply("p", batch)


def _claimer_calls(fn) -> tuple:
    """``(fn()'s result, how often each Claimer method was entered meanwhile, by name)``."""
    counts: collections.Counter = collections.Counter()

    def hook(frame, event, arg):
        if event == "call" and isinstance(frame.f_locals.get("self"), Claimer):
            counts[frame.f_code.co_name] += 1

    sys.setprofile(hook)
    try:
        return fn(), counts
    finally:
        sys.setprofile(None)


def test_a_claim_works_out_each_kinds_first_claim_once(store):
    """16 first attempts of two kinds: the claim asks how to claim a first attempt of each kind once
    (its handler, its lease, its cap), and looks at no row one by one. Deterministic: it counts calls,
    no timing; it first checks that every row was chosen to fire."""
    _write_due(store, [_A, _B], 8)
    claimer = Claimer(store, "p", TimerRegistry().register(_Noop(_A)).register(_Noop(_B)), _NOW_MS, _BUDGET)
    (rows, batches), called = _claimer_calls(lambda: claimer.select(16))
    assert len(rows) == len(batches) == 16
    assert called["_first"] == 2 and called["_lease_ms"] == 2
    assert called["_choose"] == 0


def test_a_first_claim_is_what_the_row_by_row_look_gives(store):
    """Each row the claim chooses at once, its batch (guard and writes) and the timer its handler gets,
    equals what ``Claimer._choose`` makes of the same row in a claim at the same time: the same claimed
    key (attempt 1, due a lease after now), original due time, value and kind. Deterministic."""
    _write_due(store, [_A], 8)
    registry = TimerRegistry().register(_Noop(_A))
    rows, _ = Claimer(store, "p", registry, _NOW_MS, _BUDGET).select(8)
    looked = Claimer(store, "p", registry, _NOW_MS, _BUDGET)
    assert len(rows) == 8
    for row in rows:
        one = looked._choose(row.key, row.value)
        assert (row.guards, row.writes, row.key, row.handler, row.schedule) == (
            one.guards, one.writes, one.key, one.handler, one.schedule)
        fields = ("due_at_ms", "reference", "value", "attempt", "claimed_key")
        assert [getattr(row, f) for f in fields] == [getattr(one, f) for f in fields] and row.kind is one.kind
        assert row.guards == [Equals(row.key, row.value)]


def test_a_kind_with_a_jittered_backoff_claims_each_row_for_its_whole_first_delay(store):
    """A handler's own Backoff with jitter: the jitter shortens retries, never a claim's lease, so every
    row is claimed for the whole first delay (10 s), worked out once per claim as for the default
    backoff. Each row's lease was drawn with the jitter (5 to 10 s here), and one drawn near its
    jitter's whole fraction let another runner start a call just begun."""
    _write_due(store, [_A], 8)
    backoff = Backoff(base_s=10.0, jitter=0.5)
    claimer = Claimer(store, "p", TimerRegistry().register(_Noop(_A, backoff)), _NOW_MS, _BUDGET)
    (rows, _), called = _claimer_calls(lambda: claimer.select(8))
    assert len(rows) == 8 and called["_first"] == 1 and called["_lease_ms"] == 1
    assert {keys.parse(row.claimed_key).due_at_ms for row in rows} == {_NOW_MS + 10_000}

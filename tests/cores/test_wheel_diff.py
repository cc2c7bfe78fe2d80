"""Differential property test: C core, pure twin and a sorted-list reference model agree.

Random programs of schedule, cancel, reschedule and advance (tiny and huge gaps; delays around 0,
511, 512, 513, multiples of 512 and very long ones; re-arms that move a timer later, which the wheel
defers, then earlier again, cancels of deferred timers, advances across their old slots) run on the
reference model and on each core; fired tokens, cancel/reschedule results, counts and next_fire_ms
bounds must match, and the C core and the pure twin must also issue identical ids and fire in the
identical order. Hypothesis shrinks any counterexample.

The fire order the model checks: each advance fires exactly the model's timers, in non-decreasing
due time; among timers due at the same ms, those whose last arming did not move them later fire in
arming order (a timer re-armed later, which the wheel defers, fires among them in the order it was
re-filed).
"""
from __future__ import annotations

import importlib
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MAX_DUE_MS = 2**62


class ReferenceWheel:
    """The specification as a sorted list: fire by (due, arming sequence), one ms at a time in effect.

    ``later`` marks a timer whose last re-arm did not move it earlier: the wheel may defer it, so
    its place among the timers of its due ms is free (see ``check_fired``).
    """

    def __init__(self, now_ms):
        self.now = now_ms
        self.seq = 0
        self.pending = {}  # handle -> [due, seq, token, later]

    def schedule(self, handle, after_ms, token):
        self.seq += 1
        self.pending[handle] = [self.now + max(after_ms, 1), self.seq, token, False]

    def cancel(self, handle):
        return self.pending.pop(handle, None) is not None

    def reschedule(self, handle, after_ms):
        if handle not in self.pending:
            return False
        self.seq += 1
        due = self.now + max(after_ms, 1)
        self.pending[handle] = [due, self.seq, self.pending[handle][2], due >= self.pending[handle][0]]
        return True

    def advance(self, now_ms):
        """The fired timers as (due, token, later) in (due, arming sequence) order."""
        due = sorted((v[0], v[1], h) for h, v in self.pending.items() if v[0] <= now_ms)
        self.now = now_ms
        return [(d, *self.pending.pop(h)[2:]) for d, _, h in due]

    def earliest(self):
        return min((v[0] for v in self.pending.values()), default=None)

    def due_of(self, handle):
        return self.pending[handle][0] if handle in self.pending else None


def check_fired(fired, expected):
    """``fired`` (the wheel's tokens) is a valid fire order of ``expected`` (the model's): the same
    timers, due ms by due ms, and within one due ms the timers not re-armed later in arming order."""
    assert Counter(fired) == Counter(token for _, token, _ in expected)
    start = 0
    for due in sorted({d for d, _, _ in expected}):
        group = [(token, later) for d, token, later in expected if d == due]
        chunk = iter(fired[start:start + len(group)])
        assert Counter(fired[start:start + len(group)]) == Counter(token for token, _ in group), due
        # The tokens in arming order form a subsequence of the chunk (``in`` consumes the iterator).
        assert all(token in chunk for token, later in group if not later), due
        start += len(group)


_delays = st.one_of(
    st.sampled_from([-7, 0, 1, 2, 511, 512, 513, 1023, 1024, 1025, 32767, 32768, 32769, 30_000]),
    st.integers(1, 8).map(lambda k: 512 * k),
    st.integers(-3, 3).map(lambda d: 512 * 64 * 64 + d),
    st.integers(-10, 100_000),
    st.integers(0, 2**48),
    st.integers(2**58, 2**61),
)
_gaps = st.one_of(
    st.integers(0, 3),
    st.sampled_from([511, 512, 513, 1800, 32768]),
    st.integers(0, 70_000),
    st.integers(0, 2**50),
)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("schedule"), _delays, st.integers(0, 2**64 - 1)),
        st.tuples(st.just("cancel"), st.integers(0, 63)),
        st.tuples(st.just("reschedule"), st.integers(0, 63), _delays),
        # Moved later (deferred while at a level >= 1) or earlier than the timer's due time, by ms.
        st.tuples(st.just("later"), st.integers(0, 63), st.one_of(st.integers(0, 600), st.integers(0, 2**40))),
        st.tuples(st.just("earlier"), st.integers(0, 63), st.one_of(st.integers(1, 600), st.integers(1, 2**40))),
        st.tuples(st.just("advance"), _gaps),
        st.tuples(st.just("advance_array"), _gaps),
        st.tuples(st.just("schedule_many"), st.lists(st.tuples(_delays, st.integers(0, 2**64 - 1)), max_size=8)),
        st.tuples(st.just("cancel_many"), st.lists(st.integers(0, 63), max_size=8)),
    ),
    max_size=120,
)


def _run(mod, start, ops):
    """Play ``ops`` on ``mod.TimerWheel`` and the reference model; return the core's trace."""
    tw = mod.TimerWheel(now_ms=start)
    ref = ReferenceWheel(start)
    ids = []  # handle -> id, in issue order
    trace = []
    for op in ops:
        if op[0] == "schedule":
            _, after, token = op
            if tw.now_ms() + max(after, 1) > MAX_DUE_MS:
                continue
            ref.schedule(len(ids), after, token)
            ids.append(tw.schedule(after, token))
            trace.append(ids[-1])
        elif op[0] == "cancel":
            if not ids:
                continue
            h = op[1] % len(ids)
            got = tw.cancel(ids[h])
            assert got == ref.cancel(h)
            trace.append(got)
        elif op[0] in ("reschedule", "later", "earlier"):
            if not ids:
                continue
            h = op[1] % len(ids)
            after = op[2]
            if op[0] != "reschedule":
                due = ref.due_of(h)
                if due is None:
                    continue
                after = due - tw.now_ms() + (after if op[0] == "later" else -after)
            if tw.now_ms() + max(after, 1) > MAX_DUE_MS:
                continue
            got = tw.reschedule(ids[h], after)
            assert got == ref.reschedule(h, after)
            trace.append(got)
        elif op[0] == "schedule_many":
            batch = [(d, t) for d, t in op[1] if tw.now_ms() + max(d, 1) <= MAX_DUE_MS]
            got = tw.schedule_many(
                np.array([d for d, _ in batch], dtype=np.int64), np.array([t for _, t in batch], dtype=np.uint64)
            )
            assert got.dtype == np.uint64 and len(got) == len(batch)
            for (d, t), tid in zip(batch, got.tolist()):
                ref.schedule(len(ids), d, t)
                ids.append(tid)
            trace.append(got.tolist())
        elif op[0] == "cancel_many":
            if not ids:
                continue
            handles = [h % len(ids) for h in op[1]]
            got = tw.cancel_many(np.array([ids[h] for h in handles], dtype=np.uint64))
            assert got == sum(ref.cancel(h) for h in handles)
            trace.append(got)
        else:
            now = min(tw.now_ms() + op[1], MAX_DUE_MS)
            fired = tw.advance(now) if op[0] == "advance" else tw.advance_array(now).tolist()
            check_fired(fired, ref.advance(now))
            trace.append(fired)
        assert len(tw) == tw.active_count() == len(ref.pending)
        hint = tw.next_fire_ms()
        earliest = ref.earliest()
        if earliest is None:
            assert hint == tw.now_ms() + 2**32
        else:
            # Never later than the earliest due time; exact for one timer not re-armed later.
            assert tw.now_ms() < hint <= earliest
            if len(ref.pending) == 1 and not next(iter(ref.pending.values()))[3]:
                assert hint == earliest
    trace.append(tw.advance(MAX_DUE_MS))
    check_fired(trace[-1], ref.advance(MAX_DUE_MS))
    return trace


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(start=st.one_of(st.integers(0, 2000), st.integers(0, 2**40)), ops=_ops)
def test_differential_against_reference(wheel_impl, start, ops):
    """Each core matches the reference model on every observable; cannot flake: virtual time only."""
    _run(wheel_impl, start, ops)


@pytest.mark.c_extension
@settings(max_examples=300, deadline=None)
@given(start=st.integers(0, 2**40), ops=_ops)
def test_c_and_pure_issue_identical_ids(start, ops):
    """The C core and the pure twin give identical traces, ids included (same allocation order)."""
    c = importlib.import_module("timerwheel_c._wheel")
    pure = importlib.import_module("timerwheel_c.pure.wheel")
    assert _run(c, start, ops) == _run(pure, start, ops)


def _cascade_starts(t0, t1):
    """How many level >= 1 slot starts lie in (t0, t1] ms: the most cascades advancing over it makes."""
    starts = 0
    for level in range(1, 10):
        width = 1 << (6 * level + 3)
        starts += t1 // width - t0 // width
    return starts


_rearm_ops = st.lists(
    st.one_of(
        st.tuples(st.just("schedule"), st.one_of(st.integers(1, 600), st.integers(1, 100_000))),
        st.tuples(st.just("later"), st.integers(0, 63), st.integers(0, 100_000)),
        st.tuples(st.just("earlier"), st.integers(0, 63), st.integers(1, 100_000)),
        st.tuples(st.just("cancel"), st.integers(0, 63)),
        st.tuples(st.just("wake"), st.integers(0, 3)),
    ),
    max_size=150,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=_rearm_ops)
def test_waking_at_next_fire_ms_fires_or_cascades_despite_deferred_rearms(wheel_impl, ops):
    """A reactor that sleeps until next_fire_ms() and advances there is never late and wakes
    pointlessly at most once per level >= 1 slot it crosses: a deferred re-arm leaves a lower bound
    in its old slot, and the wake-up at it cascades that slot (about 2 per second at most).

    ``wake`` ops advance to next_fire_ms() as such a loop would; at the end the loop runs dry. Each
    wake-up fires exactly the model's due timers; one that fires nothing must have cascaded a slot,
    so their count is bounded by the slot starts crossed. Cannot flake: virtual time only.
    """
    tw = wheel_impl.TimerWheel(now_ms=0)
    ref = ReferenceWheel(0)
    ids = []
    empty = 0
    start = tw.now_ms()

    def wake():
        nonlocal empty
        hint = tw.next_fire_ms()
        earliest = ref.earliest()
        assert earliest is None or tw.now_ms() < hint <= earliest
        fired = tw.advance(hint)
        check_fired(fired, ref.advance(hint))
        empty += not fired

    for op in ops:
        if op[0] == "schedule":
            ref.schedule(len(ids), op[1], len(ids))
            ids.append(tw.schedule(op[1], len(ids)))
        elif op[0] == "cancel" and ids:
            h = op[1] % len(ids)
            assert tw.cancel(ids[h]) == ref.cancel(h)
        elif op[0] in ("later", "earlier") and ids:
            h = op[1] % len(ids)
            due = ref.due_of(h)
            if due is not None:
                after = due - tw.now_ms() + (op[2] if op[0] == "later" else -op[2])
                assert tw.reschedule(ids[h], after) == ref.reschedule(h, after)
        elif op[0] == "wake":
            for _ in range(op[1]):
                if len(tw):
                    wake()
    while len(tw):
        wake()
    assert not ref.pending
    assert empty <= _cascade_starts(start, tw.now_ms())

"""Differential property test: C core, pure twin and a sorted-list reference model agree.

Random programs of schedule, cancel, reschedule and advance (tiny and huge gaps; delays around 0,
511, 512, 513, multiples of 512 and very long ones) run on the reference model and on each core;
fired tokens, cancel/reschedule results, counts and next_fire_ms bounds must match, and the C core
and the pure twin must also issue identical ids. Hypothesis shrinks any counterexample.
"""
from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MAX_DUE_MS = 2**62


class ReferenceWheel:
    """The specification as a sorted list: fire by (due, arming sequence), one ms at a time in effect."""

    def __init__(self, now_ms):
        self.now = now_ms
        self.seq = 0
        self.pending = {}  # handle -> [due, seq, token]

    def schedule(self, handle, after_ms, token):
        self.seq += 1
        self.pending[handle] = [self.now + max(after_ms, 1), self.seq, token]

    def cancel(self, handle):
        return self.pending.pop(handle, None) is not None

    def reschedule(self, handle, after_ms):
        if handle not in self.pending:
            return False
        self.seq += 1
        self.pending[handle][:2] = [self.now + max(after_ms, 1), self.seq]
        return True

    def advance(self, now_ms):
        due = sorted((v[0], v[1], h) for h, v in self.pending.items() if v[0] <= now_ms)
        self.now = now_ms
        return [self.pending.pop(h)[2] for _, _, h in due]

    def earliest(self):
        return min((v[0] for v in self.pending.values()), default=None)


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
        elif op[0] == "reschedule":
            if not ids or tw.now_ms() + max(op[2], 1) > MAX_DUE_MS:
                continue
            h = op[1] % len(ids)
            got = tw.reschedule(ids[h], op[2])
            assert got == ref.reschedule(h, op[2])
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
            assert fired == ref.advance(now)
            trace.append(fired)
        assert len(tw) == tw.active_count() == len(ref.pending)
        hint = tw.next_fire_ms()
        earliest = ref.earliest()
        if earliest is None:
            assert hint == tw.now_ms() + 2**32
        else:
            assert tw.now_ms() < hint <= earliest
            if len(ref.pending) == 1:
                assert hint == earliest
    trace.append(tw.advance(MAX_DUE_MS))
    assert trace[-1] == ref.advance(MAX_DUE_MS)
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

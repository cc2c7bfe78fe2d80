"""Differential test: the compiled scheduler and its pure twin, driven by one random script on a
hand-cranked loop, run the same callbacks at the same loop times in the same order, never before
their deadlines, also when re-arms to later times are deferred in the wheels' overflow slots.

The loop here is a minimal stand-in that the schedulers use through its public methods only
(``time``, ``call_at``, ``call_exception_handler``); it keeps its clock still until the test moves
it, so both runs see identical times and the comparison is exact, not timing-dependent.
"""
from __future__ import annotations

import heapq
import importlib
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.c_extension


class _CrankedLoop:
    """Time stands still until ``crank_to``, which runs every due ``call_at`` callback in order."""

    def __init__(self):
        self.now = 1000.0
        self._timers = []
        self._seq = itertools.count()
        self.errors = []

    def time(self):
        return self.now

    def call_at(self, when, callback, *args):
        entry = [when, next(self._seq), callback, args]
        heapq.heappush(self._timers, entry)
        return _Cancel(entry)

    def call_exception_handler(self, context):
        self.errors.append(type(context["exception"]).__name__)

    def crank_to(self, when):
        while self._timers and self._timers[0][0] <= when:
            at, _, callback, args = heapq.heappop(self._timers)
            if callback is not None:
                self.now = max(self.now, at)
                callback(*args)
        self.now = max(self.now, when)


class _Cancel:
    def __init__(self, entry):
        self._entry = entry

    def cancel(self):
        self._entry[2] = None


# Short delays stay on level 0; those over 512 ms wait in an overflow slot, where a re-arm to a
# later time is deferred until the wheel reaches that slot.
_delay = st.one_of(st.floats(-0.002, 0.05), st.sampled_from([0.0, 0.001, 0.0015, 0.0305]),
                   st.floats(0.5, 3.0), st.sampled_from([0.6, 1.2, 40.0]))
_ops = st.lists(st.one_of(
    st.tuples(st.just("call"), _delay, st.sampled_from(["none", "cancel", "resched", "arm", "close"]),
              st.integers(0, 15), _delay),
    st.tuples(st.just("cancel"), st.integers(0, 15)),
    st.tuples(st.just("resched"), st.integers(0, 15), _delay),
    st.tuples(st.just("arm"), st.integers(-3, 12), _delay),
    st.tuples(st.just("kcancel"), st.integers(-3, 12)),
    st.tuples(st.just("crank"), st.one_of(st.floats(0.0, 0.02), st.floats(0.3, 2.0))),
), max_size=60)


def _play(module_name, ops):
    """Run ``ops`` on a fresh scheduler from ``module_name``; returns what it observably did."""
    aio = importlib.import_module(module_name)
    loop = _CrankedLoop()
    sched = aio.WheelScheduler(loop)
    log, handles = [], []
    def act(name, action, target, delay):
        log.append((name, loop.now))
        if name.startswith("h"):  # never early: a handle runs at or after its deadline
            assert handles[int(name[1:])].when() <= loop.now
        if action == "cancel" and target < len(handles):
            handles[target].cancel()
        elif action == "resched" and target < len(handles):
            log.append(("resched", handles[target].reschedule(delay)))
        elif action == "arm":
            keys.arm(target, delay)
        elif action == "close":
            sched.close()
    keys = sched.keyed(lambda key: act(f"key{key}", "resched", key, 0.003))
    for op in ops:
        try:
            if op[0] == "call":
                _, delay, action, target, delay2 = op
                handles.append(sched.call_later(delay, act, f"h{len(handles)}", action, target, delay2))
            elif op[0] == "cancel" and op[1] < len(handles):
                handles[op[1]].cancel()
            elif op[0] == "resched" and op[1] < len(handles):
                log.append(("resched", handles[op[1]].reschedule(op[2])))
            elif op[0] == "arm":
                keys.arm(op[1], op[2])
            elif op[0] == "kcancel":
                log.append(("kcancel", keys.cancel(op[1])))
            elif op[0] == "crank":
                loop.crank_to(loop.now + op[1])
        except RuntimeError as exc:
            log.append(("error", str(exc)))
        log.append((sched.active_count(), len(keys), [h.cancelled() for h in handles],
                    [h.when() for h in handles], [keys.when(k) for k in range(-3, 13)]))
    loop.crank_to(loop.now + 60.0)
    return log, loop.errors


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops)
def test_compiled_and_pure_schedulers_agree(ops):
    """Same script, same observable run: which callbacks ran, at which loop time, in which order,
    what every call returned, and every handle's and key's state after every step."""
    assert _play("timerwheel_c._aio", ops) == _play("timerwheel_c.pure.aio", ops)

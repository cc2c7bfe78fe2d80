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
import math

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

    def call_soon(self, callback, *args):
        return self.call_at(-math.inf, callback, *args)  # first, at the next crank

    def call_exception_handler(self, context):
        self.errors.append(type(context["exception"]).__name__)

    def crank_to(self, when):
        while self._timers and self._timers[0][0] <= when:
            at, _, callback, args = heapq.heappop(self._timers)
            if callback is not None:
                self.now = max(self.now, at)
                callback(*args)
        self.now = max(self.now, when)

    def jump_to(self, when):
        """A late loop: the clock is at ``when`` before any due callback runs."""
        self.now = max(self.now, when)
        self.crank_to(self.now)


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
    # The loop's clock stepped back (a patched or virtual clock), below 0 too: the wheels follow it.
    st.tuples(st.just("back"), st.one_of(st.floats(0.0, 0.02), st.floats(0.3, 2.0), st.just(1500.0))),
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
            elif op[0] == "back":
                loop.now -= op[1]
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


# Re-arms to later deadlines are only recorded (the wheel entry stays, due earlier, and is re-filed
# when it fires); the timers start at every level: 1 ms, level 0, levels 1, 2 and 3.
_start_s = st.sampled_from([0.001, 0.02, 0.3, 0.6, 5.0, 40.0, 3000.0])
_lazy_ops = st.lists(st.one_of(
    st.tuples(st.just("later"), st.integers(0, 5), st.one_of(st.floats(0.0, 0.05), st.floats(0.5, 60.0))),
    st.tuples(st.just("earlier"), st.integers(0, 5), st.floats(0.0, 0.05)),
    st.tuples(st.just("beyond"), st.integers(0, 5)),
    st.tuples(st.just("cancel"), st.integers(0, 5)),
    st.tuples(st.just("crank"), st.one_of(st.floats(0.0, 0.02), st.floats(0.3, 50.0))),
    st.tuples(st.just("jump"), st.one_of(st.floats(0.0, 0.02), st.floats(0.3, 50.0))),
), max_size=50)


def _play_lazy(module_name, starts, ops):
    """Six handles and six keys armed at ``starts``, then moved by ``ops``; every run is checked
    against a model: never before its deadline, never twice, never after the first wake-up at its
    due time (unless the loop itself was late: a jump), and in due order. Returns the run's log."""
    aio = importlib.import_module(module_name)
    loop = _CrankedLoop()
    sched = aio.WheelScheduler(loop)
    slack_s = sched.clock_slack_s
    armed = {}  # ("h", i) or ("k", i) -> its deadline while armed
    late_until = [loop.now]  # the loop time up to which a jump made the loop late
    log, last_run = [], {}

    def ran(name):
        deadline = armed.pop(name)  # KeyError: ran twice, or after its cancel
        assert deadline <= loop.now, (name, deadline, loop.now)  # never early
        # never late: at the first wake-up at its due ms, unless the loop itself was late
        assert loop.now <= deadline + slack_s + 0.002 or loop.now <= late_until[0], (name, deadline)
        # due order among the handles and among the keys (a late batch runs the handles first),
        # ties only within one ms
        if name[0] in last_run:
            assert deadline >= last_run[name[0]] - 0.001 - 1e-9, (name, deadline, last_run)
        last_run[name[0]] = deadline
        log.append((name, loop.now))

    handles = [sched.call_later(start, ran, ("h", i)) for i, start in enumerate(starts)]
    keys = sched.keyed(lambda key: ran(("k", key)))
    for i, start in enumerate(starts):
        keys.arm(i, start)
    for i in range(len(starts)):
        armed[("h", i)] = handles[i].when()
        armed[("k", i)] = keys.when(i)
    for op, *args in ops:
        if op in ("later", "earlier"):
            i, delay = args
            if ("h", i) in armed and handles[i].when() - loop.now != delay:
                moved = max(0.0, handles[i].when() - loop.now + (delay if op == "later" else -delay))
                assert handles[i].reschedule(moved) is True
                armed[("h", i)] = handles[i].when()
                keys.arm(i, moved)
                armed[("k", i)] = keys.when(i)
        elif op == "beyond" and ("h", args[0]) in armed:  # a deadline beyond the range changes nothing
            i, = args
            before = handles[i].when(), keys.when(i)
            with pytest.raises(ValueError):
                handles[i].reschedule(2.0**62)
            with pytest.raises(ValueError):
                keys.arm(i, 2.0**62)
            assert (handles[i].when(), keys.when(i)) == before
        elif op == "cancel":
            i, = args
            handles[i].cancel()
            armed.pop(("h", i), None)
            log.append(("kcancel", keys.cancel(i)))
            armed.pop(("k", i), None)
        elif op in ("crank", "jump"):
            delay, = args
            if op == "jump":
                late_until[0] = loop.now + delay
                loop.jump_to(loop.now + delay)
            else:
                loop.crank_to(loop.now + delay)
        log.append((sched.active_count(), len(keys), [h.when() for h in handles],
                    [keys.when(k) for k in range(len(starts))]))
    loop.crank_to(loop.now + 4000.0)
    assert not loop.errors  # a model check that failed inside a callback went to the loop's handler
    assert not armed, armed  # never lost: every armed timer ran
    assert sched.active_count() == 0 and len(keys) == 0
    return log, loop.errors


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(starts=st.lists(_start_s, min_size=6, max_size=6), ops=_lazy_ops)
def test_rearm_later_is_recorded_and_refiled_never_early_twice_lost_or_out_of_order(starts, ops):
    """A re-arm to a later deadline only records it; the timer's earlier wheel entry is re-filed
    when it fires. Moved later many times, moved earlier after such moves, cancelled while its
    entry waits, at every wheel level, refused beyond the wheel's range, on a loop that keeps time
    and on one that wakes late: each twin runs every timer once, at its first wake-up at or after
    its deadline, in due order, and both twins agree. Deterministic: the loop's clock moves only
    when the script moves it."""
    assert _play_lazy("timerwheel_c._aio", starts, ops) == _play_lazy("timerwheel_c.pure.aio", starts, ops)


def test_rearm_later_leaves_the_wheel_entry_and_earlier_moves_it():
    """A re-arm to a later deadline writes the deadline alone: the wheel entry keeps its due ms
    (the one cache line a re-arm at random over many timers must miss is the handle's or the key
    slot's, not the entry's too); a re-arm to an earlier deadline moves the entry at once. Seen
    through the pure twin, whose wheel is a plain attribute; the property test above checks that
    the compiled twin runs the same."""
    from timerwheel_c.pure import aio

    loop = _CrankedLoop()
    sched = aio.WheelScheduler(loop)
    handle = sched.call_later(5.0, lambda: None)
    keys = sched.keyed(lambda key: None)
    keys.arm(7, 5.0)
    wheel, key_wheel = sched._wheel, keys._wheel
    filed = wheel.due_ms(handle._timer_id), key_wheel.due_ms(keys._entries[7][0])
    assert handle.reschedule(9.0) and keys.arm(7, 9.0) is None
    assert handle.when() == keys.when(7) == loop.now + 9.0
    assert (wheel.due_ms(handle._timer_id), key_wheel.due_ms(keys._entries[7][0])) == filed
    assert handle.reschedule(1.0) and keys.arm(7, 1.0) is None
    assert wheel.due_ms(handle._timer_id) < filed[0] and key_wheel.due_ms(keys._entries[7][0]) < filed[1]

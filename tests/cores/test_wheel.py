"""TimerWheel behaviour against both cores: schedule, advance, fire order, cancel, reschedule,
counts, next_fire_ms, range checks, memory, the batch calls, and Python code (a foreign
``__index__``, the garbage collector) running inside a call.

All times are integer ms on a virtual clock the test drives, so no test depends on the machine's speed.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

MAX_DUE_MS = 2**62


def test_schedule_clamps_delay_and_returns_positive_id(wheel_impl):
    """schedule: due at now + after_ms, after_ms <= 0 clamped to 1 (next tick, never the current one),
    any token in [0, 2**64), positive int ids. Pure virtual time: deterministic."""
    tw = wheel_impl.TimerWheel(now_ms=1000)
    ids = [tw.schedule(0, 0), tw.schedule(-5, 2**64 - 1), tw.schedule(-(10**30), 7), tw.schedule(3, 9)]
    assert all(type(i) is int and i > 0 for i in ids)
    assert len(set(ids)) == 4
    assert tw.advance(1000) == []
    assert tw.advance(1001) == [0, 2**64 - 1, 7]
    assert tw.advance(1002) == []
    assert tw.advance(1003) == [9]


def test_schedule_at_a_due_time_at_or_before_now_is_due_now(wheel_impl):
    """schedule_at: a due time at or before now_ms() (any int below it too) is due now, fired by
    the next advance, advance(now_ms()) included, before the timers of later ms, in arming order;
    a later due time fires at its ms, never before. Pure virtual time: deterministic."""
    tw = wheel_impl.TimerWheel(now_ms=1000)
    assert tw.advance(1000) == []  # nothing due now: still a no-op
    tw.schedule_at(1002, 5)
    tw.schedule_at(1000, 1)
    tw.schedule_at(-(10**30), 2)
    tw.schedule(0, 9)  # a delay of 0 stays the next tick
    tw.schedule_at(999, 3)
    assert tw.due_ms(tw.schedule_at(1001, 4)) == 1001
    assert tw.poll_timeout() == 0 and tw.next_fire_ms() == 1000
    assert tw.advance(1000) == [1, 2, 3]
    assert tw.advance(1000) == []
    assert tw.advance(1001) == [9, 4]
    assert tw.advance(1001) == []
    tw.schedule_at(1001, 6)
    assert list(tw.advance_array(1002)) == [6, 5]
    far = 3 * 3600 * 1000  # an overflow level
    tw.schedule_at(far, 7)
    assert tw.advance(far - 1) == [] and tw.advance(far) == [7]


def test_schedule_at_refuses_bad_due_times_by_name(wheel_impl):
    """schedule_at: a due time beyond 2**62 ms, a non-int due time or a bad token raises naming
    the value; the wheel is unchanged."""
    tw = wheel_impl.TimerWheel(now_ms=0)
    with pytest.raises(ValueError, match=r"due_ms 4611686018427387905 is beyond 2\*\*62"):
        tw.schedule_at(MAX_DUE_MS + 1, 1)
    with pytest.raises(ValueError, match=r"beyond 2\*\*62"):
        tw.schedule_at(10**30, 1)
    with pytest.raises(TypeError, match="due_ms"):
        tw.schedule_at(1.5, 1)
    with pytest.raises(ValueError, match="token -1"):
        tw.schedule_at(5, -1)
    with pytest.raises(TypeError, match="schedule_at"):
        tw.schedule_at(5)
    assert tw.active_count() == 0
    assert tw.due_ms(tw.schedule_at(MAX_DUE_MS, 1)) == MAX_DUE_MS


def test_advance_fires_each_due_timer_once_and_never_early(wheel_impl):
    """advance: every timer fires exactly once, at the first advance at or after its due time, and
    never before; covers slot wrap, exact multiples of 512, multi-rotation delays, many rotations
    and coarse 1800 ms steps. Deterministic: every (delay, step) pair is enumerated."""
    delays = [1, 2, 510, 511, 512, 513, 1023, 1024, 1025, 1536, 4096, 32767, 32768, 32769,
              100_000, 30_000, 262_144, 2_097_151, 2_097_152, 5 * 3600 * 1000]
    for start in (0, 511, 512, 777, 32767):
        for step in (1, 7, 512, 1800):
            tw = wheel_impl.TimerWheel(now_ms=start)
            due_of = {}
            for k, d in enumerate(delays):
                tw.schedule(d, k)
                due_of[k] = start + d
            fired_at = {}
            now = start
            horizon = start + max(delays)
            # Walk step by step near the start, then jump close to each due time, then step again.
            checkpoints = sorted({t for d in due_of.values() for t in (d - 2 * step, d - 1, d, d + step)})
            for target in checkpoints:
                if target <= now:
                    continue
                while now < target:
                    now = min(now + step, target) if target - now < 50 * step else target
                    for k in tw.advance(now):
                        assert k not in fired_at, "fired twice"
                        fired_at[k] = now
            assert now >= horizon
            for k, due in due_of.items():
                assert k in fired_at, f"timer {k} never fired"
                assert fired_at[k] >= due, f"timer {k} due {due} fired early at {fired_at[k]}"
            assert len(tw) == 0


def test_advance_fires_at_exact_tick_when_stepping_by_one(wheel_impl):
    """With 1 ms steps a timer fires exactly on its due tick, across a wrap and a rotation multiple."""
    tw = wheel_impl.TimerWheel(now_ms=500)
    expect = {}
    for d in (11, 12, 512, 1024, 1500):
        tw.schedule(d, d)
        expect[d] = 500 + d
    seen = {}
    for now in range(501, 2100):
        for tok in tw.advance(now):
            seen[tok] = now
    assert seen == expect


def test_fire_order_by_due_then_arming_order(wheel_impl):
    """Within one call tokens come out by non-decreasing due time, ties in arming order
    (schedule or reschedule call order; a reschedule to a later time may keep the timer's place),
    including overflow levels and a long jump."""
    tw = wheel_impl.TimerWheel(now_ms=3)
    # One due time armed from three levels (far, nearer, level 0) cascades into one arming order.
    for k, (at, after) in enumerate([(3, 100_000), (60_000, 40_003), (99_990, 13)]):
        tw.advance(at)
        tw.schedule(after, k)
    tw.schedule(40_000, 9)
    assert tw.advance(100_003) == [0, 1, 2]
    assert tw.advance(10**6) == [9]
    tw = wheel_impl.TimerWheel(now_ms=3)
    # The same with re-arms: a reschedule moves a timer behind those armed before it.
    a = tw.schedule(100_000, 1)             # due 100_003, armed first, sits on a high level
    tw.advance(60_000)
    b = tw.schedule(40_003, 2)              # due 100_003, armed second, lower level
    tw.advance(99_990)
    tw.schedule(13, 3)                      # due 100_003, armed third, level 0
    tw.schedule(12, 4)                      # due 100_002
    tw.schedule(5_000_000, 5)               # far overflow
    tw.schedule(14, 6)
    assert tw.reschedule(a, 13)             # re-armed: now after 3
    assert tw.reschedule(b, 13)
    fired = tw.advance(10**12)
    assert fired == [4, 3, 1, 2, 6, 5]


def test_long_gap_cost_follows_timers_not_gap(wheel_impl):
    """Advancing 10**12 ms over 1000 timers completes (a tick-by-tick walk would never finish) and
    fires all of them in due order. The liveness bound of 30 s is generous on any loaded machine;
    the speed itself is measured in the benchmark, not asserted here."""
    tw = wheel_impl.TimerWheel(now_ms=0)
    dues = [(k * 7_919_993_311) % 10**12 + 1 for k in range(1000)]
    for k, due in enumerate(dues):
        tw.schedule(due, k)
    t0 = time.perf_counter()
    fired = tw.advance(10**12)
    assert time.perf_counter() - t0 < 30
    assert len(fired) == 1000
    assert [dues[k] for k in fired] == sorted(dues)


def test_cancel_true_once_and_stale_ids_never_cancel_later_timers(wheel_impl):
    """cancel is True exactly once for a pending timer; False after fire, after cancel, for ids never
    issued and any other int; a stale id never cancels a later timer reusing its entry."""
    tw = wheel_impl.TimerWheel(now_ms=0)
    t1 = tw.schedule(10, 1)
    assert tw.cancel(t1) is True
    assert tw.cancel(t1) is False
    t2 = tw.schedule(5, 2)                  # reuses t1's entry
    assert t2 != t1
    assert tw.cancel(t1) is False
    assert len(tw) == 1
    assert tw.advance(5) == [2]
    assert tw.cancel(t2) is False
    for bogus in (0, -1, 1, 2**32, 2**63, 2**64 - 1, 2**64, 2**200, -(2**200), np.int64(5)):
        assert tw.cancel(bogus) is False
    # Reuse one entry many times; every stale id stays dead.
    live = tw.schedule(1000, 3)
    stale = []
    for _ in range(20_000):
        tid = tw.schedule(1000, 4)
        stale.append(tid)
        assert tw.cancel(tid)
    assert len(set(stale)) == len(stale)
    keep = tw.schedule(1000, 5)
    assert not any(tw.cancel(s) for s in stale[::97])
    assert len(tw) == 2 and tw.cancel(keep) and tw.cancel(live)


def test_reschedule_moves_pending_timer_keeping_id_and_token(wheel_impl):
    """reschedule moves a pending timer to now + after_ms (earlier or later) keeping id and token;
    False for a timer that is not pending."""
    tw = wheel_impl.TimerWheel(now_ms=0)
    tid = tw.schedule(30_000, 77)
    tw.advance(20_000)
    assert tw.reschedule(tid, 30_000) is True
    assert tw.advance(49_999) == []
    assert tw.reschedule(tid, 1) is True
    assert tw.advance(50_000) == [77]
    assert tw.reschedule(tid, 5) is False
    assert tw.cancel(tid) is False
    tid2 = tw.schedule(100, 8)
    assert tw.reschedule(tid2, 0) and tw.advance(50_001) == [8]
    assert tw.reschedule(-3, 5) is False and tw.reschedule(2**70, 5) is False


def test_counts_track_pending_timers(wheel_impl):
    """active_count() and len() count scheduled timers neither fired nor cancelled."""
    tw = wheel_impl.TimerWheel(now_ms=0)
    ids = [tw.schedule(d, d) for d in range(1, 101)]
    assert tw.active_count() == len(tw) == 100
    tw.cancel(ids[0])
    tw.cancel(ids[0])
    tw.reschedule(ids[1], 500)
    assert len(tw) == 99
    tw.advance(50)
    assert tw.active_count() == len(tw) == 99 - 48
    tw.advance(10_000)
    assert len(tw) == 0


def test_next_fire_ms_exact_for_one_timer_and_never_late(wheel_impl):
    """next_fire_ms: now + 2**32 when idle; exactly T for one pending timer at any distance; never
    later than the true earliest, also after cancels of the earliest timer; O(levels) cost."""
    tw = wheel_impl.TimerWheel(now_ms=123)
    assert tw.next_fire_ms() == 123 + 2**32
    for d in (1, 5, 511, 512, 513, 30_000, 5 * 3600 * 1000, 2**40, MAX_DUE_MS - 123):
        tid = tw.schedule(d, 0)
        assert tw.next_fire_ms() == 123 + d
        tw.cancel(tid)
        assert tw.next_fire_ms() == 123 + 2**32
    # Several timers in one high slot; cancelling the earliest leaves a lower bound, never later.
    ids = {d: tw.schedule(d, d) for d in (40_000, 40_100, 40_200)}
    assert tw.next_fire_ms() == 123 + 40_000
    tw.cancel(ids[40_000])
    assert 123 <= tw.next_fire_ms() <= 123 + 40_100
    tw.cancel(ids[40_100])
    assert tw.next_fire_ms() == 123 + 40_200    # one left: exact again
    assert tw.cancel(ids[40_200])
    # A reactor sleeping until the hint until it fires never misses and wakes a bounded number of times.
    tw.schedule(30_000, 9)
    wakes = 0
    while len(tw):
        now = tw.next_fire_ms()
        wakes += 1
        tw.advance(now)
    assert wakes <= 2
    assert tw.now_ms() == 123 + 30_000


def test_poll_timeout_is_the_wait_until_the_earliest_due_time_capped(wheel_impl):
    """poll_timeout: None when idle without a cap, the cap when idle with one; next_fire_ms() -
    now_ms() with timers pending, at most the cap and at most one day; 1 for a timer due in 1 ms."""
    tw = wheel_impl.TimerWheel(now_ms=1_000)
    assert tw.poll_timeout() is None
    assert tw.poll_timeout(cap_ms=250) == 250 and tw.poll_timeout(cap_ms=0) == 0
    assert tw.poll_timeout(cap_ms=np.int64(7)) == 7
    tid = tw.schedule(40, 1)
    assert tw.poll_timeout() == 40 == tw.next_fire_ms() - tw.now_ms()
    assert tw.poll_timeout(cap_ms=10) == 10 and tw.poll_timeout(cap_ms=10**30) == 40
    tw.reschedule(tid, MAX_DUE_MS - 1_000)  # far beyond any selector's limit
    # next_fire_ms() of a timer at an overflow level is the cascade's bound, not its due time:
    # the wait is that bound, never more than a day.
    assert tw.poll_timeout() == min(tw.next_fire_ms() - tw.now_ms(), 86_400_000) == tw.poll_timeout(cap_ms=2**40)
    while tw.next_fire_ms() < 1_000 + MAX_DUE_MS - 1_000:  # wake at each bound, as a reactor would
        assert 0 < tw.poll_timeout() <= 86_400_000
        assert tw.advance(tw.next_fire_ms()) == []
    tw.advance(1_000 + MAX_DUE_MS - 1_000 - 1)
    assert tw.poll_timeout() == 1
    tw.advance(tw.now_ms() + 1)
    assert tw.poll_timeout() is None and len(tw) == 0


@pytest.mark.parametrize("cap, error, needle", [
    (-1, ValueError, "cap_ms must be >= 0 ms, got -1"),
    (1.5, TypeError, "cap_ms must be an int, not float (1.5)"),
    (True, TypeError, "cap_ms must be an int, not bool (True)"),
    ("5", TypeError, "cap_ms must be an int, not str ('5')"),
])
def test_poll_timeout_refuses_a_bad_cap_naming_it(wheel_impl, cap, error, needle):
    tw = wheel_impl.TimerWheel(now_ms=0)
    with pytest.raises(error, match=re.escape(needle)):
        tw.poll_timeout(cap_ms=cap)


@pytest.mark.parametrize("kind", ["selectors", "poll", "select"])
def test_every_selector_accepts_the_longest_poll_timeout(wheel_impl, kind):
    """The longest timeout poll_timeout returns (a timer 2**62 ms out) passes every selector's own
    checks: each is called with a socket already readable, so it returns at once instead of
    waiting a day. The naive timeout, next_fire_ms() - now_ms() of an idle wheel (2**32 ms),
    raises OverflowError in the same calls (asserted, so the test is not vacuous)."""
    import select
    import selectors
    import socket

    if kind == "poll" and not hasattr(select, "poll"):
        pytest.skip("no select.poll here")
    tw = wheel_impl.TimerWheel(now_ms=0)
    tw.schedule(MAX_DUE_MS, 1)
    longest_ms = tw.poll_timeout()
    a, b = socket.socketpair()
    try:
        b.send(b"x")

        def wait(timeout_ms):
            if kind == "selectors":
                with selectors.DefaultSelector() as sel:
                    sel.register(a, selectors.EVENT_READ)
                    return len(sel.select(timeout_ms / 1000))
            if kind == "poll":
                p = select.poll()
                p.register(a, select.POLLIN)
                return len(p.poll(timeout_ms))
            return len(select.select([a], [], [], timeout_ms / 1000)[0])

        assert wait(longest_ms) == 1
        idle = wheel_impl.TimerWheel(now_ms=0)
        if kind != "select":  # select() takes a timeval: seconds of any size
            with pytest.raises(OverflowError):
                wait(idle.next_fire_ms() - idle.now_ms())
    finally:
        a.close()
        b.close()


def test_rearm_later_is_deferred_to_its_old_slot_and_never_fires_early(wheel_impl):
    """A re-arm to a later time while the timer waits at a level >= 1 only records the new due
    time: next_fire_ms() then reports at most the old slot's last ms (a lower bound, never later
    than the true due time); advancing across the old slot re-files the timer and fires nothing;
    it fires exactly at its new due time. Re-armed earlier again, it moves at once; cancelled while
    deferred, it never fires. Virtual time only: cannot flake."""
    tw = wheel_impl.TimerWheel(now_ms=0)
    a = tw.schedule(30_000, 1)                  # level 1: the slot [29_696, 30_208)
    b = tw.schedule(30_000, 2)
    assert tw.reschedule(a, 60_000)             # deferred: b keeps the slot's bound exact
    assert tw.next_fire_ms() == 30_000
    assert tw.cancel(b)
    old_slot_last = 30_207
    assert tw.next_fire_ms() == old_slot_last   # one deferred timer: its old slot's last ms
    assert tw.advance(old_slot_last) == []      # the wake-up at the bound re-files it
    assert tw.next_fire_ms() == 60_000          # now exact
    assert tw.advance(59_999) == []
    assert tw.advance(60_000) == [1]
    # Later, then earlier than the old due time: moved at once, fires at the earlier time.
    c = tw.schedule(40_000, 3)                  # due 100_000
    assert tw.reschedule(c, 90_000)             # deferred to 150_000
    assert tw.reschedule(c, 10_000)             # earlier: due 70_000, re-filed now
    assert tw.next_fire_ms() == 70_000
    assert tw.advance(69_999) == [] and tw.advance(70_000) == [3]
    # Cancelled while deferred: gone, and its old slot never fires it.
    d = tw.schedule(40_000, 4)
    assert tw.reschedule(d, 80_000) and tw.cancel(d) and not tw.cancel(d)
    assert len(tw) == 0 and tw.advance(10**6) == []


def test_due_ms_reports_a_pending_timer_and_none_otherwise(wheel_impl):
    """due_ms(id) is the due time in ms of a pending timer (the new one after a deferred re-arm),
    and None once it fired or was cancelled, for an id never issued and for any int; a non-int
    raises TypeError naming it."""
    tw = wheel_impl.TimerWheel(now_ms=100)
    a = tw.schedule(50, 1)
    b = tw.schedule(40_000, 2)
    assert tw.due_ms(a) == 150 and tw.due_ms(b) == 40_100
    assert tw.reschedule(b, 90_000) and tw.due_ms(b) == 90_100
    assert tw.advance(150) == [1] and tw.due_ms(a) is None
    assert tw.cancel(b) and tw.due_ms(b) is None
    assert tw.due_ms(0) is None and tw.due_ms(-1) is None and tw.due_ms(2**70) is None
    with pytest.raises(TypeError, match="timer_id"):
        tw.due_ms("1")


def test_time_never_goes_backwards(wheel_impl):
    """advance(t < now) raises ValueError naming t and leaves the wheel unchanged; advance(now) is a no-op."""
    tw = wheel_impl.TimerWheel(now_ms=1000)
    tw.schedule(1, 5)
    with pytest.raises(ValueError, match="999"):
        tw.advance(999)
    assert tw.now_ms() == 1000 and len(tw) == 1
    assert tw.advance(1000) == []
    assert tw.advance(1001) == [5]


def test_out_of_range_and_wrong_types_raise(wheel_impl):
    """Tokens outside [0, 2**64) and due times beyond 2**62 raise ValueError naming the value;
    bool, float, str and None raise TypeError; numpy integer scalars are ints. Nothing is armed."""
    tw = wheel_impl.TimerWheel(now_ms=10)
    for token in (-1, 2**64, 2**100, np.int64(-1)):
        with pytest.raises(ValueError, match=str(int(token))):
            tw.schedule(5, token)
    with pytest.raises(ValueError, match=str(MAX_DUE_MS + 1)):
        tw.schedule(MAX_DUE_MS - 9, 0)
    with pytest.raises(ValueError):
        tw.schedule(2**64, 0)
    with pytest.raises(ValueError):
        tw.schedule(2**200, 0)
    for bad in (1.0, "5", None, True, False, np.bool_(True), np.float64(3), [1]):
        with pytest.raises(TypeError):
            tw.schedule(bad, 0)
        with pytest.raises(TypeError):
            tw.schedule(5, bad)
        with pytest.raises(TypeError):
            tw.cancel(bad)
        with pytest.raises(TypeError):
            tw.advance(bad)
    tid = tw.schedule(5, 1)
    for bad in (1.5, None, True):
        with pytest.raises(TypeError):
            tw.reschedule(tid, bad)
        with pytest.raises(TypeError):
            tw.reschedule(bad, 5)
    with pytest.raises(ValueError):
        tw.reschedule(tid, MAX_DUE_MS)
    with pytest.raises(ValueError, match=str(MAX_DUE_MS + 1)):
        tw.advance(MAX_DUE_MS + 1)
    with pytest.raises(TypeError):
        tw.advance(20, ())
    assert len(tw) == 1
    assert tw.schedule(np.int32(3), np.uint64(2**64 - 1)) > 0
    assert tw.schedule(np.uint8(3), np.int64(7)) > 0
    assert tw.advance(np.int64(13)) == [2**64 - 1, 7]
    for bad_now in (-1, MAX_DUE_MS + 1):
        with pytest.raises(ValueError):
            wheel_impl.TimerWheel(now_ms=bad_now)
    with pytest.raises(TypeError):
        wheel_impl.TimerWheel(now_ms=1.0)


def test_cancel_frees_entry_at_once(wheel_impl):
    """A cancelled timer's entry is reused by the next schedule: live entries never exceed pending
    timers, so the footprint after churn equals the footprint of the live set."""
    tw = wheel_impl.TimerWheel(now_ms=0)
    ids = [tw.schedule(30_000, k) for k in range(1000)]
    base = tw.nbytes()
    for k in range(50_000):
        i = k % 1000
        assert tw.cancel(ids[i])
        ids[i] = tw.schedule(30_000 + k % 700, i)
    assert tw.nbytes() == base
    assert len(tw) == 1000


def test_batch_calls_match_scalar_semantics(wheel_impl):
    """schedule_many/cancel_many/advance_array: same ids, tokens and order as the scalar calls;
    uint64 arrays out; mismatched lengths or bad values raise and schedule nothing."""
    delays = np.array([5, 0, -3, 512, 513, 30_000, 5], dtype=np.int64)
    tokens = np.array([1, 2, 3, 2**64 - 1, 5, 6, 7], dtype=np.uint64)
    a = wheel_impl.TimerWheel(now_ms=7)
    b = wheel_impl.TimerWheel(now_ms=7)
    ids = a.schedule_many(delays, tokens)
    assert ids.dtype == np.uint64 and ids.shape == (7,)
    assert ids.tolist() == [b.schedule(int(d), int(t)) for d, t in zip(delays, tokens)]
    assert a.cancel_many(np.array([ids[4], ids[4], 0, 2**63], dtype=np.uint64)) == 1
    b.cancel(int(ids[4]))
    out = a.advance_array(10**6)
    assert out.dtype == np.uint64
    assert out.tolist() == b.advance(10**6) == [2, 3, 1, 7, 2**64 - 1, 6]
    # One delay for every token.
    ids = a.schedule_many(100, np.arange(3, dtype=np.uint32))
    assert a.advance_array(10**6 + 100).tolist() == [0, 1, 2]
    assert a.cancel_many(ids) == 0
    assert a.advance_array(10**6 + 100).tolist() == []
    # Rejections leave the wheel untouched.
    bad = [
        (ValueError, np.array([1, 2]), np.array([1, 2, 3], dtype=np.uint64)),
        (ValueError, np.array([1, 2]), np.array([1, -2])),
        (ValueError, np.array([1, 2**62]), np.array([1, 2], dtype=np.uint64)),
        (TypeError, np.array([1.0, 2.0]), np.array([1, 2], dtype=np.uint64)),
        (TypeError, np.array([1, 2]), np.array([True, False])),
        (TypeError, np.array([[1, 2]]), np.array([[1, 2]], dtype=np.uint64)),
        (TypeError, 1.5, np.array([1, 2], dtype=np.uint64)),
    ]
    for exc, d, t in bad:
        with pytest.raises(exc):
            a.schedule_many(d, t)
    assert len(a) == 0
    with pytest.raises(TypeError):
        a.cancel_many(np.array([1.0]))
    assert a.schedule_many(np.array([], dtype=np.int64), np.array([], dtype=np.uint64)).shape == (0,)


def test_batch_calls_take_python_int_lists_exactly(wheel_impl):
    """Lists of Python ints beyond int64 (which numpy alone reads as float64 or object) are taken
    exactly, never rounded; a list no 64-bit type holds, or holding a float, raises naming the
    values and schedules nothing. Deterministic."""
    tw = wheel_impl.TimerWheel(now_ms=0)
    ids = tw.schedule_many(17, [2**64 - 1, 0, 2**63 + 1])
    assert ids.dtype == np.uint64 and len(tw) == 3
    assert tw.advance_array(17).tolist() == [2**64 - 1, 0, 2**63 + 1]
    assert tw.cancel_many([int(ids[0]), 2**64 - 1]) == 0
    with pytest.raises(ValueError, match="-1 and 18446744073709551615"):
        tw.schedule_many(17, [-1, 2**64 - 1])
    with pytest.raises(ValueError, match="18446744073709551616 does not fit"):
        tw.schedule_many(17, [0, 2**64])
    with pytest.raises(TypeError, match="1.5"):
        tw.schedule_many(17, [2**63, 1.5])
    assert len(tw) == 0


def test_advance_array_large_then_small_batches_match_advance(wheel_impl):
    """advance_array over a batch larger than the C core's kept scratch (4096 tokens), then small
    and empty ones, returns exactly what advance returns, as fresh writable uint64 arrays. The
    sizes are asserted first, so the large case cannot pass vacuously; the clock is virtual."""
    a = wheel_impl.TimerWheel(now_ms=0)
    b = wheel_impl.TimerWheel(now_ms=0)
    n = 20_000
    delays = (np.arange(n, dtype=np.int64) * 7919) % 3000
    for tw in (a, b):
        tw.schedule_many(delays, np.arange(n, dtype=np.uint64))
    results = []
    for now in (2000, 2000, 2001, 2500, 2999, 10**6):
        out = a.advance_array(now)
        assert out.dtype == np.uint64 and out.flags.writeable
        assert out.tolist() == b.advance(now)
        results.append(out)
    assert len(results[0]) > 4096 and len(results[1]) == 0 and 0 < len(results[2]) < 4096
    assert sum(len(r) for r in results) == n and len(a) == 0
    first = results[0].copy()
    results[2][:] = 0  # writing one result must not alter another (no shared scratch)
    assert (results[0] == first).all()


def test_memory_flat_under_10m_churn_cycles(wheel_impl):
    """Memory stays flat under churn, at full scale for C (10 million schedule/cancel cycles over 100k live timers,
    through the batch calls, plus 1M scalar cycles), scaled to 300k cycles over 10k for the pure twin:
    the wheel's byte count ends where it was with the live set alone, and the process RSS does not
    grow by more than the 100 MB a leak of even 10 bytes per cycle would cost. Virtual time only."""
    psutil = pytest.importorskip("psutil")
    is_c = wheel_impl.__name__ == "timerwheel_c._wheel"
    live, rounds, scalar = (100_000, 100, 1_000_000) if is_c else (10_000, 20, 100_000)
    tw = wheel_impl.TimerWheel(now_ms=0)
    tokens = np.arange(live, dtype=np.uint64)
    ids = tw.schedule_many(30_000, tokens)
    base = tw.nbytes()
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    for r in range(rounds):
        assert tw.cancel_many(ids) == live
        ids = tw.schedule_many(30_000 + r, tokens)
        tw.advance(tw.now_ms() + 1)
    ids = ids.tolist()
    for k in range(scalar):
        i = k % live
        tw.cancel(ids[i])
        ids[i] = tw.schedule(30_000, i)
    assert len(tw) == live
    assert tw.nbytes() == base
    assert proc.memory_info().rss - rss0 < 100 * 2**20


def test_foreign_index_runs_before_the_wheel_is_touched(wheel_impl):
    """An argument's __index__ may call back into the wheel (advance, cancel); every conversion runs
    before the wheel is read, so the timer is armed from the wheel's time after the callback and
    a timer cancelled by the callback is reported not pending. Deterministic: no clock involved."""
    tw = wheel_impl.TimerWheel(now_ms=0)

    class Advancing:
        def __index__(self):
            tw.advance(tw.now_ms() + 100)
            return 7

    tw.schedule(5, Advancing())
    assert tw.now_ms() == 100
    assert tw.advance(104) == [] and tw.advance(105) == [7]

    victim = tw.schedule(50, 1)

    class Cancelling:
        def __index__(self):
            tw.cancel(victim)
            return 10

    assert tw.reschedule(victim, Cancelling()) is False
    assert len(tw) == 0 and tw.advance(10_000) == []


# -- Python code running inside a call, and the range edges -------------------------------


HELPERS = Path(__file__).resolve().parent


@pytest.mark.parametrize("call", ["advance_array(Now)", "advance", "advance(Now, [])"])
def test_timers_scheduled_from_python_code_inside_a_call_are_never_lost(tmp_path, call):
    """No memory corruption and no lost timers when Python code schedules on the compiled wheel
    *during* a call that fills C memory from the wheel's state: the garbage collector's (a
    finalizer, weakref callback or gc.callbacks) inside ``advance`` (it allocates the result list),
    or a foreign ``__index__`` converting ``now_ms``. A core that sized its output buffer before
    such an allocation would write the timers the hook scheduled past the buffer's end (the pure
    twin holds the property: it has no C buffer).

    Checked in a subprocess (tests/cores/wheel_code_inside_call.py), since a corrupted heap may crash
    it: every timer is either returned or still pending. Deterministic: the hook acts once, inside
    the call, and the test asserts that it did."""
    pytest.importorskip("timerwheel_c._wheel")
    proc = subprocess.run([sys.executable, str(HELPERS / "wheel_code_inside_call.py"), "timerwheel_c._wheel", call],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-500:]
    hit, fired, pending, total = proc.stdout.split()
    assert hit == "True", "no Python code ran inside the call: the test proved nothing"
    assert int(fired) + int(pending) == int(total)
    assert int(pending) == 0


def test_schedule_many_rechecks_due_times_after_gc_advances_the_wheel(wheel_impl):
    """No timer is ever armed beyond 2**62 ms, even when the GC's Python code (here a gc callback)
    advances the wheel to near 2**62 while ``schedule_many`` converts its arrays (after its range
    check read ``now_ms``): the batch raises ValueError and arms nothing, or arms timers that the
    final ``advance(2**62)`` fires. Deterministic: the callback acts once, inside the call
    (asserted), and with a gen-0 threshold of 1 the call's allocations always start a collection."""
    import gc

    w = wheel_impl.TimerWheel(0)
    inside, hits = [False], []

    def cb(phase, info):
        if phase == "start" and inside[0] and not hits:
            hits.append(1)
            w.advance(MAX_DUE_MS - 10)

    delays = np.array([100, 5], dtype=np.int64)
    tokens = np.array([1, 2], dtype=np.uint64)
    gc.callbacks.append(cb)
    old = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        inside[0] = True
        try:
            w.schedule_many(delays, tokens)
        except ValueError:
            pass
        inside[0] = False
    finally:
        gc.set_threshold(*old)
        gc.callbacks.remove(cb)
    assert hits, "no collection ran inside schedule_many: the test proved nothing"
    w.advance(MAX_DUE_MS)
    assert len(w) == 0


def test_due_error_names_the_clamped_due_time(wheel_impl):
    """The ValueError for a due time beyond 2**62 ms names the real due time: at now_ms == 2**62 a
    delay of 0 is clamped to 1, so the due time is 2**62 + 1 (not now + after_ms == 2**62, which
    would be in range). Deterministic: pure arithmetic."""
    w = wheel_impl.TimerWheel(now_ms=MAX_DUE_MS)
    for call in (lambda: w.schedule(0, 1), lambda: w.schedule_many(np.array([0]), np.array([1]))):
        with pytest.raises(ValueError, match=f"due time {MAX_DUE_MS + 1} ms"):
            call()
    assert len(w) == 0


def test_schedule_many_refuses_a_clamped_due_time_beyond_the_maximum(wheel_impl):
    """Out-of-range input gets an exception in the batch call as in the scalar one: at
    now_ms == 2**62, a delay of 0 is clamped to 1, so the due time 2**62 + 1 is beyond any
    advance; ``schedule_many([0, -5], ...)`` raises ValueError and schedules nothing, rather
    than arming timers that would stay pending forever."""
    w = wheel_impl.TimerWheel(now_ms=MAX_DUE_MS)
    with pytest.raises(ValueError):
        w.schedule(0, 1)
    with pytest.raises(ValueError):
        w.schedule_many(np.array([0, -5], dtype=np.int64), np.array([1, 2], dtype=np.uint64))
    assert len(w) == 0


@pytest.mark.parametrize("delay", [2**63 - 1, 2**64, 2**70])
def test_schedule_many_names_the_delay_it_was_given(wheel_impl, delay):
    """One delay for every token beyond the wheel's range is refused naming that delay, as
    ``schedule`` names it, not the value it is clamped to inside (2**62 + 1), which the caller never
    passed; nothing is scheduled."""
    w = wheel_impl.TimerWheel(now_ms=0)
    with pytest.raises(ValueError, match=rf"after_ms {delay}\)"):
        w.schedule_many(delay, [1, 2])
    with pytest.raises(ValueError, match=rf"after_ms {delay}\)"):
        w.schedule(delay, 1)
    assert len(w) == 0


def test_schedule_many_accepts_list_of_valid_u64_tokens(wheel_impl):
    """``tokens`` is any int in [0, 2**64), in a list as in an array: ``[1, 2**63]``, which numpy
    alone would turn into float64 (losing precision), schedules both, like the scalar calls, and
    fires them unchanged."""
    w = wheel_impl.TimerWheel(0)
    ids = w.schedule_many(5, [1, 2**63])
    assert len(ids) == 2
    assert [int(t) for t in w.advance_array(5)] == [1, 2**63]


@pytest.mark.parametrize("call, bad", [
    (lambda w: w.schedule_many([5, True], [1, 2]), "after_ms must be an int, not bool (True)"),
    (lambda w: w.schedule_many((5, 6), [7, np.bool_(False)]), "tokens must be an int, not bool ("),
    (lambda w: w.cancel_many([w.schedule(5, 1), True]), "must be an int, not bool (True)"),
    (lambda w: w.schedule_many(np.ma.masked_array([5, 6], mask=[0, 1]), [1, 2]), "after_ms must not be a masked array"),
])
def test_batch_calls_refuse_a_bool_in_a_list_and_a_masked_array(wheel_impl, call, bad):
    """A bool inside a list is refused, naming it, as a bool alone or a bool array is (np.asarray read
    ``[5, True]`` as int64: a 1 ms delay, token 0, timer id 1, taken without a word); so is a masked
    array, whose masked entries np.asarray would hand over. Nothing is scheduled or cancelled."""
    w = wheel_impl.TimerWheel(0)
    before = len(w)
    with pytest.raises(TypeError, match=re.escape(bad)):
        call(w)
    assert len(w) - before in (0, 1)  # cancel_many's own schedule(5, 1) stays armed
    assert all(t in (1,) for t in w.advance(10))


def test_a_wrong_fired_argument_is_refused_in_the_same_words_by_both_twins():
    """advance(now_ms, fired=()) raises TypeError with Cython's message in both twins."""
    from timerwheel_c.pure.wheel import TimerWheel as PureWheel

    from timerwheel_c import TimerWheel

    messages = []
    for cls in (TimerWheel, PureWheel):
        with pytest.raises(TypeError) as info:
            cls(0).advance(5, fired=())
        messages.append(str(info.value))
    assert messages[0] == messages[1] == "Argument 'fired' has incorrect type (expected list, got tuple)"


def test_reinit_of_a_wheel_in_use_raises_and_keeps_its_timers(wheel_impl):
    """Never lost, and the twins behave the same: calling ``__init__`` again on a wheel holding
    a pending timer raises RuntimeError, and the timer still fires."""
    w = wheel_impl.TimerWheel(0)
    w.schedule(10, 1)
    with pytest.raises(RuntimeError):
        w.__init__(5)
    assert w.advance(100) == [1]

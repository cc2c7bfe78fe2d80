"""The event loop's timer store keeps the timer armed last out of its wheel until it next reads
the wheel or arms another: one cancelled before then never enters the wheel (what an
``asyncio.timeout`` block that ends in time does), and one not cancelled answers and fires exactly
as if it had gone in when armed: counted, listed, due at its deadline and never before.

The clock is a fake loop's ``time()`` (no real time passes), so every property is exact. Whether
a timer entered the wheel is read from the twin's structure: the pure twin's wheel, and the
compiled one's index list as the collector sees it (an armed timer holds an index past 0)."""
from __future__ import annotations

import collections
import gc

import timerwheel_c.pure.loop as pure_loop
from fake_loop import FakeLoop


def _entered(loop_impl, timers) -> int:
    """How many timers ``timers`` holds in its wheel, read without making it read its wheel."""
    if loop_impl is pure_loop:
        return len(timers._wheel)
    (handles,) = [r for r in gc.get_referents(timers) if type(r) is list]
    return sum(h is not None for h in handles[1:])


def test_a_timer_cancelled_before_the_wheel_is_read_never_enters_it(loop_impl):
    """Armed for a later ms and cancelled with no read of the wheel between, a timer takes no
    wheel entry and no index, is counted and listed nowhere, and never runs; arming another timer
    puts the one waiting in the wheel first, so the count starts above 0 (not vacuous)."""
    loop = FakeLoop(1000.0)
    timers = loop_impl.LoopTimers(loop)
    handle = timers.call_at(1000.5, print, "cancelled")
    assert handle._scheduled and _entered(loop_impl, timers) == 0
    handle.cancel()
    assert not handle._scheduled and _entered(loop_impl, timers) == 0
    first = timers.call_at(1000.5, print, "first")
    timers.call_at(1000.6, print, "second")
    assert _entered(loop_impl, timers) == 1  # the first went in when the second was armed
    first.cancel()
    assert _entered(loop_impl, timers) == 0 and timers.active_count() == 1
    loop.now_s = 1001.0
    ready = collections.deque()
    assert timers.move_due(ready) == 1 and [h._args[0] for h in ready] == ["second"]
    assert timers.active_count() == 0 and timers.scheduled() == []


def test_a_waiting_timer_is_counted_listed_and_runs_at_its_deadline_never_early(loop_impl):
    """A timer left waiting is counted and listed as armed; moved by an iteration whose
    selector timeout was 0 (callbacks ready: the wheel not read first), it is not due a
    microsecond before its deadline and due at it, in deadline order with the others, ties in
    arming order."""
    loop = FakeLoop(1000.0)
    timers = loop_impl.LoopTimers(loop)
    early = timers.call_at(1000.0305, print, "early")
    tie = timers.call_at(1000.0305, print, "tie")
    assert _entered(loop_impl, timers) == 1
    assert timers.active_count() == 2 and timers.scheduled() == [early, tie]
    late = timers.call_at(1000.0405, print, "late")
    assert timers.select_timeout(True) == 0
    loop.now_s = 1000.0305 - 1e-6
    ready = collections.deque()
    assert timers.move_due(ready) == 0 and late._scheduled
    loop.now_s = 1000.0405
    assert timers.move_due(ready) == 3
    assert [h._args[0] for h in ready] == ["early", "tie", "late"]


def test_the_selector_waits_for_a_waiting_timer(loop_impl):
    """With only a waiting timer armed, the selector's timeout is the time until its ms, as for
    a timer in the wheel (not None, which would sleep past it)."""
    loop = FakeLoop(1000.0)
    timers = loop_impl.LoopTimers(loop)
    timers.call_at(1000.25, print, 0)
    timeout_s = timers.select_timeout(False)
    assert timeout_s is not None and 0.0 < timeout_s <= 0.25
    assert _entered(loop_impl, timers) == 1


def test_close_drops_a_waiting_timer_uncancelled(loop_impl):
    """close() drops a waiting timer as it drops the wheel's: unarmed, not cancelled, never run;
    the store's collector references no longer reach it."""
    loop = FakeLoop(1000.0)
    timers = loop_impl.LoopTimers(loop)
    handle = timers.call_at(1000.5, print, 0)
    timers.close()
    assert not handle._scheduled and not handle.cancelled()
    assert handle not in gc.get_referents(*gc.get_referents(timers))
    loop.now_s = 1001.0
    assert timers.move_due(collections.deque()) == 0

"""WheelScheduler against asyncio's own timer semantics, on the compiled scheduler and its
pure twin and on the default loop and uvloop (uvloop runs are skipped when it does not import).

No test asserts a speed or a lateness number: timing properties are "not before the
deadline" (exact, by the loop's own clock) and "within a generous liveness bound".
"""
from __future__ import annotations

import asyncio
import contextvars
import random
import re
import threading
import time

import pytest

LIVENESS_S = 5.0  # seconds: the liveness bound of the conftest's `until`

def _script_equal_delays(call_later, log):
    """Eight callbacks with one delay, then four with shorter delays armed last."""
    for i in range(8):
        call_later(0.1, log.append, i)
    for i in range(4):
        call_later(0.01 + i * 0.001, log.append, f"early{i}")


def test_equal_deadlines_run_in_scheduling_order(aio_run, until):
    """Callbacks with equal deadlines run in the order they were scheduled, earlier deadlines
    first. Two scripts: call_later with one delay in sequence, which asyncio's loop orders
    the same way (its deadlines grow with loop.time()); and call_at with one exact `when`,
    which asyncio's heap (not stable) may reorder but the wheel (ties in arming order) and
    uvloop do not. Deterministic: the order depends on deadlines and arming order only, and
    the script would need an 87 ms stall between two calls to blur the two groups."""
    async def main(sched, loop):
        ours, theirs, exact = [], [], []
        _script_equal_delays(sched.call_later, ours)
        _script_equal_delays(loop.call_later, theirs)
        when = loop.time() + 0.02
        for i in range(8):
            sched.call_at(when, exact.append, i)
        await until(lambda: len(ours) == 12 and len(theirs) == 12 and len(exact) == 8)
        return ours, theirs, exact
    ours, theirs, exact = aio_run(main)
    assert ours == theirs == [f"early{i}" for i in range(4)] + list(range(8))
    assert exact == list(range(8))


def _script_cancels(call_at, loop, log):
    """A cancels B (next in line, usually in A's batch) and C (later); D cancels itself while running."""
    when = loop.time() + 0.01
    handles = {}
    def a():
        log.append("a")
        handles["b"].cancel()
        handles["c"].cancel()
    def d():
        log.append("d")
        handles["d"].cancel()
        log.append(("d cancelled()", handles["d"].cancelled()))
    handles["a"] = call_at(when, a)
    # b 2 ms after a: asyncio's heap does not keep arming order on exact ties, and uvloop turns
    # call_at into a whole-ms delay from the moment of arming, so a hair later could round earlier
    handles["b"] = call_at(when + 0.002, log.append, "b")
    handles["c"] = call_at(when + 0.01, log.append, "c")
    handles["d"] = call_at(when + 0.005, d)
    call_at(when + 0.02, log.append, "end")
    return handles


def test_cancel_from_inside_a_callback(aio_run, until):
    """A handle cancelled by an earlier callback of the same fire batch does not run, nor does
    a later one; self-cancel while running is harmless. Same log as asyncio's loop."""
    async def main(sched, loop):
        ours, theirs = [], []
        h_ours = _script_cancels(sched.call_at, loop, ours)
        h_theirs = _script_cancels(loop.call_at, loop, theirs)
        await until(lambda: "end" in ours and "end" in theirs)
        assert h_ours["b"].cancelled() and h_theirs["b"].cancelled()
        assert sched.active_count() == 0
        return ours, theirs
    ours, theirs = aio_run(main)
    assert ours == theirs
    assert "b" not in ours and "c" not in ours and ours[0] == "a"


def test_reschedule_moves_the_deadline_both_ways(aio_run, until):
    """reschedule() keeps the handle, runs it once at the new deadline (later or earlier), never
    before it; a cancelled handle refuses (False) and never runs."""
    async def main(sched, loop):
        log = []
        later = sched.call_later(0.01, lambda: log.append(("later", loop.time())))
        sooner = sched.call_later(10.0, lambda: log.append(("sooner", loop.time())))
        dead = sched.call_later(0.01, log.append, "dead")
        assert later.reschedule(0.2) is True  # 180 ms apart: no stall reorders them
        assert sooner.reschedule(0.02) is True
        dead.cancel()
        assert dead.reschedule(0.01) is False
        await until(lambda: len(log) == 2)
        await asyncio.sleep(0.03)  # give "dead" every chance to (wrongly) run
        return log, later.when(), sooner.when()
    log, later_when, sooner_when = aio_run(main)
    assert [name for name, _ in log] == ["sooner", "later"]
    assert log[0][1] >= sooner_when and log[1][1] >= later_when


def test_reschedule_of_a_handle_due_in_the_same_batch_defers_it(aio_run, until):
    """A callback rescheduling a handle that is due in the same batch (after it) moves it: it
    runs once, at the new deadline, not in this batch."""
    async def main(sched, loop):
        log = []
        when = loop.time() + 0.01
        def first():
            log.append(("first", loop.time()))
            second.reschedule(0.03)
        sched.call_at(when, first)
        second = sched.call_at(when, lambda: log.append(("second", loop.time())))
        await until(lambda: len(log) == 2)
        await asyncio.sleep(0.02)
        return log, second.when()
    log, second_when = aio_run(main)
    assert [name for name, _ in log] == ["first", "second"]
    assert log[1][1] >= second_when >= log[0][1] + 0.03


def test_a_callback_may_rearm_itself(aio_run, until):
    """reschedule() from inside its own callback runs it again: a periodic timer."""
    async def main(sched, loop):
        runs = []
        def tick():
            runs.append(loop.time())
            if len(runs) < 3:
                assert handle.reschedule(0.005) is True
        handle = sched.call_later(0.005, tick)
        await until(lambda: len(runs) == 3)
        await asyncio.sleep(0.02)
        return runs
    runs = aio_run(main)
    assert len(runs) == 3 and runs == sorted(runs)


def test_a_callback_schedules_another(aio_run, until):
    """A callback that schedules another (even with delay 0) does not run it in the same batch;
    the chain runs in order, each link not before its own deadline."""
    async def main(sched, loop):
        log = []
        def link(n):
            log.append((n, loop.time()))
            if n < 5:
                handles.append(sched.call_later(0 if n % 2 else 0.002, link, n + 1))
        handles = [sched.call_later(0.001, link, 0)]
        await until(lambda: len(log) == 6)
        return log, [h.when() for h in handles]
    log, whens = aio_run(main)
    assert [n for n, _ in log] == list(range(6))
    for (_n, ran_at), when in zip(log, whens):
        assert ran_at >= when
    # delay 0 from inside a batch runs on a later wake-up, never before its parent
    assert all(b[1] >= a[1] for a, b in zip(log, log[1:]))


def test_exceptions_go_to_the_loop_handler_like_asyncio(aio_run, until):
    """A raising callback reaches loop.call_exception_handler with asyncio's keys (message,
    exception, handle) and the rest of the batch still runs."""
    async def main(sched, loop):
        contexts, ran = [], []
        loop.set_exception_handler(lambda _loop, ctx: contexts.append(ctx))
        boom = ZeroDivisionError("boom")
        def bad():
            raise boom
        when = loop.time() + 0.005
        ours = sched.call_at(when, bad)
        sched.call_at(when, ran.append, "after")
        theirs = loop.call_at(when, bad)
        await until(lambda: len(contexts) == 2 and ran)
        return contexts, ours, theirs, boom
    contexts, ours, theirs, boom = aio_run(main)
    by_handle = {id(c["handle"]): c for c in contexts}
    mine, asyncio_ctx = by_handle[id(ours)], by_handle[id(theirs)]
    assert set(mine) == set(asyncio_ctx) - {"source_traceback"} == {"message", "exception", "handle"}
    assert mine["exception"] is boom and mine["message"].startswith("Exception in callback")


def test_callback_runs_in_its_context(aio_run, until):
    """Callbacks run in the given context, else in a copy taken at call_later time (asyncio's rule)."""
    var = contextvars.ContextVar("var", default="unset")
    async def main(sched, loop):
        seen = {}
        var.set("at call time")
        sched.call_later(0.001, lambda: seen.setdefault("copied", var.get()))
        given = contextvars.Context()
        given.run(var.set, "given")
        h = sched.call_later(0.001, lambda: seen.setdefault("given", var.get()), context=given)
        assert h.get_context() is given
        var.set("changed later")
        await until(lambda: len(seen) == 2)
        return seen
    assert aio_run(main) == {"copied": "at call time", "given": "given"}


def test_never_before_its_delay(aio_run, until):
    """300 handles with random delays (seeded) and random reschedules all run, each at a loop
    time at or after its when(), within a liveness bound. Exact by construction: due times
    round up and wake-up times round down to the ms."""
    rng = random.Random(6)
    async def main(sched, loop):
        ran = {}
        handles = []
        for i in range(300):
            h = sched.call_later(rng.uniform(-0.001, 0.08), lambda i=i: ran.setdefault(i, loop.time()))
            handles.append(h)
            if rng.random() < 0.3:
                h.reschedule(rng.uniform(0, 0.08))
            if rng.random() < 0.3:
                await asyncio.sleep(rng.uniform(0, 0.003))
        await until(lambda: len(ran) == 300)
        return ran, [h.when() for h in handles]
    ran, whens = aio_run(main)
    for i, when in enumerate(whens):
        assert ran[i] >= when, (i, ran[i], when)
        assert ran[i] < when + LIVENESS_S


def test_never_before_its_delay_in_real_time(aio_run, until):
    """Measured on time.monotonic(), not the loop clock: 200 handles with random delays run
    no sooner than their delay after a stamp taken before call_later. On uvloop, whose clock
    trails the real time, this rests on the scheduler's clock slack."""
    rng = random.Random(7)
    async def main(sched, loop):
        elapsed = {}
        delays = {}
        for i in range(200):
            delays[i] = rng.uniform(0.0, 0.05)
            start = time.monotonic()
            sched.call_later(delays[i], lambda i=i, start=start: elapsed.setdefault(i, time.monotonic() - start))
            if rng.random() < 0.2:
                await asyncio.sleep(rng.uniform(0, 0.003))
        await until(lambda: len(elapsed) == 200)
        return elapsed, delays
    elapsed, delays = aio_run(main)
    for i, delay in delays.items():
        assert delay <= elapsed[i] < delay + LIVENESS_S, (i, delay, elapsed[i])


@pytest.mark.parametrize("patch", ["loop.time", "time.monotonic"])
def test_a_patched_loop_clock_moves_the_schedulers_deadlines(aio_impl, patch):
    """A test's clock, set on the loop instance before the scheduler is made or patched into
    ``time.monotonic`` (which asyncio's ``loop.time()`` calls), is the clock deadlines count from,
    on both twins, as it is for ``loop.call_later``: never the real monotonic clock read in C."""
    from unittest import mock

    loop = asyncio.new_event_loop()
    try:
        if patch == "loop.time":
            loop.time = lambda: 5000.0
            sched = aio_impl.WheelScheduler(loop)
            assert sched.call_later(1.0, print).when() == loop.call_later(1.0, print).when() == 5001.0
        else:
            sched = aio_impl.WheelScheduler(loop)
            with mock.patch("time.monotonic", lambda: 7000.0):
                assert sched.call_later(1.0, print).when() == loop.call_later(1.0, print).when() == 7001.0
            # The real clock again, once unpatched (a second apart at most on a loaded machine).
            assert abs(sched.call_later(1.0, print).when() - loop.call_later(1.0, print).when()) < 1.0
        sched.close()
    finally:
        loop.close()


def test_a_loop_clock_that_goes_back_or_below_zero_takes_the_wheels_with_it(aio_impl):
    """A hand-moved loop clock (a test's, a virtual clock) stepped back: a handle or key armed after the
    step fires at its deadline, on both twins, as on asyncio's loop; one armed before it still fires at
    its own deadline, never earlier, equal deadlines in arming order. A clock below 0 from the start, or
    going there later, works alike. Armed after a step back, a timer fired once the clock came back to
    where the wheel had been, late by the whole step; a clock below 0 raised ValueError("now_ms ...")."""
    loop = asyncio.new_event_loop()
    clock = [1000.0]
    loop.time = lambda: clock[0]
    fired = []

    def at(t):
        clock[0] = t
        loop.call_soon(loop.stop)
        loop.run_forever()
        return [name for name, _ in fired]

    try:
        sched = aio_impl.WheelScheduler(loop)
        keys = sched.keyed(lambda key: fired.append((f"key {key}", clock[0])))

        def later(delay, name):
            return sched.call_later(delay, lambda: fired.append((name, clock[0])))

        later(0.5, "first")
        later(10.0, "before the step")
        later(10.0, "before the step, second")
        assert at(1000.6) == ["first"]
        clock[0] = 900.0  # the step back
        later(0.1, "after the step")
        keys.arm(7, 0.2)
        assert at(900.05) == ["first"]
        assert at(900.1) == ["first", "after the step"]
        assert at(900.2) == ["first", "after the step", "key 7"]
        assert at(1009.999) == ["first", "after the step", "key 7"]
        assert at(1010.0)[3:] == ["before the step", "before the step, second"]
        assert all(t >= when for (_, t), when in zip(fired, (1000.5, 900.1, 900.2, 1010.0, 1010.0)))
        sched.close()

        fired.clear()
        clock[0] = -5.0
        sched = aio_impl.WheelScheduler(loop)  # a clock below 0 from the start
        keys = sched.keyed(lambda key: fired.append((f"key {key}", clock[0])))
        sched.call_later(1.0, lambda: fired.append(("at -4", clock[0])))
        assert at(-4.001) == []
        assert at(-4.0) == ["at -4"]
        clock[0] = -100.0  # and further below
        sched.call_later(0.5, lambda: fired.append(("at -99.5", clock[0])))
        keys.arm(1, 0.25)
        assert at(-99.8) == ["at -4"]
        assert at(-99.75) == ["at -4", "key 1"]
        assert at(-99.5) == ["at -4", "key 1", "at -99.5"]
        # Two steps back before the loop turns, each arming a timer due before the wheels' origin: the
        # wake-up is the loop's next turn, which follows the clock (it was aimed at the first step's
        # time, and the second timer fired 9 s late).
        fired.clear()
        clock[0] = -200.0
        sched.call_at(-195.0, lambda: fired.append(("at -195", clock[0])))
        clock[0] = -210.0
        sched.call_at(-209.0, lambda: fired.append(("at -209", clock[0])))
        assert at(-209.5) == []
        assert at(-209.0) == ["at -209"]
        assert at(-195.0) == ["at -209", "at -195"]
        # Armed while the clock is behind the wheel, then the clock comes back to the wheel's very ms:
        # owed now (it waited for the ms after).
        fired.clear()
        at(-190.0)
        clock[0] = -191.0
        sched.call_at(-190.5, lambda: fired.append(("at -190.5", clock[0])))
        assert at(-190.0) == ["at -190.5"]
        sched.close()
    finally:
        loop.close()


def test_clock_slack_defaults_and_checks(new_loop, aio_impl):
    """The clock slack is 1 or 2 ms on uvloop (its clock trails real time) and 0 on asyncio's
    loop; a negative or non-numeric slack is refused."""
    loop = new_loop()
    try:
        sched = aio_impl.WheelScheduler(loop)
        if type(loop).__module__.startswith("uvloop"):
            assert 0.001 <= sched.clock_slack_s <= 0.002
        else:
            assert sched.clock_slack_s == 0.0
        assert aio_impl.WheelScheduler(loop, clock_slack_s=0.01).clock_slack_s == 0.01
        with pytest.raises(ValueError, match="clock_slack_s"):
            aio_impl.WheelScheduler(loop, clock_slack_s=-0.001)
        with pytest.raises(TypeError, match="clock_slack_s"):
            aio_impl.WheelScheduler(loop, clock_slack_s="1ms")
        # A lag, not a delay: beyond 1 s it is a unit mistake that would put every deadline
        # out of the wheel's range, refused here by its own name.
        assert aio_impl.WheelScheduler(loop, clock_slack_s=1).clock_slack_s == 1.0
        for huge in (1.001, 1e300, 2**64):
            with pytest.raises(ValueError, match=r"clock_slack_s must be in \[0, 1.0\] seconds, got " + re.escape(repr(huge))):
                aio_impl.WheelScheduler(loop, clock_slack_s=huge)
    finally:
        loop.close()


def test_a_wake_up_the_loop_refuses_arms_nothing_and_leaves_the_scheduler_working(aio_impl, until):
    """In debug mode asyncio's call_at refuses a call from another thread. A handle or a key armed
    there, whose wake-up is the first, is refused with it and armed nowhere, and the scheduler keeps
    firing what its own thread arms (once, a refused wake-up left it waiting for ever)."""
    async def main():
        asyncio.get_running_loop().set_debug(True)
        sched = aio_impl.WheelScheduler()
        fired, refused = [], []
        keyed = sched.keyed(fired.append)

        def from_another_thread():
            for arm in (lambda: sched.call_later(0.001, fired.append, "thread"), lambda: keyed.arm(8, 0.001)):
                try:
                    arm()
                except RuntimeError as exc:
                    refused.append(str(exc))

        thread = threading.Thread(target=from_another_thread)
        thread.start()
        thread.join()
        assert len(refused) == 2 and all("thread" in message for message in refused)
        assert sched.active_count() == 0 and 8 not in keyed
        sched.call_later(0.01, fired.append, "loop")
        keyed.arm(7, 0.02)
        await until(lambda: len(fired) == 2)
        await asyncio.sleep(0.05)
        sched.close()
        return fired

    assert asyncio.run(main()) == ["loop", 7]


class _CountingLoop:
    """Forwards to a real loop and counts call_at, to see how often the wake-up is armed."""
    def __init__(self, loop):
        self._loop = loop
        self.call_at_count = 0
    def time(self):
        return self._loop.time()
    def call_at(self, *args, **kwargs):
        self.call_at_count += 1
        return self._loop.call_at(*args, **kwargs)
    def call_exception_handler(self, context):
        self._loop.call_exception_handler(context)


def test_one_wakeup_armed_not_one_per_timer(new_loop, aio_impl):
    """1000 timers armed in increasing-deadline order, then rescheduled later (the idle-timeout
    pattern), arm the loop's wake-up once; a timer due earlier than it moves it once more."""
    loop = new_loop()
    try:
        counting = _CountingLoop(loop)
        sched = aio_impl.WheelScheduler(counting)
        handles = [sched.call_later(1.0 + i * 0.001, lambda: None) for i in range(1000)]
        for h in handles:
            h.reschedule(5.0)
        assert counting.call_at_count == 1
        sched.call_later(0.1, lambda: None)  # earlier than the wake-up at ~1 s
        assert counting.call_at_count == 2
        sched.close()
    finally:
        loop.close()


def test_close_drops_pending_handles(aio_run, until):
    """close() cancels every pending handle (none runs, each reports cancelled()), is idempotent,
    and later arming raises RuntimeError (re-arming a dropped handle returns False); closing
    from inside a callback stops the batch."""
    async def main(sched, loop):
        ran = []
        when = loop.time() + 0.005
        sched.call_at(when, lambda: (ran.append("closer"), sched.close()))
        handles = [sched.call_at(when, ran.append, i) for i in range(5)]
        handles += [sched.call_later(0.05, ran.append, "late")]
        await until(lambda: ran)
        await asyncio.sleep(0.08)
        sched.close()
        with pytest.raises(RuntimeError, match="closed"):
            sched.call_later(0.01, ran.append, "x")
        assert handles[-1].reschedule(0.01) is False
        return ran, handles
    ran, handles = aio_run(main)
    assert ran == ["closer"]
    assert all(h.cancelled() for h in handles) and len(handles) == 6


@pytest.mark.parametrize("delay, exc", [
    ("1", TypeError), (None, TypeError), (True, TypeError), (b"1", TypeError),
    (float("nan"), ValueError), (float("inf"), ValueError), (-float("inf"), ValueError),
    (1e300, ValueError), (10**400, ValueError),
])
def test_bad_delay_is_refused(aio_run, delay, exc):
    """A delay that is not a finite real number of seconds, or out of the wheel's range, is
    refused with an exception naming it, and nothing is armed."""
    async def main(sched, loop):
        with pytest.raises(exc, match="delay|range"):
            sched.call_later(delay, print)
        handle = sched.call_later(1.0, print)
        with pytest.raises(exc, match="delay|range"):
            handle.reschedule(delay)
        handle.cancel()
        return sched.active_count()
    assert aio_run(main) == 0


def test_bad_callback_is_refused(aio_run):
    """A non-callable or a coroutine function is refused with TypeError, as asyncio's debug mode."""
    async def main(sched, loop):
        async def coro():
            pass
        with pytest.raises(TypeError, match="callable"):
            sched.call_later(0.01, 42)
        with pytest.raises(TypeError, match="coroutine"):
            sched.call_later(0.01, coro)
        return sched.active_count()
    assert aio_run(main) == 0


def test_handle_mirrors_timerhandle(aio_run, aio_impl):
    """WheelHandle has TimerHandle's cancel/cancelled/when and the scheduler needs no loop arg
    inside a running loop."""
    async def main(sched, loop):
        default = aio_impl.WheelScheduler()
        h = default.call_later(0.2, print)
        assert isinstance(h, aio_impl.WheelHandle) and not h.cancelled()
        assert abs(h.when() - (loop.time() + 0.2)) < 0.1
        h.cancel()
        h.cancel()
        assert h.cancelled() and default.active_count() == 0
        numpy = pytest.importorskip("numpy")
        default.call_later(numpy.int64(1), print).cancel()  # any real number, as asyncio
        default.close()
        return True
    assert aio_run(main)


def test_scheduler_needs_a_loop(aio_impl):
    """Without a running loop and without loop=, construction fails like asyncio.get_running_loop."""
    with pytest.raises(RuntimeError):
        aio_impl.WheelScheduler()


def test_keyboard_interrupt_in_a_callback_loses_no_timer(aio_impl, until):
    """A KeyboardInterrupt escaping a callback propagates (asyncio's rule) and the handles that
    were due in the same batch still run afterwards: none is lost. Default loop only."""
    loop = asyncio.new_event_loop()
    try:
        sched = aio_impl.WheelScheduler(loop)
        ran = []
        def interrupt():
            raise KeyboardInterrupt
        when = loop.time() + 0.005
        sched.call_at(when, interrupt)
        for i in range(3):
            sched.call_at(when, ran.append, i)
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(asyncio.sleep(1.0))
        assert ran == [] and sched.active_count() == 3
        async def wait():
            await until(lambda: len(ran) == 3)
        loop.run_until_complete(wait())
        assert ran == [0, 1, 2]
    finally:
        loop.close()


def test_a_fire_batch_rearms_the_wakeup_once(new_loop, aio_impl, until):
    """100 callbacks due together, each arming a new timer, end their batch with exactly one
    new wake-up, not one per callback."""
    loop = new_loop()
    try:
        counting = _CountingLoop(loop)
        sched = aio_impl.WheelScheduler(counting)
        ran = []
        when = loop.time() + 0.01
        for i in range(100):
            sched.call_at(when, lambda i=i: (ran.append(i), sched.call_later(1.0 + i * 0.001, ran.append, -i)))
        assert counting.call_at_count == 1
        async def wait():
            await until(lambda: len(ran) == 100)
        loop.run_until_complete(wait())
        assert ran == list(range(100)) and sched.active_count() == 100
        assert counting.call_at_count == 2
        sched.close()
    finally:
        loop.close()


def test_close_from_a_callback_skips_the_rest_of_the_batch_quietly(aio_impl):
    """``close()`` is safe from inside a callback: the rest of the batch does not run, and the
    loop's exception handler hears nothing (no callback runs with its callable cleared). Both
    callbacks share one due time (same call_at), so they are always in one batch; the 100 ms
    sleep is a generous liveness bound for a 20 ms timer."""

    async def main():
        loop = asyncio.get_running_loop()
        errors = []
        loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        sched = aio_impl.WheelScheduler()
        ran = []
        when = loop.time() + 0.02
        sched.call_at(when, lambda: (ran.append(1), sched.close()))
        sched.call_at(when, lambda: ran.append(2))
        await asyncio.sleep(0.1)
        return ran, errors

    ran, errors = asyncio.run(main())
    assert ran == [1], "the first callback did not run: the test proved nothing"
    assert errors == [], [ctx.get("message") for ctx in errors]


class _HandLoop:
    """A loop whose clock moves only by ``run_to``: on time (each wake-up at its own time) or
    late (the clock jumps first, then every due wake-up runs)."""
    def __init__(self):
        self.now = 100.0
        self._timers = []
    def time(self):
        return self.now
    def call_at(self, when, callback, *args):
        entry = [when, len(self._timers), callback]
        self._timers.append(entry)
        return _Dropped(entry)
    def call_exception_handler(self, context):
        raise AssertionError(context)
    def run_to(self, when, *, late=False):
        if late:
            self.now = when
        while True:
            due = sorted(t for t in self._timers if t[2] is not None and t[0] <= when)
            if not due:
                break
            self._timers.remove(due[0])
            self.now = max(self.now, due[0][0])
            due[0][2]()
        self.now = when


class _Dropped:
    def __init__(self, entry):
        self._entry = entry
    def cancel(self):
        self._entry[2] = None


def test_rearmed_later_runs_by_its_new_deadline_on_time_and_on_a_late_loop(aio_impl):
    """A handle and a key re-armed to a later deadline keep their earlier wheel entry, which is
    re-filed when it comes due: on a loop that keeps time, nothing runs at the old deadline and
    each runs once, at its new one; on a loop that wakes once after every deadline, they still
    run in due order (after the timers due between their old and new deadlines). Deterministic:
    the loop's clock moves by hand."""
    loop = _HandLoop()
    sched = aio_impl.WheelScheduler(loop)
    ran = []
    keys = sched.keyed(lambda key: ran.append((key, loop.now)))
    a = sched.call_later(1.0, lambda: ran.append(("a", loop.now)))
    keys.arm(1, 1.0)
    assert a.reschedule(3.0) is True and keys.arm(1, 3.0) is None
    loop.run_to(102.0)
    assert ran == [] and sched.active_count() == 1 and len(keys) == 1  # the old entry came due
    loop.run_to(110.0)
    assert [name for name, _ in ran] == ["a", 1] and all(at >= 103.0 for _, at in ran)

    ran.clear()
    a = sched.call_later(1.0, lambda: ran.append(("a", loop.now)))
    sched.call_later(2.0, lambda: ran.append(("b", loop.now)))
    keys.arm(1, 1.0)
    keys.arm(2, 2.0)
    assert a.reschedule(3.0) is True and keys.arm(1, 3.0) is None
    loop.run_to(120.0, late=True)
    assert [name for name, _ in ran] == ["b", "a", 2, 1]
    assert sched.active_count() == 0 and len(keys) == 0
    sched.close()

"""timerwheel_c.aio.EventLoop behaves as asyncio's own loop where real code and test suites look at
its timers: a deadline already due, a patched or virtual clock, a patch of the loop's class, NaN,
``loop._scheduled`` and handle order, and the slow-callback logger. On both twins of the timer
store (``new_wheel_loop``); where the property is "as asyncio", the same code runs on asyncio's
own loop beside it and both must agree.

No test sleeps for a deadline: a due-now timer needs no time to pass, and the patched clocks are
driven by hand. Each run that a timer never firing would hang is stopped after LIVENESS_S of real
time by a thread (a patched clock cannot bound it), so it fails instead.
"""
from __future__ import annotations

import asyncio
import time
import types
import math
import sys
import threading
from unittest import mock

import pytest
from conftest import LIVENESS_S


def _run_bounded(loop, coro):
    """``loop.run_until_complete(coro)``, stopped from a thread after LIVENESS_S of real time
    (RuntimeError: the loop stopped before the coroutine completed)."""
    watchdog = threading.Timer(LIVENESS_S, loop.call_soon_threadsafe, (loop.stop,))
    watchdog.start()
    try:
        return loop.run_until_complete(coro)
    finally:
        watchdog.cancel()


def _order_of_due_timers(loop):
    """The run order of callbacks a callback schedules: two call_soon chains, and timers already
    due (call_later(0), call_later(-1), call_at(loop.time())) armed between them."""
    order = []

    def chain(name, left):
        order.append(name)
        if left:
            loop.call_soon(chain, name + "'", left - 1)

    def start():
        loop.call_soon(chain, "soon", 3)
        loop.call_later(0, order.append, "later(0)")
        loop.call_later(-1, order.append, "later(-1)")
        loop.call_at(loop.time(), order.append, "at(now)")
        loop.call_soon(chain, "soon2", 3)
        loop.call_later(3600, order.append, "never")

    async def main():
        loop.call_soon(start)
        while len(order) < 11:
            await asyncio.sleep(0)

    _run_bounded(loop, main())
    return order


def test_a_timer_already_due_runs_at_the_next_iteration_as_on_asyncio(new_wheel_loop):
    """call_later(0), call_later(-1) and call_at(loop.time()) run at the next iteration, after
    the callbacks already ready and before what those queue, in deadline order: the same order
    as on asyncio's loop (where the timers are due at once), not at the end of the current ms."""
    reference = asyncio.new_event_loop()
    try:
        expected = _order_of_due_timers(reference)
    finally:
        reference.close()
    assert expected[:5] == ["soon", "soon2", "later(-1)", "later(0)", "at(now)"]  # the test's premise
    assert _order_of_due_timers(new_wheel_loop()) == expected


def _order_of_deadlines_passed_since_the_last_iteration(loop):
    """On a clock driven by hand: an iteration at 100.0, then a callback moves the clock to 100.5
    and arms deadlines it has already passed (100.3, 100.2, each in a ms after the last
    iteration's) and a call_later(0), between two call_soon chains. Returns the run order."""
    clock = [100.0]
    order = []

    def chain(name, left):
        order.append(name)
        if left:
            loop.call_soon(chain, name + "'", left - 1)

    def start():
        clock[0] = 100.5
        loop.call_soon(chain, "soon", 2)
        loop.call_at(100.3, order.append, "at(100.3)")
        loop.call_later(0, order.append, "later(0)")
        loop.call_at(100.2, order.append, "at(100.2)")
        loop.call_soon(chain, "soon2", 2)

    async def main():
        await asyncio.sleep(0)  # an iteration at 100.0: the wheel's now
        loop.call_soon(start)
        while len(order) < 9:
            await asyncio.sleep(0)

    with mock.patch.object(loop, "time", lambda: clock[0]):
        _run_bounded(loop, main())
    return order


def test_deadlines_passed_since_the_last_iteration_run_at_the_next_one_as_on_asyncio(new_wheel_loop):
    """A deadline the clock passed after the last iteration, in a later ms than that iteration's,
    is due at once as a call_later(0) is: all run at the next iteration, in deadline order, after
    the callbacks already ready and before what those queue, as on asyncio's loop (call_at files
    such a deadline in its ms without reading the clock)."""
    reference = asyncio.new_event_loop()
    try:
        expected = _order_of_deadlines_passed_since_the_last_iteration(reference)
    finally:
        reference.close()
    assert expected[:5] == ["soon", "soon2", "at(100.2)", "at(100.3)", "later(0)"]  # the premise
    assert _order_of_deadlines_passed_since_the_last_iteration(new_wheel_loop()) == expected


def test_a_due_timer_overtakes_a_busy_call_soon_chain(new_wheel_loop):
    """A callback that keeps re-queueing itself (a busy loop) lets a call_later(0) armed beside it
    run at the next iteration: after one more turn of the chain, not after a ms of turns."""
    loop = new_wheel_loop()
    turns = []

    def spin():
        turns.append(None)
        if len(turns) < 100_000:
            loop.call_soon(spin)

    def due():
        loop.stop()
        turns.append("due")

    loop.call_soon(spin)
    loop.call_soon(loop.call_later, 0, due)
    loop.run_forever()
    assert turns.index("due") <= 3


def _order_within_one_ms(loop):
    """On a clock driven by hand: a timer due later in the current ms, then the clock passing its
    deadline, then a call_later(0); another timer later in the same ms. Returns the run order,
    with the clock reading at each run."""
    clock = [100.0]
    order = []

    def run(name):
        order.append((name, clock[0]))

    async def turns(n):
        for _ in range(n):
            await asyncio.sleep(0)

    async def main():
        loop.call_at(100.0003, run, "at 100.0003")
        loop.call_at(100.0007, run, "at 100.0007")
        await turns(3)
        clock[0] = 100.0005
        loop.call_later(0, run, "later(0) at 100.0005")
        await turns(3)
        clock[0] = 100.0007
        await turns(3)

    with mock.patch.object(loop, "time", lambda: clock[0]):
        _run_bounded(loop, main())
    return order


def test_timers_of_the_current_ms_run_when_due_in_deadline_order_as_on_asyncio(new_wheel_loop):
    """Every timer whose deadline is at or before loop.time() runs at the next iteration, even
    within the current ms, and never one before its deadline: a timer due at 100.0003 runs before
    a call_later(0) made at 100.0005 (deadline order), and one due at 100.0007 runs only once the
    clock reads 100.0007: the order and clock readings of asyncio's loop."""
    reference = asyncio.new_event_loop()
    try:
        expected = _order_within_one_ms(reference)
    finally:
        reference.close()
    assert [name for name, _ in expected] == ["at 100.0003", "later(0) at 100.0005", "at 100.0007"]
    assert _order_within_one_ms(new_wheel_loop()) == expected


def test_a_timer_made_due_by_a_clock_that_then_went_back_holds_back_no_sooner_timer(new_wheel_loop):
    """call_later(0) while loop.time reads far ahead (a patch, undone at once) is due at that far
    time once the clock is back, as on asyncio's heap; it must not hold back a sleep due sooner,
    which ends, and the far one does not run. The far time is 100 x the liveness bound the run is
    stopped after, so a loop that slept until it fails."""
    async def main(loop, fired):
        ahead = loop.time() + 100 * LIVENESS_S
        with mock.patch.object(loop, "time", return_value=ahead):
            loop.call_later(0, fired.append, "ahead")
        await asyncio.sleep(0.01)

    for loop in (asyncio.new_event_loop(), new_wheel_loop()):
        fired: list = []
        try:
            _run_bounded(loop, main(loop, fired))
            assert fired == [], type(loop)
        finally:
            loop.close()


_CLOCK_PATCHES = {
    "loop.time": lambda loop, clock: mock.patch.object(loop, "time", lambda: clock[0]),
    "time.monotonic": lambda loop, clock: mock.patch("time.monotonic", lambda: clock[0]),
    # what asyncio's own loop reads through its classes and its module's global: tests patch these
    "BaseEventLoop.time": lambda loop, clock: mock.patch.object(asyncio.BaseEventLoop, "time", lambda self: clock[0]),
    "SelectorEventLoop.time": lambda loop, clock: mock.patch.object(
        asyncio.SelectorEventLoop, "time", mock.Mock(side_effect=lambda: clock[0])),  # a Mock: called unbound
    "asyncio.base_events.time": lambda loop, clock: mock.patch(
        "asyncio.base_events.time", types.SimpleNamespace(monotonic=lambda: clock[0])),
}


@pytest.mark.parametrize("target", list(_CLOCK_PATCHES))
def test_a_patched_clock_moves_the_timers_as_on_asyncio(new_wheel_loop, target):
    """With loop.time (on the instance), time.monotonic, asyncio's loop classes' time or
    asyncio.base_events' time module patched to a clock driven by hand that starts at 0 (far
    before the real monotonic clock the wheel started at), asyncio.sleep(3600) ends once the
    clock is moved 3600 s on, and never before: the loop reads the patched clock, as asyncio's
    loop does, and its wheel follows the clock back."""
    loop = new_wheel_loop()
    clock = [0.0]
    woke = []

    async def sleeper():
        await asyncio.sleep(3600)
        woke.append(loop.time())

    async def main():
        task = loop.create_task(sleeper())
        for _ in range(5):
            await asyncio.sleep(0)
        clock[0] = 3599.999
        for _ in range(5):
            await asyncio.sleep(0)
        assert not woke  # never early
        clock[0] = 3600.5
        await task

    with _CLOCK_PATCHES[target](loop, clock):
        assert loop.time() == 0.0
        _run_bounded(loop, main())
    assert woke == [3600.5]
    # The patch gone, the real clock again: bracketed by it, for 3600.5 may lie on either side of the
    # real monotonic clock (a machine up for less than an hour is behind it).
    before = time.monotonic()
    now = loop.time()
    assert before <= now <= time.monotonic()


def test_freezegun_real_asyncio_keeps_the_loop_on_the_real_clock(new_wheel_loop):
    """freezegun's ``freeze_time(real_asyncio=True)`` freezes time.monotonic and sets the real
    clock as ``time`` on ``type(asyncio.new_event_loop())``, asyncio's selector loop class when no
    policy is installed: EventLoop, derived from it, follows that, so asyncio.sleep ends (with
    time.monotonic frozen alone it would never end, on either loop)."""
    real = time.monotonic
    loop = new_wheel_loop()
    probe = asyncio.new_event_loop()
    probe.close()
    with mock.patch("time.monotonic", lambda: 1000.0), \
            mock.patch.object(type(probe), "time", lambda self: real()):
        start = loop.time()
        assert start == pytest.approx(real(), abs=5.0)
        _run_bounded(loop, asyncio.sleep(0.05))
        assert loop.time() - start >= 0.05


@pytest.mark.skipif(sys.version_info < (3, 11), reason="looptime needs Python 3.11+ (the test extra installs it there only)")
def test_looptime_fast_forwards_the_event_loop_as_asyncio_loop():
    """looptime (a virtual clock that subclasses the loop's class at run time and moves time in
    its select) makes asyncio.sleep(3600) end at once, at loop time 3600, on EventLoop as on
    asyncio's loop."""
    import looptime
    from timerwheel_c.loop import EventLoop

    async def main(loop):
        start = loop.time()
        await asyncio.sleep(3600)
        return loop.time() - start

    for make in (asyncio.new_event_loop, EventLoop):
        loop = looptime.patch_event_loop(make(), start=0)
        try:
            assert loop.looptime_on, make  # patching enables it
            slept = _run_bounded(loop, main(loop))
            assert 3600 <= slept < 3600.01, make
        finally:
            loop.close()


def test_a_deadline_within_the_clock_resolution_is_due_as_on_asyncio_loop(new_wheel_loop):
    """A deadline after loop.time() by less than loop._clock_resolution, in the same ms, runs at
    that iteration, as asyncio's _run_once moves every timer before time() + _clock_resolution: a
    clock moved by hand to 0.3 runs call_at(0.1 + 0.2) (0.30000000000000004), where it waited for
    the clock to move again; one due a resolution later waits, on both loops. A resolution of 0
    runs neither."""
    def iterate(loop):
        loop.call_soon(loop.stop)
        loop.run_forever()

    def check(loop):
        clock = [0.1]
        ran = []
        with mock.patch.object(loop, "time", lambda: clock[0]):
            loop.call_at(0.1 + 0.2, ran.append, "sum")
            loop.call_at(0.3 + loop._clock_resolution, ran.append, "a resolution later")
            clock[0] = 0.3
            iterate(loop)
            assert ran == ["sum"], loop
            loop._clock_resolution = 0.0
            loop.call_at(math.nextafter(0.3, 1.0), ran.append, "1 ulp")
            iterate(loop)
            assert ran == ["sum"], loop
            clock[0] = 0.301
            iterate(loop)
            assert ran == ["sum", "1 ulp", "a resolution later"], loop

    for loop in (asyncio.new_event_loop(), new_wheel_loop()):
        try:
            check(loop)
        finally:
            loop.close()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="looptime needs Python 3.11+ (the test extra installs it there only)")
def test_looptime_ends_sleeps_at_the_loop_time_asyncio_loop_ends_them(new_wheel_loop):
    """Under looptime, whose clock moves in whole 1 us ticks, sleeps of 0.1 s then 0.2 s end at loop
    time 0.3 and another 0.7 s at 1.0, exactly, as on asyncio's loop; the second sleep's deadline
    0.1 + 0.2 lies 1 ulp past 0.3, and each such sleep ended a tick late (0.300001, 1.000002)."""
    import looptime

    async def main(loop):
        await asyncio.sleep(0.1)
        await asyncio.sleep(0.2)
        first = loop.time()
        await asyncio.sleep(0.7)
        return first, loop.time()

    for make in (asyncio.new_event_loop, new_wheel_loop):
        loop = looptime.patch_event_loop(make(), start=0)
        try:
            assert _run_bounded(loop, main(loop)) == (0.3, 1.0), make
        finally:
            loop.close()


def test_a_patch_of_the_loop_class_sees_every_timer_call(new_wheel_loop):
    """time, call_later and call_at are the class's, never bound onto the instance: a patch of
    type(loop) sees every asyncio.sleep (call_later), asyncio.timeout's reschedule (call_at) and
    a patched type(loop).time moves the timers, as on asyncio's loop."""
    loop = new_wheel_loop()
    cls = type(loop)
    assert not {"time", "call_at", "call_later"} & set(vars(loop))
    seen = []

    def spy(name):
        original = getattr(cls, name)

        def method(self, *args, **kwargs):
            seen.append((name, args[0]))
            return original(self, *args, **kwargs)
        return method

    async def main():
        await asyncio.sleep(0.001)
        loop.call_at(loop.time() + 10, print).cancel()

    with mock.patch.object(cls, "call_later", spy("call_later")), mock.patch.object(cls, "call_at", spy("call_at")):
        loop.run_until_complete(main())
    assert ("call_later", 0.001) in seen
    assert any(name == "call_at" for name, _ in seen)

    clock = [0.0]
    ran = []
    with mock.patch.object(cls, "time", lambda self: clock[0]):
        loop.call_later(60, ran.append, "timer")
        loop.call_soon(clock.__setitem__, 0, 61.0)
        _run_bounded(loop, _until(lambda: ran))
    assert ran == ["timer"]


def test_a_subclass_overriding_call_at_sees_every_timer_as_on_asyncio(new_wheel_loop):
    """A subclass whose call_at records its callbacks sees call_later's, asyncio.sleep's and
    wait_for's, as asyncio's call_later, which calls self.call_at, shows a subclass of its loop."""
    def seen_on(base):
        seen = []

        class Recording(base):
            def call_at(self, when, callback, *args, context=None):
                seen.append(getattr(callback, "__name__", repr(callback)))
                return super().call_at(when, callback, *args, context=context)

        loop = Recording()
        try:
            async def main():
                loop.call_later(0.001, print)
                await asyncio.sleep(0.001)
                await asyncio.wait_for(asyncio.sleep(0), 1)

            _run_bounded(loop, main())
        finally:
            loop.close()
        return seen

    reference = asyncio.new_event_loop()
    asyncio_type = type(reference)
    reference.close()
    expected = seen_on(asyncio_type)  # wait_for's callback differs between Python versions
    assert expected[:2] == ["print", "_set_result_unless_cancelled"] and len(expected) == 3
    assert seen_on(type(new_wheel_loop())) == expected


@pytest.mark.parametrize("debug", [False, True])
def test_a_call_at_set_on_the_loop_itself_sees_call_later_as_on_asyncio(new_wheel_loop, debug):
    """mock.patch.object(loop, "call_at", wraps=...) sees call_later's and asyncio.sleep's timers,
    as asyncio's call_later, which calls self.call_at, shows it, in debug mode too; and once the
    patch is undone, call_later no longer goes through it."""
    def seen_on(loop):
        loop.set_debug(debug)
        try:
            with mock.patch.object(loop, "call_at", wraps=loop.call_at) as patched:
                async def main():
                    loop.call_later(0.001, print)
                    await asyncio.sleep(0.001)

                _run_bounded(loop, main())
                calls = patched.call_count
            loop.call_later(0.001, print)
            return calls, patched.call_count
        finally:
            loop.close()

    assert seen_on(asyncio.new_event_loop()) == (2, 2)
    assert seen_on(new_wheel_loop()) == (2, 2)


async def _until(predicate):
    while not predicate():
        await asyncio.sleep(0)


def test_nan_deadlines_behave_as_on_asyncio_loop(new_wheel_loop):
    """asyncio.sleep(nan), wait_for(x, nan), asyncio.timeout(nan) and call_later(nan) have the
    outcomes they have on asyncio's loop of this CPython, where a NaN deadline is never after the
    loop's time: the sleep returns at once, the waits expire, the callback runs at the next iteration
    with when() NaN (from 3.13, asyncio.sleep(nan) itself raises ValueError, before any loop; where
    asyncio's loop fails in its selector on a NaN timeout, EventLoop keeps its earlier outcomes).
    asyncio.timeout is 3.11+: before, the other three are compared."""
    nan = float("nan")
    has_timeout = hasattr(asyncio, "timeout")

    async def outcomes(loop):
        got = []

        async def expired(wait):
            try:
                got.append(await wait())
            except (asyncio.TimeoutError, TimeoutError, ValueError) as exc:
                got.append(type(exc).__name__)

        async def within_timeout():
            async with asyncio.timeout(nan):
                await asyncio.Event().wait()

        await expired(lambda: asyncio.sleep(nan, "slept"))
        await expired(lambda: asyncio.wait_for(asyncio.Event().wait(), nan))
        if has_timeout:
            await expired(within_timeout)
        fut = loop.create_future()
        handle = loop.call_later(nan, fut.set_result, "ran")
        got += [await fut, math.isnan(handle.when())]
        return got

    reference = asyncio.new_event_loop()
    try:
        # Bounded by a thread, not a timer: on asyncio's heap a NaN entry can sink below any other.
        expected = _run_bounded(reference, outcomes(reference))
    except ValueError:
        # Newer CPythons' epoll selector refuses the NaN timeout asyncio's own loop hands it (it rounds
        # the timeout with math.ceil): asyncio has no outcome to follow there, so EventLoop keeps the
        # one it has on earlier CPythons (from 3.13 asyncio.sleep refuses NaN itself, before any loop).
        expected = ["ValueError" if sys.version_info >= (3, 13) else "slept", "TimeoutError",
                    *(["TimeoutError"] if has_timeout else []), "ran", True]
    finally:
        reference.close()
    assert expected[-2:] == ["ran", True] and "ValueError" not in expected[1:], expected  # the case arose
    loop = new_wheel_loop()
    assert _run_bounded(loop, outcomes(loop)) == expected


def _run_order(loop, *delays):
    """The order in which timers armed in one callback with these delays run (a NaN delay
    included), each named by its delay, after a few iterations (all are due at once)."""
    order = []

    def arm():
        for delay in delays:
            loop.call_later(delay, order.append, str(delay))

    loop.call_soon(arm)
    for _ in range(4):
        loop.call_soon(loop.stop)
        loop.run_forever()
    return order


@pytest.mark.parametrize("delays", [(0, math.nan), (math.nan, 0), (-1, math.nan, 0), (0, -1, math.nan),
                                    (0, 0, math.nan), (math.nan,)], ids=str)
def test_nan_deadline_runs_in_the_place_of_its_arming_time_as_on_asyncio_loop(new_wheel_loop, delays):
    """A NaN deadline, which asyncio's heap never moves past the entries pushed before it, runs
    after the due timers armed before it and before those armed after it, as on asyncio's loop
    beside it: in the place of the loop time it was armed at, never first of all."""
    reference = asyncio.new_event_loop()
    try:
        expected = _run_order(reference, *delays)
    finally:
        reference.close()
    assert sorted(expected) == sorted(str(d) for d in delays)  # every timer ran on asyncio's loop
    assert _run_order(new_wheel_loop(), *delays) == expected


def test_nan_deadline_where_asyncio_heap_gives_no_order(new_wheel_loop):
    """Where asyncio's heap orders a NaN entry by its shape (it blocks the entries pushed below
    it, rises when a sift picks it as a right child, or waits under a later timer armed before
    it), the NaN timer still takes the place of its arming time: an earlier deadline armed after
    it runs first, an equal one armed after it runs after it, and a later timer never holds it."""
    assert _run_order(new_wheel_loop(), math.nan, -1) == ["-1", "nan"]
    assert _run_order(new_wheel_loop(), -1, 0, math.nan, 0) == ["-1", "0", "nan", "0"]
    assert _run_order(new_wheel_loop(), 3600, math.nan) == ["nan"]


def test_scheduled_is_a_read_only_view_of_the_live_handles_by_when(new_wheel_loop):
    """loop._scheduled lists the armed handles ordered by when() ([0] is the earliest, as on
    asyncio's heap), drops a cancelled one at once (asyncio's heap keeps it), and cannot be
    replaced or appended to."""
    loop = new_wheel_loop()
    assert len(loop._scheduled) == 0 and list(loop._scheduled) == []
    late = loop.call_later(30, print)
    early = loop.call_later(10, print)
    middle = loop.call_later(20, print)
    assert list(loop._scheduled) == [early, middle, late]
    assert loop._scheduled[0] is early and len(loop._scheduled) == 3
    middle.cancel()
    assert [h for h in loop._scheduled] == [early, late]
    with pytest.raises(AttributeError, match="read-only"):
        loop._scheduled = [early]
    assert not hasattr(loop._scheduled, "append")
    loop.close()
    assert len(loop._scheduled) == 0


def test_handles_have_asyncio_when_and_scheduled_for_the_code_that_reads_the_heap(new_wheel_loop):
    """The idle check of test helpers, ``loop._scheduled[0]._when - loop.time()``, reads the same
    on both loops; ``_scheduled`` is True while the handle is on the heap (armed), False once run
    or cancelled, as asyncio's flag reads once its heap drops the handle."""
    for loop in (asyncio.new_event_loop(), new_wheel_loop()):
        try:
            early = loop.call_later(5, print)
            loop.call_later(10, print)
            assert loop._scheduled[0]._when == early.when() and 4 < loop._scheduled[0]._when - loop.time() <= 5
            assert early._scheduled is True
            ran = loop.call_later(0, print)
            loop.run_until_complete(asyncio.sleep(0.01))
            assert ran._scheduled is False and ran._when == ran.when()
            early.cancel()
            loop.run_until_complete(asyncio.sleep(0))
            assert early not in list(loop._scheduled), type(loop)
        finally:
            loop.close()


def test_timer_cancelled_count_counts_the_cancelled_handles_scheduled_lists(new_wheel_loop):
    """loop._timer_cancelled_count counts the cancelled handles loop._scheduled holds, as on
    asyncio's loop beside it (there some, kept on the heap; here none, the wheel drops them), so
    ``len(_scheduled) - _timer_cancelled_count`` is the live timers on both; a count that would
    disagree with the view cannot be set."""
    reference = asyncio.new_event_loop()
    loop = new_wheel_loop()
    try:
        for each in (reference, loop):
            handles = [each.call_later(delay, print) for delay in (10, 20, 30, 40)]
            handles[1].cancel()
            handles[3].cancel()
            handles[3].cancel()  # a second cancel counts once
            each.call_soon(each.stop)
            each.run_forever()  # an iteration: asyncio's sweeps only the heap's top
            held = [h for h in each._scheduled if h.cancelled()]
            assert each._timer_cancelled_count == len(held), each
            assert len(each._scheduled) - each._timer_cancelled_count == 2, each
        assert reference._timer_cancelled_count == 2  # the case arose: asyncio's heap holds them
        loop._timer_cancelled_count = 0  # what asyncio's __init__ sets
        with pytest.raises(AttributeError, match="not 5"):
            loop._timer_cancelled_count = 5
        assert loop._timer_cancelled_count == 0
    finally:
        reference.close()


def test_handles_order_and_compare_as_asyncio_timer_handles(new_wheel_loop):
    """Handles order by when() (<, <=, >, >=, sorted, heapq), are equal and hash as asyncio's
    TimerHandle (same deadline, callback, arguments and state), and refuse to order against
    anything else with TypeError."""
    loop = new_wheel_loop()
    a = loop.call_at(100.0, print, 1)
    b = loop.call_at(200.0, print, 1)
    same = loop.call_at(100.0, print, 1)
    assert a < b and a <= b and b > a and b >= a and not b < a and not a > b
    assert a <= same and a >= same and a == same and hash(a) == hash(same) == hash(100.0)
    assert a != b and sorted([b, a]) == [a, b]
    same.cancel()
    assert a != same
    with pytest.raises(TypeError):
        a < 1  # noqa: B015
    reference = asyncio.TimerHandle(100.0, print, (1,), asyncio.new_event_loop())
    reference._loop.close()
    assert (reference < asyncio.TimerHandle(200.0, print, (1,), reference._loop)) == (a < b)


def test_slow_callback_warning_goes_through_asyncio_base_events_logger(new_wheel_loop):
    """In debug mode a slow callback is reported through the module global
    asyncio.base_events.logger, looked up at the report as asyncio's _run_once does, so a test
    that replaces it (CPython's test_base_events test_log_slow_callbacks) sees the report."""
    loop = new_wheel_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = 0.0

    def stop_loop_cb():
        loop.stop()

    with mock.patch("asyncio.base_events.logger") as logger:
        loop.call_soon(stop_loop_cb)
        loop.run_forever()
    fmt, *args = logger.warning.call_args[0]
    assert "stop_loop_cb" in fmt % tuple(args) and (fmt % tuple(args)).startswith("Executing <Handle")


def test_a_handle_made_without_the_loop_raises_and_never_crashes(new_wheel_loop):
    """A handle made with ``__new__`` (a library or a fuzzer bypassing the constructor) belongs to no
    loop: each method that reaches the loop raises AttributeError, as asyncio's and the pure twin's do,
    where the compiled handle read through a NULL store and crashed the process."""
    loop = new_wheel_loop()
    handle = loop.call_later(10, print)
    bare = type(handle).__new__(type(handle))
    for use in (bare._run, lambda: bare._loop, bare.cancel, lambda: repr(bare)):
        with pytest.raises(AttributeError):
            use()
    handle.cancel()

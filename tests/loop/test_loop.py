"""timerwheel_c.aio.EventLoop: asyncio's loop with every timer on the wheel, on both twins of
its timer store (``loop_impl``). CPython's own asyncio suites run on it separately
(tests/conformance/asyncio_conformance.py, through test_loop_conformance.py); these prove the properties the
wheel adds or could break: never early, asyncio's order, cancel frees at once, the handle's API.

No test asserts a speed or a lateness number: the properties hold on a loaded machine.
"""
from __future__ import annotations

import asyncio
import contextvars
import gc
import logging
import math
import os
import sys
import time
import weakref
from asyncio import base_events
from unittest import mock

import pytest

import timerwheel_c.aio as aio
from timerwheel_c.loop import EventLoop


def test_every_asyncio_timer_is_armed_on_the_wheel(new_wheel_loop):
    """asyncio.sleep, wait_for, asyncio.timeout (3.11+) and a stream read's timeout each arm a
    timer the store counts, and nothing lands on asyncio's heap (loop._scheduled, its view of the
    wheel, lists no asyncio.TimerHandle)."""
    loop = new_wheel_loop()
    seen = []

    async def main():
        timers = loop._timers
        sleeper = asyncio.ensure_future(asyncio.sleep(10))
        await asyncio.sleep(0)
        seen.append(("sleep", timers.active_count()))
        sleeper.cancel()
        waiter = asyncio.ensure_future(asyncio.wait_for(asyncio.Event().wait(), 10))
        await asyncio.sleep(0)
        seen.append(("wait_for", timers.active_count()))
        waiter.cancel()
        if sys.version_info >= (3, 11):
            async with asyncio.timeout(10) as cm:
                cm.reschedule(loop.time() + 20)
                seen.append(("timeout", timers.active_count()))
        await asyncio.sleep(0)
        seen.append(("heap", sum(isinstance(h, asyncio.TimerHandle) for h in loop._scheduled)))

    loop.run_until_complete(main())
    counts = dict(seen)
    assert counts["sleep"] >= 1 and counts["wait_for"] >= 1
    assert counts.get("timeout", 1) >= 1
    assert counts["heap"] == 0


def test_timers_never_run_before_their_deadline_on_loop_time(new_wheel_loop):
    """Each of 300 timers, at delays spread over 0-30 ms (many sharing a ms, some at 0 and below),
    finds loop.time() strictly past its when() when its callback runs; all of them run."""
    loop = new_wheel_loop()
    ran = []

    def check(handle_box):
        ran.append(loop.time() - handle_box[0].when())

    async def main():
        for i in range(300):
            box = []
            box.append(loop.call_later((i % 31) / 1000.0 - 0.002 + (i % 7) * 1e-4, check, box))
        while len(ran) < 300:
            await asyncio.sleep(0.005)

    loop.run_until_complete(asyncio.wait_for(main(), 10))
    assert len(ran) == 300
    assert min(ran) > 0


def test_due_timers_run_in_deadline_order_equal_deadlines_in_scheduling_order(new_wheel_loop):
    """Timers armed out of deadline order, several per ms and several per deadline, all due by the
    time a blocking callback returns, run in one iteration sorted by when(), ties in the order they
    were scheduled: the order asyncio's heap gives."""
    loop = new_wheel_loop()
    order = []
    base = loop.time() + 0.002
    whens = [base + 0.0007, base, base + 0.0003, base, base + 0.0031, base + 0.0003, base - 0.5, base]
    for i, when in enumerate(whens):
        loop.call_at(when, order.append, i)
    loop.call_soon(time.sleep, 0.02)  # everything is due when it returns
    loop.call_later(0.03, loop.stop)
    loop.run_forever()
    expected = sorted(range(len(whens)), key=lambda i: (whens[i], i))
    assert order == expected


def _callback_script(loop):
    """Timers and call_soon callbacks interleaved; returns the order the callbacks ran in."""
    log = []

    def timer(name, soon):
        log.append(name)
        if soon:
            loop.call_soon(log.append, soon)

    def block():
        # The timers are armed here, in the loop's first iteration, so none can be due before the
        # next one, whatever the machine's load: then all are (the sleep passes every deadline).
        log.append("block")
        # call_later first, then the time the call_at deadlines count from: a stall of the machine
        # between two of these calls (up to 0.19 s, under valgrind or a loaded CI) moves no deadline
        # past another, and the order is the same on both loops.
        loop.call_later(0.200, timer, "t-later", "soon-from-t-later")
        t = loop.time()
        loop.call_at(t + 0.300, timer, "t2", "soon-from-t2")
        loop.call_at(t + 0.010, timer, "t1", "soon-from-t1")
        loop.call_at(t + 0.320, timer, "t3", None)  # no tie: asyncio's heap keeps no order among ties
        loop.call_soon(log.append, "soon-from-block")
        # The last timer due stops the loop after everything, however stalled the machine: it fires
        # last in the next iteration, so its call_soon(stop) queues behind what the others queued.
        loop.call_at(t + 0.340, loop.call_soon, loop.stop)
        time.sleep(0.4)

    loop.call_soon(block)
    loop.run_forever()
    return log


def test_call_soon_inside_a_timer_callback_runs_in_asyncio_order(new_wheel_loop):
    """The same script of timers that call_soon, run on asyncio's default loop and on EventLoop,
    logs the same order: due timers run after what was already ready, and what they schedule runs
    on the next iteration."""
    default = asyncio.new_event_loop()
    try:
        expected = _callback_script(default)
    finally:
        default.close()
    assert expected.index("soon-from-block") < expected.index("t1")  # the premise: one batch after block
    assert {"t3", "soon-from-t1", "soon-from-t2", "soon-from-t-later"} <= set(expected)  # and all ran
    assert _callback_script(new_wheel_loop()) == expected


def test_cancel_frees_the_timer_at_once(new_wheel_loop):
    """A cancelled handle leaves the store at once (its count drops, no sweep needed) and nothing
    keeps it alive: its weak reference dies when the caller drops it."""
    loop = new_wheel_loop()
    handles = [loop.call_later(100, print) for _ in range(1000)]
    assert loop._timers.active_count() == 1000
    for h in handles[:600]:
        h.cancel()
    assert loop._timers.active_count() == 400
    ref = weakref.ref(handles[0])
    del h
    handles = handles[600:]
    assert ref() is None
    assert all(not h.cancelled() for h in handles)


def test_handle_answers_as_asyncio_timerhandle(new_wheel_loop):
    """when(), cancelled(), cancel() (idempotent), get_context() and repr() answer as
    asyncio.TimerHandle's; isinstance(h, asyncio.TimerHandle) is False, as documented."""
    loop = new_wheel_loop()
    ctx = contextvars.copy_context()
    h = loop.call_at(12345.5, print, "x", context=ctx)
    assert h.when() == 12345.5
    assert h.get_context() is ctx
    assert not h.cancelled()
    assert repr(h).startswith("<TimerHandle when=12345.5 print(")
    h.cancel()
    h.cancel()
    assert h.cancelled()
    assert repr(h) == "<TimerHandle cancelled when=12345.5>"
    assert not isinstance(h, asyncio.TimerHandle)
    assert isinstance(loop.call_later(1, print).get_context(), contextvars.Context)


def test_callback_runs_in_its_context(new_wheel_loop):
    """A callback runs in the context given (or copied at scheduling), as asyncio's."""
    loop = new_wheel_loop()
    var = contextvars.ContextVar("var", default="unset")
    seen = []
    var.set("scheduled")
    loop.call_later(0.001, lambda: seen.append(var.get()))
    ctx = contextvars.Context()
    ctx.run(var.set, "given")
    loop.call_later(0.001, lambda: seen.append(var.get()), context=ctx)
    var.set("later")
    loop.run_until_complete(asyncio.sleep(0.01))
    assert seen == ["scheduled", "given"]


def test_handles_armed_in_one_context_each_run_in_a_copy_of_their_own(new_wheel_loop):
    """Handles armed without a context each run in a copy of their own of the context current at
    arming, as asyncio's: a variable one callback sets is unseen by a handle armed beside it, seen
    by one the callback arms, and get_context() answers the very context the callback ran in,
    before the run, after it and after cancel()."""
    loop = new_wheel_loop()
    var = contextvars.ContextVar("var", default="unset")
    seen = []

    def cb(name, arms=None):
        seen.append((name, var.get()))
        var.set(name)
        if arms:
            handles.append(loop.call_later(0, cb, arms))

    def arm():
        return [loop.call_later(0, cb, "first", "third"), loop.call_later(0, cb, "second")]

    handles = contextvars.copy_context().run(arm)
    early = handles[0].get_context()
    cancelled = loop.call_later(0, cb, "cancelled")
    cancelled.cancel()
    done = loop.create_future()
    loop.call_later(0.001, done.set_result, None)
    loop.run_until_complete(done)
    assert seen == [("first", "unset"), ("second", "unset"), ("third", "first")]
    assert handles[0].get_context() is early and early[var] == "first"
    contexts = [h.get_context() for h in handles]
    assert [ctx[var] for ctx in contexts] == ["first", "second", "third"]
    assert all(ctx is h.get_context() for ctx, h in zip(contexts, handles))
    assert var not in cancelled.get_context() and cancelled.get_context() is cancelled.get_context()


def test_a_handle_runs_with_the_variables_of_its_arming_never_later_ones(new_wheel_loop):
    """Each handle's context holds the variables as they were at its call_later, whatever the
    arming context sets after it, as asyncio's copy at arming holds them."""
    loop = new_wheel_loop()
    var = contextvars.ContextVar("var", default="unset")
    seen = []

    def arm():
        var.set("a")
        loop.call_later(0, lambda: seen.append(var.get()))
        loop.call_later(0, lambda: seen.append(var.get()))
        var.set("b")
        loop.call_later(0, lambda: seen.append(var.get()))
        var.set("c")

    contextvars.copy_context().run(arm)
    loop.call_later(0, lambda: seen.append(var.get()))
    done = loop.create_future()
    loop.call_later(0.001, done.set_result, None)
    loop.run_until_complete(done)
    assert seen == ["a", "a", "b", "unset"]


def test_a_context_variable_outlives_its_timers_by_one_loop_iteration_at_most(new_wheel_loop):
    """What a context variable holds is freed once the last handle armed with it is gone and the
    loop has run an iteration (the store keeps the variables of the last arming until its next
    iteration), as on asyncio's loop, where the handle's copy is the only holder."""
    loop = new_wheel_loop()
    var = contextvars.ContextVar("var")

    class Payload:
        pass

    def arm():
        payload = Payload()
        var.set(payload)
        loop.call_later(30, print).cancel()
        return weakref.ref(payload)

    ref = contextvars.copy_context().run(arm)
    loop.run_until_complete(asyncio.sleep(0))
    assert ref() is None


def test_debug_mode_reports_a_slow_timer_callback_with_where_it_was_made(new_wheel_loop, caplog):
    """In debug mode a timer callback slower than slow_callback_duration is logged, as asyncio
    logs it: the handle's repr, with the file and line that scheduled it."""
    loop = new_wheel_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = 0.001

    def slow():
        time.sleep(0.01)

    h = loop.call_later(0.001, slow)
    line = sys._getframe().f_lineno - 1
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        loop.run_until_complete(asyncio.sleep(0.03))
    messages = [r.getMessage() for r in caplog.records]
    assert any("Executing <TimerHandle when=" in m and f"test_loop.py:{line}" in m for m in messages), messages
    assert h._source_traceback[-1][1] == line


def test_callback_exception_goes_to_the_loop_exception_handler(new_wheel_loop):
    """An exception in a timer callback reaches the loop's exception handler with the handle, as
    asyncio's, and the loop goes on."""
    loop = new_wheel_loop()
    got = []
    loop.set_exception_handler(lambda lp, context: got.append(context))

    def boom():
        raise ValueError("boom")

    h = loop.call_later(0.001, boom)
    loop.run_until_complete(asyncio.sleep(0.02))
    assert len(got) == 1
    assert got[0]["handle"] is h and isinstance(got[0]["exception"], ValueError)
    assert got[0]["message"].startswith("Exception in callback ")


def test_a_hook_that_replaces_asyncios_handle_run_sees_the_timer_callbacks(new_wheel_loop, monkeypatch):
    """A slow-callback hook replaces asyncio's Handle._run (aiodebug, logfire): on asyncio's loop it
    sees every timer callback, so here it is given the wheel's handles too, which it runs through
    asyncio's own _run (the handle's _context, _callback, _args, _loop); an exception there still
    reaches the loop's exception handler, and call_soon's handles go through it as before."""
    original = asyncio.events.Handle._run
    seen = []

    def hook(handle):
        seen.append((type(handle).__name__, getattr(handle._callback, "__name__", None)))
        return original(handle)

    monkeypatch.setattr(asyncio.events.Handle, "_run", hook)
    loop = new_wheel_loop()
    errors, ran = [], []
    loop.set_exception_handler(lambda lp, context: errors.append(context))
    var = contextvars.ContextVar("var", default="unset")

    def on_time():
        ran.append(var.get())

    def boom():
        raise ValueError("boom")

    var.set("armed")
    h = loop.call_later(0.001, on_time)
    bad = loop.call_later(0.002, boom)
    loop.call_soon(lambda: None)
    loop.run_until_complete(asyncio.sleep(0.01))
    assert ran == ["armed"]
    assert ("TimerHandle", "on_time") in seen and ("TimerHandle", "boom") in seen
    assert any(kind == "Handle" for kind, _ in seen)
    assert len(errors) == 1 and errors[0]["handle"] is bad and isinstance(errors[0]["exception"], ValueError)
    assert h.get_context() is h._context
    monkeypatch.undo()
    seen.clear()
    loop.call_later(0.001, on_time)
    loop.run_until_complete(asyncio.sleep(0.01))
    assert seen == [] and ran == ["armed", "armed"]


@pytest.mark.parametrize("debug", [False, True])
def test_a_failed_task_nobody_holds_is_reported_at_once_as_on_asyncios_loop(new_wheel_loop, debug):
    """A task that fails and that nobody holds is freed by reference counting as soon as the loop
    moves to its next ready callback, and its "exception was never retrieved" reaches the handler
    then, as on asyncio's loop (CPython's test_futures2). On 3.12, a ready handle run through a
    helper function kept the task alive through its traceback, in debug mode, until the cyclic
    collector ran."""
    loop = new_wheel_loop()
    loop.set_debug(debug)
    name = contextvars.ContextVar("name", default="foo")
    seen = []
    loop.set_exception_handler(lambda lp, context: seen.append((name.get(), context["message"])))

    async def failing() -> None:
        name.set("bar")
        raise ZeroDivisionError("never retrieved")

    async def main() -> list:
        asyncio.ensure_future(failing())
        await asyncio.sleep(0)
        return list(seen)

    gc.disable()
    try:
        # In the task's context from 3.12 on (CPython gh-96704); before, the loop's.
        context = "bar" if sys.version_info >= (3, 12) else "foo"
        assert loop.run_until_complete(main()) == [(context, "Task exception was never retrieved")]
    finally:
        gc.enable()


def test_the_run_loop_cannot_be_replaced_on_the_class_as_nest_asyncio_does(new_wheel_loop):
    """nest_asyncio's apply() sets its own run_forever, run_until_complete and _run_once on the
    loop's class, whose iteration pops asyncio's heap: on EventLoop the first assignment raises the
    ValueError it raises for uvloop's loop (which libraries catch), and nothing is replaced."""
    loop = new_wheel_loop()
    cls = type(loop)
    for name in ("run_forever", "run_until_complete", "_run_once"):
        before = getattr(cls, name)
        with pytest.raises(ValueError, match=f"Can't patch loop of type .*{name}"):
            setattr(cls, name, lambda self: None)
        assert getattr(cls, name) is before
    with pytest.raises(ValueError, match="run_forever"):
        EventLoop.run_forever = lambda self: None
    loop._run_once = lambda: None  # an instance's own attribute is its own
    del loop._run_once
    assert loop.run_until_complete(asyncio.sleep(0.001, "slept")) == "slept"


def test_an_event_loop_subclass_may_mix_in_an_abc_or_bring_a_metaclass_derived_from_its_own():
    """EventLoop's metaclass (which refuses a replaced run loop) derives from ABCMeta, so a subclass
    mixing in an ABC is made as for asyncio's loop, and so is one whose metaclass derives from it."""
    import abc

    from timerwheel_c.loop import EventLoopType

    class Named(abc.ABC):
        @abc.abstractmethod
        def name(self) -> str: ...

    class Mine(EventLoop, Named):
        def name(self) -> str:
            return "mine"

    class Meta(EventLoopType):
        pass

    class Other(EventLoop, metaclass=Meta):
        pass

    for cls in (Mine, Other):
        loop = cls()
        try:
            assert loop.run_until_complete(asyncio.sleep(0.001, cls.__name__)) == cls.__name__
        finally:
            loop.close()
        with pytest.raises(ValueError, match="Can't patch loop"):
            cls._run_once = lambda self: None  # type: ignore[method-assign]
    loop = Mine()
    try:
        assert isinstance(loop, Named) and loop.name() == "mine"
    finally:
        loop.close()  # left open, the collector later finalized its self-pipe socket before the loop


def test_a_hook_installed_before_the_loop_module_is_imported_sees_the_timer_callbacks():
    """A slow-callback hook that replaced asyncio's Handle._run before timerwheel_c was imported (a
    tool set up at start, functools.wraps over asyncio's) sees the wheel's timer callbacks as one set
    up after does: asyncio's own _run is known by its code, not by what was in place at import."""
    import subprocess

    script = """
import asyncio, functools
original = asyncio.events.Handle._run
seen = []
@functools.wraps(original)
def hook(handle):
    seen.append(type(handle).__name__)
    return original(handle)
asyncio.events.Handle._run = hook
import timerwheel_c.aio
timerwheel_c.aio.run(asyncio.sleep(0.001))
print(sorted(set(seen)))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    assert "TimerHandle" in out.stdout, out.stdout


@pytest.mark.parametrize("method, value, error, match", [
    ("call_later", None, TypeError, "delay must not be None"),
    ("call_at", None, TypeError, "when cannot be None"),
    ("call_later", "5", TypeError, "delay must be a real number of seconds, got '5'"),
    ("call_at", 1j, TypeError, r"when must be a real number of seconds, got 1j"),
    ("call_later", __import__("decimal").Decimal("0.5"), TypeError, r"got Decimal\('0.5'\)"),
])
def test_bad_deadlines_are_refused_by_name(new_wheel_loop, method, value, error, match):
    """A None or non-number deadline raises a specific error naming it; nothing is armed."""
    loop = new_wheel_loop()
    with pytest.raises(error, match=match):
        getattr(loop, method)(value, print)
    assert loop._timers.active_count() == 0


def test_a_delay_asyncio_adds_to_its_clock_is_taken_in_debug_mode_and_out(new_wheel_loop):
    """What ``loop.time() + delay`` takes on asyncio's loop (a numpy 0-d array, a numpy bool, an
    object with ``__radd__``) arms a timer here too, in debug mode and out, with the float the sum
    gives; ``asyncio.sleep`` of a 0-d array ends."""
    np = pytest.importorskip("numpy")

    class Half:
        def __radd__(self, other):
            return other + 0.5

    for debug in (False, True):
        loop = new_wheel_loop()
        loop.set_debug(debug)
        for delay, seconds in ((np.array(0.25), 0.25), (np.bool_(True), 1.0), (Half(), 0.5)):
            before = loop.time()
            handle = loop.call_later(delay, print)
            assert type(handle.when()) is float and before + seconds <= handle.when() <= loop.time() + seconds
            handle.cancel()
        loop.run_until_complete(asyncio.sleep(np.array(0.001)))


def test_a_deadline_past_the_wheel_range_is_listed_cancellable_and_never_early(new_wheel_loop):
    """Deadlines past the wheel's 2**62 ms (call_later(1e18), call_at(1e300), inf) are kept as
    asyncio's heap keeps them: listed in loop._scheduled with when() as given, the selector told
    to wait asyncio's one-day cap, cancellable. A hand-moved clock then runs each once it reaches
    its deadline and never before (inf never). An int delay beyond a float's range raises
    OverflowError, as ``loop.time() + delay`` raises it in asyncio's call_later; such an int
    deadline is inf (or -inf, due now), as asyncio's heap compares it (it raised OverflowError)."""
    loop = new_wheel_loop()
    clock = [loop.time()]
    ran = []

    def iterate():
        loop.call_soon(loop.stop)
        loop.run_forever()

    with mock.patch.object(loop, "time", lambda: clock[0]):
        within = loop.call_later(1e15, ran.append, "1e15")  # 31 million years: the wheel's top level
        past = loop.call_later(1e18, ran.append, "1e18")
        at = loop.call_at(1e300, ran.append, "1e300")
        never = loop.call_at(math.inf, ran.append, "inf")
        gone = loop.call_later(math.inf, ran.append, "inf delay")
        assert list(loop._scheduled) == [within, past, at, never, gone]
        assert (within.when(), past.when(), at.when()) == (clock[0] + 1e15, clock[0] + 1e18, 1e300)
        assert never.when() == gone.when() == math.inf
        with pytest.raises(OverflowError, match="^delay must be seconds in a float's range: int too large"):
            loop.call_later(2**1100, ran.append, "2**1100")
        huge = loop.call_at(2**1100, ran.append, "2**1100")
        assert huge.when() == math.inf
        huge.cancel()
        loop.call_at(-2**1100, ran.append, "-2**1100")
        iterate()
        assert ran == ["-2**1100"]
        ran.clear()
        assert loop._timers.select_timeout(False) == base_events.MAXIMUM_SELECT_TIMEOUT
        gone.cancel()
        assert list(loop._scheduled) == [within, past, at, never]
        iterate()
        assert ran == []
        clock[0] = math.nextafter(1e300, 0.0)  # a hair before at's deadline
        iterate()
        assert ran == ["1e15", "1e18"]
        assert loop._timers.select_timeout(False) == base_events.MAXIMUM_SELECT_TIMEOUT
        clock[0] = 1e300
        iterate()
        assert ran == ["1e15", "1e18", "1e300"]
        clock[0] = sys.float_info.max
        iterate()
        assert ran == ["1e15", "1e18", "1e300"] and list(loop._scheduled) == [never]
        assert loop._timers.select_timeout(False) == base_events.MAXIMUM_SELECT_TIMEOUT


def test_arming_on_a_closed_loop_raises_and_close_drops_every_timer(new_wheel_loop):
    """close() drops the armed timers (as asyncio's clears its heap); arming afterwards raises
    RuntimeError('Event loop is closed'), as asyncio's call_at does."""
    loop = new_wheel_loop()
    handles = [loop.call_later(1, print) for _ in range(10)]
    loop.close()
    assert loop._timers.active_count() == 0
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.call_later(1, print)
    handles[0].cancel()
    assert handles[0].cancelled()


def test_an_unclosed_loop_with_pending_timers_is_collected(new_wheel_loop):
    """A loop dropped unclosed with timers pending (each referencing the loop) is collected: the
    store shows its handles to the garbage collector, so the cycle through them is found."""
    cls = type(new_wheel_loop())
    loop = cls()
    for _ in range(5):
        loop.call_later(100, loop.stop)
    ref = weakref.ref(loop)
    with pytest.warns(ResourceWarning):
        del loop
        gc.collect()
        gc.collect()
    assert ref() is None


def test_a_closed_loop_is_freed_by_reference_counting_as_asyncios_is(new_wheel_loop):
    """A closed EventLoop goes when its last reference does, with the cyclic collector off, as
    asyncio's own loop does: once closed its store holds it weakly (the loop holds the store, and
    that cycle waited for the collector, which tornado's own suite reports as a failure). A handle
    kept past the loop names it while it lives, then no loop."""
    cls = type(new_wheel_loop())
    gc.collect()
    gc.disable()
    try:
        for make in (asyncio.new_event_loop, cls):
            loop = make()
            loop.run_until_complete(asyncio.sleep(0.001))
            loop.call_later(10, print)
            loop.close()
            ref = weakref.ref(loop)
            del loop
            assert ref() is None, make
        loop = cls()
        handle = loop.call_later(10, print)
        loop.close()
        assert handle._loop is loop
        del loop
        assert handle._loop is None
    finally:
        gc.enable()


def test_each_call_arms_on_its_own_loops_store_as_loops_come_and_go(new_wheel_loop):
    """call_at/call_later arm on the store the loop holds at the call, whatever loop was armed on
    before: loops taking turns, a store replaced on the loop, and new loops made where dropped ones
    lived (CPython reuses a freed object's address at once, so a few rounds make the same
    addresses again: the compiled store remembers the loop last armed on by address, and forgets
    it when the store is freed). The rounds stop once an address came back three times; each costs a
    full collection."""
    a, b = new_wheel_loop(), new_wheel_loop()
    for _ in range(3):
        assert a.call_later(10, print)._loop is a
        assert b.call_at(b.time() + 10, print)._loop is b
    old, a._timers = a._timers, type(a._timers)(a)
    assert a.call_later(10, print)._loop is a and a._timers.active_count() == 1
    a._timers = old
    assert a.call_later(10, print)._loop is a and old.active_count() == 4
    cls = type(a)
    seen, came_back = set(), 0
    for _ in range(50):
        if came_back == 3:
            break
        loop = cls()
        came_back += id(loop) in seen
        seen.add(id(loop))
        handle = loop.call_later(10, print)
        assert handle._loop is loop and loop._timers.active_count() == 1
        loop.close()
        del loop, handle
        gc.collect()
    # An address came back, the case the store must not confuse. valgrind's allocator holds freed
    # blocks back, and so did CPython 3.13 here, where the store keeps no memo (it looks up every
    # time): there the rounds prove only the turns and the replaced store.
    if "vgpreload" not in os.environ.get("LD_PRELOAD", "") and sys.version_info < (3, 13):
        assert came_back


def test_loopback_echo_with_per_read_timeouts(new_wheel_loop):
    """Real loopback sockets: a stream server that reads with wait_for per message echoes a client
    that talks, and times out a client that stays silent, while both are open at once."""
    loop = new_wheel_loop()
    outcomes = []

    async def handle(reader, writer):
        try:
            while True:
                line = await asyncio.wait_for(reader.readline(), 0.2)
                if not line:
                    break
                writer.write(line)
                await writer.drain()
        except asyncio.TimeoutError:
            outcomes.append("timed out")
        finally:
            writer.close()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        silent = await asyncio.open_connection("127.0.0.1", port)
        r, w = await asyncio.open_connection("127.0.0.1", port)
        for i in range(20):
            w.write(b"ping %d\n" % i)
            assert await asyncio.wait_for(r.readline(), 5) == b"ping %d\n" % i
            await asyncio.sleep(0.01)
        w.close()
        assert await asyncio.wait_for(silent[0].read(), 5) == b""  # closed by the server's timeout
        silent[1].close()
        server.close()
        await server.wait_closed()

    loop.run_until_complete(asyncio.wait_for(main(), 20))
    assert outcomes == ["timed out"]


@pytest.mark.c_extension  # the installed package's compiled store: every CPython CI runs
def test_new_event_loop_run_and_runner_make_event_loops():
    """new_event_loop() makes an EventLoop; run() (any Python) and asyncio.Runner (3.11+) run a
    coroutine on one and return its result."""
    async def main():
        await asyncio.sleep(0.001)
        return type(asyncio.get_running_loop())

    loop = aio.new_event_loop()
    try:
        assert isinstance(loop, EventLoop)
    finally:
        loop.close()
    assert issubclass(aio.run(main()), EventLoop)
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=aio.new_event_loop) as runner:
            assert issubclass(runner.run(main()), EventLoop)


@pytest.mark.c_extension
@pytest.mark.skipif(sys.version_info >= (3, 14), reason="event loop policies are deprecated from 3.14")
def test_install_makes_asyncio_use_event_loop():
    """install() sets EventLoopPolicy: asyncio.new_event_loop() then makes an EventLoop."""
    old = asyncio.get_event_loop_policy()
    try:
        aio.install()
        assert isinstance(asyncio.get_event_loop_policy(), aio.EventLoopPolicy)
        loop = asyncio.new_event_loop()
        try:
            assert isinstance(loop, EventLoop)
        finally:
            loop.close()
    finally:
        asyncio.set_event_loop_policy(old)


def test_call_later_is_checked_in_debug_and_a_subclass_override_answers(new_wheel_loop):
    """set_debug(True) makes call_later/call_at check their callback (a coroutine function is
    refused, as asyncio's debug mode does) and set_debug(False) drops the checks; a subclass's
    override answers, and a mock set on the instance stays."""
    loop = new_wheel_loop()
    loop.set_debug(True)

    async def coro():
        pass

    with pytest.raises(TypeError, match="coroutines cannot be used with call_at"):
        loop.call_later(1, coro)
    loop.set_debug(False)
    loop.call_later(1, coro).cancel()
    loop.call_at = mocked = lambda *a, **k: None
    loop.set_debug(True)
    loop.set_debug(False)
    assert loop.call_at is mocked

    class Sub(type(loop)):
        def call_later(self, delay, callback, *args, context=None):
            return super().call_later(delay, callback, *args, context=context)

    sub = Sub()
    try:
        assert getattr(sub.call_later, "__func__", None) is Sub.call_later
        assert sub.call_later(1, print).when() > 0
    finally:
        sub.close()


@pytest.mark.c_extension  # the installed package's compiled store: every CPython CI runs
def test_policies_are_absent_from_314_on_with_a_message_saying_what_to_use():
    """Where event loop policies are deprecated (3.14+), asking for EventLoopPolicy or install
    raises AttributeError naming run() and loop_factory; the hook is checked on every Python."""
    import timerwheel_c.loop as loop_module

    with pytest.raises(AttributeError, match=r"deprecated from 3\.14.*loop_factory=timerwheel_c\.aio\.new_event_loop"):
        loop_module.__getattr__("install")
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        aio.nothing  # noqa: B018
    assert hasattr(aio, "install") == (sys.version_info < (3, 14))


def test_time_call_at_and_call_later_take_every_argument_form_asyncios_take(new_wheel_loop, loop_impl):
    """The class's time, call_at and call_later (C methods of the class on the compiled store,
    functions on the pure twin) take asyncio's argument forms: the leading two by position or by
    name, extra positional arguments, ``context=``; too few arguments or an unknown keyword is a
    TypeError, as before; install_methods takes only an event loop class."""
    loop = new_wheel_loop()
    cls = type(loop)
    if loop_impl.__name__ == "timerwheel_c._loop":
        assert type(cls.__dict__["call_at"]).__name__ == "method_descriptor"
        assert type(EventLoop.__dict__["call_later"]).__name__ == "method_descriptor"
    ctx = contextvars.copy_context()
    now = loop.time()
    assert isinstance(now, float) and abs(now - time.monotonic()) < 60
    assert cls.time(loop) >= now
    h = loop.call_at(now + 50, print, 1, 2, context=ctx)
    assert (h.when(), h._args, h.get_context()) == (now + 50, (1, 2), ctx)
    h.cancel()
    assert loop.call_at(when=now + 50, callback=print).when() == now + 50
    assert loop.call_at(now + 50, callback=print, context=None).when() == now + 50
    assert loop.call_later(delay=50, callback=print, context=ctx).get_context() is ctx
    h = cls.call_later(loop, 50, print, "x")
    assert h._args == ("x",) and now + 50 <= h.when() <= loop.time() + 50
    assert loop.call_later(50, print, *range(20))._args == tuple(range(20))
    with pytest.raises(TypeError):
        loop.call_at(now)
    with pytest.raises(TypeError):
        loop.call_later(1, print, bogus=1)
    with pytest.raises(TypeError):
        loop.call_at(now, print, context=None, bogus=1)
    with pytest.raises(TypeError):
        loop.time(1)
    with pytest.raises(TypeError, match="when cannot be None"):
        loop.call_at(None, print)
    with pytest.raises(TypeError, match="delay must not be None"):
        loop.call_later(None, print)
    with pytest.raises(TypeError, match="subclass of asyncio.BaseEventLoop"):
        loop_impl.install_methods(object)


@pytest.mark.c_extension
def test_handles_armed_one_after_another_lie_one_after_another_in_memory():
    """The compiled store's handles are placed in arming order (src/tw_slab.h), as asyncio's heap
    places its handles, not in the block the handle freed last: re-armed (cancel + call_later) in
    the same order pass after pass, as a server's round over its connections, the handles lie in
    that order, so the next pass reads them in address order. The allocator keeps at most about
    4/3 blocks per handle, and gives chunks back once the handles are gone."""
    import random

    from timerwheel_c import _loop

    before = _loop._handle_blocks()
    if before is None:
        pytest.skip("this build keeps the default allocator (free-threaded)")
    per_chunk = (1 << 18) // before["block_bytes"]
    loop = EventLoop()
    try:
        n = 20_000
        handles = [loop.call_later(30, print) for _ in range(n)]
        order = list(range(n))
        random.Random(5).shuffle(order)
        for _ in range(3):
            for i in order:
                handles[i].cancel()
                handles[i] = loop.call_later(30, print)
        addresses = [id(handles[i]) for i in order]
        forward = sum(b > a for a, b in zip(addresses, addresses[1:])) / (n - 1)
        assert forward > 0.95, forward  # last-freed-first reuse keeps the first pass's scatter: ~0.5
        blocks = _loop._handle_blocks()
        assert blocks["live"] >= n
        assert blocks["capacity"] <= blocks["live"] * 4 // 3 + 2 * per_chunk
        for h in handles:
            h.cancel()
        del handles, h
        gc.collect()
        after = _loop._handle_blocks()
        assert after["live"] <= before["live"] + 10
        assert after["capacity"] <= 2 * after["live"] + 3 * per_chunk
    finally:
        loop.close()

"""Context variables on EventLoop's timers, against asyncio's own loop: each scenario runs on a fresh
asyncio loop and on EventLoop (both twins of its store, ``loop_impl``), and what the callbacks saw
must be the same on both and what asyncio's handles promise (a copy of the arming context per
handle, PEP 567). The compiled store shares one snapshot of the current context among the handles
armed while its variables stay the same, so these attack that sharing: variables set by a callback,
set and reset between armings, foreign contexts, threads, handles run many iterations later, and the
lifetime of what a variable holds (weakref). No test reads a clock for its verdict: a timer's delay
only orders the callbacks, and every wait is for loop iterations, so none can flake on a loaded
machine."""
from __future__ import annotations

import asyncio
import contextvars
import threading
import weakref

import pytest

VAR = contextvars.ContextVar("VAR", default="unset")


class Payload:
    """A value a context variable holds, whose lifetime a weakref observes."""


def _on_both(new_wheel_loop, scenario):
    """``scenario(loop)`` on a fresh asyncio loop and on a fresh EventLoop, each closed after; what it
    returned, asserted equal on both, and returned."""
    results = []
    for make in (asyncio.new_event_loop, new_wheel_loop):
        loop = make()
        try:
            results.append(contextvars.copy_context().run(scenario, loop))
        finally:
            loop.close()
    assert results[0] == results[1], f"asyncio saw {results[0]!r}, EventLoop saw {results[1]!r}"
    return results[1]


def _context_of(handle):
    """``handle.get_context()``, which asyncio's handles have from Python 3.12 on (before: the
    attribute it reads)."""
    get = getattr(handle, "get_context", None)
    return handle._context if get is None else get()


def _iterations(loop, n):
    """Run ``n`` iterations of ``loop`` (each sleep(0) yields once to the loop)."""
    async def spin():
        for _ in range(n):
            await asyncio.sleep(0)

    loop.run_until_complete(spin())


def _run_timers(loop):
    """Run ``loop`` until every timer armed with a delay of 0 or 1 ms so far has run: a timer of 10 ms
    is armed after them, and its deadline is later than all of theirs."""
    done = loop.create_future()
    loop.call_later(0.01, done.set_result, None)
    loop.run_until_complete(done)


def test_a_variable_a_callback_sets_leaks_into_no_other_timer(new_wheel_loop):
    """Twenty handles armed together in one context each set the variable when run: every one still
    sees the arming value, and a handle one of them arms sees that one's value."""
    def scenario(loop):
        seen = []

        def cb(i):
            seen.append((i, VAR.get()))
            VAR.set(f"set by {i}")
            if i == 3:
                loop.call_later(0, lambda: seen.append(("armed by 3", VAR.get())))

        VAR.set("armed")
        for i in range(20):
            loop.call_later(0, cb, i)
        _run_timers(loop)
        return seen, VAR.get()

    seen, after = _on_both(new_wheel_loop, scenario)
    assert seen == [(i, "armed") for i in range(20)] + [("armed by 3", "set by 3")] and after == "armed"


def test_set_and_reset_between_armings_each_handle_keeps_its_own(new_wheel_loop):
    """Within one iteration the variable is set, a handle armed, reset with its token, another armed,
    set again to the same object, a third armed: each runs with the value at its own arming."""
    def scenario(loop):
        seen = []
        first = loop.call_later(0, lambda: seen.append(("first", VAR.get())))
        token = VAR.set("temporary")
        loop.call_later(0, lambda: seen.append(("second", VAR.get())))
        VAR.reset(token)
        loop.call_later(0, lambda: seen.append(("third", VAR.get())))
        VAR.set("unset")  # the same str object as the default, set this time
        loop.call_later(0, lambda: seen.append(("fourth", VAR.get())))
        _run_timers(loop)
        return seen, VAR in _context_of(first)

    seen, had_var = _on_both(new_wheel_loop, scenario)
    assert seen == [("first", "unset"), ("second", "temporary"), ("third", "unset"), ("fourth", "unset")]
    assert had_var is False


def test_foreign_contexts_tasks_and_callbacks_each_arm_in_their_own(new_wheel_loop):
    """call_later from inside Context.run of a foreign context, of a copy of it (the same variables),
    from a task and from a plain callback: each timer runs with the variables where it was armed."""
    def scenario(loop):
        seen = []
        foreign = contextvars.Context()
        foreign.run(VAR.set, "foreign")
        twin = foreign.copy()
        VAR.set("outer")
        foreign.run(loop.call_later, 0, lambda: seen.append(("in foreign", VAR.get())))
        loop.call_later(0, lambda: seen.append(("in outer", VAR.get())))
        twin.run(loop.call_later, 0, lambda: seen.append(("in twin", VAR.get())))
        twin.run(VAR.set, "twin changed")
        foreign.run(loop.call_later, 0, lambda: seen.append(("in foreign again", VAR.get())))

        async def task():
            VAR.set("task")
            loop.call_later(0, lambda: seen.append(("from task", VAR.get())))

        def plain():
            VAR.set("callback")
            loop.call_later(0, lambda: seen.append(("from callback", VAR.get())))

        loop.run_until_complete(task())
        loop.call_soon(plain)
        _run_timers(loop)
        return seen, VAR.get(), foreign.run(VAR.get)

    seen, outer, foreign = _on_both(new_wheel_loop, scenario)
    assert sorted(seen) == sorted([("in foreign", "foreign"), ("in outer", "outer"), ("in twin", "foreign"),
                                   ("in foreign again", "foreign"), ("from task", "task"),
                                   ("from callback", "callback")])
    assert (outer, foreign) == ("outer", "foreign")


def test_get_context_is_each_handles_own_and_the_one_it_runs_in(new_wheel_loop):
    """Two handles armed together: get_context() is the same object on every call, each handle's is
    its own (a variable set in one through Context.run is unseen by the other's callback and seen by
    its own), and it holds the arming context's variables."""
    def scenario(loop):
        seen = []
        VAR.set("armed")
        arming = contextvars.copy_context()
        one = loop.call_later(0, lambda: seen.append(("one", VAR.get())))
        two = loop.call_later(0, lambda: seen.append(("two", VAR.get())))
        ctx_one = _context_of(one)
        assert ctx_one is _context_of(one) and ctx_one is not _context_of(two)
        assert dict(ctx_one) == dict(arming) == dict(_context_of(two))
        ctx_one.run(VAR.set, "changed through get_context")
        _run_timers(loop)
        return seen, _context_of(one) is ctx_one, _context_of(two)[VAR]

    seen, same, two_value = _on_both(new_wheel_loop, scenario)
    assert seen == [("one", "changed through get_context"), ("two", "armed")] and same and two_value == "armed"


def test_an_explicit_context_is_used_as_given(new_wheel_loop):
    """context= is the very context the callback runs in and get_context() answers, shared by every
    handle given it, so a variable one callback sets is seen by the next."""
    def scenario(loop):
        seen = []
        ctx = contextvars.Context()

        def cb(i):
            seen.append((i, VAR.get()))
            VAR.set(f"set by {i}")

        handles = [loop.call_later(0, cb, i, context=ctx) for i in range(3)]
        _run_timers(loop)
        return seen, all(_context_of(h) is ctx for h in handles), ctx[VAR]

    seen, same, last = _on_both(new_wheel_loop, scenario)
    assert seen == [(0, "unset"), (1, "set by 0"), (2, "set by 1")] and same and last == "set by 2"


def test_threads_arming_through_call_soon_threadsafe_run_in_their_own_contexts(new_wheel_loop):
    """Four threads, each with its own value of the variable, arm a timer through
    call_soon_threadsafe(loop.call_later, ...): each timer sees its own thread's value."""
    def scenario(loop):
        seen = []
        armed = threading.Barrier(5)

        def arm(i):
            VAR.set(f"thread {i}")
            loop.call_soon_threadsafe(loop.call_later, 0, lambda: seen.append(VAR.get()))
            armed.wait(timeout=60)

        threads = [threading.Thread(target=arm, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        armed.wait(timeout=60)
        for t in threads:
            t.join(timeout=60)
        _iterations(loop, 2)  # the call_later calls run, arming timers due at once
        _run_timers(loop)
        return sorted(seen)

    assert _on_both(new_wheel_loop, scenario) == [f"thread {i}" for i in range(4)]


def test_a_timer_run_many_iterations_after_its_arming_keeps_its_variables_alive(new_wheel_loop):
    """A handle armed with a payload in the variable, the variable then changed: the payload lives
    through many iterations (the store drops its snapshot each one, never the handle's variables),
    the callback sees it, and it is freed within one iteration after the handle ran."""
    def scenario(loop):
        seen = []

        def arm():
            payload = Payload()
            VAR.set(payload)
            fut = loop.create_future()
            loop.call_later(0.02, lambda: (seen.append(VAR.get() is ref()), fut.set_result(None)))
            return weakref.ref(payload), fut

        ref, fut = contextvars.copy_context().run(arm)
        VAR.set("changed")
        loop.call_later(0, lambda: None)  # an arming with other variables meanwhile
        _iterations(loop, 50)
        alive_before = ref() is not None
        loop.run_until_complete(fut)
        _iterations(loop, 1)
        return alive_before, seen, ref() is None

    assert _on_both(new_wheel_loop, scenario) == (True, [True], True)


def test_a_payload_of_many_handles_is_freed_an_iteration_after_the_last_is_gone(new_wheel_loop):
    """20,000 handles armed in one context holding a payload, half cancelled and half run: each run
    sees the payload, and it is freed within one iteration after the last handle ran."""
    def scenario(loop):
        seen = []

        def arm():
            payload = Payload()
            VAR.set(payload)
            handles = [loop.call_later(0.001 * (i % 2), lambda: seen.append(VAR.get() is payload))
                       for i in range(20_000)]
            return weakref.ref(payload), handles

        ref, handles = contextvars.copy_context().run(arm)
        for h in handles[1::2]:
            h.cancel()
        del handles, h  # h: the last cancelled handle, whose context holds the payload as asyncio's does
        _run_timers(loop)
        _iterations(loop, 1)
        return len(seen), all(seen), ref() is None

    assert _on_both(new_wheel_loop, scenario) == (10_000, True, True)


def test_a_closed_loop_keeps_no_variable_of_its_last_arming(new_wheel_loop):
    """A loop closed with a timer armed (then cancelled after the close, as a library's cleanup does):
    once the handle is gone, the payload its context held is freed, though the loop object lives on
    and never iterates again, as on asyncio's loop, which drops its heap at close."""
    def scenario(loop):
        def arm():
            payload = Payload()
            VAR.set(payload)
            return weakref.ref(payload), loop.call_later(30, print)

        ref, handle = contextvars.copy_context().run(arm)
        loop.close()
        handle.cancel()
        cancelled = handle.cancelled()
        del handle
        return cancelled, ref() is None

    assert _on_both(new_wheel_loop, scenario) == (True, True)


@pytest.mark.parametrize("when", ["run", "cancel"])
def test_cancel_from_a_weakref_callback_while_handles_are_freed(new_wheel_loop, when):
    """A handle's argument whose weakref callback cancels another handle, and whose __del__ cancels a
    third, when the first handle drops it: once it ran, or at its cancel(). Nothing raises, the cancelled
    handles never run, and the same happens on both loops."""
    def scenario(loop):
        seen = []
        errors = []
        loop.set_exception_handler(lambda lp, context: errors.append(context.get("message")))

        class Trigger:
            def __del__(self):
                third.cancel()

        trigger = Trigger()
        first = loop.call_later(0 if when == "run" else 30, lambda t: seen.append("first"), trigger)
        if when == "cancel":
            first.cancel()  # drops its arguments, as asyncio's cancel() does
        second = loop.call_later(0.001, lambda: seen.append("second"))
        third = loop.call_later(0.001, lambda: seen.append("third"))
        ref = weakref.ref(trigger, lambda r: second.cancel())
        del trigger
        del first
        _run_timers(loop)
        return seen, second.cancelled(), third.cancelled(), ref() is None, errors

    seen, second, third, freed, errors = _on_both(new_wheel_loop, scenario)
    assert (second, third, freed, errors) == (True, True, True, [])
    assert "second" not in seen and "third" not in seen

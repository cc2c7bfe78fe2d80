"""EventLoop's iteration on both twins of its timer store (``loop_impl``): its I/O step
(``LoopTimers.poll``: asyncio's epoll selector's ``select`` run in C on the compiled twin) and its
run of the ready callbacks (``LoopTimers.run_ready``, with debug mode's checked path in Python)
behave as asyncio's ``_run_once``. Each test runs the same scenario on asyncio's own loop and
compares, so it proves equality; none waits on a clock beyond a zero-timeout poll.
"""
from __future__ import annotations

import asyncio
import selectors
import socket
from unittest import mock

import pytest


@pytest.mark.skipif(not hasattr(selectors, "EpollSelector"), reason="epoll only")
def test_the_io_step_gives_the_events_asyncios_epoll_selector_gives(new_wheel_loop):
    """With the default epoll selector, the I/O step hands ``_process_events`` the very list
    ``selector.select`` gives for the same ready descriptors (keys and event masks), and a
    reader and a writer run as on asyncio's loop."""
    loop = new_wheel_loop()
    assert type(loop._selector) is selectors.EpollSelector
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    try:
        b.send(b"x")
        got = []
        loop.add_reader(a, got.append, "read")
        loop.add_writer(c, got.append, "write")
        loop.add_reader(d, got.append, "never")
        seen = []
        with mock.patch.object(loop, "_process_events", side_effect=seen.append):
            loop._timers.poll(loop._selector, 0)
        assert len(seen) == 1 and sorted(seen[0], key=lambda e: e[0].fd) == \
            sorted(loop._selector.select(0), key=lambda e: e[0].fd)
        assert {(key.fileobj, mask) for key, mask in seen[0]} == {(a, selectors.EVENT_READ),
                                                                   (c, selectors.EVENT_WRITE)}
        loop.run_until_complete(asyncio.sleep(0))
        assert set(got) == {"read", "write"}  # level-triggered: each iteration of the run sees them
    finally:
        for s in (a, b, c, d):
            loop.remove_reader(s)
            loop.remove_writer(s)
            s.close()


def test_a_selector_given_or_patched_and_process_events_patched_are_called_every_iteration(new_wheel_loop):
    """A user's selector (``selector=``), a ``select`` patched on the default one, and a
    ``_process_events`` set on the loop are each called once per iteration, with the wheel's
    timeout and the selector's events (an empty list too), as asyncio's _run_once calls them."""
    class Recording(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
        def select(self, timeout=None):
            calls.append(timeout)
            return super().select(timeout)

    calls: list = []
    loop = new_wheel_loop(Recording())
    loop.run_until_complete(asyncio.sleep(0))
    assert calls and calls[-1] == 0

    loop = new_wheel_loop()
    real = loop._selector.select
    with mock.patch.object(loop._selector, "select", side_effect=real) as select, \
            mock.patch.object(loop, "_process_events") as process:
        loop.call_later(3600, print)
        loop.run_until_complete(asyncio.sleep(0))
    assert select.call_count >= 2 and process.call_count == select.call_count
    assert all(call.args == ([],) for call in process.call_args_list)


def _scenario(loop):
    """Three callbacks ready at once: the first turns debug mode on and the second records the
    loop's _current_handle; what they schedule waits for the next iteration."""
    order = []

    def first():
        order.append(("first", loop._current_handle is None))
        loop.set_debug(True)
        loop.call_soon(order.append, ("later", None))

    def second():
        order.append(("second", loop._current_handle is h2))

    loop.call_soon(first)
    h2 = loop.call_soon(second)
    cancelled = loop.call_soon(order.append, ("cancelled", None))
    cancelled.cancel()
    loop.call_soon(order.append, ("third", None))
    loop.call_soon(loop.stop)
    loop.run_forever()
    loop.set_debug(False)
    return order


def test_debug_mode_turned_on_by_a_callback_reaches_the_next_callbacks_of_the_iteration(new_wheel_loop):
    """asyncio reads its debug flag before each callback: one that turns debug mode on makes the
    next ones of the same iteration run through the checked path (``loop._current_handle`` set),
    cancelled ones are skipped, and what they schedule runs on the next iteration."""
    ref = asyncio.new_event_loop()
    try:
        expected = _scenario(ref)
    finally:
        ref.close()
    assert expected[:2] == [("first", True), ("second", True)]
    assert _scenario(new_wheel_loop()) == expected


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_keyboard_interrupt_and_system_exit_leave_the_loop_and_the_rest_runs_later(new_wheel_loop, exc):
    """As asyncio's Handle._run re-raises them, KeyboardInterrupt and SystemExit from a callback
    leave run_forever; the callbacks after it stay ready and run at the next run, in order, and
    any other exception goes to the loop's exception handler."""
    def run(loop):
        got, errors = [], []
        loop.set_exception_handler(lambda lp, context: errors.append(type(context["exception"])))

        def boom():
            raise exc

        loop.call_soon(got.append, 1)
        loop.call_soon(boom)
        loop.call_soon(got.append, 2)
        loop.call_soon(lambda: 1 / 0)
        with pytest.raises(exc):
            loop.run_forever()
        left = len(loop._ready)
        loop.call_soon(loop.stop)
        loop.run_forever()
        return got, errors, left

    ref = asyncio.new_event_loop()
    try:
        expected = run(ref)
    finally:
        ref.close()
    assert expected == ([1, 2], [ZeroDivisionError], 2)
    assert run(new_wheel_loop()) == expected


def test_run_ready_hands_back_what_is_left_once_debug_mode_is_on(new_wheel_loop):
    """``run_ready`` runs none of the callbacks once debug mode is on: it puts the first back and
    says how many are left, for the loop's checked path; off debug mode it runs the ``ntodo`` it is
    given and no more, 0 left."""
    loop = new_wheel_loop()
    got = []
    for i in range(3):
        loop.call_soon(got.append, i)
    loop.set_debug(True)
    ready = loop._ready
    assert loop._timers.run_ready(ready, 3) == 3 and len(ready) == 3 and got == []
    loop.set_debug(False)
    assert loop._timers.run_ready(ready, 2) == 0 and got == [0, 1] and len(ready) == 1
    assert loop._timers.run_ready(ready, 1) == 0 and got == [0, 1, 2] and not ready

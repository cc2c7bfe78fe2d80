"""EventLoop's ``call_soon``, on both twins of its timer store (``loop_impl``): asyncio's own
``BaseEventLoop.call_soon`` on the pure twin, and on the compiled one a C method of the class
that makes the same ``asyncio.Handle`` without asyncio's four Python frames, as long as what those
frames call is asyncio's own. Each test compares with asyncio's loop, so it proves equality, not a
constant; none waits on a clock.
"""
from __future__ import annotations

import asyncio
import contextvars
import sys
from unittest import mock

import pytest

from timerwheel_c.loop import EventLoop


def _fields(handle):
    return (type(handle), handle._callback, handle._args, handle._cancelled, handle._repr, handle._source_traceback)


def test_call_soon_is_compiled_on_the_class_or_asyncios_own(new_wheel_loop, loop_impl):
    """The compiled twin gives the class a C method (a method descriptor, as time, call_at and
    call_later); the pure twin's call_soon is asyncio's own function."""
    loop = new_wheel_loop()
    if loop_impl.__name__ == "timerwheel_c._loop":
        assert type(type(loop).__dict__["call_soon"]).__name__ == "method_descriptor"
        assert type(EventLoop.__dict__["call_soon"]).__name__ == "method_descriptor"
    else:
        assert loop_impl.call_soon is asyncio.BaseEventLoop.call_soon
        assert type(loop).call_soon is asyncio.BaseEventLoop.call_soon


def test_call_soon_makes_the_handle_asyncios_makes_and_queues_it_in_order(new_wheel_loop):
    """The handle is an asyncio.Handle with the fields asyncio's call_soon gives it, its context a
    copy of the current one or the one given, appended to the ready queue: callbacks run in the
    order they were queued, with their arguments, in their contexts."""
    loop, ref = new_wheel_loop(), asyncio.new_event_loop()
    try:
        var = contextvars.ContextVar("var", default="unset")
        var.set("queued")
        ran = []

        def cb(*args):
            ran.append((args, var.get()))

        for lp in (loop, ref):
            h = lp.call_soon(cb, 1, 2)
            assert _fields(h) == (asyncio.Handle, cb, (1, 2), False, None, None)
            assert h._loop is lp and lp._ready[-1] is h
            assert h._context is not contextvars.copy_context() and h._context[var] == "queued"
        ctx = contextvars.Context()
        h = loop.call_soon(cb, 3, context=ctx)
        assert h._context is ctx and h._args == (3,)
        assert loop.call_soon(callback=cb)._args == ()
        assert loop.call_soon(cb, *range(20))._args == tuple(range(20))
        var.set("later")
        loop.run_until_complete(asyncio.sleep(0))
        assert ran == [((1, 2), "queued"), ((3,), "unset"), ((), "queued"), (tuple(range(20)), "queued")]
        with pytest.raises(TypeError):
            loop.call_soon()
        with pytest.raises(TypeError):
            loop.call_soon(cb, bogus=1)
    finally:
        ref.close()


def test_call_soon_on_a_closed_loop_raises_and_debug_mode_checks_as_asyncio(new_wheel_loop):
    """A closed loop refuses call_soon with asyncio's RuntimeError. In debug mode the callback is
    checked and the handle's source traceback ends at the caller's line, as on asyncio's loop."""
    loop, ref = new_wheel_loop(), asyncio.new_event_loop()
    try:
        for lp in (loop, ref):
            lp.set_debug(True)
            with pytest.raises(TypeError, match="a callable object was expected by call_soon"):
                lp.call_soon(1)
            h = lp.call_soon(print)
            line = sys._getframe().f_lineno - 1
            assert h._source_traceback[-1][1] == line and h._source_traceback[-1][2] == sys._getframe().f_code.co_name
            lp.set_debug(False)
            assert lp.call_soon(print)._source_traceback is None
    finally:
        ref.close()
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.call_soon(print)


def test_call_soon_goes_through_what_asyncio_calls_once_it_is_replaced(new_wheel_loop, monkeypatch):
    """asyncio's call_soon calls the loop's _call_soon, _check_closed and get_debug, and makes an
    asyncio.events.Handle: a subclass's override or a patch of any of them is called, as on
    asyncio's loop, and once undone the compiled path is taken again."""
    loop = new_wheel_loop()
    calls = []

    class Sub(type(loop)):
        def _call_soon(self, callback, args, context):
            calls.append(callback)
            return super()._call_soon(callback, args, context)

    sub = Sub()
    try:
        sub.call_soon(print)
        assert calls == [print]
    finally:
        sub.close()

    class MyHandle(asyncio.Handle):
        __slots__ = ()

    monkeypatch.setattr(asyncio.events, "Handle", MyHandle)
    assert type(loop.call_soon(print)) is MyHandle
    monkeypatch.undo()
    assert type(loop.call_soon(print)) is asyncio.Handle

    def init(self, callback, args, lp, context=None):
        calls.append("init")
        original(self, callback, args, lp, context)

    original = asyncio.Handle.__init__
    monkeypatch.setattr(asyncio.Handle, "__init__", init)
    loop.call_soon(print)
    assert calls[-1] == "init"
    monkeypatch.undo()
    monkeypatch.setattr(type(loop), "get_debug", lambda self: True)
    assert loop.call_soon(print)._source_traceback
    monkeypatch.undo()
    assert loop.call_soon(print)._source_traceback is None
    loop.run_until_complete(asyncio.sleep(0))


def test_call_soon_calls_a_new_set_on_asyncios_handle_as_asyncio_does(loop_impl):
    """A ``__new__`` set on asyncio.Handle (a tracker of the handles made) is called with the
    arguments asyncio's call_soon gives ``Handle()``, and what it makes is the handle, as on
    asyncio's loop, even when that is no Handle at all (asyncio's call_soon then fails reading it).
    The compiled path fills a Handle's slots in place, so it must never take what such a
    ``__new__`` makes: it wrote them into an object with no such slots, and crashed. In a process
    of its own: CPython keeps calling a ``__new__`` looked up on the class once one was set there,
    even after it is deleted, and asyncio's own Handle() then fails."""
    import subprocess

    script = """
import asyncio, importlib, sys
from timerwheel_c.loop import EventLoop
impl = importlib.import_module(sys.argv[1])
cls = type("EventLoop", (EventLoop,), {"_timers_class": impl.LoopTimers, "time": impl.time, "call_at": impl.call_at,
                                       "call_later": impl.call_later, "call_soon": impl.call_soon})
impl.install_methods(cls)
seen = []
def recording_new(cls, *args):
    seen.append(args[:2])
    return object.__new__(cls)
asyncio.Handle.__new__ = recording_new
loops = [cls(), asyncio.new_event_loop()]
outcomes = [[] for loop in loops]
for loop, outcome in zip(loops, outcomes):
    seen.clear()
    handle = loop.call_soon(print, 1)
    outcome.append((seen == [(print, (1,))], type(handle).__name__, loop._ready[-1] is handle))
asyncio.Handle.__new__ = lambda cls, *args: object()
for loop, outcome in zip(loops, outcomes):
    try:
        outcome.append(type(loop.call_soon(print, 2)).__name__)
    except AttributeError as exc:
        outcome.append(str(exc))
    loop.close()
    print(outcome)
"""
    out = subprocess.run([sys.executable, "-c", script, loop_impl.__name__], capture_output=True, text=True,
                         timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    wheel, asyncios = out.stdout.splitlines()
    assert wheel == asyncios == str([(True, "Handle", True), "'object' object has no attribute '_source_traceback'"])


@pytest.mark.parametrize("args, kwargs", [((), {}), ((print,), {"bogus": 1}), ((), {"context": None})])
def test_call_soon_refuses_bad_arguments_with_asyncios_messages(new_wheel_loop, args, kwargs):
    """A call_soon with no callback or an unknown keyword raises asyncio's TypeError, word for word
    (the method named as asyncio names it, the missing argument by its name), on both twins."""
    loop, ref = new_wheel_loop(), asyncio.new_event_loop()
    try:
        messages = []
        for lp in (loop, ref):
            with pytest.raises(TypeError) as raised:
                lp.call_soon(*args, **kwargs)
            messages.append(str(raised.value))
        assert messages[0] == messages[1]
    finally:
        ref.close()


def test_call_soon_goes_through_what_is_set_on_the_loop_itself(new_wheel_loop):
    """asyncio's call_soon looks up _check_closed, _call_soon and get_debug on the loop, so a patch
    set on the loop object itself (``mock.patch.object(loop, ...)``) is called, as on asyncio's
    loop, also after call_soon and call_later ran on it unpatched; once undone, the handle is
    made as before."""
    loop, ref = new_wheel_loop(), asyncio.new_event_loop()
    try:
        outcomes = []
        for lp in (loop, ref):
            lp.call_soon(print)
            lp.call_later(3600, print).cancel()
            with mock.patch.object(lp, "_check_closed", side_effect=RuntimeError("refused")):
                with pytest.raises(RuntimeError, match="refused"):
                    lp.call_soon(print)
            with mock.patch.object(lp, "_call_soon", wraps=lp._call_soon) as inner:
                queued = lp.call_soon(print, 1) is lp._ready[-1]
            with mock.patch.object(lp, "get_debug", return_value=True):
                traced = lp.call_soon(print)._source_traceback is not None
            seen = [call.args[:2] for call in inner.call_args_list]
            outcomes.append((seen, queued, traced, type(lp.call_soon(print)), lp.call_soon(print)._source_traceback))
            lp._ready.clear()
        assert outcomes[0] == outcomes[1] == ([(print, (1,))], True, True, asyncio.Handle, None)
    finally:
        ref.close()


def test_call_soon_patched_on_asyncios_classes_is_not_seen_but_what_it_calls_is(new_wheel_loop):
    """EventLoop's call_soon replaces asyncio's, as its call_at and call_later do (and uvloop's):
    a call_soon patched on asyncio's loop classes is not called. What asyncio's call_soon calls,
    patched there, is: the handle is then made by asyncio's own call_soon, through the patch."""
    loop = new_wheel_loop()
    with mock.patch.object(asyncio.BaseEventLoop, "call_soon") as replaced:
        assert type(loop.call_soon(print)) is asyncio.Handle
    assert not replaced.called
    inner = asyncio.BaseEventLoop._call_soon
    with mock.patch.object(asyncio.BaseEventLoop, "_call_soon", autospec=True, side_effect=inner) as patched:
        handle = loop.call_soon(print, 1)
    patched.assert_called_once_with(loop, print, (1,), None)
    assert loop._ready[-1] is handle

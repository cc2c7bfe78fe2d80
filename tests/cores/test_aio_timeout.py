"""WheelScheduler.timeout(): asyncio.timeout's contract on the wheel, on the compiled scheduler and its pure twin.

Deadlines here are tens of ms against bodies that sleep for seconds (or the reverse), so
each outcome holds on a loaded machine; no test asserts how late an expiry was.
"""
from __future__ import annotations

import asyncio
import sys
import types

import pytest


LONG_S = 10.0  # a body this long must be cut short; the test's own bound is well under it


@pytest.fixture
def run(aio_impl):
    def runner(main):
        async def wrapper():
            sched = aio_impl.WheelScheduler()
            try:
                return await asyncio.wait_for(main(sched), LONG_S / 2)
            finally:
                sched.close()
        return asyncio.run(wrapper())
    return runner


def test_expiry_raises_timeout_error(run):
    """A body outliving the deadline is cancelled and the block raises TimeoutError, not before
    the deadline (by the loop clock), and the timeout reports expired()."""
    async def main(sched):
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError):
            async with sched.timeout(0.02) as cm:
                await asyncio.sleep(LONG_S)
        assert cm.expired()
        return loop.time() - started
    assert 0.02 <= run(main) < LONG_S / 2


def test_no_expiry_when_the_body_finishes(run):
    """A body finishing before the deadline exits normally; the handle is disarmed, so the
    task is not cancelled afterwards."""
    async def main(sched):
        async with sched.timeout(LONG_S) as cm:
            await asyncio.sleep(0.001)
        assert not cm.expired() and sched.active_count() == 0
        await asyncio.sleep(0.01)
        return "done"
    assert run(main) == "done"


def test_reschedule_after_extends_the_deadline(run):
    """An idle timeout re-armed with reschedule_after on each 'message' (every 10 ms, 30 times)
    outlives its 200 ms delay; once the messages stop, it expires. Only a 190 ms stall could
    break it."""
    async def main(sched):
        loop = asyncio.get_running_loop()
        started = loop.time()
        survived = None
        with pytest.raises(TimeoutError):
            async with sched.timeout(0.2) as cm:
                for _ in range(30):
                    await asyncio.sleep(0.01)
                    cm.reschedule_after(0.2)
                survived = loop.time() - started
                await asyncio.sleep(LONG_S)
        return survived
    assert run(main) >= 0.3


def test_reschedule_none_disarms_and_rearms(run):
    """reschedule(None) disarms the timeout (when() is None); a later deadline arms it again."""
    async def main(sched):
        loop = asyncio.get_running_loop()
        async with sched.timeout(0.01) as cm:
            cm.reschedule(None)
            assert cm.when() is None
            await asyncio.sleep(0.03)
            cm.reschedule(loop.time() + 0.01)
            assert cm.when() is not None
            with pytest.raises(asyncio.CancelledError):
                await asyncio.sleep(LONG_S)
            raise asyncio.CancelledError  # what the task would have seen, re-raised
        return "unreachable"
    with pytest.raises(TimeoutError):
        run(main)


def test_timeout_state_errors(run):
    """Re-entering, rescheduling after exit, and use outside a task raise RuntimeError;
    a bad delay raises TypeError/ValueError."""
    async def main(sched):
        cm = sched.timeout(1.0)
        async with cm:
            pass
        with pytest.raises(RuntimeError, match="entered"):
            async with cm:
                pass
        with pytest.raises(RuntimeError, match="exited"):
            cm.reschedule(1.0)
        with pytest.raises(RuntimeError, match="exited"):
            cm.reschedule_after(1.0)
        with pytest.raises(TypeError):
            sched.timeout("1")
        with pytest.raises(ValueError):
            sched.timeout(float("nan"))
        return True
    assert run(main)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Task.uncancel() is 3.11+")
def test_outside_cancel_is_not_turned_into_timeout(run):
    """A cancel sent from elsewhere while the timeout is expiring still propagates as
    CancelledError (asyncio.timeout's rule, via Task.uncancel)."""
    async def main(sched):
        async def body():
            async with sched.timeout(0.01):
                try:
                    await asyncio.sleep(LONG_S)
                finally:
                    asyncio.current_task().cancel()  # a second, outside cancel request
                    await asyncio.sleep(0)
        task = asyncio.ensure_future(body())
        with pytest.raises(asyncio.CancelledError):
            await task
        return task.cancelled()
    assert run(main)


def test_reschedule_takes_loop_time_as_asyncio_timeout_does(run):
    """Code ported from asyncio: ``cm.reschedule(loop.time() + 0.05)`` expires about 50 ms later
    (not in some 800 s, as a relative reading would), and when() reports that loop time, as
    asyncio.Timeout's does, before entry too. Only a stall of LONG_S / 2 could break it."""
    async def main(sched):
        loop = asyncio.get_running_loop()
        cm = sched.timeout(LONG_S)
        assert abs(cm.when() - (loop.time() + LONG_S)) < 1.0   # the deadline, taken at creation
        started = loop.time()
        with pytest.raises(TimeoutError):
            async with cm:
                target = loop.time() + 0.05
                cm.reschedule(target)
                assert cm.when() == target
                await asyncio.sleep(LONG_S)
        assert loop.time() >= target and cm.expired() and cm.when() == target
        return loop.time() - started
    assert run(main) < LONG_S / 2


def test_timeout_at_expires_at_a_loop_time_and_reschedule_after_takes_a_delay(run):
    """timeout_at(when) is asyncio.timeout_at: it expires at loop time ``when``, never before;
    reschedule_after(delay) moves the deadline to loop.time() + delay; timeout_at(None) never
    expires. Deadlines of tens of ms against a body of LONG_S: cannot flake."""
    async def main(sched):
        loop = asyncio.get_running_loop()
        when = loop.time() + 0.02
        with pytest.raises(TimeoutError):
            async with sched.timeout_at(when) as cm:
                assert cm.when() == when
                await asyncio.sleep(LONG_S)
        assert loop.time() >= when
        with pytest.raises(TimeoutError):
            async with sched.timeout_at(None) as cm:
                assert cm.when() is None
                before = loop.time()
                cm.reschedule_after(0.02)
                assert before + 0.02 <= cm.when() <= loop.time() + 0.02
                await asyncio.sleep(LONG_S)
        async with sched.timeout_at(None) as cm:
            await asyncio.sleep(0.01)
        assert not cm.expired()
        with pytest.raises(TypeError):
            sched.timeout_at("1")
        with pytest.raises(ValueError):
            sched.timeout_at(float("inf"))
        return True
    assert run(main)


def test_nested_timeouts_blame_the_right_block(run):
    """Nested like asyncio.timeout: the inner block's expiry raises TimeoutError from the inner
    block only (the outer runs on); the outer's expiry passes through the inner block as
    CancelledError and surfaces as TimeoutError from the outer block."""
    async def main(sched):
        outer_went_on = False
        async with sched.timeout(LONG_S) as outer:
            with pytest.raises(TimeoutError):
                async with sched.timeout(0.01) as inner:
                    await asyncio.sleep(LONG_S)
            outer_went_on = True
        assert inner.expired() and not outer.expired() and outer_went_on
        inner_saw = None
        with pytest.raises(TimeoutError):
            async with sched.timeout(0.01) as outer:
                try:
                    async with sched.timeout(LONG_S) as inner:
                        await asyncio.sleep(LONG_S)
                except BaseException as exc:
                    inner_saw = type(exc)
                    raise
        assert outer.expired() and not inner.expired()
        return inner_saw
    assert run(main) is asyncio.CancelledError


def test_a_refused_reschedule_leaves_the_deadline_as_it_was(run):
    """reschedule() to a deadline beyond the wheel's range raises ValueError naming it, and
    when() still gives the deadline the timeout keeps (once, the refused one was reported)."""
    async def main(sched):
        async with sched.timeout(LONG_S) as cm:
            before = cm.when()
            with pytest.raises(ValueError, match="beyond the wheel's range"):
                cm.reschedule(1e300)
            assert cm.when() == before
            cm.reschedule(None)
            with pytest.raises(ValueError, match="beyond the wheel's range"):
                cm.reschedule(1e300)
            assert cm.when() is None
        return True

    assert run(main)


def test_enter_and_exit_awaitables_work_wherever_a_coroutine_does(run):
    """``__aenter__()`` and ``__aexit__()`` return awaitables that ``yield from`` takes and that
    ``asyncio.ensure_future``, ``gather`` and ``wait_for`` wrap, as asyncio's coroutines are: a
    library that enters the block through them (an exit stack, a task of its own) gets the timeout.
    The deadlines are far off or already passed, so no outcome depends on the machine's speed."""
    @types.coroutine
    def delegate(awaitable):
        return (yield from awaitable.__await__())

    async def main(sched):
        cm = sched.timeout(LONG_S)
        assert await delegate(cm.__aenter__()) is cm
        assert await delegate(cm.__aexit__(None, None, None)) is None
        cm = sched.timeout(LONG_S)
        assert await asyncio.ensure_future(cm.__aenter__()) is cm
        assert await asyncio.gather(cm.__aexit__(None, None, None)) == [None]
        cm = sched.timeout(LONG_S)
        assert await asyncio.wait_for(cm.__aenter__(), LONG_S) is cm
        cm.reschedule(0)  # long past: it expires at the next tick
        with pytest.raises(asyncio.CancelledError):
            await asyncio.sleep(LONG_S)
        with pytest.raises(TimeoutError):
            await delegate(cm.__aexit__(asyncio.CancelledError, asyncio.CancelledError(), None))
        assert cm.expired() and sched.active_count() == 0
        return "done"
    assert run(main) == "done"

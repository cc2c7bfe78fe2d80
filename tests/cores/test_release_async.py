"""``await deadline`` on asyncio loops, against the C core and the pure twin via ``release_impl``.

The C core wakes a loop through an eventfd/self-pipe watched with ``add_reader``, or,
for loops without ``add_reader`` (the Windows proactor), through a helper thread posting
with ``call_soon_threadsafe``; ``NoReaderLoop`` forces that second path on any OS.
Assertions are "released, never early, within a liveness bound of seconds".
"""
from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from timerwheel_c.errors import ReleaseTimerClosed

LIVENESS_S = 10.0
HOUR_NS = 3600 * 10**9


class NoReaderLoop(asyncio.SelectorEventLoop):
    """A loop without add_reader, like the Windows proactor: forces the call_soon_threadsafe path."""

    def add_reader(self, *args, **kwargs):
        raise NotImplementedError


def _loop_factories():
    factories = [pytest.param(asyncio.new_event_loop, id="asyncio"), pytest.param(NoReaderLoop, id="no-reader")]
    try:
        import uvloop
    except ImportError:
        factories.append(pytest.param(None, id="uvloop", marks=pytest.mark.skip(reason="uvloop not installed")))
    else:
        factories.append(pytest.param(uvloop.new_event_loop, id="uvloop"))
    return factories


def _run(factory, coro):
    loop = factory()
    try:
        return loop.run_until_complete(asyncio.wait_for(coro, LIVENESS_S))
    finally:
        loop.close()


@pytest.mark.parametrize("factory", _loop_factories())
def test_many_concurrent_awaits(release_impl, factory):
    """1,000 tasks on one loop await 500 deadlines (two tasks each): all resume, none before at_ns.

    Pairs of tasks share a deadline, so one release must resolve several futures. A
    lost wakeup would hang a task past the liveness bound.
    """

    async def main(rt):
        base = time.monotonic_ns() + 5_000_000
        ds = [rt.arm_ns(base + (i * 7) % 500 * 20_000) for i in range(500)]

        async def waiter(d):
            await d
            return time.monotonic_ns() >= d.at_ns and d.done() and d.released_at_ns >= d.at_ns

        return await asyncio.gather(*(waiter(d) for d in ds for _ in range(2)))

    with release_impl.ReleaseTimer() as rt:
        assert _run(factory, main(rt)) == [True] * 1000


@pytest.mark.parametrize("factory", _loop_factories())
def test_close_wakes_awaiting_waiters(release_impl, factory):
    """close() from another thread wakes tasks awaiting far deadlines with ReleaseTimerClosed.

    The deadlines are an hour out, so without the close the tasks would hit the liveness
    bound (asyncio.wait_for) instead.
    """

    async def main(rt):
        ds = [rt.arm_ns(time.monotonic_ns() + HOUR_NS + i) for i in range(20)]

        async def waiter(d):
            try:
                await d
            except ReleaseTimerClosed:
                return "closed"
            return "released"

        tasks = [asyncio.ensure_future(waiter(d)) for d in ds]
        await asyncio.sleep(0.02)
        assert not any(t.done() for t in tasks)
        closer = threading.Thread(target=rt.close)
        closer.start()
        results = await asyncio.gather(*tasks)
        closer.join(LIVENESS_S)
        return results

    rt = release_impl.ReleaseTimer()
    assert _run(factory, main(rt)) == ["closed"] * 20


def _close_from_release_path_once(release_impl):
    """One attempt of test_close_from_release_path: (the timer, what the closing call saw)."""
    seen = {}
    closing = []

    class ClosingLoop(NoReaderLoop):
        def call_soon_threadsafe(self, callback, *args, **kwargs):
            if closing and "thread" not in seen and threading.current_thread() is not threading.main_thread():
                seen["thread"] = threading.current_thread().name
                start = time.monotonic()
                rt.close()
                seen["close_s"] = time.monotonic() - start
            return super().call_soon_threadsafe(callback, *args, **kwargs)

    async def main():
        await rt.arm_ns(time.monotonic_ns() + 1_000_000)
        d = rt.arm_ns(time.monotonic_ns() + 100_000_000)
        closing.append(True)
        await d
        return d.done()

    rt = release_impl.ReleaseTimer()
    assert _run(ClosingLoop, main())
    return rt, seen


def test_close_from_release_path(release_impl):
    """close() called from code run on the release path returns instead of joining itself.

    ``ClosingLoop.call_soon_threadsafe`` calls ``rt.close()``. In the pure twin the release
    thread itself calls it (asserted), so close must detach rather than join its own
    thread; in the C core the release thread never runs Python, so it is the helper
    thread that posts for a loop without add_reader. Either way close() returns and the
    awaited deadline's task completes within the liveness bound. A first deadline sets
    up the loop's channel; the second is 100 ms out so the task is surely waiting when
    it is released; should load ever defeat that, the attempt is repeated, and the test
    fails only if the situation never arose.
    """
    for _attempt in range(5):
        rt, seen = _close_from_release_path_once(release_impl)
        if seen:
            break
    assert seen, "the release never reached a waiting task"
    assert seen["close_s"] < LIVENESS_S
    assert rt.closed
    if release_impl.__name__.endswith("pure.release"):
        assert seen["thread"] == "timerwheel_c-release"
    else:
        assert seen["thread"] == "timerwheel_c-release-helper"


def test_cancelled_await_then_release(release_impl):
    """A task cancelled while awaiting leaves no stale future: a later await of the same deadline
    returns once it is released, never before.

    The deadline is 300 ms out, so the task is suspended on it when cancelled (asserted: on a
    machine so loaded that it was released first, the attempt is repeated further out).
    """

    async def main(rt, lead_ns):
        d = rt.arm_ns(time.monotonic_ns() + lead_ns)
        task = asyncio.ensure_future(_await(d))
        await asyncio.sleep(0)
        if task.done():  # released before the task awaited: the situation did not arise
            return False
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await d
        assert d.done() and time.monotonic_ns() >= d.at_ns
        return True

    async def _await(d):
        await d

    with release_impl.ReleaseTimer() as rt:
        assert any(_run(asyncio.new_event_loop, main(rt, lead_ms * 1_000_000)) for lead_ms in (300, 3000)), \
            "the deadline was released before the task awaited it"


def test_await_from_two_loops(release_impl):
    """One deadline awaited from two loops in two threads resumes both, none before at_ns."""
    with release_impl.ReleaseTimer() as rt:
        d = rt.arm_ns(time.monotonic_ns() + 30_000_000)
        results = []

        async def waiter():
            await d
            return time.monotonic_ns() >= d.at_ns

        t = threading.Thread(target=lambda: results.append(_run(asyncio.new_event_loop, waiter())))
        t.start()
        results.append(_run(asyncio.new_event_loop, waiter()))
        t.join(LIVENESS_S)
        assert results == [True, True]


def test_a_cancelled_await_on_a_second_loop_leaves_no_thread_waiting(release_impl):
    """A deadline bound to one loop and awaited on a second is settled there by a helper thread;
    an await cancelled meanwhile (``wait_for`` timing out), or whose loop is closed, ends its
    helper within a wait step, not at the deadline: a retry loop of short waits on an hour-long
    deadline kept one thread per try. The deadline is an hour out, so nothing is released during
    the test."""
    def helpers():
        return [t for t in threading.enumerate() if t.name == "timerwheel_c-release-helper"]

    async def bind(d):
        task = asyncio.ensure_future(_await(d))
        await asyncio.sleep(0)
        return task

    async def retry(d, tries):
        for _ in range(tries):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(_await(d), 0.001)
        return len(helpers())

    async def _await(d):
        await d

    before = len(helpers())
    with release_impl.ReleaseTimer() as rt:
        d = rt.arm_ns(time.monotonic_ns() + HOUR_NS)
        first = asyncio.new_event_loop()
        task = first.run_until_complete(bind(d))  # the deadline's channel is the first loop's
        try:
            assert _run(asyncio.new_event_loop, retry(d, 20)) > before  # the situation arose
            third = asyncio.new_event_loop()
            left = third.run_until_complete(bind(d))  # its await still pending as the loop closes
            left._log_destroy_pending = False
            assert left in asyncio.all_tasks(third) and len(helpers()) > before
            third.close()
            deadline = time.monotonic() + LIVENESS_S
            while len(helpers()) > before and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(helpers()) == before and not d.done()
        finally:
            task.cancel()
            first.run_until_complete(asyncio.gather(task, return_exceptions=True))
            first.close()


def test_await_past_and_released(release_impl):
    """Awaiting a deadline already released (at arm time, or since) returns at once."""

    async def main(rt):
        await rt.arm(time.monotonic() - 1)
        d = rt.arm_ns(time.monotonic_ns() + 1_000_000)
        assert d.wait(LIVENESS_S)
        await d
        return True

    with release_impl.ReleaseTimer() as rt:
        assert _run(asyncio.new_event_loop, main(rt))


def test_loop_reuse_after_closed_loop(release_impl):
    """A timer keeps serving new loops after earlier loops closed (their channels are reaped)."""

    async def once(rt):
        d = rt.arm_ns(time.monotonic_ns() + 1_000_000)
        await d
        return d.done()

    with release_impl.ReleaseTimer() as rt:
        assert all(_run(asyncio.new_event_loop, once(rt)) for _ in range(20))


@pytest.mark.c_extension
def test_channel_made_by_new_raises_and_never_crashes(tmp_path):
    """The C core's private ``_Channel`` made by ``_Channel.__new__`` (no timer, NULL Chan) raises
    TypeError, so ``_helper_main`` can never dereference NULL. Run in a subprocess, so a segfault
    would fail this one test only. No timing: cannot flake."""
    code = textwrap.dedent("""
        import timerwheel_c._release as m
        try:
            c = m._Channel.__new__(m._Channel)
        except TypeError as e:
            assert "_channel_for" in str(e), e
        else:
            c._helper_main()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-500:]}"


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open file descriptors in /proc/self/fd")
@pytest.mark.filterwarnings("ignore::ResourceWarning")  # the unclosed loops, on their collection
@pytest.mark.parametrize("factory", [pytest.param(asyncio.new_event_loop, id="asyncio"),
                                     pytest.param(NoReaderLoop, id="no-reader")])
def test_unclosed_loops_of_ended_threads_are_not_kept(release_impl, factory):
    """200 threads each await a deadline on a loop of their own and end without closing it (as
    code that calls run_until_complete and never close() does). The timer holds loops weakly: after
    gc.collect() every loop is gone and the open file descriptors are back where they were (each
    loop held 3 or 4: its selector, its self-pipe, the wake fd), so nothing accumulates per thread.
    Without the weak hold, 200 loops stayed alive and the fds grew by 600 to 800.
    The loops really existed (201 made, counted)."""
    import gc
    import weakref

    loops = []

    def worker(rt):
        loop = factory()
        loops.append(weakref.ref(loop))
        loop.run_until_complete(rt.arm(time.monotonic() + 0.001))

    with release_impl.ReleaseTimer() as rt:
        worker(rt)  # the first channel's lazily made state is not a leak
        gc.collect()
        before = _open_fds()
        for _ in range(200):
            t = threading.Thread(target=worker, args=(rt,))
            t.start()
            t.join()
        assert len(loops) == 201
        # A helper thread (the no-reader path) holds its loop while it posts a drain, so the
        # last loops may outlive their thread by a moment: gc.collect() until a liveness bound.
        end = time.monotonic() + LIVENESS_S
        while gc.collect() >= 0 and any(ref() is not None for ref in loops) and time.monotonic() < end:
            time.sleep(0.01)
        assert sum(ref() is not None for ref in loops) == 0, "loops are kept alive"
        assert _open_fds() <= before + 2, (before, _open_fds())


@pytest.mark.c_extension
@pytest.mark.parametrize("factory", [pytest.param(asyncio.new_event_loop, id="fd"), pytest.param(NoReaderLoop, id="helper")])
def test_a_channels_helper_loop_runs_only_on_its_own_thread(factory):
    """A loop's channel (the compiled core's inbox per loop) has a method its helper thread runs, for a
    loop without add_reader. Called by anyone else it read the torn-down channel's freed state (a
    segfault), or waited for ever on a condition an fd channel never signals. It now refuses with a
    RuntimeError whatever the channel's mode or state, and the loop's awaits still resume."""
    from timerwheel_c._release import ReleaseTimer

    rt = ReleaseTimer()
    try:
        async def main():
            await rt.arm(time.monotonic() + 0.001)
            import weakref
            # The timer's channels, by loop: a field the collector sees, not an attribute.
            (chans,) = [r for r in gc.get_referents(rt) if isinstance(r, weakref.WeakKeyDictionary)]
            (chan,) = chans.values()
            with pytest.raises(RuntimeError, match="helper thread"):
                chan._helper_main()
            await rt.arm(time.monotonic() + 0.001)
            return chan

        chan = _run(factory, main())
        chan.teardown()
        with pytest.raises(RuntimeError, match="helper thread"):
            chan._helper_main()
    finally:
        rt.close()

"""The process-wide release timer: arm_at, release_timer_started, sleep_until, sleep, and fork.

These run on the core ``timerwheel_c`` loaded (C in CI, where extensions are required);
the twins' shared semantics are covered per implementation in test_release.py.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

import timerwheel_c

LIVENESS_S = 10.0


def test_exports():
    """The package exports the issue-3 API, from one core for both classes."""
    assert timerwheel_c.Deadline.__module__ == timerwheel_c.ReleaseTimer.__module__
    assert issubclass(timerwheel_c.ReleaseTimerClosed, RuntimeError)
    assert timerwheel_c.pure.ReleaseTimer is not None


def test_past_deadline_does_not_start_the_timer(tmp_path):
    """arm_at(at <= now) is released at once and does not start the process-wide timer.

    Run in a fresh interpreter, where nothing else could have started it (from an empty
    directory, so it imports the installed package, not the checkout).
    """
    code = (
        "import time, timerwheel_c as t\n"
        "d = t.arm_at(time.monotonic() - 1)\n"
        "assert d.done() and d.wait(0) and not t.release_timer_started()\n"
        "d = t.arm_at(time.monotonic() + 0.001)\n"
        "assert t.release_timer_started() and d.wait(10) and d.released_at_ns >= d.at_ns\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_sleep_and_sleep_until_never_early():
    """sleep(delay) and sleep_until(at) resume no earlier than asked, and return result."""

    async def main():
        start = time.monotonic()
        assert await timerwheel_c.sleep(0.003, result="r") == "r"
        slept_ok = time.monotonic() >= start + 0.003
        at = time.monotonic() + 0.002
        await timerwheel_c.sleep_until(at)
        until_ok = time.monotonic() >= at
        assert await timerwheel_c.sleep(0) is None
        assert await timerwheel_c.sleep(-1, result=5) == 5
        return slept_ok and until_ok

    assert asyncio.run(asyncio.wait_for(main(), LIVENESS_S))
    assert timerwheel_c.release_timer_started()


@pytest.mark.parametrize("bad, exc", [("1", TypeError), (True, TypeError), (float("nan"), ValueError)])
def test_sleep_rejects_bad_delay(bad, exc):
    """sleep() names a bad delay: TypeError for non-numbers and bool, ValueError for NaN."""
    with pytest.raises(exc):
        asyncio.run(timerwheel_c.sleep(bad))


def test_fork_child_recreates_the_timer():
    """After os.fork() the child arms, waits and awaits on its own process-wide timer, and the
    parent's timer keeps working.

    The child cannot hang the suite: an alarm kills it, and the parent reads its exit
    code (0 means every check passed; 3 a check failed; a signal, a hang).
    """
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    d_parent = timerwheel_c.arm_at(time.monotonic() + 3600)
    assert timerwheel_c.release_timer_started()
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            signal.alarm(int(LIVENESS_S))
            ok = not timerwheel_c.release_timer_started()
            ok = ok and not d_parent.done()  # the parent's deadline is readable, not released here
            d = timerwheel_c.arm_at(time.monotonic() + 0.002)
            ok = ok and timerwheel_c.release_timer_started()
            ok = ok and d.wait(LIVENESS_S) and d.released_at_ns >= d.at_ns

            async def child_main():
                start = time.monotonic()
                await timerwheel_c.sleep(0.002)
                return time.monotonic() >= start + 0.002

            ok = ok and asyncio.run(child_main())
            try:
                d_parent.wait(0.01)
                ok = False
            except timerwheel_c.ReleaseTimerClosed:
                pass
            code = 0 if ok else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    d = timerwheel_c.arm_at(time.monotonic() + 0.002)
    assert d.wait(LIVENESS_S) and d.released_at_ns >= d.at_ns
    assert not d_parent.done()


def test_fork_child_with_core_timer(release_impl):
    """A ReleaseTimer made before fork is closed in the child (its thread is not there); a new
    one works in the child; the parent's is untouched.

    Exit codes as in test_fork_child_recreates_the_timer; the child cannot hang the suite.
    """
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    with release_impl.ReleaseTimer() as rt:
        d_far = rt.arm_ns(time.monotonic_ns() + 3600 * 10**9)
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                signal.alarm(int(LIVENESS_S))
                ok = not d_far.done()
                try:
                    rt.arm_ns(time.monotonic_ns() + 1000)
                    ok = False
                except timerwheel_c.ReleaseTimerClosed:
                    pass
                del d_far  # abandoning a parent deadline must not touch the parent's lock
                with release_impl.ReleaseTimer() as rt2:
                    d = rt2.arm_ns(time.monotonic_ns() + 2_000_000)
                    ok = ok and d.wait(LIVENESS_S) and d.released_at_ns >= d.at_ns
                code = 0 if ok else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        d = rt.arm_ns(time.monotonic_ns() + 2_000_000)
        assert d.wait(LIVENESS_S) and not d_far.done()

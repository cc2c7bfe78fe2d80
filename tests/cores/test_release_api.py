"""The process-wide release timer: arm_at, release_timer_started, sleep_until, sleep, and fork.

These run on the core ``timerwheel_c`` loaded (C in CI, where extensions are required);
the twins' shared semantics are covered per implementation in test_release.py.
"""
from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

import timerwheel_c

LIVENESS_S = 10.0


def test_exports():
    """The package exports the release-timer API (ReleaseTimer, Deadline, arm_at, sleep,
    sleep_until), from one core for both classes."""
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


@pytest.mark.parametrize("bad, exc", [("1", TypeError), (None, TypeError), (float("nan"), ValueError)])
def test_sleep_rejects_bad_delay(bad, exc):
    """sleep() names a bad delay: TypeError for non-numbers, ValueError for NaN. (bool is a real
    number that asyncio.sleep accepts, so sleep accepts it too.)"""
    with pytest.raises(exc):
        asyncio.run(timerwheel_c.sleep(bad))


def _run_in_child(checks) -> None:
    """Fork; in the child run ``checks()`` (a list of failed check names) and exit 0 if it
    is empty, else 3 after writing the names (or the traceback) to a pipe.

    The child cannot hang the suite: an alarm kills it. The parent asserts exit 0 and
    shows what the child wrote.
    """
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code, report = 3, "no report"
        try:
            os.close(rfd)
            signal.alarm(int(LIVENESS_S))
            failed = checks()
            code, report = (0, "") if not failed else (3, f"failed checks: {failed}")
        except BaseException:
            import traceback

            report = traceback.format_exc()
        finally:
            os.write(wfd, report.encode()[:60000])
            os._exit(code)
    os.close(wfd)
    chunks = []
    while chunk := os.read(rfd, 65536):
        chunks.append(chunk)
    os.close(rfd)
    _, status = os.waitpid(pid, 0)
    report = b"".join(chunks).decode(errors="replace")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}: {report}"


def test_fork_child_recreates_the_timer():
    """After os.fork() the child arms, waits and awaits on its own process-wide timer, and the
    parent's timer keeps working. (The child cannot hang the suite; see _run_in_child.)
    """
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    d_parent = timerwheel_c.arm_at(time.monotonic() + 3600)
    assert timerwheel_c.release_timer_started()

    def checks():
        failed = []
        if timerwheel_c.release_timer_started():
            failed.append("started after fork")
        if d_parent.done():
            failed.append("parent deadline done")  # readable in the child, never released here
        # An hour ahead: a deadline already due by the time it is armed (a stall of the loaded
        # machine) comes back released without starting the timer.
        timerwheel_c.arm_at(time.monotonic() + 3600)
        if not timerwheel_c.release_timer_started():
            failed.append("not started by arm_at")
        d = timerwheel_c.arm_at(time.monotonic() + 0.002)
        if not (d.wait(LIVENESS_S) and d.released_at_ns >= d.at_ns):
            failed.append("child deadline")

        async def child_main():
            at_ns = time.monotonic_ns() + 2_000_000
            await timerwheel_c.sleep_until(at_ns / 1e9)
            return time.monotonic_ns() >= at_ns

        if not asyncio.run(child_main()):
            failed.append("child sleep_until early")
        try:
            d_parent.wait(0.01)
            failed.append("parent deadline waitable")
        except timerwheel_c.ReleaseTimerClosed:
            pass
        return failed

    _run_in_child(checks)
    d = timerwheel_c.arm_at(time.monotonic() + 0.002)
    assert d.wait(LIVENESS_S) and d.released_at_ns >= d.at_ns
    assert not d_parent.done()


# Forking a process with running threads is the situation under test (CPython 3.12+ warns of it).
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning")
def test_fork_child_with_core_timer(release_impl):
    """A ReleaseTimer made before fork is closed in the child (its thread is not there); a new
    one works in the child; the parent's is untouched. (See _run_in_child.)
    """
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    with release_impl.ReleaseTimer() as rt:
        d_far = rt.arm_ns(time.monotonic_ns() + 3600 * 10**9)

        def checks():
            nonlocal d_far
            failed = []
            if d_far.done():
                failed.append("parent deadline done")
            try:
                rt.arm_ns(time.monotonic_ns() + 1000)
                failed.append("parent timer armable")
            except timerwheel_c.ReleaseTimerClosed:
                pass
            d_far = None  # abandoning a parent deadline must not touch the parent's lock
            with release_impl.ReleaseTimer() as rt2:
                d = rt2.arm_ns(time.monotonic_ns() + 2_000_000)
                if not (d.wait(LIVENESS_S) and d.released_at_ns >= d.at_ns):
                    failed.append("child deadline")
            return failed

        _run_in_child(checks)
        d = rt.arm_ns(time.monotonic_ns() + 2_000_000)
        assert d.wait(LIVENESS_S) and not d_far.done()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_reads_deadlines_while_a_parent_thread_holds_the_lock():
    """Fork safety: in a forked child, reading a parent's deadline (``released_at_ns``, ``done()``,
    ``repr``) and ``rt.pending()`` must not block on a lock some parent thread held at fork time
    (the release thread holds it most of the time). Both cores guard these reads with a fork
    epoch; this test reaches into the pure twin's ``core.lock`` to hold it across the fork.
    Deterministic: a helper thread holds the lock across the fork; the child is killed by an
    alarm after 5 s if it hangs."""
    from timerwheel_c.pure import release as release_impl

    rt = release_impl.ReleaseTimer()
    try:
        d = rt.arm(time.monotonic() + 60)
        lock = rt._core.lock
        held, go = threading.Event(), threading.Event()

        def holder():
            with lock:
                held.set()
                go.wait()

        threading.Thread(target=holder, daemon=True).start()
        assert held.wait(5)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            import signal
            signal.alarm(5)
            try:
                _ = d.released_at_ns
                rt.pending()
                d.done()
                repr(d)
                os._exit(0)
            except BaseException:
                os._exit(3)
        go.set()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "child hung (-14 = SIGALRM) or raised (3)"
    finally:
        rt.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning")
def test_a_forked_child_drops_a_loop_the_parents_timer_woke_while_its_thread_held_the_lock(release_impl):
    """Fork safety of the asyncio bridge: a loop that awaited a parent's deadline has a channel on
    that timer; in a forked child, closing and collecting that loop tears the channel down, which
    must not lock the parent's timer (its release thread, busy releasing 300,000 deadlines at the
    fork, holds the lock, and is not in the child). The child exits within 5 s (an alarm kills it
    if it hangs)."""
    rt = release_impl.ReleaseTimer()
    loop = asyncio.new_event_loop()
    try:
        async def wait_one():
            await rt.arm(time.monotonic() + 0.001)

        loop.run_until_complete(wait_one())
        at_ns = time.monotonic_ns() + 10**9  # after the arming below, whatever the machine's load
        deadlines = [rt.arm_ns(at_ns) for _ in range(300_000)]
        while time.monotonic_ns() < at_ns + 5_000_000:  # the release thread is releasing them
            pass
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            signal.alarm(5)
            try:
                loop.close()
                del loop
                import gc
                gc.collect()
                os._exit(0)
            except BaseException:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "child hung (-14 = SIGALRM) or raised (3)"
        del deadlines
    finally:
        if not loop.is_closed():
            loop.close()
        rt.close()


@pytest.mark.parametrize("override", ["forgets the base", "raises"])
def test_a_subclass_whose_close_does_not_stop_the_thread_is_still_freed_safely(release_impl, override, tmp_path):
    """Dropping a ReleaseTimer stops its thread itself, whatever a subclass's ``close()`` does: one
    that forgets to call the base's, or raises, must not leave the thread running on freed memory
    (the compiled core crashed). Run in a child process, so that a crash fails this test alone."""
    script = f"""
import time
from {release_impl.__name__} import ReleaseTimer
class R(ReleaseTimer):
    def close(self):
        if {override == "raises"!r}:
            raise RuntimeError("close failed")
for _ in range(30):
    r = R()
    d = r.arm(time.monotonic() + 0.001)
    del d, r
    time.sleep(0.002)
print("freed")
"""
    # In tmp_path, not the checkout: the child imports the installed package.
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "freed", (out.returncode, out.stderr[-2000:])


def test_a_subclass_takes_arguments_of_its_own_and_passes_the_backend_to_the_base(release_impl):
    """A subclass whose constructor has its own arguments, and passes ``backend`` to
    ``super().__init__``, gets that backend, as any Python base class allows (the compiled core
    read the subclass's arguments as the backend, and refused super().__init__(backend=...)); one
    whose ``__init__`` never calls the base's still releases, on slice. Each wait is for a deadline
    1 ms ahead, bounded by LIVENESS_S."""
    class Named(release_impl.ReleaseTimer):
        def __init__(self, name, backend=None):
            super().__init__(backend=backend)
            self.name = name

    with Named("retransmits", "condvar") as rt:
        assert (rt.name, rt.backend) == ("retransmits", "condvar")
        assert rt.arm(time.monotonic() + 0.001).wait(LIVENESS_S)
    with pytest.raises(ValueError, match="'condvr'"):
        Named("retransmits", "condvr")

    class Bare(release_impl.ReleaseTimer):
        def __init__(self):
            pass

    with Bare() as rt:
        assert rt.backend == "slice"
        assert rt.arm(time.monotonic() + 0.001).wait(LIVENESS_S)


def test_sleep_accepts_any_real_delay():
    """``timerwheel_c.sleep(delay)`` is "like asyncio.sleep": every ``numbers.Real`` delay that
    asyncio.sleep accepts (``np.int64(0)``, ``np.float32(0.001)``, ``Fraction(1, 1000)``,
    ``False``) sleeps and returns ``result``. Each sleep is at most 1 ms; the 5 s bound is
    liveness only."""
    import asyncio
    from fractions import Fraction

    import numpy as np

    import timerwheel_c

    async def main():
        for delay in (np.int64(0), np.float32(0.001), Fraction(1, 1000), np.float64(0.001), False):
            assert await asyncio.wait_for(timerwheel_c.sleep(delay, result="r"), 5) == "r"

    asyncio.run(main())


def test_sleep_rejects_bad_delays_naming_the_delay():
    """``timerwheel_c.sleep`` raises TypeError for a non-real delay and ValueError naming the
    *delay* (not the computed deadline) for NaN, +infinity and delays beyond the int64 ns range,
    including ints too large for a float. Nothing is armed: cannot flake."""
    import asyncio

    import timerwheel_c

    async def main():
        with pytest.raises(TypeError, match="delay must be a real number"):
            await timerwheel_c.sleep("1")
        for delay in (float("nan"), float("inf"), 1e300, 2**1024):
            with pytest.raises(ValueError, match="^" + re.escape(f"delay={delay!r} s ")):
                await timerwheel_c.sleep(delay)

    asyncio.run(main())


def test_sleep_longer_than_a_release_deadline_takes_is_slept_in_steps(monkeypatch):
    """The release timer refuses a deadline more than 10 years ahead (wall-clock time by mistake),
    but a sleep is relative: ``sleep(4e8)`` (12.7 years) sleeps, as asyncio.sleep does, where it
    raised ValueError blaming NaN or the int64 range. Its steps end at the deadline, never before:
    with 10 ms steps, a 50 ms sleep ends at or after 50 ms on the monotonic clock."""
    import timerwheel_c
    from timerwheel_c import process_timer

    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(timerwheel_c.sleep(4e8), 0.05)
        monkeypatch.setattr(process_timer, "_STEP_S", 0.01)
        start = time.monotonic()
        assert await asyncio.wait_for(timerwheel_c.sleep(0.05, result="r"), 5) == "r"
        assert time.monotonic() - start >= 0.05

    asyncio.run(main())


def test_a_sleep_already_due_when_armed_still_yields_to_the_loop():
    """``sleep(1e-7)`` is due by the time it is armed, a few µs later; it yields to the loop once
    anyway, as asyncio.sleep of any delay does (a loop of such sleeps starved every other task:
    0 turns in 2,000 sleeps); so does ``sleep_until`` of a time past."""
    import timerwheel_c

    async def main():
        turns = [0]
        stop = asyncio.Event()

        async def other():
            while not stop.is_set():
                turns[0] += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(other())
        await asyncio.sleep(0)
        before = turns[0]
        for _ in range(100):
            await timerwheel_c.sleep(1e-7)
            await timerwheel_c.sleep_until(time.monotonic() - 1)
        stop.set()
        await task
        return turns[0] - before

    assert asyncio.run(main()) >= 100


def test_a_deadline_in_float_seconds_becomes_the_least_ns_at_or_after_it_exactly():
    """arm(at) takes float seconds, rounded up to whole ns so a release is never early: the exact
    ceiling of at * 10**9, never 1 ns below it as a ceiling of the rounded float product was (0.8 %
    of deadlines near a machine's uptime). Checked with exact fractions; pure arithmetic."""
    import math
    import random
    from fractions import Fraction

    from timerwheel_c._release_common import _seconds_to_ns, _timeout_ns

    rng = random.Random(7)
    for at in [76900.12345678901, 0.1, 1e-9, -0.3, 123456.789] + [rng.uniform(0, 2e6) for _ in range(20_000)]:
        exact = Fraction(at) * 10**9
        assert _seconds_to_ns(at) == math.ceil(exact), at
        if at > 0:
            assert _timeout_ns(at) == math.ceil(exact), at

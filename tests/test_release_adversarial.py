"""Regression tests for ReleaseTimer/Deadline bugs found by adversarial testing.

Each test was xfail(strict=True) until its fix landed.
"""
import copy
import gc
import os
import pickle
import re
import subprocess
import sys
import textwrap
import threading
import time

import pytest


@pytest.mark.parametrize("op", ["done", "wait", "released_at_ns", "repr"])
def test_bare_deadline_new_raises_not_crashes(release_impl, op, tmp_path):
    """A Deadline made by ``Deadline.__new__`` (bypassing arm()) must raise a Python exception (or
    behave), never crash the interpreter. Run in a subprocess, so a segfault fails this one test only;
    the C core dereferenced its None ``_rt`` and died with SIGSEGV. (The fix makes ``__new__`` itself
    raise TypeError; the op then runs on ``d = None`` and raises too.)"""
    code = textwrap.dedent(f"""
        import importlib
        m = importlib.import_module({release_impl.__name__!r})
        d = None
        try:
            d = m.Deadline.__new__(m.Deadline)
        except TypeError:
            pass
        try:
            {{"done": lambda: d.done(), "wait": lambda: d.wait(0.01),
              "released_at_ns": lambda: d.released_at_ns, "repr": lambda: repr(d)}}[{op!r}]()
        except Exception:
            pass
        # the pure twin's bare object has no slots set: its __del__ must not complain either
        d = None
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-500:]}"
    assert "Exception ignored" not in proc.stderr, proc.stderr[-500:]


def test_deadline_cannot_be_constructed_directly(release_impl):
    """A Deadline comes only from ``arm``/``arm_ns``: ``Deadline.__new__(Deadline)`` and
    ``Deadline()`` raise TypeError naming the factory, so no Deadline with an unset slot exists.
    Pure logic, no timing: cannot flake."""
    for make in (lambda: release_impl.Deadline.__new__(release_impl.Deadline), release_impl.Deadline,
                 lambda: release_impl.Deadline(None, -1, 0, 0, 0)):
        with pytest.raises(TypeError, match="ReleaseTimer.arm"):
            make()


@pytest.mark.c_extension
def test_bare_channel_new_raises_not_crashes(tmp_path):
    """The C core's private ``_Channel`` made by ``_Channel.__new__`` (no timer, NULL Chan) must
    raise TypeError, not let ``_helper_main`` dereference NULL (it died with SIGSEGV). Run in a
    subprocess, so a segfault fails this one test only. No timing: cannot flake."""
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


def test_copy_of_deadline_does_not_abandon_original(release_impl):
    """Never lost: a Deadline still referenced is released. ``copy.copy(d)``, ``copy.deepcopy(d)``
    and pickling must not make a second owner of d's slot whose garbage collection abandons it:
    they raise TypeError, and d is then still released. Cannot flake: the deadline is 50 ms out
    and the wait allows 10 s."""
    with release_impl.ReleaseTimer() as rt:
        d = rt.arm(time.monotonic() + 0.05)
        for dup in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError, match="cannot be copied or pickled"):
                dup(d)
        gc.collect()
        assert d.wait(10) is True
        assert d.done()
        assert d.released_at_ns >= d.at_ns


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_child_does_not_hang_on_parents_lock_pure():
    """Fork safety: in a forked child, reading a parent's deadline (``released_at_ns``, ``done()``,
    ``repr``) and ``rt.pending()`` must not block on a lock some parent thread held at fork time
    (the release thread holds it most of the time). The C core guards these with its fork epoch;
    the pure twin takes ``core.lock`` and hangs. Deterministic: a helper thread holds the lock
    across the fork; the child is killed by an alarm after 5 s if it hangs. (The C core guards
    these reads with its fork epoch and passes the same check.)"""
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
                d.released_at_ns
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


def test_huge_int_arguments_get_documented_errors(release_impl):
    """Out-of-range input gets the documented exception, never OverflowError from ``float()``:
    ``arm(2**1024)`` and ``arm(-2**1024)`` are "out of the int64 ns range" (ValueError naming the
    value); ``wait(timeout=-2**1024)`` is a timeout <= 0 (a poll returning False). Cannot flake:
    the deadline is 60 s out and every call returns at once."""
    from fractions import Fraction

    with release_impl.ReleaseTimer() as rt:
        for at in (2**1024, -(2**1024), Fraction(2**1100, 3)):
            with pytest.raises(ValueError, match="out of the int64 nanosecond range"):
                rt.arm(at)
        d = rt.arm(time.monotonic() + 60)
        assert d.wait(timeout=-(2**1024)) is False
        assert d.wait(timeout=Fraction(-(2**1100), 3)) is False
        assert not d.done()


def test_sleep_accepts_any_real_delay():
    """``timerwheel_c.sleep(delay)`` is "like asyncio.sleep" and documents TypeError only for a
    non-real delay, yet ``np.int64(0)``, ``np.float32(0.001)`` and ``Fraction(1, 1000)`` (all
    ``numbers.Real``, all accepted by asyncio.sleep) raise "delay must be a number of seconds".
    Each sleep is at most 1 ms; the 5 s bound is liveness only."""
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

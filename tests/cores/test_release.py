"""ReleaseTimer and Deadline properties, against the C core and the pure twin via ``release_impl``.

Timing tests only assert what holds on a loaded 2-core machine: a deadline is released
and never before its ``at_ns``, and things happen within liveness bounds of seconds.
Lateness numbers live in the bench (``python bench/run.py --only lateness``).
"""
from __future__ import annotations

import copy
import gc
import pickle
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from timerwheel_c.errors import ReleaseTimerClosed

LIVENESS_S = 10.0  # far longer than any release can take, even on a saturated machine
HOUR_NS = 3600 * 10**9
BACKENDS = ["slice", "condvar"]


def _eventually(predicate, timeout_s: float = LIVENESS_S) -> bool:
    until = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > until:
            return False
        time.sleep(0.005)
    return True


@pytest.mark.parametrize("backend", BACKENDS)
def test_never_early_over_300_spaced_samples(release_impl, backend):
    """Each of 300 deadlines, spaced 0-90 us apart over ~15 ms, is released and never before its at_ns.

    Never-early is structural (the thread only releases entries with at_ns <= now), so
    no load can break it; the waits have a liveness bound of seconds.
    """
    with release_impl.ReleaseTimer(backend) as rt:
        base = time.monotonic_ns() + 2_000_000
        deadlines, at = [], base
        for i in range(300):
            at += (i * 7919) % 97 * 1000  # 0..96 us steps in a scrambled order
            deadlines.append(rt.arm_ns(at))
        for d in deadlines:
            assert d.wait(LIVENESS_S)
            assert time.monotonic_ns() >= d.at_ns
            assert d.done()
            assert d.released_at_ns is not None and d.released_at_ns >= d.at_ns


@pytest.mark.parametrize("backend", BACKENDS)
def test_float_seconds_never_early(release_impl, backend):
    """arm(at) in float seconds releases no earlier than at on time.monotonic(); at_ns rounds up."""
    with release_impl.ReleaseTimer(backend) as rt:
        at = time.monotonic() + 0.003
        d = rt.arm(at)
        assert d.at_ns >= at * 1e9
        assert d.wait(LIVENESS_S)
        assert time.monotonic() >= at
        assert d.released_at_ns >= d.at_ns


@pytest.mark.parametrize("backend", BACKENDS)
def test_preemption(release_impl, backend):
    """A near deadline armed while the thread waits on a far one is released, far one untouched.

    The far deadline is an hour out, so a thread that did not preempt its wait would
    miss the 10 s liveness bound by an hour: no load makes this flake.
    """
    with release_impl.ReleaseTimer(backend) as rt:
        far = rt.arm_ns(time.monotonic_ns() + HOUR_NS)
        assert _eventually(lambda: rt.wakes >= 1)  # the thread is in its wait on the far one
        time.sleep(0.02)
        near = rt.arm_ns(time.monotonic_ns() + 5_000_000)
        assert near.wait(LIVENESS_S)
        assert near.released_at_ns >= near.at_ns
        assert not far.done()
        assert rt.pending() == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_idle_parks(release_impl, backend):
    """With nothing armed, the thread makes at most one wake over a 200 ms idle window.

    The thread first releases a deadline (so it has run), then parks on an untimed wait;
    an idle thread can only wake if signalled, so load cannot add wakes.
    """
    with release_impl.ReleaseTimer(backend) as rt:
        assert rt.arm_ns(time.monotonic_ns() + 1_000_000).wait(LIVENESS_S)
        assert rt.pending() == 0
        time.sleep(0.05)
        before = rt.wakes
        assert before >= 1
        time.sleep(0.2)
        assert rt.wakes - before <= 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(min_value=0, max_value=20), min_size=1, max_size=200))
def test_min_heap_order_and_fifo_ties(release_impl, offsets):
    """Deadlines are released by at_ns, and equal at_ns in arm order, as the order in which their
    awaiting tasks resume shows: one loop awaits them all, its channel resolves their futures in
    release order, and asyncio resumes the tasks in that order. The offsets are ns apart, so the
    thread releases many in one step; few distinct offsets force many ties.

    The order is only meaningful if every task was suspended on its deadline before the first
    release (asserted): on a machine so loaded that one was not, the attempt is repeated with the
    deadlines further out, and the test fails only if the situation never arose.
    """
    import asyncio

    async def attempt(rt, lead_ns):
        order = []
        base = time.monotonic_ns() + lead_ns
        ds = [rt.arm_ns(base + off) for off in offsets]

        async def wait(i):
            await ds[i]
            order.append(i)

        tasks = [asyncio.ensure_future(wait(i)) for i in range(len(ds))]
        await asyncio.sleep(0)  # every task runs up to its await
        suspended = not any(d.done() for d in ds)
        await asyncio.wait_for(asyncio.gather(*tasks), LIVENESS_S)
        return suspended, order

    with release_impl.ReleaseTimer() as rt:
        loop = asyncio.new_event_loop()
        try:
            for lead_ms in (20, 200, 2000):
                suspended, order = loop.run_until_complete(attempt(rt, lead_ms * 1_000_000))
                if suspended:
                    break
        finally:
            loop.close()
        assert suspended, "a deadline was released before every task awaited it"
        assert order == sorted(range(len(offsets)), key=lambda i: (offsets[i], i))
        assert rt.pending() == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_released_with_abandoned_interleaved(release_impl, backend):
    """Live and abandoned deadlines interleaved over ~700 ms (several sweep intervals, heap > 64):
    every live one is released, never early, and the abandoned ones are gone afterwards.

    The sweep only ever frees entries whose Deadline object is gone; the live ones are
    held in a list, so a sweep that removed one would leave it unreleased past the
    liveness bound. The heap really exceeds the sweep threshold (asserted): on a machine so loaded
    that this thread stalls past most deadlines before it checks, the attempt is released and
    repeated, and the test fails only if the situation never arose.
    """
    with release_impl.ReleaseTimer(backend) as rt:
        for _attempt in range(5):
            # Collected before the due times are fixed, not between the arming and the check: a full
            # collection of a long run's heap can outlast their whole spread on a loaded machine. The
            # abandoned deadlines need none: their reference count frees them at `del d`.
            gc.collect()
            base = time.monotonic_ns() + 5_000_000
            live = []
            peak = 0  # read while arming: a stall after the loop would release most before one look
            for i in range(400):
                d = rt.arm_ns(base + i * 1_750_000)
                if i % 2 == 0:
                    live.append(d)
                del d
                peak = max(peak, rt.pending())
            if peak > 64:
                break
            assert all(d.wait(LIVENESS_S) for d in live)
            assert _eventually(lambda: rt.pending() == 0)
        assert peak > 64, "the heap never held more than 64 deadlines at once"
        for d in live:
            assert d.wait(LIVENESS_S)
            assert d.released_at_ns >= d.at_ns
        assert _eventually(lambda: rt.pending() == 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sweep_of_10000_abandoned(release_impl, backend):
    """10,000 abandoned far deadlines are swept long before their instants; 10 live ones stay.

    They are an hour out, so only the sweep can empty the heap; live ones are referenced
    and must still be pending afterwards. The bound is seconds against a 250 ms interval.
    The thread is first parked on the earliest of them, with a heap too small to sweep,
    so the test also proves a heap growing past the threshold cuts that wait short.
    """
    with release_impl.ReleaseTimer(backend) as rt:
        base = time.monotonic_ns() + HOUR_NS
        first = rt.arm_ns(base)
        assert _eventually(lambda: rt.wakes >= 1)
        time.sleep(0.02)  # parked on `first`
        armed = [first] + [rt.arm_ns(base + i) for i in range(1, 10_000)]
        del first
        live = armed[::1000]
        assert rt.pending() == 10_000
        del armed
        gc.collect()
        assert _eventually(lambda: rt.pending() == 10)
        assert not any(d.done() for d in live)  # so the 10 entries left are the live ones


def test_close_with_pending_waiters(release_impl):
    """close() returns promptly with far deadlines pending and wakes a blocking waiter with
    ReleaseTimerClosed; later arms raise it too.

    The deadlines are an hour out: a close that waited for them, or a waiter left
    hanging, would miss the liveness bound by an hour.
    """
    rt = release_impl.ReleaseTimer()
    d = rt.arm_ns(time.monotonic_ns() + HOUR_NS)
    others = [rt.arm_ns(time.monotonic_ns() + HOUR_NS + i) for i in range(100)]
    outcome = []
    waiting = threading.Event()

    def waiter():
        waiting.set()
        try:
            outcome.append(d.wait())
        except ReleaseTimerClosed as exc:
            outcome.append(exc)

    t = threading.Thread(target=waiter)
    t.start()
    assert waiting.wait(LIVENESS_S)
    time.sleep(0.05)  # let the waiter block inside wait()
    start = time.monotonic()
    rt.close()
    assert time.monotonic() - start < LIVENESS_S
    t.join(LIVENESS_S)
    assert not t.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], ReleaseTimerClosed)
    assert not d.done() and not any(o.done() for o in others)
    with pytest.raises(ReleaseTimerClosed):
        d.wait(0)
    with pytest.raises(ReleaseTimerClosed):
        rt.arm_ns(time.monotonic_ns() + HOUR_NS)
    rt.close()  # idempotent


def test_wait_timeout_returns_false(release_impl):
    """wait(timeout) on a far deadline returns False after the timeout; wait(0) polls."""
    with release_impl.ReleaseTimer() as rt:
        d = rt.arm_ns(time.monotonic_ns() + HOUR_NS)
        assert d.wait(0) is False
        assert d.wait(0.02) is False
        assert not d.done() and d.released_at_ns is None


def test_past_deadline_is_released_without_the_heap(release_impl):
    """arm(at <= now) returns a released Deadline and leaves the heap empty."""
    with release_impl.ReleaseTimer() as rt:
        d = rt.arm(time.monotonic() - 1.0)
        assert d.done() and d.wait() and d.released_at_ns >= d.at_ns
        assert rt.arm_ns(0).done()
        assert rt.pending() == 0
        assert release_impl.past_deadline(time.monotonic() - 1.0).done()
        assert release_impl.past_deadline(time.monotonic() + 3600.0) is None


@pytest.mark.parametrize("bad", ["1", None, True, [1], 1.5])
def test_arm_ns_rejects_non_int(release_impl, bad):
    """arm_ns takes an int of ns; anything else (bool and float too) is a TypeError naming it."""
    with release_impl.ReleaseTimer() as rt:
        with pytest.raises(TypeError, match="at_ns"):
            rt.arm_ns(bad)


@pytest.mark.parametrize("bad", [2**63, -(2**63) - 1, 10**30])
def test_arm_ns_rejects_out_of_range(release_impl, bad):
    """arm_ns out of int64 is a ValueError naming the value, never a wrapped integer."""
    with release_impl.ReleaseTimer() as rt:
        with pytest.raises(ValueError, match=str(bad)):
            rt.arm_ns(bad)


@pytest.mark.parametrize(
    "bad, exc", [(float("nan"), ValueError), (float("inf"), ValueError), (1e300, ValueError),
                 ("1", TypeError), (True, TypeError), (None, TypeError)]
)
def test_arm_rejects_bad_seconds(release_impl, bad, exc):
    """arm takes finite float seconds in the int64 ns range; the error names the value."""
    with release_impl.ReleaseTimer() as rt:
        with pytest.raises(exc, match="at"):
            rt.arm(bad)


def test_backend_choice(release_impl, monkeypatch):
    """The argument wins (any case), else $TIMERWHEEL_C_RELEASE_TIMER, else slice. A misspelt argument is
    a ValueError naming it (it was taken for slice, silently); a misspelt environment value is slice
    with a RuntimeWarning naming it."""
    monkeypatch.setenv("TIMERWHEEL_C_RELEASE_TIMER", "condvar")
    with release_impl.ReleaseTimer() as rt:
        assert rt.backend == "condvar"
    with release_impl.ReleaseTimer(" Slice ") as rt:
        assert rt.backend == "slice"
    monkeypatch.setenv("TIMERWHEEL_C_RELEASE_TIMER", "condvr")
    with pytest.warns(RuntimeWarning, match="'condvr'") as caught:
        with release_impl.ReleaseTimer() as rt:
            assert rt.backend == "slice"
    # It names the line that made the timer, in both twins (the compiled one named its caller's caller).
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, sys._getframe().f_lineno - 3)]
    monkeypatch.delenv("TIMERWHEEL_C_RELEASE_TIMER")
    with release_impl.ReleaseTimer() as rt:
        assert rt.backend == "slice"
    for bad in ("condvr", "", "nonsense"):
        with pytest.raises(ValueError, match=repr(bad)):
            release_impl.ReleaseTimer(bad)


def test_many_blocking_waiters(release_impl):
    """Eight threads blocked on the same and on different deadlines are all woken, none early."""
    with release_impl.ReleaseTimer() as rt:
        base = time.monotonic_ns() + 20_000_000
        ds = [rt.arm_ns(base + (i % 3) * 1_000_000) for i in range(8)]
        results = [None] * 8

        def waiter(i):
            results[i] = ds[i].wait(LIVENESS_S) and time.monotonic_ns() >= ds[i].at_ns

        threads = [threading.Thread(target=waiter, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(LIVENESS_S)
        assert results == [True] * 8


def test_dropped_timer_closes(release_impl):
    """A ReleaseTimer dropped without close() stops its thread (no thread leak).

    Threads are seen with psutil as OS thread ids, which covers the C core's native
    thread too; only the ids that appeared with the timer are followed, so helper
    threads of earlier tests finishing late cannot disturb the count.
    """
    proc = psutil.Process()

    def tids():
        return {t.id for t in proc.threads()}

    before = tids()
    rt = release_impl.ReleaseTimer()
    rt.arm_ns(time.monotonic_ns() + HOUR_NS)
    new = tids() - before
    assert new  # the release thread
    del rt
    gc.collect()
    assert _eventually(lambda: not (new & tids()))


@pytest.mark.c_extension
def test_c_release_needs_no_gil():
    """The C release thread releases a deadline while a Python thread holds the GIL throughout.

    The switch interval is raised to 60 s, so the spinning thread keeps the GIL for its
    whole spin (up to the 10 s liveness bound) and no other Python thread runs. It
    polls ``done()``, a read of native memory; seeing the deadline released before the
    spin ends proves the release thread never needed the GIL. Only an OS starving the
    release thread for 10 s could fail it. (The pure twin cannot pass this by design.)
    """
    import sys

    from timerwheel_c import _release

    with _release.ReleaseTimer() as rt:
        seen = {}

        def spin(d):
            end = time.monotonic_ns() + int(LIVENESS_S * 1e9)
            while time.monotonic_ns() < end and not d.done():
                pass
            seen["done"] = d.done()
            seen["spin_end_ns"] = time.monotonic_ns()

        old = sys.getswitchinterval()
        sys.setswitchinterval(60.0)
        try:
            d = rt.arm_ns(time.monotonic_ns() + 20_000_000)
            t = threading.Thread(target=spin, args=(d,))
            t.start()
            t.join()
        finally:
            sys.setswitchinterval(old)
        assert seen["done"]
        assert d.at_ns <= d.released_at_ns <= seen["spin_end_ns"]


@pytest.mark.parametrize("op", ["done", "wait", "released_at_ns", "repr"])
def test_deadline_made_by_new_raises_and_never_crashes(release_impl, op, tmp_path):
    """A Deadline made by ``Deadline.__new__`` (bypassing arm()) raises a Python exception, never
    crashes the interpreter: ``__new__`` itself raises TypeError, so the op runs on ``d = None``
    and raises too. Run in a subprocess, so a segfault would fail this one test only."""
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


def test_copy_and_pickle_are_refused_and_the_original_is_still_released(release_impl):
    """Never lost: a Deadline still referenced is released. ``copy.copy(d)``, ``copy.deepcopy(d)``
    and pickling must not make a second owner of d's slot whose garbage collection abandons it:
    they raise TypeError, and d is then still released. Cannot flake: the deadline is 50 ms out
    and the wait allows 10 s."""
    with release_impl.ReleaseTimer() as rt:
        d = rt.arm(time.monotonic() + 0.05)
        for dup in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError, match="cannot be copied or pickled"):
                dup(d)
            # The timer itself too, in both twins alike: a pure copy shared the release thread, and the
            # compiled one raised Cython's own words.
            with pytest.raises(TypeError, match="^ReleaseTimer objects cannot be copied or pickled: a copy would "
                                                "share the original's timers$"):
                dup(rt)
        gc.collect()
        assert d.wait(10) is True
        assert d.done()
        assert d.released_at_ns >= d.at_ns


def test_huge_int_arguments_get_the_documented_errors(release_impl):
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

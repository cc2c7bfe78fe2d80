"""Regression tests for TimerWheel bugs found by adversarial testing (breaker).

Each test is xfail(strict=True) until its fix lands; see the reason of each.
"""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

MAX_DUE_MS = 2**62


def _gc_scheduling_inside_advance_array(module_name, tmp_path):
    """No memory corruption and no lost timers when Python code run by the garbage collector
    (a finalizer, weakref callback or gc callback) schedules on the wheel *during* advance_array.
    The C core sizes its output array from the pending count, then creates a memoryview (a GC
    allocation); timers the GC code schedules fire into the buffer past its end (a heap overflow:
    the process then spins at exit) and are missing from the result. Property checked in a
    subprocess: every timer is either in the returned array or still pending. Deterministic: the
    callback only acts once a collection has started inside the call (asserted)."""
    code = textwrap.dedent(f"""
        import gc, os, importlib
        m = importlib.import_module({module_name!r})
        w = m.TimerWheel(0)
        w.schedule(1, 0)
        total = 1
        inside, hits = [False], []
        def cb(phase, info):
            global total
            if phase == "start" and inside[0] and not hits:
                hits.append(1)
                for i in range(20000):
                    w.schedule(1, 7)
                total += 20000
        gc.callbacks.append(cb)
        gc.set_threshold(1, 1, 1)
        fired = 0
        for trial in range(5000):
            inside[0] = True
            out = w.advance_array(w.now_ms() + 5)
            inside[0] = False
            fired += len(out)
            if hits:
                break
            w.schedule(1, 0); total += 1
        gc.set_threshold(700, 10, 10)
        gc.callbacks.remove(cb)
        print(bool(hits), fired, len(w), total, flush=True)
        os._exit(0)   # skip teardown: a corrupted heap may hang it
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-500:]
    hit, fired, pending, total = proc.stdout.split()
    assert hit == "True", "no collection ran inside advance_array: the test proved nothing"
    assert int(fired) + int(pending) == int(total)


@pytest.mark.xfail(strict=True, reason="C advance_array sizes its buffer, then allocates (GC may run and schedule): heap overflow")
def test_advance_array_with_gc_scheduling_inside_c(tmp_path):
    """The compiled core under the property of ``_gc_scheduling_inside_advance_array`` (the pure
    twin holds it; valgrind shows the C core's invalid 8-byte write in TimerWheel._run)."""
    pytest.importorskip("timerwheel_c._wheel")
    _gc_scheduling_inside_advance_array("timerwheel_c._wheel", tmp_path)


@pytest.mark.xfail(strict=True, reason="schedule_many clamps delays <= 0 to 1 after its 2**62 check: arms an unfireable timer")
def test_schedule_many_clamped_delay_beyond_max_due(wheel_impl):
    """Out-of-range input gets an exception, as the scalar call does: at now_ms == 2**62,
    ``schedule(0, t)`` raises ValueError (due 2**62 + 1), but ``schedule_many([0], [t])`` arms a
    timer due at 2**62 + 1, which no advance can ever reach (advance beyond 2**62 raises), so it is
    pending forever. The batch must raise ValueError and schedule nothing."""
    w = wheel_impl.TimerWheel(now_ms=MAX_DUE_MS)
    with pytest.raises(ValueError):
        w.schedule(0, 1)
    with pytest.raises(ValueError):
        w.schedule_many(np.array([0, -5], dtype=np.int64), np.array([1, 2], dtype=np.uint64))
    assert len(w) == 0


@pytest.mark.xfail(strict=True, reason="a list of valid tokens mixing < and >= 2**63 becomes float64 in numpy: TypeError")
def test_schedule_many_accepts_list_of_valid_u64_tokens(wheel_impl):
    """``tokens`` is any int in [0, 2**64): a plain list ``[1, 2**63]`` holds only valid tokens, but
    numpy turns it into float64 and the call raises TypeError "not dtype float64" (which also
    loses precision if converted). It must schedule both, like the scalar calls, and fire them
    unchanged."""
    w = wheel_impl.TimerWheel(0)
    ids = w.schedule_many(5, [1, 2**63])
    assert len(ids) == 2
    assert [int(t) for t in w.advance_array(5)] == [1, 2**63]


@pytest.mark.xfail(strict=True, reason="pure TimerWheel.__init__ on a wheel in use silently drops every pending timer (C raises)")
def test_reinit_of_wheel_in_use_does_not_drop_timers_pure():
    """Never lost, and the twins behave the same: calling ``__init__`` again on a wheel holding
    a pending timer raises RuntimeError in the C core ("already in use"), but the pure twin
    re-initializes and silently forgets the timer, which then never fires. (The C core passes.)"""
    from timerwheel_c.pure import wheel as wheel_impl

    w = wheel_impl.TimerWheel(0)
    w.schedule(10, 1)
    with pytest.raises(RuntimeError):
        w.__init__(5)
    assert w.advance(100) == [1]

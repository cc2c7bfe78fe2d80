"""Regression tests for TimerWheel bugs found by adversarial testing.

Each test proves a fix: it failed before the fix landed (see its docstring).
"""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

MAX_DUE_MS = 2**62


def _python_code_inside_a_call(module_name, tmp_path, call):
    """No memory corruption and no lost timers when Python code schedules on the wheel *during* a
    call that fills C memory from the wheel's state: the garbage collector's (a finalizer, weakref
    callback or gc.callbacks) inside ``advance`` (it allocates the result list), or a foreign
    ``__index__`` converting ``advance_array``'s ``now_ms``. An older core sized its output buffer,
    then allocated a memoryview (a GC allocation): timers the GC code scheduled were written past
    the buffer's end (a heap overflow; valgrind: invalid write in TimerWheel._run). Property checked
    in a subprocess: every timer is either returned or still pending. Deterministic: the hook only
    acts once inside the call (for the GC, some trial's collection lands there: the trials shift
    the gen-0 count's phase), and the test asserts that it did."""
    code = textwrap.dedent(f"""
        import gc, os, importlib
        m = importlib.import_module({module_name!r})
        w = m.TimerWheel(0)
        w.schedule(1, 0)
        total = 1
        inside, hits = [False], []
        def hook():
            global total
            if inside[0] and not hits:
                hits.append(1)
                for i in range(20000):
                    w.schedule(1, 7)
                total += 20000
        def cb(phase, info):
            if phase == "start":
                hook()
        class Now:
            def __init__(self, ms):
                self.ms = ms
            def __index__(self):
                hook()
                return self.ms
        gc.callbacks.append(cb)
        gc.set_threshold(1, 1, 1)
        gc.collect()   # start from a zero gen-0 count whatever the imports left
        fired = 0
        for trial in range(5000):
            # Shifts the gen-0 count's phase from trial to trial (frees decrement it), so some
            # trial's collection starts inside the call.
            pad = []
            for _ in range(trial % 3):
                pad.append([])
            inside[0] = True
            out = {call}
            inside[0] = False
            del pad
            fired += len(out)
            if hits:
                break
            w.schedule(1, 0); total += 1
        gc.set_threshold(700, 10, 10)
        gc.callbacks.remove(cb)
        fired += len(w.advance(w.now_ms() + 5))
        print(bool(hits), fired, len(w), total, flush=True)
        os._exit(0)   # skip teardown: a corrupted heap may hang it
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-500:]
    hit, fired, pending, total = proc.stdout.split()
    assert hit == "True", "no Python code ran inside the call: the test proved nothing"
    assert int(fired) + int(pending) == int(total)
    assert int(pending) == 0


@pytest.mark.parametrize("call", [
    "w.advance_array(Now(w.now_ms() + 5))",
    "w.advance(w.now_ms() + 5)",
    "w.advance(Now(w.now_ms() + 5), [])",
])
def test_advance_array_with_gc_scheduling_inside_c(tmp_path, call):
    """The compiled core under the property of ``_python_code_inside_a_call``, for each call that
    hands out fired tokens (the pure twin holds it: it has no C buffer)."""
    pytest.importorskip("timerwheel_c._wheel")
    _python_code_inside_a_call("timerwheel_c._wheel", tmp_path, call)


def test_schedule_many_rechecks_due_times_after_gc_advances_the_wheel(wheel_impl):
    """No timer is ever armed beyond 2**62 ms, even when the GC's Python code (here a gc callback)
    advances the wheel to near 2**62 while ``schedule_many`` converts its arrays (after its range
    check read ``now_ms``): the batch raises ValueError and arms nothing, or arms timers that the
    final ``advance(2**62)`` fires. Deterministic: the callback acts once, inside the call
    (asserted), and with a gen-0 threshold of 1 the call's allocations always start a collection."""
    import gc

    w = wheel_impl.TimerWheel(0)
    inside, hits = [False], []

    def cb(phase, info):
        if phase == "start" and inside[0] and not hits:
            hits.append(1)
            w.advance(MAX_DUE_MS - 10)

    delays = np.array([100, 5], dtype=np.int64)
    tokens = np.array([1, 2], dtype=np.uint64)
    gc.callbacks.append(cb)
    old = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        inside[0] = True
        try:
            w.schedule_many(delays, tokens)
        except ValueError:
            pass
        inside[0] = False
    finally:
        gc.set_threshold(*old)
        gc.callbacks.remove(cb)
    assert hits, "no collection ran inside schedule_many: the test proved nothing"
    w.advance(MAX_DUE_MS)
    assert len(w) == 0


def test_due_error_names_the_clamped_due_time(wheel_impl):
    """The ValueError for a due time beyond 2**62 ms names the real due time: at now_ms == 2**62 a
    delay of 0 is clamped to 1, so the due time is 2**62 + 1 (not now + after_ms == 2**62, which
    would be in range). Deterministic: pure arithmetic."""
    w = wheel_impl.TimerWheel(now_ms=MAX_DUE_MS)
    for call in (lambda: w.schedule(0, 1), lambda: w.schedule_many(np.array([0]), np.array([1]))):
        with pytest.raises(ValueError, match=f"due time {MAX_DUE_MS + 1} ms"):
            call()
    assert len(w) == 0


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


def test_schedule_many_accepts_list_of_valid_u64_tokens(wheel_impl):
    """``tokens`` is any int in [0, 2**64): a plain list ``[1, 2**63]`` holds only valid tokens, but
    numpy turns it into float64 and the call raises TypeError "not dtype float64" (which also
    loses precision if converted). It must schedule both, like the scalar calls, and fire them
    unchanged."""
    w = wheel_impl.TimerWheel(0)
    ids = w.schedule_many(5, [1, 2**63])
    assert len(ids) == 2
    assert [int(t) for t in w.advance_array(5)] == [1, 2**63]


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

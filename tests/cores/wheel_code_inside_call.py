"""Run as a subprocess by tests/cores/test_wheel.py: Python code schedules timers on a wheel *during* a
call that fills C memory from the wheel's state, and the run prints whether it did and where
every timer went.

    python tests/cores/wheel_code_inside_call.py MODULE CALL

MODULE is the wheel's module (``timerwheel_c._wheel``); CALL is one of :data:`CALLS`. The hook
runs the garbage collector's way (``gc.callbacks``, at the start of a collection inside
``advance``, which allocates the result list) or through a foreign ``__index__`` converting
``now_ms``. Trials shift the gen-0 count's phase (frees decrement it) until a collection starts
inside the call. Prints ``HIT FIRED PENDING TOTAL``: whether the hook ran inside the call, the
timers fired, those still pending, and every timer scheduled. It exits with ``os._exit`` to skip
teardown, which a corrupted heap may hang.
"""
from __future__ import annotations

import gc
import importlib
import os
import sys

CALLS = ("advance_array(Now)", "advance", "advance(Now, [])")
HOOKED_TIMERS = 20_000


def main(module_name: str, call: str) -> None:
    if call not in CALLS:
        raise SystemExit(f"unknown call {call!r}; choose from {', '.join(CALLS)}")
    w = importlib.import_module(module_name).TimerWheel(0)
    w.schedule(1, 0)
    total = 1
    inside, hits = [False], []

    def hook() -> None:
        nonlocal total
        if inside[0] and not hits:
            hits.append(1)
            for _ in range(HOOKED_TIMERS):
                w.schedule(1, 7)
            total += HOOKED_TIMERS

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            hook()

    class Now:
        def __init__(self, ms: int) -> None:
            self.ms = ms

        def __index__(self) -> int:
            hook()
            return self.ms

    gc.callbacks.append(on_gc)
    gc.set_threshold(1, 1, 1)
    gc.collect()  # start from a zero gen-0 count, whatever the imports left
    fired = 0
    for trial in range(5000):
        pad = []
        for _ in range(trial % 3):
            pad.append([])
        # The call is spelled out per case, so nothing but the call itself runs while inside.
        inside[0] = True
        if call == "advance_array(Now)":
            out = w.advance_array(Now(w.now_ms() + 5))
        elif call == "advance":
            out = w.advance(w.now_ms() + 5)
        else:
            out = w.advance(Now(w.now_ms() + 5), [])
        inside[0] = False
        del pad
        fired += len(out)
        if hits:
            break
        w.schedule(1, 0)
        total += 1
    gc.set_threshold(700, 10, 10)
    gc.callbacks.remove(on_gc)
    fired += len(w.advance(w.now_ms() + 5))
    print(bool(hits), fired, len(w), total, flush=True)
    os._exit(0)


if __name__ == "__main__":
    main(*sys.argv[1:3])

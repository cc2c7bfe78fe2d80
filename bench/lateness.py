"""Lateness of 2 ms deadlines through each release path, in one run.

Lateness is the time a deadline was released (or a sleeper woke) minus the deadline,
in integer nanoseconds; it can be negative only for a path that wakes early
(asyncio.sleep may, by up to one clock resolution). The ReleaseTimer series read
``released_at_ns``, stamped by the release thread itself, so a "+ spinning thread"
series shows whether a Python thread hogging the GIL delays the release (the C core
never takes the GIL; the pure twin must). The sleep series read the clock on waking.

Contract with the bench CLI: ``run()`` returns ``{series name: [lateness ns, ...]}``
with the names in ``SERIES``. The compiled series run only when the process's one
selection (:mod:`timerwheel_c._impl`) chose the compiled cores: with
``TIMERWHEEL_C_NO_EXTENSIONS=1``, or without a build, they are left out.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import timerwheel_c
from timerwheel_c import pure

SERIES = (
    "ReleaseTimer (c)",
    "ReleaseTimer (c) + spinning thread",
    "ReleaseTimer (pure)",
    "ReleaseTimer (pure) + spinning thread",
    "time.sleep",
    "asyncio.sleep",
    "timerwheel_c.sleep",
)
WARMUP = 10  # samples run and discarded before each series


class _Spinner:
    """A Python thread spinning in pure Python (it holds the GIL whenever it can)."""

    def __enter__(self):
        self._stop = False
        self._thread = threading.Thread(target=self._spin, name="lateness-spinner", daemon=True)
        self._thread.start()
        return self

    def _spin(self):
        n = 0
        while not self._stop:
            n += 1

    def __exit__(self, *exc):
        self._stop = True
        self._thread.join()


def _release_timer(release_timer: type, n: int, delay_ns: int, tick) -> list[int]:
    out = []
    with release_timer() as rt:
        for i in range(n + WARMUP):
            at_ns = time.monotonic_ns() + delay_ns
            d = rt.arm_ns(at_ns)
            d.wait()
            if i >= WARMUP:
                out.append(d.released_at_ns - at_ns)
                tick()
    return out


def _time_sleep(n: int, delay_ns: int, tick) -> list[int]:
    out = []
    for i in range(n + WARMUP):
        at_ns = time.monotonic_ns() + delay_ns
        time.sleep(delay_ns / 1e9)
        if i >= WARMUP:
            out.append(time.monotonic_ns() - at_ns)
            tick()
    return out


def _async_sleep(sleep, n: int, delay_ns: int, tick) -> list[int]:
    async def main():
        out = []
        for i in range(n + WARMUP):
            at_ns = time.monotonic_ns() + delay_ns
            await sleep(delay_ns / 1e9)
            if i >= WARMUP:
                out.append(time.monotonic_ns() - at_ns)
                tick()
        return out

    return asyncio.run(main())


def run(
    samples: int = 300, delay_ms: float = 2.0, progress: Callable[[int, int], None] | None = None
) -> dict[str, list[int]]:
    """Measure ``samples`` lateness samples (int ns) per series for ``delay_ms`` deadlines.

    ``progress``, if given, is called as ``progress(done, total)`` after each sample: the
    samples completed so far and the run's total (the bench CLI's progress contract). A
    missing compiled core leaves its two series out (their samples count as done).
    About 7 x samples x delay_ms of wall time (300 samples of 2 ms: ~5-9 s).

    Raises:
        ValueError: ``samples`` < 1 or ``delay_ms`` <= 0.
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples!r}")
    if not delay_ms > 0:
        raise ValueError(f"delay_ms must be > 0, got {delay_ms!r}")
    delay_ns = int(delay_ms * 1e6)
    total = samples * len(SERIES)
    done = 0

    def tick():
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    results: dict[str, list[int]] = {}
    cores = {"pure": pure.ReleaseTimer}
    if timerwheel_c.IMPLEMENTATION == "c":
        cores = {"c": timerwheel_c.ReleaseTimer, **cores}
    else:
        done += 2 * samples
    for impl, release_timer in cores.items():
        results[f"ReleaseTimer ({impl})"] = _release_timer(release_timer, samples, delay_ns, tick)
        with _Spinner():
            results[f"ReleaseTimer ({impl}) + spinning thread"] = _release_timer(release_timer, samples, delay_ns,
                                                                                  tick)
    results["time.sleep"] = _time_sleep(samples, delay_ns, tick)
    results["asyncio.sleep"] = _async_sleep(asyncio.sleep, samples, delay_ns, tick)
    results["timerwheel_c.sleep"] = _async_sleep(timerwheel_c.sleep, samples, delay_ns, tick)
    return {name: results[name] for name in SERIES if name in results}


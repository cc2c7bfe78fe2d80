"""Waiting until a run's items are all done, by polling the server the run is measured on.

The poll shares that server, and its CPUs, with the run, so it must stay small against the run
whichever system it waits for (:mod:`.cpu_split` leaves its own backend's CPU out of the server's
figure, not the CPU it takes from the run): every :data:`POLL_S` a check that stops at the first item
left (an index probe), and only every :data:`COUNT_EVERY_S` a count of the items left, for the
progress shown. Counting every
20 ms read every row left (for an index range, every entry, live or dead) 50 times a second: up
to a third of the server's CPU per item of the fleet's runs.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

__all__ = ["COUNT_EVERY_S", "POLL_S", "wait_done", "warmup_items"]

# A run of 10,000 items at 25,000/s lasts 0.4 s: polling every 20 ms added up to 5 % to the faster
# system's time; a probe is one index step, so every 5 ms costs the server nothing to speak of.
POLL_S = 0.005
COUNT_EVERY_S = 0.5
WARMUP_MIN = 200  # items fired before a measured run of fewer than 10,000, 2 % of a larger one


def warmup_items(n: int) -> int:
    """How many items a system fires before its measured run of ``n`` (a warm-up: see :mod:`.fleet`)."""
    return max(WARMUP_MIN, n // 50)


def wait_done(n: int, any_left: Callable[[], bool], count_left: Callable[[], int],
              progress: Optional[Callable[[int], None]], timeout_s: float, what: str,
              check: Callable[[], None] = lambda: None) -> None:
    """Return once ``any_left()`` is False: all ``n`` items done. ``count_left()`` (items left) feeds
    ``progress(k)`` (``k`` items just done) every :data:`COUNT_EVERY_S`; ``check()`` runs each poll and
    may raise (a worker that died).

    Raises:
        RuntimeError: items still left after ``timeout_s`` seconds (``what`` names them).
    """
    done, deadline = 0, time.monotonic() + timeout_s
    counted_at = time.monotonic()
    while True:
        check()
        time.sleep(POLL_S)
        now = time.monotonic()
        if not any_left():
            break
        if now > deadline:
            raise RuntimeError(f"{what}: {count_left()} of {n} still left after {timeout_s:.0f} s")
        if progress is not None and now - counted_at >= COUNT_EVERY_S:
            counted_at = now
            now_done = n - count_left()
            if now_done > done:
                progress(now_done - done)
                done = now_done
    if progress is not None and n > done:
        progress(n - done)

"""Helpers that the durable tests share: the wall clock in ms, and a liveness wait.

A wait asserts only that something happened within a generous bound, never how fast: the
bound holds on a loaded 2-vCPU machine, so a failure means "never", not "slow".
"""
from __future__ import annotations

import time

LIVENESS_S = 30.0


def wall_ms() -> int:
    """Now, in Unix epoch ms (the durable layer's clock)."""
    return time.time_ns() // 1_000_000


def wait_until(predicate, what: str, timeout: float = LIVENESS_S) -> None:
    """Poll ``predicate()`` every 20 ms until it is true; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.02)

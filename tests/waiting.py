"""Helpers that the durable tests share: the wall clock in ms, a liveness wait, and an async write
shown to wait on a lock without blocking its event loop.

A wait asserts only that something happened within a generous bound, never how fast: the
bound holds on a loaded 2-vCPU machine, so a failure means "never", not "slow".
"""
from __future__ import annotations

import asyncio
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


def advance_until(clock, done, step_s: float, what: str, timeout: float = LIVENESS_S, service=None) -> None:
    """Advance the ManualClock ``clock`` by ``step_s`` each time a service is asleep on it, until
    ``done()``; fail naming ``what`` after ``timeout`` s of real time. A service busy with a store
    call is never stepped past: its clock moves only while it waits on it. With ``service`` (a
    DurableTimerService), also not while it has a row claimed and not yet run to its end (``queued``,
    ``in_flight``), as tokio's paused clock advances only when its runtime is idle: a test that judges
    a call's lateness on ``clock`` then sees no step taken while a loaded machine delayed the call's
    start."""
    def step() -> bool:
        if not done() and clock.waiting and (service is None or service.queued == service.in_flight == 0):
            clock.advance(step_s)
        return done()

    wait_until(step, what, timeout)


async def write_while_ticking(write, waits_on: str, release, timeout: float = LIVENESS_S):
    """Await the coroutine ``write`` while a ticker task runs every 10 ms; after 0.5 s assert that
    the write still waits (on ``waits_on``) and the ticker ran at least 5 times, then call
    ``release()`` (which frees the lock) and return the write's result, within ``timeout`` s."""
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    tick_task = asyncio.ensure_future(ticker())
    pending = asyncio.ensure_future(write)
    try:
        await asyncio.sleep(0.5)
        assert not pending.done(), f"the write should be waiting on {waits_on}"
        assert ticks >= 5, f"the loop served the ticker only {ticks} times while the write waited"
        release()
        return await asyncio.wait_for(pending, timeout)
    finally:
        tick_task.cancel()

"""An awaitable deadline on the monotonic clock, for the service's sleeps and durable sleeps.

It awaits the process-wide release timer (``timerwheel_c.arm_at``: one release thread per
process, releasing within microseconds) when this build has it, else :func:`asyncio.sleep`,
whose selector rounds to about 1 ms. Both run on the monotonic clock, so a wall-clock jump
cannot move a deadline once it is set.
"""
from __future__ import annotations

import asyncio
import time

__all__ = ["deadline_factory"]


def deadline_factory():
    """Return ``deadline(at_ns)``: an awaitable completing at ``at_ns`` (int ns on :func:`time.monotonic_ns`)."""
    try:
        from .. import arm_at
    except ImportError:
        arm_at = None

    async def deadline(at_ns: int):
        if arm_at is None:
            await asyncio.sleep(max(0, at_ns - time.monotonic_ns()) / 1e9)
        else:
            await arm_at(at_ns / 1e9)

    return deadline

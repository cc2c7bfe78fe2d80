"""An awaitable deadline on the monotonic clock, for the service's sleeps and durable sleeps.

It awaits the process-wide release timer (``timerwheel_c.arm_at``: one release thread per
process, releasing within microseconds, where asyncio's selector rounds to about 1 ms). It
runs on the monotonic clock, so a wall-clock jump cannot move a deadline once it is set.
"""
from __future__ import annotations

__all__ = ["deadline_factory"]


def deadline_factory():
    """Return ``deadline(at_ns)``: an awaitable completing at ``at_ns`` (int ns on :func:`time.monotonic_ns`).

    Raises (when awaited):
        ValueError: ``at_ns`` is out of the int64 ns range (see :func:`timerwheel_c.arm_at`).
    """
    # Here, not at the module's top: the release core (and asyncio) load when a service or a durable
    # sleep first needs a deadline, not with every import of the durable package.
    from ...process_timer import arm_at

    async def deadline(at_ns: int):
        await arm_at(at_ns / 1e9)

    return deadline

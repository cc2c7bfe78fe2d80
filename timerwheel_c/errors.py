"""Exceptions shared by the compiled cores and their pure twins."""
from __future__ import annotations

__all__ = ["ReleaseTimerClosed"]


class ReleaseTimerClosed(RuntimeError):
    """The ReleaseTimer was closed before the deadline was released.

    Raised by ``Deadline.wait()`` and ``await deadline`` for a deadline still pending
    when ``ReleaseTimer.close()`` ran, and by ``arm``/``arm_ns`` on a closed timer.
    A pending waiter is woken with this rather than left waiting, so nothing hangs
    on a closed timer.
    """

"""timerwheel_c: C-accelerated timers for latency-sensitive Python networking code.

- :class:`TimerWheel`: a hashed timing wheel (512 slots of 1 ms plus overflow) with
  O(1) schedule, cancel and reschedule; times in integer ms on the caller's monotonic clock.
- :mod:`timerwheel_c.pure`: the pure-Python twins, always importable, for tests and benchmarks.
- :mod:`timerwheel_c.durable`: timers that survive a restart.

``IMPLEMENTATION`` says which cores this process uses: ``"c"`` or ``"pure"``
(see :mod:`timerwheel_c._impl` for the rule).
"""
from . import _impl

# The wheel (issue 2).
TimerWheel = _impl.load("wheel").TimerWheel

IMPLEMENTATION = _impl.IMPLEMENTATION

__all__ = ["IMPLEMENTATION", "TimerWheel"]
__version__ = "0.1.0"

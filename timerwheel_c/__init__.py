"""timerwheel_c: C-accelerated timers for latency-sensitive Python networking code.

- :class:`TimerWheel`: a hashed timing wheel (512 slots of 1 ms plus overflow) with
  O(1) schedule, cancel and reschedule; times in integer ms on the caller's monotonic clock.
- :class:`ReleaseTimer`: a deadline release thread that never takes the GIL; with
  :func:`arm_at`, :func:`sleep_until` and :func:`sleep` on a process-wide one.
- :mod:`timerwheel_c.pure`: the pure-Python twins, always importable, for tests and benchmarks.
- :mod:`timerwheel_c.durable`: timers that survive a restart.

``IMPLEMENTATION`` says which cores this process uses: ``"c"`` or ``"pure"``
(see :mod:`timerwheel_c._impl` for the rule).
"""
from . import _impl

# The hashed timing wheel.
TimerWheel = _impl.load("wheel").TimerWheel

# The deadline release thread.
_release_core = _impl.load("release")
ReleaseTimer, Deadline = _release_core.ReleaseTimer, _release_core.Deadline
from .errors import ReleaseTimerClosed  # noqa: E402
from .release import arm_at, release_timer_started, sleep, sleep_until  # noqa: E402

IMPLEMENTATION = _impl.IMPLEMENTATION

__all__ = [
    "IMPLEMENTATION",
    "Deadline",
    "ReleaseTimer",
    "ReleaseTimerClosed",
    "TimerWheel",
    "arm_at",
    "release_timer_started",
    "sleep",
    "sleep_until",
]
__version__ = "0.1.0"

"""timerwheel_c: C-accelerated timers for latency-sensitive Python networking code.

- :class:`TimerWheel`: a hashed timing wheel (512 slots of 1 ms plus overflow) with
  O(1) schedule, cancel and reschedule; times in integer ms on the caller's monotonic clock.
- :class:`ReleaseTimer`: a deadline release thread that never takes the GIL; with
  :func:`arm_at`, :func:`sleep_until` and :func:`sleep` on a process-wide one.
- :mod:`timerwheel_c.aio`: ``call_later``, ``timeout()`` and keyed timers for asyncio on the wheel.
- :mod:`timerwheel_c.pure`: the pure-Python twins, always importable, for tests and benchmarks.
- :mod:`timerwheel_c.durable`: timers that survive a restart.

``IMPLEMENTATION`` says which cores this process uses: ``"c"`` or ``"pure"``
(see :mod:`timerwheel_c._impl` for the rule).
"""
import importlib
from typing import Any

from . import _impl
from .errors import ReleaseTimerClosed
from .process_timer import arm_at, release_timer_started, sleep, sleep_until

TimerWheel = _impl.load("wheel").TimerWheel
ReleaseTimer = _impl.load("release").ReleaseTimer
Deadline = _impl.load("release").Deadline
# The asyncio scheduler (timerwheel_c.aio), loaded here so IMPLEMENTATION covers it too.
_impl.load("aio")

# Read after every core is loaded: a fallback of any of them makes it "pure".
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


def __getattr__(name: str) -> Any:
    # ``timerwheel_c.pure`` after a plain ``import timerwheel_c``, as the docs use it, without
    # importing the twins into every process (PEP 562).
    if name == "pure":
        return importlib.import_module(".pure", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

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

The names above are loaded on first use (PEP 562), so that a program importing only
:mod:`timerwheel_c.durable` (every ``timerwheel-c`` command) pays for no core, no numpy and no
asyncio it does not use. The first use of a core's name, or of ``IMPLEMENTATION``, makes the
choice of :mod:`timerwheel_c._impl` as an import of every core used to: a missing extension warns
then, or raises ImportError under ``TIMERWHEEL_C_REQUIRE_EXTENSIONS=1``.
"""
import importlib
from typing import TYPE_CHECKING, Any

from .errors import ReleaseTimerClosed

if TYPE_CHECKING:  # type checkers see the pure twins, as aio-libs does
    from .process_timer import arm_at, release_timer_started, sleep, sleep_until
    from .pure.release import Deadline, ReleaseTimer
    from .pure.wheel import TimerWheel

    IMPLEMENTATION: str

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

# name -> the core that defines it
_CORE_NAMES = {"TimerWheel": "wheel", "ReleaseTimer": "release", "Deadline": "release"}
_PROCESS_TIMER_NAMES = ("arm_at", "release_timer_started", "sleep", "sleep_until")
# The cores whose choice IMPLEMENTATION reports: every one (the asyncio scheduler's and the event
# loop's timer store, timerwheel_c.aio's, too), so that it says the same before and after they load.
_CORES = ("wheel", "release", "aio", "loop")


def _load(name: str) -> Any:
    if name in _PROCESS_TIMER_NAMES:
        return getattr(importlib.import_module(".process_timer", __name__), name)
    if name == "pure":  # after a plain ``import timerwheel_c``, as the docs use it
        return importlib.import_module(".pure", __name__)
    if name not in _CORE_NAMES and name != "IMPLEMENTATION":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # By import_module, not ``from . import``: that asks this module for the attribute first.
    impl = importlib.import_module("._impl", __name__)
    if name == "IMPLEMENTATION":
        for core in _CORES:
            impl.load(core)
        return impl.IMPLEMENTATION  # read after every core is loaded: a fallback of any makes it "pure"
    return getattr(impl.load(_CORE_NAMES[name]), name)


def __getattr__(name: str) -> Any:
    value = _load(name)
    globals()[name] = value  # later reads are plain attribute reads
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__) | {"pure"})

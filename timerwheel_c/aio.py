"""asyncio timers on the timing wheel: ``WheelScheduler``, its ``timeout()`` and ``keyed()`` timers,
and ``EventLoop``, the drop-in event loop that puts every asyncio timer on the wheel
(:mod:`timerwheel_c.loop`: ``new_event_loop()``, ``run()``, ``EventLoopPolicy``, ``install()``).

The compiled core ``timerwheel_c._aio`` (``src/_aio.pyx``) or, where it is not built, its
pure-Python twin :mod:`timerwheel_c.pure.aio`, chosen as the other cores are (see
:mod:`timerwheel_c._impl`). Both have the same API and semantics; the design (clock rounding,
never early on the loop clock or in real time, one loop wake-up) is in the twin's docstring.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from . import _impl
from .loop import HAS_POLICIES, EventLoop, TimerHandle, new_event_loop, run

if TYPE_CHECKING:  # type checkers see the pure twin, as aio-libs does
    from .pure.aio import KeyedTimers, WheelHandle, WheelScheduler, WheelTimeout
else:
    _core = _impl.load("aio")
    KeyedTimers = _core.KeyedTimers
    WheelHandle = _core.WheelHandle
    WheelScheduler = _core.WheelScheduler
    WheelTimeout = _core.WheelTimeout

if HAS_POLICIES:  # Python 3.9-3.13; policies are deprecated from 3.14
    from .loop import EventLoopPolicy, install

__all__ = ["EventLoop", "KeyedTimers", "TimerHandle", "WheelHandle", "WheelScheduler", "WheelTimeout",
           "new_event_loop", "run"]
if HAS_POLICIES:
    __all__ += ["EventLoopPolicy", "install"]


def __getattr__(name: str) -> object:
    if name in ("EventLoopPolicy", "install"):  # Python 3.14+: an AttributeError saying why
        from . import loop

        return getattr(loop, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

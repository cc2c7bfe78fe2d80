"""asyncio timers on the timing wheel: ``WheelScheduler``, its ``timeout()`` and ``keyed()`` timers.

The compiled core ``timerwheel_c._aio`` (``src/_aio.pyx``) or, where it is not built, its
pure-Python twin :mod:`timerwheel_c.pure.aio`, chosen as the other cores are (see
:mod:`timerwheel_c._impl`). Both have the same API and semantics; the design (clock rounding,
never early on the loop clock or in real time, one loop wake-up) is in the twin's docstring.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from . import _impl

if TYPE_CHECKING:  # type checkers see the pure twin, as aio-libs does
    from .pure.aio import KeyedTimers, WheelHandle, WheelScheduler, WheelTimeout
else:
    _core = _impl.load("aio")
    KeyedTimers = _core.KeyedTimers
    WheelHandle = _core.WheelHandle
    WheelScheduler = _core.WheelScheduler
    WheelTimeout = _core.WheelTimeout

__all__ = ["KeyedTimers", "WheelHandle", "WheelScheduler", "WheelTimeout"]

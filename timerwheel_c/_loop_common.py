"""What both twins of the event loop's timer store share: the handle's repr, the report of a
callback's exception, and the argument checks of ``call_at``/``call_later``.

All of it follows asyncio's ``events.Handle``/``TimerHandle`` and ``BaseEventLoop.call_at``
(CPython ``Lib/asyncio/events.py``, ``base_events.py``), so that a timer on the wheel reads,
logs and fails as asyncio's does. Neither twin imports the other; the compiled one
(``src/_loop.pyx``) calls these on its slow paths only.
"""
from __future__ import annotations

import math
import numbers
import sys
from asyncio import base_events, format_helpers
from typing import Any, cast

from ._aio_common import MAX_DUE_MS, floor_ms

__all__ = ["MAX_DUE_MS", "MAX_SELECT_S", "check_when", "handle_repr", "loop_ms", "report_exception"]

# asyncio's cap on one select() wait, in seconds (one day).
MAX_SELECT_S: float = base_events.MAXIMUM_SELECT_TIMEOUT  # type: ignore[attr-defined]
# 3.13's callback format shortens a callback's repr unless the loop is in debug mode.
_FORMAT_TAKES_DEBUG = sys.version_info >= (3, 13)


def _format_callback(handle: Any, debug: bool) -> str:
    if _FORMAT_TAKES_DEBUG:
        return format_helpers._format_callback_source(  # type: ignore[call-arg,unused-ignore]
            handle._callback, handle._args, debug=debug)
    return format_helpers._format_callback_source(handle._callback, handle._args)


def loop_ms(t_s: float) -> int:
    """The ms a loop time ``t_s`` (seconds) lies in: the largest ``n`` with ``n / 1000 <= t_s``,
    clamped to [-1, 2**62], past which every time alike is "never" (a real clock is far inside)."""
    if not t_s * 1000.0 < MAX_DUE_MS:
        return MAX_DUE_MS
    if not t_s * 1000.0 >= 0.0:
        return -1
    return floor_ms(t_s)


def check_when(when: Any, name: str) -> float:
    """``when`` (``call_at``) or ``delay`` (``call_later``), in seconds, as a float.

    asyncio takes any number that adds to a float; so does this (``numbers.Real``). ``inf`` (and anything
    beyond the wheel's 2**62 ms) means "never", as it does on asyncio's heap.

    Raises:
        TypeError: it is None (with asyncio's message) or not a real number.
        ValueError: it is NaN, which has no place in time order.
    """
    if when is None:
        raise TypeError("when cannot be None" if name == "when" else "delay must not be None")
    if not isinstance(when, numbers.Real):  # as float + when fails on asyncio's loop
        raise TypeError(f"{name} must be a real number of seconds, got {when!r}")
    try:
        value = float(when)
    except OverflowError:  # an int beyond float: as far in the future as inf
        value = math.inf if cast(Any, when) > 0 else -math.inf
    if value != value:
        raise ValueError(f"{name} must not be NaN, got {when!r}")
    return value


def handle_repr(handle: Any, debug: bool) -> str:
    """``repr`` of a wheel timer handle, in asyncio's ``TimerHandle`` format:
    ``<TimerHandle [cancelled] when=W callback(args) [at file:line] [created at file:line]>``."""
    if handle._repr is not None:
        return handle._repr
    info = ["TimerHandle"]
    if handle._cancelled:
        info.append("cancelled")
    info.append(f"when={handle.when()}")
    if handle._callback is not None:
        info.append(_format_callback(handle, debug))
    if handle._source_traceback:
        frame = handle._source_traceback[-1]
        info.append(f"created at {frame[0]}:{frame[1]}")
    return "<{}>".format(" ".join(info))


def report_exception(handle: Any, loop: Any, exc: BaseException) -> None:
    """Hand a callback's exception to ``loop.call_exception_handler``, as ``Handle._run`` does."""
    cb = _format_callback(handle, loop.get_debug())
    context = {"message": f"Exception in callback {cb}", "exception": exc, "handle": handle}
    if handle._source_traceback:
        context["source_traceback"] = handle._source_traceback
    loop.call_exception_handler(context)

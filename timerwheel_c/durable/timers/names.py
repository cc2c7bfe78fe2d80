"""How a log line or a message names a durable timer: decoded, never as its raw key.

A timer is named by what an operator types to find it again (``timerwheel-c timers show``,
:func:`~.writer.get_timer`): its partition, its kind (with the registered handler's class name
when the registry knows the kind), its reference (UTF-8 text when it decodes, else hex) and,
where known, its attempt (of its handler's ``max_attempts``) and its due time in ISO 8601 UTC.
:func:`timer_name` is the one place that format lives; :func:`row_name` names a stored row by
its key, falling back to a hex prefix for a row whose key does not parse (a malformed row has
no name to decode).
"""
from __future__ import annotations

import datetime
from typing import Optional

from . import keys
from .registry import handler_name

__all__ = ["iso_utc", "reference_text", "row_name", "timer_name"]

_HEX_PREFIX_BYTES = 32  # of a malformed row's key, enough to find it with a range scan


def iso_utc(at_ms: int) -> str:
    """``at_ms`` (Unix epoch ms) as ISO 8601 UTC with milliseconds (``2026-01-31T12:00:00.250Z``);
    a time past the year 9999 as ``<n> ms``."""
    try:
        at = datetime.datetime.fromtimestamp(at_ms / 1000, datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return f"{at_ms} ms"
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at_ms % 1000:03d}Z"


def reference_text(reference: bytes) -> str:
    """A reference as text: ``'order-42'`` (quoted, escaped as Python escapes) when it is UTF-8,
    else ``hex 00ff12``."""
    try:
        return repr(reference.decode("utf-8"))
    except UnicodeDecodeError:
        return f"hex {reference.hex()}"


def timer_name(partition: str, kind: int, reference: bytes, *, handler=None, attempt: Optional[int] = None,
               due_at_ms: Optional[int] = None, occurrence: bool = False) -> str:
    """``timer partition 'p' kind 3 'send-reminder' (Reminder) reference 'order-42' attempt 2 of 20 due
    2026-...Z``: the parts given, in that order (``schedule occurrence ...`` for a schedule's occurrence).

    ``handler``: the kind's :class:`~.registry.TimerHandler`, if known: it names the kind by its
    kind's name (if any) and its class or function, and gives the attempt's maximum (``attempt 2 of 20``, or ``attempt 2 (no limit)`` for
    ``max_attempts=None``). ``due_at_ms``: Unix epoch ms.
    """
    kind_text = f"{int(kind)}"
    if handler is not None:
        name = getattr(handler.kind, "name", None)
        kind_text += f" ({handler_name(handler)})" if name is None else f" {name!r} ({handler_name(handler)})"
    text = (f"{'schedule occurrence' if occurrence else 'timer'} partition {partition!r} kind {kind_text} "
            f"reference {reference_text(reference)}")
    if attempt is not None:
        text += f" attempt {attempt}"
        if handler is not None:
            text += " (no limit)" if handler.max_attempts is None else f" of {handler.max_attempts}"
    if due_at_ms is not None:
        text += f" due {iso_utc(due_at_ms)}"
    return text


def row_name(partition: str, key: bytes, *, registry=None) -> str:
    """The name of the stored row ``key`` of ``partition``: :func:`timer_name` of the timer (its
    attempt, if any, and original due time included; ``registry``, a
    :class:`~.registry.TimerRegistry`, names its kind) when it parses as a timer or parked row, else
    ``partition 'p' malformed row <hex of its first bytes>``."""
    try:
        tk = keys.parse_parked(key) if keys.is_parked_key(key) else keys.parse(key)
    except (keys.MalformedKey, TypeError):
        more = "..." if len(key) > _HEX_PREFIX_BYTES else ""
        return f"partition {partition!r} malformed row {bytes(key[:_HEX_PREFIX_BYTES]).hex()}{more}"
    return timer_name(partition, tk.kind, tk.reference, handler=None if registry is None else registry.get(tk.kind),
                      attempt=tk.attempt or None, due_at_ms=tk.original_due_at_ms, occurrence=tk.occurrence)

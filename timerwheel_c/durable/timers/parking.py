"""Failed attempts and parking: what becomes of a timer whose handler fails, and how it is logged.

Every call of a handler's ``fire`` is an attempt, counted in the row's key when the runner claims it
(:mod:`.claim`), before the call. A failed attempt (an exception, :class:`~.registry.Retry`, a
return value that is not an outcome, an invalid outcome) leaves the row at its claimed backoff key,
so it is tried again after its backoff; the attempt that reaches the handler's
:attr:`~.registry.TimerHandler.max_attempts` instead *parks* the timer: one guarded batch
(:class:`Parking`) moves the claimed row to its parked key (:func:`~.keys.parked`, outside the
timer space, so no runner scans it again), its value behind its last error, and points its
identity row at it. A row that comes due with its attempts already used (the process died during
the last attempt, or its outcome did not commit) is parked by the claim instead of fired again,
with a last error saying so. A parked schedule occurrence pauses its schedule
(:func:`~.schedules.park_occurrence`).

Logs (logger ``timerwheel_c.durable``), each naming the timer by :func:`~.names.timer_name`:
a failure at WARNING (a :class:`~.registry.Retry` before the last attempt at INFO: the handler
asked for it), with the exception's traceback at DEBUG for the attempts before the last and at
ERROR for the one that parks the timer. The last error kept in the parked row is the exception's
type and message (or what the handler returned), with any store URL's password masked
(:func:`~timerwheel_c.durable.storage.redact.redact`) and cut to :data:`~.keys.MAX_ERROR_BYTES`.
"""
from __future__ import annotations

import logging
import time
from typing import Optional

from . import keys
from .names import iso_utc, timer_name
from .registry import TimerHandler
from ..storage.printable import log_traceback, printable
from ..storage.redact import redact
from ..storage.store import Absent, Batch, Equals

__all__ = ["STOPPED_DURING", "Parking", "RetryLater", "exhausted", "last_error_of", "log_failure", "park_timer", "wall_ms",
           "wrong_outcome"]

log = logging.getLogger("timerwheel_c.durable")

STOPPED_DURING = "the runner stopped during attempt {attempt} of {max_attempts}, or its outcome did not commit"
_OUTCOME_REPR_CHARS = 200  # of a wrong return value quoted in a last error


class Parking(Batch):
    """A guarded batch that parks a timer: its commit counts as ``parked``, never as ``fired``."""


class RetryLater(Batch):
    """A guarded batch that records a failed attempt's last error and, for a ``Retry(delay=)``, moves
    its retry to the time asked for: its commit counts as neither ``fired`` nor ``parked`` (the
    failure is counted when settled)."""


def wall_ms() -> int:
    """Now, Unix epoch ms: when a timer is parked, absent a tick's own time."""
    return time.time_ns() // 1_000_000


def exhausted(handler: TimerHandler, attempt: int) -> bool:
    """True when attempt ``attempt`` (>= 1) is ``handler``'s last (or past it)."""
    return handler.max_attempts is not None and attempt >= handler.max_attempts


def last_error_of(error: Optional[BaseException] = None, why: Optional[str] = None) -> str:
    """The last error to keep and log: ``"TypeError: message"`` for ``error``, else ``why``;
    passwords masked, cut to :data:`~.keys.MAX_ERROR_BYTES` (the log lines that quote it are
    bounded as the parked row is, however long the handler's message)."""
    text = f"{type(error).__name__}: {_printed(str, error)}" if error is not None else (why or "failed")
    return keys.error_bytes(redact(text)).decode()


def wrong_outcome(outcome: object) -> str:
    """The failure of a handler that returned ``outcome``, not an outcome."""
    shown = _printed(repr, outcome)
    if len(shown) > _OUTCOME_REPR_CHARS:
        shown = shown[:_OUTCOME_REPR_CHARS] + "..."
    return f"the handler returned {shown}, not Done, Reschedule or Retry"


def _printed(show, obj: object) -> str:
    """``show(obj)`` (``str`` or ``repr``), or a placeholder when that raises, as the traceback module
    prints such an object: a failure must be recorded whatever the handler's own types do."""
    try:
        return show(obj)
    except Exception:
        return f"<{type(obj).__name__}: {show.__name__}() failed>"


def park_timer(key: bytes, value: bytes, tk: keys.TimerKey, parked_at_ms: int, last_error: str) -> Parking:
    """The guarded move of the timer row ``key`` (parsed ``tk``, holding ``value``) to its parked row,
    its identity row pointed at it. A schedule's occurrence needs its schedule's guard and pause too:
    :func:`~.schedules.park_occurrence` adds them."""
    parked = keys.parked(parked_at_ms, tk)
    batch = Parking()
    batch.require(Equals(key, value)).require(Absent(parked)).delete(key)
    batch.put(parked, keys.parked_value(last_error, value)).put(keys.identity_of(tk), parked)
    if tk.attempt > 1:  # the parked row keeps the last error now
        batch.delete(keys.last_error_row(keys.identity_of(tk)))
    # A parked timer fires no more until requeued, a new start: its writer's span is no longer its cause.
    if keys.may_keep_a_trace_context(tk):
        batch.delete(keys.trace_context_row(keys.identity_of(tk)))
    return batch


def log_failure(partition: str, handler: TimerHandler, tk: keys.TimerKey, attempt: int, due_at_ms: int,
                last_error: str, error: Optional[BaseException], *, retry_at_ms: Optional[int],
                asked: bool = False) -> None:
    """Log a failed attempt (see the module docstring): ``retry_at_ms`` (Unix epoch ms) when it is
    tried again, None when it parks; ``asked``: the handler returned Retry."""
    name = timer_name(partition, tk.kind, tk.reference, handler=handler, attempt=attempt, due_at_ms=due_at_ms,
                      occurrence=tk.occurrence)
    shown = printable(last_error)  # one line: a handler's message may hold a newline and a forged log line after it
    if retry_at_ms is not None:
        log.log(logging.INFO if asked else logging.WARNING, "%s failed: %s; tried again at %s", name, shown,
                iso_utc(retry_at_ms))
        if error is not None:
            log_traceback(log, logging.DEBUG, error, "%s: the traceback of its failure", name)
        return
    log.warning("%s failed: %s; it was the last attempt", name, shown)
    if error is None:
        log.error("%s parked after its last attempt: %s", name, shown)
    else:
        log_traceback(log, logging.ERROR, error, "%s parked after its last attempt: %s", name, shown)


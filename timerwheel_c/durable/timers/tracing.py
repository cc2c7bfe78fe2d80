"""OpenTelemetry spans of durable timer fires, when ``opentelemetry-api`` is installed (the ``otel`` extra).

Each handler call is one span, ``timerwheel.fire {kind}`` (the kind named by its handler's class,
as log lines name it), of kind CONSUMER, current while the handler runs, so that the spans the
handler starts are its children. Its attributes:

- ``timerwheel.partition`` (str), ``timerwheel.kind`` (int 1..255), ``timerwheel.kind_name`` (the
  handler's class name), ``timerwheel.reference`` (UTF-8 text, else ``hex ...``, as
  :func:`~.names.reference_text` writes it);
- ``timerwheel.attempt`` (int, 1 on the first try), ``timerwheel.lateness_ms`` (int: the call's
  start minus the due time, Unix epoch ms);
- ``timerwheel.outcome``: the outcome's class name (``Done``, ``Reschedule``, ``Retry``) or
  ``raised <exception class>``. A call that raised or returned :class:`~.registry.Retry` (a failed
  attempt) sets the span's status to ERROR; an exception is also recorded as the span's
  ``exception`` event. Its message and traceback have their passwords masked
  (:func:`~timerwheel_c.durable.storage.redact.redact`), as the log lines and parked rows have.

The span has no link to the span that scheduled the timer: carrying a trace context from the
writer to the fire would need it stored with the timer, and a timer row's value is the caller's
bytes, handed to the handler as they were written, while its key's layout is what the claims,
the change signals and the parked rows read; docs/DESIGN.md ("Traces") says what that link needs.

Without ``opentelemetry-api``, :data:`ENABLED` is False, decided once at import: the runner and the
service's executor then call the handler directly, with no span and no work per fire.
"""
from __future__ import annotations

import traceback
from typing import Any

from .names import reference_text
from .parking import last_error_of
from ..storage.redact import redact

try:
    from opentelemetry import trace
except ImportError:  # the otel extra is not installed: fires are not traced
    trace = None  # type: ignore[assignment]

__all__ = ["ENABLED", "SPAN_PREFIX", "fire", "fire_async"]

ENABLED = trace is not None
SPAN_PREFIX = "timerwheel.fire "


# A proxy until the application sets its tracer provider, then that provider's tracer: safe to
# take once, at import.
_tracer = None if trace is None else trace.get_tracer("timerwheel_c.durable")


def _start(handler):
    """The fire's span, started and made current (a context manager yielding the span)."""
    return _tracer.start_as_current_span(SPAN_PREFIX + type(handler).__name__, kind=trace.SpanKind.CONSUMER,
                                         record_exception=False, set_status_on_exception=False)


def _began(span, handler, partition: str, timer, started_ms: int) -> None:
    # Built only for a recorded span: the API alone, without an SDK, records nothing.
    if span.is_recording():
        span.set_attributes({"timerwheel.partition": partition, "timerwheel.kind": int(timer.kind),
                             "timerwheel.kind_name": type(handler).__name__,
                             "timerwheel.reference": reference_text(timer.reference),
                             "timerwheel.attempt": timer.attempt, "timerwheel.lateness_ms": started_ms - timer.due_at_ms})


def _ended(span, outcome: Any) -> None:
    if not span.is_recording():
        return
    name = type(outcome).__name__
    span.set_attribute("timerwheel.outcome", name)
    if name == "Retry":
        span.set_status(trace.Status(trace.StatusCode.ERROR, "Retry: a failed attempt"))


def _raised(span, exc: BaseException) -> None:
    if not span.is_recording():
        return
    span.set_attribute("timerwheel.outcome", f"raised {type(exc).__name__}")
    # Not span.record_exception: its message and traceback would carry a password the handler's
    # error quoted to whatever collector the spans go to.
    text = last_error_of(exc)
    span.add_event("exception", {"exception.type": type(exc).__qualname__, "exception.message": text,
                                 "exception.stacktrace": redact("".join(traceback.format_exception(
                                     type(exc), exc, exc.__traceback__)))})
    span.set_status(trace.Status(trace.StatusCode.ERROR, text))


def fire(handler, ctx, timer, started_ms: int) -> Any:
    """``handler.fire(ctx, timer)`` inside its span (``ctx.partition`` names the partition,
    ``started_ms`` is the call's start, Unix epoch ms); returns its outcome, raises what it raises."""
    with _start(handler) as span:
        _began(span, handler, ctx.partition, timer, started_ms)
        try:
            outcome = handler.fire(ctx, timer)
        except BaseException as exc:
            _raised(span, exc)
            raise
        _ended(span, outcome)
        return outcome


async def fire_async(handler, ctx, timer, started_ms: int) -> Any:
    """:func:`fire` of an ``async def fire``: awaited inside its span."""
    with _start(handler) as span:
        _began(span, handler, ctx.partition, timer, started_ms)
        try:
            outcome = await handler.fire(ctx, timer)
        except BaseException as exc:
            _raised(span, exc)
            raise
        _ended(span, outcome)
        return outcome

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

The span links to the span that scheduled the timer, as Temporal and Celery link a run to its
caller's: :func:`~.writer.schedule` called while a valid span is current keeps that span's W3C
``traceparent`` in a row beside the timer's identity row (:func:`~.keys.trace_context_row`), in
the schedule's batch; each traced fire of a timer by name reads it (one more read per fire; a
schedule's occurrence, which never has one, reads none) and adds a ``Link`` to its span context. Spans start only once an SDK's tracer provider is set: with the API alone a fire is the
handler's call and nothing more. The row goes when the timer fires,
is cancelled, replaced, rescheduled or parked; a row a runner without tracing left is told apart by
its due time.

Without ``opentelemetry-api``, :data:`ENABLED` is False, decided once at import: the runner and the
service's executor then call the handler directly, with no span and no work per fire.
"""
from __future__ import annotations

import traceback
from typing import Any, Optional

from . import keys
from .names import reference_text
from .parking import last_error_of
from ..storage.redact import redact

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the otel extra is not installed: fires are not traced
    trace = None  # type: ignore[assignment]

__all__ = ["ENABLED", "SPAN_PREFIX", "fire", "fire_async", "recording", "traceparent"]

ENABLED = trace is not None
SPAN_PREFIX = "timerwheel.fire "


# A proxy until the application sets its tracer provider, then that provider's tracer: safe to
# take once, at import.
_tracer = None if trace is None else trace.get_tracer("timerwheel_c.durable")
# W3C trace context whatever propagator the application set: the stored header must read back alike.
_w3c = None if trace is None else TraceContextTextMapPropagator()


def traceparent() -> Optional[bytes]:
    """The W3C ``traceparent`` header (ASCII bytes, 55 for version 00) of the span current in the
    caller, or None without ``opentelemetry-api`` or without a valid current span."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict = {}
    _w3c.inject(carrier)
    found = carrier.get("traceparent")
    return None if found is None else found.encode("ascii")


def recording() -> bool:
    """Whether an SDK's tracer provider is set: with the API alone no span records anything, so a
    fire then starts none (a span would cost the fire most of its time: a context manager, a
    context attached and detached, for a span nobody sees). Asked per fire: an application may set
    its provider after the service started (the service's executor asks once per run of sync calls,
    a few ms of them)."""
    return not isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def _links(ctx, timer) -> list:
    """``[Link]`` to the span that scheduled ``timer`` (its kept trace context), or []."""
    tk = keys.parse(timer.key)
    if not keys.may_keep_a_trace_context(tk):  # a schedule's occurrence: no row to read
        return []
    kept = ctx.store.get(ctx.partition, keys.trace_context_row(keys.identity_of(tk)))
    text = keys.trace_context_text(kept, tk)
    if text is None:
        return []
    linked = trace.get_current_span(_w3c.extract({"traceparent": text})).get_span_context()
    return [trace.Link(linked)] if linked.is_valid else []


def _start(handler, links: list):
    """The fire's span, started and made current (a context manager yielding the span)."""
    return _tracer.start_as_current_span(SPAN_PREFIX + type(handler).__name__, kind=trace.SpanKind.CONSUMER,
                                         links=links, record_exception=False, set_status_on_exception=False)


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
    ``started_ms`` is the call's start, Unix epoch ms); returns its outcome, raises what it raises.
    Without an SDK's tracer provider, the call alone, with no span."""
    if not recording():
        return handler.fire(ctx, timer)
    with _start(handler, _links(ctx, timer)) as span:
        _began(span, handler, ctx.partition, timer, started_ms)
        try:
            outcome = handler.fire(ctx, timer)
        except BaseException as exc:
            _raised(span, exc)
            raise
        _ended(span, outcome)
        return outcome


async def fire_async(handler, ctx, timer, started_ms: int) -> Any:
    """:func:`fire` of an ``async def fire``: awaited inside its span (its trace context read on a
    worker thread, off the event loop)."""
    if not recording():
        return await handler.fire(ctx, timer)
    import asyncio  # loaded already where an async handler runs; not by every writer's import of this module

    with _start(handler, await asyncio.to_thread(_links, ctx, timer)) as span:
        _began(span, handler, ctx.partition, timer, started_ms)
        try:
            outcome = await handler.fire(ctx, timer)
        except BaseException as exc:
            _raised(span, exc)
            raise
        _ended(span, outcome)
        return outcome

"""Each fire of a durable timer is an OpenTelemetry span when opentelemetry-api is installed, and
costs nothing when it is not.

The spans are read from opentelemetry-sdk's in-memory exporter, behind the process's one tracer
provider (set once here: OpenTelemetry refuses to replace it). Time is injected as ``now_ms`` in the
runner's tests; the service's tests wait on their own outcome with a generous liveness bound.
"""
from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("opentelemetry.sdk.trace", reason="the test extra's opentelemetry-sdk reads the spans")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from timerwheel_c.durable import DurableTimerService, schedule  # noqa: E402
from timerwheel_c.durable.storage.sqlite import SQLiteStore  # noqa: E402
from timerwheel_c.durable.timers import tracing  # noqa: E402
from timerwheel_c.durable.timers.registry import Done, Retry, TimerHandler, TimerKind, TimerRegistry  # noqa: E402
from timerwheel_c.durable.timers.runner import run_due  # noqa: E402

NOW = 1_800_000_000_000
P = "traces"


@pytest.fixture(scope="module")
def exporter():
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    found = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(found))
    yield found
    found.shutdown()


def _fires(exporter) -> list:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(tracing.SPAN_PREFIX)]


class Expire(TimerHandler):
    kind = TimerKind(1)

    def fire(self, ctx, timer):
        with trace.get_tracer("app").start_as_current_span("send reminder"):
            return Done()


class Flaky(TimerHandler):
    kind = TimerKind(2)

    def fire(self, ctx, timer):
        raise ConnectionError("could not reach postgresql://app:hunter2@db/app")


class Later(TimerHandler):
    kind = TimerKind(3)

    def fire(self, ctx, timer):
        return Retry()


def test_a_runner_fire_is_a_span_with_the_timer_its_lateness_and_outcome(exporter):
    """A fired timer's span names its kind by its handler and carries partition, kind, reference
    (as text), attempt, lateness (the tick's time minus the due time, injected) and outcome; a span
    the handler starts is its child."""
    exporter.clear()
    store = SQLiteStore(":memory:")
    schedule(store, P, NOW - 250, 1, b"order-42")
    report = run_due(store, P, TimerRegistry().register(Expire()), NOW)
    assert report.fired == 1
    (span,) = _fires(exporter)
    assert span.name == "timerwheel.fire Expire" and span.kind == trace.SpanKind.CONSUMER
    assert dict(span.attributes) == {"timerwheel.partition": P, "timerwheel.kind": 1, "timerwheel.kind_name": "Expire",
                                     "timerwheel.reference": "'order-42'", "timerwheel.attempt": 1,
                                     "timerwheel.lateness_ms": 250, "timerwheel.outcome": "Done"}
    assert span.status.status_code == trace.StatusCode.UNSET
    (child,) = [s for s in exporter.get_finished_spans() if s.name == "send reminder"]
    assert child.parent is not None and child.parent.span_id == span.context.span_id
    assert child.context.trace_id == span.context.trace_id


def test_a_failed_attempt_is_an_error_span_whose_exception_has_its_password_masked(exporter):
    """A handler that raises gives an ERROR span with an ``exception`` event; the password its
    message quotes reaches neither the event nor the status (as in the log lines). A Retry() is an
    ERROR span too. A binary reference is written as hex."""
    exporter.clear()
    store = SQLiteStore(":memory:")
    schedule(store, P, NOW, 2, b"\xff\x00")
    schedule(store, P, NOW, 3, b"later")
    report = run_due(store, P, TimerRegistry().register(Flaky()).register(Later()), NOW)
    assert report.failed == 2
    spans = {s.attributes["timerwheel.kind"]: s for s in _fires(exporter)}
    raised, retried = spans[2], spans[3]
    assert raised.attributes["timerwheel.outcome"] == "raised ConnectionError"
    assert raised.attributes["timerwheel.reference"] == "hex ff00"
    assert raised.status.status_code == trace.StatusCode.ERROR
    (event,) = [e for e in raised.events if e.name == "exception"]
    assert event.attributes["exception.type"] == "ConnectionError"
    assert "could not reach" in event.attributes["exception.message"]
    assert "ConnectionError" in event.attributes["exception.stacktrace"]
    shown = [raised.status.description, *event.attributes.values()]
    assert all("hunter2" not in str(text) for text in shown) and "***" in event.attributes["exception.message"]
    assert retried.attributes["timerwheel.outcome"] == "Retry"
    assert retried.status.status_code == trace.StatusCode.ERROR


class AsyncExpire(TimerHandler):
    kind = TimerKind(4)

    async def fire(self, ctx, timer):
        await asyncio.sleep(0)
        with trace.get_tracer("app").start_as_current_span("async child"):
            return Done()


def test_run_due_traces_an_async_fire_over_its_whole_call(exporter):
    """run_due's span of an ``async def`` handler covers its awaited call, as the service's does: the
    handler's own span is its child, and the error it raises is the span's. The span ended as the
    coroutine was made, before the handler ran: outcome "coroutine", status unset."""
    exporter.clear()

    class AsyncFails(TimerHandler):
        kind = TimerKind(5)

        async def fire(self, ctx, timer):
            await asyncio.sleep(0)
            with trace.get_tracer("app").start_as_current_span("async child"):
                raise RuntimeError("async boom")

    store = SQLiteStore(":memory:")
    schedule(store, P, NOW, 5, b"a")
    report = run_due(store, P, TimerRegistry().register(AsyncFails()), NOW)
    assert report.failed == 1
    spans = {s.name: s for s in exporter.get_finished_spans()}
    fired = spans["timerwheel.fire AsyncFails"]
    assert fired.attributes["timerwheel.outcome"] == "raised RuntimeError"
    assert fired.status.status_code == trace.StatusCode.ERROR
    assert spans["async child"].parent.span_id == fired.context.span_id


def test_the_service_traces_its_sync_and_async_fires(exporter):
    """A service's fires, on its worker threads and on its loop, are spans too, each the parent of
    what its handler starts and linked to the span that scheduled it. The waits are liveness bounds."""
    exporter.clear()
    store = SQLiteStore(":memory:")
    registry = TimerRegistry().register(Expire()).register(AsyncExpire())
    with DurableTimerService(store, registry, [P]) as service:
        now_ms = time.time_ns() // 1_000_000
        with trace.get_tracer("app").start_as_current_span("request") as writer_span:
            service.schedule(P, now_ms, TimerKind(1), b"sync-1")
            service.schedule(P, now_ms, TimerKind(4), b"async-1")
        deadline = time.monotonic() + 30
        while len(_fires(exporter)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    fire_sync, fire_async = spans["timerwheel.fire Expire"], spans["timerwheel.fire AsyncExpire"]
    assert fire_sync.attributes["timerwheel.reference"] == "'sync-1'"
    assert fire_async.attributes["timerwheel.outcome"] == "Done"
    assert fire_sync.attributes["timerwheel.lateness_ms"] >= 0
    assert spans["send reminder"].parent.span_id == fire_sync.context.span_id
    assert spans["async child"].parent.span_id == fire_async.context.span_id
    for fired in (fire_sync, fire_async):
        assert [link.context.span_id for link in fired.links] == [writer_span.get_span_context().span_id]


def test_without_opentelemetry_fires_are_not_traced(tmp_path):
    """With opentelemetry not importable, the check is made once at import (ENABLED False in the
    runner and the executor) and a service still fires: the otel extra is optional."""
    source = textwrap.dedent("""
        import sys, time
        sys.modules["opentelemetry"] = None      # as if opentelemetry-api were not installed
        from timerwheel_c.durable import DurableTimerService, SQLiteStore
        from timerwheel_c.durable.service import executor
        from timerwheel_c.durable.timers import runner, tracing
        from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerKind, TimerRegistry
        assert not tracing.ENABLED and not runner._TRACED and not executor._TRACED

        fired = []
        class Count(TimerHandler):
            kind = TimerKind(1)
            def fire(self, ctx, timer):
                fired.append(timer.reference)
                return Done()

        store = SQLiteStore(":memory:")
        with DurableTimerService(store, TimerRegistry().register(Count()), ["p"]) as service:
            service.schedule("p", time.time_ns() // 1_000_000, TimerKind(1), b"r")
            deadline = time.monotonic() + 30
            while not fired and time.monotonic() < deadline:
                time.sleep(0.01)
        assert fired == [b"r"], fired
        assert "opentelemetry.trace" not in sys.modules
    """)
    # Run outside the checkout: ``-c`` puts the working directory first on sys.path.
    done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def test_with_the_api_alone_a_fire_starts_no_span(tmp_path):
    """With opentelemetry-api installed but no SDK's tracer provider set, a fire is the handler's call
    alone: the tracer is never asked for a span (here one that fails if asked), in the runner and in
    the service. In a process of its own: the tracer provider can be set once per process, and the
    other tests here set one."""
    source = textwrap.dedent("""
        import time
        from timerwheel_c.durable import DurableTimerService, SQLiteStore, schedule
        from timerwheel_c.durable.timers import tracing
        from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerKind, TimerRegistry
        from timerwheel_c.durable.timers.runner import run_due
        assert tracing.ENABLED

        class NoSpans:
            def start_as_current_span(self, *args, **kwargs):
                raise AssertionError("a span was started with no SDK's tracer provider set")
        tracing._tracer = NoSpans()

        fired = []
        class Count(TimerHandler):
            kind = TimerKind(1)
            def fire(self, ctx, timer):
                fired.append(timer.reference)
                return Done()

        registry = TimerRegistry().register(Count())
        store = SQLiteStore(":memory:")
        schedule(store, "p", 1_800_000_000_000, TimerKind(1), b"runner")
        assert run_due(store, "p", registry, 1_800_000_000_000).fired == 1
        with DurableTimerService(store, registry, ["p"]) as service:
            service.schedule("p", time.time_ns() // 1_000_000, TimerKind(1), b"service")
            deadline = time.monotonic() + 30
            while len(fired) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
        assert fired == [b"runner", b"service"], fired
    """)
    # Run outside the checkout: ``-c`` puts the working directory first on sys.path.
    done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def test_the_bench_row_measures_a_fire_with_and_without_otel():
    """``bench.durable_traces`` measures each variant in a process of its own (tracing is decided at
    import) and reports the ratio to the untraced fire; a calibration, so only its shape is checked."""
    from bench.durable_traces import VARIANTS, fire_costs

    figures = fire_costs(1, 20)
    assert set(figures) == set(VARIANTS)
    assert figures["no otel"][1] == 1.0 and all(us > 0 for us, _ in figures.values())


def _kept_context(store, kind, reference):
    from timerwheel_c.durable.timers import keys

    return store.get(P, keys.trace_context_row(keys.identity(kind, reference)))


def test_a_fire_links_to_the_span_that_scheduled_it(exporter, store_url):
    """A timer scheduled inside a span keeps its W3C trace context beside its identity row; its fire's
    span links to that span (same trace and span ids), and the row is gone once it fired. A timer
    scheduled without a span keeps none, and its fire has no link. On each backend."""
    from timerwheel_c.durable.storage.open import open_store

    exporter.clear()
    store = open_store(store_url)
    with trace.get_tracer("app").start_as_current_span("checkout") as writer_span:
        schedule(store, P, NOW, 1, b"linked")
    schedule(store, P, NOW, 1, b"unlinked")
    kept = _kept_context(store, 1, b"linked")
    assert kept is not None and len(kept) == 8 + 55
    assert _kept_context(store, 1, b"unlinked") is None
    report = run_due(store, P, TimerRegistry().register(Expire()), NOW)
    assert report.fired == 2
    spans = {s.attributes["timerwheel.reference"]: s for s in _fires(exporter)}
    (link,) = spans["'linked'"].links
    assert link.context.trace_id == writer_span.get_span_context().trace_id
    assert link.context.span_id == writer_span.get_span_context().span_id
    assert not spans["'unlinked'"].links
    assert _kept_context(store, 1, b"linked") is None
    store.close()


def test_the_trace_context_goes_with_a_cancel_and_a_replace_and_a_stale_one_links_nothing(exporter):
    """Cancelling a timer scheduled in a span deletes its trace context; replacing it outside a span
    deletes the replaced timer's; a context left for another due time (by a runner without tracing)
    is not linked."""
    from timerwheel_c.durable import cancel
    from timerwheel_c.durable.storage.store import Batch
    from timerwheel_c.durable.timers import keys

    exporter.clear()
    store = SQLiteStore(":memory:")
    with trace.get_tracer("app").start_as_current_span("checkout"):
        schedule(store, P, NOW, 1, b"c")
        schedule(store, P, NOW, 1, b"r")
    assert cancel(store, P, 1, b"c") and _kept_context(store, 1, b"c") is None
    schedule(store, P, NOW, 1, b"r")
    assert _kept_context(store, 1, b"r") is None
    with trace.get_tracer("app").start_as_current_span("earlier"):
        stale = keys.trace_context_value(NOW - 1, tracing.traceparent())
    store.apply(P, Batch().put(keys.trace_context_row(keys.identity(1, b"r")), stale))
    assert run_due(store, P, TimerRegistry().register(Expire()), NOW).fired == 1
    (span,) = _fires(exporter)
    assert not span.links and _kept_context(store, 1, b"r") is None


class Once(TimerHandler):
    kind = TimerKind(5)
    max_attempts = 1

    def fire(self, ctx, timer):
        raise RuntimeError("no luck")


def test_a_retry_links_again_and_parking_deletes_the_trace_context(exporter):
    """A failed attempt keeps the trace context, so the retry's span links to the writer's span too;
    a timer parked after its last attempt keeps none."""
    exporter.clear()
    store = SQLiteStore(":memory:")
    with trace.get_tracer("app").start_as_current_span("checkout") as writer_span:
        schedule(store, P, NOW, 3, b"retried")
        schedule(store, P, NOW, 5, b"parked")
    registry = TimerRegistry().register(Later()).register(Once())
    assert run_due(store, P, registry, NOW).failed == 2
    assert _kept_context(store, 3, b"retried") is not None and _kept_context(store, 5, b"parked") is None
    run_due(store, P, registry, NOW + 86_400_000)
    retries = [s for s in _fires(exporter) if s.attributes["timerwheel.kind"] == 3]
    assert [s.attributes["timerwheel.attempt"] for s in retries] == [1, 2]
    assert all([link.context.span_id for link in s.links] == [writer_span.get_span_context().span_id] for s in retries)


def test_a_schedules_occurrence_neither_reads_nor_deletes_a_trace_context(exporter, tmp_path):
    """Only schedule() keeps a trace context, for a timer by name: a schedule's occurrence never has
    one, so its traced fire reads no such row and its outcome deletes none (one statement fewer per
    occurrence), while a timer by name's fire still reads and deletes its own; each fire is traced."""
    from timerwheel_c.durable import Every, add_schedule
    from timerwheel_c.durable.timers import keys

    exporter.clear()
    store = SQLiteStore(str(tmp_path / "t.db"))
    with trace.get_tracer("app").start_as_current_span("setup"):
        add_schedule(store, P, "tick", Every(1, start=NOW - 1500), 1, misfire="all", catchup_window_s=60)
        schedule(store, P, NOW - 1, 1, b"named")
    statements: list = []
    store._db.set_trace_callback(statements.append)
    try:
        assert run_due(store, P, TimerRegistry().register(Expire()), NOW).fired == 2
    finally:
        store._db.set_trace_callback(None)
    occurrence_context = keys.trace_context_row(keys.occurrence_identity(1, b"tick")).hex()
    named_context = keys.trace_context_row(keys.identity(1, b"named")).hex()
    assert not [s for s in statements if occurrence_context in s]
    assert [s.split(" ")[0] for s in statements if named_context in s] == ["SELECT", "DELETE"]
    assert {s.attributes["timerwheel.reference"] for s in _fires(exporter)} == {"'tick'", "'named'"}
    store.close()

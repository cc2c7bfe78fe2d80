"""The durable API's convenience forms: function handlers, relative due times, bulk writes. Each
test drives time by hand (an explicit ``now_ms`` to run_due) or waits within a generous liveness
bound for a timer already due, so none depends on the machine's speed."""
from __future__ import annotations

import logging
import time

import pytest

from timerwheel_c.durable import DurableTimerService, TimerKind, TimerRegistry, get_timer, schedule
from timerwheel_c.durable.storage.store import Batch
from timerwheel_c.durable.timers.registry import Done, FunctionHandler
from timerwheel_c.durable.timers.runner import run_due

P = "api"
NOW = 1_700_000_000_000
LIVENESS_S = 30


@pytest.fixture
def store(durable_store):
    return durable_store


def test_a_sync_function_handler_fires_and_keeps_its_options(store, caplog):
    """@registry.handler registers a plain function under its kind, returns it unchanged, and its
    max_attempts parks the timer after that many failures, logged under the function's name."""
    registry = TimerRegistry()
    seen = []

    @registry.handler(TimerKind(5), max_attempts=1)
    def expire(ctx, timer):
        seen.append((ctx.partition, timer.reference, timer.value))
        if timer.reference == b"bad":
            raise RuntimeError("boom")
        return Done(Batch().put(b"done/" + timer.reference, timer.value))

    assert callable(expire) and not isinstance(expire, FunctionHandler)
    assert isinstance(registry.get(5), FunctionHandler) and registry.get(5).max_attempts == 1
    schedule(store, P, NOW - 10, 5, b"ok", b"v")
    schedule(store, P, NOW - 5, 5, b"bad", b"w")
    with caplog.at_level(logging.WARNING, logger="timerwheel_c.durable"):
        run_due(store, P, registry, NOW)
    assert seen == [(P, b"ok", b"v"), (P, b"bad", b"w")]
    assert store.get(P, b"done/ok") == b"v" and get_timer(store, P, 5, b"ok") is None
    assert get_timer(store, P, 5, b"bad").state == "parked"
    assert "kind 5 (test_a_sync_function_handler_fires_and_keeps_its_options.<locals>.expire)" in caplog.text


def test_an_async_function_handler_is_awaited_by_the_service(store):
    """An ``async def`` registered with the decorator is awaited on the service's loop: its timer,
    already due, fires within the liveness bound."""
    registry = TimerRegistry()

    @registry.handler(6)
    async def remind(ctx, timer):
        return Done(Batch().put(b"reminded/" + timer.reference, b"1"))

    with DurableTimerService(store, registry, [P]) as service:
        service.schedule(P, time.time_ns() // 1_000_000 - 1, 6, b"u1")
        deadline = time.monotonic() + LIVENESS_S
        while store.get(P, b"reminded/u1") is None and time.monotonic() < deadline:
            time.sleep(0.01)
    assert store.get(P, b"reminded/u1") == b"1"


def test_the_handler_decorator_checks_its_arguments_when_it_decorates():
    """A bad kind or option, a kind taken twice or a non-callable raise at decoration time, naming the value."""
    registry = TimerRegistry()
    with pytest.raises(ValueError, match="256"):
        registry.handler(256)(lambda ctx, timer: Done())
    with pytest.raises(ValueError, match="max_attempts"):
        registry.handler(1, max_attempts=0)(lambda ctx, timer: Done())
    with pytest.raises(TypeError, match="callable"):
        registry.handler(1)("not a function")
    registry.handler(1)(lambda ctx, timer: Done())
    with pytest.raises(ValueError, match="already registered"):
        registry.handler(1)(lambda ctx, timer: Done())

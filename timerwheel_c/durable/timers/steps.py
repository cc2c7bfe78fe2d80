"""A writer's round trips to the store as data, so that one implementation of each writer serves the
store's own connection, a caller's sync connection and a caller's asyncio connection.

A writer (:func:`~.writer.schedule`, :func:`~.writer.cancel`, :func:`~.writer.reschedule`) is a
generator that yields ``(GET, key)`` to read a row of its partition and ``(APPLY, batch)`` to commit a
guarded :class:`~timerwheel_c.durable.storage.store.Batch`, is sent the value read (bytes or None)
or the apply's result (``Committed`` / ``PreconditionFailed``), and returns its result. It does no
I/O itself: :func:`run_steps` drives it with blocking calls, :func:`arun_steps` with awaited ones.
This is the "sans-I/O" shape that psycopg 3 itself uses to share one protocol implementation between
its sync and async connections (``psycopg/generators.py``).
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable, Generator, Optional, TypeVar

__all__ = ["APPLY", "GET", "Steps", "arun_steps", "run_steps"]

T = TypeVar("T")
GET = "get"
APPLY = "apply"
#: A writer's generator: yields ``(GET, key)`` / ``(APPLY, batch)``, returns its result.
Steps = Generator[tuple, Any, T]


def run_steps(steps: "Steps[T]", get: Callable[[bytes], Optional[bytes]], apply: Callable[[Any], Any]) -> T:
    """Drive ``steps`` to its result with ``get(key)`` and ``apply(batch)`` (blocking calls); an
    exception from either propagates, the generator abandoned."""
    reply: Any = None
    try:
        while True:
            op, arg = steps.send(reply)
            reply = get(arg) if op == GET else apply(arg)
    except StopIteration as stop:
        return stop.value


async def arun_steps(steps: "Steps[T]", get: Callable[[bytes], Awaitable[Optional[bytes]]],
                     apply: Callable[[Any], Awaitable[Any]]) -> T:
    """:func:`run_steps` with ``get`` and ``apply`` coroutine functions, awaited in turn."""
    reply: Any = None
    try:
        while True:
            op, arg = steps.send(reply)
            reply = await (get(arg) if op == GET else apply(arg))
    except StopIteration as stop:
        return stop.value

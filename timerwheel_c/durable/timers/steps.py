"""A writer's round trips to the store as data, so that one implementation of each writer serves the
store's own connection, a caller's sync connection and a caller's asyncio connection.

A writer (:func:`~.writer.schedule`, :func:`~.writer.cancel`, :func:`~.writer.reschedule`) is a
generator that yields ``(GET, key)`` to read a row of its partition, ``(SCAN, (start, end, limit))``
to read its rows with ``start <= key < end`` in key order, at most ``limit``, and ``(APPLY, batch)``
to commit a guarded :class:`~timerwheel_c.durable.storage.store.Batch`, is sent the value read (bytes
or None), the rows read (a list of ``(key, value)``) or the apply's result (``Committed`` /
``PreconditionFailed``), and returns its result. It does no
I/O itself: :func:`run_steps` drives it with blocking calls, :func:`arun_steps` with awaited ones.
This is the "sans-I/O" shape that psycopg 3 itself uses to share one protocol implementation between
its sync and async connections (``psycopg/generators.py``).
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable, Generator, Optional, TypeVar

__all__ = ["APPLY", "GET", "SCAN", "Steps", "arun_steps", "run_steps"]

T = TypeVar("T")
GET = "get"
SCAN = "scan"
APPLY = "apply"
#: A writer's generator: yields ``(GET, key)`` / ``(SCAN, (start, end, limit))`` / ``(APPLY, batch)``,
#: returns its result.
Steps = Generator[tuple, Any, T]


def run_steps(steps: "Steps[T]", get: Callable[[bytes], Optional[bytes]], apply: Callable[[Any], Any],
              scan: Callable[[bytes, bytes, int], list]) -> T:
    """Drive ``steps`` to its result with ``get(key)``, ``apply(batch)`` and ``scan(start, end, limit)``
    (blocking calls); an exception from any propagates, the generator abandoned."""
    reply: Any = None
    try:
        while True:
            op, arg = steps.send(reply)
            reply = get(arg) if op == GET else apply(arg) if op == APPLY else scan(*arg)
    except StopIteration as stop:
        return stop.value


async def arun_steps(steps: "Steps[T]", get: Callable[[bytes], Awaitable[Optional[bytes]]],
                     apply: Callable[[Any], Awaitable[Any]], scan: Callable[[bytes, bytes, int], Awaitable[list]]) -> T:
    """:func:`run_steps` with ``get``, ``apply`` and ``scan`` coroutine functions, awaited in turn."""
    reply: Any = None
    try:
        while True:
            op, arg = steps.send(reply)
            reply = await (get(arg) if op == GET else apply(arg) if op == APPLY else scan(*arg))
    except StopIteration as stop:
        return stop.value

"""A writer's round trips to the store as data, so that one implementation of each writer serves the
store's own connection, a caller's sync connection and a caller's asyncio connection.

A writer (:func:`~.writer.schedule`, :func:`~.writer.cancel`, :func:`~.writer.reschedule`) is a
generator that yields ``(GET, key)`` to read a row of its partition, ``(GET_THROUGH, key)`` to read a
row and the row whose key it holds at one instant (``(value, value at that key)``, Nones for rows
missing: the store's ``get_through``), ``(SCAN, (start, end, limit))``
to read its rows with ``start <= key < end`` in key order, at most ``limit``, and ``(APPLY, batch)``
to commit a guarded :class:`~timerwheel_c.durable.storage.store.Batch`, is sent the value read (bytes
or None), the rows read (a list of ``(key, value)``) or the apply's result (``Committed`` /
``PreconditionFailed``), and returns its result. It does no
I/O itself: :func:`run_steps` drives it with blocking calls, :func:`arun_steps` with awaited ones.
This is the "sans-I/O" shape that psycopg 3 itself uses to share one protocol implementation between
its sync and async connections (``psycopg/generators.py``).
"""
from __future__ import annotations

from typing import Any, Generator, TypeVar

__all__ = ["APPLY", "GET", "GET_THROUGH", "SCAN", "Steps", "arun_steps", "run_steps"]

T = TypeVar("T")
GET = "get"
GET_THROUGH = "get_through"
SCAN = "scan"
APPLY = "apply"
#: A writer's generator: yields ``(GET, key)`` / ``(GET_THROUGH, key)`` / ``(SCAN, (start, end, limit))`` /
#: ``(APPLY, batch)``,
#: returns its result.
Steps = Generator[tuple, Any, T]


def run_steps(steps: "Steps[T]", tx: Any) -> T:
    """Drive ``steps`` to its result with ``tx``'s blocking ``get(key)``, ``get_through(key)``,
    ``apply(batch)`` and ``scan(start, end, limit)``; an exception from any propagates, the generator
    abandoned."""
    reply: Any = None
    calls = {GET: tx.get, GET_THROUGH: tx.get_through, APPLY: tx.apply}
    scan = tx.scan
    try:
        while True:
            op, arg = steps.send(reply)
            reply = scan(*arg) if op == SCAN else calls[op](arg)
    except StopIteration as stop:
        return stop.value


async def arun_steps(steps: "Steps[T]", tx: Any) -> T:
    """:func:`run_steps` with ``tx``'s coroutine functions, awaited in turn."""
    reply: Any = None
    calls = {GET: tx.get, GET_THROUGH: tx.get_through, APPLY: tx.apply}
    scan = tx.scan
    try:
        while True:
            op, arg = steps.send(reply)
            reply = await (scan(*arg) if op == SCAN else calls[op](arg))
    except StopIteration as stop:
        return stop.value

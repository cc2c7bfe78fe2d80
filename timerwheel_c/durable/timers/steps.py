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

import functools
from typing import Any, Awaitable, Callable, Generator, Optional, TypeVar

from ..storage.store import read_in_turn

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
    """Drive ``steps`` to its result with ``tx``'s blocking ``get(key)``, ``get_through(key)`` (an
    object without one gets its two ``get`` in turn), ``apply(batch)`` and ``scan(start, end, limit)``;
    an exception from any propagates, the generator abandoned."""
    reply: Any = None
    get_through = getattr(tx, "get_through", None) or _through(tx.get)
    get, apply, scan = tx.get, tx.apply, tx.scan
    send = steps.send
    try:
        while True:
            op, arg = send(reply)
            if op == APPLY:
                reply = apply(arg)
            elif op == GET_THROUGH:
                reply = get_through(arg)
            elif op == GET:
                reply = get(arg)
            elif op == SCAN:
                reply = scan(*arg)
            else:
                raise KeyError(op)
    except StopIteration as stop:
        return stop.value


async def arun_steps(steps: "Steps[T]", tx: Any) -> T:
    """:func:`run_steps` with ``tx``'s coroutine functions, awaited in turn."""
    reply: Any = None
    calls = {GET: tx.get, GET_THROUGH: getattr(tx, "get_through", None) or _athrough(tx.get), APPLY: tx.apply}
    scan = tx.scan
    try:
        while True:
            op, arg = steps.send(reply)
            reply = await (scan(*arg) if op == SCAN else calls[op](arg))
    except StopIteration as stop:
        return stop.value


def _through(get: Callable[[bytes], Optional[bytes]]) -> Callable[[bytes], tuple]:
    """``get_through`` of an object that has only ``get`` (a caller's own): its two reads in turn."""
    return functools.partial(read_in_turn, get)


def _athrough(get: Callable[[bytes], Awaitable[Optional[bytes]]]) -> Callable[[bytes], Awaitable[tuple]]:
    """:func:`_through` of a coroutine function ``get``."""
    async def get_through(key: bytes) -> tuple:
        value = await get(key)
        return value, (None if value is None else await get(value))
    return get_through

"""Cancels that psycopg loses: before psycopg 3.3 its async waits for the server go through
``asyncio.wait_for``, which before Python 3.12 can swallow a cancel that lands as the wait ends
(CPython gh-86296); the write then returns as if never cancelled, and a task cancelled in a loop of
writes goes on for ever (``asyncio.run`` never ends after Ctrl-C). psycopg 3.2 is the newest on
Python 3.9, and the one a pin keeps on later versions.

:func:`keeping_cancels` awaits such a write in a task of its own through :func:`asyncio.wait`,
which never loses a cancel: the caller's lands there, and is passed on to the task.
"""
from __future__ import annotations

import asyncio
import sys
from typing import Awaitable, TypeVar

import psycopg

__all__ = ["LOSES_CANCELS", "keeping_cancels"]

T = TypeVar("T")


def _major_minor(version: str) -> tuple:
    parts = version.split(".")
    return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)


#: True where an awaited psycopg call may lose a cancel (see the module docstring).
LOSES_CANCELS = sys.version_info < (3, 12) and _major_minor(psycopg.__version__) < (3, 3)


async def keeping_cancels(awaitable: Awaitable[T]) -> T:
    """``await awaitable`` (psycopg calls), such that a cancel of the caller is never lost: where
    :data:`LOSES_CANCELS`, in a task of its own, awaited with :func:`asyncio.wait`; a cancel of the
    caller cancels that task, waits for it to end, and is raised (the write's outcome is then
    unknown, as for any cancelled write).

    Raises:
        asyncio.CancelledError: the caller was cancelled. Whatever ``awaitable`` raises.
    """
    if not LOSES_CANCELS:
        return await awaitable
    task = asyncio.ensure_future(awaitable)
    try:
        await asyncio.wait([task])
    except asyncio.CancelledError:
        # Passed on, and waited for: the write ends (its connection back in its pool) before the
        # caller goes on, whether or not psycopg keeps that cancel, a second cancel of the caller
        # included (a task group's, asyncio.run's at exit); what the write ended with is dropped.
        task.cancel()
        while not task.done():
            try:
                await asyncio.wait([task])
            except asyncio.CancelledError:
                pass  # passed on once already: the write is ending
        if not task.cancelled():
            task.exception()
        raise
    return task.result()

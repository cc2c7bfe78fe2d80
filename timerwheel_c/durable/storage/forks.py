"""A store's connections across ``os.fork()``: a forked child never uses, closes or lets be collected
a connection its parent opened, and opens its own on first use.

The two processes would share one socket to PostgreSQL (each reading the other's answers: a write
of the parent got the child's rows), or one SQLite file's connection with its locks and WAL index
(SQLite's own docs: "do not open an SQLite database connection, then fork()"). Even a child that
only drops the inherited connection ends the parent's session: libpq tells the server goodbye on
the shared socket. So each store registers here, and in a child (``os.register_at_fork``) each
forgets what it inherited: a PostgreSQL socket is first pointed at ``/dev/null`` (the goodbye goes
nowhere, the descriptor number stays taken until the connection is collected); what cannot be
so silenced (a SQLite connection, an asyncio pool) is kept referenced for the child's life.
The model is SQLAlchemy's ``engine.dispose(close=False)`` in a child, and psycopg's advice that a
connection not be shared across processes.
"""
from __future__ import annotations

import os
import weakref
from typing import Any

__all__ = ["keep", "silence", "track"]

_STORES: "weakref.WeakSet[Any]" = weakref.WeakSet()
_INHERITED: list = []  # what children keep referenced, never closed: see keep()


def track(store: Any) -> None:
    """Have ``store._after_fork()`` called in every child this process forks from now on."""
    _STORES.add(store)


def keep(obj: Any) -> None:
    """Keep ``obj``, inherited from the parent, referenced for this child's life: never closed, never
    collected (its close would act on what the parent still uses)."""
    _INHERITED.append(obj)


def silence(fd: int) -> None:
    """Point the inherited socket ``fd`` at ``/dev/null`` in this child, its number still taken: what
    the child's copy of the connection later writes there (libpq's goodbye when it is closed or
    collected) reaches no server, and the parent's session on the socket goes on."""
    null = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def _after_fork_in_child() -> None:
    for store in list(_STORES):
        try:
            store._after_fork()
        except Exception:  # noqa: BLE001 -- one store's trouble must not leave the others inherited
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

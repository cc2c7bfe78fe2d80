"""A write's savepoint on a caller's connection, and :class:`Joined`, the interface of such a write:
what the SQLite half (:mod:`.joined`) and the PostgreSQL half (:mod:`.postgres.joined`) of writes in the
caller's own transaction share. :mod:`.joined` gives the contract and picks the half for a store.
"""
from __future__ import annotations

import abc
import contextlib
import logging
from typing import Optional, Union

from .errors import StoreError, wrap_exceptions
from .store import Batch, Committed, PreconditionFailed, read_in_turn

__all__ = ["OPEN", "Joined", "ending", "type_name", "unless_failing"]

log = logging.getLogger("timerwheel_c.durable")

# One spelling that both SQLite and PostgreSQL take.
OPEN = "SAVEPOINT timerwheel_c_write"
_RELEASE = "RELEASE SAVEPOINT timerwheel_c_write"
_UNDO = "ROLLBACK TO SAVEPOINT timerwheel_c_write"


def type_name(obj: object) -> str:
    """``module.Class`` of ``obj``: what the messages name instead of its repr, which for a
    connection may hold its DSN."""
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def ending(exc: Optional[BaseException]) -> tuple:
    """The statements that end a write: release its savepoint, or, when the write raised ``exc``,
    first roll back to it (undoing the write alone, and clearing a PostgreSQL transaction's error)."""
    return (_RELEASE,) if exc is None else (_UNDO, _RELEASE)


@contextlib.contextmanager
def unless_failing(exc: Optional[BaseException], wrap: wrap_exceptions):
    """Raise a failure to end a write as the StoreError that ``wrap`` makes of it, unless the write
    already failed with ``exc``: the connection is then likely gone, ``exc`` says why, and this one
    is only logged."""
    try:
        with wrap:
            yield
    except StoreError:
        if exc is None:
            raise
        log.debug("ending the write's savepoint failed after the write failed", exc_info=True)


class Joined(abc.ABC):
    """A write in progress on a caller's connection: entering it opens the write's savepoint (and,
    where the connection would, begins the caller's transaction); leaving it releases the savepoint,
    or rolls back to it when the block raised. In between, :meth:`get`, :meth:`get_through`, :meth:`scan` and :meth:`apply` act as
    the store's own on the write's partition, inside the caller's transaction."""

    @abc.abstractmethod
    def get(self, key: bytes) -> Optional[bytes]:
        """The value at ``key`` as the caller's transaction sees it, or None."""

    def get_through(self, key: bytes) -> tuple:
        """:meth:`~.store.Store.get_through` as the caller's transaction sees it: in one statement where
        a backend overrides it (both of this package's do), else its two reads in turn."""
        return read_in_turn(self.get, key)

    @abc.abstractmethod
    def scan(self, start: bytes, end: bytes, limit: int) -> list:
        """``(key, value)`` of the rows with ``start <= key < end`` in key order, at most ``limit``, as
        the caller's transaction sees them."""

    @abc.abstractmethod
    def apply(self, batch: Batch) -> Union[Committed, PreconditionFailed]:
        """Judge ``batch``'s guards and write it inside the caller's transaction (committed when it is)."""

    @abc.abstractmethod
    def __enter__(self) -> "Joined":
        """Open the write's savepoint."""

    @abc.abstractmethod
    def __exit__(self, typ, exc, tb) -> None:
        """Release the savepoint, or roll back to it when the block raised."""

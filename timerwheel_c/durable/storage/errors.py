"""The storage layer's one error hierarchy: every backend raises these itself, so the layers above
never match driver classes or message text (as procrastinate's connector wraps its driver's errors).

- :class:`TransientStoreError`: a passing condition worth retrying as it is (a lost or refused
  connection, a server restart, a serialization failure or deadlock, SQLite's busy/locked).
- :class:`PermanentStoreError`: retrying the same call will fail the same way (a value the
  server refuses, a full disk, a read-only or corrupt file, a schema this version does not know).

Each keeps the driver's exception as ``__cause__``. Backends classify by SQLSTATE class
(PostgreSQL, https://www.postgresql.org/docs/current/errcodes-appendix.html) and by result code
(SQLite, https://sqlite.org/rescode.html), never by message text. APScheduler 4 likewise
retries only the errors it knows to be transient.
"""
from __future__ import annotations

import sqlite3

__all__ = ["PermanentStoreError", "StoreError", "TransientStoreError", "is_transient"]


class StoreError(Exception):
    """A store call failed; ``__cause__`` holds the driver's exception."""


class TransientStoreError(StoreError):
    """A store call failed for a passing reason: the same call may succeed when retried."""


class PermanentStoreError(StoreError):
    """A store call failed for a reason that retrying will not fix."""


_SQLITE_TRANSIENT = ("database is locked", "database table is locked", "database is busy")


def _psycopg_transient(exc: BaseException) -> bool:
    try:
        import psycopg
    except ImportError:
        return False
    return isinstance(exc, psycopg.OperationalError)


def is_transient(exc: BaseException) -> bool:
    """True when ``exc``, raised by a store call, is worth retrying as a passing condition.

    Transitional: until every backend raises :class:`StoreError` itself, driver errors are still
    classified here."""
    if isinstance(exc, StoreError):
        return isinstance(exc, TransientStoreError)
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, sqlite3.OperationalError):
        return any(text in str(exc).lower() for text in _SQLITE_TRANSIENT)
    return _psycopg_transient(exc)

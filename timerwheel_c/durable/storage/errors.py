"""Which store errors are transient: the service retries every store error, but logs and counts
the two kinds apart, so a bug does not read as a flaky database.

Transient, as APScheduler 4 classifies them (it retries lost connections and OS errors, and
lets everything else surface): a lost or refused connection (``psycopg.OperationalError``,
which covers a server restart, ``pg_terminate_backend`` and a failed serialization or
deadlock, and :class:`ConnectionError`), and SQLite's "database is locked" / "busy"
(https://sqlite.org/rescode.html#busy). Anything else (a constraint or type error, a full
disk, a corrupt file, a bug in a backend) is not.
"""
from __future__ import annotations

import sqlite3

__all__ = ["is_transient"]

_SQLITE_TRANSIENT = ("database is locked", "database table is locked", "database is busy")


def _psycopg_transient(exc: BaseException) -> bool:
    try:
        import psycopg
    except ImportError:
        return False
    return isinstance(exc, psycopg.OperationalError)


def is_transient(exc: BaseException) -> bool:
    """True when ``exc``, raised by a store call, is worth retrying as a passing condition."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, sqlite3.OperationalError):
        return any(text in str(exc).lower() for text in _SQLITE_TRANSIENT)
    return _psycopg_transient(exc)

"""The storage layer's one error hierarchy: every backend raises these itself, so the layers above
never match driver classes or message text (as procrastinate's connector wraps its driver's errors).

- :class:`TransientStoreError`: a passing condition worth retrying as it is (a lost or refused
  connection, a server restart, a serialization failure or deadlock, SQLite's busy/locked), or a
  refusal of every write by the store as a whole (a full disk, a read-only server or file, as
  during a failover), which ends without any change to the call: a runner backs off the whole
  pass, and quarantines no row for it.
- :class:`PermanentStoreError`: retrying the same call will fail the same way (a value the
  server refuses, a corrupt file, a schema this version does not know).

A write whose connection is lost while its commit is on its way (a server restart or a network
cut at that moment) raises TransientStoreError, yet the server may have committed it: no client
of any database can tell which. The writes by name are made to be retried through that doubt:
``schedule()`` again leaves one timer of the name (with ``if_exists="replace"``), and ``cancel()``
again returns False for a timer the first call removed, so a caller that must know reads it back
(``get_timer``). A runner's claims and outcomes are guarded on their rows, so a retry of one that
committed fails its guard and changes nothing.

Each keeps the driver's exception as ``__cause__`` and its code as ``code`` (a PostgreSQL SQLSTATE
such as ``"54000"``, a SQLite result code name such as ``"SQLITE_BUSY"``, or None). Backends
classify by SQLSTATE class (PostgreSQL, https://www.postgresql.org/docs/current/errcodes-appendix.html)
and by result code (SQLite, https://sqlite.org/rescode.html), never by message text, through
:class:`wrap_exceptions`. APScheduler 4 likewise retries only the errors it knows to be transient.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Dict, Optional, Tuple

__all__ = ["PermanentStoreError", "PicklesItsArguments", "StoreError", "TransientStoreError", "is_transient",
           "wrap_exceptions"]


class PicklesItsArguments(Exception):
    """A base of the exceptions whose ``__init__`` takes other arguments than their message: each
    keeps them (``_arguments``: positional, keyword), and pickling (a process pool's worker that
    raises one, multiprocessing) makes it again from them, where BaseException's pickling passes
    the message alone to ``__init__`` and unpickling fails."""

    _arguments: Tuple[tuple, Dict[str, Any]] = ((), {})

    def __reduce__(self):
        args, kwargs = self._arguments
        return functools.partial(type(self), **kwargs), args, self.__dict__


class StoreError(Exception):
    """A store call failed; ``__cause__`` holds the driver's exception, ``code`` its code (str or None)."""

    def __init__(self, message: str, code: Optional[str] = None):
        super().__init__(message)
        self.code = code


class TransientStoreError(StoreError):
    """A store call failed for a passing reason: the same call may succeed when retried."""


class PermanentStoreError(StoreError):
    """A store call failed for a reason that retrying will not fix."""


def is_transient(exc: BaseException) -> bool:
    """True when ``exc``, raised by a store call, is worth retrying as a passing condition: a
    :class:`TransientStoreError`, or an OS-level connection loss or timeout."""
    return isinstance(exc, (TransientStoreError, ConnectionError, TimeoutError))


class wrap_exceptions(contextlib.ContextDecorator):
    """A context manager (and method decorator) that re-raises every ``driver_error`` raised inside it as
    the :class:`StoreError` that ``classify(exc)`` returns, chained to it (procrastinate's
    ``wrap_exceptions``). Errors that are already StoreErrors, or not driver errors, pass unchanged."""

    def __init__(self, driver_error: type, classify: Callable[[Any], StoreError]):
        self._driver_error = driver_error
        self._classify = classify

    def __enter__(self):
        return self

    def __exit__(self, typ, exc, tb):
        if exc is not None and isinstance(exc, self._driver_error) and not isinstance(exc, StoreError):
            raise self._classify(exc) from exc
        return False

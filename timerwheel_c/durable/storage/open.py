"""Opening a store from a URL.

A store URL is ``sqlite:///PATH`` (as in SQLAlchemy: three slashes, then the path, so
an absolute path gives four; ``sqlite:///:memory:`` for an in-memory database; no ``?`` options), or
``postgresql://...`` / ``postgres://...`` (a libpq connection URI; a ``key=value`` connection string
is not a URL: give it to ``PostgresStore`` itself. Needs psycopg 3, the ``postgres`` extra).
"""
from __future__ import annotations

from typing import Optional

from .redact import redact
from .store import Store

__all__ = ["SQLITE_PREFIX", "open_store", "sqlite_path"]

SQLITE_PREFIX = "sqlite:///"


def sqlite_path(url: str) -> Optional[str]:
    """The file path of a ``sqlite:///PATH`` URL, as given (``:memory:`` included); None for another scheme.

    Raises:
        ValueError: an empty path, or one with a query or a fragment (``?``, ``#``), naming the URL
            (password masked).
    """
    if not url.startswith(SQLITE_PREFIX):
        return None
    path = url[len(SQLITE_PREFIX):]
    if not path:
        raise ValueError(f"store URL {redact(url, url)!r} has no path (use sqlite:///relative.db or sqlite:////abs/path.db)")
    if "?" in path or "#" in path:
        # SQLAlchemy's URLs and SQLite's own URIs carry options there; the path is opened as it
        # is, so an option would name another file: a new, empty store beside the application's.
        raise ValueError(f"store URL {redact(url, url)!r}: a sqlite:/// URL takes a file path alone, no query (?...) "
                         f"or fragment (#...)")
    return path


def open_store(url: str, *, read_only: bool = False, create: bool = True) -> Store:
    """Open the store named by ``url``; with ``read_only``, for reading alone: nothing is created,
    upgraded or written, a database without a store raises
    :class:`~timerwheel_c.durable.storage.store.NoStoreError`, and a SQLite file is opened
    read-only (see each store's ``read_only``). With ``create=False``, for a command that writes
    rows but must not make a store: nothing is created or upgraded (no file, no DDL), and a
    database without a store raises NoStoreError, but the store may write.

    Raises:
        TypeError: ``url`` is not a str.
        ValueError: an unsupported scheme, an empty path, or a SQLite path with a query or a fragment
            (``?``, ``#``), naming the URL (password masked).
        ImportError: a postgresql:// URL without psycopg installed; the message gives the
            install command, ``pip install 'timerwheel_c[postgres]'``.
        PermanentStoreError / TransientStoreError (:mod:`.errors`, never the driver's own errors):
            the database cannot be opened (see each store's Raises: a SQLite path whose directory
            does not exist or that is no database file is permanent; a PostgreSQL server that
            cannot be reached or refuses the connection is transient); SchemaError,
            SchemaVersionError and NoStoreError (PermanentStoreErrors): as each store raises them.
    """
    if not isinstance(url, str):
        raise TypeError(f"store URL must be a str, got {type(url).__name__}")
    path = sqlite_path(url)
    if path is not None:
        from .sqlite.store import SQLiteStore

        return SQLiteStore(path, read_only=read_only, create=create)
    if url.startswith(("postgresql://", "postgres://")):
        try:
            from .postgres.store import PostgresStore
        except ModuleNotFoundError as exc:
            if exc.name != "psycopg":
                raise
            raise ModuleNotFoundError(
                "a postgresql:// store needs psycopg 3, which is not installed: "
                "pip install 'timerwheel_c[postgres]'", name="psycopg") from exc
        return PostgresStore(url, read_only=read_only, create=create)
    raise ValueError(f"unsupported store URL {redact(url, url)!r}: expected sqlite:///PATH or postgresql://... (a libpq "
                     "URI; a key=value connection string goes to PostgresStore(dsn) itself)")

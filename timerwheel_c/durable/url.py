"""Opening a store from a URL: ``sqlite:///PATH`` (as in SQLAlchemy: three slashes, then the path,
so an absolute path gives four; ``sqlite:///:memory:`` for an in-memory database), or
``postgresql://...`` / ``postgres://...`` (a libpq URL; needs psycopg 3, the ``postgres`` extra)."""
from __future__ import annotations

import re

from .store import Store

__all__ = ["open_store", "redacted"]

# The password of a URL's user info (scheme://user:PASSWORD@host), and a password given as a
# parameter (libpq's key=value form, or a URL's ?password=...).
_USERINFO_PASSWORD = re.compile(r"^([a-z][a-z0-9+.-]*://[^:@/?#]*):[^@/?#]*@", re.IGNORECASE)
_PARAM_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)", re.IGNORECASE)

_SQLITE = "sqlite:///"


def open_store(url: str) -> Store:
    """Open the store named by ``url``.

    Raises:
        TypeError: ``url`` is not a str.
        ValueError: an unsupported scheme or an empty path, naming the URL.
        ImportError: a postgresql:// URL without psycopg installed.
        sqlite3.Error / psycopg.Error: the database cannot be opened.
    """
    if not isinstance(url, str):
        raise TypeError(f"store URL must be a str, got {type(url).__name__} {url!r}")
    if url.startswith(_SQLITE):
        path = url[len(_SQLITE):]
        if not path:
            raise ValueError(f"store URL {url!r} has no path (use sqlite:///relative.db or sqlite:////abs/path.db)")
        from .sqlite import SQLiteStore

        return SQLiteStore(path)
    if url.startswith(("postgresql://", "postgres://")):
        from .postgres import PostgresStore  # ImportError without psycopg

        return PostgresStore(url)
    raise ValueError(f"unsupported store URL {url!r}: expected sqlite:///PATH or postgresql://...")


def redacted(url: str) -> str:
    """``url`` (a store URL or a libpq connection string) with every password replaced by
    ``***``, fit for a log line, an error message or a repr."""
    return _PARAM_PASSWORD.sub(r"\1***", _USERINFO_PASSWORD.sub(r"\1:***@", url))

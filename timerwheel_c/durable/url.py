"""Opening a store from a URL: ``sqlite:///PATH`` (as in SQLAlchemy: three slashes, then the path,
so an absolute path gives four; ``sqlite:///:memory:`` for an in-memory database)."""
from __future__ import annotations

from .store import Store

__all__ = ["open_store"]

_SQLITE = "sqlite:///"


def open_store(url: str) -> Store:
    """Open the store named by ``url``.

    Raises:
        TypeError: ``url`` is not a str.
        ValueError: an unsupported scheme or an empty path, naming the URL.
        sqlite3.Error: the database cannot be opened.
    """
    if not isinstance(url, str):
        raise TypeError(f"store URL must be a str, got {type(url).__name__} {url!r}")
    if url.startswith(_SQLITE):
        path = url[len(_SQLITE):]
        if not path:
            raise ValueError(f"store URL {url!r} has no path (use sqlite:///relative.db or sqlite:////abs/path.db)")
        from .sqlite import SQLiteStore

        return SQLiteStore(path)
    raise ValueError(f"unsupported store URL {url!r}: expected sqlite:///PATH")

"""The SQLite backend (the embedded default, the standard library's ``sqlite3``), in one folder: the
store (:mod:`.store`) and its SQL (``sql/``).
"""
from .store import SCHEMA_VERSION, SQLiteStore

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

"""SQLite's errors in the store contract's terms: a ``sqlite3.Error`` as a
:class:`~..errors.StoreError`, transient or permanent by its result code. Shared by the store
(:mod:`.store`) and writes through a caller's connection (:mod:`.joined`).
"""
from __future__ import annotations

import sqlite3

from ..errors import PermanentStoreError, StoreError, TransientStoreError
from ..redact import redact
from ..shards import MAX_SHARD_COUNT
from ..store import SchemaError

__all__ = ["result_code", "store_error"]

# SQLite's primary result codes (https://sqlite.org/rescode.html) of passing conditions: BUSY,
# LOCKED, NOMEM, INTERRUPT, PROTOCOL (a WAL lock race) and SCHEMA (another connection changed it),
# and the store-wide refusals of a file that was open for writing: READONLY (the file or its
# filesystem turned read-only) and FULL (the disk), which end when someone steps in, and which a
# runner backs off from rather than quarantine the rows it met. Opening a file refuses them at
# once (PermanentStoreError, see SQLiteStore._open_error).
_TRANSIENT_CODES = {5: "SQLITE_BUSY", 6: "SQLITE_LOCKED", 7: "SQLITE_NOMEM", 8: "SQLITE_READONLY", 9: "SQLITE_INTERRUPT",
                    13: "SQLITE_FULL", 15: "SQLITE_PROTOCOL", 17: "SQLITE_SCHEMA"}
# Python before 3.11 gives no result code; SQLite's fixed text for each code (sqlite3_errstr(),
# which is what sqlite3_errmsg() returns for these) maps the message back to it, there only.
_ERRSTR_CODES = {"database is locked": 5, "database table is locked": 6, "out of memory": 7, "interrupted": 9,
                 "locking protocol": 15, "database schema has changed": 17, "database or disk is full": 13,
                 "attempt to write a readonly database": 8, "disk I/O error": 10, "unable to open database file": 14,
                 "database disk image is malformed": 11, "file is not a database": 26}
_CODE_NAMES = {**_TRANSIENT_CODES, 10: "SQLITE_IOERR", 11: "SQLITE_CORRUPT", 14: "SQLITE_CANTOPEN", 26: "SQLITE_NOTADB"}


def result_code(exc: sqlite3.Error) -> tuple:
    """``(primary result code, its name)`` of a sqlite3 error, ``(None, None)`` when it has none
    (a closed connection, a misuse of the module)."""
    code = getattr(exc, "sqlite_errorcode", None)  # Python >= 3.11
    if code is None:
        code = _ERRSTR_CODES.get(str(exc))
        if code is None:
            return None, None
    name = getattr(exc, "sqlite_errorname", None) or _CODE_NAMES.get(code & 0xFF, f"SQLITE_{code & 0xFF}")
    return code & 0xFF, name


def store_error(path: str, exc: sqlite3.Error) -> StoreError:
    """The :class:`StoreError` for a sqlite3 error on the database ``path``: transient for the
    result codes of passing conditions, permanent for every other; a :class:`SchemaError` for a write
    refused a shard because the meta table records no shard count (queries.sql's ``put``)."""
    primary, name = result_code(exc)
    where = f"SQLite database {redact(path, path)!r}"
    if isinstance(exc, sqlite3.IntegrityError) and str(exc) == "NOT NULL constraint failed: timerwheel_kv.shard":
        return SchemaError(f"{where} records no shard count of 1..{MAX_SHARD_COUNT} (its meta "
                           "table's shard_count row): the table was edited or is damaged, and nothing was written",
                           name)
    kind = TransientStoreError if primary in _TRANSIENT_CODES else PermanentStoreError
    return kind(f"{where}: {exc}" + (f" ({name})" if name else ""), name)

"""What the PostgreSQL server answers, in the store contract's terms: a psycopg error as a
:class:`~..errors.StoreError` (transient or permanent, by its SQLSTATE), and the row of the
``<table>_apply_many`` function as per-batch results. Shared by the store's own statements
(:mod:`.store`) and those on a caller's connection (:mod:`.joined`).
"""
from __future__ import annotations

from typing import Optional

import psycopg

from ..errors import PermanentStoreError, StoreError, TransientStoreError
from ..redact import redact
from ..store import COMMITTED, PreconditionFailed, Refused

__all__ = ["RESHARD_RETRIES", "apply_results", "is_transient_sqlstate", "resharded_meanwhile", "session_is_stale",
           "store_error"]

# SQLSTATEs of passing conditions (https://www.postgresql.org/docs/current/errcodes-appendix.html),
# by class: 08 connection exception, 40 transaction rollback (serialization failure, deadlock),
# 53 insufficient resources (too many connections, out of memory, disk full) and 57 operator
# intervention (admin or crash shutdown, cannot connect now, query canceled) but for 57P04 database
# dropped; 55P03 lock not available, 55006 object in use, and 25006 read-only SQL transaction (a
# standby during a failover, or default_transaction_read_only set for maintenance). A full disk and
# a read-only server refuse every write, whatever the row: a store-wide refusal, which ends when
# space is freed or writes come back, so a runner backs off and retries rather than quarantine the
# rows it met meanwhile. Everything else (22 data exception, 23 integrity, 54 program limit exceeded
# such as an index row too large, 42 syntax or access, XX internal) is permanent.
_TRANSIENT_CLASSES = ("08", "40", "53", "57")
_PERMANENT_IN_TRANSIENT_CLASSES = ("57P04",)
_TRANSIENT_STATES = ("55P03", "55006", "25006")


def is_transient_sqlstate(sqlstate: Optional[str]) -> bool:
    """True for a SQLSTATE of a passing condition (see above); None (an error the client raised
    itself, without a server reply: a lost or refused connection) counts as one."""
    if sqlstate is None:
        return True
    if sqlstate in _PERMANENT_IN_TRANSIENT_CLASSES:
        return False
    return sqlstate[:2] in _TRANSIENT_CLASSES or sqlstate in _TRANSIENT_STATES


def session_is_stale(exc: BaseException) -> bool:
    """True when ``exc`` is a refusal that no retry on the same session ends: 25006, a read-only
    transaction. A session keeps the ``default_transaction_read_only`` it began with (a database's
    or role's setting for maintenance, a standby's), so once a DBA resets it, or a standby is
    promoted, only a new session writes: the session that met it must be closed, not reused."""
    # A psycopg error, or the StoreError it became on the way (its code is the SQLSTATE).
    return (getattr(exc, "sqlstate", None) if isinstance(exc, psycopg.Error) else getattr(exc, "code", None)) == "25006"


def store_error(exc: psycopg.Error, dsn: Optional[str] = None) -> StoreError:
    """The :class:`StoreError` for a psycopg error: classified by its SQLSTATE (a client-side error
    without one is transient when it is about the connection, permanent otherwise: a malformed DSN
    or a misuse); the message is the driver's, its password redacted."""
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate is None:
        transient = isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))
    else:
        transient = is_transient_sqlstate(sqlstate)
    message = redact(str(exc).strip() or type(exc).__name__, dsn)
    kind = TransientStoreError if transient else PermanentStoreError
    return kind(f"PostgreSQL: {message}" + (f" (SQLSTATE {sqlstate})" if sqlstate else ""), sqlstate)


def apply_results(failed: list, refused: list) -> list:
    """The per-batch results (:class:`Committed`, :class:`PreconditionFailed`, :class:`Refused`) of
    the row ``(failed, refused)`` that a call of :meth:`PostgresStore.apply_call` returned."""
    return [Refused(_refusal(why)) if why is not None else COMMITTED if f is None else PreconditionFailed(bytes(f))
            for f, why in zip(failed, refused)]


def _refusal(why: str) -> StoreError:
    """The error of a batch the server refused inside ``<table>_apply_many``: ``why`` is
    ``"SQLSTATE message"``."""
    sqlstate, _, message = why.partition(" ")
    kind = TransientStoreError if is_transient_sqlstate(sqlstate) else PermanentStoreError
    return kind(f"PostgreSQL refused the batch: {message} (SQLSTATE {sqlstate})", sqlstate)


#: Calls of a write made again, each after reading the store's new shard count, before giving up
#: (another process resharding the store as often: see PostgresStore.at_recorded_count).
RESHARD_RETRIES = 10


def resharded_meanwhile(table: str) -> TransientStoreError:
    """The error of a write whose every call found the shard count of ``table`` changed meanwhile."""
    return TransientStoreError(f"PostgreSQL table {table!r}: its shard count changed under {RESHARD_RETRIES} "
                               "calls of one write in a row")

"""A store's sessions are its own: connection poolers in transaction or statement mode are refused.

A PostgresStore relies on its server sessions: a fleet runner holds its shards with session advisory
locks, wake-ups come through ``LISTEN``, each connection sets ``lock_timeout`` and the isolation level
(and a read-only store ``default_transaction_read_only``), and psycopg prepares the statements it
runs often. A pooler that hands a server session to another client after each transaction
(PgBouncer's ``pool_mode = transaction`` or ``statement``, and poolers like it) breaks each of them:
two runners both own every shard, or none does; a wake-up is lost; a ``SET`` reaches another client's
transactions; a prepared statement is missing, or another client's is run. A pool in session mode
(``pool_mode = session``) lends a session for the whole life of a connection, and works.

So the first open of a store on a connection string, in a process, asks whether two of its
connections, open at once, ever run on one server session (``pg_backend_pid()``), which no server
and no session-mode pool allows, and refuses the store if they do. A pooler that gives the two
connections different sessions every time it is asked is not seen; the docs say to use session mode.
"""
from __future__ import annotations

import threading

import psycopg

from ..errors import PermanentStoreError, StoreError
from .results import store_error
from .session import open_session

__all__ = ["PROBES", "refuse_shared_sessions"]

PROBES = 3  # rounds of the two connections' pid reads: a pooler that reuses its last session shows at once
_TOO_MANY_CONNECTIONS = "53300"  # SQLSTATE too_many_connections: the role's or the server's limit
_TOO_MANY_WORDS = ("too many connections", "too many clients")  # its messages (role or database; server)
_checked: set = set()  # connection strings whose sessions were found to be their own, in this process
_lock = threading.Lock()


def refuse_shared_sessions(dsn: str, describe: str) -> None:
    """Return if two connections to ``dsn`` open at once run on two server sessions (checked once per
    ``dsn`` in a process); ``describe`` names it (its password masked).

    Raises:
        PermanentStoreError: they ran on one session: a pooler in transaction or statement mode.
        StoreError: the server cannot be reached, or refuses the DSN.
    """
    with _lock:
        if dsn in _checked:
            return
    first = open_session(dsn)
    try:
        try:
            second = open_session(dsn)
        except StoreError as exc:
            # Refused at connect time, libpq gives no SQLSTATE: the server's words tell it.
            if exc.code != _TOO_MANY_CONNECTIONS and not any(w in str(exc) for w in _TOO_MANY_WORDS):
                raise
            return  # a role or server that allows one connection more: unchecked, as no pooler could share it
        try:
            for _ in range(PROBES):
                pids = [_pid(conn) for conn in (first, second)]
                if pids[0] == pids[1]:
                    raise PermanentStoreError(
                        f"{describe} leads to a connection pooler in transaction or statement mode: two connections "
                        f"open at once ran on one server session (pid {pids[0][0]}), and a store needs sessions of its own "
                        "(advisory locks, LISTEN, session settings, prepared statements); connect to PostgreSQL "
                        "directly, or through a pool in session mode (PgBouncer: pool_mode = session)")
        except psycopg.Error as exc:
            raise store_error(exc, dsn) from exc
        finally:
            second.close()
    finally:
        first.close()
    with _lock:
        _checked.add(dsn)


def _pid(conn: psycopg.Connection) -> tuple:
    """The server session ``conn`` runs on: its backend's pid, and its server's start time, which tells
    two servers' sessions apart (a connection string naming several hosts)."""
    row = conn.execute("SELECT pg_backend_pid(), pg_postmaster_start_time()").fetchone()
    assert row is not None  # the functions return one row
    return int(row[0]), row[1]

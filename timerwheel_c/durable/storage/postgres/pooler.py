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
connections, open at once, ever run on one server session (``pg_backend_pid()`` and the server's
start time), which no server and no session-mode pool allows, and refuses the store if they do. A
second connection that is refused for want of room (the role's or the server's limit), or that gets
no session within :data:`PROBE_WAIT_S` (a session pool that is full), leaves the store unchecked
rather than unopened, and is not asked again for :data:`RECHECK_S` (each open would wait again). A
pooler that gives the two connections different sessions every time it is
asked is not seen; the docs say to use session mode.
"""
from __future__ import annotations

import math
import queue
import threading
import time
from typing import Optional

import psycopg

from ..errors import PermanentStoreError, StoreError
from .results import store_error
from .session import open_session

__all__ = ["PROBES", "PROBE_WAIT_S", "RECHECK_S", "refuse_shared_sessions"]

PROBES = 3  # rounds of the two connections' session reads: a pooler that reuses its last session shows at once
PROBE_WAIT_S = 2.0  # how long the second connection's read may wait for a session before the check gives up
_TOO_MANY_CONNECTIONS = "53300"  # SQLSTATE too_many_connections: the role's or the server's limit
_TOO_MANY_WORDS = ("too many connections", "too many clients")  # its messages (role or database; server)
RECHECK_S = 60.0  # how long a check that could not tell is not made again for its connection string
_checked: set = set()  # connection strings whose sessions were found to be their own, in this process
_unchecked: dict = {}  # connection string -> time.monotonic() s its check last could not tell
_lock = threading.Lock()


def refuse_shared_sessions(dsn: str, describe: str) -> Optional[psycopg.Connection]:
    """Return if two connections to ``dsn`` open at once run on two server sessions, or if that cannot
    be told (see the module docstring); checked once per ``dsn`` in a process. ``describe`` names it
    (its password masked). Returns the check's first connection (as :func:`.session.open_session`
    opens one), the caller's to use and close, or None when no check ran: closing it and opening
    another raced its session's end, on a role allowed one connection ("too many connections").

    Raises:
        PermanentStoreError: they ran on one session: a pooler in transaction or statement mode.
        StoreError: the server cannot be reached, or refuses the DSN.
    """
    with _lock:
        if dsn in _checked or time.monotonic() - _unchecked.get(dsn, -math.inf) < RECHECK_S:
            return None
    first = open_session(dsn)
    try:
        if _sessions_are_own(dsn, describe, first):
            with _lock:
                _checked.add(dsn)
        else:
            with _lock:
                _unchecked[dsn] = time.monotonic()
    except BaseException:
        first.close()
        raise
    return first


def _sessions_are_own(dsn: str, describe: str, first: psycopg.Connection) -> bool:
    """The check of :func:`refuse_shared_sessions` on its open ``first`` connection: True when two
    connections ran on two sessions, False when that cannot be told.

    Raises:
        as :func:`refuse_shared_sessions`.
    """
    # The second connection lives on a daemon thread of its own, so that a read it cannot get a
    # session for (a full session pool queues it, for minutes) never holds the open up.
    asks: queue.SimpleQueue = queue.SimpleQueue()
    answers: queue.SimpleQueue = queue.SimpleQueue()
    second = threading.Thread(target=_second_session, args=(dsn, asks, answers), name="timerwheel-c-pooler-check",
                              daemon=True)
    second.start()
    answered = False  # the second connection answered every ask: it closes at once when told
    try:
        for _ in range(PROBES):
            try:
                mine = _session(first)
            except psycopg.Error as exc:
                raise store_error(exc, dsn) from exc
            asks.put(True)
            try:
                theirs = answers.get(timeout=PROBE_WAIT_S)
            except queue.Empty:
                return False  # no session for it within the wait
            if isinstance(theirs, StoreError):
                # Refused at connect time, libpq gives no SQLSTATE: the server's words tell it.
                if theirs.code == _TOO_MANY_CONNECTIONS or any(w in str(theirs) for w in _TOO_MANY_WORDS):
                    return False  # no room for a second connection, so none to share one
                raise theirs
            answered = True
            if mine == theirs:
                raise PermanentStoreError(
                    f"{describe} leads to a connection pooler in transaction or statement mode: two connections "
                    f"open at once ran on one server session (pid {mine[0]}), and a store needs sessions of its "
                    "own (advisory locks, LISTEN, session settings, prepared statements); connect to PostgreSQL "
                    "directly, or through a pool in session mode (PgBouncer: pool_mode = session)")
    finally:
        asks.put(None)  # the thread closes its connection and ends, once its read (if any) returns
        if answered:
            second.join(PROBE_WAIT_S)  # its session ended before the store's opens (a count of sessions sees one)
    return True


def _second_session(dsn: str, asks: queue.SimpleQueue, answers: queue.SimpleQueue) -> None:
    """The second connection of a check, on its own thread: answers each ask with its session (or the
    StoreError it met, and then ends) until asked None."""
    try:
        conn = open_session(dsn)
    except StoreError as exc:
        answers.put(exc)
        return
    try:
        while asks.get() is not None:
            try:
                answers.put(_session(conn))
            except psycopg.Error as exc:
                answers.put(store_error(exc, dsn))
                return
    finally:
        conn.close()


def _session(conn: psycopg.Connection) -> tuple:
    """The server session ``conn`` runs on: its backend's pid, and its server's start time, which tells
    two servers' sessions apart (a connection string naming several hosts)."""
    row = conn.execute("SELECT pg_backend_pid(), pg_postmaster_start_time()").fetchone()
    assert row is not None  # the functions return one row
    return int(row[0]), row[1]

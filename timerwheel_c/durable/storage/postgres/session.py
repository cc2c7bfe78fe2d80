"""How every connection of a PostgresStore is set up, its own and its asyncio pools' alike, whatever the
role's, the database's or the environment's defaults (``ALTER ROLE ... SET``, ``PGCLIENTENCODING``).

- UTF-8 on the wire (``client_encoding``), so that any partition name travels whatever the client's
  locale or environment.
- READ COMMITTED (``default_transaction_isolation``), the level the apply function's guards are
  judged at: each of its statements reads a snapshot taken after the partition's lock is held,
  where a REPEATABLE READ default would judge them on one taken before the wait, and a guarded
  write would commit on a value another writer had changed meanwhile. SERIALIZABLE would be
  correct too, but aborts under contention. A caller's own transaction (a joined write) is refused
  at REPEATABLE READ (:mod:`.joined`).
- No idle-session timeout (``idle_session_timeout``, PostgreSQL 14 and later): a runner's change
  signal and claims sessions wait idle between passes by design, and a database's timeout would end
  them every few minutes (a reconnect, a full pass and a WARNING each time), and fail an
  application's next write on its store once (a TransientStoreError).
"""
from __future__ import annotations

from typing import Any, Dict

import psycopg

from ..redact import redact, remember
from .results import store_error

__all__ = ["CONNECT_KWARGS", "SESSION_SETUP", "open_session"]

#: psycopg.connect() keyword arguments: they override the same parameters of the DSN.
CONNECT_KWARGS: Dict[str, Any] = {"autocommit": True, "client_encoding": "UTF8"}
#: The statement run on each new connection (one round trip; a server before 14 has no idle timeout).
SESSION_SETUP = ("SELECT set_config('default_transaction_isolation', 'read committed', false), "
                 "CASE WHEN current_setting('server_version_num')::int >= 140000 "
                 "THEN set_config('idle_session_timeout', '0', false) END")


def open_session(dsn: str) -> psycopg.Connection:
    """A new autocommit connection to ``dsn`` with :data:`CONNECT_KWARGS`, not yet set up.

    Raises:
        StoreError: the server cannot be reached (transient) or refuses the DSN (permanent); the
            message never holds the password.
    """
    try:
        conn = psycopg.connect(dsn, **CONNECT_KWARGS)
    except psycopg.Error as exc:
        error = store_error(exc, dsn)
        if redact(str(exc), dsn) != str(exc):
            # libpq quoted the connection string back, password included: do not chain it.
            raise error from None
        raise error from exc
    # The password libpq connected with, however it was given (the environment's PGPASSWORD, the
    # password file, PGSERVICE): masked wherever this process prints it, a handler's error included.
    remember(dsn, conn.info.password)
    return conn

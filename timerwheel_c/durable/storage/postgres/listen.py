"""The PostgreSQL change signal: a dedicated ``LISTEN`` connection that outlives server restarts.

Writers notify through a trigger on the store's table (``wake_trigger`` in
``postgres/sql/queries.sql``, see :mod:`timerwheel_c.durable.storage.postgres`): every insert or update of a key the timer layer declared calls
``pg_notify`` in the writing transaction, so the notification is delivered on commit
and never for a rolled-back write (https://www.postgresql.org/docs/current/sql-notify.html),
whichever client wrote the row.

A listener that silently stops after a restart is a known failure of LISTEN-based
workers, so :class:`PgListener` treats its connection as disposable:

- It waits for notifications in slices of ``_SLICE_S`` and, after ``_PROBE_S`` without one,
  runs ``SELECT 1`` so a half-open socket is found, not waited on forever.
- Once its ``LISTEN`` is in place it calls back once unconditionally: a write committed
  before that (while the first connection was being opened, or during an outage) sent a
  notification nobody received, so the runner must do a full pass.
- On any connection error (a restart, ``pg_terminate_backend``, a network drop) it
  reconnects with backoff (50 ms doubling to 5 s) and ``LISTEN``s again, calling back
  as above.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import psycopg
from psycopg import sql

from ..errors import StoreError
from ..printable import printable
from ..watch import Watcher, call_back

__all__ = ["PgListener"]

log = logging.getLogger("timerwheel_c.durable")

_SLICE_S = 0.1
_PROBE_S = 5.0
_RECONNECT_S = (0.05, 5.0)


class PgListener(Watcher):
    """``LISTEN`` on ``channel`` through its own autocommit connection, opened by ``connect()``
    (which raises :class:`StoreError` without quoting a password); ``callback()`` on each notification
    and after each reconnect (see the module docstring).

    Counters: ``reconnects`` (connections opened after a lost one). ``connected`` is an Event
    set while the ``LISTEN`` is in place (tests wait on it). The connection's
    ``application_name`` is ``timerwheel_c listen <channel>``, to find it in ``pg_stat_activity``.
    """

    def __init__(self, connect: Callable[[], psycopg.Connection], channel: str, callback: Callable[[], None]):
        self._connect = connect
        self.application_name = f"timerwheel_c listen {channel}"[:63]
        self._listen = sql.SQL("LISTEN {}").format(sql.Identifier(channel))
        self._callback = callback
        self._closing = threading.Event()
        self.connected = threading.Event()
        self.reconnects = 0
        self._thread = threading.Thread(target=self._loop, name="pg-listener", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        failures = 0
        while not self._closing.is_set():
            try:
                with self._connect() as conn:
                    conn.execute("SELECT set_config('application_name', %s, false)", (self.application_name,))
                    conn.execute(self._listen)
                    self.connected.set()
                    if failures:
                        self.reconnects += 1
                        log.warning("LISTEN connection restored after %d failed attempt(s); running a full pass", failures)
                    call_back(self._callback, self._closing)
                    failures = 0
                    self._serve(conn)
            except (psycopg.Error, StoreError) as exc:
                self.connected.clear()
                if self._closing.is_set():
                    return
                failures += 1
                delay_s = min(_RECONNECT_S[0] * 2 ** min(failures - 1, 16), _RECONNECT_S[1])
                why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                log.warning("LISTEN connection lost (%s); reconnecting in %.2f s", printable(why), delay_s)
                self._closing.wait(delay_s)
        self.connected.clear()

    def _serve(self, conn: psycopg.Connection) -> None:
        quiet_since = time.monotonic()
        while not self._closing.is_set():
            got = False
            for _ in conn.notifies(timeout=_SLICE_S, stop_after=1):
                got = True
            if got:
                quiet_since = time.monotonic()
                call_back(self._callback, self._closing)
            elif time.monotonic() - quiet_since >= _PROBE_S:
                conn.execute("SELECT 1")
                quiet_since = time.monotonic()

    def close(self) -> None:
        self._closing.set()

"""What the server's ``pg_stat_activity`` says of a fleet's runners, for the status page: read on a
connection of the store's own, with the store's driver, so that the page's layer imports none.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import psycopg

if TYPE_CHECKING:
    from .store import PostgresStore

__all__ = ["heartbeats"]


def heartbeats(store: "PostgresStore", backend_pids: list) -> dict:
    """``{backend pid: ms}`` since each of ``backend_pids``' connections (a runner's lock connection)
    ended its last statement, on the server's clock; a pid the store's role may not see, or every
    pid when the server cannot be reached, is left out (the page then shows no heartbeat)."""
    try:
        with store.new_connection() as conn:
            rows = conn.execute(
                "SELECT pid, (extract(epoch FROM clock_timestamp() - state_change) * 1000)::int8 "
                "FROM pg_stat_activity WHERE pid = ANY(%s)", (backend_pids,)).fetchall()
    except psycopg.Error:
        return {}
    return {pid: ms for pid, ms in rows if ms is not None}

"""``python stop_during_start.py RUN_ARGS...``: ``timerwheel-c run`` whose store stops answering right
after it opened: another session then holds an ACCESS EXCLUSIVE lock on the store's meta table,
which the service's start reads (as a frozen server or a peer's long migration would block it).
Prints ``meta locked`` on stderr once the lock is held."""
from __future__ import annotations

import sys

import psycopg

from timerwheel_c.cli import main
from timerwheel_c.durable.service import cli

_open = cli.open_or_say
_held = []


def _open_then_lock(command, url, **kwargs):
    store = _open(command, url, **kwargs)
    conn = psycopg.connect(url)  # a transaction left open: the lock stays until this process ends
    conn.execute(f"LOCK TABLE {store.table}_meta IN ACCESS EXCLUSIVE MODE")
    _held.append(conn)
    print("meta locked", file=sys.stderr, flush=True)
    return store


cli.open_or_say = _open_then_lock
sys.exit(main(sys.argv[1:]))

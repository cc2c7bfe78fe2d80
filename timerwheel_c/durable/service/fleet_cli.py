"""``timerwheel-c fleet status``: the live runners of a store and the state of each partition.

    timerwheel-c fleet status [--store URL] [--json]

Per partition (every partition that holds a row): its owner, its due backlog (rows due now and not
yet fired, counted up to 1000, so 1000 reads "at least 1000"), its oldest due time (a retrying
row's is that of its next attempt) and its parked timers (counted up to 1000).

What each backend can tell:

- PostgreSQL: the live fleet runners, from ``pg_locks``: each one's PostgreSQL backend pid (the
  owner column), the name it gives its connection (``timerwheel_c runner on HOST pid N #TOKEN``,
  with its OS process id and a token of its own), its address, since when it is a member, its kinds and its partitions (the
  partitions of a list it was given, or the shards it owns of a store it serves whole). A runner
  holds these locks on a connection of its own, so one killed disappears from the list when its
  connection closes (at once, or within about 10 s for a vanished host). A partition has one
  owner per group of runners with the same kinds (two during a rolling deploy that adds a kind),
  or none (``-``) while no live runner holds it. Runners pinned with ``run --partition`` form no
  fleet and take no locks: they are not listed. A role without ``pg_read_all_stats`` sees the name,
  address and start of other roles' connections as ``-``.
- SQLite: no runner is recorded in the file, so runners and owners are unknown; the partition
  figures are exact.

The table gives times in this machine's zone and how far they are from now. ``--json`` prints one
object: ``backend`` (``"postgresql"`` or ``"sqlite"``), ``now_ms``, ``runners`` (null on SQLite;
else objects with ``backend_pid``, ``name``, ``client_addr``, ``since``/``since_ms``, ``kinds``,
``partitions``, ``shards``), ``partitions_total`` and ``partitions`` (objects with ``partition``, ``owners`` (backend pids; null on
SQLite), ``due_backlog``, ``due_backlog_capped``, ``oldest_due_at``/``oldest_due_at_ms``,
``parked``, ``parked_capped``) and ``kind_names`` (the kinds' names the store records, by kind
number); times are ISO 8601 UTC and Unix epoch ms.

It only reads: no DDL (a PostgreSQL role with SELECT on the store's tables suffices), a database
without a store is refused ("no timerwheel_c store here"), and a SQLite file is opened read-only.

Exit status: 0; 2, with one line on stderr, on a store that cannot be opened or read.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from ..._helptext import terminal_text
from ..storage.errors import StoreError
from ..storage.redact import redact
from .cli import open_or_say, store_url
from .cli_text import first_line, in_words, local_iso, table
from .fleet import kinds_text, owned_text, status

_RUNNER_COLUMNS = ["backend_pid", "name", "client", "since", "kinds", "partitions"]
_PARTITION_COLUMNS = ["partition", "owner", "due_backlog", "oldest_due", "parked"]


def add_parser(sub) -> None:
    """Register the ``fleet`` subcommand (and its ``status``) on an argparse subparsers object."""
    p = sub.add_parser("fleet", help="the live runners and the state of each partition",
                       description=terminal_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="action", required=True)
    a = actions.add_parser("status", help="the live runners and the state of each partition",
                           description=terminal_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--store", default=None, metavar="URL",
                   help="sqlite:///PATH or postgresql://USER@HOST/DB (a password is masked in every message); "
                        "default: $TIMERWHEEL_C_STORE")
    a.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.set_defaults(func=main)


def _count(n: int, capped: bool) -> str:
    return f"{n}+" if capped else str(n)


def _tables(state: dict) -> str:
    now_ms = state["now_ms"]
    out = []
    if state["runners"] is None:
        out.append("runners: not recorded by a SQLite store")
    elif not state["runners"]:
        out.append("runners: none live")
    else:
        out.append(f"runners: {len(state['runners'])} live")
        out.append(table([{"backend_pid": r["backend_pid"], "name": r["name"] or "-", "client": r["client_addr"] or "-",
                           "since": "-" if r["since_ms"] is None else
                           f"{local_iso(r['since_ms'])} ({in_words(r['since_ms'], now_ms)})",
                           "kinds": kinds_text(r["kinds"]), "partitions": owned_text(r) if r["shards"] else len(r["partitions"])}
                          for r in state["runners"]], _RUNNER_COLUMNS))
    if state["kind_names"]:
        out.append("kinds: " + ", ".join(f"{k} {name}" for k, name in state["kind_names"].items()))
    out.append("")
    if not state["partitions"]:
        out.append("partitions: none (no partition holds a row)")
    else:
        out.append(table([{"partition": p["partition"],
                           "owner": "-" if not p["owners"] else ",".join(str(o) for o in p["owners"]),
                           "due_backlog": _count(p["due_backlog"], p["due_backlog_capped"]),
                           "oldest_due": "-" if p["oldest_due_at_ms"] is None else
                           f"{local_iso(p['oldest_due_at_ms'])} ({in_words(p['oldest_due_at_ms'], now_ms)})",
                           "parked": _count(p["parked"], p["parked_capped"])}
                          for p in state["partitions"]], _PARTITION_COLUMNS))
    return "\n".join(out)


def main(args) -> int:
    """Print the fleet's status; 0, or 2 on a store that cannot be opened or read (one line on stderr)."""
    command = f"fleet {args.action}"
    store = open_or_say(command, args.store, read_only=True)
    if store is None:
        return 2
    try:
        state = status(store, time.time_ns() // 1_000_000)
    except StoreError as exc:
        url = store_url(args.store, command)
        print(f"timerwheel-c {command}: store {redact(url)!r}: {first_line(exc, url)}", file=sys.stderr)
        return 2
    finally:
        store.close()
    print(json.dumps(state, indent=2) if args.json else _tables(state))
    return 0

"""``timerwheel-c schedules``: list, add, remove, pause and resume the recurring schedules of a store.

    timerwheel-c schedules list   --store URL [--partition P] [--json]
    timerwheel-c schedules add    --store URL --partition P NAME (--every SECONDS | --cron EXPR [--tz ZONE])
                                  --kind N [--value TEXT] [--misfire once|skip|all] [--grace SECONDS]
                                  [--catchup SECONDS] [--jitter SECONDS] [--paused | --resumed]
    timerwheel-c schedules remove --store URL --partition P NAME   (also pause, resume)

``list`` prints a table giving each schedule's next fire time in this machine's zone (ISO 8601 with
its offset, as ``timers list`` does), or with ``--json`` one JSON array of objects with
``partition``, ``name``, ``trigger``, ``kind``, ``next_fire``/``next_fire_ms``, ``paused``,
``last_fired``/``last_fired_ms``, ``misfire``, ``runs`` (the occurrences done) and ``ended`` (true once
its trigger has no occurrence left; ``next_fire`` is then null): times ISO 8601 UTC and Unix epoch ms. ``add`` replaces a schedule of the same name atomically. The
runners (``timerwheel-c run``) fire the occurrences; these commands only write the store.

Exit status: 0 on success; 1, with one line on stderr, when the named schedule does not exist; 2,
with one line on stderr naming the offending value, on a bad argument (a bad cron field, an unknown
zone, an interval <= 0, a kind outside 1..255) or a store that cannot be opened. No command makes a
store (``timerwheel-c run`` does): none runs DDL, and a database or SQLite path without a store is
refused ("no timerwheel_c store here"), as is ``sqlite:///:memory:``. ``list`` only reads (a PostgreSQL
role with SELECT on the store's tables suffices), and opens a SQLite file read-only.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings

from ..._helptext import terminal_text
from ..timers.schedules import (add_schedule, list_schedules, pause_schedule, remove_schedule,
                                resume_schedule)
from ..timers.keys import TimerKind
from ..timers.triggers import MISFIRE_POLICIES, Cron, Every, Trigger, check_misfire
from .cli import open_or_say
from .cli_text import in_words, local_iso, table, utc_iso

_COLUMNS = ["partition", "name", "trigger", "kind", "next_fire", "when", "paused", "misfire"]
_CHANGES = {"remove": remove_schedule, "pause": pause_schedule, "resume": resume_schedule}


def add_parser(sub) -> None:
    """Register the ``schedules`` subcommand (and its own subcommands) on an argparse subparsers object."""
    p = sub.add_parser("schedules", help="list, add, remove, pause or resume recurring schedules",
                       description=terminal_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="action", required=True)
    for action in ("list", "add", *_CHANGES):
        a = actions.add_parser(action, help=f"{action} schedules" if action == "list" else f"{action} a schedule",
                               description=terminal_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
        a.add_argument("--store", default=None, metavar="URL",
                       help="sqlite:///PATH or postgresql://USER@HOST/DB (a password is masked in every message); "
                            "default: $TIMERWHEEL_C_STORE")
        a.add_argument("--partition", required=action != "list", metavar="P",
                       help="the partition" + (" (default: every partition)" if action == "list" else ""))
        if action == "list":
            a.add_argument("--json", action="store_true", help="print one JSON array instead of a table")
            continue
        a.add_argument("name", help="the schedule's name")
        if action != "add":
            continue
        when = a.add_mutually_exclusive_group(required=True)
        when.add_argument("--every", type=float, metavar="SECONDS", help="fire every SECONDS (> 0, ms resolution)")
        when.add_argument("--cron", metavar="EXPR", help="fire on a 5-field cron expression, or @hourly/@daily/...")
        a.add_argument("--tz", metavar="ZONE", help="the IANA zone of --cron (default UTC; not with --every)")
        a.add_argument("--kind", required=True, type=int, metavar="N", help="the timer kind (1..255) of the handler")
        a.add_argument("--value", default="", metavar="TEXT", help="the value (UTF-8) each occurrence fires with")
        a.add_argument("--misfire", default="once", choices=MISFIRE_POLICIES, metavar="POLICY",
                       help=f"what missed occurrences do: {', '.join(MISFIRE_POLICIES)} (default once)")
        a.add_argument("--grace", type=float, default=60.0, metavar="SECONDS", help="misfire_grace_s (default 60)")
        a.add_argument("--catchup", type=float, default=None, metavar="SECONDS",
                       help="catchup_window_s, required with --misfire all")
        a.add_argument("--jitter", type=float, default=0.0, metavar="SECONDS",
                       help="each occurrence fires up to SECONDS after its nominal time (default 0)")
        pause = a.add_mutually_exclusive_group()
        pause.add_argument("--paused", dest="paused", action="store_const", const=True, default=None,
                           help="add it paused (default: a schedule added again keeps its pause)")
        pause.add_argument("--resumed", dest="paused", action="store_const", const=False,
                           help="add it unpaused, resuming it if it was paused")
    p.set_defaults(func=main)


def _row(info, now_ms: int) -> dict:
    """``info`` as a table row: times in this machine's zone (``-`` past the year 9999), and how far the
    next fire is from ``now_ms`` (Unix epoch ms) in words, as ``timers list`` gives its due times."""
    return {"partition": info.partition, "name": info.name, "trigger": str(info.trigger), "kind": int(info.kind),
            "next_fire": "ended" if info.ended else local_iso(info.next_fire_ms),
            "when": "-" if info.ended else in_words(info.next_fire_ms, now_ms), "paused": info.paused,
            "misfire": info.misfire}


def _as_json(info) -> dict:
    """``info`` as the JSON object ``list --json`` prints: times ISO 8601 UTC (null when absent, or past
    the year 9999) and Unix epoch ms."""
    return {"partition": info.partition, "name": info.name, "trigger": str(info.trigger), "kind": int(info.kind),
            "next_fire": None if info.next_fire_ms is None else utc_iso(info.next_fire_ms),
            "next_fire_ms": info.next_fire_ms, "paused": info.paused,
            "last_fired": None if info.last_fired_ms is None else utc_iso(info.last_fired_ms),
            "last_fired_ms": info.last_fired_ms, "misfire": info.misfire, "runs": info.runs, "ended": info.ended}


_OPTIONS = {"catchup_window_s": "--catchup", "misfire_grace_s": "--grace", "jitter_s": "--jitter"}


def main(args) -> int:
    """Run one ``schedules`` action; 0 on success, 1 when the named schedule does not exist, 2 on a bad
    argument or a store that cannot be opened (one line on stderr)."""
    command = f"schedules {args.action}"
    if args.partition == "":
        print(f"timerwheel-c {command}: --partition must be a non-empty name, got ''", file=sys.stderr)
        return 2
    trigger: Trigger = Every(1)  # replaced by the real one for "add"
    try:
        if args.action == "add":  # checked before the store is opened: a bad one leaves no new file
            if args.every is not None and args.tz is not None:
                raise ValueError(f"--tz applies to --cron only, got --tz {args.tz!r} with --every: an interval "
                                 "counts seconds of real time, in no zone")
            with warnings.catch_warnings(record=True) as caught:  # a warning is one line of ours, no source path
                warnings.simplefilter("always")
                trigger = (Every(args.every, jitter_s=args.jitter) if args.every is not None
                           else Cron(args.cron, "UTC" if args.tz is None else args.tz, jitter_s=args.jitter))
            for warning in caught:
                print(f"timerwheel-c {command}: warning: {warning.message}", file=sys.stderr)
            TimerKind(args.kind)
            check_misfire(args.misfire, args.grace, args.catchup)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        for name, option in _OPTIONS.items():  # the options typed, not the Python parameters they set
            message = message.replace(name, option)
        print(f"timerwheel-c {command}: {message}", file=sys.stderr)
        return 2
    store = open_or_say(command, args.store, read_only=args.action == "list")
    if store is None:
        return 2
    try:
        if args.action == "list":
            infos = list_schedules(store, args.partition)
            now_ms = time.time_ns() // 1_000_000
            print(json.dumps([_as_json(i) for i in infos], indent=2) if args.json
                  else table([_row(i, now_ms) for i in infos], _COLUMNS))
        elif args.action == "add":
            info = add_schedule(store, args.partition, args.name, trigger, args.kind,
                                args.value.encode("utf-8", "surrogateescape"),  # argv bytes as typed, UTF-8 or not
                                misfire=args.misfire, misfire_grace_s=args.grace, catchup_window_s=args.catchup,
                                paused=args.paused)
            print(f"added {info.name!r}: {info.trigger}, "
                  + ("paused" if info.paused else f"next fire {local_iso(info.next_fire_ms)}"))
        elif not _CHANGES[args.action](store, args.partition, args.name):
            print(f"timerwheel-c {command}: partition {args.partition!r} has no schedule named {args.name!r}",
                  file=sys.stderr)
            return 1
        else:
            print(f"{args.action}d {args.name!r}")  # removed, paused, resumed
    except (TypeError, ValueError) as exc:
        print(f"timerwheel-c {command}: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
    return 0

"""``timerwheel-c schedules``: list, add, remove, pause and resume the recurring schedules of a store.

    timerwheel-c schedules list   --store URL [--partition P] [--json]
    timerwheel-c schedules add    --store URL --partition P NAME (--every SECONDS | --cron EXPR [--tz ZONE])
                                  --kind N [--value TEXT] [--misfire once|skip|all] [--grace SECONDS]
                                  [--catchup SECONDS] [--jitter SECONDS]
    timerwheel-c schedules remove --store URL --partition P NAME   (also pause, resume)

``list`` prints a table, or with ``--json`` one JSON array, giving each schedule's next fire time in
its own zone (UTC for ``--every``). ``add`` replaces a schedule of the same name atomically. The
runners (``timerwheel-c run``) fire the occurrences; these commands only write the store.

Exit status: 0 on success; 2, with one line on stderr naming the offending value, on a bad argument
(a bad cron field, an unknown zone, an interval <= 0, a kind outside 1..255, a schedule that does
not exist) or a store that cannot be opened.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys

from ..._helptext import terminal_text
from ..timers.schedules import (add_schedule, list_schedules, pause_schedule, remove_schedule,
                                resume_schedule)
from ..timers.keys import TimerKind
from ..timers.triggers import MISFIRE_POLICIES, Cron, Every, Trigger, check_misfire
from .cli import open_or_say
from .cli_text import table

_COLUMNS = ["partition", "name", "trigger", "kind", "next_fire", "paused", "misfire"]
_CHANGES = {"remove": remove_schedule, "pause": pause_schedule, "resume": resume_schedule}


def add_parser(sub) -> None:
    """Register the ``schedules`` subcommand (and its own subcommands) on an argparse subparsers object."""
    p = sub.add_parser("schedules", help="list, add, remove, pause or resume recurring schedules",
                       description=terminal_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="action", required=True)
    for action in ("list", "add", *_CHANGES):
        a = actions.add_parser(action, help=f"{action} schedules" if action == "list" else f"{action} a schedule")
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
        a.add_argument("--tz", default="UTC", metavar="ZONE", help="the IANA zone of --cron (default UTC)")
        a.add_argument("--kind", required=True, type=int, metavar="N", help="the timer kind (1..255) of the handler")
        a.add_argument("--value", default="", metavar="TEXT", help="the value (UTF-8) each occurrence fires with")
        a.add_argument("--misfire", default="once", choices=MISFIRE_POLICIES, metavar="POLICY",
                       help=f"what missed occurrences do: {', '.join(MISFIRE_POLICIES)} (default once)")
        a.add_argument("--grace", type=float, default=60.0, metavar="SECONDS", help="misfire_grace_s (default 60)")
        a.add_argument("--catchup", type=float, default=None, metavar="SECONDS",
                       help="catchup_window_s, required with --misfire all")
        a.add_argument("--jitter", type=float, default=0.0, metavar="SECONDS",
                       help="each occurrence fires up to SECONDS after its nominal time (default 0)")
    p.set_defaults(func=main)


def _local(ms, trigger) -> str:
    if ms is None:
        return "-"
    zone = trigger.tz if isinstance(trigger, Cron) else dt.timezone.utc
    try:
        return dt.datetime.fromtimestamp(ms / 1000, zone).strftime("%Y-%m-%d %H:%M:%S %Z")
    except (OverflowError, OSError, ValueError):  # beyond year 9999: an interval may be up to timedelta.max
        return "-"


def _row(info) -> dict:
    return {"partition": info.partition, "name": info.name, "trigger": str(info.trigger), "kind": int(info.kind),
            "next_fire": "ended" if info.ended else _local(info.next_fire_ms, info.trigger),
            "next_fire_ms": info.next_fire_ms, "paused": info.paused, "last_fired_ms": info.last_fired_ms,
            "misfire": info.misfire, "runs": info.runs, "ended": info.ended}


def main(args) -> int:
    """Run one ``schedules`` action; 0 on success, 2 on a bad argument (one line on stderr)."""
    command = f"schedules {args.action}"
    if args.partition == "":
        print(f"timerwheel-c {command}: --partition must be a non-empty name, got ''", file=sys.stderr)
        return 2
    trigger: Trigger = Every(1)  # replaced by the real one for "add"
    try:
        if args.action == "add":  # checked before the store is opened: a bad one leaves no new file
            trigger = (Every(args.every, jitter_s=args.jitter) if args.every is not None
                       else Cron(args.cron, args.tz, jitter_s=args.jitter))
            TimerKind(args.kind)
            check_misfire(args.misfire, args.grace, args.catchup)
    except (TypeError, ValueError) as exc:
        print(f"timerwheel-c {command}: {exc}", file=sys.stderr)
        return 2
    store = open_or_say(command, args.store)
    if store is None:
        return 2
    try:
        if args.action == "list":
            rows = [_row(i) for i in list_schedules(store, args.partition)]
            print(json.dumps(rows, indent=2) if args.json else table(rows, _COLUMNS))
        elif args.action == "add":
            info = add_schedule(store, args.partition, args.name, trigger, args.kind, args.value.encode(),
                                misfire=args.misfire, misfire_grace_s=args.grace, catchup_window_s=args.catchup)
            print(f"added {info.name!r}: {info.trigger}, next fire {_local(info.next_fire_ms, info.trigger)}")
        elif not _CHANGES[args.action](store, args.partition, args.name):
            print(f"timerwheel-c {command}: partition {args.partition!r} has no schedule named {args.name!r}",
                  file=sys.stderr)
            return 2
        else:
            print(f"{args.action}d {args.name!r}")  # removed, paused, resumed
    except (TypeError, ValueError) as exc:
        print(f"timerwheel-c {command}: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
    return 0

"""``timerwheel-c timers``: see and steer the pending timers of a store.

    timerwheel-c timers list     [--store URL] [--partition P] [--kind N] [--state S] [--limit N] [--json]
    timerwheel-c timers show     [--store URL] --partition P --kind N (--reference R | --reference-hex HEX) [--json]
    timerwheel-c timers cancel   [--store URL] --partition P --kind N (--reference R | --reference-hex HEX)
    timerwheel-c timers requeue  [--store URL] --partition P --kind N (--reference R | --reference-hex HEX)
                                 [--due-at ISO | --in SECONDS]
    timerwheel-c timers fire-now [--store URL] --partition P --kind N (--reference R | --reference-hex HEX)

A timer is named by its partition, its kind (a number 1..255: the store keeps numbers, not the
names a registry gives them) and its reference: ``--reference`` as UTF-8 text, ``--reference-hex``
for a binary one (``--reference-hex 00ff10``).

States: ``scheduled`` (waiting for its due time), ``retrying`` (an attempt failed or runs now; its
due time is that of its next attempt) and ``parked`` (its last allowed attempt failed: it stays,
never retried, until an operator requeues or cancels it).

``list`` prints the pending timers in the order they fire next, then the parked ones in the order
they were parked, of every partition unless
``--partition`` names one, at most ``--limit`` (default 100; a line on stderr says when more were
left out). The table gives due times in this machine's zone and how far they are from now.
``--json`` prints one JSON array instead: each timer an object with ``partition``, ``kind``,
``kind_name`` (the name the store records for the kind, or null; tables show it after the number),
``reference`` (the text, or null when it is not printable UTF-8), ``reference_hex``, ``due_at``
(ISO 8601, UTC), ``due_at_ms`` (Unix epoch ms; a parked timer's original due time), ``state``,
``attempt``, ``last_error`` and ``parked_at``/``parked_at_ms`` (null unless parked) and
``value_size`` (bytes). ``show`` prints one timer, all of it: with ``--json``, that object
plus ``value`` (text or null) and ``value_hex``.

``cancel`` removes the timer, whatever its state. ``requeue`` puts a parked or retrying timer
back to scheduled with its attempts reset, due now, at ``--due-at`` (ISO 8601 as ``datetime.fromisoformat``
reads it, and ``Z``: before Python 3.11 only the extended form ``isoformat()`` writes; without a zone,
this machine's) or ``--in SECONDS`` from now (rounded up to the ms); it leaves a scheduled timer as it is (exit 1):
``fire-now`` is the command that moves a healthy timer. ``fire-now`` makes the timer due now
with its attempts reset, whatever its state. A runner serving the partition fires it on its next
pass (at once when the store signals the write).

A recurring schedule's pending occurrence is listed under the schedule's name, but it is no timer
of its own: the actions on one timer do not reach it (exit 1, naming the schedule), and
``timerwheel-c schedules pause|resume|remove`` steer it.

Exit status: 0 on success; 1, with one line on stderr, when no pending timer has that name (or
``requeue`` finds it scheduled); 2, with one line on stderr naming the offending value, on a bad
argument or a store that cannot be opened or read. None of these commands makes a store (``timerwheel-c
run`` does): none runs DDL or creates a SQLite file, a database without a store is refused ("no
timerwheel_c store here", exit 2), and so is ``sqlite:///:memory:``.

``list`` and ``show`` only read: they run no DDL (a PostgreSQL role with SELECT on the store's
tables suffices), refuse a database without a store ("no timerwheel_c store here", exit 2), and
open a SQLite file read-only, so a file this user may not write can be read.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
import time
from typing import Optional

from ..._helptext import terminal_text
from ..storage.errors import StoreError
from ..storage.redact import redact
from ..timers.due import due_at_ms_of, span_ms
from ..timers.keys import TimerKind
from ..timers.kind_names import kind_names
from ..timers.schedules import get_schedule
from ..timers.writer import STATES, PendingTimer, cancel, get_timer, list_timers, requeue
from .cli import open_or_say, store_url
from .cli_text import first_line, in_words, local_iso, printable, reference_text, shell_word, table, utc_iso

DEFAULT_LIMIT = 100
_NAMED = ("show", "cancel", "requeue", "fire-now")  # the actions on one timer, named by its identity
_COLUMNS = ["partition", "kind", "reference", "state", "attempt", "due", "when", "last_error"]
_SHOWN_CHARS = 48  # a reference or an error longer than this is cut in a table (--json has it all)


class NoSuchTimer(LookupError):
    """The named timer is not pending (or not in a state the action acts on): exit status 1."""


def add_parser(sub) -> None:
    """Register the ``timers`` subcommand (and its own subcommands) on an argparse subparsers object."""
    p = sub.add_parser("timers", help="list, show, cancel, requeue or fire pending timers now",
                       description=terminal_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="action", required=True)
    helps = {"list": "list pending timers", "show": "show one timer", "cancel": "cancel one timer",
             "requeue": "put a parked or retrying timer back to scheduled", "fire-now": "make one timer due now"}
    for action, text in helps.items():
        a = actions.add_parser(action, help=text, description=terminal_text(__doc__),
                               formatter_class=argparse.RawDescriptionHelpFormatter)
        a.add_argument("--store", default=None, metavar="URL",
                       help="sqlite:///PATH or postgresql://USER@HOST/DB (a password is masked in every message); "
                            "default: $TIMERWHEEL_C_STORE")
        a.add_argument("--partition", required=action in _NAMED, metavar="P",
                       help="the partition" + ("" if action in _NAMED else " (default: every partition)"))
        a.add_argument("--kind", required=action in _NAMED, type=_kind, metavar="N",
                       help="the timer kind, 1..255" + ("" if action in _NAMED else " (default: every kind)"))
        if action == "list":
            a.add_argument("--state", choices=STATES, metavar="S", help=f"only timers in this state: {', '.join(STATES)}")
            a.add_argument("--limit", type=_limit, default=DEFAULT_LIMIT, metavar="N",
                           help=f"print at most N timers (default {DEFAULT_LIMIT})")
        else:
            ref = a.add_mutually_exclusive_group(required=True)
            ref.add_argument("--reference", metavar="R", help="the timer's reference, as UTF-8 text")
            ref.add_argument("--reference-hex", metavar="HEX", help="the timer's reference as hex digits (binary)")
        if action == "requeue":
            when = a.add_mutually_exclusive_group()
            when.add_argument("--due-at", type=_iso_ms, metavar="ISO",
                              help="due at this ISO 8601 time, as this Python's datetime.fromisoformat reads it, "
                                   "and Z (before Python 3.11 only the extended form isoformat() writes, such as "
                                   "2026-12-01T18:30:00.500+01:00; without a zone: this machine's, a time in a "
                                   "daylight-saving gap read on the offset before it); default now")
            when.add_argument("--in", type=_seconds, dest="in_s", metavar="SECONDS", help="due SECONDS from now (rounded up to the ms)")
        if action in ("list", "show"):
            a.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=main)


def _kind(text: str) -> int:
    try:
        return int(TimerKind(int(text)))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a timer kind number 1..255, got {text!r}") from None


def _limit(text: str) -> int:
    # str.isdigit() alone lets through digits int() refuses ("\u00b2"), which argparse would report
    # without saying what it wants
    if not text.isdigit() or not text.isascii() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}")
    return int(text)


# The last time --due-at can name (datetime's year 9999), as Unix epoch seconds: --in reaches no further,
# so that a time it gives is one the tables can show (and 1e300 is refused here, naming --in).
_LATEST_S = (dt.datetime.max.replace(tzinfo=dt.timezone.utc) - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) \
    .total_seconds()


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    most = math.floor(_LATEST_S - time.time())
    if not (math.isfinite(seconds) and 0 <= seconds <= most):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds from 0 to {most} "
                                         f"(to the year 9999), got {text!r}")
    return seconds


def _iso_ms(text: str) -> int:
    """ISO 8601 (a trailing ``Z`` allowed; a time without a zone is local) as Unix epoch ms."""
    try:
        when = dt.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an ISO 8601 time such as 2026-12-01T18:30:00+01:00, "
                                         f"got {text!r}") from None
    try:
        if when.tzinfo is None:
            # This machine's local time, read as datetime.timestamp() reads it (PEP 495, fold 0): a time
            # in a spring-forward gap counts on the offset before the gap, so it lands after the gap,
            # where astimezone() put it an hour before. Whole seconds, then the us: exact, no float sum.
            whole_s = when.replace(microsecond=0).timestamp()
            when = dt.datetime.fromtimestamp(whole_s, dt.timezone.utc).replace(microsecond=when.microsecond)
    except (OverflowError, OSError, ValueError):  # a time before the platform's local time zones
        raise argparse.ArgumentTypeError(f"must be an ISO 8601 time this machine can place in its time zone, "
                                         f"got {text!r}") from None
    try:
        # Exact: timestamp() * 1000 is a float product, 1 ms short for some times (2038-09-14T18:20:04.523Z)
        return due_at_ms_of(when, "--due-at")
    except ValueError:  # before 1970
        raise argparse.ArgumentTypeError(f"must be a time from 1970-01-01 UTC on, got {text!r}") from None


def _reference(args) -> bytes:
    if args.reference_hex is not None:
        try:
            return bytes.fromhex(args.reference_hex)
        except ValueError:
            raise ValueError(f"--reference-hex must be pairs of hex digits, got {args.reference_hex!r}") from None
    # surrogateescape: argv bytes that are not UTF-8 reach the store as they were typed
    return args.reference.encode("utf-8", "surrogateescape")


def _kind_text(timer: PendingTimer, names: dict) -> str:
    """The kind as tables show it: its number, then the name the store records for it, if any."""
    name = names.get(int(timer.kind))
    return str(int(timer.kind)) if name is None else f"{int(timer.kind)} {name}"


def as_json(timer: PendingTimer, *, value: bool = False, names: Optional[dict] = None) -> dict:
    """``timer`` as the JSON object ``list --json`` prints (``value``: with ``value`` and ``value_hex``;
    ``names``: the kind names the store records, :func:`~..timers.kind_names.kind_names`)."""
    out = {"partition": timer.partition, "kind": int(timer.kind), "kind_name": (names or {}).get(int(timer.kind)),
           "reference": reference_text(timer.reference),
           "reference_hex": timer.reference.hex(), "due_at": utc_iso(timer.due_at_ms), "due_at_ms": timer.due_at_ms,
           "state": timer.state, "attempt": timer.attempt, "last_error": timer.last_error,
           "parked_at": None if timer.parked_at_ms is None else utc_iso(timer.parked_at_ms),
           "parked_at_ms": timer.parked_at_ms, "value_size": len(timer.value), "schedule": timer.schedule}
    if value:
        out.update(value=reference_text(timer.value), value_hex=timer.value.hex())
    return out


def _cut(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS - 1] + "…"


def _shown_reference(reference: bytes) -> str:
    text = reference_text(reference)
    return _cut(text) if text is not None else _cut("hex:" + reference.hex())


def _row(timer: PendingTimer, now_ms: int, names: dict) -> dict:
    error = timer.last_error
    # A schedule's occurrence is named as one: its reference is the schedule's name, which a
    # one-off timer may share (two rows that would otherwise read alike).
    shown = _shown_reference(timer.reference)
    return {"partition": timer.partition, "kind": _kind_text(timer, names),
            "reference": f"schedule {shown}" if timer.schedule else shown,
            "state": timer.state, "attempt": timer.attempt, "due": local_iso(timer.due_at_ms),
            "when": in_words(timer.due_at_ms, now_ms), "last_error": "-" if error is None else _cut(" ".join(error.split()))}


def _show(timer: PendingTimer, now_ms: int, names: dict) -> str:
    text = reference_text(timer.reference)
    value = reference_text(timer.value)
    fields = [("partition", timer.partition), ("kind", _kind_text(timer, names)),
              ("reference", "(not printable UTF-8 text)" if text is None else text), ("reference hex", timer.reference.hex()),
              ("state", timer.state), ("attempt", timer.attempt),
              ("due at", f"{local_iso(timer.due_at_ms)} ({in_words(timer.due_at_ms, now_ms)}; "
                         f"{timer.due_at_ms} ms since the epoch)"),
              ("parked at", "-" if timer.parked_at_ms is None else
               f"{local_iso(timer.parked_at_ms)} ({in_words(timer.parked_at_ms, now_ms)})"),
              ("last error", timer.last_error or "-"),
              ("value", f"{len(timer.value)} byte{'' if len(timer.value) == 1 else 's'}" + (f": {value}" if value else "")),
              ("value hex", timer.value.hex() or "-")]
    width = max(len(name) for name, _ in fields)
    return "\n".join(f"{name.ljust(width)}  {printable(str(shown))}" for name, shown in fields)


def _list(store, args, now_ms: int) -> int:
    # limit + 1: one more than is printed says whether any were left out. Every partition (no
    # --partition) is read by shard, as a runner reads them: never one read per partition.
    timers = list_timers(store, args.partition, kind=args.kind, state=args.state, limit=args.limit + 1)
    shown = timers[:args.limit]
    if args.json:
        print(json.dumps([as_json(t, names=kind_names(store)) for t in shown], indent=2))
    elif shown:
        names = kind_names(store)
        print(table([_row(t, now_ms, names) for t in shown], _COLUMNS))
    else:
        print("no pending timers" + ("" if args.state is None else f" in state {args.state!r}"))
    if len(timers) > args.limit:
        print(f"timerwheel-c timers list: showing the first {args.limit} timers; more are pending "
              "(raise --limit, or narrow with --partition, --kind or --state)", file=sys.stderr)
    return 0


def _named(store, args, now_ms: int) -> str:
    """Run a named action; what to print on success. Raises NoSuchTimer when there is nothing to act on."""
    reference = _reference(args)
    name = f"partition {args.partition!r} kind {args.kind} reference {_shown_reference(reference)!r}"
    timer = get_timer(store, args.partition, args.kind, reference)
    if timer is None:
        raise NoSuchTimer(f"no pending timer in {name}{_occurrence_hint(store, args, reference)}")
    if args.action == "show":
        names = kind_names(store)
        return json.dumps(as_json(timer, value=True, names=names), indent=2) if args.json else _show(timer, now_ms,
                                                                                                       names)
    if args.action == "cancel":
        if not cancel(store, args.partition, args.kind, reference):
            raise NoSuchTimer(f"no pending timer in {name} (it fired or was removed meanwhile)")
        return f"cancelled the {timer.state} timer of {name}"
    if args.action == "requeue":
        if timer.state == "scheduled":
            raise NoSuchTimer(f"the timer of {name} is scheduled, not parked or retrying; "
                              "fire-now makes a scheduled timer due now")
        # Rounded up, as delay= is: a due time never comes before the seconds asked for have passed.
        due_ms = args.due_at if args.due_at is not None else now_ms + span_ms(args.in_s or 0)
    else:  # fire-now
        due_ms = now_ms
    if not requeue(store, args.partition, due_ms, args.kind, reference):
        raise NoSuchTimer(f"no pending timer in {name} (it fired or was removed meanwhile)")
    return f"{'requeued' if args.action == 'requeue' else 'fired now'}: the timer of {name}, " \
           f"due {local_iso(due_ms)} ({in_words(due_ms, now_ms)})"


def _occurrence_hint(store, args, reference: bytes) -> str:
    """What to add to "no pending timer" when the name is a schedule's: ``list`` shows a schedule's
    pending occurrence under the schedule's name, but it is no timer of its own, so the by-name
    actions do not reach it; the ``schedules`` commands do."""
    try:
        schedule_name = reference.decode("utf-8")
        info = get_schedule(store, args.partition, schedule_name)
    except (UnicodeDecodeError, TypeError, ValueError):  # not a valid schedule name: no schedule of that name
        return ""
    if info is None or int(info.kind) != args.kind:
        return ""
    return (f"; it is an occurrence of schedule {schedule_name!r}, steered with timerwheel-c schedules "
            f"pause|resume|remove --partition {shell_word(args.partition)} {shell_word(schedule_name)}")


def main(args) -> int:
    """Run one ``timers`` action; 0 on success, 1 when the named timer is not pending, 2 on a bad
    argument or a store that cannot be opened or read (one line on stderr; see the module docstring)."""
    command = f"timers {args.action}"
    if args.partition == "":
        print(f"timerwheel-c {command}: --partition must be a non-empty name, got ''", file=sys.stderr)
        return 2
    if args.action != "list":
        try:
            _reference(args)  # checked before the store is opened
        except ValueError as exc:
            print(f"timerwheel-c {command}: {exc}", file=sys.stderr)
            return 2
    store = open_or_say(command, args.store, read_only=args.action in ("list", "show"))
    if store is None:
        return 2
    now_ms = time.time_ns() // 1_000_000
    try:
        if args.action == "list":
            return _list(store, args, now_ms)
        print(_named(store, args, now_ms))
        return 0
    except NoSuchTimer as exc:
        print(f"timerwheel-c {command}: {exc.args[0]}", file=sys.stderr)
        return 1
    except (TypeError, ValueError, StoreError) as exc:
        url = store_url(args.store, command)
        where = f"store {redact(url)!r}: " if isinstance(exc, StoreError) else ""
        print(f"timerwheel-c {command}: {where}{first_line(exc, url)}", file=sys.stderr)
        return 2
    finally:
        store.close()

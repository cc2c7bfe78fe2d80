"""The operator commands, ``timerwheel-c timers list|show|cancel|requeue|fire-now`` and ``timerwheel-c
fleet status``, run in-process (tests/cli_run.py; the tests where a pipe's reader or a runner must be
a real process are in tests/e2e/test_durable_timers_cli_processes.py) against a SQLite file and the
shared PostgreSQL server (a schema of the test's own): tables for a terminal, ``--json`` that parses,
the store from ``TIMERWHEEL_C_STORE``, binary references by hex, and every bad argument or store as one line on stderr with exit 2 (exit 1
for a timer that is not pending). Time assertions compare with the wall clock read around each
command, with minutes of slack, so a loaded machine cannot make them flake."""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import subprocess

import pytest

from timerwheel_c.durable import Retry, TimerHandler, TimerKind, TimerRegistry, get_timer, open_store, run_due, schedule
from timerwheel_c.durable.service.cli_text import in_words
from cli_run import run_cli
from waiting import wall_ms

TIMEOUT_S = 60.0
KIND = 7
MIN_MS = 60_000
HOUR_MS = 3_600_000
EFFECT_KIND = 0xF3  # tests/durable_handlers.py


def cli(*args: str, store_env: str | None = None) -> subprocess.CompletedProcess:
    """``timerwheel-c ARGS`` in this process (tests/cli_run.py), with ``$TIMERWHEEL_C_STORE`` set to
    ``store_env`` or unset."""
    return run_cli(*args, env={"TIMERWHEEL_C_STORE": store_env})


def one_line_error(out: subprocess.CompletedProcess, status: int, *needles: str) -> str:
    assert out.returncode == status, (out.returncode, out.stdout, out.stderr)
    err = out.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.fixture
def url(store_url):
    """The URL of an empty store on each backend (conftest's ``store_url``)."""
    return store_url


class Failing(TimerHandler):
    kind = TimerKind(KIND)

    def fire(self, ctx, timer):
        return Retry()


def retrying(store, partition: str, reference: bytes, due_ms: int) -> None:
    """A pending timer whose first attempt failed (its next attempt is after a backoff)."""
    schedule(store, partition, due_ms, KIND, reference)
    assert run_due(store, partition, TimerRegistry().register(Failing()), due_ms).failed == 1


@pytest.fixture
def timers(url):
    """Four pending timers: p1 'order-1' in 3 min and kind 8 'later' in a day, p2 a binary reference
    2 h overdue, and p3 'flaky' retrying. Returns the wall ms they were written at."""
    now = wall_ms()
    with open_store(url) as store:
        schedule(store, "p1", now + 3 * MIN_MS, KIND, b"order-1", b"value-1")
        schedule(store, "p1", now + 24 * HOUR_MS, 8, b"later")
        schedule(store, "p2", now - 2 * HOUR_MS, KIND, b"\xff\x00bin", b"\x01\x02")
        retrying(store, "p3", b"flaky", now - MIN_MS)
    return now


def test_list_prints_every_partition_in_due_order_as_a_table_and_as_json(url, timers, tmp_path):
    """Every pending timer, of all partitions, in due order; the table in words, the JSON with both forms."""
    out = cli("timers", "list", "--json", "--store", url)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["partition"], r["reference_hex"]) for r in rows] == [
        ("p2", b"\xff\x00bin".hex()), ("p3", b"flaky".hex()), ("p1", b"order-1".hex()), ("p1", b"later".hex())]
    binary, flaky, order, later = rows
    assert binary["reference"] is None and binary["kind"] == KIND and binary["value_size"] == 2
    assert binary["due_at_ms"] == timers - 2 * HOUR_MS and binary["due_at"].endswith("Z")
    assert (flaky["state"], flaky["attempt"]) == ("retrying", 1) and flaky["last_error"].startswith("Retry:")
    assert (order["reference"], order["state"], order["attempt"]) == ("order-1", "scheduled", 0)
    assert later["kind"] == 8

    table = cli("timers", "list", "--store", url).stdout.splitlines()
    assert table[0].split()[:4] == ["PARTITION", "KIND", "REFERENCE", "STATE"] and len(table) == 5
    assert "hex:" + b"\xff\x00bin".hex() in table[1] and "2 h ago" in table[1]
    assert "order-1" in table[3] and ("in 2 min" in table[3] or "in 3 min" in table[3])


def test_list_filters_by_partition_kind_and_state_and_says_when_it_is_cut(url, timers, tmp_path):
    def listed(*args):
        out = cli("timers", "list", "--json", "--store", url, *args)
        assert out.returncode == 0, out.stderr
        return [bytes.fromhex(r["reference_hex"]) for r in json.loads(out.stdout)], out.stderr

    assert listed("--partition", "p1") == ([b"order-1", b"later"], "")
    assert listed("--kind", "8") == ([b"later"], "")
    assert listed("--state", "retrying") == ([b"flaky"], "")
    assert listed("--partition", "nowhere") == ([], "")
    refs, err = listed("--limit", "2")
    assert refs == [b"\xff\x00bin", b"flaky"] and "first 2" in err and "--limit" in err


def test_show_finds_a_binary_reference_by_hex_and_a_missing_timer_is_exit_1(url, timers, tmp_path):
    out = cli("timers", "show", "--json", "--store", url, "--partition", "p2", "--kind", str(KIND),
              "--reference-hex", b"\xff\x00bin".hex())
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert shown["reference"] is None and (shown["value"], shown["value_hex"]) == (None, "0102")
    text = cli("timers", "show", "--store", url, "--partition", "p1", "--kind", str(KIND),
               "--reference", "order-1").stdout
    assert "order-1" in text and "value-1" in text and "scheduled" in text
    missing = cli("timers", "show", "--store", url, "--partition", "p1", "--kind", str(KIND),
                  "--reference", "ghost")
    one_line_error(missing, 1, "'ghost'", "no pending timer")


def test_cancel_removes_the_timer_in_any_state_once(url, timers, tmp_path):
    for partition, ref in (("p1", "order-1"), ("p3", "flaky")):
        args = ("timers", "cancel", "--store", url, "--partition", partition, "--kind", str(KIND), "--reference", ref)
        out = cli(*args)
        assert out.returncode == 0 and "cancelled" in out.stdout, out.stderr
        one_line_error(cli(*args), 1, repr(ref))
    with open_store(url) as store:
        assert get_timer(store, "p1", KIND, b"order-1") is None and get_timer(store, "p3", KIND, b"flaky") is None
        assert get_timer(store, "p1", 8, b"later") is not None


def test_requeue_moves_a_retrying_timer_back_to_scheduled_and_leaves_a_scheduled_one(url, timers, tmp_path):
    """requeue --in 600: the retrying timer is scheduled again, attempt 0, due in 10 min; a scheduled
    timer is refused with exit 1, unchanged."""
    out = cli("timers", "requeue", "--store", url, "--partition", "p3", "--kind", str(KIND),
              "--reference", "flaky", "--in", "600")
    assert out.returncode == 0 and "requeued" in out.stdout, out.stderr
    with open_store(url) as store:
        timer = get_timer(store, "p3", KIND, b"flaky")
        assert (timer.state, timer.attempt) == ("scheduled", 0)
        assert timers + 10 * MIN_MS <= timer.due_at_ms <= wall_ms() + 10 * MIN_MS
        before = get_timer(store, "p1", KIND, b"order-1")
    refused = cli("timers", "requeue", "--store", url, "--partition", "p1", "--kind", str(KIND),
                  "--reference", "order-1")
    one_line_error(refused, 1, "scheduled", "fire-now")
    with open_store(url) as store:
        assert get_timer(store, "p1", KIND, b"order-1") == before


def test_requeue_due_at_is_the_exact_ms_given(url, timers, tmp_path):
    """requeue --due-at lands on the ms given, never one before it: this time is one whose float
    timestamp times 1000 falls just short of its ms. A time before 1970 is refused in one line."""
    given = "2038-09-14T18:20:04.523Z"
    exact_ms = (dt.datetime(2038, 9, 14, 18, 20, 4, 523000, tzinfo=dt.timezone.utc)
                - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(milliseconds=1)
    assert int(dt.datetime.fromisoformat(given[:-1] + "+00:00").timestamp() * 1000) == exact_ms - 1  # the situation arose
    out = cli("timers", "requeue", "--store", url, "--partition", "p3", "--kind", str(KIND),
              "--reference", "flaky", "--due-at", given)
    assert out.returncode == 0 and "requeued" in out.stdout, out.stderr
    with open_store(url) as store:
        assert get_timer(store, "p3", KIND, b"flaky").due_at_ms == exact_ms
    early = cli("timers", "requeue", "--store", url, "--partition", "p3", "--kind", str(KIND),
                "--reference", "flaky", "--due-at", "1969-12-31T23:59:59Z")
    one_line_error(early, 2, "--due-at", "1970", "1969-12-31T23:59:59Z")


@pytest.mark.parametrize("in_s, due_after_ms", [("0.0004", 1), ("0.0025", 3), ("600.0005", 600_001)])
def test_requeue_in_seconds_is_never_before_they_have_passed(url, timers, monkeypatch, in_s, due_after_ms):
    """requeue --in SECONDS rounds up to the ms, as delay= and Retry(delay=) do: rounded to the nearest
    ms, 0.0004 s was due now and 0.0025 s (half to even) 2 ms on, before the time asked for. The
    command's clock is held at a whole ms, so the due time is exact and nothing can flake."""
    import time

    now_ms = wall_ms()
    monkeypatch.setattr(time, "time_ns", lambda: now_ms * 1_000_000)
    out = cli("timers", "requeue", "--store", url, "--partition", "p3", "--kind", str(KIND),
              "--reference", "flaky", "--in", in_s)
    assert out.returncode == 0 and "requeued" in out.stdout, out.stderr
    with open_store(url) as store:
        assert get_timer(store, "p3", KIND, b"flaky").due_at_ms == now_ms + due_after_ms


@pytest.fixture
def new_york(monkeypatch):
    """This process's local time zone is New York's for the test (TZ and time.tzset(), POSIX only)."""
    import time
    if not hasattr(time, "tzset"):
        pytest.skip("time.tzset() is POSIX only: no local time zone to set on this platform")
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize("local, utc", [
    ("2027-03-14T02:30", "2027-03-14T07:30:00"),  # in the spring-forward gap: on EST, so 03:30 EDT
    ("2027-03-14T01:59:59.250", "2027-03-14T06:59:59.250"),  # just before it, the ms kept
    ("2027-11-07T01:30", "2027-11-07T05:30:00"),  # the repeated hour: its first reading (EDT)
])
def test_requeue_due_at_local_time_around_daylight_saving(url, timers, new_york, local, utc):
    """requeue --due-at with a time without a zone reads it as local time the way
    datetime.timestamp() does (PEP 495): a time the spring-forward gap skips lands after the gap,
    never an hour before it, where astimezone() put it."""
    out = cli("timers", "requeue", "--store", url, "--partition", "p3", "--kind", str(KIND),
              "--reference", "flaky", "--due-at", local)
    assert out.returncode == 0 and "requeued" in out.stdout, out.stderr
    expected_ms = (dt.datetime.fromisoformat(utc + "+00:00")
                   - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(milliseconds=1)
    with open_store(url) as store:
        assert get_timer(store, "p3", KIND, b"flaky").due_at_ms == expected_ms


def test_fire_now_makes_a_scheduled_or_retrying_timer_due_now(url, timers, tmp_path):
    for partition, ref in (("p1", "order-1"), ("p3", "flaky")):
        before_ms = wall_ms()
        out = cli("timers", "fire-now", "--store", url, "--partition", partition, "--kind", str(KIND),
                  "--reference", ref)
        assert out.returncode == 0 and "fired now" in out.stdout, out.stderr
        with open_store(url) as store:
            timer = get_timer(store, partition, KIND, ref.encode())
            assert (timer.state, timer.attempt) == ("scheduled", 0)
            assert before_ms - MIN_MS <= timer.due_at_ms <= wall_ms()


class Broken(TimerHandler):
    kind = TimerKind(KIND)
    max_attempts = 1

    def fire(self, ctx, timer):
        raise RuntimeError(f"no such order {timer.reference!r}")


def test_a_parked_timer_is_listed_shown_counted_and_requeued(url, timers, tmp_path):
    """A timer whose only attempt raised is parked: listed last with its error, shown, counted by
    fleet status; requeue puts it back to scheduled with its attempts reset, due now."""
    with open_store(url) as store:
        schedule(store, "p1", timers - MIN_MS, KIND, b"order-2", b"v")
        assert run_due(store, "p1", TimerRegistry().register(Broken()), timers).parked == 1
    out = cli("timers", "list", "--json", "--store", url)
    rows = json.loads(out.stdout)
    assert rows[-1]["reference"] == "order-2" and [r["state"] for r in rows].count("parked") == 1
    parked = rows[-1]
    assert (parked["state"], parked["attempt"], parked["due_at_ms"]) == ("parked", 1, timers - MIN_MS)
    assert parked["last_error"] == "RuntimeError: no such order b'order-2'" and parked["parked_at_ms"] >= timers
    only = json.loads(cli("timers", "list", "--json", "--state", "parked", "--store", url).stdout)
    assert only == [parked]
    table = cli("timers", "list", "--store", url).stdout.splitlines()
    assert "parked" in table[-1] and "RuntimeError: no such order" in table[-1]
    name = ("--store", url, "--partition", "p1", "--kind", str(KIND), "--reference", "order-2")
    shown = cli("timers", "show", *name).stdout
    assert "parked" in shown and "RuntimeError: no such order" in shown and "parked at" in shown
    state = json.loads(cli("fleet", "status", "--json", "--store", url).stdout)
    assert {p["partition"]: p["parked"] for p in state["partitions"]} == {"p1": 1, "p2": 0, "p3": 0}
    before_ms = wall_ms()
    out = cli("timers", "requeue", *name)
    assert out.returncode == 0 and "requeued" in out.stdout, out.stderr
    with open_store(url) as store:
        timer = get_timer(store, "p1", KIND, b"order-2")
        assert (timer.state, timer.attempt, timer.last_error) == ("scheduled", 0, None)
        assert before_ms - MIN_MS <= timer.due_at_ms <= wall_ms()


def test_fleet_status_gives_each_partitions_backlog_and_oldest_due_time(url, timers, tmp_path):
    """Due now: p2's overdue timer and p3's retrying one once its backoff passed (not yet, so p3 is
    not due); p1's are in the future. SQLite records no runners; PostgreSQL has none live."""
    out = cli("fleet", "status", "--json", "--store", url)
    assert out.returncode == 0, out.stderr
    state = json.loads(out.stdout)
    parts = {p["partition"]: p for p in state["partitions"]}
    assert sorted(parts) == ["p1", "p2", "p3"]
    assert (parts["p1"]["due_backlog"], parts["p1"]["oldest_due_at_ms"]) == (0, None)
    assert (parts["p2"]["due_backlog"], parts["p2"]["oldest_due_at_ms"]) == (1, timers - 2 * HOUR_MS)
    assert all(p["parked"] == 0 and not p["due_backlog_capped"] for p in parts.values())
    if url.startswith("sqlite"):
        assert state["backend"] == "sqlite" and state["runners"] is None and parts["p2"]["owners"] is None
    else:
        assert state["backend"] == "postgresql" and state["runners"] == [] and parts["p2"]["owners"] == []
    table = cli("fleet", "status", "--store", url).stdout
    assert "runners:" in table and "2 h ago" in table and "DUE BACKLOG" in table


@pytest.mark.parametrize("argv", [["timers", "list"], ["timers", "show", "--partition", "p", "--kind", "1",
                                                        "--reference", "r"], ["fleet", "status"]])
def test_an_unreachable_store_is_one_line_exit_2_and_never_its_password(argv, tmp_path):
    pytest.importorskip("psycopg")
    url = "postgresql://postgres:sekrit@127.0.0.1:1/postgres?connect_timeout=5"
    err = one_line_error(cli(*argv, "--store", url), 2, "postgresql://postgres:***@127.0.0.1:1/postgres")
    assert "sekrit" not in err


@pytest.mark.parametrize("argv", [["timers", "list"], ["fleet", "status"], ["timers", "cancel", "--partition", "p",
                                                                            "--kind", "1", "--reference", "r"]])
def test_a_missing_sqlite_file_is_one_line_exit_2_and_is_not_created(argv, tmp_path):
    db = tmp_path / "typo.db"
    one_line_error(cli(*argv, "--store", f"sqlite:///{db}"), 2, str(db), "no SQLite store")
    assert not db.exists()
    one_line_error(cli(*argv, "--store", "mysql://x"), 2, "mysql://x")
    one_line_error(cli(*argv), 2, "TIMERWHEEL_C_STORE")


# Every command that writes rows, none of which makes a store (only ``run`` does).
WRITES = [["timers", action, "--partition", "p", "--kind", "1", "--reference", "r"]
          for action in ("cancel", "requeue", "fire-now")]
WRITES += [["schedules", "add", "--partition", "p", "s", "--every", "60", "--kind", "1"]]
WRITES += [["schedules", action, "--partition", "p", "s"] for action in ("remove", "pause", "resume")]


def _tables(url: str) -> list:
    """The tables of the store ``url`` names: of its SQLite file, or of its PostgreSQL schema."""
    if url.startswith("sqlite:///"):
        import sqlite3

        with contextlib.closing(sqlite3.connect(url[len("sqlite:///"):])) as db:
            return [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    import psycopg

    with psycopg.connect(url) as conn:
        return [row[0] for row in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")]


@pytest.mark.parametrize("argv", WRITES, ids=[" ".join(argv[:2]) for argv in WRITES])
def test_a_command_that_writes_rows_never_makes_a_store(argv, url):
    """A command that writes rows acts on a store a runner made: against a database without one (an
    empty PostgreSQL schema, an empty SQLite file) it ran the store's DDL and then said "no pending
    timer" (exit 1), or "added" to a store nobody serves, and a mistyped SQLite path became a new file.
    It now refuses, one line and exit 2, and leaves the database as it was."""
    if url.startswith("sqlite:///"):
        db = url[len("sqlite:///"):]
        one_line_error(cli(*argv, "--store", url), 2, "no SQLite store", db)
        assert not os.path.exists(db)
        open(db, "wb").close()
    one_line_error(cli(*argv, "--store", url), 2, "no timerwheel_c store here")
    one_line_error(cli(*argv, store_env=url), 2, "no timerwheel_c store here")
    assert _tables(url) == []


@pytest.mark.parametrize("argv", [*WRITES, ["timers", "list"], ["schedules", "list"], ["fleet", "status"],
                                  ["run", "--handlers", "durable_handlers:registry"], ["web", "--port", "0"]],
                         ids=lambda argv: " ".join(argv[:2]))
def test_an_in_memory_store_is_refused_by_every_command(argv):
    """A CLI process's in-memory store is gone when it exits: ``schedules add`` said "added" (exit 0) and
    the schedule went with it. Every command refuses ``sqlite:///:memory:`` with one line, exit 2."""
    one_line_error(cli(*argv, "--store", "sqlite:///:memory:"), 2, "'sqlite:///:memory:'", "private to this process")


@pytest.mark.parametrize("argv, needles", [
    (["list", "--kind", "256"], ["--kind", "'256'"]),
    (["list", "--kind", "seven"], ["--kind", "'seven'"]),
    (["list", "--limit", "0"], ["--limit", "'0'"]),
    (["list", "--state", "asleep"], ["'asleep'"]),
    (["list", "--partition", ""], ["--partition", "''"]),
    (["show", "--partition", "p1", "--kind", "7", "--reference-hex", "0g"], ["--reference-hex", "'0g'"]),
    (["show", "--partition", "p1", "--kind", "7"], ["--reference"]),
    (["requeue", "--partition", "p1", "--kind", "7", "--reference", "r", "--due-at", "soon"], ["'soon'"]),
    (["requeue", "--partition", "p1", "--kind", "7", "--reference", "r", "--in", "-5"], ["'-5'"]),
    # Past the year 9999, which no table can show: refused naming --in, not due_at_ms and its 300 digits.
    (["requeue", "--partition", "p1", "--kind", "7", "--reference", "r", "--in", "1e300"], ["--in", "'1e300'"]),
    (["requeue", "--partition", "p1", "--kind", "7", "--reference", "r", "--in", "1e15"], ["--in", "'1e15'"]),
    (["list", "--limit", "\u00b2"], ["--limit", "int >= 1", "'\u00b2'"]),  # a digit to str.isdigit, not to int()
    (["requeue", "--partition", "p1", "--kind", "7", "--reference", "r", "--due-at", "0001-01-01T00:00:00"],
     ["--due-at", "ISO 8601", "'0001-01-01T00:00:00'"]),  # no local time zone that early
])
def test_bad_arguments_are_one_line_and_exit_2(argv, needles, tmp_path):
    url = "sqlite:///" + str(tmp_path / "t.db")
    with open_store(url):
        pass
    one_line_error(cli("timers", *argv, "--store", url), 2, *needles)


def test_the_store_comes_from_the_environment_without_a_url_on_the_command_line(url, timers, tmp_path):
    """With TIMERWHEEL_C_STORE set, no command line names the store (so ps never shows its URL)."""
    for argv in (["timers", "list", "--json"], ["fleet", "status", "--json"],
                 ["timers", "show", "--partition", "p1", "--kind", str(KIND), "--reference", "order-1"]):
        out = cli(*argv, store_env=url)
        assert out.returncode == 0, out.stderr
    assert len(json.loads(cli("timers", "list", "--json", store_env=url).stdout)) == 4


def test_durations_read_in_words_to_their_two_largest_units():
    now = 1_800_000_000_000
    assert in_words(now + 400, now) == "now"
    assert in_words(now + 3 * MIN_MS, now) == "in 3 min"
    assert in_words(now - 2 * HOUR_MS - 5 * MIN_MS - 7000, now) == "2 h 5 min ago"
    assert in_words(now + 26 * HOUR_MS + 59 * 1000, now) == "in 1 d 2 h"
    assert in_words(now + 24 * HOUR_MS + 30 * 1000, now) == "in 1 d"
    assert in_words(None, now) == "-"


def test_a_listed_schedule_occurrence_is_named_as_such_by_the_commands_on_one_timer(url, tmp_path):
    """``list`` shows a schedule's pending occurrence under the schedule's name, but it is no timer of
    its own: ``show``, ``cancel``, ``requeue`` and ``fire-now`` on the name ``list`` printed answer exit
    1 with one line that says it is the schedule's occurrence and which command steers it, rather than
    a bare "no pending timer" for a row the operator has just seen listed."""
    from timerwheel_c.durable import Every, add_schedule

    with open_store(url) as store:
        add_schedule(store, "reports", "heartbeat", Every(60), KIND)
    listed = json.loads(cli("timers", "list", "--store", url, "--json").stdout)
    assert [(t["partition"], t["kind"], t["reference"]) for t in listed] == [("reports", KIND, "heartbeat")]
    for action in ("show", "cancel", "requeue", "fire-now"):
        out = cli("timers", action, "--store", url, "--partition", "reports", "--kind", str(KIND),
                  "--reference", "heartbeat")
        one_line_error(out, 1, "occurrence of schedule 'heartbeat'", "timerwheel-c schedules")


def test_the_steering_hint_of_an_occurrence_stays_one_line_and_pastes_back(tmp_path):
    """A schedule and partition named with a newline, a terminal escape, a quote and a backslash:
    the hint of the commands on one timer stays one line with no raw control character, and its
    command, pasted into bash, names the partition and the schedule exactly."""
    from timerwheel_c.durable import Every, add_schedule

    url = "sqlite:///" + str(tmp_path / "hint.db")
    partition, name = "p'art\\\u2028", "nightly\nreport\x1b[2J \u00e9"
    with open_store(url) as store:
        add_schedule(store, partition, name, Every(60), KIND)
    out = cli("timers", "fire-now", "--store", url, "--partition", partition, "--kind", str(KIND), "--reference", name)
    line = one_line_error(out, 1, "occurrence of schedule", "timerwheel-c schedules")
    assert "\x1b" not in line and "\u2028" not in line
    command = line.split("steered with ", 1)[1]
    echoed = subprocess.run(["bash", "-c", "printf '%s\\0' " + command.replace("timerwheel-c schedules pause|resume|remove", "")],
                            capture_output=True, text=True, check=True).stdout
    assert echoed.split("\0")[:-1] == ["--partition", partition, name]


def test_control_characters_in_names_are_escaped_in_tables(tmp_path):
    """A partition name holding a newline and a terminal escape sequence: ``timers list``, ``timers
    show`` and ``fleet status`` print it escaped (``\\n``, ``\\x1b``), so that a name can neither
    break a table's rows nor drive the operator's terminal; ``--json`` keeps it as it is."""
    url = "sqlite:///" + str(tmp_path / "names.db")
    evil = "evil\n\x1b[2Jname"
    with open_store(url) as store:
        schedule(store, evil, wall_ms() + HOUR_MS, KIND, b"r")
    outs = [cli("timers", "list", "--store", url), cli("fleet", "status", "--store", url),
            cli("timers", "show", "--store", url, "--partition", evil, "--kind", str(KIND), "--reference", "r")]
    for out in outs:
        assert out.returncode == 0, out.stderr
        assert "\x1b" not in out.stdout and "evil\\n\\x1b[2Jname" in out.stdout, out.stdout
    assert len(outs[0].stdout.strip().splitlines()) == 2  # the header and one row
    listed = json.loads(cli("timers", "list", "--store", url, "--json").stdout)
    assert [t["partition"] for t in listed] == [evil]

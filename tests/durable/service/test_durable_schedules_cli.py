"""``timerwheel-c schedules``: add, list (a table in this machine's zone, JSON in UTC), pause, resume,
remove; bad arguments are one line on stderr and exit 2, before any store file is made."""
from __future__ import annotations

import datetime as dt
import json
from zoneinfo import ZoneInfo

import pytest

from timerwheel_c.cli import main
from timerwheel_c.durable import SQLiteStore, get_schedule
from timerwheel_c.durable.service.cli_text import local_iso


@pytest.fixture
def url(tmp_path):
    """The URL of a store a runner has made: these commands never make one."""
    SQLiteStore(tmp_path / "s.db").close()
    return "sqlite:///" + str(tmp_path / "s.db")


def test_add_again_keeps_a_pause_unless_resumed_and_can_add_paused(url, capsys):
    add = ["schedules", "add", "--store", url, "--partition", "p", "beat", "--every", "60", "--kind", "8"]
    assert main(add + ["--paused"]) == 0
    assert capsys.readouterr().out.strip() == "added 'beat': every 60 s, paused"
    store = SQLiteStore(url[len("sqlite:///"):])
    try:
        assert get_schedule(store, "p", "beat").paused
        assert main(add) == 0 and get_schedule(store, "p", "beat").paused  # the next deploy adds it again
        assert main(add + ["--resumed"]) == 0 and not get_schedule(store, "p", "beat").paused
        assert "next fire" in capsys.readouterr().out
    finally:
        store.close()
    with pytest.raises(SystemExit) as exit_:
        main(add + ["--paused", "--resumed"])
    assert exit_.value.code == 2 and "not allowed with argument --paused" in capsys.readouterr().err


def test_add_list_pause_resume_remove(url, tmp_path, capsys):
    assert main(["schedules", "add", "--store", url, "--partition", "p", "nightly", "--cron", "30 2 * * *",
                 "--tz", "Europe/London", "--kind", "7", "--value", "v"]) == 0
    assert "added 'nightly'" in capsys.readouterr().out
    assert main(["schedules", "add", "--store", url, "--partition", "p", "beat", "--every", "0.5", "--kind", "8",
                 "--misfire", "all", "--catchup", "60"]) == 0
    capsys.readouterr()
    assert main(["schedules", "list", "--store", url]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["PARTITION", "NAME", "TRIGGER"] and len(table) == 3
    assert main(["schedules", "list", "--store", url, "--partition", "p", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["beat"]["kind"] == 8 and rows["beat"]["misfire"] == "all" and rows["beat"]["next_fire"].endswith("Z")
    nightly = dt.datetime.fromtimestamp(rows["nightly"]["next_fire_ms"] / 1000, ZoneInfo("Europe/London"))
    assert nightly.strftime("%H:%M:%S") == "02:30:00"
    assert any("nightly" in line and local_iso(rows["nightly"]["next_fire_ms"]) in line for line in table)
    # How far away, in words, as timers list gives it: the half-second beat is due within a second.
    assert table[0].split()[4:6] == ["NEXT", "FIRE"] and table[0].split()[6] == "WHEN"
    assert any("beat" in line and " now " in line for line in table) or any(
        "beat" in line and " ago " in line for line in table), table
    assert any("nightly" in line and " in " in line for line in table), table
    assert main(["schedules", "pause", "--store", url, "--partition", "p", "beat"]) == 0
    assert main(["schedules", "resume", "--store", url, "--partition", "p", "beat"]) == 0
    assert main(["schedules", "remove", "--store", url, "--partition", "p", "nightly"]) == 0
    assert capsys.readouterr().out.split() == ["paused", "'beat'", "resumed", "'beat'", "removed", "'nightly'"]
    with SQLiteStore(tmp_path / "s.db") as store:
        assert get_schedule(store, "p", "nightly") is None
        assert get_schedule(store, "p", "beat").value == b""


def test_the_help_names_every_field_of_the_json_listing(url, capsys):
    """``schedules list --help`` names each key of a ``--json`` object, so a script's author reads them
    there (``runs`` and ``ended`` were left out)."""
    assert main(["schedules", "add", "--store", url, "--partition", "p", "beat", "--every", "60", "--kind", "8"]) == 0
    capsys.readouterr()
    assert main(["schedules", "list", "--store", url, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    with pytest.raises(SystemExit):
        main(["schedules", "list", "--help"])
    help_words = set(capsys.readouterr().out.replace("/", " ").replace(",", " ").split())
    assert len(row) >= 12 and not [key for key in row if key not in help_words], sorted(row)

def test_a_value_that_is_not_utf8_is_stored_as_typed(url, tmp_path, capsys):
    """``--value`` bytes that are not UTF-8 (argv as the OS gave it, surrogate-escaped by Python)
    are stored as typed, as ``timers``' references are, never a UnicodeEncodeError."""
    typed = b"\xff\xfeok".decode("utf-8", "surrogateescape")
    assert main(["schedules", "add", "--store", url, "--partition", "p", "raw", "--every", "60", "--kind", "3",
                 "--value", typed]) == 0, capsys.readouterr().err
    with SQLiteStore(tmp_path / "s.db") as store:
        assert get_schedule(store, "p", "raw").value == b"\xff\xfeok"


@pytest.mark.parametrize("argv, needle", [
    (["add", "n", "--cron", "61 * * * *", "--kind", "1"], "minute"),
    (["add", "n", "--cron", "@daily", "--tz", "Mars/Olympus", "--kind", "1"], "Mars/Olympus"),
    (["add", "n", "--cron", "@daily", "--tz", "", "--kind", "1"], "unknown IANA time zone ''"),  # not UTC
    (["add", "n", "--cron", "@daily", "--tz", "localtime", "--kind", "1"], "'localtime'"),
    # Names zoneinfo's lookup failed on with an OSError (too long for a file name, a directory): a traceback.
    (["add", "n", "--cron", "30 2 * * *", "--tz", "a" * 300, "--kind", "1"], "unknown IANA time zone 'aaa"),
    (["add", "n", "--cron", "30 2 * * *", "--tz", "Europe", "--kind", "1"], "unknown IANA time zone 'Europe'"),
    (["add", "n", "--every", "60", "--misfire", "skip", "--grace", "1e308", "--kind", "1"], "--grace"),
    (["add", "n", "--every", "0", "--kind", "1"], "0"),
    (["add", "n", "--every", "5", "--kind", "256"], "256"),
    (["add", "n", "--every", "5", "--kind", "1", "--misfire", "all"], "needs --catchup"),
    (["add", "n", "--every", "5", "--kind", "1", "--jitter", "-1"], "--jitter must be"),
    (["add", "n", "--every", "60", "--tz", "Europe/Paris", "--kind", "1"], "--tz applies to --cron only"),
])
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, capsys, argv, needle):
    url = "sqlite:///" + str(tmp_path / "bad.db")
    assert main(["schedules", argv[0], "--store", url, "--partition", "p", *argv[1:]]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and err.startswith("timerwheel-c schedules add: ")
    assert not (tmp_path / "bad.db").exists()  # checked before the store is opened


def test_a_warning_about_the_trigger_is_one_line_of_the_command(url, capsys):
    """A zone without daylight saving time picked for a region's clock adds the schedule and warns in one
    line of the command's, naming the zone to use: it printed Python's warning, the source file's path
    and line included."""
    assert main(["schedules", "add", "--store", url, "--partition", "p", "est", "--cron", "0 9 * * *", "--tz", "EST",
                 "--kind", "1"]) == 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("timerwheel-c schedules add: warning: tz 'EST'") and "America/New_York" in err
    assert len(err.splitlines()) == 1 and ".py" not in err


@pytest.mark.parametrize("action", ["remove", "pause", "resume"])
def test_changing_a_missing_schedule_is_one_line_and_exit_1(url, capsys, action):
    """A schedule that does not exist is "not found", exit 1, as a missing timer is for ``timers``:
    one rule for every subcommand (2 is for bad arguments and stores that cannot be opened)."""
    assert main(["schedules", "add", "--store", url, "--partition", "p", "other", "--every", "60", "--kind", "1"]) == 0
    assert main(["schedules", action, "--store", url, "--partition", "p", "ghost"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'ghost'" in err


def test_an_unopenable_store_is_one_line_and_exit_2(tmp_path, capsys):
    url = "sqlite:///" + str(tmp_path / "missing-dir" / "s.db")
    assert main(["schedules", "add", "--store", url, "--partition", "p", "s", "--every", "60", "--kind", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no SQLite store at" in err  # add never creates a file either
    assert main(["schedules", "list", "--store", url]) == 2  # list never creates a file: it says there is none
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no SQLite store at" in err


def test_a_next_fire_past_the_year_9999_is_shown_as_a_dash(url, capsys):
    """An interval may be as long as timedelta.max (some 2.7 million years), so a next fire time may
    lie past what datetime can show: add and list print "-" for it, exit 0, and the store's other
    schedules are still listed (its ms stay in the JSON)."""
    assert main(["schedules", "add", "--store", url, "--partition", "p", "far", "--every", "8e13", "--kind", "1"]) == 0
    assert "next fire -" in capsys.readouterr().out
    assert main(["schedules", "add", "--store", url, "--partition", "p", "near", "--every", "60", "--kind", "1"]) == 0
    capsys.readouterr()
    assert main(["schedules", "list", "--store", url]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 3 and any(line.split()[1:2] == ["far"] and " - " in line for line in table)
    assert main(["schedules", "list", "--store", url, "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["far"]["next_fire"] is None and rows["far"]["next_fire_ms"] > 10**16 and rows["near"]["next_fire"]


def test_timers_list_and_schedules_list_show_times_in_one_format(url, capsys, monkeypatch):
    """In a zone with a half-hour offset (Asia/Kolkata, +05:30): both tables give times in this
    machine's zone as ISO 8601 with its offset, and both JSON outputs give them in ISO 8601 UTC
    (``...Z``) beside the epoch ms, whatever the schedule's own zone."""
    import re
    import time

    if not hasattr(time, "tzset"):
        pytest.skip("time.tzset() is POSIX only: no local time zone to set on this platform")
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        assert main(["schedules", "add", "--store", url, "--partition", "p", "tokyo", "--cron", "0 9 * * *",
                     "--tz", "Asia/Tokyo", "--kind", "1"]) == 0
        assert main(["schedules", "add", "--store", url, "--partition", "p", "beat", "--every", "3600", "--kind", "2"]) == 0
        capsys.readouterr()
        assert main(["schedules", "list", "--store", url, "--json"]) == 0
        schedules = json.loads(capsys.readouterr().out)
        assert main(["timers", "list", "--store", url, "--json"]) == 0
        timers = json.loads(capsys.readouterr().out)
        assert len(schedules) == 2 and len(timers) == 2  # each schedule's pending occurrence is listed
        for shown, ms in [(s["next_fire"], s["next_fire_ms"]) for s in schedules] + [(t["due_at"], t["due_at_ms"]) for t in timers]:
            assert shown == dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat(timespec="milliseconds")[:-6] + "Z"
        local = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+05:30")
        for command in (["schedules", "list"], ["timers", "list"]):
            assert main([*command, "--store", url]) == 0
            rows = capsys.readouterr().out.splitlines()[1:]
            assert len(rows) == 2 and all(len(local.findall(row)) == 1 for row in rows), rows
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()

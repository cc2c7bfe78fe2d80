"""``timerwheel-c schedules``: add, list (table and JSON, next fire time in the schedule's zone), pause,
resume, remove; bad arguments are one line on stderr and exit 2, before any store file is made."""
from __future__ import annotations

import json

import pytest

from timerwheel_c.cli import main
from timerwheel_c.durable import SQLiteStore, get_schedule


@pytest.fixture
def url(tmp_path):
    return "sqlite:///" + str(tmp_path / "s.db")


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
    assert any("nightly" in line and ("GMT" in line or "BST" in line) and "02:30:00" in line for line in table)
    assert main(["schedules", "list", "--store", url, "--partition", "p", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["beat"]["kind"] == 8 and rows["beat"]["misfire"] == "all" and rows["beat"]["next_fire"].endswith("UTC")
    assert main(["schedules", "pause", "--store", url, "--partition", "p", "beat"]) == 0
    assert main(["schedules", "resume", "--store", url, "--partition", "p", "beat"]) == 0
    assert main(["schedules", "remove", "--store", url, "--partition", "p", "nightly"]) == 0
    assert capsys.readouterr().out.split() == ["paused", "'beat'", "resumed", "'beat'", "removed", "'nightly'"]
    with SQLiteStore(tmp_path / "s.db") as store:
        assert get_schedule(store, "p", "nightly") is None
        assert get_schedule(store, "p", "beat").value == b""


@pytest.mark.parametrize("argv, needle", [
    (["add", "n", "--cron", "61 * * * *", "--kind", "1"], "minute"),
    (["add", "n", "--cron", "@daily", "--tz", "Mars/Olympus", "--kind", "1"], "Mars/Olympus"),
    (["add", "n", "--every", "0", "--kind", "1"], "0"),
    (["add", "n", "--every", "5", "--kind", "256"], "256"),
    (["add", "n", "--every", "5", "--kind", "1", "--misfire", "all"], "catchup_window_s"),
    (["add", "n", "--every", "60", "--tz", "Europe/Paris", "--kind", "1"], "--tz applies to --cron only"),
])
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, capsys, argv, needle):
    url = "sqlite:///" + str(tmp_path / "bad.db")
    assert main(["schedules", argv[0], "--store", url, "--partition", "p", *argv[1:]]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and err.startswith("timerwheel-c schedules add: ")
    assert not (tmp_path / "bad.db").exists()  # checked before the store is opened


def test_changing_a_missing_schedule_is_one_line_and_exit_2(url, capsys):
    assert main(["schedules", "remove", "--store", url, "--partition", "p", "ghost"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'ghost'" in err


def test_an_unopenable_store_is_one_line_and_exit_2(tmp_path, capsys):
    url = "sqlite:///" + str(tmp_path / "missing-dir" / "s.db")
    assert main(["schedules", "list", "--store", url]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot open store" in err


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
    assert rows["far"]["next_fire"] == "-" and rows["far"]["next_fire_ms"] > 10**16 and rows["near"]["next_fire"] != "-"

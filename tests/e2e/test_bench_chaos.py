"""The chaos command (``python bench/run.py -m bench.chaos``): its counts judge each timer by what the
writer knows of it, and a short run through every fault this machine allows leaves every count but the
faults at 0.

The counting test builds the writer's record and the fires by hand, so it proves each count (lost,
doubled, early, fired after a cancel, the lateness per fault) without a server or a clock. The run
uses a PostgreSQL cluster of its own (tests/pg_cluster.py), since it restarts the server and makes it
read-only; it asserts only counts that must be 0 whatever the load, first checking that the situation
arose (each fault injected, timers fired, cancelled and rescheduled); lateness is reported, never
asserted.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import BENCH_RUN

PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")


def _chaos(events):
    from bench.chaos import Chaos

    chaos = Chaos("postgresql://unused", duration_s=10, grace_s=1, hold_s=1, freeze_s=1, skew_s=5, pg_data=None,
                  faults=(), seed=1)
    chaos.events = events
    return chaos


def test_each_count_judges_a_timer_by_the_writers_last_successful_write():
    from bench.chaos import Name

    chaos = _chaos([(10_000, "sigkill", "runner 0")])
    chaos.names = {
        b"on-time": Name("p", 5_000, fires=[(5_040, 1, 1)]),
        b"late-after-kill": Name("p", 12_000, fires=[(12_900, 1, 2)]),
        b"lost": Name("p", 6_000),
        b"doubled": Name("p", 7_000, fires=[(7_010, 1, 1), (7_020, 2, 1)]),
        b"early": Name("p", 8_000, fires=[(7_999, 1, 1)]),
        b"after-cancel": Name("p", 9_000, cancelled=True, fires=[(9_000, 1, 1)]),
        b"cancelled": Name("p", 9_000, cancelled=True),
        b"unsure": Name("p", 9_000, unsure=True, fires=[(1, 1, 1), (2, 1, 1)]),
        b"due-after-the-end": Name("p", 30_000),
    }
    chaos._start_ms = 4_000
    report = chaos.report(end_ms=20_000)
    assert {k: report[k] for k in ("lost", "doubled", "early", "after_cancel")} == \
        {"lost": 1, "doubled": 1, "early": 1, "after_cancel": 1}
    assert [(f["fault"], f["at_s"], f["worst_lateness_ms"]) for f in report["faults"]] == \
        [("none", 0.0, 40), ("sigkill", 6.0, 900)]
    assert report["fired"] == 5 and report["cancelled"] == 2


def test_a_bad_argument_is_one_line_naming_it_and_status_2(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH_RUN), "-m", "bench.chaos", "--pg-dsn", "postgresql://x",
                           "--faults", "sigkill,meteor"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown fault(s) ['meteor']" in proc.stderr, proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(not PG_DSN, reason="set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to run the chaos command")
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_short_chaos_run_loses_doubles_and_fires_early_nothing(tmp_path):
    import psycopg

    from bench.chaos import iptables_usable
    from pg_cluster import throwaway_cluster

    with throwaway_cluster() as (dsn, _pg_ctl):
        with psycopg.connect(dsn) as conn:
            data = conn.execute("SHOW data_directory").fetchone()[0]
        out = tmp_path / "chaos.json"
        # cwd=tmp_path: never import the checkout's timerwheel_c instead of the installed one.
        proc = subprocess.run([sys.executable, str(BENCH_RUN), "-m", "bench.chaos", "--pg-dsn", dsn, "--pg-data", data,
                               "--duration-s", "30", "--hold-s", "3", "--freeze-s", "4", "--grace-s", "90",
                               "--json", str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1) and out.exists(), proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    injected = [f["fault"] for f in report["faults"][1:]]
    wanted = ["sigkill", "sigstop"] + (["drop"] if iptables_usable() is None else []) + ["pg-restart", "read-only"]
    assert injected == wanted, proc.stdout
    assert report["fired"] > 0 and report["cancelled"] > 0 and report["rescheduled"] > 0, proc.stdout
    counts = {k: report[k] for k in ("lost", "doubled", "early", "after_cancel")}
    assert counts == {"lost": 0, "doubled": 0, "early": 0, "after_cancel": 0}, proc.stdout
    assert proc.returncode == 0, proc.stdout + proc.stderr

"""The embedded-service workload of the bench: a service run with and without prepare_process(), its
row in the goals table, and the collector's passes counted. One tiny real run on SQLite (10 timers per
run); nothing here asserts a speed: the goal is checked to be stated and judged, never to be met."""
from __future__ import annotations

import gc

from bench import goals
from bench.durable_embedded import MODES, _GcTimer
from bench_tiny import run_tiny

GOAL_NAME = "sqlite fired/s of a service embedded without prepare_process(), over timerwheel-c run's"


def test_the_bench_measures_an_embedded_service_against_a_run_process_and_judges_the_ratio(monkeypatch, capsys,
                                                                                          tmp_path):
    """``--only embedded`` at a tiny scale runs both modes on SQLite, each firing every timer (its run
    fails otherwise), and reports fired/s, CPU per fired timer and the collector's share per mode; the
    ratio of the two is the goal's measure, printed under the table and in the closing goals table."""
    figures, out = run_tiny("embedded", monkeypatch, capsys, tmp_path)
    sqlite = figures["workloads"]["embedded"]["results"]["sqlite"]
    for mode in MODES:
        f = sqlite[mode]
        assert f["mode"] == mode and f["fired_per_s"] > 0 and f["runner_cpu_us_per_fired"] > 0
        assert 0 <= f["gc_share"] <= 1
    assert sqlite["embedded_over_run"] == sqlite["embedded"]["fired_per_s"] / sqlite["run"]["fired_per_s"]
    assert sqlite["embedded_over_run_cpu"] == (sqlite["run"]["runner_cpu_us_per_fired"]
                                               / sqlite["embedded"]["runner_cpu_us_per_fired"])
    [verdict] = figures["goals"]
    assert (verdict["workload"], verdict["name"], verdict["goal"]) == ("embedded", GOAL_NAME, ">= 0.90x")
    assert verdict["measured"] == sqlite["embedded_over_run"]
    assert goals.line(verdict) in out


def test_the_collector_timer_counts_each_pass_and_its_cpu_time():
    """Every collector pass, started and stopped on this thread, is counted once, with a CPU time."""
    timer = _GcTimer()
    gc.callbacks.append(timer)
    try:
        gc.collect()
        gc.collect(0)
    finally:
        gc.callbacks.remove(timer)
    assert timer.passes >= 2 and timer.cpu_s >= 0

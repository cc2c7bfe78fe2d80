"""The bulk-write workload of the bench: one ``schedule_many`` of many new timers against a loop of
``schedule()``, and its row in the goals table. One tiny real run on SQLite; nothing here asserts a
speed: the goal is checked to be stated and judged, never to be met."""
from __future__ import annotations

from bench import goals
from bench_tiny import run_tiny


def test_the_bench_measures_schedule_many_and_judges_it_against_50000_timers_per_second(monkeypatch, capsys,
                                                                                        tmp_path):
    """``--only bulk`` at a tiny scale writes the timers into a new SQLite store per round and reports
    timers/s of ``schedule_many`` and of the ``schedule()`` loop; the goal (at least 50,000 timers/s)
    is printed under the table and in the closing goals table, as n/a at a size it is not set for."""
    figures, out = run_tiny("bulk", monkeypatch, capsys, tmp_path)
    bulk = figures["workloads"]["bulk"]
    sqlite = bulk["results"]["sqlite"]
    assert sqlite["many_per_s"] > 0 and sqlite["loop_per_s"] > 0
    assert sqlite["many_over_loop"] == sqlite["many_per_s"] / sqlite["loop_per_s"]
    [verdict] = figures["goals"]
    assert (verdict["workload"], verdict["name"], verdict["goal"]) == (
        "bulk", "sqlite schedule_many, new timers written per second", ">= 50,000 timers/s")
    assert verdict["measured"] == sqlite["many_per_s"] and verdict["set_at"] == "100,000 timers"
    assert goals.line(verdict) in out

"""Goals are judged and shown one way: goal, measured value, met / NOT met / n/a. Fixed numbers,
nothing timed."""
from __future__ import annotations

import pytest

from bench import goals

AT_MOST = goals.Goal("churn", "C reschedule / empty method", 1.5, at_most=True)
AT_LEAST = goals.Goal("durable", "sqlite fired timers per second", 5000, at_most=False, unit="fired/s")


@pytest.mark.parametrize("goal, measured, met", [
    (AT_MOST, 1.2, True), (AT_MOST, 1.5, True), (AT_MOST, 1.51, False),
    (AT_LEAST, 5000, True), (AT_LEAST, 4999.9, False),
    (AT_MOST, None, None), (AT_LEAST, float("nan"), None),
])
def test_judge_meets_at_the_bound_and_marks_missing_figures_na(goal, measured, met):
    """The bound itself meets the goal; a figure that does not apply (None, NaN) is neither met
    nor missed, and the verdict is JSON-ready (no NaN)."""
    verdict = goal.judge(measured)
    assert verdict["met"] is met
    assert verdict["measured"] == (None if met is None else measured)
    assert verdict["goal"] == goal.target() and verdict["name"] == goal.name
    assert verdict["workload"] == goal.workload


def test_every_form_shows_goal_measured_and_verdict():
    """The sentence and the table row carry the same three things; units are spelled out."""
    missed, met, na = AT_MOST.judge(1.8), AT_LEAST.judge(12_747.0), AT_MOST.judge(None)
    assert goals.line(missed) == "goal: C reschedule / empty method <= 1.50x; measured 1.80x: NOT met"
    assert goals.line(met) == "goal: sqlite fired timers per second >= 5,000 fired/s; measured 12,747 fired/s: met"
    assert goals.line(na) == "goal: C reschedule / empty method <= 1.50x; measured n/a: n/a"
    assert goals.rows([missed, met, na]) == [
        ["churn: C reschedule / empty method", "<= 1.50x", "1.80x", "NOT met"],
        ["durable: sqlite fired timers per second", ">= 5,000 fired/s", "12,747 fired/s", "met"],
        ["churn: C reschedule / empty method", "<= 1.50x", "n/a", "n/a"],
    ]
    assert len(goals.HEADERS) == len(goals.rows([met])[0])


def test_summary_counts_and_says_what_a_miss_means():
    text = goals.summary([AT_MOST.judge(1.8), AT_LEAST.judge(6000), AT_MOST.judge(None)])
    assert text.startswith("1 of 3 goals met, 1 NOT met, 1 n/a; ")
    assert "exit status 0" in text


def test_the_bench_prints_each_goal_under_its_table_and_in_the_goals_table(monkeypatch, capsys, tmp_path):
    """With fixed durable figures (the measurement replaced; nothing timed), each durable goal is
    printed under the durable table as a goal line and again as a row of the closing goals
    table, the JSON holds the same verdicts, and a missed goal leaves the exit status 0."""
    import json

    from bench import cli
    from bench import durable

    def fixed(n_timers, dsn=None, progress=None):
        return {"sqlite": {"fired_per_s": 6000.0, "lateness_ms": [1.0] * 98 + [30.0, 30.0]}}

    monkeypatch.setattr(durable, "run", fixed)
    path = tmp_path / "figures.json"
    status = cli.main(["--only", "durable", "--plain", "--no-progress", "--json", str(path)])
    out = capsys.readouterr().out
    assert status == 0
    verdicts = json.loads(path.read_text())["goals"]
    assert [(v["name"], v["met"]) for v in verdicts] == [
        ("sqlite fired timers per second", True), ("sqlite lateness p99", False)]
    for verdict in verdicts:
        assert goals.line(verdict) in out
        assert " ".join(goals.rows([verdict])[0]) in " ".join(out.split())
    assert "1 of 2 goals met, 1 NOT met" in out


def test_a_goal_measured_at_another_size_is_shown_na_with_the_size_it_is_set_for():
    """A figure measured at a size the goal is not stated at (--quick) is neither met nor missed:
    the verdict shows the measured value and "n/a: set at" the goal's size."""
    verdict = AT_MOST.judge(1.8, set_at="100,000 connections, 1,000,000 ops")
    assert verdict["met"] is None and verdict["measured"] == 1.8
    assert goals.rows([verdict]) == [["churn: C reschedule / empty method", "<= 1.50x", "1.80x",
                                      "n/a: set at 100,000 connections, 1,000,000 ops"]]
    assert goals.summary([verdict]).startswith("0 of 1 goals met, 1 n/a")


def test_quick_sizes_leave_size_bound_goals_unjudged_and_default_sizes_judge_them():
    """suite.goals judges the churn and asyncio goals only at the sizes they are set for (the
    defaults): at --quick sizes they are n/a naming those sizes; the durable goals likewise."""
    from bench import suite
    from bench.workloads import Sizes

    cell = {"median_ns_per_op": 100.0}
    churn = {"results": {"C wheel": {"reschedule": cell, "cancel+schedule": cell},
                         "empty Cython method": {"reschedule": cell, "cancel+schedule": cell}}}
    default = suite.goals({"churn": churn}, dict(Sizes().__dict__))
    quick = suite.goals({"churn": churn}, dict(Sizes.quick().__dict__))
    assert [v["met"] for v in default][:2] == [True, True]
    assert all(v["met"] is None for v in quick)
    assert quick[0]["set_at"] == "100,000 connections, 1,000,000 ops" and quick[0]["measured"] == 1.0
    aio = suite.goals({"aio": {"results": {}}}, dict(Sizes.quick().__dict__))
    assert aio and all(v["set_at"] == "100,000 handles armed" for v in aio)


def test_the_fleet_goals_against_pgqueuer_and_the_cpu_per_fired_timer_are_the_sharded_stores():
    """The durable goals of a run compared with pgqueuer (fixed figures, nothing timed): one runner at
    least 1.5x pgqueuer's fired/s and four at least 1.8x, at most 20 µs of the server's CPU and 25 µs
    of the runner's per fired timer, and a takeover within 2 s."""
    from bench import suite

    figures = {"results": {},
               "fleet": {"runners_1": {"runners": 1, "fired_per_s": 20_000.0, "server_cpu_us_per_fired": 19.0,
                                       "runner_cpu_us_per_fired": 26.0},
                         "runners_4": {"runners": 4, "fired_per_s": 40_000.0, "takeover_s": 2.5}},
               "pgqueuer": {"results": {"workers_1_batch_100": {"ours_over_pgqueuer": 1.6},
                                        "workers_4_batch_100": {"ours_over_pgqueuer": 1.7}}}}
    verdicts = {v["name"]: (v["goal"], v["met"]) for v in (g.judge(m) for g, m in suite._durable_goals(figures))}
    assert verdicts["fleet of 1 runner(s) / pgqueuer 1 worker(s) at batch 100, fired/s"] == (">= 1.50x", True)
    assert verdicts["fleet of 4 runner(s) / pgqueuer 4 worker(s) at batch 100, fired/s"] == (">= 1.80x", False)
    assert verdicts["fleet of 1 runner, server CPU per fired timer"] == ("<= 20.0 us", True)
    assert verdicts["fleet of 1 runner, runner CPU per fired timer"] == ("<= 25.0 us", False)
    assert verdicts["fleet takeover after SIGKILL (4 runners)"] == ("<= 2.00 s", False)

"""The partitions wake-up as a workload of the bench: its rows in the goals table, its chart, and the
fleet beside pgqueuer as a chart. One tiny real run on SQLite (10 partitions, 10 timers); the rest
from fixed figures in the JSON's shape. Nothing here asserts a speed: the goal is checked to be
stated and judged only at the size it is set for, never to be met.
"""
from __future__ import annotations

import pytest

from bench import cli, goals, suite
from bench.workloads import Sizes
from bench_tiny import run_tiny

GOAL_NAME = "sqlite wake-up p99 at 100,000 idle partitions"


def _figures(p99_at_top: float, top: int) -> dict:
    return {"timers": 30, "results": {"sqlite": {
        str(n): {"p50_ms": 4.0, "p99_ms": p99_at_top if n == top else 8.0, "lateness_ms": [4.0, 8.0]}
        for n in (1, 1_000, top)}}}


def test_the_bench_prints_the_partitions_goal_in_the_goals_table_and_writes_its_chart(monkeypatch, capsys,
                                                                                      tmp_path):
    """``--only partitions`` at a tiny scale measures a p50 and p99 per partition count on SQLite,
    prints the goal under its table and as a row of the closing goals table (n/a: it is set at
    100,000 partitions), records the same verdict in the JSON, and ``--plot`` writes partitions.png."""
    pytest.importorskip("matplotlib")
    charts = tmp_path / "charts"
    figures, out = run_tiny("partitions", monkeypatch, capsys, tmp_path, "--plot", str(charts))
    by_count = figures["workloads"]["partitions"]["results"]["sqlite"]
    assert sorted(by_count, key=int) == ["1", "10"]  # the ladder below the scaled 100,000, then it
    assert all(len(f["lateness_ms"]) == 10 and f["p99_ms"] >= f["p50_ms"] for f in by_count.values())
    [verdict] = figures["goals"]
    assert (verdict["workload"], verdict["name"], verdict["goal"]) == ("partitions", GOAL_NAME, "<= 20.0 ms")
    assert verdict["met"] is None and verdict["set_at"] == "100,000 partitions"
    assert verdict["measured"] == by_count["10"]["p99_ms"]
    assert goals.line(verdict) in out
    assert " ".join(goals.rows([verdict])[0]) in out
    assert (charts / "partitions.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("p99, met", [(9.0, True), (20.0, True), (21.0, False)])
def test_the_partitions_goal_is_judged_at_100000_partitions_on_the_largest_count(p99, met):
    """At the default sizes the goal is judged on the p99 at the largest count (100,000), per
    backend; at --quick sizes (10,000 partitions) it is n/a, naming the size it is set for."""
    [verdict] = suite.goals({"partitions": _figures(p99, 100_000)}, dict(Sizes().__dict__))
    assert verdict["met"] is met and verdict["measured"] == p99 and verdict["set_at"] is None
    [quick] = suite.goals({"partitions": _figures(p99, 10_000)}, dict(Sizes.quick().__dict__))
    assert quick["met"] is None and quick["set_at"] == "100,000 partitions"


def test_quick_mode_measures_up_to_10000_partitions_and_the_default_up_to_100000():
    from bench import durable_partitions

    assert durable_partitions.counts(Sizes().partitions_max) == [1, 1_000, 10_000, 100_000]
    assert durable_partitions.counts(Sizes.quick().partitions_max) == [1, 1_000, 10_000]
    assert durable_partitions.counts(200) == [1, 200]
    assert Sizes().partitions_effect_rows == durable_partitions.EFFECT_ROWS == 1_000_000
    assert Sizes.quick().partitions_effect_rows == 10_000


PEERS = {
    "results": {"postgres": {"fired_per_s": 9_000.0}},
    "fleet": {"runners_1": {"runners": 1, "budget": "default", "fired_per_s": 14_676.0},
              "runners_4": {"runners": 4, "budget": "default", "fired_per_s": 21_755.0},
              "runners_4_large": {"runners": 4, "budget": "large", "fired_per_s": 23_000.0}},
    "pgqueuer": {"version": "1.6.0", "rounds": 3, "results": {
        f"workers_{w}_batch_{b}": {"workers": w, "batch_size": b, "timers": 10_000, "fired_per_s": fired}
        for w, b, fired in ((1, 100, 15_826.0), (4, 100, 20_652.0), (1, 10, 6_660.0), (4, 10, 9_713.0))}},
}


@pytest.fixture
def drawn():
    pytest.importorskip("matplotlib")
    from bench import plot

    figures = {"workloads": {"partitions": _figures(9.0, 100_000), "durable": PEERS}}
    out = plot.charts(figures)
    yield out
    import matplotlib.pyplot as plt

    for fig in out.values():
        plt.close(fig)


def test_partitions_chart_plots_p50_and_p99_against_partitions_on_a_log_axis(drawn):
    """A line per backend and percentile, through every measured count, on a log x axis ticked at
    those counts; the y axis is linear from zero."""
    ax = drawn["partitions"].axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines}
    assert lines == {"sqlite p50": ([1, 1_000, 100_000], [4.0] * 3),
                     "sqlite p99": ([1, 1_000, 100_000], [8.0, 8.0, 9.0])}
    assert [label.get_text() for label in ax.get_xticklabels()] == ["1", "1,000", "100,000"]


def test_peers_chart_puts_our_fleet_next_to_pgqueuer_by_runner_count(drawn):
    """Fired/s against runner processes: our fleet at its default budget, and pgqueuer at each batch size."""
    ax = drawn["peers"].axes[0]
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines}
    assert lines == {"timerwheel_c fleet": ([1, 4], [14_676.0, 21_755.0]),
                     "pgqueuer 1.6.0, batch 10": ([1, 4], [6_660.0, 9_713.0]),
                     "pgqueuer 1.6.0, batch 100": ([1, 4], [15_826.0, 20_652.0])}
    assert ax.get_ylim()[0] == 0


def test_without_the_pgqueuer_comparison_there_is_no_peers_chart_and_one_line_says_why():
    pytest.importorskip("matplotlib")
    from bench import plot

    figures = {"workloads": {"durable": {**PEERS, "pgqueuer": {"missing": "no PostgreSQL server (--pg-dsn)"}}}}
    out = plot.charts(figures)
    try:
        assert "peers" not in out and "durable" in out
    finally:
        import matplotlib.pyplot as plt

        for fig in out.values():
            plt.close(fig)
    assert plot.notes(figures) == ["no peers chart: pgqueuer not compared: no PostgreSQL server (--pg-dsn)"]


def test_the_bench_says_in_one_line_why_it_drew_no_peers_chart(monkeypatch, capsys, tmp_path):
    """``--only durable --plot`` without a server (the measurement replaced; nothing timed) draws
    durable.png, no peers.png, and prints one line saying why."""
    pytest.importorskip("matplotlib")
    from bench import durable

    monkeypatch.setattr(durable, "run", lambda n_timers, dsn=None, progress=None: {
        "sqlite": {"fired_per_s": 6000.0, "lateness_ms": [1.0]}})
    monkeypatch.delenv("TIMERWHEEL_C_STORE", raising=False)
    assert cli.main(["--only", "durable", "--plain", "--no-progress", "--plot", str(tmp_path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "peers chart" in line]
    assert len(lines) == 1 and lines[0].startswith("no peers chart: pgqueuer not compared: ")
    assert (tmp_path / "durable.png").exists() and not (tmp_path / "peers.png").exists()

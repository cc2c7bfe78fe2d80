"""The bench CLI end to end, in a tiny mode: figures, fired-set checks, options, fallbacks.

None of these tests asserts a speed: figures are only checked to exist and be positive.
"""
from __future__ import annotations

import json
import sys

import pytest

import timerwheel_c
from bench import cli
from bench import impls, workloads

TIMER = ["churn", "expiry", "rto", "gap"]
TINY = ["--scale", "0.002", "--repeat", "1", "--no-progress", "--plain"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One tiny run of the in-process workloads, shared by the checks below."""
    path = tmp_path_factory.mktemp("bench") / "figures.json"
    status = cli.main(TINY + ["--only", ",".join(TIMER + ["memory"]), "--json", str(path)])
    return status, json.loads(path.read_text())


def test_tiny_run_succeeds_and_writes_every_figure(tiny_run):
    """Every available implementation gets a median, min, max, quartiles and raw samples per variant.

    Deterministic: the simulated clock and seeded inputs make each run the same; only
    the figures' values vary, and they are checked only to be positive.
    """
    status, figures = tiny_run
    assert status == 0, figures["failed"]
    assert figures["failed"] == {} and figures["skipped"] == {}
    for key in ("cpu", "logical_cpus", "python", "numpy", "IMPLEMENTATION", "timerwheel_c_path"):
        assert key in figures["machine"]
    ran = figures["implementations"]["run"]
    assert (impls.C_WHEEL in ran) == (timerwheel_c.IMPLEMENTATION == "c")
    for name in TIMER:
        results = figures["workloads"][name]["results"]
        stats = [cell for cells in results.values() for cell in cells.values() if isinstance(cell, dict)]
        assert stats, name
        for cell in stats:
            assert cell["median_ns_per_op"] > 0 and len(cell["samples_ns_per_op"]) == 1
            assert cell["min_ns_per_op"] <= cell["median_ns_per_op"] <= cell["max_ns_per_op"]
        for impl in ran:
            if impl != impls.FLOOR or name == "churn":
                assert impl in results, (name, impl)
    memory = figures["workloads"]["memory"]["results"]
    assert set(memory) == {i for i in ran if i != impls.FLOOR}
    assert all(m["bytes_per_timer"] > 0 for m in memory.values())


def test_fired_sets_are_checked_equal_across_implementations(tiny_run):
    """Each workload's checked runs produce one and the same (tick, token) digest.

    Each digest is computed only after the run matched the model; equal digests show
    the implementations fired the same set at the same ticks.
    """
    _, figures = tiny_run
    for name in TIMER:
        digests = figures["workloads"][name]["fired_digests"]
        by_variant: dict = {}
        for impl, cells in digests.items():
            for variant, digest in cells.items():
                by_variant.setdefault(variant, {})[impl] = digest
        # Not vacuous: some variant of every workload was checked on several implementations.
        assert max(len(per_impl) for per_impl in by_variant.values()) >= 3, (name, by_variant)
        for variant, per_impl in by_variant.items():
            assert len(set(per_impl.values())) == 1, (name, variant, per_impl)


def test_churn_goals_are_judged_in_the_json(tiny_run):
    """The churn ratios against the floor, the pure twin and asyncio are in the JSON (values
    unchecked): each verdict has its goal and the measured ratio; measured at a tiny scale, not the
    size the goals are set for, none is judged (met None, set_at naming that size)."""
    _, figures = tiny_run
    if impls.C_WHEEL not in figures["implementations"]["run"]:
        pytest.skip("the C wheel is not built here")
    churn = {v["name"]: v for v in figures["goals"] if v["workload"] == "churn"}
    for key in ("C reschedule / empty method", "pure / C (reschedule)", "asyncio cancel+call_later / C reschedule"):
        assert churn[key]["measured"] > 0 and churn[key]["met"] is None
        assert churn[key]["set_at"] == "100,000 connections, 1,000,000 ops"
        assert churn[key]["goal"].startswith(("<= ", ">= "))


class _DropsOne(impls.HeapqTimers):
    """A wrong timer structure: it loses the third timer it would fire."""

    __slots__ = ("_fired_count",)

    def __init__(self, now_ms=0):
        super().__init__(now_ms)
        self._fired_count = 0

    def advance(self, now_ms, out=None):
        out = [] if out is None else out
        start = len(out)
        super().advance(now_ms, out)
        for i in range(start, len(out)):
            self._fired_count += 1
            if self._fired_count == 3:
                del out[i]
                break
        return out


def test_a_wrong_implementation_fails_the_run(monkeypatch, capsys):
    """A structure that loses one timer makes the bench exit 3 naming it: a fast wrong answer can't win."""
    wrong = impls.Impl("wrong", "wheel", _DropsOne)
    monkeypatch.setattr("bench.cli.available", lambda: ([wrong], {}))
    status = cli.main(TINY + ["--only", "rto"])
    out = capsys.readouterr().out
    assert status == 3
    assert "fired set mismatch" in out and "rto/wrong" in out


def test_check_fired_rejects_late_duplicate_and_disordered():
    """The checker catches a wrong tick, a double fire and a due-order violation within one advance."""
    import numpy as np

    from bench.harness import Fired, FiredMismatch, check_fired

    due = np.array([5, 3, 9])
    expected = np.array([5, 5, -1])
    check_fired("ok", Fired([1, 0], [2], [5]), due, expected)
    with pytest.raises(FiredMismatch, match="fired at tick 6"):
        check_fired("late", Fired([1, 0], [1, 2], [5, 6]), due, expected)
    with pytest.raises(FiredMismatch, match="fired 2 times"):
        check_fired("dup", Fired([1, 0, 0], [3], [5]), due, expected)
    with pytest.raises(FiredMismatch, match="cancelled"):
        check_fired("cancelled", Fired([1, 0, 2], [3], [5]), due, np.array([5, 5, -1]))
    with pytest.raises(FiredMismatch, match="within one advance"):
        check_fired("order", Fired([0, 1], [2], [5]), due, expected)


def test_unavailable_workload_is_a_clear_not_available_line(monkeypatch, capsys):
    """A workload whose measurement raises NotAvailable is skipped with a 'not available' line, exit 0."""
    from bench import durable, lateness, network
    from bench.harness import NotAvailable

    def unavailable(*args, **kwargs):
        raise NotAvailable("needs something this machine lacks")

    for module in (lateness, durable, network):
        monkeypatch.setattr(module, "run", unavailable)
    status = cli.main(TINY + ["--only", "lateness,durable,network"])
    out = capsys.readouterr().out
    assert status == 0
    for name in ("lateness", "durable", "network"):
        assert f"{name}: not available: needs something this machine lacks" in out


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch, capsys, tmp_path):
    """--plot with matplotlib missing exits 2 before running anything, naming the extra to install."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    status = cli.main(TINY + ["--only", "churn", "--plot", str(tmp_path)])
    assert status == 2
    assert "pip install 'timerwheel_c[plot]'" in capsys.readouterr().err


def test_plot_draws_pngs(tmp_path):
    """--plot writes one PNG per timer workload, non-empty."""
    pytest.importorskip("matplotlib")
    status = cli.main(TINY + ["--only", "rto,gap", "--plot", str(tmp_path)])
    assert status == 0
    for name in ("rto", "gap"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000


def test_bad_scale_is_a_usage_error(capsys):
    """--scale 0 exits 2 naming the value, before running anything."""
    assert cli.main(["--scale", "0", "--only", "churn"]) == 2
    assert "--scale must be > 0, got 0.0" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--only", "churn,bogus"], "unknown workload 'bogus'"),
    (["--repeat", "0"], "--repeat takes a positive int, got 0"),
    (["--repeat", "x"], "--repeat takes a positive int, got 'x'"),
])
def test_bad_options_are_usage_errors(argv, message, capsys):
    """Bad option values exit 2 with argparse's message naming the value."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_scaled_sizes_shrink_counts_not_below_ten():
    """--scale multiplies counts, never below 10, and keeps the simulated times."""
    tiny = workloads.Sizes().scaled(1e-9)
    assert tiny.churn_conns == 10 and tiny.expiry_timers == 10
    assert tiny.churn_idle_ms == workloads.Sizes().churn_idle_ms


def test_sibling_workloads_render_and_serialize(monkeypatch, tmp_path, capsys):
    """Lateness, durable and network figures (numpy values included) reach the tables and the JSON.

    The measurements are replaced by fakes with the agreed contracts, so the test
    checks this CLI's side only, with fixed numbers and no timing.
    """
    import numpy as np

    from bench import durable, lateness, network

    calls = []

    def lateness_run(samples, delay_ms=2.0, progress=None):
        progress(1, 2)
        calls.append(("lateness", samples, delay_ms))
        return {"time.sleep": np.array([50_000, 60_000, 70_000]), "ReleaseTimer (c)": [55_000, 65_000]}

    def durable_run(n_timers, dsn=None, progress=None):
        progress(3)
        calls.append(("durable", n_timers, dsn))
        return {"sqlite": {"fired_per_s": np.float64(6000.0), "lateness_ms": [1.0, 2.0, 30.0]}}

    def network_run(connections, seconds, progress=None):
        progress(50)
        calls.append(("network", connections, seconds))
        fig = {"requests_per_s": 1e4, "latency_us": [100, 200], "cpu_ns_per_request": 5000,
               "idle_closes_expected": 4, "idle_closes_fired": 4, "idle_close_lateness_ms": [0.5, 1.5],
               "early_closes": 0, "unexpected_closes": 0}
        return {"call_later": fig, "WheelScheduler": dict(fig, cpu_ns_per_request=2500)}

    for module, run in ((lateness, lateness_run), (durable, durable_run), (network, network_run)):
        monkeypatch.setattr(module, "run", run)
    # The fake durable run takes the DSN without connecting: so does the preflight here.
    monkeypatch.setattr("bench.preflight.check_postgres", lambda dsn: calls.append(("preflight", dsn)))
    path = tmp_path / "f.json"
    status = cli.main(TINY + ["--only", "lateness,durable,network", "--pg-dsn", "postgresql://x/y",
                              "--json", str(path)])
    out = capsys.readouterr().out
    assert status == 0, out
    assert [c[0] for c in calls] == ["preflight", "lateness", "durable", "network"]
    assert calls[0][1] == calls[2][2] == "postgresql://x/y"
    w = json.loads(path.read_text())["workloads"]
    assert w["lateness"]["results"]["time.sleep"]["summary_us"]["p50"] == 60.0
    assert w["lateness"]["results"]["time.sleep"]["lateness_ns"] == [50_000, 60_000, 70_000]
    assert w["durable"]["results"]["sqlite"]["fired_per_s"] == 6000.0
    assert w["network"]["results"]["WheelScheduler"]["latency_summary_us"]["n"] == 2
    for title in ("lateness of 2 ms deadlines", "durable:", "network:", "WheelScheduler", "0.5x"):
        assert title in out


def test_runs_as_plain_text_without_rich(monkeypatch, capsys):
    """Without rich (the 'bench' extra) the tables print as plain text and progress as lines on stderr."""
    monkeypatch.setattr("bench.report.Console", None)
    status = cli.main(["--scale", "0.002", "--repeat", "1", "--only", "gap"])
    captured = capsys.readouterr()
    assert status == 0
    assert "long gap:" in captured.out and "implementation" in captured.out
    assert "bench: running gap" in captured.err


def test_json_figures_do_not_depend_on_printing(monkeypatch, tmp_path):
    """The figures are built before any table prints: with printing disabled, --json still holds them."""
    monkeypatch.setattr("bench.cli._print", lambda rep, figures: None)
    path = tmp_path / "f.json"
    assert cli.main(TINY + ["--only", "gap,memory", "--json", str(path)]) == 0
    w = json.loads(path.read_text())["workloads"]
    assert w["gap"]["results"] and w["memory"]["results"] and w["memory"]["timers"] > 0


def test_one_percentile_definition():
    """Every summary is numpy's default percentile (linear interpolation), in the samples' unit."""
    import numpy as np

    from bench.harness import summary

    values = [5.0, 1.0, 3.0, 2.0, 4.0, 100.0]
    s = summary(values)
    assert s == {"n": 6, "min": 1.0, "p50": float(np.percentile(values, 50)),
                 "p95": float(np.percentile(values, 95)), "p99": float(np.percentile(values, 99)), "max": 100.0}
    assert summary([]) == {"n": 0}


@pytest.mark.parametrize("use_rich", [True, False], ids=["rich", "plain"])
def test_text_with_brackets_prints_as_written(capsys, use_rich):
    """rich reads ``[peers]`` as markup: every line, title, header, cell and note the bench prints is
    escaped, so ``pip install ".[peers]"`` stays a command one can paste."""
    if use_rich:
        pytest.importorskip("rich")
    from bench.report import Reporter

    rep = Reporter(use_rich=use_rich, show_progress=False)
    rep.line('pip install ".[peers]"')
    rep.table("peers [pgqueuer]", ["[a]", "b"], [['".[peers]"', "[1]"]], notes=["needs .[peers]"])
    out = capsys.readouterr().out
    for text in ('pip install ".[peers]"', "peers [pgqueuer]", "[a]", '".[peers]"', "[1]", "needs .[peers]"):
        assert text in out, (text, out)

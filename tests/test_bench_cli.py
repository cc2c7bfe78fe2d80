"""The bench CLI end to end, in a tiny mode: figures, fired-set checks, options, fallbacks.

None of these tests asserts a speed: figures are only checked to exist and be positive.
"""
from __future__ import annotations

import json
import sys

import pytest

from timerwheel_c import cli
from timerwheel_c.bench import impls, workloads

TIMER = ["churn", "expiry", "rto", "gap"]
TINY = ["bench", "--scale", "0.002", "--repeat", "1", "--no-progress", "--plain"]


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
    for key in ("cpu", "logical_cpus", "python", "numpy", "IMPLEMENTATION", "cython_at_build"):
        assert key in figures["machine"]
    ran = figures["implementations"]["run"]
    assert impls.C_WHEEL in ran or "--no-c-extensions" in sys.argv
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
        assert by_variant, name
        for variant, per_impl in by_variant.items():
            assert len(per_impl) >= 2, (name, variant, per_impl)
            assert len(set(per_impl.values())) == 1, (name, variant, per_impl)


def test_issue2_targets_are_reported(tiny_run):
    """The churn ratios against the floor, the pure twin and asyncio are in the JSON (values unchecked)."""
    _, figures = tiny_run
    if impls.C_WHEEL not in figures["implementations"]["run"]:
        pytest.skip("the C wheel is not built here")
    t = figures["targets"]
    for key in ("C reschedule / empty method", "pure / C (reschedule)", "asyncio cancel+call_later / C reschedule"):
        assert t[key]["ratio"] > 0


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
    monkeypatch.setattr("timerwheel_c.bench.cli.available", lambda: ([wrong], {}))
    status = cli.main(TINY + ["--only", "rto"])
    out = capsys.readouterr().out
    assert status == 3
    assert "fired set mismatch" in out and "rto/wrong" in out


def test_check_fired_rejects_late_duplicate_and_disordered():
    """The checker catches a wrong tick, a double fire and a due-order violation within one advance."""
    import numpy as np

    from timerwheel_c.bench.harness import Fired, FiredMismatch, check_fired

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


def test_missing_sibling_workload_is_a_clear_not_available_line(monkeypatch, capsys):
    """A workload whose module is absent is skipped with a 'not available' line, exit 0."""
    for name in ("lateness", "durable", "network"):
        monkeypatch.setitem(sys.modules, f"timerwheel_c.bench.{name}", None)
    status = cli.main(TINY + ["--only", "lateness,durable,network"])
    out = capsys.readouterr().out
    assert status == 0
    for name in ("lateness", "durable", "network"):
        assert f"{name}: not available" in out


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch, capsys, tmp_path):
    """--plot with matplotlib missing exits 2 before running anything, naming the extra to install."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    status = cli.main(TINY + ["--only", "churn", "--plot", str(tmp_path)])
    assert status == 2
    assert "pip install 'timerwheel_c[plot]'" in capsys.readouterr().out


def test_plot_draws_pngs(tmp_path):
    """--plot writes one PNG per timer workload, non-empty."""
    pytest.importorskip("matplotlib")
    status = cli.main(TINY + ["--only", "rto,gap", "--plot", str(tmp_path)])
    assert status == 0
    for name in ("rto", "gap"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000


@pytest.mark.parametrize("argv, message", [
    (["--only", "churn,bogus"], "unknown workload 'bogus'"),
    (["--repeat", "0"], "--repeat takes a positive int, got 0"),
    (["--repeat", "x"], "--repeat takes a positive int, got 'x'"),
])
def test_bad_options_are_usage_errors(argv, message, capsys):
    """Bad option values exit 2 with argparse's message naming the value."""
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench"] + argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_scaled_sizes_shrink_counts_not_below_ten():
    """--scale multiplies counts, never below 10, and keeps the simulated times."""
    tiny = workloads.Sizes().scaled(1e-9)
    assert tiny.churn_conns == 10 and tiny.expiry_timers == 10
    assert tiny.churn_idle_ms == workloads.Sizes().churn_idle_ms

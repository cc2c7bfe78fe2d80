"""``--plot``: one chart per workload, every row labelled (a figure that does not apply reads
"n/a"), every label inside its image. Built from fixed figures in the JSON's shape, so
nothing is measured or timed here.
"""
from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from bench import plot  # noqa: E402


def _cell(median_ns: float) -> dict:
    return {"median_ns_per_op": median_ns, "min_ns_per_op": median_ns * 0.9, "max_ns_per_op": median_ns * 1.1}


def _summary(p50: float, p99: float) -> dict:
    return {"p50": p50, "p99": p99, "max": p99 * 2, "n": 100}


FIGURES = {
    "config": {"repeats": 3, "sizes": {"memory_timers": 250_000, "durable_timers": 2_000,
                                       "network_connections": 300, "network_seconds": 2.0}},
    "workloads": {
        "churn": {"title": "churn: 100 live connections", "columns": {"reschedule": "reschedule ns/op", "cancel+schedule": "c+s ns/op"},
                  "results": {"C wheel": {"reschedule": _cell(70), "cancel+schedule": _cell(400)},
                              "asyncio heap": {"reschedule": "n/a: no re-arm", "cancel+schedule": _cell(3900)}}},
        "rto": {"title": "rto", "columns": {"lifecycle": "ns/op"},
                "results": {"C wheel": {"lifecycle": _cell(180)}, "uvloop": {}}},
        "memory": {"timers": 250_000, "results": {"C wheel": {"bytes_per_timer": 33.6},
                                                  "pure twin": {"bytes_per_timer": 170.0}}},
        "lateness": {"delay_ms": 2.0, "results": {
            "ReleaseTimer (c)": {"lateness_ns": [40_000, 45_000, 90_000]},
            "ReleaseTimer (pure) + spinning thread": {"lateness_ns": [8_000_000, 9_600_000]},
            "time.sleep": {"lateness_ns": [80_000, 85_000, 150_000]}}},
        "durable": {"results": {"sqlite": {"fired_per_s": 12_000.0, "lateness_summary_ms": _summary(0.2, 0.5)},
                                "postgres": {"fired_per_s": 3_000.0, "lateness_summary_ms": {"n": 0}}},
                    "fleet": {"runners_1": {"runners": 1, "partitions": 16, "fired_per_s": 3_500.0},
                              "runners_4": {"runners": 4, "partitions": 16, "fired_per_s": 9_000.0,
                                            "takeover_s": 1.2}}},
        "aio": {"handles": 1_000, "results": {
            "WheelScheduler (C)": {"re-arm": _cell(145), "keyed re-arm": _cell(165), "bytes_per_handle": 221.0,
                                   "bytes_per_key": 82.0},
            "asyncio": {"re-arm": _cell(3_000), "bytes_per_handle": 273.0}}},
        "echo": {"results": [
            {"connections": n, "loop": "asyncio", "timers": timers, "cpu_ns_per_request": cpu,
             "cpu_ns_min": cpu * 0.9, "cpu_ns_max": cpu * 1.1}
            for n in (10, 100) for timers, cpu in (("asyncio", 70_000.0), ("WheelScheduler", 45_000.0))]},
        "network": {"results": {
            name: {"cpu_ns_per_request": cpu, "latency_summary_us": _summary(200, 900),
                   "idle_close_lateness_summary_ms": _summary(0.6, 1.0)}
            for name, cpu in (("call_later", 170_000.0), ("WheelScheduler", 160_000.0))}},
    },
}


@pytest.fixture(scope="module")
def charts():
    figures = plot.charts(FIGURES)
    yield figures
    import matplotlib.pyplot as plt

    for fig in figures.values():
        plt.close(fig)


def _texts(fig) -> list[str]:
    out = [t.get_text() for t in fig.texts]
    if fig._suptitle is not None:
        out.append(fig._suptitle.get_text())
    for ax in fig.axes:
        out += [t.get_text() for t in ax.texts] + [ax.get_title(), ax.get_xlabel()]
        out += [label.get_text() for label in ax.get_yticklabels()]
    return out


def test_every_workload_with_figures_gets_a_chart(charts):
    """Durable, aio, echo and network included: one chart per workload present in the figures."""
    assert set(charts) == {"churn", "rto", "memory", "lateness", "durable", "aio", "echo", "network"}


def test_figures_that_do_not_apply_are_labelled_na(charts):
    """A reason string keeps its reason, a missing row and an empty summary read "n/a": no blank row."""
    assert "n/a: no re-arm" in _texts(charts["churn"])
    assert "n/a" in _texts(charts["rto"]) and "uvloop" in _texts(charts["rto"])
    assert "n/a: no samples" in _texts(charts["durable"])
    assert "n/a" in _texts(charts["aio"])  # asyncio has no keyed re-arm and no bytes per key


def test_durable_chart_shows_the_fleet_when_measured(charts):
    assert "4 runner(s)" in _texts(charts["durable"]) and len(charts["durable"].axes) == 3


def test_memory_chart_says_how_many_timers(charts):
    assert any("250,000 timers" in text for text in _texts(charts["memory"]))


@pytest.mark.parametrize("name", ["churn", "rto", "memory", "lateness", "durable", "aio", "echo", "network"])
def test_every_label_fits_inside_its_image(charts, name):
    """Each axes with everything drawn around it (axis labels, tick labels, title), and the
    figure's title, lie inside the saved image: no label is cut at an edge."""
    fig = charts[name]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    width, height = fig.bbox.width, fig.bbox.height
    boxes = [(ax.get_xlabel() or ax.get_title(), ax.get_tightbbox(renderer)) for ax in fig.axes]
    if fig._suptitle is not None:
        boxes.append((fig._suptitle.get_text(), fig._suptitle.get_window_extent(renderer)))
    assert any(ax.get_xlabel() for ax in fig.axes)  # not vacuous: there are labels to check
    for what, box in boxes:
        assert box.x0 >= -1 and box.x1 <= width + 1 and box.y0 >= -1 and box.y1 <= height + 1, \
            (name, what, box, (width, height))


def test_draw_writes_one_png_per_chart(tmp_path):
    """draw() creates the missing directory (parents too) and writes non-empty PNGs."""
    out = tmp_path / "runs" / "1"
    written = plot.draw(out, FIGURES)
    assert sorted(p.name for p in written) == sorted(f"{n}.png" for n in plot.charts(FIGURES))
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000


@pytest.mark.parametrize("name", ["churn", "rto", "memory", "durable", "aio", "echo", "network"])
def test_bars_are_on_a_linear_axis_from_zero_and_say_what_bars_and_whiskers_are(charts, name):
    """Bar lengths compare as the figures do: every bar axis is linear and starts at 0; its label
    says what a bar is and whether whiskers are drawn (min to max over the repeats, or none)."""
    for ax in charts[name].axes:
        assert ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0, (name, ax.get_xlabel())
        assert "bar" in ax.get_xlabel() and "whiskers" in ax.get_xlabel(), (name, ax.get_xlabel())


@pytest.mark.parametrize("name, size", [
    ("churn", "churn"), ("memory", "250,000 timers"), ("aio", "1,000 handles"), ("echo", "10, 100 connections"),
    ("durable", "2,000 timers"), ("network", "300 connections"), ("lateness", "3 samples"),
])
def test_every_chart_states_its_sizes(charts, name, size):
    assert any(size in " ".join(text.split()) for text in _texts(charts[name])), (name, _texts(charts[name]))


def test_lateness_chart_marks_p50_and_p99_of_each_series(charts):
    """Each histogram has two vertical lines, labelled with the series' p50 and p99 (numpy's)."""
    fig = charts["lateness"]
    for ax in fig.axes:
        assert len(ax.lines) == 2
        labels = [t.get_text() for t in ax.texts]
        assert any(t.startswith(" p50 ") for t in labels) and any(t.startswith(" p99 ") for t in labels)
    assert " p50 45 us" in [t.get_text() for t in fig.axes[0].texts]  # median of 40, 45, 90 us

"""``--plot DIR``: PNG charts from the bench's JSON figures (matplotlib, the ``plot`` extra).

- ``<workload>.png``: median ns/op per implementation and variant, with min-max
  whiskers (churn, expiry, rto, gap), and bytes per timer (memory);
- ``lateness.png``: a histogram of lateness (µs) per series, its p50 and p99 marked;
- ``durable.png``: fired timers per second and due-to-committed lateness (ms) per store,
  and the PostgreSQL fleet's fired timers per second by runner count when it was measured;
- ``network.png``: server CPU per request, request latency (µs) and idle-close lateness
  (ms) per scheduler;
- ``aio.png``: ns per operation of each asyncio timer API per row, and bytes per armed
  handle and key;
- ``echo.png``: server CPU per request (ns, min-max whiskers) per loop and timer keeper,
  one series per connection count;
- ``partitions.png``: the cross-process wake-up p50 and p99 (ms) against the number of idle
  partitions, a line per backend and percentile, on a log axis of partitions;
- ``peers.png``: fired timers per second against the number of runner processes, our PostgreSQL
  fleet next to pgqueuer at each batch size (when the durable workload compared them; otherwise
  :func:`notes` says why there is no such chart).

Every bar chart is on a linear axis from zero, so bar lengths compare as the figures do (a log
axis would make a third look like a sixth). Every chart states its sizes (timers, connections,
samples) in its title, and what its bars and whiskers are in its axis label. A row whose figure
does not apply (an implementation without that operation, a series this run could not take) is
drawn as the text "n/a", never left blank.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from .report import NOT_APPLICABLE

__all__ = ["PlotUnavailable", "charts", "draw", "notes", "require"]

# One bar: (median, low, high) of a figure; or why it does not apply.
Cell = Union[tuple, str]


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def require() -> None:
    """Raise PlotUnavailable with the install command unless matplotlib imports."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise PlotUnavailable(
            "--plot needs matplotlib, which is not installed: pip install 'timerwheel_c[plot]'"
        ) from exc


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _number(value: float) -> str:
    """Plain numbers for ticks and bar labels: 1,000 rather than 10^3."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _na_label(cell: Cell) -> str:
    """``n/a`` and the reason a figure does not apply (``"n/a: no re-arm"`` stays as it is)."""
    if not isinstance(cell, str) or not cell:
        return NOT_APPLICABLE
    return cell if cell.startswith(NOT_APPLICABLE) else f"{NOT_APPLICABLE}: {cell}"


def _spread(config: dict) -> str:
    """What a bar and its whiskers are, for the timed figures of a run with ``config``."""
    return _median_of(config.get("repeats", 3), "repeat")


def _median_of(n: int, what: str) -> str:
    return f"bar: median of {n} {what}{'s' if n != 1 else ''}, whiskers: min to max"


def _panel(ax, series: dict[str, dict[str, Cell]], rows: list[str], unit: str) -> None:
    """Grouped horizontal bars on ``ax``, on a linear axis from zero: ``series[variant][row]`` is a
    Cell, rows top to bottom in ``rows`` order; a row missing from a variant, or holding a
    reason, reads "n/a". ``unit`` is the axis label (say there what the bars and whiskers are)."""
    from matplotlib import ticker

    height = 0.8 / max(1, len(series))
    for j, (variant, cells) in enumerate(series.items()):
        ys, med, low, high = [], [], [], []
        for i, row in enumerate(rows):
            cell = cells.get(row, NOT_APPLICABLE)
            if isinstance(cell, tuple):
                ys.append(i + j * height)
                med.append(cell[0])
                low.append(cell[0] - cell[1])
                high.append(cell[2] - cell[0])
            else:
                # x in axes fraction, y in data: the label sits at the axis, whatever the scale.
                ax.text(0.01, i + j * height, _na_label(cell), transform=ax.get_yaxis_transform(),
                        va="center", fontsize=7, color="0.35")
        bars = ax.barh(ys, med, height=height, xerr=[low, high], label=variant)
        ax.bar_label(bars, labels=[_number(m) for m in med], fontsize=7, padding=3)
    ax.set_yticks([i + (len(series) - 1) * height / 2 for i in range(len(rows))], rows)
    ax.set_ylim(len(rows) - 0.5 + (len(series) - 1) * height, -0.5)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(5))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: _number(v)))
    ax.margins(x=0.15)  # room for the value labels at the bars' ends
    ax.set_xlim(left=0)
    ax.set_xlabel(unit, fontsize=8)
    if len(series) > 1:
        ax.legend(fontsize=8)


def _bars(plt, title: str, unit: str, series: dict[str, dict[str, Cell]], rows: list[str]):
    """One chart of grouped bars (see :func:`_panel`)."""
    import textwrap

    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.45 * len(rows) * max(1, len(series))))
    _panel(ax, series, rows, unit)
    ax.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=9)
    return fig


def _single(value) -> Cell:
    """A figure without a spread as a bar, or n/a when the run has none."""
    return (value,) * 3 if isinstance(value, (int, float)) else NOT_APPLICABLE


def _percentiles(summaries: dict[str, dict], keys=("p50", "p99")) -> dict[str, dict[str, Cell]]:
    """``{"p50": {row: (v, v, v)}, "p99": ...}`` from ``{row: summary}``; an empty summary is n/a."""
    return {key: {row: (s[key],) * 3 if key in s else "no samples" for row, s in summaries.items()} for key in keys}


PERCENTILE_BARS = "bars: p50 and p99 of the samples (no whiskers)"
ONE_FIGURE = "bar: the one figure of the run (no whiskers)"


def _durable(plt, wl: dict, config: dict):
    """Fired/s and lateness per store; with a PostgreSQL fleet measured, its fired/s by runner count."""
    results = wl["results"]
    stores = list(results)
    fleet = {f"{f['runners']} runner(s)" + (", large budget" if f.get("budget") == "large" else ""): _single(f.get("fired_per_s"))
             for f in wl.get("fleet", {}).values()}
    fig, axes = plt.subplots(1, 3 if fleet else 2, figsize=(16 if fleet else 11, 2.0 + 0.5 * max(len(stores), len(fleet))))
    _panel(axes[0], {"fired/s": {s: _single(f.get("fired_per_s")) for s, f in results.items()}}, stores,
           f"fired timers per second\n{ONE_FIGURE}")
    _panel(axes[1], _percentiles({s: f.get("lateness_summary_ms", {}) for s, f in results.items()}), stores,
           f"due-to-committed lateness, ms\n{PERCENTILE_BARS}")
    if fleet:
        _panel(axes[2], {"fired/s": fleet}, list(fleet), f"PostgreSQL fleet: fired timers per second\n{ONE_FIGURE}")
    timers = config.get("sizes", {}).get("durable_timers")
    fig.suptitle("durable timers: a no-op handler per store" + (f", {timers:,} timers" if timers else ""), fontsize=10)
    return fig


def _network(plt, wl: dict, config: dict):
    results = wl["results"]
    names = list(results)
    fig, (cpu, lat, close) = plt.subplots(1, 3, figsize=(14, 2.0 + 0.5 * len(names)))
    _panel(cpu, {"CPU": {n: _single(f.get("cpu_ns_per_request")) for n, f in results.items()}}, names,
           f"server CPU per request, ns\n{ONE_FIGURE}")
    _panel(lat, _percentiles({n: f.get("latency_summary_us", {}) for n, f in results.items()}), names,
           f"request round trip, us\n{PERCENTILE_BARS}")
    _panel(close, _percentiles({n: f.get("idle_close_lateness_summary_ms", {}) for n, f in results.items()}), names,
           f"idle close after its timeout, ms\n{PERCENTILE_BARS}")
    for ax in (lat, close):
        ax.set_yticklabels([])
    sizes = config.get("sizes", {})
    connections, seconds = sizes.get("network_connections"), sizes.get("network_seconds")
    fig.suptitle("network: idle-timeout server on loopback, per scheduler"
                 + (f", {connections:,} connections for {seconds:g} s" if connections and seconds else ""), fontsize=10)
    return fig


def _cells(results: dict) -> dict[str, dict[str, Cell]]:
    """``{variant: {row: (median, low, high) or reason}}`` from timed cells (``median_ns_per_op``
    and its min and max) keyed row -> variant; other entries (plain numbers) are left out."""
    series: dict[str, dict[str, Cell]] = {}
    for row, cells in results.items():
        for variant, cell in cells.items():
            if isinstance(cell, dict):
                series.setdefault(variant, {})[row] = (
                    cell["median_ns_per_op"], cell["min_ns_per_op"], cell["max_ns_per_op"])
            elif isinstance(cell, str):
                series.setdefault(variant, {})[row] = cell
    return series


def _aio(plt, wl: dict, config: dict):
    results = wl["results"]
    rows = list(results)
    series = _cells(results)
    fig, (ops, size) = plt.subplots(1, 2, figsize=(15, 1.6 + 0.35 * len(rows) * max(1, len(series))),
                                    gridspec_kw={"width_ratios": [2, 1]})
    _panel(ops, series, rows, f"ns per operation (CPU time)\n{_spread(config)}")
    _panel(size, {label: {row: _single(f.get(key)) for row, f in results.items()}
                  for label, key in (("per armed handle", "bytes_per_handle"), ("per armed key", "bytes_per_key"))},
           rows, f"bytes\n{ONE_FIGURE}")
    size.set_yticklabels([])
    fig.suptitle(f"asyncio timer APIs, {wl.get('handles', 0):,} handles armed, re-armed in random order", fontsize=10)
    return fig


def _echo(plt, wl: dict, config: dict):
    runs = wl["results"]
    rows = list(dict.fromkeys(f"{r['loop']} + {r['timers']}" for r in runs))
    series: dict[str, dict[str, Cell]] = {}
    for r in runs:
        series.setdefault(f"{r['connections']:,} connections", {})[f"{r['loop']} + {r['timers']}"] = (
            r["cpu_ns_per_request"], r["cpu_ns_min"], r["cpu_ns_max"])
    counts = ", ".join(f"{n:,}" for n in dict.fromkeys(r["connections"] for r in runs))
    rate = wl.get("rate_per_s")
    return _bars(plt, f"echo server on loopback: server CPU per request, by event loop + timer keeper; {counts} "
                      f"connections" + (f", {rate:,} requests/s offered" if rate else ""),
                 f"server CPU per request, ns\n{_median_of(wl.get('repeats', 1), 'run')}",
                 series, rows)


def _lateness(plt, wl: dict):
    import numpy as np
    from matplotlib import ticker

    series = {k: v["lateness_ns"] for k, v in wl["results"].items() if v["lateness_ns"]}
    if not series:
        return None
    # Log-spaced bins shared by every series, so their shapes compare at a glance.
    top = max(max(ns) for ns in series.values()) / 1000
    bins = np.geomspace(1.0, max(top, 10.0) * 1.01, 60)
    fig, axes = plt.subplots(len(series), 1, figsize=(9, 1.4 + 1.3 * len(series)), sharex=True, squeeze=False)
    for ax, (label, ns) in zip(axes[:, 0], series.items()):
        us = np.asarray(ns, dtype=float) / 1000
        ax.hist(np.clip(us, 1.0, None), bins=bins, color="0.6")
        ax.set_xscale("log")
        ax.set_xlim(right=bins[-1] * 2.5)  # room for a percentile's label right of its line
        ax.set_ylim(bottom=0)
        # The labels at two heights, so close percentiles do not overwrite each other.
        for q, style, height in ((50, "-", 0.95), (99, "--", 0.6)):
            value = float(np.percentile(us, q))
            ax.axvline(max(value, 1.0), color="C3", linestyle=style, linewidth=1)
            ax.text(max(value, 1.0), height, f" p{q} {_number(value)} us", transform=ax.get_xaxis_transform(),
                    va="top", fontsize=7, color="C3")
        ax.yaxis.set_major_locator(ticker.MaxNLocator(3, integer=True))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.set_ylabel(label, rotation=0, ha="right", va="center", fontsize=8)
    axes[-1, 0].xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: _number(v)))
    axes[-1, 0].set_xlabel(f"lateness after a {wl.get('delay_ms', 2.0):g} ms deadline, us (log axis); "
                           "count per bin on a linear axis; red lines: p50 (solid), p99 (dashed)", fontsize=8)
    samples = max(len(ns) for ns in series.values())
    fig.suptitle(f"lateness histograms, {samples:,} samples per series; under 1 us and early wakes fall in the "
                 "first bin", fontsize=10)
    return fig


def _lines(ax, series: dict[str, tuple[list, list]], ylabel: str, styles: Optional[dict[str, dict]] = None) -> None:
    """One line with markers per ``series[label] = (xs, ys)`` (matplotlib keywords per label in
    ``styles``), on a linear y axis from zero, each point labelled with its value."""
    from matplotlib import ticker

    for label, (xs, ys) in series.items():
        (drawn,) = ax.plot(xs, ys, marker="o", label=label, **(styles or {}).get(label, {}))
        for x, y in zip(xs, ys):
            ax.annotate(_number(y), (x, y), textcoords="offset points", xytext=(0, 5), ha="center", fontsize=7,
                        color=drawn.get_color())
    ax.set_ylim(bottom=0, top=max((max(ys) for _, ys in series.values() if ys), default=1.0) * 1.2)
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: _number(v)))
    ax.set_ylabel(ylabel, fontsize=8)
    ax.legend(fontsize=8)


def _partitions(plt, wl: dict):
    """Wake-up p50 and p99 against the partition count (log axis), a line per backend and percentile."""
    from matplotlib import ticker

    series, styles = {}, {}
    for i, (backend, by_count) in enumerate(wl["results"].items()):
        counts = sorted(by_count, key=int)
        for q, linestyle in (("p50", "-"), ("p99", "--")):
            series[f"{backend} {q}"] = ([int(n) for n in counts], [by_count[n][f"{q}_ms"] for n in counts])
            styles[f"{backend} {q}"] = {"color": f"C{i}", "linestyle": linestyle}  # a colour per backend
    fig, ax = plt.subplots(figsize=(8, 4))
    _lines(ax, series, "wake-up lateness, ms (from 0); solid p50, dashed p99", styles)
    ax.set_xscale("log")
    ax.set_xticks(sorted({x for xs, _ in series.values() for x in xs}))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.margins(x=0.1)
    ax.set_xlabel("idle partitions in the store (log axis), one timer a day away in each", fontsize=8)
    ax.set_title(f"cross-process wake-up against idle partitions: p50 and p99 of {wl.get('timers', 0):,} timers "
                 "per point", fontsize=9)
    return fig


def _peers(plt, wl: dict):
    """Fired/s against runner processes: our fleet beside pgqueuer at each batch size; None unless
    the durable workload compared them."""
    peer = wl.get("pgqueuer", {})
    fleet = [f for f in wl.get("fleet", {}).values() if f.get("runners") and f.get("budget", "default") == "default"]
    if not peer.get("results") or not fleet:
        return None
    fleet.sort(key=lambda f: f["runners"])
    series = {"timerwheel_c fleet": ([f["runners"] for f in fleet], [f["fired_per_s"] for f in fleet])}
    for result in sorted(peer["results"].values(), key=lambda r: (r["batch_size"], r["workers"])):
        xs, ys = series.setdefault(f"pgqueuer {peer.get('version', '')}, batch {result['batch_size']}", ([], []))
        xs.append(result["workers"])
        ys.append(result["fired_per_s"])
    fig, ax = plt.subplots(figsize=(8, 4))
    _lines(ax, series, "fired items per second (linear axis from 0)")
    ax.set_xticks(sorted({x for xs, _ in series.values() for x in xs}))
    ax.margins(x=0.15)
    ax.set_xlabel("runner (worker) processes", fontsize=8)
    timers = next(iter(peer["results"].values())).get("timers", 0)
    ax.set_title(f"PostgreSQL: our fleet next to pgqueuer, {timers:,} no-op items all due at once, median of "
                 f"{peer.get('rounds', 1)} interleaved round(s)", fontsize=9)
    return fig


def notes(figures: dict) -> list[str]:
    """One line per chart that ``figures`` could hold but do not, saying why (the peers chart when
    the durable workload ran without the pgqueuer comparison)."""
    peer = figures.get("workloads", {}).get("durable", {}).get("pgqueuer", {})
    return [f"no peers chart: pgqueuer not compared: {peer['missing']}"] if "missing" in peer else []


def charts(figures: dict) -> dict:
    """``{workload: matplotlib Figure}``, laid out, for every chart the JSON ``figures`` hold.

    The caller owns the figures (``draw`` saves and closes them).
    """
    plt = _pyplot()
    config = figures.get("config", {})
    out = {}
    for name, wl in figures.get("workloads", {}).items():
        if name in ("churn", "expiry", "rto", "gap"):
            series: dict = {}
            for impl, cells in wl["results"].items():
                for variant, cell in cells.items():
                    series.setdefault(wl["columns"].get(variant, variant), {})[impl] = (
                        (cell["median_ns_per_op"], cell["min_ns_per_op"], cell["max_ns_per_op"])
                        if isinstance(cell, dict) else cell)
            out[name] = _bars(plt, wl["title"], f"ns per operation (CPU time)\n{_spread(config)}", series,
                              list(wl["results"]))
        elif name == "aio":
            out[name] = _aio(plt, wl, config)
        elif name == "echo":
            out[name] = _echo(plt, wl, config)
        elif name == "memory":
            cells = {impl: _single(f.get("bytes_per_timer")) for impl, f in wl["results"].items()}
            timers = wl.get("timers") or config["sizes"]["memory_timers"]
            out[name] = _bars(plt, f"bytes per pending timer, measured with {timers:,} timers pending",
                              f"bytes per timer\n{ONE_FIGURE}", {"bytes/timer": cells}, list(cells))
        elif name == "lateness":
            fig = _lateness(plt, wl)
            if fig is not None:
                out[name] = fig
        elif name == "durable":
            out[name] = _durable(plt, wl, config)
            peers = _peers(plt, wl)
            if peers is not None:
                out["peers"] = peers
        elif name == "partitions":
            out[name] = _partitions(plt, wl)
        elif name == "network":
            out[name] = _network(plt, wl, config)
    for fig in out.values():
        fig.tight_layout()
    return out


def draw(out_dir: str | Path, figures: dict) -> list[Path]:
    """Draw every chart the JSON ``figures`` hold into ``out_dir`` as ``<workload>.png``
    (the directory is created if missing, parents included); return the files written."""
    plt = _pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in charts(figures).items():
        path = out / f"{name}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written

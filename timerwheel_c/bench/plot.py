"""``--plot DIR``: PNG charts from the bench's JSON figures (matplotlib, the ``plot`` extra).

- ``<workload>.png``: median ns/op per implementation and variant, with min-max
  whiskers, on a log axis (churn, expiry, rto, gap), and bytes per timer (memory);
- ``lateness.png``: a histogram of lateness (µs) per series, log count axis.
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["PlotUnavailable", "draw", "require"]


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


def _bars(plt, path: Path, title: str, unit: str, series: dict[str, dict[str, tuple]], impls: list[str]) -> None:
    """``series[variant][impl] = (median, low, high)``: grouped horizontal bars, rows in ``impls`` order."""
    import textwrap

    fig, ax = plt.subplots(figsize=(9, 0.6 + 0.45 * len(impls) * max(1, len(series))))
    height = 0.8 / max(1, len(series))
    for j, (variant, cells) in enumerate(series.items()):
        ys = [i + j * height for i, impl in enumerate(impls) if impl in cells]
        med = [cells[impl][0] for impl in impls if impl in cells]
        err = [[m - cells[impl][1] for impl, m in zip([i for i in impls if i in cells], med)],
               [cells[impl][2] - m for impl, m in zip([i for i in impls if i in cells], med)]]
        ax.barh(ys, med, height=height, xerr=err, label=variant)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(impls))], impls)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel(unit)
    ax.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=9)
    if len(series) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw(out_dir: str | Path, figures: dict) -> list[Path]:
    """Draw every chart the JSON ``figures`` hold into ``out_dir``; return the files written."""
    plt = _pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, wl in figures.get("workloads", {}).items():
        if name in ("churn", "expiry", "rto", "gap"):
            series: dict = {}
            for impl, cells in wl["results"].items():
                for variant, cell in cells.items():
                    if isinstance(cell, dict):
                        series.setdefault(wl["columns"].get(variant, variant), {})[impl] = (
                            cell["median_ns_per_op"], cell["min_ns_per_op"], cell["max_ns_per_op"])
            path = out / f"{name}.png"
            _bars(plt, path, wl["title"], "ns per operation (log)", series, list(wl["results"]))
            written.append(path)
        elif name == "memory":
            cells = {impl: (f["bytes_per_timer"],) * 3 for impl, f in wl["results"].items()}
            path = out / "memory.png"
            _bars(plt, path, "bytes per pending timer", "bytes (log)", {"bytes/timer": cells}, list(cells))
            written.append(path)
        elif name == "lateness":
            series = {k: v["lateness_ns"] for k, v in wl["results"].items() if v["lateness_ns"]}
            if not series:
                continue
            import numpy as np

            # Log-spaced bins shared by every series, so their shapes compare at a glance.
            top = max(max(ns) for ns in series.values()) / 1000
            bins = np.geomspace(1.0, max(top, 10.0) * 1.01, 60)
            fig, axes = plt.subplots(len(series), 1, figsize=(8, 1.5 * len(series)), sharex=True, squeeze=False)
            for ax, (label, ns) in zip(axes[:, 0], series.items()):
                ax.hist(np.clip(np.asarray(ns, dtype=float) / 1000, 1.0, None), bins=bins, log=True)
                ax.set_xscale("log")
                ax.set_ylabel(label, rotation=0, ha="right", fontsize=8)
            axes[-1, 0].set_xlabel("lateness after a 2 ms deadline (us, log; under 1 us and early wakes in the first bin)")
            fig.suptitle("lateness histograms", fontsize=10)
            fig.tight_layout()
            path = out / "lateness.png"
            fig.savefig(path, dpi=120)
            plt.close(fig)
            written.append(path)
    return written

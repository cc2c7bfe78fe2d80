"""The workloads measured by sibling modules: lateness, durable and network.

Each lives in its own module beside this one (``lateness.py``, ``durable.py``,
``network.py``), imported lazily: a missing module, or one whose optional
dependency is missing, turns its workload into a "not available" line instead of
failing the run. The contracts (units in the names):

- ``lateness.run(samples, delay_ms=2.0, progress=None) -> {series: [lateness_ns, ...]}``
- ``durable.run(n_timers, dsn=None, progress=None) ->
  {"sqlite": {"fired_per_s": float, "lateness_ms": [...]}, "postgres"?: {...}}``
- ``network.run(connections, seconds, progress=None) -> {scheduler: {"requests_per_s",
  "latency_us": [...], "cpu_ns_per_request", "idle_closes_expected", "idle_closes_fired",
  "idle_close_lateness_ms": [...], "early_closes"}}``

``progress`` is called as ``progress(done, total)`` (lateness) or ``progress(k)``, k
units just completed (durable, network); :func:`progress_callback` takes both.
"""
from __future__ import annotations

import importlib

import numpy as np

__all__ = ["NotAvailable", "durable", "lateness", "network", "percentiles", "progress_callback", "progress_total",
           "require"]


class NotAvailable(Exception):
    """The workload's module, or something it needs, is not importable here."""


def require(name: str):
    """Import and return the sibling module ``name``; raise NotAvailable if it does not import."""
    try:
        return importlib.import_module(f"timerwheel_c.bench.{name}")
    except ImportError as exc:
        raise NotAvailable(f"timerwheel_c.bench.{name} is not available ({exc})") from exc


def progress_callback(bar):
    """Adapt a sibling module's progress calls to the bar.

    ``progress(done, total)`` sets the bar (lateness); ``progress(k)`` advances it by
    ``k`` units (durable, network), against a total given when the task was made, or
    an open-ended bar when none was.
    """
    def progress(done, total=None):
        if total is None:
            bar.advance(float(done))
        else:
            bar.update(float(done), float(total))
    return progress


def progress_total(name: str, sizes, dsn: str | None) -> float | None:
    """The progress units workload ``name`` will report, where its module says; else None."""
    mod = require(name)
    if name == "lateness":
        return float(sizes.lateness_samples * len(getattr(mod, "SERIES", ())) or 1)
    if name == "network" and hasattr(mod, "UNITS_PER_SCHEDULER") and hasattr(mod, "scheduler_names"):
        return float(mod.UNITS_PER_SCHEDULER * len(mod.scheduler_names()))
    return None


def percentiles(values, qs=(50, 95, 99)) -> dict:
    """``{"p50": .., "p95": .., "p99": .., "max": .., "n": ..}`` of ``values`` (same unit)."""
    arr = np.asarray(values, dtype=np.float64)
    if not len(arr):
        return {"n": 0}
    out = {f"p{q}": float(v) for q, v in zip(qs, np.percentile(arr, qs))}
    out.update(max=float(arr.max()), min=float(arr.min()), n=int(len(arr)))
    return out


def lateness(samples: int, bar) -> dict:
    """Lateness of 2 ms deadlines per series: summary in µs, and the raw ns samples."""
    series = require("lateness").run(samples, delay_ms=2.0, progress=progress_callback(bar))
    return {
        name: {"summary_us": percentiles(np.asarray(ns, dtype=np.float64) / 1000), "lateness_ns": np.asarray(ns).tolist()}
        for name, ns in series.items()
    }


def durable(n_timers: int, dsn: str | None, bar) -> dict:
    """Fired/s and due-to-committed lateness (ms) per store."""
    stores = require("durable").run(n_timers, dsn=dsn, progress=progress_callback(bar))
    return {
        store: {**fig, "lateness_summary_ms": percentiles(fig.get("lateness_ms", []))}
        for store, fig in stores.items()
    }


def network(connections: int, seconds: float, bar) -> dict:
    """Requests/s, latency (µs), CPU per request (ns) and idle closes per scheduler."""
    runs = require("network").run(connections, seconds, progress=progress_callback(bar))
    return {
        name: {
            **fig,
            "latency_summary_us": percentiles(fig.get("latency_us", [])),
            "idle_close_lateness_summary_ms": percentiles(fig.get("idle_close_lateness_ms", [])),
        }
        for name, fig in runs.items()
    }

"""``timerwheel-c bench`` (also ``python -m timerwheel_c bench``): every timer side by side.

In one process and one run it times the C wheel, its pure twin, asyncio's timer
heap, heapq with lazy deletion, uvloop (when installed) and an empty compiled
method (the floor) over the same seeded workloads; checks every implementation's
fired set against the model; prints one table per workload with ratios against the
C wheel, the machine's facts and the targets. Figures are the bench thread's
CPU time per operation, the median of ``--repeat`` runs after one warm-up run.
Exit status: 0 on success, 1 if a workload failed, 2 for a usage error, 3 if an
implementation fired a wrong set.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

from .. import _impl
from .._helptext import terminal_text
from . import external, preflight, tables, workloads
from .harness import FiredMismatch
from .impls import available
from .memory import memory
from .preflight import PreflightError
from .report import Reporter
from .workloads import Sizes

__all__ = ["WORKLOADS", "add_parser", "run"]

TIMER_WORKLOADS = ("churn", "expiry", "rto", "gap")
WORKLOADS = TIMER_WORKLOADS + ("memory", "lateness", "durable", "network")


def add_parser(sub) -> argparse.ArgumentParser:
    """Register the ``bench`` subcommand on ``sub`` (argparse subparsers)."""
    p = sub.add_parser("bench", help="run the side-by-side benchmarks", description=terminal_text(__doc__),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller workloads (a tenth or less): under a minute")
    p.add_argument("--only", metavar="WORKLOAD[,...]", type=_workload_list, default=list(WORKLOADS),
                   help=f"run only these, comma-separated, from: {', '.join(WORKLOADS)}")
    p.add_argument("--repeat", metavar="N", type=_positive_int, default=3,
                   help="timed repeats after the one warm-up run (default 3)")
    p.add_argument("--json", metavar="FILE", help="write every figure, raw samples included, to FILE")
    p.add_argument("--plot", metavar="DIR", help="draw PNG charts into DIR (needs the 'plot' extra: matplotlib)")
    p.add_argument("--pg-dsn", metavar="DSN", default=None, help="also run the durable workload on PostgreSQL")
    p.add_argument("--seed", type=int, default=20261129, help="seed of every workload's inputs")
    p.add_argument("--scale", type=float, default=1.0, metavar="F",
                   help="multiply every workload's timer, op and sample counts by F (e.g. 0.1 on a slow machine)")
    p.add_argument("--plain", action="store_true", help="plain-text tables even when rich is installed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)
    return p


def _workload_list(text: str) -> list[str]:
    names = [w.strip() for w in text.split(",") if w.strip()]
    unknown = [w for w in names if w not in WORKLOADS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown workload {', '.join(map(repr, unknown)) or repr(text)}; choose from {', '.join(WORKLOADS)}")
    return names


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--repeat takes a positive int, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--repeat takes a positive int, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    """Run the selected workloads, print the tables, write ``--json`` and ``--plot``; return the exit status."""
    from . import plot

    if args.plot is not None:
        try:
            plot.require()
        except plot.PlotUnavailable as exc:
            print(f"timerwheel-c bench: error: {exc}", file=sys.stderr)
            return 2
    if _impl.FALLBACK_REASON is not None:
        # The import already warned why (a RuntimeWarning, just above): say only what it means here.
        print("timerwheel-c bench: error: the compiled cores did not load (the RuntimeWarning above says why), "
              "and the bench compares them, so it stops here; set TIMERWHEEL_C_NO_EXTENSIONS=1 to bench "
              "the pure twins alone.", file=sys.stderr)
        return 2
    if args.scale <= 0:
        print(f"timerwheel-c bench: error: --scale must be > 0, got {args.scale}", file=sys.stderr)
        return 2
    try:
        _preflight(args)
    except PreflightError as exc:
        print(f"timerwheel-c bench: error: {exc}", file=sys.stderr)
        return 2
    sizes = Sizes.quick() if args.quick else Sizes()
    if args.scale != 1.0:
        sizes = sizes.scaled(args.scale)
    repeats = args.repeat
    impls, missing = available()
    from .machine import facts

    figures: dict = {
        "machine": facts(),
        "config": {"mode": "quick" if args.quick else "default", "repeats": repeats, "warmup_runs": 1,
                   "seed": args.seed, "scale": args.scale, "workloads": args.only, "sizes": dict(sizes.__dict__),
                   "spread": "min-max over the repeats", "clock": "time.thread_time_ns (CPU time of the bench thread)"},
        "implementations": {"run": [i.name for i in impls], "missing": missing},
        "workloads": {}, "skipped": {}, "failed": {}, "targets": {},
    }
    results: dict = {}
    status = 0
    started = time.perf_counter()
    with Reporter(use_rich=not args.plain, show_progress=not args.no_progress) as rep:
        for name in args.only:
            t0 = time.perf_counter()
            try:
                results[name] = _run_one(name, impls, sizes, repeats, args, rep)
                figures["config"].setdefault("elapsed_s_per_workload", {})[name] = round(time.perf_counter() - t0, 1)
            except FiredMismatch as exc:
                figures["failed"][name] = f"fired set mismatch: {exc}"
                status = 3
                break
            except external.NotAvailable as exc:
                figures["skipped"][name] = str(exc)
            except Exception as exc:  # a sibling workload failing must not hide the others' figures
                figures["failed"][name] = f"{type(exc).__name__}: {exc}"
                figures.setdefault("tracebacks", {})[name] = traceback.format_exc()
                print(figures["tracebacks"][name], file=sys.stderr)
                status = max(status, 1)
    figures["config"]["elapsed_s"] = round(time.perf_counter() - started, 1)
    out = Reporter(use_rich=not args.plain, show_progress=False)
    _print(out, figures, results, missing)
    if args.json is not None:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1, default=_json_default)
        out.line(f"figures written to {args.json}")
    if args.plot is not None:
        for path in plot.draw(args.plot, figures):
            out.line(f"chart written to {path}")
    return status


def _preflight(args: argparse.Namespace) -> None:
    """Check, before the first workload, what the run would otherwise fail on only at its end."""
    if args.json is not None:
        preflight.check_json_file(args.json)
    if args.plot is not None:
        preflight.check_plot_dir(args.plot)
    if args.pg_dsn is None:
        return
    if "durable" not in args.only:
        print("timerwheel-c bench: note: --pg-dsn is unused: --only leaves out the durable workload", file=sys.stderr)
        return
    try:
        preflight.check_postgres(args.pg_dsn)
    except PreflightError as exc:
        # The user asked for the PostgreSQL figures: stop rather than run minutes without them.
        raise PreflightError(f"{exc}; the bench stops before any workload "
                             "(leave out --pg-dsn to bench the durable workload on SQLite only)") from exc


def _json_default(value):
    """numpy scalars and arrays from sibling modules' figures, as plain JSON."""
    import numpy as np

    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _run_one(name: str, impls, sizes: Sizes, repeats: int, args, rep: Reporter):
    if name in TIMER_WORKLOADS:
        bar = rep.task(name, workloads.steps(name, impls, repeats))
        return getattr(workloads, name)(impls, sizes, repeats, args.seed, bar)
    if name == "memory":
        return memory(impls, sizes.memory_timers, args.seed, rep.task(name, sum(not i.floor for i in impls)))
    bar = rep.task(name, external.progress_total(name, sizes, args.pg_dsn))
    if name == "lateness":
        return external.lateness(sizes.lateness_samples, bar)
    if name == "durable":
        return external.durable(sizes.durable_timers, args.pg_dsn, bar)
    return external.network(sizes.network_connections, sizes.network_seconds, bar)


def _print(rep: Reporter, figures: dict, results: dict, missing: dict) -> None:
    tables.machine_table(rep, figures["machine"], {
        "mode": figures["config"]["mode"], "repeats (after 1 warm-up)": figures["config"]["repeats"],
        "seed": figures["config"]["seed"], "elapsed s": figures["config"]["elapsed_s"]})
    for name, reason in missing.items():
        rep.line(f"{name}: not available: {reason}", "yellow")
    for name, result in results.items():
        if name in TIMER_WORKLOADS:
            tables.timer_table(rep, result)
            figures["workloads"][name] = result.to_json()
        else:
            getattr(tables, f"{name}_table")(rep, *((result, figures["config"]["sizes"]["memory_timers"])
                                                   if name == "memory" else (result,)))
            figures["workloads"][name] = {"results": result}
    figures["targets"] = tables.targets(results.get("churn"))
    if figures["targets"]:
        tables.targets_table(rep, figures["targets"])
    for name, reason in figures["skipped"].items():
        rep.line(f"{name}: not available: {reason}", "yellow")
    for name, reason in figures["failed"].items():
        rep.line(f"{name}: FAILED: {reason}", "bold red")

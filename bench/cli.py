"""``python bench/run.py``: every timer side by side, against the installed timerwheel_c.

In one process and one run it times the C wheel, its pure twin, asyncio's timer
heap, heapq with lazy deletion, uvloop (when installed) and an empty compiled
method (the floor) over the same seeded workloads; checks every implementation's
fired set against the model; prints one table per workload with ratios against the
C wheel (or the workload's reference row) and the machine's facts. Each goal (for
example a C re-arm at most 1.5x an empty compiled method, at least 10x faster than the
pure twin and 20x faster than asyncio's cancel + call_later) is shown the same way
under its workload's table and in a closing goals table: the goal, the measured value,
and met, NOT met, or n/a. Timer figures are the bench thread's CPU time per
operation, the median of ``--repeat`` runs after one warm-up run. ``--only`` runs a
subset (``--only lateness``, ``--only durable --pg-dsn URL``, ``--only network``).
Every output path, and the PostgreSQL server of ``--pg-dsn``, is checked before the
first workload.
Exit status: 0 on success; 1 if a workload failed, or the output could not be written
after the run; 2 for a usage error (one line on stderr, before anything runs); 3 if an
implementation fired a wrong set. A missed goal does not change it: goals are speeds of
this machine under its present load.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback

from timerwheel_c import _impl
from timerwheel_c._helptext import terminal_text
from timerwheel_c.durable.service.cli import STORE_ENV
from timerwheel_c.durable.service.logs import log_to_stderr
from timerwheel_c.durable.storage.redact import redact
from . import goals, plot, preflight, suite, tables
from .harness import FiredMismatch, NotAvailable
from .impls import available
from .machine import facts
from .preflight import PreflightError
from .report import Reporter
from .workloads import Sizes

__all__ = ["PROG", "WORKLOADS", "main", "parser", "run"]

WORKLOADS = tuple(w.name for w in suite.WORKLOADS)
PG_WORKLOADS = ("durable", "partitions", "fleet", "embedded", "bulk")  # the workloads --pg-dsn also runs on PostgreSQL
# The command as the README gives it, and the prefix of every line the bench prints on stderr.
PROG = "bench"


def parser() -> argparse.ArgumentParser:
    """The bench's command line."""
    p = argparse.ArgumentParser(prog="python bench/run.py", description=terminal_text(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller workloads (a tenth or less): 1 to 1.5 minutes on 2 vCPUs")
    p.add_argument("--only", metavar="WORKLOAD[,...]", type=_workload_list, default=list(WORKLOADS),
                   help=f"run only these, comma-separated, from: {', '.join(WORKLOADS)}")
    p.add_argument("--repeat", metavar="N", type=_positive_int, default=3,
                   help="timed repeats after the one warm-up run (default 3)")
    p.add_argument("--json", metavar="FILE", help="write every figure, raw samples included, to FILE")
    p.add_argument("--plot", metavar="DIR", help="draw PNG charts into DIR (needs the 'plot' extra: matplotlib)")
    p.add_argument("--pg-dsn", metavar="DSN", default=None,
                   help="also run the durable and partitions workloads on PostgreSQL, and the fleet one there (its password is masked in every output); "
                        f"default: ${STORE_ENV} when that is a postgresql:// URL (a sqlite one is ignored: "
                        "the bench makes its own SQLite files). Without a password, libpq reads PGPASSWORD or PGPASSFILE")
    p.add_argument("--seed", type=int, default=20261129, help="seed of every workload's inputs")
    p.add_argument("--scale", type=float, default=1.0, metavar="F",
                   help="multiply every workload's timer, op and sample counts by F (e.g. 0.1 on a slow machine)")
    p.add_argument("--plain", action="store_true", help="plain-text tables even when rich is installed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the bench; returns the exit status."""
    return run(parser().parse_args(argv))


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
    """Measure the selected workloads, then print the tables and write ``--json`` and ``--plot``
    from the same figures; return the exit status."""
    if args.pg_dsn is None and set(PG_WORKLOADS) & set(args.only):
        env_url = os.environ.get(STORE_ENV, "")
        if env_url.startswith(("postgresql://", "postgres://")):
            args.pg_dsn = env_url
    log_to_stderr(logging.WARNING, args.pg_dsn)
    if args.plot is not None:
        try:
            plot.require()
        except plot.PlotUnavailable as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2
    if _impl.FALLBACK_REASON is not None:
        # The import already warned why (a RuntimeWarning, just above): say only what it means here.
        print(f"{PROG}: error: the compiled cores did not load (the RuntimeWarning above says why), "
              "and the bench compares them, so it stops here; set TIMERWHEEL_C_NO_EXTENSIONS=1 to bench "
              "the pure twins alone.", file=sys.stderr)
        return 2
    if args.scale <= 0:
        print(f"{PROG}: error: --scale must be > 0, got {args.scale}", file=sys.stderr)
        return 2
    try:
        _preflight(args)
    except PreflightError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    sizes = Sizes.quick() if args.quick else Sizes()
    if args.scale != 1.0:
        sizes = sizes.scaled(args.scale)
    impls, missing = available()
    ctx = suite.Context(impls, sizes, args.repeat, args.seed, args.pg_dsn)
    figures, status = _measure(ctx, args)
    figures["implementations"] = {"run": [i.name for i in impls], "missing": missing}
    out = Reporter(use_rich=not args.plain, show_progress=False)
    _print(out, figures)
    try:
        if args.json is not None:
            with open(args.json, "w") as f:
                json.dump(figures, f, indent=1, default=_json_default)
            out.line(f"figures written to {args.json}")
        if args.plot is not None:
            for path in plot.draw(args.plot, figures):
                out.line(f"chart written to {path}")
            for note in plot.notes(figures):
                out.line(note, "yellow")
    except OSError as exc:  # checked before the run, so something changed since: a full disk, a removed directory
        print(f"{PROG}: error: writing the output failed after the run: {exc}; "
              "the tables above hold the figures", file=sys.stderr)
        return max(status, 1)
    return status


def _preflight(args: argparse.Namespace) -> None:
    """Check, before the first workload, what the run would otherwise fail on only at its end."""
    if args.json is not None:
        preflight.check_json_file(args.json)
    if args.plot is not None:
        preflight.check_plot_dir(args.plot)
    if args.pg_dsn is None:
        return
    if not set(PG_WORKLOADS) & set(args.only):
        print(f"{PROG}: note: --pg-dsn is unused: --only leaves out every workload that uses it "
              f"({', '.join(PG_WORKLOADS)})", file=sys.stderr)
        return
    try:
        preflight.check_postgres(args.pg_dsn)
    except PreflightError as exc:
        # The user asked for the PostgreSQL figures: stop rather than run minutes without them.
        raise PreflightError(f"{exc}; the bench stops before any workload "
                             "(leave out --pg-dsn to bench the durable workload on SQLite only)") from exc


def _measure(ctx: suite.Context, args: argparse.Namespace) -> tuple[dict, int]:
    """Run every selected workload; return the figures (what ``--json`` writes) and the exit status."""
    figures: dict = {
        "machine": facts(),
        "config": {"mode": "quick" if args.quick else "default", "repeats": ctx.repeats, "warmup_runs": 1,
                   "seed": ctx.seed, "scale": args.scale, "workloads": args.only,
                   "pg_dsn": None if ctx.pg_dsn is None else redact(ctx.pg_dsn),
                   "sizes": dict(ctx.sizes.__dict__), "spread": "min-max over the repeats",
                   "percentiles": "numpy.percentile, linear interpolation",
                   "clock": "time.thread_time_ns (CPU time of the bench thread)",
                   "elapsed_s_per_workload": {}},
        "workloads": {}, "skipped": {}, "failed": {}, "goals": [],
    }
    status = 0
    started = time.perf_counter()
    with Reporter(use_rich=not args.plain, show_progress=not args.no_progress) as rep:
        for name in args.only:
            workload = suite.BY_NAME[name]
            t0 = time.perf_counter()
            try:
                bar = rep.task(name, workload.steps(ctx))
                figures["workloads"][name] = workload.measure(ctx, bar)
                figures["config"]["elapsed_s_per_workload"][name] = round(time.perf_counter() - t0, 1)
            except FiredMismatch as exc:  # names implementations and tokens only: nothing to redact
                figures["failed"][name] = f"fired set mismatch: {exc}"
                status = 3
                break
            except NotAvailable as exc:
                figures["skipped"][name] = redact(str(exc), ctx.pg_dsn)
            except Exception as exc:  # a sibling workload failing must not hide the others' figures
                figures["failed"][name] = redact(f"{type(exc).__name__}: {exc}", ctx.pg_dsn)
                figures.setdefault("tracebacks", {})[name] = redact(traceback.format_exc(), ctx.pg_dsn)
                print(figures["tracebacks"][name], file=sys.stderr)
                status = max(status, 1)
    figures["config"]["elapsed_s"] = round(time.perf_counter() - started, 1)
    figures["goals"] = suite.goals(figures["workloads"], figures["config"]["sizes"])
    return figures, status


def _json_default(value):
    """numpy scalars and arrays from sibling modules' figures, as plain JSON."""
    import numpy as np

    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _print(rep: Reporter, figures: dict) -> None:
    """Every table, from the figures alone."""
    tables.machine_table(rep, figures["machine"], {
        "mode": figures["config"]["mode"], "repeats (after 1 warm-up)": figures["config"]["repeats"],
        "seed": figures["config"]["seed"], "elapsed s": figures["config"]["elapsed_s"]})
    for name, reason in figures["implementations"]["missing"].items():
        rep.line(f"{name}: not available: {reason}", "yellow")
    for name, workload_figures in figures["workloads"].items():
        suite.BY_NAME[name].table(rep, workload_figures)
        for verdict in figures["goals"]:
            if verdict["workload"] == name:
                rep.line(f"  {goals.line(verdict)}", goals.style(verdict))
    if figures["goals"]:
        rep.table("goals (each also under its workload's table)", goals.HEADERS, goals.rows(figures["goals"]),
                  [goals.summary(figures["goals"])])
    for name, reason in figures["skipped"].items():
        rep.line(f"{name}: not available: {reason}", "yellow")
    for name, reason in figures["failed"].items():
        rep.line(f"{name}: FAILED: {reason}", "bold red")

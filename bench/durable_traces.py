"""What a durable timer's fire costs with and without its OpenTelemetry span.

    python bench/run.py -m bench.durable_traces [--rounds N] [--timers N]

CPU µs per fired timer of :func:`~timerwheel_c.durable.timers.runner.run_due` draining ``--timers``
due no-op timers from an in-memory SQLite store (claims, fires and guarded commits included: what a
fire costs as a whole), in a fresh process per variant, since whether fires are traced is decided
once, at import:

- ``no otel``: opentelemetry made unimportable, as without the ``otel`` extra;
- ``otel api``: opentelemetry-api installed with no SDK (its no-op tracer), what an application
  that installed the extra but configured no tracing pays;
- ``otel sdk``: opentelemetry-sdk's tracer provider recording every span to its in-memory exporter.

The variants interleave round by round, so that the machine's drift hits all alike; medians, and
each as a ratio of ``no otel`` within the run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

__all__ = ["VARIANTS", "fire_costs"]

VARIANTS = ("no otel", "otel api", "otel sdk")

# Run in a child process: prints CPU µs per fired timer.
_CHILD = """
import sys, time
variant, n = sys.argv[1], int(sys.argv[2])
if variant == "no otel":
    sys.modules["opentelemetry"] = None
elif variant == "otel sdk":
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    trace.set_tracer_provider(provider)
from timerwheel_c.durable import SQLiteStore, schedule
from timerwheel_c.durable.timers import tracing
from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerKind, TimerRegistry
from timerwheel_c.durable.timers.runner import run_due
assert tracing.ENABLED == (variant != "no otel")

class Noop(TimerHandler):
    kind = TimerKind(1)
    def fire(self, ctx, timer):
        return Done()

store = SQLiteStore(":memory:")
now_ms = 1_800_000_000_000
for i in range(n):
    schedule(store, "p", now_ms - 1, 1, b"t%d" % i)
registry = TimerRegistry().register(Noop())
t0 = time.process_time()
fired = 0
for _ in range(n):  # ticks of the default budget until every timer fired
    fired += run_due(store, "p", registry, now_ms).fired
    if fired >= n:
        break
took = time.process_time() - t0
assert fired == n, fired
print(took / n * 1e6)
"""


def _available(variant: str) -> bool:
    module = {"no otel": None, "otel api": "opentelemetry.trace", "otel sdk": "opentelemetry.sdk.trace"}[variant]
    if module is None:
        return True
    import importlib.util
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def fire_costs(rounds: int, timers: int) -> dict:
    """``{variant: (median CPU µs per fired timer, ratio to "no otel")}`` over ``rounds`` interleaved
    rounds; a variant whose package is not installed is left out."""
    variants = [v for v in VARIANTS if _available(v)]
    samples: dict = {v: [] for v in variants}
    for _ in range(rounds):
        for variant in variants:
            done = subprocess.run([sys.executable, "-c", _CHILD, variant, str(timers)], capture_output=True,
                                  text=True, timeout=600, check=True)
            samples[variant].append(float(done.stdout))
    base = statistics.median(samples["no otel"])
    return {v: (statistics.median(s), statistics.median(s) / base) for v, s in samples.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python bench/run.py -m bench.durable_traces", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per figure (median; default 3)")
    p.add_argument("--timers", type=int, default=5_000, help="due timers drained per round (default 5000)")
    p.add_argument("--json", default=None, help="also write the figures to this path")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.timers < 1:
        p.error(f"--rounds and --timers must be >= 1, got {args.rounds} and {args.timers}")
    figures = fire_costs(args.rounds, args.timers)
    print(f"CPU µs per fired timer, {args.timers} no-op timers drained by run_due on SQLite, median of "
          f"{args.rounds} interleaved rounds; x = ratio to no otel in this run")
    for variant, (us, ratio) in figures.items():
        print(f"  {variant:8s} {us:7.1f} µs ({ratio:.2f}x)")
    missing = [v for v in VARIANTS if v not in figures]
    if missing:
        print(f"  not measured (package not installed): {', '.join(missing)}; pip install '.[otel,test]'")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({v: {"cpu_us_per_fire": us, "ratio": r} for v, (us, r) in figures.items()}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

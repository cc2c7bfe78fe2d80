"""Print lateness percentiles (us) of 2 ms deadlines for every release path, in one run.

    python bench/bench_lateness.py [--samples 300] [--delay-ms 2.0]

The measurement lives in timerwheel_c.bench.lateness (also run by `timerwheel-c bench`).
"""
from __future__ import annotations

import argparse
import platform
import sys

from timerwheel_c.bench.lateness import percentiles, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300, help="samples per series (default 300)")
    parser.add_argument("--delay-ms", type=float, default=2.0, help="deadline distance in ms (default 2.0)")
    args = parser.parse_args(argv)
    results = run(args.samples, args.delay_ms)
    print(f"lateness of {args.delay_ms} ms deadlines, {args.samples} samples per series, "
          f"Python {platform.python_version()} on {platform.machine()} {platform.system()}")
    print(f"{'series':40} {'p50 us':>9} {'p95 us':>9} {'p99 us':>9} {'max us':>9}")
    for name, samples in results.items():
        p = percentiles(samples)
        print(f"{name:40} " + " ".join(f"{p[k] / 1000:9.1f}" for k in ("p50", "p95", "p99", "max")))
    return 0


if __name__ == "__main__":
    sys.exit(main())

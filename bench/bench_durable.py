"""Print the durable-timer figures: fired/s on SQLite and fire lateness p50/p99 while the service runs.

    python bench/bench_durable.py [--timers N] [--dsn postgresql://...]
"""
import argparse
import statistics

from timerwheel_c.bench.durable import run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timers", type=int, default=5000)
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args()
    for backend, r in run(args.timers, args.dsn).items():
        lat = sorted(r["lateness_ms"])
        q = statistics.quantiles(lat, n=100) if len(lat) > 1 else lat * 99
        print(f"{backend}: fired/s {r['fired_per_s']:,.0f}   lateness ms p50 {q[49]:.2f}  p99 {q[98]:.2f}"
              f"  max {lat[-1]:.2f}  (n={len(lat)})")


if __name__ == "__main__":
    main()

"""Loopback load benchmark: idle timeouts on call_later vs WheelScheduler (and uvloop).

    python bench/bench_network.py                 # 2000 connections, 5 s per scheduler
    python bench/bench_network.py --quick         # 500 connections, 2 s per scheduler

Prints requests/s, round-trip latency p50/p99 (µs), server CPU ns per request and its
ratio to call_later on the same loop, idle closes fired/expected with their lateness
(ms past the deadline, server loop clock) and early closes (must be 0). See
:mod:`timerwheel_c.bench.network` for the workload.
"""
import argparse
import sys

from timerwheel_c.bench import network


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=5.0, help="measured run per scheduler (s)")
    parser.add_argument("--idle-timeout-ms", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="500 connections for 2 s")
    args = parser.parse_args(argv)
    if args.quick:
        args.connections, args.seconds = 500, 2.0
    results = network.run(args.connections, args.seconds, args.idle_timeout_ms)
    print(f"{args.connections} loopback connections, {args.seconds:g} s each, "
          f"idle timeout {args.idle_timeout_ms} ms, {network.SILENT_FRACTION:.0%} fall silent")
    print(network.format_table(results))
    print("idle closes seen by the client (real time, vs its own send; uvloop's loop clock "
          "trails real time by up to 1-2 ms):")
    for name, r in results.items():
        late = r["client_idle_close_lateness_ms"]
        print(f"  {name:<22} early {r['client_early_closes']:>4}, earliest "
              f"{min(late, default=float('nan')):+.3f} ms, client CPU "
              f"{r['client_cpu_ns_per_request']:.0f} ns/request")
    return 1 if any(r["early_closes"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

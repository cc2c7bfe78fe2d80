"""Issue 2's wheel benchmark: churn and expiry for the C wheel, the pure twin, asyncio's heap,
heapq with lazy deletion (and uvloop when installed), against the empty-method floor.

A thin front for ``python -m timerwheel_c bench --only churn,expiry``; any other bench
option passes through, e.g. ``python bench/bench_wheel.py --quick --json wheel.json``.
Run it against the installed package (``pip install ".[bench]"``).
"""
import sys

from timerwheel_c.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--only", "churn,expiry", *sys.argv[1:]]))

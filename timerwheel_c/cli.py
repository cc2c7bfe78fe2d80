"""The ``timerwheel-c`` command (also ``python -m timerwheel_c``).

Each subcommand lives beside the concept it drives and registers itself through
``add_parser(subparsers)``; this module only dispatches.
"""
from __future__ import annotations

import argparse
import sys

from . import IMPLEMENTATION, __version__
from .bench import cli as bench_cli
from .durable import cli as durable_cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="timerwheel-c",
        description="timerwheel_c from the command line: the side-by-side benchmark, and a durable timer service.",
    )
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {__version__} ({IMPLEMENTATION} cores, Python {sys.version.split()[0]})")
    sub = parser.add_subparsers(dest="command", required=True)
    bench_cli.add_parser(sub)
    durable_cli.add_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

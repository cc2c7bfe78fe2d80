"""The ``timerwheel-c`` command (also ``python -m timerwheel_c``).

Each subcommand lives beside the concept it drives and registers itself through
``add_parser(subparsers)``; this module only dispatches. A subcommand's module is imported
only when the command line names it (or names none, for the overall help). The benchmarks
are not a subcommand: they live in the repository's ``bench/``, not in the installed package
(``python bench/run.py``).
"""
from __future__ import annotations

import argparse
import importlib
import io
import os
import sys

from . import __version__

#: The exit status of every subcommand (each one's --help says what it means there).
EXIT_STATUS = """\
exit status, for every subcommand:
  0  done
  1  what the command names is not there or not in a state it acts on (no such timer or
     schedule; requeue of a timer that is scheduled), or the command ended otherwise than
     asked (run: the service stopped without a signal)
  2  bad arguments, or a store that cannot be opened or read
each with one line on stderr saying why"""

# subcommand -> the module whose add_parser registers it
_COMMANDS = {"run": "timerwheel_c.durable.service.cli", "schedules": "timerwheel_c.durable.service.schedules_cli",
             "timers": "timerwheel_c.durable.service.timers_cli", "fleet": "timerwheel_c.durable.service.fleet_cli",
             "web": "timerwheel_c.durable.service.web_cli"}


class OneLineErrors(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line on stderr (``PROG: MESSAGE``), exit 2, so
    that every bad argument of every command reads alike; ``--help`` still gives the usage. Its
    subparsers, and theirs, are of its class (argparse's default), so each command's are too."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message}\n")


class _Version(argparse.Action):
    """``--version``: argparse's own, but the cores it names are loaded only when it is asked for,
    not by every command (the durable commands use none)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="show program's version number and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            from . import IMPLEMENTATION
        except (ValueError, ImportError) as exc:
            # A switch set to neither on nor off (TIMERWHEEL_C_NO_EXTENSIONS=maybe), or a core missing
            # under TIMERWHEEL_C_REQUIRE_EXTENSIONS=1: one line and exit 2, as every bad input here.
            parser.exit(2, f"{parser.prog}: {exc}\n")
        print(f"{parser.prog} {__version__} ({IMPLEMENTATION} cores, Python {sys.version.split()[0]})")
        parser.exit()


def _as_typed(arg: str) -> str:
    """``arg`` as the UTF-8 its bytes were typed in: Python decodes argv in the locale's encoding,
    which in a C locale without UTF-8 mode leaves each non-ASCII byte as a surrogate ('ü' as
    '\\udcc3\\udcbc'); bytes that are not UTF-8 stay so escaped, for the checks to name."""
    if arg.isascii() or not any("\udc80" <= c <= "\udcff" for c in arg):
        return arg
    try:
        return os.fsencode(arg).decode("utf-8")
    except (UnicodeError, ValueError):
        return arg


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the subcommand; returns its exit status."""
    if argv is None:
        argv = sys.argv[1:]
    argv = [_as_typed(arg) for arg in argv]
    for stream in (sys.stdout, sys.stderr):
        # A name the terminal's encoding cannot show is printed escaped, never an encoding error.
        if isinstance(stream, io.TextIOWrapper) and stream.errors in ("strict", "surrogateescape"):
            stream.reconfigure(errors="backslashreplace")
    parser = OneLineErrors(
        prog="timerwheel-c",
        description="timerwheel_c from the command line: a durable timer service.",
        epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True)
    named = next((arg for arg in argv if not arg.startswith("-")), None)
    for command, module in _COMMANDS.items():
        if named not in _COMMANDS or named == command:
            importlib.import_module(module).add_parser(sub)
    stdout = sys.stdout
    sys.stdout = _Output(stdout)
    command = "timerwheel-c"
    try:
        try:
            args = parser.parse_args(argv)
        finally:
            sys.stdout.flush()  # --help and --version print, then exit
        command = " ".join(filter(None, (command, args.command, getattr(args, "action", None))))
        status = args.func(args)
        sys.stdout.flush()  # here, not at exit: what a buffered line meets is this command's to report
        return status
    except BrokenPipeError:
        # The reader of stdout went away (``timerwheel-c timers list | head``): end quietly, as a
        # shell command does on SIGPIPE, with status 1 (the command ended otherwise than asked).
        _drop_output(stdout)
        return 1
    except _OutputError as exc:
        # stdout cannot be written (a full disk, ``> /dev/full``): one line, as for any other failure.
        _drop_output(stdout)
        print(f"{command}: cannot write the output: {exc.__cause__}", file=sys.stderr)
        return 1
    finally:
        sys.stdout = stdout


class _OutputError(Exception):
    """An OSError writing stdout (its ``__cause__``), told apart from any other OSError of a command."""


class _Output:
    """``stream`` (stdout), whose write and flush raise an OSError as :class:`_OutputError`, all but a
    BrokenPipeError (a reader gone, which ends the command quietly)."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _OutputError() from exc

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _OutputError() from exc

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _drop_output(stream) -> None:
    """Point ``stream``'s file at devnull, so that its flush at exit, of what it still holds, cannot fail
    again (the recipe of Python's signal docs, "Note on SIGPIPE"); an in-memory stream has no file."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    os.dup2(os.open(os.devnull, os.O_WRONLY), fd)


if __name__ == "__main__":
    sys.exit(main())

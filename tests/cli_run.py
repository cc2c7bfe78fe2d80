"""The ``timerwheel-c`` command run in the test process, seen as a test sees a subprocess.

``run_cli(*args)`` calls :func:`timerwheel_c.cli.main` with ``args``, stdout and stderr captured,
and returns a :class:`subprocess.CompletedProcess` (``returncode``, ``stdout``, ``stderr`` as
text), a ``SystemExit`` (argparse's usage errors, ``--help``, ``--version``) turned into its status.
This saves a process start-up and the package's import per call; the tests of what only a real
process shows (signals, SIGKILL, a pipe closed by its reader, logging set up at start-up) still
start one.
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
from typing import Iterator, Mapping, Optional

from timerwheel_c.cli import main


@contextlib.contextmanager
def _environ(changes: Mapping[str, Optional[str]]) -> Iterator[None]:
    """``os.environ`` with each name set to its value, or removed for None, restored afterwards."""
    saved = {name: os.environ.get(name) for name in changes}
    try:
        _set_environ(changes)
        yield
    finally:
        _set_environ(saved)


def _set_environ(values: Mapping[str, Optional[str]]) -> None:
    """Set each name of ``os.environ`` to its value, or remove it for None."""
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def run_cli(*args: str, env: Optional[Mapping[str, Optional[str]]] = None) -> subprocess.CompletedProcess:
    """``timerwheel-c ARGS`` in this process, with the environment variables of ``env`` set (a None
    value unsets one) for the call only."""
    out, err = io.StringIO(), io.StringIO()
    with _environ(env or {}), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(list(args))
        except SystemExit as exc:
            # As the interpreter exits: None is 0, an int is the status, anything else is printed and 1.
            if exc.code is None or isinstance(exc.code, int):
                status = exc.code or 0
            else:
                print(exc.code, file=err)
                status = 1
    return subprocess.CompletedProcess(["timerwheel-c", *args], status, out.getvalue(), err.getvalue())

"""What the bench checks before its first workload, so that a run of several minutes never
ends in an error it could have reported at once: every output path can be written, and the
PostgreSQL server of ``--pg-dsn`` can be reached.

Each check raises :class:`PreflightError` with one line for the user; the CLI prints it
and exits 2 before measuring anything.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from timerwheel_c.durable.storage.redact import redact

__all__ = ["PreflightError", "check_json_file", "check_plot_dir", "check_postgres"]

PG_CONNECT_TIMEOUT_S = 10


class PreflightError(Exception):
    """A bench option names something the run could not use; the message is one line."""


def check_json_file(path: str) -> None:
    """Check that ``--json`` FILE can be written, by opening it as the run will at its end.

    An existing file is opened for appending (left unchanged); a new one is created and
    removed again, so a run that fails later leaves nothing behind.

    Raises:
        PreflightError: the name is empty or a directory, its directory is missing, or
            opening it fails (permissions, a read-only or special file system such as /proc).
    """
    target = Path(path)
    if not path:
        raise PreflightError("--json needs a file name, got ''")
    if target.is_dir():
        raise PreflightError(f"--json {path!r} is a directory; give a file name")
    if not target.parent.is_dir():
        raise PreflightError(f"--json {path!r}: directory {str(target.parent)!r} does not exist")
    existed = target.exists()
    try:
        with open(target, "a"):
            pass
    except OSError as exc:
        verb = "written" if existed else "created"
        raise PreflightError(f"--json {path!r} cannot be {verb}: {exc.strerror or exc}") from exc
    if not existed:
        target.unlink()


def check_plot_dir(path: str) -> None:
    """Check that ``--plot`` DIR can hold the charts: an existing directory that accepts a new
    file, or a missing one whose nearest existing ancestor is such a directory (the charts
    create the missing levels).

    Raises:
        PreflightError: the name is empty, it or an ancestor is an existing file, or a file
            cannot be created there (permissions, a read-only or special file system).
    """
    if not path:
        raise PreflightError("--plot needs a directory name, got ''")
    existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "is an existing file" if existing == Path(path) else f"is inside {str(existing)!r}, an existing file"
        raise PreflightError(f"--plot {path!r} {what}, not a directory")
    try:
        # Creating the charts needs write permission on this directory: try it.
        fd, probe = tempfile.mkstemp(prefix=".timerwheel-c-probe-", dir=existing)
    except OSError as exc:
        raise PreflightError(f"--plot {path!r}: no file can be created in {str(existing)!r}: "
                             f"{exc.strerror or exc}") from exc
    os.close(fd)
    os.unlink(probe)


def check_postgres(dsn: str) -> None:
    """Check that ``--pg-dsn`` can be used: psycopg 3 imports and the server accepts a
    connection within ``PG_CONNECT_TIMEOUT_S`` (10 s).

    Raises:
        PreflightError: psycopg is not installed (the message gives the install command), or
            the connection fails (the message names the DSN, password redacted, and the
            server's or libpq's first line of error).
    """
    try:
        import psycopg
    except ImportError as exc:
        raise PreflightError("--pg-dsn needs psycopg 3, which is not installed: "
                             "pip install 'timerwheel_c[postgres]'") from exc
    try:
        with psycopg.connect(dsn, connect_timeout=PG_CONNECT_TIMEOUT_S):
            pass
    except psycopg.Error as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise PreflightError(f"--pg-dsn {redact(dsn)!r}: cannot connect: {redact(first_line, dsn)}") from exc

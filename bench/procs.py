"""Helper processes of the benchmarks: starting a measured server, stopping them."""
from __future__ import annotations

import contextlib
import subprocess
import tempfile
from typing import Iterator

__all__ = ["server", "stop"]


@contextlib.contextmanager
def server(cmd: list, name: str) -> Iterator[tuple]:
    """Start the server process ``cmd`` (stdin, stdout piped, text) and wait for its ``READY <port>`` line.

    Yields ``(process, port)``. On leaving, a server still running is killed; one that exited non-zero
    raises ``RuntimeError`` with the tail of its stderr, as does one that did not print ``READY``.
    ``name`` names the server in those messages.
    """
    with tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True)
        try:
            assert proc.stdin is not None and proc.stdout is not None  # both PIPE
            ready = proc.stdout.readline()
            if not ready.startswith("READY "):
                stderr.seek(0)
                raise RuntimeError(f"{name} did not start: {ready!r} {stderr.read()[-2000:]}")
            yield proc, int(ready.split()[1])
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if proc.returncode != 0:
            stderr.seek(0)
            raise RuntimeError(f"{name} failed ({proc.returncode}): {stderr.read()[-2000:]}")


def stop(procs: list, timeout_s: float = 20) -> None:
    """SIGTERM every process of ``procs`` still running, wait up to ``timeout_s`` seconds for each,
    then SIGKILL the ones left."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

"""Helper processes of the fleet benchmarks: stopping them."""
from __future__ import annotations

import subprocess

__all__ = ["stop"]


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

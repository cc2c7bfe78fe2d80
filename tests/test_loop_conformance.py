"""CPython's own asyncio suites pass on timerwheel_c's EventLoop (tests/asyncio_conformance.py,
run in a child interpreter so its substitution of asyncio's loop classes stays there).

The compiled store runs on every CPython CI builds; the pure twin's run (slow: a whole second
pass) runs in the full run only. The runner itself fails unless loops were substituted and every
real loop the suites made was an EventLoop, so a pass cannot be vacuous.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

RUNNER = Path(__file__).with_name("asyncio_conformance.py")


def _run(*args: str) -> None:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, str(RUNNER), *args], capture_output=True, text=True, env=env,
                          timeout=1200)
    tail = (proc.stdout[-6000:] + proc.stderr[-6000:])
    assert proc.returncode == 0, tail
    assert "loops made: {'EventLoop': " in proc.stdout, tail


@pytest.mark.c_extension
def test_cpython_asyncio_suites_pass_on_event_loop():
    """test_events (its loop tests on every selector), test_timeouts, test_waitfor, test_tasks,
    test_locks, test_queues, test_taskgroups, test_streams and test_sock_lowlevel pass, on the
    compiled timer store."""
    _run()


@pytest.mark.slow
def test_cpython_asyncio_suites_pass_on_event_loop_with_the_pure_twin():
    """The same suites pass with the pure-Python twin of the timer store."""
    _run("--pure")

"""CPython's own asyncio suites pass on timerwheel_c's EventLoop (tests/asyncio_conformance.py,
run in a child interpreter so its substitution of asyncio's loop classes stays there).

The compiled store runs on every CPython CI builds; the pure twin's run (slow: a whole second
pass) runs in the full run only. The runner itself fails unless loops were substituted, every
real loop the suites made was an EventLoop, and every module that built one passed, so a pass
cannot be vacuous. With TIMERWHEEL_C_CONFORMANCE_TABLE set to a file, the per-module table
(tests run, EventLoops built, verdict) is appended there: .ci/run prints it for each CPython.
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
    table = os.environ.get("TIMERWHEEL_C_CONFORMANCE_TABLE")
    proc = subprocess.run([sys.executable, str(RUNNER), *args, *(["--table", table] if table else [])],
                          capture_output=True, text=True, env=env, timeout=1800)
    tail = (proc.stdout[-8000:] + proc.stderr[-4000:])
    assert proc.returncode == 0, tail
    assert "loops made: {'EventLoop': " in proc.stdout, tail


@pytest.mark.c_extension
def test_cpython_asyncio_suites_pass_on_event_loop():
    """Every test_asyncio module of this CPython passes on the compiled timer store, or is
    reported as not covering the loop (it built no EventLoop), beyond the runner's named
    KNOWN_FAILURES."""
    _run()


@pytest.mark.slow
def test_cpython_asyncio_suites_pass_on_event_loop_with_the_pure_twin():
    """The same suites pass with the pure-Python twin of the timer store."""
    _run("--pure")

"""CPython's own asyncio suites pass on timerwheel_c's EventLoop (tests/conformance/asyncio_conformance.py,
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
# The two whole runs, minutes each, stay on one pytest-xdist worker (the README's test command), one
# after the other: their tables append to one file, and two CPython suites at once would double the
# load their timing tests see. xdist hands out its groups first, so they never land at the run's end.
WHOLE_RUN = pytest.mark.xdist_group("conformance")


def _run(*args: str) -> None:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    table = os.environ.get("TIMERWHEEL_C_CONFORMANCE_TABLE")
    proc = subprocess.run([sys.executable, str(RUNNER), *args, *(["--table", table] if table else [])],
                          capture_output=True, text=True, env=env, timeout=1800)
    tail = (proc.stdout[-8000:] + proc.stderr[-4000:])
    assert proc.returncode == 0, tail
    assert "loops made: {'EventLoop': " in proc.stdout, tail


@WHOLE_RUN
@pytest.mark.c_extension
def test_cpython_asyncio_suites_pass_on_event_loop():
    """Every test_asyncio module of this CPython passes on the compiled timer store, or is
    reported as not covering the loop (it built no EventLoop), beyond the runner's named
    KNOWN_FAILURES."""
    _run()


@WHOLE_RUN
@pytest.mark.slow
def test_cpython_asyncio_suites_pass_on_event_loop_with_the_pure_twin():
    """The same suites pass with the pure-Python twin of the timer store."""
    _run("--pure")


@pytest.mark.c_extension
def test_a_module_that_builds_no_event_loop_is_reported_as_not_covering_it(tmp_path):
    """The runner's table cannot turn an untested module into a pass: test_pep492 runs its tests
    on asyncio's BaseEventLoop with a mocked selector, so its row says it does not cover the loop
    (0 EventLoops), beside test_context's, which builds one and passes; a run of such modules
    alone fails, as no EventLoop was made. Both modules are tiny and exist on 3.9-3.14."""
    table = tmp_path / "table.txt"
    proc = subprocess.run([sys.executable, str(RUNNER), "test_pep492", "test_context", "--table", str(table)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = {line.split()[0]: line.split() for line in table.read_text().splitlines()[2:-1]}
    assert rows["test_pep492"][4] == "0" and "does not cover the loop" in " ".join(rows["test_pep492"])
    assert int(rows["test_context"][4]) > 0 and rows["test_context"][-1] == "passes"

    alone = subprocess.run([sys.executable, str(RUNNER), "test_pep492"], capture_output=True, text=True, timeout=600)
    assert alone.returncode == 1
    assert "no EventLoop was made" in alone.stdout


@pytest.mark.c_extension
def test_the_documented_uses_warn_of_nothing_deprecated(tmp_path):
    """Each way the docs give to run on EventLoop, on this CPython, runs with DeprecationWarning
    turned into an error: import, run(), asyncio.run or asyncio.Runner with loop_factory (3.11+),
    and install() where policies are not deprecated (3.9-3.13). On 3.14, where policies are, this
    proves that none of them touches a policy API; install() is then absent, as documented."""
    code = """if True:
        import asyncio, sys
        import timerwheel_c.aio as aio

        async def main():
            return type(asyncio.get_running_loop())

        assert aio.run(main()) is aio.EventLoop
        if sys.version_info >= (3, 12):
            assert asyncio.run(main(), loop_factory=aio.new_event_loop) is aio.EventLoop
        if sys.version_info >= (3, 11):
            with asyncio.Runner(loop_factory=aio.new_event_loop) as runner:
                assert runner.run(main()) is aio.EventLoop
        if sys.version_info < (3, 14):
            aio.install()
            assert asyncio.run(main()) is aio.EventLoop
        else:
            assert not hasattr(aio, "install") and not hasattr(aio, "EventLoopPolicy")
        print("ok")
    """
    # Run outside the checkout: ``-c`` puts the working directory first on sys.path.
    proc = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stdout + proc.stderr

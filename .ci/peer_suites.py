"""Other projects' asyncio test suites, run on asyncio's own loop and on timerwheel_c's EventLoop.

    python .ci/peer_suites.py [--cache DIR] [SUITE ...]      (SUITE: uvloop, anyio, tornado; default all)

Each suite's tests come from its source distribution on PyPI at the version installed here
(``pip download --no-binary <name> --no-deps <name>==<version>``, kept in ``--cache``; tornado's
ship in its package, ``tornado.test``), and run
twice, each time in a child interpreter: on asyncio's default loop, then with EventLoop
substituted for it as tests/conformance/asyncio_conformance.py does (the default policy's loop factory and
``asyncio.SelectorEventLoop``). Every event loop constructed is counted by class.

- uvloop: its AIO test classes (``uvloop._testbase.AIOTestCase``: the same tests as on uvloop,
  on ``asyncio.new_event_loop()``), with unittest;
- anyio: its pytest suite's modules that drive the loop (ANYIO_MODULES), with its own
  configuration, on the asyncio backend (debug mode on; the ``asyncio+uvloop`` and trio
  parameters are deselected: they run no asyncio loop; so are the tests needing the Internet);
- tornado: its whole suite with its own runner (``tornado.test.runtests``: warnings are errors, and
  a run that logs at INFO or above, or writes to stderr, fails), its IOLoop on asyncio's loop.

Prints a table: per suite and loop, tests passed, failed, skipped and the EventLoops built.
A test that fails on EventLoop only is run again, alone, RERUNS times on each loop in turn (as
pytest-rerunfailures retries a failure): it fails the run if it failed every time on EventLoop and
never on asyncio's loop; otherwise it is printed as flaky with both counts (socket tests that bind
fixed names, and races with worker threads, fail now and then on either loop). Exits non-zero on
such a failure, or when the EventLoop run built no EventLoop.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest
from pathlib import Path
from typing import Optional

CHECKOUT = Path(__file__).resolve().parent.parent
# Reruns of each test that failed on EventLoop alone, per loop. anyio's
# test_to_thread.py::test_asyncio_run_does_not_leak_event_loop races its worker thread and leaked the
# loop in 7 of 30 runs on asyncio's loop and 10 of 30 on EventLoop: failing all of 3 reruns on
# EventLoop while passing all 3 on asyncio's is then about a 1-in-60 chance.
RERUNS = 3
SUITES = ("uvloop", "anyio", "tornado")
# anyio's modules that drive the event loop (timers, sockets, streams, threads, subprocesses,
# signals, task groups); left out for time, as they test anyio's own layers and not the loop:
# the pytest plugin (pytester), file I/O, itertools, functools, lazy imports, worker processes
# and subinterpreters.
ANYIO_MODULES = ("test_taskgroups.py", "test_synchronization.py", "test_sockets.py", "streams",
                 "test_from_thread.py", "test_to_thread.py", "test_eventloop.py", "test_lowlevel.py",
                 "test_debugging.py", "test_subprocesses.py", "test_signals.py", "test_contextmanagers.py",
                 "test_concurrency_utils.py", "test_futures.py")
# Its parameters that run no loop of asyncio's default policy (uvloop's loop, trio), and the
# tests that need the Internet.
ANYIO_DESELECT = ["-k", "not uvloop and not trio", "-m", "not network"]


def _sources(name: str, cache: Path) -> Path:
    """The unpacked sdist of the installed ``name``, downloaded into ``cache`` once (tornado: its
    installed package, which holds its tests)."""
    if name == "tornado":
        import tornado

        return Path(tornado.__file__).parent
    version = importlib.metadata.version(name)
    root = cache / f"{name}-{version}"
    if not (root / "tests").is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        sdist = cache / f"{name}-{version}.tar.gz"
        if not sdist.exists():
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", name, "--no-deps",
                            f"{name}=={version}", "-d", str(cache)], check=True)
        with tarfile.open(sdist) as tar:
            # Only its tests and configuration: uvloop's uncompiled package must not shadow the installed one.
            members = [m for m in tar.getmembers() if m.name.split("/")[1:2] in (["tests"], ["pyproject.toml"])]
            tar.extractall(cache, members=members, filter="data")
    return root


def _child(suite: str, loop: str, source: Path, out: Path, only: Optional[list]) -> None:
    """In the child interpreter: count loops, substitute EventLoop if asked, run (the tests of
    ``only``, by id, when given; else the suite), write the outcome."""
    # A job started in the background by a non-interactive shell has SIGINT ignored, and an ignored
    # signal stays ignored in every process it starts: uvloop's signal tests, which SIGINT a child
    # of theirs, would then wait for it for ever. A handler, unlike SIG_IGN, is reset at exec.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, str(CHECKOUT / "tests" / "conformance"))
    import asyncio_conformance

    from timerwheel_c.loop import EventLoop

    made = asyncio_conformance.count_loops(EventLoop)
    if loop == "EventLoop":
        asyncio_conformance.substitute(EventLoop)
    outcome: dict[str, list[str]] = {"passed": [], "failed": [], "skipped": []}
    if suite == "uvloop":
        from uvloop import _testbase

        if loop == "EventLoop":
            # Its tests take a loop whose class is not from the asyncio package for uvloop, and check
            # uvloop's extensions there (sendto() without an address on a connected socket...);
            # EventLoop's transports are asyncio's.
            _testbase.BaseTestCase.is_asyncio_loop = lambda self: isinstance(self.loop, EventLoop)
        os.chdir(source)
        loader = unittest.TestLoader()
        tests = unittest.TestSuite(t for t in asyncio_conformance.iter_tests(loader.discover("tests", top_level_dir="."))
                                   if isinstance(t, _testbase.AIOTestCase) and (only is None or t.id() in only))
        ids = [t.id() for t in asyncio_conformance.iter_tests(tests)]
        result = unittest.TextTestRunner(verbosity=0, stream=sys.stderr).run(tests)
        failed = {t.id() for t, _ in result.failures + result.errors} | {t.id() for t in result.unexpectedSuccesses}
        skipped = {t.id() for t, _ in result.skipped}
        outcome["failed"], outcome["skipped"] = sorted(failed), sorted(skipped)
        outcome["passed"] = sorted(set(ids) - failed - skipped)
    elif suite == "tornado":
        _tornado(outcome, only)
    else:
        import pytest

        class Outcomes:
            def pytest_runtest_logreport(self, report):
                if report.when == "call" or report.outcome != "passed":
                    key = "skipped" if report.skipped else report.outcome
                    if report.nodeid not in outcome[key]:
                        outcome[key].append(report.nodeid)

        os.chdir(source)
        # looptime (installed with the test extra) registers a plugin that needs pytest-asyncio.
        pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:looptime_plugin", *ANYIO_DESELECT,
                     *(only if only is not None else (f"tests/{m}" for m in ANYIO_MODULES))],
                    plugins=[Outcomes()])
        outcome["passed"] = [t for t in outcome["passed"] if t not in outcome["failed"]]
    out.write_text(json.dumps({**outcome, "loops": dict(made)}))
    # A test may leave an executor thread blocked for good; its outcome is written, so do not
    # wait for that thread at exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _tornado(outcome: dict, only: Optional[list]) -> None:
    """tornado's suite (the tests of ``only``, by id, when given) with its own runner, each test's
    outcome kept in ``outcome``; a run that logged or wrote to stderr fails as a test of its own."""
    from asyncio_conformance import iter_tests
    from tornado.test import runtests

    made_runner = runtests.test_runner_factory

    def recording_runner(stderr):
        class Recording(made_runner(stderr)):
            def run(self, test):
                ids = {t.id() for t in iter_tests(test)}  # before the run, which drops each test it ran
                result = super().run(test)
                failed = {t.id() for t, _ in result.failures + result.errors} | {t.id() for t in result.unexpectedSuccesses}
                skipped = {t.id() for t, _ in result.skipped}
                outcome["failed"], outcome["skipped"] = sorted(failed), sorted(skipped)
                outcome["passed"] = sorted(ids - failed - skipped)
                return result
        return Recording

    runtests.test_runner_factory = recording_runner
    sys.argv = ["runtests", *(only if only is not None else ["tornado.test.runtests.all"])]
    try:
        runtests.main()
    except SystemExit as exit:
        if exit.code and not outcome["failed"]:  # it logged, or wrote to stderr, with every test passing
            outcome["failed"].append("tornado.test.runtests (logged at INFO or above, or wrote to stderr)")


def _run(suite: str, loop: str, source: Path, only: Optional[list] = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "outcome.json"
        selection = Path(tmp) / "only.json"
        selection.write_text(json.dumps(only))
        started = time.monotonic()
        proc = subprocess.run([sys.executable, __file__, "--child", suite, loop, str(source), str(out), str(selection)],
                              capture_output=True, text=True, timeout=1200)
        if not out.exists():
            sys.exit(f"{suite} on {loop}: the run ended without an outcome (exit {proc.returncode})\n"
                     f"{proc.stdout[-4000:]}{proc.stderr[-4000:]}")
        outcome = json.loads(out.read_text())
        outcome["seconds"] = time.monotonic() - started
        return outcome


def _rerun(suite: str, source: Path, test_ids: list) -> dict:
    """``{loop: {test id: failures}}`` over :data:`RERUNS` runs of ``test_ids`` on each loop, in turn."""
    failed: dict = {loop: dict.fromkeys(test_ids, 0) for loop in ("asyncio", "EventLoop")}
    for _ in range(RERUNS):
        for loop, counts in failed.items():
            outcome = _run(suite, loop, source, test_ids)
            ran = set(outcome["passed"]) | set(outcome["failed"])
            for test_id in test_ids:
                # A test the selection did not reach counts as failed: it proves nothing.
                counts[test_id] += test_id in outcome["failed"] or test_id not in ran
    return failed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suites", nargs="*", metavar="SUITE", help=f"any of {', '.join(SUITES)} (default: all)")
    parser.add_argument("--cache", type=Path, default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                        / "timerwheel-c" / "sdists", help="where the sdists are kept (default: %(default)s)")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        suite, loop, source, out, selection = args.child
        _child(suite, loop, Path(source), Path(out), json.loads(Path(selection).read_text()))
        return 0

    unknown = set(args.suites) - set(SUITES)
    if unknown:
        parser.error(f"unknown suites {sorted(unknown)}: the suites are {', '.join(SUITES)}")
    rows = [("suite", "loop", "passed", "failed", "skipped", "EventLoops", "seconds")]
    regressions = []
    for suite in args.suites or SUITES:
        source = _sources(suite, args.cache)
        label = f"{suite} {importlib.metadata.version(suite)}"
        runs = {loop: _run(suite, loop, source) for loop in ("asyncio", "EventLoop")}
        for loop, o in runs.items():
            rows.append((label, loop, str(len(o["passed"])), str(len(o["failed"])), str(len(o["skipped"])),
                         str(o["loops"].get("EventLoop", 0)), f"{o['seconds']:.0f}"))
        new_failures = sorted(set(runs["EventLoop"]["failed"]) - set(runs["asyncio"]["failed"]))
        if new_failures:
            failed = _rerun(suite, source, new_failures)
            for test_id in new_failures:
                counts = f"failed {failed['EventLoop'][test_id]} of {RERUNS} reruns on EventLoop, " \
                         f"{failed['asyncio'][test_id]} of {RERUNS} on asyncio's loop"
                if failed["EventLoop"][test_id] == RERUNS and failed["asyncio"][test_id] == 0:
                    regressions.append(f"{label}: fails on EventLoop only: {test_id} ({counts})")
                else:
                    print(f"{label}: failed on EventLoop only in the full run, flaky: {test_id} ({counts})")
        if not runs["EventLoop"]["loops"].get("EventLoop"):
            regressions.append(f"{label}: the EventLoop run built no EventLoop: the substitution did not happen")
        both = set(runs["asyncio"]["failed"]) & set(runs["EventLoop"]["failed"])
        if both:  # what this machine lacks (IPv6, say), whichever the loop
            print(f"{label}: {len(both)} tests fail on both loops, e.g. {sorted(both)[0]}")
        asyncio_only = sorted(set(runs["asyncio"]["failed"]) - both)
        if asyncio_only:
            print(f"{label}: fail on asyncio's loop only: {', '.join(asyncio_only)}")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    for line in regressions:
        print("FAIL: " + line)
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())

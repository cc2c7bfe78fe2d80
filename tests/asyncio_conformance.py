"""CPython's own asyncio tests, run on timerwheel_c's EventLoop.

    python tests/asyncio_conformance.py [--pure] [-v] [MODULE ...]

Runs the suites that ship with the interpreter (``test.test_asyncio.<MODULE>``; default: the
ones below that exist on this Python) with the loop substituted wherever the suite makes one:

- ``asyncio.SelectorEventLoop`` (what test_events' and test_sock_lowlevel's loop test classes
  instantiate, with each selector) is EventLoop;
- the default policy's loop factory is EventLoop, so ``asyncio.new_event_loop()``,
  ``asyncio.run()``, ``asyncio.Runner`` and ``IsolatedAsyncioTestCase`` make EventLoops, even
  after a test module resets the policy.

Proof that the substitution happened: every event loop constructed is counted by class; the run
fails unless some were made and every real loop made is an EventLoop. Not substituted, by
design: ``test.test_asyncio.utils.TestLoop``, a simulated clock that the suites drive by hand
(its time jumps exactly to each deadline; it replaces the clock, which is what the wheel reads),
and the mock loops of tests that check asyncio's own classes. Their counts are printed.

Tests this runner skips are listed in SKIPS below with the reason: none. The suites skip one
test themselves on a release build of CPython: test_tasks' ``test_refleaks_in_task___init__``
needs ``sys.gettotalrefcount`` (a debug build). Exits non-zero on any failure.
``--pure`` runs the pure-Python twin of the timer store instead of the compiled one.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import importlib
import sys
import time
import unittest

MODULES = ("test_events", "test_timeouts", "test_waitfor", "test_tasks", "test_locks", "test_queues",
           "test_taskgroups", "test_streams", "test_sock_lowlevel")

# test id suffix -> why it cannot pass on EventLoop (kept short: each is a real difference).
SKIPS: dict[str, str] = {}


def _install(loop_class: type) -> collections.Counter:
    """Make every asyncio loop factory the suites use build ``loop_class``; return the counter of
    loops constructed (by class name), filled as the tests run."""
    made: collections.Counter = collections.Counter()
    base_init = asyncio.BaseEventLoop.__init__

    def counting_init(self, *args, **kwargs):
        made[type(self).__name__ if not isinstance(self, loop_class) else "EventLoop"] += 1
        base_init(self, *args, **kwargs)

    asyncio.BaseEventLoop.__init__ = counting_init  # type: ignore[method-assign]
    asyncio.SelectorEventLoop = loop_class  # type: ignore[misc]
    if sys.platform != "win32":
        import asyncio.unix_events as unix_events

        unix_events.SelectorEventLoop = loop_class  # type: ignore[misc]
        unix_events._UnixDefaultEventLoopPolicy._loop_factory = loop_class  # type: ignore[attr-defined]
    return made


def _load(names: list[str]) -> unittest.TestSuite:
    suite = unittest.TestSuite()
    loader = unittest.TestLoader()
    for name in names:
        try:
            module = importlib.import_module(f"test.test_asyncio.{name}")
        except ModuleNotFoundError:
            print(f"{name}: not in this Python's test suite, skipped")
            continue
        suite.addTests(loader.loadTestsFromModule(module))
    return suite


def _apply_skips(suite: unittest.TestSuite) -> None:
    for test in _iter(suite):
        for suffix, reason in SKIPS.items():
            if test.id().endswith(suffix):
                setattr(test, test._testMethodName, unittest.skip(reason)(getattr(test, test._testMethodName)))


def _iter(suite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from _iter(item)
        else:
            yield item


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", default=list(MODULES))
    parser.add_argument("--pure", action="store_true", help="the pure-Python twin of the timer store")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)

    from timerwheel_c.loop import EventLoop

    loop_class = EventLoop
    if args.pure:
        from timerwheel_c.pure.loop import LoopTimers

        loop_class = type("EventLoop", (EventLoop,), {"_timers_class": LoopTimers})
    made = _install(loop_class)
    # Imported after the substitution: a module that binds a loop class at import sees ours.
    suite = _load(args.modules)
    _apply_skips(suite)
    started = time.monotonic()
    result = unittest.TextTestRunner(verbosity=2 if args.verbose else 1, stream=sys.stdout).run(suite)
    twin = "pure" if args.pure else "compiled"
    print(f"Python {sys.version.split()[0]}, {twin} timers: {result.testsRun} tests in "
          f"{time.monotonic() - started:.0f} s; loops made: {dict(made)}")
    ours = made["EventLoop"]
    # Loops that are not the suites' real loops: the simulated clock and asyncio's own classes
    # made directly by tests of those classes.
    others = {name: n for name, n in made.items() if name not in ("EventLoop", "TestLoop")
              and not name.startswith(("Mock", "_Mock", "BaseEventLoop", "Base"))}
    failed = not result.wasSuccessful()
    if ours == 0:
        print("FAIL: no EventLoop was made: the substitution did not happen")
        failed = True
    if others:
        print(f"FAIL: real loops other than EventLoop were made: {others}")
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""CPython's own asyncio tests, run on timerwheel_c's EventLoop, with a table per module.

    python tests/conformance/asyncio_conformance.py [--pure] [-v] [MODULE ...]

Runs the suites that ship with the interpreter (``test.test_asyncio.<MODULE>``; default: every
``test_*`` module this Python has), one module at a time, with the loop substituted wherever the
suite makes one:

- ``asyncio.SelectorEventLoop`` (what test_events' and test_sock_lowlevel's loop test classes
  instantiate, with each selector) and, from 3.13, ``asyncio.EventLoop`` (the ``loop_factory`` of
  test_taskgroups' and test_tasks' ``IsolatedAsyncioTestCase`` classes on 3.14) are EventLoop;
- the default policy's loop factory is EventLoop, so ``asyncio.new_event_loop()``,
  ``asyncio.run()``, ``asyncio.Runner`` and ``IsolatedAsyncioTestCase`` make EventLoops, even
  after a test module resets the policy;
- in the modules named in PLAIN_TEST_LOOP (test_tasks, test_futures), the loop fixture
  ``test.test_asyncio.utils.TestCase.new_test_loop()`` called without a time generator (what
  their test classes build in ``setUp``) makes an EventLoop. Such a ``TestLoop`` cannot fire a
  timer at all (its clock moves only by the generator it lacks), so its tests check no simulated
  time and run on a real loop as they are.

Not substituted, by design:

- ``new_test_loop(gen)``: ``TestLoop``'s simulated clock, whose time jumps exactly to each
  deadline as the generator says; the wheel reads the real monotonic clock, so those tests
  (most of test_tasks' sleeps and timeouts, test_queues' on 3.9) stay on ``TestLoop``;
- ``asyncio.BaseEventLoop()`` with a mocked selector (test_pep492, test_runners, parts of
  test_base_events): a loop with no I/O, where EventLoop is a selector loop whose self-pipe needs
  a real selector; and the mock loops of tests that check asyncio's own classes
  (test_selector_events, test_proactor_events, test_unix_events...).

Proof that the substitution happened: every event loop constructed is counted, per module and by
class. Each module gets a row: tests run, failures (errors included), skipped, the EventLoops and
TestLoops it built, and a verdict. A module that built no EventLoop "does not cover the loop",
whatever its results: it is never reported as passing on EventLoop.

Exits non-zero when a module that covers the loop has a failure not named in KNOWN_FAILURES, when
no EventLoop was made, or when one of asyncio's own selector loops was made (a missed
substitution). A known failure that passes is reported, so its entry can go.
``--pure`` runs the pure-Python twin of the timer store instead of the compiled one.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import importlib
import io
import pkgutil
import sys
import time
import unittest

# test id suffix -> why it fails on EventLoop today (each a real difference, fixed in the loop).
KNOWN_FAILURES: dict[str, str] = {}
# Modules whose loop fixture new_test_loop() without a generator makes an EventLoop.
PLAIN_TEST_LOOP = ("test_tasks", "test_futures")


def _modules() -> list[str]:
    import test.test_asyncio as package

    return sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.name.startswith("test_"))


def count_loops(loop_class: type) -> collections.Counter:
    """Count every asyncio event loop constructed from now on, by class name (``loop_class`` and
    its subclasses as "EventLoop"); the counter fills as the tests run."""
    made: collections.Counter = collections.Counter()
    base_init = asyncio.BaseEventLoop.__init__

    def counting_init(self, *args, **kwargs):
        made["EventLoop" if isinstance(self, loop_class) else type(self).__name__] += 1
        base_init(self, *args, **kwargs)

    asyncio.BaseEventLoop.__init__ = counting_init  # type: ignore[method-assign]
    return made


def substitute(loop_class: type) -> tuple[type, ...]:
    """Make every asyncio loop factory the suites use build ``loop_class``; return asyncio's own
    selector loop classes, which no test may build any more."""
    asyncio_loops: tuple[type, ...] = (asyncio.SelectorEventLoop,)
    asyncio.SelectorEventLoop = loop_class  # type: ignore[misc]
    if hasattr(asyncio, "EventLoop"):  # 3.13+: the platform's default loop, test_taskgroups' loop_factory
        asyncio.EventLoop = loop_class
    if sys.platform != "win32":
        import asyncio.unix_events as unix_events

        asyncio_loops += (unix_events._UnixSelectorEventLoop,)  # type: ignore[attr-defined]
        unix_events.SelectorEventLoop = loop_class  # type: ignore[misc]
        if hasattr(unix_events, "EventLoop"):
            unix_events.EventLoop = loop_class
        unix_events._UnixDefaultEventLoopPolicy._loop_factory = loop_class  # type: ignore[attr-defined]
    return asyncio_loops


@contextlib.contextmanager
def _plain_test_loop(loop_class: type):
    """``new_test_loop()`` without a generator makes a ``loop_class``, set as the test's loop and
    closed after it as a ``TestLoop`` is; with a generator it stays a ``TestLoop``."""
    from test.test_asyncio import utils

    original = utils.TestCase.new_test_loop

    def new_test_loop(self, gen=None):
        if gen is not None:
            return original(self, gen)
        loop = loop_class()
        self.set_event_loop(loop)
        return loop

    utils.TestCase.new_test_loop = new_test_loop
    try:
        yield
    finally:
        utils.TestCase.new_test_loop = original


def iter_tests(suite):
    """The test cases of a unittest suite, however nested."""
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from iter_tests(item)
        else:
            yield item


def _known(test_id: str) -> bool:
    return any(test_id.endswith(suffix) for suffix in KNOWN_FAILURES)


class Row:
    """One module's outcome: tests run, failed (beyond the known), skipped, loops built by class."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.run = self.failed = self.skipped = 0
        self.loops: collections.Counter = collections.Counter()
        self.note = ""
        self.failed_ids: list[str] = []
        self.known_failed: list[str] = []
        self.known_passed: list[str] = []

    @property
    def covers(self) -> bool:
        return self.loops["EventLoop"] > 0

    @property
    def verdict(self) -> str:
        if self.note:
            return self.note
        if not self.covers:
            return "does not cover the loop" + (f" ({self.failed} failed)" if self.failed else "")
        known = f" (known failure: {', '.join(i.rsplit('.', 1)[-1] for i in self.known_failed)})"
        return "FAILS" if self.failed else "passes" + (known if self.known_failed else "")


def _run_module(name: str, loop_class: type, made: collections.Counter, verbosity: int) -> Row:
    row = Row(name)
    try:
        module = importlib.import_module(f"test.test_asyncio.{name}")
    except unittest.SkipTest as skip:
        row.note = f"skipped by the module: {skip}"
        return row
    except ModuleNotFoundError:
        row.note = "not in this Python's test suite"
        return row
    suite = unittest.TestLoader().loadTestsFromModule(module)
    # Taken now: a suite drops its tests as it runs them.
    known_run = {t.id() for t in iter_tests(suite) if _known(t.id())}
    made.clear()
    stream = sys.stdout if verbosity > 1 else io.StringIO()
    with _plain_test_loop(loop_class) if name in PLAIN_TEST_LOOP else contextlib.nullcontext():
        result = unittest.TextTestRunner(verbosity=verbosity, stream=stream).run(suite)
    row.loops = collections.Counter(made)
    row.run, row.skipped = result.testsRun, len(result.skipped)
    failed_ids = {test.id(): text for test, text in result.failures + result.errors}
    failed_ids.update((test.id(), "unexpected success") for test in result.unexpectedSuccesses)
    row.failed_ids = sorted(i for i in failed_ids if not _known(i))
    row.failed = len(row.failed_ids)
    row.known_failed = sorted(i for i in failed_ids if _known(i))
    row.known_passed = sorted(known_run - set(failed_ids) - {t.id() for t, _ in result.skipped})
    if verbosity <= 1:
        for test_id in row.failed_ids:
            print(f"{name}: FAILED {test_id}\n{failed_ids[test_id]}")
    return row


def _table(rows: list[Row], twin: str, seconds: float) -> str:
    header = ("module", "run", "failed", "skipped", "EventLoops", "TestLoops", "verdict")
    cells = [header] + [(r.name, str(r.run), str(r.failed), str(r.skipped), str(r.loops["EventLoop"]),
                         str(r.loops["TestLoop"]), r.verdict) for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header) - 1)]
    total = sum((r.loops for r in rows), collections.Counter())
    loops = {"EventLoop": total["EventLoop"], **dict(total.most_common())}  # EventLoop first
    return "".join(
        [f"CPython {sys.version.split()[0]}, {twin} timers: {sum(r.run for r in rows)} tests in {seconds:.0f} s, "
         f"{sum(r.covers for r in rows)} of {len(rows)} modules cover the loop\n"]
        + ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)) + "  " + line[-1] + "\n" for line in cells]
        + [f"loops made: {loops}\n"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*")
    parser.add_argument("--pure", action="store_true", help="the pure-Python twin of the timer store")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--table", metavar="FILE", help="also append the table to FILE")
    args = parser.parse_args(argv)

    from timerwheel_c.loop import EventLoop

    loop_class = EventLoop
    if args.pure:
        from timerwheel_c.pure.loop import LoopTimers

        loop_class = type("EventLoop", (EventLoop,), {"_timers_class": LoopTimers})
    made = count_loops(loop_class)
    asyncio_loops = substitute(loop_class)
    names = args.modules or _modules()
    missed = {cls.__name__ for cls in asyncio_loops}
    started = time.monotonic()
    rows = []
    # Imported after the substitution: a module that binds a loop class at import sees ours.
    for name in names:
        module_started = time.monotonic()
        rows.append(_run_module(name, loop_class, made, 2 if args.verbose else 1))
        print(f"{name}: {rows[-1].run} tests, {rows[-1].verdict}, {time.monotonic() - module_started:.0f} s",
              flush=True)

    # What ran, not what was asked: without its compiled cores the package runs the pure twin.
    twin = "pure" if ".pure." in loop_class._timers_class.__module__ else "compiled"
    report = _table(rows, twin, time.monotonic() - started)
    print("\n" + report, end="")
    if args.table:
        with open(args.table, "a") as out:
            out.write(report + "\n")

    failed = False
    for row in rows:
        for test_id in row.known_passed:
            print(f"known failure now passes, drop it from KNOWN_FAILURES: {test_id}")
        if row.covers and row.failed:
            print(f"FAIL: {row.name} covers the loop and fails: {', '.join(row.failed_ids)}")
            failed = True
        wrong = {cls: n for cls, n in row.loops.items() if cls in missed}
        if wrong:
            print(f"FAIL: {row.name} built asyncio's own loops, not EventLoop: {wrong}")
            failed = True
    if not any(row.covers for row in rows):
        print("FAIL: no EventLoop was made: the substitution did not happen")
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""One suite, two implementations (after aio-libs' conftest).

Fixtures named ``<core>_impl`` hand each test the compiled module or its pure twin.
The compiled run imports the extension directly, so a broken build is an error,
never a silent pass on pure. ``--no-c-extensions`` deselects the compiled runs.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import importlib.util
import os
from pathlib import Path

import pytest

import timerwheel_c
from locations import CHECKOUT, TESTS
from pg_cluster import fresh_schema_url

# The bench's launcher: ``[sys.executable, str(BENCH_RUN), ...]`` runs it as the README does.
BENCH_RUN = CHECKOUT / "bench" / "run.py"


def bench_without(tmp_path: Path, module: str, name: str, script: str):
    """Run ``python bench/run.py -m NAME`` in ``tmp_path``, where NAME is the module ``script`` (its
    source text) and the module ``module`` cannot be imported, as in an install without the extra
    that brings it (a ``sitecustomize`` sets ``sys.modules[module] = None``); returns the completed
    process, stdout and stderr as text."""
    import subprocess
    import sys

    (tmp_path / "sitecustomize.py").write_text(f"import sys\nsys.modules[{module!r}] = None\n")
    (tmp_path / f"{name}.py").write_text(script)
    return subprocess.run([sys.executable, str(BENCH_RUN), "-m", name], cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(tmp_path)), capture_output=True, text=True,
                          timeout=120)


def _load_bench() -> None:
    """Make ``import bench`` find the checkout's bench/ as its launcher does: by location, with no
    ``sys.path`` entry for the checkout, so ``timerwheel_c`` still comes from the installed package."""
    spec = importlib.util.spec_from_file_location("_bench_launcher", BENCH_RUN)
    assert spec is not None and spec.loader is not None
    launcher = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launcher)
    launcher.load()


if BENCH_RUN.exists():  # the compiled-core tests also run from an installed wheel, without bench/
    _load_bench()


def pytest_addoption(parser):
    parser.addoption("--no-c-extensions", action="store_true", help="run only the pure-Python twins")


def pytest_configure(config):
    installed = Path(timerwheel_c.__file__).resolve()
    if (CHECKOUT / "timerwheel_c") in installed.parents:  # a venv inside the checkout is fine
        raise pytest.UsageError(
            f"tests must import the installed package, not the checkout: got {installed}; "
            "run `pip install .` and call `pytest` (not `python -m pytest`) from the checkout"
        )


def pytest_collection_modifyitems(config, items):
    if config.getoption("--no-c-extensions"):
        skip = pytest.mark.skip(reason="--no-c-extensions")
        for item in items:
            if "c_extension" in item.keywords:
                item.add_marker(skip)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _long_first(items)


# The fast tier (README.md): these tiers without the tests marked slow.
FAST_TIERS = ("cores", "loop", "durable", "project")


def _long_first(items) -> None:
    """Under pytest-xdist (the README's test command, ``-n 2 --dist loadgroup``), put every test outside
    the fast tier first, each part in its collection order. The scheduler hands out single tests in
    this order (after the ``xdist_group`` groups, which it puts first), so the tests that take seconds
    to minutes start early and the fast tier's many short tests fill the end of the run on both
    workers, instead of one worker running a long test alone at the end. Every worker collects the
    same order, as xdist requires; a run without workers keeps pytest's order."""
    def fast(item) -> bool:
        path = Path(item.path)
        tier = path.relative_to(TESTS).parts[0] if TESTS in path.parents else ""
        return tier in FAST_TIERS and item.get_closest_marker("slow") is None

    items.sort(key=fast)


def _impl_params(core: str):
    return [
        pytest.param(f"timerwheel_c._{core}", id="c", marks=pytest.mark.c_extension),
        pytest.param(f"timerwheel_c.pure.{core}", id="pure"),
    ]


def _impl_fixture(core: str, what: str):
    """The fixture ``<core>_impl``, handing each test the compiled or the pure module of ``core``
    (``what`` names it in the fixture's docstring)."""

    def impl(request):
        return importlib.import_module(request.param)

    impl.__doc__ = f"The {what} module: ``timerwheel_c._{core}`` (C) or ``timerwheel_c.pure.{core}``."
    return pytest.fixture(impl, params=_impl_params(core), name=f"{core}_impl")


wheel_impl = _impl_fixture("wheel", "wheel core")
release_impl = _impl_fixture("release", "release-timer core")
aio_impl = _impl_fixture("aio", "asyncio scheduler")
loop_impl = _impl_fixture("loop", "event loop's timer store")


@pytest.fixture
def new_wheel_loop(loop_impl):
    """A factory of ``timerwheel_c.aio.EventLoop`` loops on ``loop_impl``'s timer store
    (``selector=`` as EventLoop takes it); every loop made is closed at teardown."""
    from timerwheel_c.loop import EventLoop

    # The twin's store and its methods of EventLoop (time, call_at, call_later, call_soon).
    cls = type("EventLoop", (EventLoop,), {"_timers_class": loop_impl.LoopTimers, "time": loop_impl.time,
                                            "call_at": loop_impl.call_at, "call_later": loop_impl.call_later,
                                            "call_soon": loop_impl.call_soon})
    loop_impl.install_methods(cls)  # the compiled twin's C methods of the class, as EventLoop's own
    made = []

    def factory(selector=None):
        made.append(cls(selector))
        return made[-1]

    yield factory
    for loop in made:
        if not loop.is_closed():
            loop.close()


# A generous bound for "it ran at all" on a loaded 2-core machine, in seconds.
LIVENESS_S = 5.0


@pytest.fixture(params=["asyncio", "uvloop"])
def new_loop(request):
    """A factory of fresh event loops: the default asyncio loop, or uvloop's (skipped if absent)."""
    if request.param == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        return uvloop.new_event_loop
    return asyncio.new_event_loop


async def _until(predicate, timeout_s=LIVENESS_S):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < end, "liveness bound exceeded"
        await asyncio.sleep(0.001)


@pytest.fixture
def until():
    """``await until(predicate)`` polls ``predicate`` every ms on the running loop until it is
    true; it fails after a liveness bound of 5 s (``timeout_s=`` to change it)."""
    return _until


@pytest.fixture
def aio_run(new_loop, aio_impl):
    """``aio_run(main)`` runs ``await main(scheduler, loop)`` on a fresh loop (each of
    ``new_loop``'s) with a fresh scheduler (each of ``aio_impl``'s), closes both, and returns
    main's result; a liveness bound of 10 s covers the whole run."""
    def runner(main, timeout_s=LIVENESS_S * 2):
        loop = new_loop()
        try:
            sched = aio_impl.WheelScheduler(loop)
            try:
                return loop.run_until_complete(asyncio.wait_for(main(sched, loop), timeout_s))
            finally:
                sched.close()
        finally:
            loop.close()
    return runner


_PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")


_NEEDS_PG = pytest.mark.skipif(not _PG_DSN, reason="set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to test PostgresStore")


def _generic_apply_many(cls):
    """``cls`` with the store contract's generic ``apply_many`` (one ``apply`` per batch) instead of
    the backend's one-round-trip override: both paths must pass the same suites."""
    from timerwheel_c.durable.storage.store import Store

    return type(f"Generic{cls.__name__}", (cls,), {"_apply_many": Store._apply_many})


@pytest.fixture(scope="session")
def pg_tables():
    """This test process's :class:`pg_tables.TablePool` on the PostgreSQL test server (skipped without
    one): one per pytest-xdist worker, its tables dropped at the end of the session."""
    if not _PG_DSN:
        pytest.skip("set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to test PostgresStore")
    from pg_tables import TablePool

    pool = TablePool(_PG_DSN)
    yield pool
    pool.close()


@pytest.fixture
def pg_table(pg_tables):
    """The name of a PostgresStore table on the PostgreSQL test server that no other test holds while
    this one runs: migrated to the current version, empty, with the meta rows of a new store; emptied
    for the next test afterwards, or dropped if the test changed its schema (tests/pg_tables.py)."""
    name = pg_tables.take()
    yield name
    pg_tables.give_back(name)


@pytest.fixture(params=["sqlite-file", "sqlite-memory", "sqlite-generic-apply-many",
                        pytest.param("postgres", marks=_NEEDS_PG), pytest.param("postgres-generic-apply-many", marks=_NEEDS_PG)])
def durable_store(request, tmp_path):
    """A fresh, empty durable-timer store per backend (on PostgreSQL, a table of ``pg_table``); a new
    backend joins by adding one param."""
    if request.param.startswith("postgres"):
        from timerwheel_c.durable.storage.postgres import PostgresStore

        cls = PostgresStore if request.param == "postgres" else _generic_apply_many(PostgresStore)
        store = cls(_PG_DSN, table=request.getfixturevalue("pg_table"))
        yield store
        store.close()
        return
    from timerwheel_c.durable.storage.sqlite import SQLiteStore

    cls = SQLiteStore if request.param != "sqlite-generic-apply-many" else _generic_apply_many(SQLiteStore)
    store = cls(":memory:" if request.param == "sqlite-memory" else tmp_path / "timers.db")
    yield store
    store.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=_NEEDS_PG)])
def runner_backend(request, tmp_path):
    """(target, store) for tests whose runner is a process of its own (tests/durable_runner_proc.py):
    the runner process's STORE argument and the test's own connection to that store."""
    if request.param == "sqlite":
        from timerwheel_c.durable.storage.sqlite import SQLiteStore

        db = tmp_path / "runner.db"
        store = SQLiteStore(db)
        yield str(db), store
        store.close()
        return
    from timerwheel_c.durable.storage.postgres import PostgresStore

    table = request.getfixturevalue("pg_table")
    store = PostgresStore(_PG_DSN, table=table)
    yield f"postgres:{table}", store
    store.close()


@pytest.fixture
def schema_url():
    """A fresh schema on the PostgreSQL test server, and a URL whose sessions use it (dropped afterwards):
    for tests whose processes open the store by URL."""
    if not _PG_DSN:
        pytest.skip("set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to test PostgresStore")
    with fresh_schema_url(_PG_DSN) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path):
    """The URL of a fresh, empty store on each backend: a SQLite file in ``tmp_path``, or a schema
    of the test's own on the PostgreSQL test server (skipped without one)."""
    if request.param == "postgres":
        return request.getfixturevalue("schema_url")
    return "sqlite:///" + str(tmp_path / "timers.db")


@pytest.fixture
def store(tmp_path):
    """A SQLiteStore in a file of the test's ``tmp_path``, closed at teardown. A module whose tests
    hold for every backend overrides it with its own ``store`` fixture returning ``durable_store``."""
    from timerwheel_c.durable.storage.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "sqlite.db")
    yield store
    store.close()


@pytest.fixture
def open_at_once(tmp_path):
    """``open_at_once(url, n=16)``: start ``n`` processes (tests/durable_handlers.py ``open``) that each
    open the store of ``url`` once all are ready (each says so on its stdout; then a file starts
    them); returns the (exit status, stderr) of those that failed."""
    import subprocess
    import sys
    from pathlib import Path

    helpers = Path(__file__).resolve().parent / "durable_handlers.py"

    def run(url: str, n: int = 16) -> list:
        go = tmp_path / "go"
        procs = [subprocess.Popen([sys.executable, str(helpers), "open", url, str(go)], cwd=tmp_path,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
        for p in procs:  # each prints "ready" once imported; one that failed ends its stdout instead
            p.stdout.readline()
        go.touch()
        done = [(p.wait(60), p.stderr.read()) for p in procs]
        return [d for d in done if d[0] != 0]

    return run


@pytest.fixture
def finalizer_in_collection():
    """``with finalizer_in_collection(call):`` runs its block with the cyclic collector at every
    allocation, and garbage waiting whose finalizer calls ``call()`` at the collector's first run:
    the case of a finalizer that calls back into a compiled core while it allocates. The lists made
    first empty the list free list, so a block's first list is a new allocation (a run of the
    collector). The collector's settings are restored after."""
    @contextlib.contextmanager
    def collecting(call):
        class Finalizer:
            def __del__(self):
                call()

        threshold = gc.get_threshold()
        gc.disable()
        try:
            garbage = Finalizer()
            garbage.cycle = garbage
            del garbage
            keep = [[] for _ in range(200)]
            gc.set_threshold(1)
            gc.enable()
            yield
        finally:
            gc.set_threshold(*threshold)
            gc.enable()
            del keep

    return collecting

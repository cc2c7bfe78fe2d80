"""One suite, two implementations (after aio-libs' conftest).

Fixtures named ``<core>_impl`` hand each test the compiled module or its pure twin.
The compiled run imports the extension directly, so a broken build is an error,
never a silent pass on pure. ``--no-c-extensions`` deselects the compiled runs.
"""
from __future__ import annotations

import importlib
import os
import uuid
from pathlib import Path

import pytest

import timerwheel_c

CHECKOUT = Path(__file__).resolve().parent.parent


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


def _impl_params(core: str):
    return [
        pytest.param(f"timerwheel_c._{core}", id="c", marks=pytest.mark.c_extension),
        pytest.param(f"timerwheel_c.pure.{core}", id="pure"),
    ]


@pytest.fixture(params=_impl_params("wheel"))
def wheel_impl(request):
    """The wheel core module: ``timerwheel_c._wheel`` (C) or ``timerwheel_c.pure.wheel``."""
    return importlib.import_module(request.param)


@pytest.fixture(params=_impl_params("release"))
def release_impl(request):
    """The release-timer core module: ``timerwheel_c._release`` (C) or ``timerwheel_c.pure.release``."""
    return importlib.import_module(request.param)


_PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")


_NEEDS_PG = pytest.mark.skipif(not _PG_DSN, reason="set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to test PostgresStore")


def _generic_apply_many(cls):
    """``cls`` with the store contract's generic ``apply_many`` (one ``apply`` per batch) instead of
    the backend's one-round-trip override: both paths must pass the same suites."""
    from timerwheel_c.durable.store import Store

    return type(f"Generic{cls.__name__}", (cls,), {"_apply_many": Store._apply_many})


@pytest.fixture(params=["sqlite-file", "sqlite-memory", "sqlite-generic-apply-many",
                        pytest.param("postgres", marks=_NEEDS_PG), pytest.param("postgres-generic-apply-many", marks=_NEEDS_PG)])
def durable_store(request, tmp_path):
    """A fresh durable-timer store per backend; a new backend joins by adding one param."""
    if request.param.startswith("postgres"):
        from timerwheel_c.durable.postgres import PostgresStore

        cls = PostgresStore if request.param == "postgres" else _generic_apply_many(PostgresStore)
        store = cls(_PG_DSN, table=f"timerwheel_test_{uuid.uuid4().hex[:16]}")
        yield store
        store.drop()
        store.close()
        return
    from timerwheel_c.durable.sqlite import SQLiteStore

    cls = SQLiteStore if request.param != "sqlite-generic-apply-many" else _generic_apply_many(SQLiteStore)
    store = cls(":memory:" if request.param == "sqlite-memory" else tmp_path / "timers.db")
    yield store
    store.close()

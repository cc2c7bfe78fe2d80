"""Imports cost what they use: ``import timerwheel_c.durable`` (every ``timerwheel-c`` command, every
process that only schedules timers) loads no compiled core, no numpy, no asyncio and no database
driver; psycopg loads when a PostgreSQL store is opened, and the cores on first use of their names.

What is checked is which modules a fresh interpreter holds afterwards, not a time: the time follows
from it (about 0.8 s less on a 2-core machine) and a number would flake under load. Deterministic."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# Modules that importing the durable package must not load, by the first part of their name.
HEAVY = ("numpy", "psycopg", "psycopg_pool", "asyncio", "timerwheel_c._wheel", "timerwheel_c._release",
         "timerwheel_c._aio", "timerwheel_c._loop", "timerwheel_c.pure", "timerwheel_c.process_timer")


def _loaded_after(code: str) -> set:
    """The heavy modules (:data:`HEAVY`) a fresh interpreter holds after running ``code``."""
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    env = {k: v for k, v in os.environ.items() if k != "TIMERWHEEL_C_NO_EXTENSIONS"}
    # -I: not the checkout, which a plain -c would put first on sys.path, but the installed package.
    done = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    names = json.loads(done.stdout.splitlines()[-1])
    assert "timerwheel_c" in names, "the probe ran"
    return {n for n in names if any(n == h or n.startswith(h + ".") for h in HEAVY)}


def test_importing_the_durable_package_loads_no_core_numpy_asyncio_or_driver():
    assert _loaded_after("import timerwheel_c.durable") == set()


def test_writing_a_timer_to_a_sqlite_store_loads_no_driver_and_no_core(tmp_path):
    """The writer, the store and a caller's own sqlite3 transaction (``conn=``) stay off psycopg:
    the PostgreSQL half of joined writes is imported only for a PostgresStore."""
    code = f"""
import sqlite3
from timerwheel_c.durable import SQLiteStore, get_timer, schedule
path = {str(tmp_path / "t.db")!r}
with SQLiteStore(path) as store:
    schedule(store, "p", 1_700_000_000_000, 1, b"a")
    conn = sqlite3.connect(path)
    with conn:
        schedule(store, "p", 1_700_000_000_000, 1, b"b", conn=conn)
    conn.close()
    assert get_timer(store, "p", 1, b"b") is not None
"""
    assert _loaded_after(code) == set()


def test_the_command_line_help_loads_no_core_and_no_service():
    """``timerwheel-c --help`` (and ``run --help``) parse without the service, asyncio or a core;
    ``--version`` loads the cores it names."""
    help_only = """
from timerwheel_c import cli
for argv in (["--help"], ["run", "--help"]):
    try:
        cli.main(argv)
    except SystemExit:
        pass
"""
    assert _loaded_after(help_only) == set()
    assert "timerwheel_c._wheel" in _loaded_after(help_only.replace('["--help"], ["run", "--help"]', '["--version"],'))


def test_psycopg_loads_when_a_postgresql_store_is_opened():
    pytest.importorskip("psycopg")
    code = """
from timerwheel_c.durable.storage.open import open_store
try:
    open_store("postgresql://nobody@127.0.0.1:1/none")
except Exception:
    pass
"""
    assert "psycopg" in _loaded_after(code)


@pytest.mark.parametrize("name", ["TimerWheel", "ReleaseTimer", "Deadline", "IMPLEMENTATION", "arm_at", "sleep"])
def test_a_top_level_name_loads_its_core_on_first_use(name):
    """The public names of ``timerwheel_c`` are all there, each loading what it needs when first read."""
    loaded = _loaded_after(f"import timerwheel_c\nassert timerwheel_c.{name} is not None\n"
                           f"from timerwheel_c import {name}\n")
    assert loaded & {"timerwheel_c._wheel", "timerwheel_c._release"}


def test_dir_lists_the_names_loaded_on_first_use():
    """``dir()`` of both packages names what ``__all__`` promises before anything is loaded (for
    completion and documentation tools), and reading each name then works."""
    code = """
import timerwheel_c, timerwheel_c.durable as durable
for module in (timerwheel_c, durable):
    missing = set(module.__all__) - set(dir(module))
    assert not missing, (module.__name__, missing)
for module in (timerwheel_c, durable):
    assert all(getattr(module, name) is not None for name in module.__all__)
"""
    assert "numpy" in _loaded_after(code)  # the names were read: the cores loaded with them

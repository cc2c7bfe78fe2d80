"""The choice between compiled cores and pure twins (timerwheel_c._impl), seen from a new process.

Each test runs a fresh interpreter, because the choice is made once at import. Importing from
the source checkout (where ``python -m`` and a REPL put the checkout first on sys.path) is the
realistic way a compiled core goes missing, so it stands in for a broken build. Deterministic.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from locations import CHECKOUT

SHOW = "import timerwheel_c; print(timerwheel_c.IMPLEMENTATION)"


def run(args, cwd, **env_overrides):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIMERWHEEL_C_")}
    env.update(env_overrides)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def checkout():
    if not (CHECKOUT / "timerwheel_c" / "__init__.py").exists():
        pytest.skip("needs the source checkout beside the tests")
    return CHECKOUT


def test_installed_package_is_compiled(tmp_path):
    """Outside the checkout the installed package uses its compiled cores, with no warning."""
    done = run(["-c", SHOW], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "c" and "RuntimeWarning" not in done.stderr


def test_no_extensions_forces_pure_silently(tmp_path):
    """TIMERWHEEL_C_NO_EXTENSIONS=1 is a deliberate choice: pure, and no warning."""
    done = run(["-c", SHOW], tmp_path, TIMERWHEEL_C_NO_EXTENSIONS="1")
    assert done.stdout.strip() == "pure" and "RuntimeWarning" not in done.stderr


def test_fallback_from_source_checkout_names_the_cause_once(checkout):
    """A missing compiled core falls back to pure with one warning that says why and what to do."""
    done = run(["-c", SHOW], checkout)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "pure"
    assert done.stderr.count("RuntimeWarning") == 1
    assert "source checkout" in done.stderr and "python -I" in done.stderr


def test_require_extensions_turns_fallback_into_import_error(checkout):
    """With TIMERWHEEL_C_REQUIRE_EXTENSIONS=1 (as in CI) the same import fails: never a silent pure pass."""
    done = run(["-c", SHOW], checkout, TIMERWHEEL_C_REQUIRE_EXTENSIONS="1")
    assert done.returncode != 0
    assert "ImportError" in done.stderr and "forbids the pure fallback" in done.stderr


def test_bench_refuses_to_run_on_an_accidental_fallback(checkout):
    """The bench compares the compiled cores: on a fallback (here the source tree put first on
    sys.path by PYTHONPATH) it exits 2 with the cause, not a pure-only table."""
    done = run([str(checkout / "bench" / "run.py"), "--quick", "--only", "gap", "--no-progress"], checkout,
               PYTHONPATH=str(checkout))
    assert done.returncode == 2
    assert "source checkout" in done.stderr and "TIMERWHEEL_C_NO_EXTENSIONS=1" in done.stderr


def test_implementation_says_pure_whenever_one_core_falls_back(tmp_path):
    """A partial install that lacks one compiled core (here the event loop's timer store): the
    loop runs on its pure twin, and IMPLEMENTATION says "pure" whether it is read before the loop is
    imported or after (it said "c" when read first, "pure" after)."""
    import shutil

    import timerwheel_c

    package = tmp_path / "timerwheel_c"
    shutil.copytree(os.path.dirname(timerwheel_c.__file__), package)
    for built in package.glob("_loop.*"):
        if built.suffix in (".so", ".pyd"):
            built.unlink()
    for before in (True, False):
        code = ("import sys, warnings; sys.path.insert(0, %r); warnings.simplefilter('ignore')\n"
                "import timerwheel_c\n" % str(tmp_path)
                + ("first = timerwheel_c.IMPLEMENTATION\n" if before else "")
                + "import timerwheel_c.aio, timerwheel_c.loop as loop\n"
                "print(timerwheel_c.IMPLEMENTATION, type(loop.EventLoop()._timers).__module__)")
        done = run(["-c", code], tmp_path)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["pure", "timerwheel_c.pure.loop"], (before, done.stdout)


@pytest.mark.parametrize("value, pure", [("1", True), ("TRUE", True), (" yes ", True), ("on", True), ("", False),
                                         ("0", False), ("false", False), ("No", False), ("off", False)])
def test_no_extensions_is_on_only_for_a_true_value(tmp_path, value, pure):
    """TIMERWHEEL_C_NO_EXTENSIONS is a switch: ``=false``, ``=no`` (anything but empty or 0) forced the
    pure cores, the opposite of what it says. Only a true value turns it on."""
    done = run(["-c", SHOW], tmp_path, TIMERWHEEL_C_NO_EXTENSIONS=value)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("pure" if pure else "c")


@pytest.mark.parametrize("name", ["TIMERWHEEL_C_NO_EXTENSIONS", "TIMERWHEEL_C_REQUIRE_EXTENSIONS"])
def test_a_switch_set_to_neither_on_nor_off_is_an_error_naming_it(tmp_path, name):
    """Both switches are read by one rule: a value that is neither on nor off (``maybe``) is a ValueError
    at import naming the variable and the value, never a guess."""
    done = run(["-c", SHOW], tmp_path, **{name: "maybe"})
    assert done.returncode != 0 and "ValueError" in done.stderr
    assert name in done.stderr and "'maybe'" in done.stderr


@pytest.mark.parametrize("name", ["TIMERWHEEL_C_NO_EXTENSIONS", "TIMERWHEEL_C_REQUIRE_EXTENSIONS"])
def test_version_with_a_switch_set_to_neither_on_nor_off_is_one_line_and_exit_2(tmp_path, name):
    """``timerwheel-c --version`` is the one command that loads the cores: a switch it cannot read is
    one line naming it and exit 2, as every bad input of the command, never a traceback."""
    done = run(["-m", "timerwheel_c", "--version"], tmp_path, **{name: "maybe"})
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith("timerwheel-c: ") and name in done.stderr and "'maybe'" in done.stderr


def test_version_with_a_core_required_but_missing_is_one_line_and_exit_2(checkout):
    """From the source checkout under TIMERWHEEL_C_REQUIRE_EXTENSIONS=1 no compiled core loads:
    ``--version`` says so in one line, exit 2."""
    done = run(["-m", "timerwheel_c", "--version"], checkout, TIMERWHEEL_C_REQUIRE_EXTENSIONS="1")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
    assert "forbids the pure fallback" in done.stderr

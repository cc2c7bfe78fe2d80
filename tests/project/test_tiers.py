"""The tests sit in tiers, one folder of ``tests/`` each, and the README names every tier and the fast
tier's command: so a new test file lands in a tier, and the fast tier's command never names a folder
that is gone. Reads the checkout's files only; nothing is run or timed."""
from __future__ import annotations

import re

from locations import CHECKOUT, TESTS

README = (CHECKOUT / "README.md").read_text(encoding="utf-8")
PYPROJECT = (CHECKOUT / "pyproject.toml").read_text(encoding="utf-8")


def _tiers() -> list:
    return sorted(p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__")))


def test_every_test_file_sits_in_a_tier():
    """No test file at the top of ``tests/``: that folder holds conftest.py and the shared helpers."""
    assert len(_tiers()) >= 5 and len(list(TESTS.rglob("test_*.py"))) > 50  # the tree was read
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []


def test_the_readme_names_every_tier():
    missing = [name for name in _tiers() if f"`{name}/`" not in README]
    assert not missing, f"README.md does not name these folders of tests/: {missing}"


def test_the_fast_tier_command_names_only_tiers_that_exist():
    """The README's fast-tier command is ``pytest tests/A tests/B ... -m "not slow" -n 3``, every folder a
    tier, run on three pytest-xdist workers (the test extra installs pytest-xdist)."""
    command = re.search(r"^pytest (tests/\S+(?: tests/\S+)*) -m \"not slow\" -n 3$", README, flags=re.M)
    assert command, "README.md names no fast-tier command"
    folders = [path.split("/", 1)[1] for path in command.group(1).split()]
    assert "e2e" not in folders and all((TESTS / folder).is_dir() for folder in folders), folders
    test_extra = re.search(r"^test = \[(.*)\]$", PYPROJECT, flags=re.M)
    assert test_extra and '"pytest-xdist' in test_extra.group(1), "the test extra does not install pytest-xdist"


def test_the_test_command_runs_every_tier_on_two_workers_with_the_long_tests_first():
    """The README's test command (the one .ci/run runs) collects every tier on two pytest-xdist workers
    with ``--dist loadgroup``, so the ``xdist_group`` marks hold. In a worker (``PYTEST_XDIST_WORKER``
    set, as xdist sets it) the tests outside the fast tier are collected first, so they are handed out
    first; without workers the order is pytest's. Collection only: nothing runs."""
    import os
    import subprocess
    import sys

    command = re.search(r"<!-- ci:test -->\n```bash\n(.*)\n```\n<!-- /ci:test -->", README)
    assert command and command.group(1) == 'pip install ".[test]" && pytest -n 2 --dist loadgroup', command
    paths = ["tests/project/test_tiers.py", "tests/e2e/test_durable_read_only.py"]
    alone = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}  # this test may run in a worker

    def files_in_collection_order(env: dict) -> list:
        # -I: the checkout is not on sys.path, so the tests import the installed package, as ``pytest`` does.
        proc = subprocess.run([sys.executable, "-I", "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                               *paths], cwd=CHECKOUT, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return list(dict.fromkeys(line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line))

    assert files_in_collection_order(alone) == paths
    assert files_in_collection_order(dict(alone, PYTEST_XDIST_WORKER="gw0")) == paths[::-1]

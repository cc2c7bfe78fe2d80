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
    """The README's fast-tier command is ``pytest tests/A tests/B ... -m "not slow" -n 2``, every folder a
    tier, run on two pytest-xdist workers (the test extra installs pytest-xdist)."""
    command = re.search(r"^pytest (tests/\S+(?: tests/\S+)*) -m \"not slow\" -n 2$", README, flags=re.M)
    assert command, "README.md names no fast-tier command"
    folders = [path.split("/", 1)[1] for path in command.group(1).split()]
    assert "e2e" not in folders and all((TESTS / folder).is_dir() for folder in folders), folders
    test_extra = re.search(r"^test = \[(.*)\]$", PYPROJECT, flags=re.M)
    assert test_extra and '"pytest-xdist' in test_extra.group(1), "the test extra does not install pytest-xdist"

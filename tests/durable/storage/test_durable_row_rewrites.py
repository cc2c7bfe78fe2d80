"""The row rewrites a store runs when it upgrades are declared as entry points of one group, each
named by the schema version it brings a store to (storage/upgrades.py): a declaration the storage
layer cannot read is refused by name, never run as some other step or skipped."""
from __future__ import annotations

from importlib import metadata

import pytest

from timerwheel_c.durable.storage import upgrades

REWRITE = "timerwheel_c.durable.timers.key_upgrade:upgraded_partition"


def _declare(monkeypatch, *entries: tuple) -> None:
    """Make the installed entry points of the group exactly ``entries`` ((name, value) pairs)."""
    found = [metadata.EntryPoint(name, value, upgrades.GROUP) for name, value in entries]
    # Python 3.10+ asks for the group; 3.9 gets every group as a dict.
    monkeypatch.setattr(upgrades.metadata, "entry_points", lambda **group: found if group else {upgrades.GROUP: found})


def test_one_rewrite_declared_twice_counts_once(monkeypatch):
    """The same package found on two paths declares its rewrite twice: one step, loaded."""
    from timerwheel_c.durable.timers.key_upgrade import upgraded_partition

    _declare(monkeypatch, ("9", REWRITE), ("9", REWRITE))
    assert upgrades.declared_rewrites() == {9: upgraded_partition}


@pytest.mark.parametrize("name", ["nine", "0", "-9", "9.0"])
def test_a_rewrite_not_named_by_a_version_is_refused_naming_it(monkeypatch, name):
    _declare(monkeypatch, (name, REWRITE))
    with pytest.raises(RuntimeError, match=f"named {name!r}, not by the schema version"):
        upgrades.rewritten_rows(1, [])


def test_two_rewrites_for_one_version_are_refused_naming_both(monkeypatch):
    _declare(monkeypatch, ("9", REWRITE), ("9", "json:loads"))
    with pytest.raises(RuntimeError, match="schema version 9 has two row rewrites .*upgraded_partition.*json:loads"):
        upgrades.declared_rewrites()


def test_no_step_above_the_found_version_reads_no_row(monkeypatch):
    """A store at or past every declared version rewrites nothing and never reads its rows."""
    _declare(monkeypatch, ("9", REWRITE))

    def rows():
        raise AssertionError("the rows were read")
        yield

    assert upgrades.rewritten_rows(9, rows()) == ([], [])

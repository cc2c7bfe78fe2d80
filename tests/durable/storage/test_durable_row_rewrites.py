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
        upgrades.rewritten_rows(1, [], target=9)


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

    assert upgrades.rewritten_rows(9, rows(), target=9) == ([], [])


def test_a_rewrite_declared_above_the_target_version_is_left_for_that_version(monkeypatch):
    """A newer copy of the package on the path declares the step of a version this code does not
    bring the store to (here one that would set every value to None): upgrading to the target runs
    the steps up to it and not that one, which the newer code runs once when it brings the store on
    (run now as well, it would run twice). Nor is a version above the target required."""
    _declare(monkeypatch, ("9", "builtins:dict"), ("12", "builtins:dict.fromkeys"))
    rows = [("p", b"k", b"v")]
    assert upgrades.rewritten_rows(8, rows, required=[9, 12, 13], target=11) == ([], [])
    assert upgrades.rewritten_rows(8, rows, required=[9, 12], target=12) == ([], [("p", b"k", None)])


def test_only_the_rewrites_an_upgrade_runs_are_loaded_and_one_that_cannot_be_is_refused_naming_it(monkeypatch):
    """A declared rewrite whose module is gone (an uninstalled plugin's stale metadata) stops no
    upgrade that does not run it; an upgrade that needs it is refused with a RuntimeError naming the
    entry and its version, never a bare ImportError."""
    _declare(monkeypatch, ("3", "no_such_module_of_timerwheel_c:rewrite"), ("9", "builtins:dict"),
             ("12", "no_such_module_of_timerwheel_c:rewrite"))
    assert upgrades.rewritten_rows(8, [("p", b"k", b"v")], required=[9], target=11) == ([], [])
    with pytest.raises(RuntimeError, match="'no_such_module_of_timerwheel_c:rewrite' of schema version 12 .*"
                                           "cannot be loaded: ModuleNotFoundError"):
        upgrades.rewritten_rows(11, [("p", b"k", b"v")], target=12)


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_a_migration_that_rewrites_rows_says_so(backend):
    """Each backend's version 9 (the reserved key space) is marked, so its rewrite is required."""
    from timerwheel_c.durable.storage import sqlfiles

    assert 9 in sqlfiles.rewrite_versions(sqlfiles.migrations(backend))


def test_an_upgrade_whose_required_rewrite_is_not_declared_is_refused_naming_the_version(monkeypatch):
    """A copy of the source that was never installed has no entry points: the upgrade stops, naming
    the version, before any row is read, instead of moving on and leaving the rows unreachable."""
    _declare(monkeypatch)

    def rows():
        raise AssertionError("the rows were read")
        yield

    with pytest.raises(RuntimeError, match="schema version 9 rewrites the stored rows, but no function is declared"):
        upgrades.rewritten_rows(8, rows(), required=[9, 10], target=10)
    assert upgrades.rewritten_rows(9, rows(), required=[9], target=10) == ([], [])


def test_an_upgrade_of_a_sqlite_store_without_its_declared_rewrite_fails_and_leaves_the_store_as_it_was(
        monkeypatch, tmp_path):
    """Through a real store: the old version and its rows stay, so an installed package upgrades it later."""
    import sqlite3

    from timerwheel_c.durable import SQLiteStore

    path = str(tmp_path / "old.db")
    with SQLiteStore(path):
        pass
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE timerwheel_meta SET value = '8' WHERE name = 'schema_version'")
    db.close()
    _declare(monkeypatch)
    with pytest.raises(RuntimeError, match="schema version 9 rewrites the stored rows"):
        SQLiteStore(path)
    db = sqlite3.connect(path)
    assert db.execute("SELECT value FROM timerwheel_meta WHERE name = 'schema_version'").fetchone() == ("8",)
    db.close()


def test_an_upgrade_of_a_sqlite_store_runs_no_rewrite_declared_above_its_version(monkeypatch, tmp_path):
    """Through a real store brought up from version 8, with a newer copy's step for the version after
    the current one declared beside the package's own: the stored value is read back unchanged, and a
    reopen (at the current version) rewrites nothing either."""
    import sqlite3

    from timerwheel_c.durable import SQLiteStore
    from timerwheel_c.durable.storage.sqlite import SCHEMA_VERSION
    from timerwheel_c.durable.storage.store import Batch

    path = str(tmp_path / "old.db")
    with SQLiteStore(path) as store:
        store.apply("p", Batch().put(b"app/k", b"v"))
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE timerwheel_meta SET value = '8' WHERE name = 'schema_version'")
    db.close()
    _declare(monkeypatch, ("9", REWRITE), (str(SCHEMA_VERSION + 1), "builtins:dict.fromkeys"))
    for _ in range(2):
        with SQLiteStore(path) as store:
            assert store.get("p", b"app/k") == b"v"

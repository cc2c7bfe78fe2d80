"""The SQL files each backend ships: numbered migrations, one file a version."""
from __future__ import annotations

import pytest

from timerwheel_c.durable.storage import sqlfiles


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_each_shipped_migration_carries_a_version_of_its_own(backend):
    versions = [version for version, _ in sqlfiles.migrations(backend)]
    assert versions == sorted(set(versions)) and versions[0] == 1


def test_two_migrations_of_one_version_are_refused_naming_both(tmp_path, monkeypatch):
    """A store records the newest version after running its migrations, so of two files numbered
    alike one would never run on a store upgraded past it: refused when the files are read."""
    (tmp_path / "0008_shards.sql").write_text("SELECT 1;")
    (tmp_path / "0008_reserved_keys.sql").write_text("SELECT 1;")
    monkeypatch.setattr(sqlfiles, "_folder", lambda backend: tmp_path)
    with pytest.raises(RuntimeError, match="0008_reserved_keys.sql and 0008_shards.sql both carry version 8"):
        sqlfiles.migrations("sqlite")


def test_the_sql_is_read_with_one_name_per_joinpath_as_python_3_9s_zip_paths_take(monkeypatch):
    """A package imported from a zip (a zipapp, shiv, pex) reads its files through zipfile.Path,
    whose joinpath takes one name on Python 3.9: the SQL reads the same through such a path."""
    real = sqlfiles.resources.files(sqlfiles.__package__)

    class OneName:
        def __init__(self, traversable):
            self._t = traversable
            self.name = traversable.name

        def joinpath(self, name):  # one argument, as 3.9's zipfile.Path.joinpath
            return OneName(self._t.joinpath(name))

        def iterdir(self):
            return (OneName(child) for child in self._t.iterdir())

        def read_text(self, encoding):
            return self._t.read_text(encoding=encoding)

    expected = {backend: (sqlfiles.migrations(backend), sqlfiles.queries(backend)) for backend in ("sqlite", "postgres")}
    monkeypatch.setattr(sqlfiles.resources, "files", lambda package: OneName(real))
    for backend, (migrations, queries) in expected.items():
        assert sqlfiles.migrations(backend) == migrations and sqlfiles.queries(backend) == queries

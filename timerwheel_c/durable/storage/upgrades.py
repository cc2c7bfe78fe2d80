"""Row upgrades: schema steps that rewrite the stored rows, handed down as data.

A numbered SQL migration (:mod:`.sqlfiles`) changes tables. Some upgrades instead change the rows
themselves in a way that only a layer above can work out (the timer layer moving its rows into the
reserved key space, and naming its timers), and the store must not learn what the rows mean. Such
a layer declares a function for a schema version as an entry point of the group :data:`GROUP`,
named by the version (this package's ``pyproject.toml`` declares the timer layer's), as SQLAlchemy
finds its dialects: nothing is registered when a module is imported, storage imports no layer
above it, and a program that imports the storage layer alone upgrades a store whole. A backend,
bringing a database from below that version, loads the declared functions, hands each one every
partition's rows and writes the difference (the rows it dropped or moved deleted, the new and
changed ones put) inside the one transaction, under the one lock, that runs its SQL migrations and
records the new version: the upgrade happens once, whole or not at all, however many processes
open the store at the same moment. This is procrastinate's numbered migrations with the data step
given as a function instead of SQL.
"""
from __future__ import annotations

import itertools
import sys
from importlib import metadata
from typing import Iterable, Optional

__all__ = ["GROUP", "declared_rewrites", "rewritten_rows"]

#: The entry-point group of the row rewrites: each entry named by the schema version (an int >= 1)
#: it brings a database to, its object a function ``rewrite({key: value}) -> {key: value}``.
GROUP = "timerwheel_c.row_rewrites"


def declared_rewrites(above: int = 0, upto: Optional[int] = None) -> dict:
    """``{version: rewrite}`` of the entry points of :data:`GROUP` for the versions above ``above``
    and at most ``upto`` (None: no bound), each loaded: ``rewrite(rows)`` takes a partition's
    ``{key: value}`` (bytes), as left by the rewrites of lower versions, and returns the partition's
    rows after the step (a new dict; a key it leaves out is deleted). One entry declared twice (the
    same package found on two paths) counts once. Only the entries of those versions are loaded, so
    one that cannot be imported stops only an upgrade that needs it.

    Raises:
        RuntimeError: an entry's name is not a version (an int >= 1), two entries of one version
            name different functions, or an entry of those versions cannot be loaded, naming them.
    """
    if sys.version_info >= (3, 10):
        entries = metadata.entry_points(group=GROUP)
    else:
        entries = metadata.entry_points().get(GROUP, ())
    found: dict = {}
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) < 1:
            raise RuntimeError(f"the row rewrite {entry.value!r} of {GROUP!r} is named {entry.name!r}, "
                               "not by the schema version it brings a store to")
        known = found.setdefault(int(entry.name), entry)
        if known.value != entry.value:
            raise RuntimeError(f"schema version {entry.name} has two row rewrites in {GROUP!r}: {known.value!r} "
                               f"and {entry.value!r}")
    return {version: _load(version, entry) for version, entry in found.items()
            if version > above and (upto is None or version <= upto)}


def _load(version: int, entry: metadata.EntryPoint):
    try:
        return entry.load()
    except Exception as exc:
        raise RuntimeError(f"the row rewrite {entry.value!r} of schema version {version} in {GROUP!r} cannot be "
                           f"loaded: {type(exc).__name__}: {exc}") from exc


def rewritten_rows(found: int, rows: Iterable, required: Iterable[int] = (), *, target: int) -> tuple:
    """``(deletes, puts)`` that upgrade a database from schema version ``found`` to ``target`` from
    its stored ``rows`` (``(partition, key, value)`` triples ordered by partition): ``deletes`` the
    ``(partition, key)`` pairs to remove, ``puts`` the ``(partition, key, value)`` rows to write
    (insert or replace), each step of the declared versions above ``found`` and at most ``target``
    in version order (:func:`declared_rewrites`); ``([], [])`` when no step lies there (``rows`` is
    then not read). A step declared for a version above ``target`` (a newer copy of the package
    found on the path) is left for the code that brings the store to that version: run now, it
    would run again then, on rows it already rewrote. ``required``: the versions whose migration
    says it rewrites rows (:func:`~.sqlfiles.rewrite_versions`).

    Raises:
        RuntimeError: as :func:`declared_rewrites`; or a version of ``required`` above ``found``
            has no declared rewrite (the package's metadata is missing, as in a copy of the source
            that was never installed), naming the version: upgrading on would leave the rows where
            the new version no longer reads them.
        ValueError (or what a rewrite raises): a rewrite refused a partition's rows.
    """
    declared = declared_rewrites(found, target)
    missing = sorted(version for version in required if found < version <= target and version not in declared)
    if missing:
        raise RuntimeError(f"schema version {missing[0]} rewrites the stored rows, but no function is declared "
                           f"for it in the entry-point group {GROUP!r}: install the package (pip install) "
                           "so that its metadata is found, then open the store again")
    steps = [rewrite for _, rewrite in sorted(declared.items())]
    deletes: list = []
    puts: list = []
    if not steps:
        return deletes, puts
    for partition, group in itertools.groupby(rows, key=lambda row: row[0]):
        before = {bytes(key): bytes(value) for _, key, value in group}
        after = before
        for rewrite in steps:
            after = rewrite(after)
        deletes.extend((partition, key) for key in before if key not in after)
        puts.extend((partition, key, value) for key, value in after.items() if before.get(key) != value)
    return deletes, puts

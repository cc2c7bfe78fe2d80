"""Row upgrades: schema steps that rewrite the stored rows, handed down as data.

A numbered SQL migration (:mod:`.sqlfiles`) changes tables. Some upgrades instead change the rows
themselves in a way that only a layer above can work out (the timer layer moving its rows into the
reserved key space, and naming its timers), and the store must not learn what the rows mean. Such
a layer registers a function for a schema version with :func:`register_rewrite` when it is imported
(the whole package is imported before any store is opened). A backend, bringing a database from
below that version, hands it each partition's rows and writes the difference (the rows it dropped
or moved deleted, the new and changed ones put) inside the one transaction, under the one lock,
that runs its SQL migrations and records the new version: the upgrade happens once, whole or not at
all, however many processes open the store at the same moment. This is procrastinate's numbered
migrations with the data step given as a function instead of SQL.
"""
from __future__ import annotations

import itertools
from typing import Callable, Iterable

__all__ = ["register_rewrite", "rewritten_rows"]

# version -> rewrite({key: value}) -> {key: value}: a partition's rows before and after.
_REWRITES: dict = {}


def register_rewrite(version: int, rewrite: Callable[[dict], dict]) -> None:
    """Make ``rewrite(rows)`` run on every partition when a database is brought from below ``version``
    (an int >= 1) to it or past it: ``rows`` is the partition's ``{key: value}`` (bytes), as left by
    the rewrites of lower versions, and it returns the partition's rows after the step (a new dict;
    a key it leaves out is deleted). Idempotent for the same function.

    Raises:
        ValueError: another function is registered for ``version``.
    """
    known = _REWRITES.get(version)
    if known is not None and known is not rewrite:
        raise ValueError(f"schema version {version} already has the row rewrite {known!r}")
    _REWRITES[version] = rewrite


def rewritten_rows(found: int, rows: Iterable) -> tuple:
    """``(deletes, puts)`` that upgrade a database at schema version ``found`` from its stored
    ``rows`` (``(partition, key, value)`` triples ordered by partition): ``deletes`` the
    ``(partition, key)`` pairs to remove, ``puts`` the ``(partition, key, value)`` rows to write
    (insert or replace), each step of the registered versions above ``found`` in version order;
    ``([], [])`` when no step lies above ``found`` (``rows`` is then not read)."""
    steps = [rewrite for version, rewrite in sorted(_REWRITES.items()) if version > found]
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

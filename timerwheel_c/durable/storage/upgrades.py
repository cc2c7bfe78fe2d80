"""Row upgrades: schema steps that add rows derived from the stored ones, handed down as data.

A numbered SQL migration (:mod:`.sqlfiles`) changes tables. Some upgrades instead need new rows that
only a layer above can derive from the stored ones (the timer layer's identity rows, derived from
timer keys), and the store must not learn what the rows mean. Such a layer registers a function for
a schema version with :func:`register_row_upgrade` when it is imported (the whole package is imported
before any store is opened), and a backend, bringing a database from below that version, calls it for
each stored row inside the one transaction, under the one lock, that runs its SQL migrations and
records the new version: the upgrade happens once, whole or not at all, however many processes open
the store at the same moment. This is procrastinate's numbered migrations with the data step given
as a function instead of SQL.
"""
from __future__ import annotations

from typing import Callable, Iterable

__all__ = ["derived_rows", "register_row_upgrade"]

# version -> derive(key, value) -> [(key, value), ...]: rows to add to the row's partition.
_ROW_UPGRADES: dict = {}


def register_row_upgrade(version: int, derive: Callable[[bytes, bytes], list]) -> None:
    """Make ``derive(key, value)`` run on every stored row when a database is brought from below
    ``version`` (an int >= 1) to it or past it; the ``(key, value)`` pairs it returns are added to
    that row's partition unless a row already holds the key. Idempotent for the same function.

    Raises:
        ValueError: another function is registered for ``version``.
    """
    known = _ROW_UPGRADES.get(version)
    if known is not None and known is not derive:
        raise ValueError(f"schema version {version} already has the row upgrade {known!r}")
    _ROW_UPGRADES[version] = derive


def derived_rows(found: int, rows: Iterable) -> list:
    """The ``(partition, key, value)`` rows to add when a database at schema version ``found`` is
    upgraded, from its stored ``rows`` (``(partition, key, value)`` triples), in the order of the
    registered versions; [] when no row upgrade lies above ``found`` (``rows`` is then not read)."""
    steps = [derive for version, derive in sorted(_ROW_UPGRADES.items()) if version > found]
    if not steps:
        return []
    out = []
    for partition, key, value in rows:
        for derive in steps:
            out.extend((partition, k, v) for k, v in derive(bytes(key), bytes(value)))
    return out

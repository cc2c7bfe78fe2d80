"""The backends' SQL, kept in each backend's folder, ``<backend>/sql/``, as procrastinate keeps its ``sql/``, not in Python strings.

- ``queries.sql``: the statements a backend runs, one per ``-- name: NAME`` section.
- ``NNNN_description.sql``: numbered migrations; ``NNNN`` is the schema version the file brings a
  database to. A database recorded at version v runs, in order, every file numbered above v (a new
  one, all of them), inside the transaction that then records the newest number. A migration whose
  step is a row rewrite of a layer above (:mod:`.upgrades`) holds the line :data:`REWRITES_ROWS`.

The files ship as package data; placeholders such as ``{t}`` (the table) are filled by the backend.
"""
from __future__ import annotations

import re
from importlib import resources

__all__ = ["REWRITES_ROWS", "migrations", "queries", "rewrite_versions", "statements"]

#: The line that marks a migration whose step is a declared row rewrite.
REWRITES_ROWS = "-- step: rewrites rows"

_MIGRATION = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
_SECTION = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _folder(backend: str):
    # One name per joinpath: 3.9's zipfile.Path (a package imported from a zip) takes one.
    return resources.files(__package__).joinpath(backend).joinpath("sql")


def migrations(backend: str) -> list:
    """``[(version, sql text), ...]`` of ``backend``'s migrations, in version order.

    Raises:
        RuntimeError: two files carry one version (a store would record the version after running
            either, so the other would never run on an upgraded store), naming both.
    """
    files = sorted((int(m.group(1)), f.name, f) for f in _folder(backend).iterdir() if (m := _MIGRATION.match(f.name)))
    for (version, name, _), (again, other, _) in zip(files, files[1:]):
        if version == again:
            raise RuntimeError(f"the {backend} migrations {name} and {other} both carry version {version}")
    return [(version, f.read_text(encoding="utf-8")) for version, _, f in files]


def rewrite_versions(migrations: list) -> list:
    """The versions of ``migrations`` (as :func:`migrations` gives them) that hold :data:`REWRITES_ROWS`."""
    return [version for version, text in migrations if REWRITES_ROWS in text.splitlines()]


def queries(backend: str) -> dict:
    """``{name: sql text}`` of ``backend``'s ``queries.sql`` (comment lines dropped)."""
    text = _folder(backend).joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _SECTION.split(text)[1:]
    return {name: "\n".join(line for line in body.strip().splitlines() if not line.lstrip().startswith("--"))
            for name, body in zip(parts[::2], parts[1::2])}


def statements(text: str) -> list:
    """The statements of a migration's ``text``, for a driver that runs one at a time: split after each
    line that ends with ``;`` (comments dropped, empty statements skipped; the files keep no ``;``
    at a line end inside a statement)."""
    out, current = [], []
    for line in text.splitlines():
        if line.lstrip().startswith("--"):
            continue
        current.append(line)
        if line.rstrip().endswith(";"):
            out.append("\n".join(current).strip())
            current = []
    tail = "\n".join(current).strip()
    return [s for s in out + ([tail] if tail else []) if s.strip(" ;\n")]

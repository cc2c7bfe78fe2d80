"""Every code block of the documentation site (``docs/*.md``) and of the README runs in a test, or
says why it does not, so that none can go stale.

A block may be marked by an HTML comment on the line just before its fence:

- ``<!-- not run: REASON -->``: not run here, and REASON says why (and where it runs, if it does);
- ``<!-- needs: postgresql -->``: run with ``TIMERWHEEL_C_STORE`` naming a fresh database on the
  test server (``TIMERWHEEL_C_TEST_PG_DSN``), dropped afterwards; skipped without a server;
- ``<!-- ci:main -->`` / ``<!-- ci:test -->`` (README only): the commands ``.ci/run`` runs.

A page's blocks run in order, each in a process of its own, in one empty directory of the page's,
so that a shell block may read the files an earlier Python block wrote: ``python`` blocks with the
interpreter running the tests, ``bash`` blocks under ``bash -euo pipefail`` with that interpreter's
``bin`` first on ``PATH`` (so ``python`` and ``timerwheel-c`` are the installed package's). The
README's Python blocks run in tests/project/test_readme.py. The examples assert their own outcomes; their
waits are liveness bounds of seconds, so a loaded machine only makes them slower.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from locations import CHECKOUT

DOCS = CHECKOUT / "docs"
README = CHECKOUT / "README.md"
BLOCK = re.compile(r"^(?:<!-- (?P<mark>[^>]*?) -->\n)?```(?P<lang>[\w-]*)\n(?P<source>.*?)^```$", re.S | re.M)
RUNNABLE = ("python", "bash")
TIMEOUT_S = 120


def _blocks(path: Path) -> list:
    """``[(mark or None, language, source)]`` of ``path``'s fenced blocks, in order."""
    return [(m["mark"], m["lang"], m["source"]) for m in BLOCK.finditer(path.read_text(encoding="utf-8"))]


PAGES = sorted(DOCS.rglob("*.md"))
RUN_PAGES = [p for p in PAGES if any(lang in RUNNABLE and not (mark or "").startswith("not run:")
                                     for mark, lang, _ in _blocks(p))]


def _problems(path: Path, allowed_marks: tuple) -> list:
    problems = []
    for mark, lang, source in _blocks(path):
        first = source.strip().splitlines()[0] if source.strip() else ""
        if mark is not None and mark.startswith("not run:"):
            if not mark[len("not run:"):].strip():
                problems.append(f"{path.name}: a block marked 'not run' gives no reason: {first!r}")
        elif mark is not None and mark not in allowed_marks:
            problems.append(f"{path.name}: unknown mark {mark!r} before {first!r}")
        elif lang not in RUNNABLE:
            problems.append(f"{path.name}: a {lang or 'plain'} block neither runs nor says why: {first!r}")
    return problems


def test_every_block_runs_or_says_why():
    """Each block of the site and the README is Python or shell (run below, or by test_readme.py
    and .ci/run), or is marked ``not run:`` with a reason; nothing else passes silently."""
    problems = [p for page in PAGES for p in _problems(page, ("needs: postgresql",))]
    problems += _problems(README, ("ci:main", "ci:test"))
    assert not problems, "\n".join(problems)


def test_the_site_has_its_pages_and_examples():
    """Guards the tests below against passing vacuously: the task pages exist and hold examples
    that run."""
    names = {p.name for p in PAGES}
    for page in ("index.md", "timeouts-in-a-reactor.md", "asyncio-on-the-wheel.md", "eventloop.md",
                 "durable-sqlite.md", "postgresql-fleet.md", "schedules-and-dst.md", "operating-a-fleet.md",
                 "upgrading-a-store.md", "figures.md", "DESIGN.md"):
        assert page in names
    runnable = [b for p in PAGES for b in _blocks(p) if b[1] in RUNNABLE and not (b[0] or "").startswith("not run:")]
    assert len(RUN_PAGES) >= 8 and len(runnable) >= 15


def _fresh_pg_database(dsn: str):
    """``(url of a new empty database on the server of dsn, a postgresql:// URL; drop())``."""
    psycopg = pytest.importorskip("psycopg")
    name = f"docs_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = urlsplit(dsn)._replace(path="/" + name).geturl()  # the URL form, as open_store takes it

    def drop():
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    return url, drop


@pytest.mark.parametrize("page", RUN_PAGES, ids=lambda p: p.relative_to(DOCS).as_posix())
def test_page_examples_run(page, tmp_path):
    """The page's examples, in order, each exits 0 (its own asserts hold) within a generous 120 s."""
    blocks = [b for b in _blocks(page) if b[1] in RUNNABLE and not (b[0] or "").startswith("not run:")]
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    env.pop("TIMERWHEEL_C_STORE", None)
    drop = None
    if any(mark == "needs: postgresql" for mark, _, _ in blocks):
        dsn = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
        if not dsn:
            pytest.skip("set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to run the PostgreSQL examples")
        env["TIMERWHEEL_C_STORE"], drop = _fresh_pg_database(dsn)
    try:
        for _mark, lang, source in blocks:
            argv = [sys.executable, "-c", source] if lang == "python" else ["bash", "-euo", "pipefail", "-c", source]
            done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
            assert done.returncode == 0, (f"{page.name} example failed:\n{source}\n--- stdout ---\n{done.stdout}"
                                          f"\n--- stderr ---\n{done.stderr}")
    finally:
        if drop is not None:
            drop()


def test_the_site_builds_in_strict_mode(tmp_path):
    """``mkdocs build --strict`` (the docs extra) builds the site: every link, anchor and reference
    to a documented object resolves. .ci/run builds it too."""
    pytest.importorskip("mkdocs", reason="the docs extra builds the site: pip install '.[docs]'")
    pytest.importorskip("mkdocstrings")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    # Not -q: a quiet build stops counting the warnings that strict mode turns into a failure.
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=CHECKOUT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "reference" / "durable" / "index.html").is_file()


# A path in backquotes that starts at a folder of the repository (or at ``durable/``, the package's
# durable layer, as DESIGN.md names its modules); ``*`` globs, ``<...>`` and ``NNNN`` are placeholders.
REPO_PATH = re.compile(r"`((?:tests|bench|timerwheel_c|src|examples|docs|\.ci|\.github|durable)/[\w./*-]+)`")


def test_every_repository_path_the_docs_name_exists():
    """A file or folder of this repository named in the README or on a page of the site is there, so a
    reader who follows it finds it (a module moved into a subpackage, a test moved into a tier)."""
    named = {m.group(1) for page in [README, *PAGES] for m in REPO_PATH.finditer(page.read_text(encoding="utf-8"))}
    assert len(named) > 40  # the pattern still finds the paths the text names
    missing = []
    for path in sorted(named):
        root = CHECKOUT / "timerwheel_c" if path.startswith("durable/") else CHECKOUT
        found = list(root.glob(path.rstrip("/"))) if "*" in path else (root / path.rstrip("/")).exists()
        if not found:
            missing.append(path)
    assert not missing, f"paths named in the README or docs/ that are not in the repository: {missing}"


def _reference_objects() -> list:
    """The objects the reference pages (``docs/reference/*.md``) document: each ``::: NAME`` of an
    object, and of a module each member its ``members:`` option lists, or every public one without it."""
    import importlib

    objects = []
    for page in sorted((DOCS / "reference").glob("*.md")):
        for m in re.finditer(r"^::: (\S+)\n((?:    .*\n)*)", page.read_text(encoding="utf-8"), flags=re.M):
            target, options = m.group(1), m.group(2)
            try:
                module = importlib.import_module(target)
            except ImportError:
                parent, _, name = target.rpartition(".")
                objects.append(getattr(importlib.import_module(parent), name))
                continue
            members = re.search(r"members: (\[.*\]|false)", options)
            if members is None:
                names = [n for n in dir(module) if not n.startswith("_")]
            else:
                names = [] if members.group(1) == "false" else [n.strip() for n in members.group(1)[1:-1].split(",")]
            objects.extend(getattr(module, n) for n in names)
    return objects


def test_the_reference_documents_every_name_timerwheel_c_durable_exports():
    """The durable reference page says it holds everything an application imports from
    ``timerwheel_c.durable``: every name of its ``__all__`` (and of ``timerwheel_c.durable.aio``'s) is
    documented on a reference page (``schedule_many``, ``Backoff`` and ``KindNameMismatch`` were
    missing)."""
    import timerwheel_c.durable as durable
    import timerwheel_c.durable.aio as durable_aio

    documented = {id(obj) for obj in _reference_objects()}
    missing = [f"{module.__name__}.{name}" for module in (durable, durable_aio) for name in module.__all__
               if id(getattr(module, name)) not in documented]
    assert not missing, f"exported but in no reference page (docs/reference/): {missing}"

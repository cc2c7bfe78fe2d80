"""``timerwheel-c run``'s argument handling: every bad argument, an unopenable store and a
handlers module that fails to import included, is one line on stderr naming the value, and
exit status 2 (a traceback only at DEBUG), before anything is served or created. The
command runs in-process (tests/cli_run.py), with the broken handler modules importable from a
fresh directory; the DEBUG traceback, which logging set up at start-up prints, and one bad
handlers spec also run as the real command in a subprocess, in that directory (never the
checkout, so the installed package is the one imported). (Serving and stopping on a signal
are in test_durable_process.py.)"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from timerwheel_c.cli import main
from cli_run import run_cli
from locations import TESTS as HELPERS_DIR

TIMEOUT_S = 60.0

BROKEN_MODULES = {
    "raises_on_import": 'raise RuntimeError("handlers cannot start: no config")\n',
    "bad_syntax": "def registry(:\n",
    "not_a_registry": "registry = 42\n",
    "factory_raises": "def registry():\n    raise KeyError('missing kind table')\n",
    "exits_on_import": "import sys\nsys.exit(3)\n",
    "leaks_on_import": 'raise RuntimeError("cannot reach postgresql://app:sekrit@db/x")\n',
    "factory_leaks": "def registry():\n    raise ValueError('connect failed: host=db password=sekrit dbname=x')\n",
}


def run_process(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``timerwheel-c run ARGS`` as a real process in ``tmp_path``, its handler modules importable."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(HELPERS_DIR)]))
    return subprocess.run([sys.executable, "-m", "timerwheel_c", "run", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)


def run_in_process(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``timerwheel-c run ARGS`` in this process (``tmp_path``, as handler_dir makes it, is already on
    sys.path and the working directory)."""
    return run_cli("run", *args)


@pytest.fixture
def handler_dir(tmp_path, monkeypatch):
    for name, source in BROKEN_MODULES.items():
        (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)  # a relative --store names a file here, as in the real process's cwd
    yield tmp_path
    for name in BROKEN_MODULES:  # the ones that import stay cached: the next test's files are its own
        sys.modules.pop(name, None)


BAD_HANDLERS = [
    ("raises_on_import:registry", ["'raises_on_import'", "RuntimeError", "handlers cannot start: no config"]),
    ("bad_syntax:registry", ["'bad_syntax'", "SyntaxError"]),
    ("nosuchmod:registry", ["'nosuchmod'", "ModuleNotFoundError"]),
    ("not_a_registry:registry", ["'not_a_registry:registry'", "int, not a TimerRegistry"]),
    ("factory_raises:registry", ["'factory_raises:registry'", "KeyError", "missing kind table"]),
    ("exits_on_import:registry", ["'exits_on_import'", "SystemExit: 3"]),
    ("durable_handlers:nosuchattr", ["'durable_handlers'", "no attribute 'nosuchattr'"]),
    ("nocolon", ["'nocolon'", "MODULE:ATTR"]),
]


@pytest.mark.parametrize("run, spec, needles",
                         [pytest.param(run_in_process, spec, needles, id=spec) for spec, needles in BAD_HANDLERS]
                         + [pytest.param(run_process, *BAD_HANDLERS[0], id="real-process")])
def test_bad_handlers_are_one_line_exit_2_and_create_no_database(handler_dir, run, spec, needles):
    """A handlers spec that cannot give a registry, for any reason (including a module raising
    while it is imported), exits 2 with exactly one stderr line naming the spec or module and
    the error; the SQLite file named by --store does not exist afterwards, because the handlers
    are checked before the store is opened."""
    db = handler_dir / "t7.db"
    before = sorted(p.name for p in handler_dir.iterdir())
    out = run(handler_dir, "--store", f"sqlite:///{db}", "--handlers", spec)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("timerwheel-c run: "), out.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert "Traceback" not in out.stderr
    after = sorted(p.name for p in handler_dir.iterdir() if p.name != "__pycache__")
    assert after == before and not db.exists()


@pytest.mark.parametrize("spec, shown", [("leaks_on_import:registry", "app:***@db"),
                                         ("factory_leaks:registry", "password=***")])
def test_a_password_in_a_failing_handlers_modules_error_is_masked(handler_dir, spec, shown):
    """The handlers' import or factory error is quoted in the one-line message with a database
    URL's or a connection string's password masked, as every log line masks it."""
    out = run_in_process(handler_dir, "--store", f"sqlite:///{handler_dir / 'x.db'}", "--handlers", spec)
    assert out.returncode == 2 and shown in out.stderr and "sekrit" not in out.stderr, out.stderr


@pytest.mark.parametrize("args", [
    ["run", "--handlers", "m:r", "--concurrency", "0"],
    ["run", "--handlers", "m:r", "--metrics-port", "99999"],
    ["run", "--handlers", "m:r", "--log-level", "bogus"],
    ["web", "--port", "x"],
    ["timers"],
    ["fleet", "--bogus"],
    ["schedules", "add"],
    ["bogus"],
], ids=" ".join)
def test_every_commands_usage_error_is_one_line_and_exit_2(handler_dir, args):
    """A usage error argparse finds, in any command or in none, is one line on stderr naming the
    command and the argument (the usage block only under --help), as the exit status promises."""
    out = run_cli(*args)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("timerwheel-c"), out.stderr
    assert "usage:" not in out.stderr


@pytest.mark.parametrize("level", ["debug", "Debug", "DEBUG"])
def test_debug_in_any_case_logs_the_handlers_traceback(handler_dir, level):
    """--log-level takes any case; at DEBUG the failing import's traceback (down to the user's
    own line) is logged, after which the same one-line error and exit 2 follow."""
    out = run_process(handler_dir, "--store", f"sqlite:///{handler_dir / 'x.db'}",
                  "--handlers", "raises_on_import:registry", "--log-level", level)
    assert out.returncode == 2, out.stderr
    assert "Traceback (most recent call last)" in out.stderr
    assert 'raise RuntimeError("handlers cannot start: no config")' in out.stderr
    assert out.stderr.splitlines()[-1].startswith("timerwheel-c run: --handlers 'raises_on_import:registry'")


def test_unknown_log_level_is_a_usage_error_naming_it(handler_dir):
    """An unknown level exits 2 through argparse, naming the value and the choices."""
    out = run_in_process(handler_dir, "--store", "sqlite:///x.db", "--handlers", "durable_handlers:registry",
                  "--log-level", "loud")
    assert out.returncode == 2
    assert "'LOUD'" in out.stderr and "DEBUG" in out.stderr
    assert not (handler_dir / "x.db").exists()


def test_bad_store_url_is_named_once_handlers_are_valid(tmp_path):
    """With valid handlers, an unsupported store URL exits 2 naming the URL."""
    out = run_in_process(tmp_path, "--store", "mysql://x", "--handlers", "durable_handlers:registry")
    assert out.returncode == 2 and "mysql://x" in out.stderr
    assert len(out.stderr.splitlines()) == 1, out.stderr


def test_unopenable_store_is_one_line_and_exit_2(tmp_path, capsys):
    """Bad input gets a clear, specific error: ``timerwheel-c run --store sqlite:////no/such/dir/x.db``
    (or a file that is not a database) exits 2 with one line naming the URL, like every other
    bad argument, not a ``sqlite3.OperationalError`` traceback."""
    not_a_db = tmp_path / "not-a-db"
    not_a_db.write_bytes(b"this is not sqlite" * 100)
    for url in (f"sqlite:///{tmp_path}/no/such/dir/x.db", f"sqlite:///{not_a_db}"):
        assert main(["run", "--store", url, "--handlers", "durable_handlers:registry"]) == 2
        assert url in capsys.readouterr().err


def test_a_registry_without_handlers_is_one_line_and_exit_2_before_the_store_is_opened(tmp_path, capsys):
    """``--handlers`` naming an empty TimerRegistry exits 2 with one line saying so (such a runner would
    hold partitions it cannot fire), and the store file is not even created."""
    db = tmp_path / "x.db"
    assert main(["run", "--store", f"sqlite:///{db}", "--handlers", "timerwheel_c.durable:TimerRegistry"]) == 2
    err = capsys.readouterr().err
    assert "no handler registered" in err and len(err.strip().splitlines()) == 1
    assert not db.exists()


@pytest.mark.parametrize("partition, shown", [("", "''"), ("a" * 300, "300 bytes"), ("\udcff", "'\\udcff'"),
                                              ("a\x00b", "NUL")], ids=["empty", "300 bytes", "not UTF-8", "NUL"])
def test_a_bad_partition_is_one_line_and_exit_2_before_the_store_is_opened(tmp_path, partition, shown):
    """A ``--partition`` no store can hold (empty, past 256 bytes, bytes that are not UTF-8 as the
    shell's ``$'\\xff'`` gives them, a NUL) is a bad argument: exit 2 and one line naming it, no
    traceback, and the store is not even created (it was, and then the service's own check raised)."""
    db = tmp_path / "x.db"
    out = run_cli("run", "--store", f"sqlite:///{db}", "--handlers", "durable_handlers:registry", "--partition",
                  partition)
    assert out.returncode == 2
    err = out.stderr
    assert "--partition" in err and shown in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not db.exists()


def test_refused_postgres_is_one_line_and_exit_2_with_the_password_masked(capsys):
    """A refused PostgreSQL connection (port 1 on loopback: nothing listens there) exits 2 with one
    line naming the URL, its password redacted."""
    pytest.importorskip("psycopg")
    url = "postgresql://postgres:sekrit@127.0.0.1:1/postgres?connect_timeout=5"
    assert main(["run", "--store", url, "--handlers", "durable_handlers:registry"]) == 2
    err = capsys.readouterr().err
    assert "postgresql://postgres:***@127.0.0.1:1/postgres" in err and "sekrit" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_concurrency_the_system_cannot_give_threads_for_is_one_line_and_exit_2(tmp_path):
    """--concurrency 1000 under an address-space limit too small for 1,000 thread stacks exits 2 with one
    line on stderr naming the option and the reason, not a traceback."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (1_500_000_000, 1_500_000_000))

    env = {**os.environ, "PYTHONPATH": str(HELPERS_DIR)}
    out = subprocess.run([sys.executable, "-m", "timerwheel_c", "run", "--store", f"sqlite:///{tmp_path / 't.db'}",
                          "--handlers", "durable_handlers:registry", "--concurrency", "1000"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60, preexec_fn=limit)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("timerwheel-c run: cannot start 1000 handler slot(s) (--concurrency)")


def test_non_ascii_names_in_a_c_locale_without_utf8_mode(tmp_path):
    """In a C locale with UTF-8 mode off (``-X utf8=0``), Python decodes argv and encodes stdout
    as ASCII: a partition typed as UTF-8 is still found (not refused as a lone surrogate), and a
    name the terminal cannot show is printed escaped, not an exit 2 "bad argument"."""
    import datetime

    from timerwheel_c.durable import SQLiteStore, TimerKind, schedule

    db = tmp_path / "t.db"
    store = SQLiteStore(db)
    schedule(store, "partition-ü", datetime.timedelta(hours=1), TimerKind(1), "réf".encode())
    store.close()
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0"}
    env.pop("PYTHONIOENCODING", None)

    def cli(*args):
        return subprocess.run([sys.executable, "-X", "utf8=0", "-m", "timerwheel_c", "timers", *args,
                               "--store", f"sqlite:///{db}"], env=env, cwd=tmp_path, capture_output=True,
                              timeout=TIMEOUT_S)

    listed = cli("list")
    assert listed.returncode == 0, listed.stderr
    assert b"partition-\\xfc" in listed.stdout
    shown = cli("show", "--partition", "partition-ü", "--kind", "1", "--reference", "réf")
    assert shown.returncode == 0, shown.stderr
    assert b"partition-\\xfc" in shown.stdout

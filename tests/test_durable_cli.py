"""``timerwheel-c run``'s argument handling: every bad argument, an unopenable store included,
is one line on stderr naming the value, and exit status 2, before anything is served.
(Serving and stopping on a signal are in test_durable_process.py.)"""
from __future__ import annotations

import pytest

from timerwheel_c.cli import main


def test_unopenable_store_is_one_line_and_exit_2(tmp_path, capsys):
    """Bad input gets a clear, specific error: ``timerwheel-c run --store sqlite:////no/such/dir/x.db``
    (or a file that is not a database) exits 2 with one line naming the URL, like every other
    bad argument, not a ``sqlite3.OperationalError`` traceback."""
    not_a_db = tmp_path / "not-a-db"
    not_a_db.write_bytes(b"this is not sqlite" * 100)
    for url in (f"sqlite:///{tmp_path}/no/such/dir/x.db", f"sqlite:///{not_a_db}"):
        assert main(["run", "--store", url, "--handlers", "timerwheel_c.durable:TimerRegistry"]) == 2
        assert url in capsys.readouterr().err


def test_empty_partition_is_one_line_and_exit_2(tmp_path, capsys):
    """``--partition ''`` is a bad argument: exit 2 and one line naming it, no traceback, and the
    store is not even created."""
    db = tmp_path / "x.db"
    assert main(["run", "--store", f"sqlite:///{db}", "--handlers", "timerwheel_c.durable:TimerRegistry", "--partition", ""]) == 2
    err = capsys.readouterr().err
    assert "--partition" in err and "''" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not db.exists()


def test_refused_postgres_is_one_line_and_exit_2_with_the_password_masked(capsys):
    """A refused PostgreSQL connection (port 1 on loopback: nothing listens there) exits 2 with one
    line naming the URL, its password redacted."""
    pytest.importorskip("psycopg")
    url = "postgresql://postgres:sekrit@127.0.0.1:1/postgres?connect_timeout=5"
    assert main(["run", "--store", url, "--handlers", "timerwheel_c.durable:TimerRegistry"]) == 2
    err = capsys.readouterr().err
    assert "postgresql://postgres:***@127.0.0.1:1/postgres" in err and "sekrit" not in err
    assert len(err.strip().splitlines()) == 1


def test_run_never_loads_the_bench_package(tmp_path):
    """``timerwheel-c run`` imports only what serving needs: in a fresh interpreter (from an empty
    directory, so the installed package is imported), parsing ``run --help`` leaves no module of
    ``timerwheel_c.bench`` loaded, while ``bench --help`` does load it (the check can fail)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from timerwheel_c.cli import main\n"
        "try:\n"
        "    main([sys.argv[1], '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('timerwheel_c.bench')))\n"
    )
    loaded = {}
    for command in ("run", "bench"):
        out = subprocess.run([sys.executable, "-c", code, command], capture_output=True, text=True,
                             timeout=120, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        loaded[command] = out.stdout.strip().splitlines()[-1]
    assert loaded["run"] == "[]"
    assert "timerwheel_c.bench.cli" in loaded["bench"]

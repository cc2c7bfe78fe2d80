"""``timerwheel-c run`` as an operator runs it: the store URL from ``TIMERWHEEL_C_STORE`` with no
password anywhere on the command line (libpq reads PGPASSWORD or PGPASSFILE), checked against a
throwaway PostgreSQL cluster of the test's own that requires a scram-sha-256 password (the shared
server trusts every local connection, so it could not tell); ``/metrics`` and ``/healthz`` over
real loopback HTTP; SIGTERM a clean exit 0. Bad input is one line and exit 2."""
from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import urllib.request

import pytest

from timerwheel_c.cli import main
from timerwheel_c.durable import open_store
from pg_cluster import throwaway_cluster
from locations import TESTS as HELPERS_DIR

TIMEOUT_S = 60.0
SECRET = "s3cret-pw"


def _env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "TIMERWHEEL_C_STORE"))}
    env.update(PYTHONPATH=os.pathsep.join([str(tmp_path), str(HELPERS_DIR)]), **extra)
    return env


def test_no_store_given_anywhere_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.delenv("TIMERWHEEL_C_STORE", raising=False)
    assert main(["run", "--handlers", "durable_handlers:registry"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "timerwheel-c run: no store: pass --store URL or set TIMERWHEEL_C_STORE"


def test_the_env_store_is_used_when_store_is_absent(tmp_path, monkeypatch, capsys):
    """TIMERWHEEL_C_STORE names the store (here an unsupported URL, so the error shows it was read)."""
    monkeypatch.setenv("TIMERWHEEL_C_STORE", "mysql://nope")
    assert main(["run", "--handlers", "durable_handlers:registry"]) == 2
    assert "'mysql://nope'" in capsys.readouterr().err


@pytest.mark.parametrize("port", ["-1", "65536", "http"])
def test_a_bad_metrics_port_is_a_usage_error_naming_it(port, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--store", "sqlite:///x.db", "--handlers", "durable_handlers:registry", "--metrics-port", port])
    assert exc.value.code == 2
    assert port in capsys.readouterr().err


@pytest.fixture(scope="module")
def scram_cluster():
    with throwaway_cluster(auth="scram-sha-256", password=SECRET) as (dsn, pg_ctl):
        yield dsn


def _no_password_url(dsn):
    return dsn.replace(f":{SECRET}@", "@")


def test_a_taken_metrics_port_is_one_line_exit_2_before_the_store_file_is_created(tmp_path, monkeypatch, capsys):
    """--metrics-port on a port another socket listens on is a bad argument like any other: one line
    naming it, exit 2, and, as for every bad argument, no new SQLite file left behind."""
    import socket

    monkeypatch.syspath_prepend(str(HELPERS_DIR))
    db = tmp_path / "new.db"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status = main(["run", "--store", f"sqlite:///{db}", "--handlers", "durable_handlers:registry",
                       "--metrics-port", str(port)])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1 and f"--metrics-port {port}" in err, err
    assert not db.exists()


@pytest.mark.slow
def test_run_from_env_store_with_pgpassword_serves_metrics_and_stops_on_sigterm(tmp_path, scram_cluster):
    """The password comes only from PGPASSWORD: not in argv (psutil reads the live command line),
    not in the environment's store URL. The runner connects (the cluster refuses a connection
    without the password), serves /healthz 200 and /metrics, and exits 0 on SIGTERM."""
    psutil = pytest.importorskip("psutil")
    url = _no_password_url(scram_cluster)
    env = _env(tmp_path, TIMERWHEEL_C_STORE=url, PGPASSWORD=SECRET)
    proc = subprocess.Popen([sys.executable, "-m", "timerwheel_c", "run", "--handlers", "durable_handlers:registry",
                             "--partition", "ops", "--metrics-port", "0", "--release-claims-on-stop"],
                            cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True)
    reader.start()
    try:
        port = None
        seen = []
        while port is None:
            line = lines.get(timeout=TIMEOUT_S)
            seen.append(line)
            m = re.search(r"serving /metrics and /healthz on http://127\.0\.0\.1:(\d+)", line)
            port = int(m.group(1)) if m else None
        assert SECRET not in " ".join(psutil.Process(proc.pid).cmdline())
        for _ in range(int(TIMEOUT_S / 0.1)):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            threading.Event().wait(0.1)
        else:
            pytest.fail("the runner never became healthy")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert "timerwheel_owned_partitions 1.0" in r.read().decode()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT_S) == 0
        reader.join(TIMEOUT_S)
        while not lines.empty():
            seen.append(lines.get())
        assert "stopped" in seen[-1] and SECRET not in "".join(seen)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_a_url_without_password_and_no_pgpassword_is_refused_in_one_line(tmp_path, scram_cluster):
    """The same URL without PGPASSWORD: the cluster really checks the password, so the run exits 2
    with one line (no traceback)."""
    url = _no_password_url(scram_cluster)
    out = subprocess.run([sys.executable, "-m", "timerwheel_c", "run", "--handlers", "durable_handlers:registry"],
                         cwd=tmp_path, env=_env(tmp_path, TIMERWHEEL_C_STORE=url, PGPASSFILE=str(tmp_path / "none")),
                         capture_output=True, text=True, timeout=TIMEOUT_S)
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "cannot open store" in out.stderr


@pytest.mark.slow
def test_a_pgpass_file_supplies_the_password(tmp_path, scram_cluster):
    """PGPASSFILE (libpq's ~/.pgpass format, mode 0600) supplies the password: the run connects and
    exits 0 on SIGTERM."""
    pgpass = tmp_path / "pgpass"
    pgpass.write_text(f"*:*:*:postgres:{SECRET}\n")
    pgpass.chmod(0o600)
    env = _env(tmp_path, TIMERWHEEL_C_STORE=_no_password_url(scram_cluster), PGPASSFILE=str(pgpass))
    proc = subprocess.Popen([sys.executable, "-m", "timerwheel_c", "run", "--handlers", "durable_handlers:registry",
                             "--partition", "ops"], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if "serving" in line:
                break
        else:
            pytest.fail(f"the runner exited {proc.wait()} before serving")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_schedules_commands_read_the_env_store_too(tmp_path, monkeypatch, capsys):
    """Every command takes TIMERWHEEL_C_STORE when --store is absent: schedules add then list."""
    open_store(f"sqlite:///{tmp_path / 'env.db'}").close()  # a runner made it: these commands never do
    monkeypatch.setenv("TIMERWHEEL_C_STORE", f"sqlite:///{tmp_path / 'env.db'}")
    assert main(["schedules", "add", "--partition", "p", "beat", "--every", "60", "--kind", "8"]) == 0
    capsys.readouterr()
    assert main(["schedules", "list", "--json"]) == 0
    assert '"beat"' in capsys.readouterr().out
    monkeypatch.delenv("TIMERWHEEL_C_STORE")
    assert main(["schedules", "list"]) == 2
    assert capsys.readouterr().err.strip() == ("timerwheel-c schedules list: no store: pass --store URL "
                                               "or set TIMERWHEEL_C_STORE")

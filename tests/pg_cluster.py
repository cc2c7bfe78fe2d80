"""A PostgreSQL cluster of a test's own (never the shared server), for tests that stop the server
or need a password check (the shared server trusts every local connection).

``throwaway_cluster(auth="trust", password=None)`` is a context manager yielding ``(dsn, pg_ctl)``:
``dsn`` connects as the superuser ``postgres`` (with ``password`` in it when given), and
``pg_ctl(*args)`` runs pg_ctl on the cluster (``"stop"``, ``"start"``, ``"restart", "-m", "fast"``).
``auth``: initdb's ``-A`` method, e.g. ``"scram-sha-256"`` so that a wrong or missing password is
refused. Skips the test when the server binaries or psycopg are missing.

``fresh_schema_url(dsn)`` is a context manager yielding the URL of a fresh schema on the server of
``dsn`` (the URL's sessions use it), dropped afterwards.

``pgbouncer(dsn, pool_mode)`` is a context manager yielding the URL of a PgBouncer of the test's own
in front of the server of ``dsn`` (a ``postgresql://user@host:port/db`` URL of a trusting server),
pooling in ``pool_mode`` with ``pool_size`` server sessions. Skips the test when pgbouncer is not installed.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Optional
from urllib.parse import quote

import pytest
from free_port import free_port

PGBIN = Path(os.environ.get("PGBIN", "/usr/lib/postgresql/15/bin"))


@contextlib.contextmanager
def throwaway_cluster(auth: str = "trust", password: Optional[str] = None):
    if not (PGBIN / "initdb").exists():
        pytest.skip(f"no PostgreSQL server binaries in {PGBIN}")
    pytest.importorskip("psycopg")
    root = Path(tempfile.mkdtemp(prefix="timerwheel-c-pg-"))
    as_pg = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        as_pg = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    data = root / "data"
    init = [*as_pg, str(PGBIN / "initdb"), "-D", str(data), "-A", auth, "-U", "postgres"]
    if password is not None:
        pwfile = root / "pw"
        pwfile.write_text(password + "\n")
        if as_pg:
            shutil.chown(pwfile, "postgres")
        init += ["--pwfile", str(pwfile)]
    subprocess.run(init, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"

    def pg_ctl(*args):
        subprocess.run([*as_pg, str(PGBIN / "pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-w", "-o", opts, *args],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    pg_ctl("start")
    try:
        secret = "" if password is None else f":{password}"
        yield f"postgresql://postgres{secret}@127.0.0.1:{port}/postgres", pg_ctl
    finally:
        subprocess.run([*as_pg, str(PGBIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def fresh_schema_url(dsn: str):
    import psycopg

    schema = f"fleet_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in dsn else "?"
    try:
        yield f"{dsn}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@contextlib.contextmanager
def pgbouncer(dsn: str, pool_mode: str, pool_size: int = 4):
    from urllib.parse import urlsplit

    binary = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None)
    if binary is None:
        pytest.skip("no pgbouncer (apt-get install pgbouncer)")
    url = urlsplit(dsn)
    root = Path(tempfile.mkdtemp(prefix="timerwheel-c-pgbouncer-"))
    as_user = []
    if os.geteuid() == 0:  # pgbouncer refuses to run as root
        shutil.chown(root, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    ini = root / "pgbouncer.ini"
    ini.write_text(f"""[databases]
{url.path.lstrip("/")} = host={url.hostname} port={url.port} user={url.username}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = any
pool_mode = {pool_mode}
default_pool_size = {pool_size}
logfile = {root / "log"}
pidfile = {root / "pid"}
""")
    proc = subprocess.Popen([*as_user, binary, str(ini)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {(root / 'log').read_text() if (root / 'log').exists() else ''}")
            import time
            time.sleep(0.02)
        yield f"postgresql://{url.username}@127.0.0.1:{port}{url.path}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)

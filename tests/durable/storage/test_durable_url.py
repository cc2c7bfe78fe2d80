"""Store URLs (sqlite:///PATH, SQLAlchemy style) and the benchmark's result contract."""
from __future__ import annotations

import os

import pytest

from bench import durable as bench_durable
from timerwheel_c.durable.storage.sqlite import SQLiteStore
from timerwheel_c.durable.storage.open import open_store
from free_port import free_port
from locations import CHECKOUT, TESTS


def test_sqlite_urls(tmp_path, monkeypatch):
    """Four slashes give an absolute path, three a relative one, :memory: an in-memory database;
    other schemes and empty paths are ValueErrors naming the URL."""
    with open_store(f"sqlite:///{tmp_path}/abs.db") as s:
        assert isinstance(s, SQLiteStore) and s.path == f"{tmp_path}/abs.db"
    monkeypatch.chdir(tmp_path)
    with open_store("sqlite:///rel.db") as s:
        assert s.path == "rel.db" and (tmp_path / "rel.db").exists()
    with open_store("sqlite:///:memory:") as s:
        assert s.path == ":memory:"
    for bad in ("sqlite://x.db", "sqlite:///", "redis://h"):
        with pytest.raises(ValueError, match="sqlite"):
            open_store(bad)
    with pytest.raises(TypeError):
        open_store(None)


@pytest.mark.parametrize("suffix", ["?mode=ro", "?cache=shared&timeout=5", "#main", "?"])
def test_a_sqlite_url_with_a_query_or_a_fragment_is_refused_and_makes_no_file(tmp_path, suffix):
    """SQLAlchemy's and SQLite's own URIs take options after a '?': this one takes a path alone and
    would have opened (for ``timerwheel-c run``, made) a new, empty store in a file named with the
    option, beside the application's, whose timers then never fired. Refused, naming the URL."""
    url = f"sqlite:///{tmp_path}/timers.db{suffix}"
    for read_only in (False, True):
        with pytest.raises(ValueError, match=r"timers\.db.*no query \(\?\.\.\.\) or fragment \(#\.\.\.\)"):
            open_store(url, read_only=read_only)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["run", "--handlers", "durable_handlers:registry"], ["timers", "list"],
                                     ["schedules", "list"], ["fleet", "status"],
                                     ["timers", "cancel", "--partition", "p", "--kind", "1", "--reference", "r"]])
def test_every_command_refuses_a_sqlite_url_with_a_query_naming_it(tmp_path, capsys, command):
    """Given ``sqlite:///timers.db?mode=ro`` for a store that exists, every command exits 2 with one line
    saying a sqlite:/// URL takes no query, and makes no file: ``run`` served a new store named with the
    query, and the other commands said there was no store at that name, though timers.db held one."""
    from timerwheel_c.cli import main

    SQLiteStore(str(tmp_path / "timers.db")).close()
    before = sorted(tmp_path.iterdir())
    assert main([*command, "--store", f"sqlite:///{tmp_path}/timers.db?mode=ro"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no query (?...) or fragment (#...)" in err, err
    assert sorted(tmp_path.iterdir()) == before


@pytest.mark.slow  # runs every durable workload of the bench, small: seconds
def test_bench_contract_shape():
    """bench.durable.run returns {"sqlite": {"fired_per_s": float > 0, "lateness_ms": [n floats], and the
    service figures: "wakeup_lateness_ms": [n floats], "fired_per_s_20ms": {"1": .., "16": ..} with no
    duplicate effect, "watcher_idle_cpu_pct": float >= 0}} and reports progress for every item (n drained,
    n lateness timers, n cross-process timers, n fires at each concurrency). No speed is asserted."""
    done = []
    result = bench_durable.run(n_timers=40, progress=done.append)
    assert set(result) == {"sqlite"}
    r = result["sqlite"]
    assert r["fired_per_s"] > 0 and len(r["lateness_ms"]) == 40
    assert all(isinstance(x, float) for x in r["lateness_ms"])
    assert len(r["wakeup_lateness_ms"]) == 40 and all(isinstance(x, float) for x in r["wakeup_lateness_ms"])
    assert set(r["fired_per_s_20ms"]) == {"1", "16"}
    assert all(f["timers"] == 40 and f["fired_per_s"] > 0 and f["duplicates"] == 0 for f in r["fired_per_s_20ms"].values())
    assert r["watcher_idle_cpu_pct"] >= 0
    assert sum(done) == 5 * 40
    with pytest.raises(ValueError, match="n_timers"):
        bench_durable.run(n_timers=0)


@pytest.mark.skipif(not os.environ.get("TIMERWHEEL_C_TEST_PG_DSN"), reason="no TIMERWHEEL_C_TEST_PG_DSN")
def test_postgresql_url_opens_a_postgres_store():
    """A postgresql:// URL opens a PostgresStore on the default table."""
    from timerwheel_c.durable.storage.postgres import PostgresStore

    with open_store(os.environ["TIMERWHEEL_C_TEST_PG_DSN"]) as s:
        assert isinstance(s, PostgresStore) and s.table == "timerwheel_kv"
        s.partitions()


# -- the password of a store URL never reaches an output --------------------------------------

PASSWORD = "Zq7-pa55word-Xk"


@pytest.mark.parametrize("url, shown", [
    (f"postgresql://app:{PASSWORD}@db.example:5432/timers", "postgresql://app:***@db.example:5432/timers"),
    (f"postgres://app:{PASSWORD}@db.example/timers?sslmode=require",
     "postgres://app:***@db.example/timers?sslmode=require"),
    (f"postgresql://db.example/timers?user=app&password={PASSWORD}&sslmode=require",
     "postgresql://db.example/timers?user=app&password=***&sslmode=require"),
    (f"host=db.example user=app password={PASSWORD} dbname=timers", "host=db.example user=app password=*** dbname=timers"),
    (f"host=db.example password='{PASSWORD} x' dbname=timers", "host=db.example password=*** dbname=timers"),
    ("postgresql://app:p%40ss@db.example/timers", "postgresql://app:***@db.example/timers"),
    ("postgresql://app@db.example:5432/timers", "postgresql://app@db.example:5432/timers"),
    (f"postgresql://app:{PASSWORD} x@db.example/timers", "postgresql://app:***@db.example/timers"),
    (f"postgresql://app:{PASSWORD}\t@db.example/timers", "postgresql://app:***@db.example/timers"),
    (f"postgresql://app@db.example/timers?sslpassword={PASSWORD}", "postgresql://app@db.example/timers?sslpassword=***"),
    (f"host=db.example sslpassword={PASSWORD}", "host=db.example sslpassword=***"),
    ("sqlite:////var/lib/timers.db", "sqlite:////var/lib/timers.db"),
])
def test_redact_masks_the_password_and_keeps_the_rest(url, shown):
    """A URL's userinfo password, a ``password=`` query parameter and a keyword/value password
    are masked; user, host, port, database and options stay, so the line still says where."""
    from timerwheel_c.durable.storage.redact import redact

    assert redact(url) == shown


def test_redact_masks_a_password_quoted_verbatim_in_any_text():
    """A driver message quoting the password alone (not as a URL) is masked too, raw and
    percent-decoded, given the URL it came from."""
    from timerwheel_c.durable.storage.redact import redact

    url = "postgresql://app:p%40ss-Q9@db.example/timers"
    message = 'connection failed near "p@ss-Q9" and "p%40ss-Q9"'
    assert redact(message, url) == 'connection failed near "***" and "***"'
    assert redact("nothing secret", None) == "nothing secret"


@pytest.mark.parametrize("url, text, shown", [
    # A short password: masked where the URL quotes it, never in unrelated text (its places would
    # give it away: "1" out of "127.0.0.1" and "1001").
    ("postgresql://postgres:1@127.0.0.1:55451/postgres",
     "invoice 2021-10 for customer 1001 declined (HTTP 402) at 127.0.0.1",
     "invoice 2021-10 for customer 1001 declined (HTTP 402) at 127.0.0.1"),
    ("postgresql://app:1@127.0.0.1:1/db1",
     'cannot open store \'postgresql://app:1@127.0.0.1:1/db1\': connection to server at "127.0.0.1", port 1 failed',
     'cannot open store \'postgresql://app:***@127.0.0.1:1/db1\': connection to server at "127.0.0.1", port 1 failed'),
    # A password that is also its URL's user, or a part of its host, stays where the URL names them;
    # a URL's scheme is never masked.
    ("postgresql://postgres:postgres@127.0.0.1:55451/nosuchdb",
     "cannot open store 'postgresql://postgres:postgres@127.0.0.1:55451/nosuchdb': database \"nosuchdb\"",
     "cannot open store 'postgresql://postgres:***@127.0.0.1:55451/nosuchdb': database \"nosuchdb\""),
    ("host=db user=timers password=timers dbname=timers", "role timers: timers-table failed",
     "role timers: timers-table failed"),
    ("postgresql://app:example@db.example.com/x", "host db.example.com unreachable", "host db.example.com unreachable"),
    ("postgresql://app:postgres@db/x", "cannot open 'postgresql://app:postgres@db/x': password for postgres rejected",
     "cannot open 'postgresql://app:***@db/x': password for *** rejected"),
    # A long enough password is masked wherever it stands: percent-encoded, inside a longer word, in
    # text without spaces, before digits.
    ("postgresql://app:s3cretpass@db/orders",
     "GET /x?dsn=postgresql%3A%2F%2Fapp%3As3cretpass%40db -> 500; KeyError: 'cache_s3cretpass'; "
     "认证失败：密码s3cretpass错误; token s3cretpass2024 rejected",
     "GET /x?dsn=postgresql%3A%2F%2Fapp%3A***%40db -> 500; KeyError: 'cache_***'; 认证失败：密码***错误; token ***2024 rejected"),
    # A keyword/value string names no path: its password is masked wherever it stands.
    ("host=db user=app password=Kw0rdpass dbname=orders", "driver said Kw0rdpass", "driver said ***"),
    # A password that holds "://", or stands as a scheme's whole name, is masked all the same.
    ("host=h user=u password=pa://ssword", "error near pa://ssword; s3cret.pw://x",
     "error near ***; s3cret.pw://x"),
    ("postgresql://u:s3cret.pw@h/db", "see s3cret.pw://x", "see ***://x"),
    # A password's tail after an unencoded "@", as libpq quotes it inside a host name, is still masked.
    ("postgresql://app:p@ss-Q9x@db/timers", "failed to resolve host 'ss-Q9x@db'", "failed to resolve host '***db'"),
])
def test_redact_masks_verbatim_only_long_passwords_no_url_names_in_the_open(url, text, shown):
    """Outside a URL or a password= parameter, a password is masked wherever it stands (never in a
    URL's scheme) when it has at least MIN_VERBATIM characters and its own URL does not also name it
    as, or in, its user, host, port or database."""
    from timerwheel_c.durable.storage.redact import MIN_VERBATIM, redact

    assert MIN_VERBATIM == 5
    assert redact(text, url) == shown


def test_a_remembered_password_is_masked_whatever_another_store_names_in_the_open():
    """The exemption of a password its own URL names in the open is that URL's alone: a store whose
    database is named as another store's password leaves that password masked."""
    from timerwheel_c.durable.storage.redact import redact, remember

    remember("postgresql://app:Rq8reports@db1/app")
    remember("postgresql://bi@db2/Rq8reports")
    assert redact("handler failed: auth with Rq8reports denied") == "handler failed: auth with *** denied"


def test_unsupported_store_url_error_masks_the_password():
    """open_store's ValueError names the URL with its password masked."""
    with pytest.raises(ValueError, match=r"mysql://app:\*\*\*@db") as exc:
        open_store(f"mysql://app:{PASSWORD}@db/timers")
    assert PASSWORD not in str(exc.value)


def test_redacting_formatter_masks_messages_and_tracebacks(caplog):
    """A log record whose message, arguments or traceback quote the URL is masked in the formatted
    line, and the record itself is left intact for other handlers."""
    import logging

    from timerwheel_c.durable.service.logs import RedactingFormatter

    url = f"postgresql://app:{PASSWORD}@db/timers"
    log = logging.getLogger("timerwheel_c.test_redaction")
    caplog.handler.setFormatter(RedactingFormatter(None, url))
    with caplog.at_level(logging.DEBUG, logger=log.name):
        log.info("serving %s", url)
        try:
            raise RuntimeError(f"cannot reach {PASSWORD}")
        except RuntimeError:
            log.exception("pass failed")
    assert "serving postgresql://app:***@db/timers" in caplog.text
    assert "cannot reach ***" in caplog.text
    assert PASSWORD not in caplog.text
    assert caplog.records[0].args == (url,), "the shared record is not rewritten"


def _with_password(dsn: str) -> str:
    """``dsn`` (a postgresql:// URL) with PASSWORD as its password (trust auth ignores it)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(dsn)
    netloc = f"{parts.username or 'postgres'}:{PASSWORD}@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _assert_no_password(*outputs) -> None:
    for output in outputs:
        text = output if isinstance(output, str) else output.decode(errors="replace")
        assert PASSWORD not in text, text[-2000:]


def _cli(*args) -> list:
    import sys

    return [sys.executable, "-m", "timerwheel_c", *args]


@pytest.mark.parametrize("refusal", ["closed port", "unknown role", "space in the password"])
def test_run_cli_never_prints_the_password_of_a_store_it_cannot_open(tmp_path, refusal):
    """``timerwheel-c run --log-level DEBUG`` on a PostgreSQL URL with a password, which a closed
    port, the real server (a role that does not exist) or libpq's URL parser (an unencoded space
    in the password) refuses, exits 2 with one line naming the masked URL; no output holds the
    password."""
    import subprocess
    from urllib.parse import urlsplit

    pytest.importorskip("psycopg")
    if refusal == "closed port":
        url = f"postgresql://app:{PASSWORD}@127.0.0.1:{free_port()}/timers?connect_timeout=5"
    elif refusal == "space in the password":
        url = f"postgresql://app:{PASSWORD} x@127.0.0.1:{free_port()}/timers?connect_timeout=5"
    else:
        if not os.environ.get("TIMERWHEEL_C_TEST_PG_DSN"):
            pytest.skip("no TIMERWHEEL_C_TEST_PG_DSN")
        url = _with_password(os.environ["TIMERWHEEL_C_TEST_PG_DSN"]).replace(
            f"{urlsplit(os.environ['TIMERWHEEL_C_TEST_PG_DSN']).username or 'postgres'}:", "no_such_role_x:", 1)
    out = subprocess.run(_cli("run", "--store", url, "--handlers", "durable_handlers:registry",
                              "--log-level", "DEBUG"),
                         cwd=tmp_path, capture_output=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(TESTS)))
    assert out.returncode == 2, out.stderr
    assert b"cannot open store 'postgresql://" in out.stderr and b":***@" in out.stderr  # the failure arose
    _assert_no_password(out.stdout, out.stderr)


@pytest.mark.skipif(not os.environ.get("TIMERWHEEL_C_TEST_PG_DSN"), reason="no TIMERWHEEL_C_TEST_PG_DSN")
def test_run_cli_never_logs_the_password_while_serving(tmp_path):
    """``timerwheel-c run --log-level DEBUG`` serving a real PostgreSQL store from a URL with a
    password logs its "serving" line with the password masked, and nothing else holds it
    either, through to a clean stop on SIGTERM."""
    import signal
    import subprocess
    import time

    pytest.importorskip("psycopg")
    url = _with_password(os.environ["TIMERWHEEL_C_TEST_PG_DSN"])
    handlers = TESTS
    env = dict(os.environ, PYTHONPATH=str(handlers))
    err_path, out_path = tmp_path / "stderr", tmp_path / "stdout"
    with open(err_path, "wb") as err, open(out_path, "wb") as out:
        proc = subprocess.Popen(_cli("run", "--store", url, "--handlers", "durable_handlers:registry",
                                     "--partition", "redaction", "--log-level", "DEBUG"),
                                cwd=tmp_path, env=env, stdout=out, stderr=err)
        try:
            deadline = time.monotonic() + 30
            while b"serving" not in err_path.read_bytes() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert b"serving postgresql://" in err_path.read_bytes(), err_path.read_bytes()  # the situation arose
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert b":***@" in err_path.read_bytes()
    _assert_no_password(out_path.read_bytes(), err_path.read_bytes())


# Reachable, it runs the bench's whole durable section against the server: minutes on a loaded machine.
@pytest.mark.parametrize("reachable", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["unreachable", "reachable"])
def test_bench_never_prints_or_writes_the_pg_dsn_password(tmp_path, reachable):
    """``python bench/run.py --only durable --pg-dsn URL`` with a password: on a closed port (the
    run stops before any workload, exit 2, naming the masked DSN) and on the real server (it
    succeeds), neither stdout, stderr nor the ``--json`` file holds the password; the JSON
    records the masked DSN."""
    import json
    import subprocess
    import sys

    pytest.importorskip("psycopg")
    if reachable:
        if not os.environ.get("TIMERWHEEL_C_TEST_PG_DSN"):
            pytest.skip("no TIMERWHEEL_C_TEST_PG_DSN")
        dsn = _with_password(os.environ["TIMERWHEEL_C_TEST_PG_DSN"])
    else:
        dsn = f"postgresql://app:{PASSWORD}@127.0.0.1:{free_port()}/timers?connect_timeout=5"
    path = tmp_path / "figures.json"
    bench_run = CHECKOUT / "bench" / "run.py"
    out = subprocess.run([sys.executable, str(bench_run), "--only", "durable", "--pg-dsn", dsn, "--scale", "0.002",
                          "--repeat", "1", "--plain", "--json", str(path)],
                         cwd=tmp_path, capture_output=True, timeout=300)
    if not reachable:
        assert out.returncode == 2 and b"--pg-dsn 'postgresql://app:***@127.0.0.1:" in out.stderr, out.stderr
        assert not path.exists()  # stopped before any workload: no figures to write
        _assert_no_password(out.stdout, out.stderr)
        return
    figures = json.loads(path.read_text())
    assert out.returncode == 0, out.stderr
    assert "postgres" in figures["workloads"]["durable"]["results"]
    assert ":***@" in figures["config"]["pg_dsn"]
    _assert_no_password(out.stdout, out.stderr, path.read_text())


def test_postgresql_url_without_psycopg_gives_the_install_hint(monkeypatch, capsys):
    """Without psycopg installed (simulated: the import fails), open_store("postgresql://...") raises
    ModuleNotFoundError with ``pip install 'timerwheel_c[postgres]'``, and ``timerwheel-c run`` prints
    that hint on one line and exits 2, the password masked."""
    import sys

    from timerwheel_c.cli import main

    monkeypatch.setitem(sys.modules, "psycopg", None)
    backend = "timerwheel_c.durable.storage.postgres"
    for name in [name for name in sys.modules if name == backend or name.startswith(backend + ".")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'timerwheel_c\[postgres\]'"):
        open_store("postgresql://u@127.0.0.1:1/db")
    url = "postgresql://u:s3cr3t@127.0.0.1:1/db"
    assert main(["run", "--store", url, "--handlers", "durable_handlers:registry"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'timerwheel_c[postgres]'" in err and "s3cr3t" not in err and len(err.strip().splitlines()) == 1


# -- every DSN form is masked whole, wherever one can be passed --------------------------------

SECRET = "Xy7&kP2q-Secret"
SECRET_PIECES = ("Xy7", "kP2q-Secret", "kP2q")  # a mask that stops at "&" or a space leaves one of these


def _assert_no_secret(text: str) -> None:
    for piece in SECRET_PIECES:
        assert piece not in text, text


@pytest.mark.parametrize("dsn, shown", [
    (f"host=db.example user=app password={SECRET} dbname=timers", "host=db.example user=app password=*** dbname=timers"),
    ("host=db.example password='Xy7 kP2q-Secret' dbname=timers", "host=db.example password=*** dbname=timers"),
    (r"host=db.example password='Xy7\' kP2q-Secret' dbname=timers", "host=db.example password=*** dbname=timers"),
    ("host=db.example password='Xy7 kP2q-Secret", "host=db.example password=***"),
    ("host=db.example password = Xy7&kP2q-Secret", "host=db.example password = ***"),
    (f"postgresql://app@db.example/timers?password={SECRET}&sslmode=require",
     "postgresql://app@db.example/timers?password=***&sslmode=require"),
    (f"postgresql://app@db.example/timers?sslmode=require&password={SECRET}",
     "postgresql://app@db.example/timers?sslmode=require&password=***"),
    # A "/" left unencoded in a URL's password: a URL parser ends the authority there, the user did not.
    ("postgresql://app:Xy7/kP2q-Secret@db.example:5432/timers", "postgresql://app:***@db.example:5432/timers"),
    ("cannot open 'postgresql://app:Xy7/kP2q@Secret@db/t': no", "cannot open 'postgresql://app:***@db/t': no"),
])
def test_redact_masks_a_keyword_value_or_query_password_whole(dsn, shown):
    """A keyword/value password runs to the next whitespace (libpq reads ``password=Xy7&kP2q``
    as ``Xy7&kP2q``) or to its closing quote (an unclosed one to the end); a query password
    not percent-encoded runs over the pieces without ``=`` that follow it; a URL's password with a
    ``/`` runs to the last ``@``. All of it is masked."""
    from timerwheel_c.durable.storage.redact import redact

    assert redact(dsn) == shown


def test_redact_masks_what_libpq_quotes_back_of_a_password():
    """libpq's refusal of an unencoded ``&`` in a URL's password quotes the tail of the password
    alone; given the URL, that tail is masked too."""
    import psycopg

    from timerwheel_c.durable.storage.redact import redact

    url = f"postgresql://app@127.0.0.1:1/timers?password={SECRET}"
    with pytest.raises(psycopg.Error) as exc:
        psycopg.connect(url, connect_timeout=2)
    assert "kP2q-Secret" in str(exc.value)  # the situation arose: the driver quotes a piece of it
    _assert_no_secret(redact(str(exc.value), url))


@pytest.mark.parametrize("command", [["run", "--handlers", "durable_handlers:registry"], ["timers", "list"],
                                     ["schedules", "list"], ["fleet", "status"]])
@pytest.mark.parametrize("dsn", [
    f"host=127.0.0.1 port=1 user=app password={SECRET} dbname=timers",
    "host=127.0.0.1 port=1 password='Xy7 kP2q-Secret'",
    f"postgresql://app@127.0.0.1:1/timers?password={SECRET}",
    f"postgresql://app:{SECRET.replace('&', '%26')}@127.0.0.1:1/timers?connect_timeout=2",
], ids=["keyword", "quoted keyword", "query not encoded", "url"])
def test_every_command_masks_every_dsn_form_whole(capsys, command, dsn):
    """``run``, ``timers list``, ``schedules list`` and ``fleet status`` given a store they cannot
    open (a keyword/value string open_store does not take, a URL libpq refuses, a closed port)
    exit 2 with one line on stderr, and no piece of the password is in any output."""
    from timerwheel_c.cli import main

    pytest.importorskip("psycopg")
    assert main([*command, "--store", dsn]) == 2
    out = capsys.readouterr()
    assert len(out.err.strip().splitlines()) == 1, out.err
    assert "***" in out.err  # the line names the store, masked
    _assert_no_secret(out.out + out.err)


def test_a_dsn_passed_where_the_registry_goes_is_masked_in_the_type_error():
    """``DurableTimerService(store, DSN)`` and ``claim_due(store, partition, DSN, ...)`` raise a
    TypeError naming what was passed, its password masked whole."""
    from timerwheel_c.durable import DurableTimerService, SQLiteStore
    from timerwheel_c.durable.timers.claim import claim_due

    dsn = f"host=db.example user=app password={SECRET} dbname=timers"
    with SQLiteStore(":memory:") as store:
        for call in (lambda: DurableTimerService(store, dsn), lambda: DurableTimerService(store, [dsn]),
                     lambda: claim_due(store, "p", dsn, 0)):
            with pytest.raises(TypeError, match="registry must be a TimerRegistry") as exc:
                call()
            assert "password=***" in str(exc.value)
            _assert_no_secret(str(exc.value))


@pytest.mark.parametrize("dsn", [f"host=db.example user=app password={SECRET} dbname=timers",
                                 "host=db.example password='Xy7 kP2q-Secret'"])
def test_open_store_masks_a_keyword_value_dsn_whole(dsn):
    """open_store takes URLs only: a keyword/value DSN is refused with a ValueError naming it, its
    password masked whole."""
    with pytest.raises(ValueError, match=r"unsupported store URL .*password=\*\*\*") as exc:
        open_store(dsn)
    _assert_no_secret(str(exc.value))


def test_redact_masks_the_host_libpq_quotes_back_of_a_password_with_an_unencoded_at():
    """libpq ends a URL's password at its first ``@`` and reads the rest as the host, which its
    error quotes back (``failed to resolve host 'Qm8-tail@127.0.0.1'``); given the URL, that tail
    of the password is masked too, not only the part a URL parser calls the password."""
    import psycopg

    from timerwheel_c.durable.storage.redact import redact

    url = "postgresql://app:Wv3-head@Qm8-tail@127.0.0.1:1/timers"
    with pytest.raises(psycopg.Error) as exc:
        psycopg.connect(url, connect_timeout=2)
    assert "Qm8-tail" in str(exc.value)  # the situation arose: the driver quotes the tail as a host
    shown = redact(str(exc.value), url)
    assert "Qm8-tail" not in shown and "Wv3-head" not in shown, shown
    assert "127.0.0.1" in shown  # the host the user meant is still named


# Malformed store URLs and DSNs: no URL parser finds their password, yet a user's typo must not print it.
LOOSE_SECRET = "Vb4-loose-Secret"
MALFORMED = [
    "postgresql:/u:{pw}@127.0.0.1/db", "postgresql//u:{pw}@127.0.0.1/db", "postgresql:u:{pw}@127.0.0.1/db",
    "postgres:/:{pw}@h/db", "sqlite:/u:{pw}@h/db", "sqlite:///u:{pw}@h/db", "sqlite://u:{pw}@h/db",
    "postgresql:/u:{pw}/x@h/db", "postgresql:/u:{pw}@x@h/db", "postgresql:/u::{pw}@h/db", "u:{pw}@h:5432/db",
    "store=postgresql:u:{pw}@h/db", "mysql:/u:{pw}@h", "postgresql:/u:{pw} tail@h/db",
    "host=h password={pw}", "host=h password='{pw}'", "host=h PASSWORD = '{pw} x' user=u",
    "postgresql:/h/db?password={pw}", "host=h sslpassword={pw}&x",
]
MALFORMED_IDS = [shape.split("{pw}")[0] + "PW" + shape.split("{pw}")[1] for shape in MALFORMED]


def _malformed(shape: str) -> str:
    return shape.format(pw=LOOSE_SECRET)


@pytest.mark.parametrize("shape", MALFORMED, ids=MALFORMED_IDS)
def test_redact_masks_the_password_of_a_malformed_url_or_dsn(shape):
    """A password in text shaped like a store URL or DSN that no URL parser reads (a slash short or
    missing, no scheme, a key/value string) is masked by its place: USER:PASSWORD@ after any prefix,
    ``password=`` quoted or not; one with whitespace is masked given the text it came from. Redacting
    twice changes nothing more (a mask quoted by a repr keeps the closing quote)."""
    from timerwheel_c.durable.storage.redact import redact

    text = _malformed(shape)
    once = redact(f"cannot open {text!r}: no", text)
    assert LOOSE_SECRET not in once and "***" in once, once
    assert redact(once) == once
    if " tail@" not in shape:
        assert LOOSE_SECRET not in redact(f"at {text}, then") and LOOSE_SECRET not in redact(repr(text))


@pytest.mark.parametrize("shape", MALFORMED, ids=MALFORMED_IDS)
def test_the_library_never_shows_the_password_of_a_malformed_url(shape, tmp_path, monkeypatch):
    """Every error that echoes a store argument (open_store's, a str given where a store goes,
    SQLiteStore's on a path that is a mistyped URL) masks its password, in str() and repr() alike."""
    from timerwheel_c.durable import schedule

    monkeypatch.chdir(tmp_path)
    text = _malformed(shape)
    calls = [lambda: open_store(text), lambda: open_store(text, create=False),
             lambda: schedule(text, "p", 1_700_000_000_000, 1, b"r")]
    if "://" not in text:
        calls.append(lambda: SQLiteStore(text, create=False))
    for call in calls:
        with pytest.raises(Exception) as raised:
            call()
        for shown in (str(raised.value), repr(raised.value)):
            assert LOOSE_SECRET not in shown, shown


@pytest.mark.parametrize("shape", MALFORMED, ids=MALFORMED_IDS)
@pytest.mark.parametrize("command", [("timers", "list"), ("schedules", "list"), ("fleet", "status"),
                                     ("timers", "cancel", "--partition", "p", "--kind", "1", "--reference", "r"),
                                     ("run", "--handlers", "durable_handlers:registry")])
@pytest.mark.parametrize("given", ["--store", "environment"])
def test_the_cli_never_prints_the_password_of_a_malformed_store_url(shape, command, given, tmp_path, monkeypatch):
    """A mistyped store URL or DSN, given with --store or $TIMERWHEEL_C_STORE, is refused with one
    line and exit 2 whatever the command; neither stdout nor stderr holds its password, and a masked
    key/value DSN keeps the quote that closes it."""
    from cli_run import run_cli

    monkeypatch.chdir(tmp_path)
    text = _malformed(shape)
    if given == "--store":
        out = run_cli(*command, "--store", text, env={"TIMERWHEEL_C_STORE": None})
    else:
        out = run_cli(*command, env={"TIMERWHEEL_C_STORE": text})
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert LOOSE_SECRET not in out.stdout + out.stderr, out.stderr
    if shape.startswith("host="):  # the masked DSN is quoted whole: its closing quote is not taken into the mask
        assert "***" in out.stderr and "': expected" in out.stderr, out.stderr

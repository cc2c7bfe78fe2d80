"""A PostgresStore's sessions, whatever the role's, the database's or the environment's defaults,
on the real test server: guards judged at READ COMMITTED under a REPEATABLE READ default, any
partition name under a LATIN1 client encoding, a caller's REPEATABLE READ transaction refused, a
database whose encoding would file rows under the wrong shard refused, and an application role
that may only read and write rows opening and serving a store its owner made."""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from urllib.parse import quote

import pytest

psycopg = pytest.importorskip("psycopg")

from timerwheel_c.durable import Done, TimerHandler, TimerKind, TimerRegistry, list_timers, run_due, schedule
from timerwheel_c.durable.storage.postgres import PostgresStore
from timerwheel_c.durable.storage.store import Batch, Equals, PreconditionFailed, SchemaError

_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
pytestmark = pytest.mark.skipif(not _DSN, reason="set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to test PostgresStore")
KIND = 0xE1
PAST_MS = 1_700_000_000_000  # Unix epoch ms: due long ago, so due at any run_due below


class Recording(TimerHandler):
    kind = TimerKind(KIND)

    def __init__(self):
        self.fired = []

    def fire(self, ctx, timer):
        self.fired.append(timer.reference)
        return Done()


def _url(dsn: str, **params: str) -> str:
    sep = "&" if "?" in dsn else "?"
    return dsn + "".join(f"{'&' if i else sep}{k}={quote(v)}" for i, (k, v) in enumerate(params.items()))


@contextlib.contextmanager
def _schema(options: str = ""):
    """A fresh schema, and a URL whose sessions use it and whose ``options`` add ``options``."""
    name = f"sess_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_DSN, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    try:
        yield _url(_DSN, options=f"-csearch_path={name} {options}".strip()), name
    finally:
        with psycopg.connect(_DSN, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")


def test_guards_are_judged_after_the_lock_under_a_repeatable_read_default():
    """With REPEATABLE READ as the session default (as ALTER ROLE/DATABASE ... SET gives it), an
    apply that waited for its partition's lock still judges its guards on the rows committed
    meanwhile: guarded on A == v1 after another writer changed A, it fails, and writes nothing.
    Every session the store opens, its asyncio pool's included, runs READ COMMITTED in UTF-8."""
    isolation = r"-cdefault_transaction_isolation=repeatable\ read -cclient_encoding=LATIN1"
    with _schema(isolation) as (url, schema):
        store = PostgresStore(url)
        try:
            with store.new_connection() as conn:
                assert conn.execute("SHOW default_transaction_isolation").fetchone() == ("read committed",)
                assert conn.execute("SHOW client_encoding").fetchone() == ("UTF8",)

            async def pooled():
                async with store.async_pools().connection() as conn:
                    return await (await conn.execute("SELECT current_setting('default_transaction_isolation'), "
                                                     "current_setting('client_encoding')")).fetchone()
            import asyncio

            assert asyncio.run(pooled()) == ("read committed", "UTF8")
            store.apply("p", Batch().put(b"A", b"v1"))
            holding, done = threading.Event(), threading.Event()

            def other_writer():
                with psycopg.connect(url) as conn, conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (store.shard_lock("p"),))
                    conn.execute(f"UPDATE {schema}.timerwheel_kv SET value = 'v2' WHERE partition = 'p' AND key = 'A'")
                    holding.set()
                    done.wait(0.5)  # the apply below waits on the lock meanwhile

            thread = threading.Thread(target=other_writer)
            thread.start()
            assert holding.wait(10)
            outcome = store.apply("p", Batch().require(Equals(b"A", b"v1")).put(b"B", b"written"))
            thread.join()
            assert isinstance(outcome, PreconditionFailed)
            assert store.get("p", b"A") == b"v2" and store.get("p", b"B") is None
        finally:
            store.close()


def test_any_partition_name_is_written_and_fired_whatever_the_client_encoding():
    """A LATIN1 client encoding in the DSN (or PGCLIENTENCODING) cannot carry '日本': the store's
    sessions speak UTF-8 whatever it says, so that partition's timer and every other fire."""
    with _schema("-cclient_encoding=LATIN1") as (url, _):
        store = PostgresStore(url)
        try:
            handler = Recording()
            registry = TimerRegistry().register(handler)
            for partition in ("日本", "plain"):
                schedule(store, partition, PAST_MS, KIND, partition.encode())
            rows = store.scan_shards(list(range(store.shard_count)), b"", b"\xff", 100)  # a whole-store pass's read
            assert {row[0] for shard in rows for row in shard} >= {"日本", "plain"}
            for partition in ("日本", "plain"):
                run_due(store, partition, registry, PAST_MS + 1000)
            assert sorted(handler.fired) == sorted([b"plain", "日本".encode()])
        finally:
            store.close()


@pytest.mark.parametrize("level", ["REPEATABLE_READ", "SERIALIZABLE", "READ_COMMITTED"])
def test_a_write_in_a_callers_repeatable_read_transaction_is_refused(level):
    """A caller's REPEATABLE READ transaction would hide the rows committed while the write waits
    for its lock: the write is refused with ValueError before it writes anything, and the caller's
    transaction goes on. SERIALIZABLE and READ COMMITTED write."""
    with _schema() as (url, _):
        store = PostgresStore(url)
        try:
            with psycopg.connect(url) as conn:
                conn.isolation_level = getattr(psycopg.IsolationLevel, level)
                with conn.transaction():
                    if level == "REPEATABLE_READ":
                        with pytest.raises(ValueError, match="conn's transaction is REPEATABLE READ"):
                            schedule(store, "p", PAST_MS, KIND, b"r", conn=conn)
                        assert conn.execute("SELECT 1").fetchone() == (1,)  # still usable
                    else:
                        schedule(store, "p", PAST_MS, KIND, b"r", conn=conn)
            assert len(list_timers(store, "p")) == (0 if level == "REPEATABLE_READ" else 1)
        finally:
            store.close()


def test_a_database_whose_encoding_would_misfile_partitions_is_refused():
    """In a LATIN1 database the server's md5() of 'café' hashes its LATIN1 bytes, not the UTF-8
    the runners hash, so the timer would sit in a shard no runner scans for it: opening a store
    there raises SchemaError naming the encoding, before any table is made."""
    name = f"latin1_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_DSN, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    try:
        url = _DSN.rsplit("/", 1)[0] + "/" + name
        with pytest.raises(SchemaError, match="server_encoding LATIN1"):
            PostgresStore(url)
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT to_regclass('timerwheel_kv')").fetchone() == (None,)
    finally:
        with psycopg.connect(_DSN, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {name}")


@contextlib.contextmanager
def _application_role(limit: str = "", owner_schedules: object = False):
    """The URL of a new role (``limit``: e.g. ``CONNECTION LIMIT 1``) granted only SELECT, INSERT,
    UPDATE and DELETE on the tables of a store its owner made in a fresh schema (no CREATE, not the
    owner; with ``owner_schedules``, the owner scheduled a timer there too, with ``"conn"`` in a transaction
    of its own, ``conn=``); the role dropped afterwards."""
    role = f"app_{uuid.uuid4().hex[:12]}"
    with _schema() as (url, schema):
        with PostgresStore(url) as owned:
            if owner_schedules == "conn":  # in the owner's own transaction
                with psycopg.connect(url) as conn:
                    schedule(owned, "p", PAST_MS, KIND, b"owner", conn=conn)
            elif owner_schedules:
                schedule(owned, "p", PAST_MS, KIND, b"owner")
        with psycopg.connect(_DSN, autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {role} LOGIN {limit}")
            conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
            conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.timerwheel_kv, "
                         f"{schema}.timerwheel_kv_meta TO {role}")
        try:
            yield psycopg.conninfo.make_conninfo(url, user=role)
        finally:
            with psycopg.connect(_DSN, autocommit=True) as conn:
                conn.execute(f"DROP OWNED BY {role}")
                conn.execute(f"DROP ROLE {role}")


def test_an_application_role_with_row_privileges_only_opens_writes_and_fires(caplog):
    """The owner makes the store; a role granted only SELECT, INSERT, UPDATE and DELETE on its
    tables (no CREATE, not the owner) opens it with the default create=True (no DDL runs on a
    store at this version), schedules (the wake trigger it may not narrow keeps signalling every
    write, with one warning) and fires."""
    with _application_role() as app_url, PostgresStore(app_url) as store:
        handler = Recording()
        with caplog.at_level(logging.WARNING, logger="timerwheel_c.durable"):
            schedule(store, "p", PAST_MS, KIND, b"r")
        assert any("cannot narrow the wake trigger" in r.getMessage() for r in caplog.records)
        run_due(store, "p", TimerRegistry().register(handler), PAST_MS + 1000)
        assert handler.fired == [b"r"] and list_timers(store, "p") == []


def test_the_narrowing_the_warning_asks_of_the_owner_spares_an_application_role_the_warning(caplog):
    """The warning of a role that cannot narrow the wake trigger says what narrows it: a timer scheduled
    (or a runner started) as the owner, not an open alone (which the owner's store above made, and which
    left it wide); once the owner has scheduled one, the role's writes narrow nothing and warn nothing."""
    with _application_role() as app_url, PostgresStore(app_url) as store:
        with caplog.at_level(logging.WARNING, logger="timerwheel_c.durable"):
            schedule(store, "p", PAST_MS, KIND, b"r")
        (warning,) = [r.getMessage() for r in caplog.records if "cannot narrow the wake trigger" in r.getMessage()]
        assert "Schedule a timer or start a runner once as its owner" in warning, warning
        assert "nor a write through conn= or timerwheel_c.durable.aio" in warning, warning
    caplog.clear()
    # The owner's write in its own transaction (conn=) leaves the trigger wide, as the warning says.
    with _application_role(owner_schedules="conn") as app_url, PostgresStore(app_url) as store:
        with caplog.at_level(logging.WARNING, logger="timerwheel_c.durable"):
            schedule(store, "p", PAST_MS, KIND, b"r")
        assert [r for r in caplog.records if "cannot narrow the wake trigger" in r.getMessage()]
    caplog.clear()
    with _application_role(owner_schedules=True) as app_url, PostgresStore(app_url) as store:
        with caplog.at_level(logging.WARNING, logger="timerwheel_c.durable"):
            schedule(store, "p", PAST_MS, KIND, b"r")
        assert not [r for r in caplog.records if "cannot narrow the wake trigger" in r.getMessage()]


def test_a_role_allowed_one_connection_opens_a_store_and_writes():
    """A role with CONNECTION LIMIT 1 opens a store and writes through it: the first open's check for a
    pooler, which asks for a second connection at once, takes its refusal (too many connections) as
    no pooler to look for, instead of failing the open."""
    with _application_role("CONNECTION LIMIT 1") as app_url, PostgresStore(app_url) as store:
        schedule(store, "p", PAST_MS, KIND, b"one")
        assert [t.reference for t in list_timers(store, "p")] == [b"one"]


def _alter_role(url: str, setting: str) -> None:
    """``ALTER ROLE <url's user> <setting>``, by the owner: the role's sessions begin with it from now on."""
    role = psycopg.conninfo.conninfo_to_dict(url)["user"]
    with psycopg.connect(_DSN, autocommit=True) as conn:
        conn.execute(f"ALTER ROLE {role} {setting}")


def test_a_session_begun_read_only_is_replaced_once_writes_come_back():
    """A DBA sets the role's sessions read-only for maintenance (or a standby serves them): writes
    fail with 25006, a TransientStoreError. Each session keeps the default it began with, so once it
    is reset, only a new session writes: the store's own connection, and each of the asyncio pool's,
    is closed at the error and made anew, and the next write goes through. It kept failing on the
    same session for ever: a runner opened during the maintenance never wrote again. A session the
    pool made anew while the role was still read-only may meet it once more."""
    import asyncio

    from timerwheel_c.durable import aio
    from timerwheel_c.durable.storage.errors import TransientStoreError

    with _application_role() as app_url:
        PostgresStore(app_url).close()  # the role's first open, while it may write
        _alter_role(app_url, "SET default_transaction_read_only = on")
        with PostgresStore(app_url) as store:
            sibling = store.open_sibling()  # a runner's claims and commits: a connection of its own
            for each in (store, sibling):
                with pytest.raises(TransientStoreError, match="25006"):
                    schedule(each, "p", PAST_MS, KIND, b"sync")

            async def in_one_loop() -> None:
                _alter_role(app_url, "SET default_transaction_read_only = on")
                with pytest.raises(TransientStoreError, match="25006"):
                    await aio.schedule(store, "p", PAST_MS, KIND, b"async")
                _alter_role(app_url, "RESET default_transaction_read_only")
                # A session the pool made anew while the role was read-only may meet it once more.
                for attempt in range(2):
                    try:
                        await aio.schedule(store, "p", PAST_MS, KIND, b"async")
                        return
                    except TransientStoreError:
                        if attempt:
                            raise

            _alter_role(app_url, "RESET default_transaction_read_only")
            schedule(store, "p", PAST_MS, KIND, b"sync")
            schedule(sibling, "p", PAST_MS, KIND, b"sibling")
            sibling.close()
            asyncio.run(in_one_loop())
            assert sorted(t.reference for t in list_timers(store, "p")) == [b"async", b"sibling", b"sync"]


@pytest.mark.parametrize("drain", [True, False], ids=["pool-drain", "no-drain"])
def test_read_only_refusals_keep_the_sessions_they_cannot_help(drain, monkeypatch):
    """A read_only=True store refuses its own writes with 25006: its session is kept, where a new one
    would only be refused the same (it reconnected at every refused write). The asyncio pool of a
    role that is read-only renews its sessions at most once a second, however many writes it
    refuses (20 refused writes opened 69 sessions), with psycopg_pool 3.3's ``drain`` and without it
    (3.2, the newest on Python 3.9: it opened a session per refused write)."""
    import asyncio

    from psycopg_pool import AsyncConnectionPool

    if not drain:
        monkeypatch.delattr(AsyncConnectionPool, "drain", raising=False)
    elif not hasattr(AsyncConnectionPool, "drain"):
        pytest.skip("psycopg_pool < 3.3 (the newest on Python 3.9) has no AsyncConnectionPool.drain to renew "
                    "with: the no-drain case is what runs here")

    from timerwheel_c.durable import aio
    from timerwheel_c.durable.storage.errors import TransientStoreError

    with _application_role() as app_url:
        PostgresStore(app_url).close()
        with PostgresStore(app_url, read_only=True) as ro:
            pids = set()
            for _ in range(3):
                with pytest.raises(TransientStoreError, match="25006"):
                    schedule(ro, "p", PAST_MS, KIND, b"r")
                with ro._lock:
                    pids.add(ro._connection().info.backend_pid)
            assert len(pids) == 1
        _alter_role(app_url, "SET default_transaction_read_only = on")
        with PostgresStore(app_url) as store:
            async def refused() -> int:
                for _ in range(20):
                    with pytest.raises(TransientStoreError, match="25006"):
                        await aio.schedule(store, "p", PAST_MS, KIND, b"r")
                pool = store.async_pools()._by_loop[asyncio.get_running_loop()][0]
                return pool.get_stats()["connections_num"]

            assert asyncio.run(refused()) <= 6  # the first, and a renewal or two of min_size (1)


def test_a_database_idle_session_timeout_does_not_end_the_stores_sessions():
    """A role's (or database's) idle_session_timeout would end a store's sessions while they wait
    between writes (a runner's change signal and claims between passes), and fail the next write
    once: every session of the store, its own and its asyncio pool's, turns it off."""
    import asyncio
    import time


    with _application_role() as app_url:
        _alter_role(app_url, "SET idle_session_timeout = '300ms'")
        with PostgresStore(app_url) as store:
            schedule(store, "p", PAST_MS, KIND, b"a")
            time.sleep(0.6)  # past the server's timeout, which only a real idle session shows
            schedule(store, "p", PAST_MS, KIND, b"b")

            async def pooled() -> str:
                async with store.async_pools().connection() as conn:
                    return (await (await conn.execute("SHOW idle_session_timeout")).fetchone())[0]

            assert asyncio.run(pooled()) == "0"
            assert sorted(t.reference for t in list_timers(store, "p")) == [b"a", b"b"]


def test_the_pooler_checks_own_session_becomes_the_stores(monkeypatch):
    """The first open of a store on a connection string checks for a pooler with two connections at
    once; the first of them is then the store's own session, set up as any. It was closed and another
    opened, which raced the closed session's end: a role allowed one connection failed to open a store
    now and then ("too many connections for role", 1 run in 20 under load)."""
    with _application_role() as app_url:
        url = psycopg.conninfo.make_conninfo(app_url, application_name=f"check-{uuid.uuid4().hex[:8]}")  # not checked yet
        opened = []
        connect = psycopg.connect

        def counted(conninfo="", **kwargs):
            conn = connect(conninfo, **kwargs)
            opened.append(conn.info.backend_pid)
            return conn

        monkeypatch.setattr(psycopg, "connect", counted)
        with PostgresStore(url) as store:
            monkeypatch.undo()
            assert len(opened) == 2, opened  # the check's two, and no third
            with store._lock:
                assert store._connection().info.backend_pid == opened[0]
            schedule(store, "p", PAST_MS, KIND, b"r")
            assert [t.reference for t in list_timers(store, "p")] == [b"r"]


def test_a_write_behind_a_callers_open_transaction_gives_up_after_lock_wait_ms():
    """A write joined to the caller's transaction holds its partition's lock until that commits: a
    write of the same partition on the store, in the same request, waited for ever (and every call
    of the store behind it). It now waits ``lock_wait_ms`` and raises TransientStoreError; the
    caller's transaction commits its write, and the store writes again. By default 5 s."""
    from timerwheel_c.durable.storage.errors import TransientStoreError
    from timerwheel_c.durable.storage.postgres.store import DEFAULT_LOCK_WAIT_MS

    assert DEFAULT_LOCK_WAIT_MS == 5_000
    with _schema() as (url, _):
        with PostgresStore(url) as default:
            with default.new_connection() as conn:
                assert conn.execute("SHOW lock_timeout").fetchone() == ("0",)  # a runner's own sessions
            assert default._connection().execute("SHOW lock_timeout").fetchone() == ("5s",)
        store = PostgresStore(url, lock_wait_ms=200)
        try:
            with psycopg.connect(url) as app:
                with app.transaction():
                    schedule(store, "p", PAST_MS, KIND, b"joined", conn=app)
                    with pytest.raises(TransientStoreError, match="lock"):
                        schedule(store, "p", PAST_MS, KIND, b"plain")
            schedule(store, "p", PAST_MS, KIND, b"plain")
            assert sorted(t.reference for t in list_timers(store, "p")) == [b"joined", b"plain"]
        finally:
            store.close()
    with pytest.raises(ValueError, match="lock_wait_ms"):
        PostgresStore(_DSN, lock_wait_ms=0)


@pytest.mark.parametrize("lock_wait_ms", [2**31, 2**32 + 3000, 2**63])
def test_a_lock_wait_past_the_servers_limit_is_refused_naming_it(lock_wait_ms):
    """PostgreSQL's lock_timeout takes at most INT_MAX ms: a larger lock_wait_ms passed the store's
    check and then failed on the server. It is a ValueError naming it, for the store and for a
    sibling alike, and INT_MAX itself is the server's to take."""
    with pytest.raises(ValueError, match=f"lock_wait_ms must be 1..2147483647 .*got {lock_wait_ms}"):
        PostgresStore(_DSN, lock_wait_ms=lock_wait_ms)
    store = PostgresStore(_DSN, lock_wait_ms=2**31 - 1)
    try:
        assert store._conn.execute("SHOW lock_timeout").fetchone()[0] == f"{2**31 - 1}ms"
        with pytest.raises(ValueError, match=f"lock_wait_ms .*got {lock_wait_ms}"):
            store.open_sibling(lock_wait_ms=lock_wait_ms)
    finally:
        store.close()


def test_a_dropped_store_is_freed_with_its_session_at_once():
    """A program that opens a store per request and drops it unclosed: the store is freed when the
    last reference goes, its session with it (it referred to itself through its error wrapper, so
    only the cyclic collector freed it, and the sessions piled up until then: "too many clients")."""
    import gc
    import time
    import warnings
    import weakref

    name = f"tw_dropped_{uuid.uuid4().hex[:10]}"
    with _schema() as (url, _):
        url = _url(url, application_name=name)

        def sessions() -> int:
            with psycopg.connect(_DSN, autocommit=True) as admin:
                return admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                                     (name,)).fetchone()[0]

        gc.disable()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ResourceWarning)  # psycopg's, for a connection left open
                store = PostgresStore(url)
                store.apply("p", Batch().put(b"k", b"v"))
                assert sessions() == 1
                gone = weakref.ref(store)
                del store
                assert gone() is None
            deadline = time.monotonic() + 10
            while sessions() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert sessions() == 0
        finally:
            gc.enable()

"""The async writer on PostgreSQL in processes of their own: a script that writes from ``asyncio.run``
exits cleanly under ``-X dev -W error``, and a throwaway cluster's stop and start turn writes into
TransientStoreError and back (the in-process tests are in tests/durable/timers/test_durable_aio_pg.py).
Timing is asserted only as liveness. Needs the shared server (TIMERWHEEL_C_TEST_PG_DSN)."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid

import pytest

pytest.importorskip("psycopg")
pytest.importorskip("psycopg_pool")

from timerwheel_c.durable import aio, get_timer, schedule  # noqa: E402
from timerwheel_c.durable.storage.errors import TransientStoreError  # noqa: E402
from timerwheel_c.durable.storage.postgres import PostgresStore  # noqa: E402
from timerwheel_c.durable.timers import keys  # noqa: E402
from waiting import LIVENESS_S, wall_ms  # noqa: E402

PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
pytestmark = pytest.mark.skipif(not PG_DSN, reason="TIMERWHEEL_C_TEST_PG_DSN is not set")

P = "aio-pg"
KIND = 0xD2


def test_a_script_writing_from_asyncio_run_exits_without_warnings(tmp_path):
    """A program that writes from ``asyncio.run`` and closes its store after (the pool left to close
    with the loop) exits 0 under ``-X dev -W error``, ten times over (a shutdown can land while the
    pool is still connecting): no ResourceWarning, no task destroyed while pending, no unclosed
    connection, and no hang."""
    table = f"tw_aio_{uuid.uuid4().hex[:12]}"
    script = tmp_path / "app.py"
    script.write_text(f"""
import asyncio
from timerwheel_c.durable import aio
from timerwheel_c.durable.storage.postgres import PostgresStore

store = PostgresStore({PG_DSN!r}, table={table!r})

async def main():
    await asyncio.gather(*(aio.schedule(store, "p", 2**40, 7, b"%d" % i) for i in range(20)))

for _ in range(10):
    asyncio.run(main())
store.close()
""")
    try:
        done = subprocess.run([sys.executable, "-X", "dev", "-W", "error", str(script)], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)
        # asyncio's debug mode may log a slow callback on a loaded machine, and psycopg_pool a connection
        # attempt cut short by the loop's shutdown: neither is a leak.
        leaks = ("ResourceWarning", "Exception ignored", "Task was destroyed", "unclosed", "Traceback")
        assert done.returncode == 0 and not any(leak in done.stderr for leak in leaks), done.stderr
    finally:
        from bench.stores import dispose

        dispose(PostgresStore(PG_DSN, table=table))


def test_stopped_server_raises_transient_store_error_and_writes_resume_after_restart():
    """On a throwaway cluster: a write after the server stops raises TransientStoreError, as the sync
    writer's does; once the server is back, the async writes land again (retried as an app would)."""
    from pg_cluster import throwaway_cluster

    with throwaway_cluster() as (dsn, pg_ctl):
        store = PostgresStore(dsn)
        aio.configure(store, timeout_s=2.0)
        due = wall_ms() + 3_600_000

        async def write(ref: bytes):
            return await aio.schedule(store, P, due, KIND, ref)

        async def main():
            await write(b"before")
            pg_ctl("stop", "-m", "fast")
            with pytest.raises(TransientStoreError):
                schedule(store, P, due, KIND, b"sync-down")
            with pytest.raises(TransientStoreError):
                await write(b"down")
            pg_ctl("start")
            deadline = asyncio.get_running_loop().time() + LIVENESS_S
            while True:
                try:
                    return await write(b"after")
                except TransientStoreError:
                    assert asyncio.get_running_loop().time() < deadline, "writes never resumed"
                    await asyncio.sleep(0.1)

        try:
            assert asyncio.run(main()) == keys.timer(due, KIND, b"after")
            assert get_timer(store, P, KIND, b"before") is not None
        finally:
            store.close()

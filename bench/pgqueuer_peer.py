"""pgqueuer, a PostgreSQL job queue (PyPI ``pgqueuer``), run in the fleet bench's shape on the same
server, for a side-by-side figure (the ``peers`` extra installs it).

- Its schema is installed with its own API (``Queries.install``) into a schema of its own,
  ``timerwheel_bench_pgq_<pid>_<n>``, under a name prefix of its own (so its NOTIFY channel is
  its own too), and uninstalled (``Queries.uninstall``), then dropped, after the run.
- ``workers`` processes (``python bench/run.py -m bench.pgqueuer_peer worker BATCH``, the DSN in the
  environment, never on a command line that ``ps`` shows), each a ``QueueManager`` over an asyncpg
  connection (``AsyncpgDriver``) on uvloop, as ``pgq run`` starts one (it tries asyncpg first), with
  a no-op async entrypoint, dequeuing ``batch_size`` jobs a round trip (pgqueuer's default: 10).
  Not its psycopg driver: there, every query waits behind the LISTEN watcher's 1 s ``notifies()``
  wait on the same connection, which would make the figure a measure of that wait.
- ``fired_per_s``: once every worker is up, ``n_timers`` jobs are enqueued in one statement, each with
  ``execute_after`` so that all come due at one instant T0; the figure is ``n_timers`` over the time
  from T0 until the queue table is empty (every job acknowledged; polled as :func:`.drain.wait_done`
  polls), as the fleet bench times until its last timer row is gone.
- Exactly once: each worker reports the id of every job its entrypoint ran; the run fails unless
  every job ran once across the workers. pgqueuer's delivery is at least once (a job whose
  heartbeat lapses is picked again), which a no-op run never provokes.
- Warm-up, as the fleet's (:mod:`.fleet`): sets of ``max(200, n_timers // 50)`` jobs due now
  (:func:`.drain.warmup_items`), each until the queue is empty (every job acknowledged), until every
  worker has run one (each prints ``WARM`` after its first job; at batch 100 one set may go to two
  workers alone), before the measured jobs are enqueued: a worker's first dequeue and
  acknowledgement (asyncpg preparing its statements, the server planning them, once per session)
  fall outside the meter. In 4 alternating pairs of runs of ``python bench/run.py -m bench.peers
  --pg-dsn DSN`` (2 vCPUs, load average 2.4 to 6.5), the runs' median CPU per job at batch 100,
  workers / server, went from 37 / 30.5 to 29 / 24.5 µs with 1 worker and from 56.5 / 35.5 to
  48.5 / 33 µs with 4. Its jobs are checked to run once like the rest and count in neither
  ``fired_per_s`` nor the CPU; the result's ``warmup`` gives their number (``items``: 200 with 1
  worker, 600 to 1,400 with 4), each worker's share (``per_process``) and their own CPU split per
  warm-up job, their enqueuing (a session of its own) included: 150 / 150 to 200 µs with 1 worker,
  167 to 233 / 233 to 283 µs with 4.
- The CPU split (:class:`.cpu_split.CpuMeter`) of the workers and the server over the same interval,
  begun :data:`.cpu_split.LEAD_S` before T0, as the fleet's.
"""
from __future__ import annotations

import asyncio
import collections
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from typing import Callable, Optional

from .cpu_split import CpuMeter
from .drain import wait_done, warmup_items
from .procs import stop as procs_stop
from .run import command

__all__ = ["DEFAULT_BATCH", "INSTALL_HINT", "missing", "run", "version"]

DEFAULT_BATCH = 10  # QueueManager.run's batch_size default
if sys.version_info >= (3, 10):
    INSTALL_HINT = ("the comparison with pgqueuer needs it installed and a PostgreSQL server: "
                    "pip install \".[peers]\", then run with --pg-dsn postgresql://...")
else:  # pgqueuer needs Python 3.10: the peers extra installs nothing here
    INSTALL_HINT = (f"the comparison with pgqueuer needs Python 3.10 or later (this is Python {sys.version_info[0]}."
                    f"{sys.version_info[1]}), there with it installed and a PostgreSQL server: "
                    "pip install \".[peers]\", then run with --pg-dsn postgresql://...")
_ENTRYPOINT = "noop"
_DSN_ENV = "TIMERWHEEL_C_PGQ_DSN"
_LEAD_S = 2.0  # from the enqueue to T0: time to commit the jobs before any is due
_START_S = 60.0
_counter = iter(range(1_000_000))


def missing() -> Optional[str]:
    """None when pgqueuer can be compared here, else why not (with :data:`INSTALL_HINT`)."""
    try:
        import asyncpg  # noqa: F401
        import pgqueuer  # noqa: F401
    except ImportError:
        return f"pgqueuer or asyncpg is not installed; {INSTALL_HINT}"
    return None


def version() -> str:
    """The installed pgqueuer's version."""
    return metadata.version("pgqueuer")


def _settings(schema: str):
    from pgqueuer.domain.settings import DBSettings

    return DBSettings(db_schema=schema, prefix=f"{schema}_")


async def _admin(dsn: str, schema: str, action: str, n_timers: int = 0, due_in_s: float = 0.0) -> list:
    """``install``, ``enqueue`` ``n_timers`` no-op jobs due in ``due_in_s`` s, or ``uninstall``
    pgqueuer in ``schema``, through its own API; returns the enqueued jobs' ids (else [])."""
    import asyncpg
    from datetime import timedelta
    from pgqueuer import AsyncpgDriver, Queries
    from pgqueuer.adapters.persistence import qb

    settings = _settings(schema)
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn), qbe=qb.QueryBuilderEnvironment(settings),
                          qbq=qb.QueryQueueBuilder(settings), qbs=qb.QuerySchedulerBuilder(settings))
        if action == "install":
            await queries.install()
        elif action == "enqueue":
            return await queries.enqueue([_ENTRYPOINT] * n_timers, [None] * n_timers, [0] * n_timers,
                                         [timedelta(seconds=due_in_s)] * n_timers)
        else:
            await queries.uninstall()
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')  # made of [a-z0-9_] above
    finally:
        await conn.close()
    return []


def _spawn(dsn: str, schema: str, batch_size: int, log) -> subprocess.Popen:
    env = dict(os.environ, **{_DSN_ENV: dsn, "PGQUEUER_SCHEMA": schema, "PGQUEUER_PREFIX": f"{schema}_"})
    return subprocess.Popen(command(__name__, "worker", str(batch_size)), env=env, stdout=subprocess.PIPE,
                            stderr=log, text=True)


def _failed(what: str, log) -> RuntimeError:
    log.seek(0)
    return RuntimeError(f"pgqueuer bench: {what}: {log.read()[-2000:]}")


def _wait_ready(procs: list, log) -> None:
    """Wait for each worker's ``READY`` line (printed once it has connected), 60 s in all."""
    deadline = time.monotonic() + _START_S
    for proc in procs:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        line = proc.stdout.readline() if ready else ""
        if line.strip() != "READY":
            raise _failed(f"a worker did not start within {_START_S:.0f} s ({line!r})", log)


def _executed(procs: list, log) -> list:
    """Stop the workers (SIGTERM: pgqueuer's shutdown, which flushes its acknowledgements); the ids
    of the jobs each one ran, from their reports, in the order of ``procs``."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    ran = []
    for proc in procs:
        out, _ = proc.communicate(timeout=30)
        if proc.returncode != 0:
            raise _failed(f"a worker exited with status {proc.returncode}", log)
        ran.append(json.loads(out.splitlines()[-1]))
    return ran


def _warm_up(dsn: str, schema: str, n_items: int, procs: list, drain: Callable[[int, str], None], log,
             meter: CpuMeter) -> tuple:
    """Run sets of ``n_items`` jobs due now until every worker has run one of them (each prints
    ``WARM`` after its first job; a set's jobs are acknowledged, so committed, once the queue is
    empty), before the measured run (see the module's docstring); ``drain(n, what)`` waits for the
    queue to empty. Returns the warm-up jobs' ids and the CPU split of the warm-up (the workers' and
    the server's: see :class:`.cpu_split.CpuMeter`), per warm-up job.

    Raises:
        RuntimeError: a worker ran none within 20 sets, or a set was not drained within 600 s.
    """
    ids: list = []
    warm: set = set()
    meter.start([p.pid for p in procs])
    for _ in range(20):
        ids += asyncio.run(_admin(dsn, schema, "enqueue", n_items))
        drain(n_items, "pgqueuer bench: warm-up jobs queued")
        for index, proc in enumerate(procs):
            while index not in warm and select.select([proc.stdout], [], [], 0)[0]:
                if proc.stdout.readline().strip() == "WARM":
                    warm.add(index)
        if len(warm) == len(procs):
            return ids, meter.stop(len(ids))
    raise _failed(f"{len(procs) - len(warm)} of {len(procs)} workers ran no job of 20 warm-up sets", log)


def run(dsn: str, n_timers: int, workers: int, batch_size: int = DEFAULT_BATCH,
        progress: Optional[Callable[[int], None]] = None) -> dict:
    """One pgqueuer run in the shape above on the server of ``dsn``; returns ``{"workers": int,
    "batch_size": int, "timers": int, "fired_per_s": float, "runner_cpu_us_per_fired": float | None,
    "server_cpu_us_per_fired": float | None, "cpu_note": str | None}``. ``progress(k)`` is called
    with the number of jobs just acknowledged.

    Raises:
        ValueError: ``n_timers``, ``workers`` or ``batch_size`` < 1.
        NotAvailable: pgqueuer is not installed (the message says how to install it).
        RuntimeError: a worker did not start within 60 s, the jobs were not all acknowledged
            within 600 s, the enqueue took longer than the lead before T0, or a job did not run
            exactly once.
        psycopg.Error: the server cannot be reached.
    """
    from .harness import NotAvailable

    for name, value in (("n_timers", n_timers), ("workers", workers), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    reason = missing()
    if reason is not None:
        raise NotAvailable(reason)
    import psycopg
    from psycopg import sql

    schema = f"timerwheel_bench_pgq_{os.getpid()}_{next(_counter)}"
    queue = sql.Identifier(schema, _settings(schema).queue_table)
    count = sql.SQL("SELECT count(*) FROM {}").format(queue)
    probe = sql.SQL("SELECT count(*) FROM (SELECT 1 FROM {} LIMIT 1) AS probe").format(queue)
    asyncio.run(_admin(dsn, schema, "install"))
    procs: list = []
    try:
        with tempfile.TemporaryFile("w+") as log, psycopg.connect(dsn, autocommit=True) as conn:
            procs += [_spawn(dsn, schema, batch_size, log) for _ in range(workers)]
            _wait_ready(procs, log)

            def left(query) -> int:
                row = conn.execute(query).fetchone()
                assert row is not None  # count(*) has one row
                return row[0]

            def drain(n: int, what: str, shown: Optional[Callable[[int], None]] = None) -> None:
                def alive() -> None:
                    if any(p.poll() is not None for p in procs):
                        raise _failed(f"a worker exited with {left(count)} of {n} jobs still queued", log)

                wait_done(n, lambda: left(probe) > 0, lambda: left(count), shown, 600, what, alive)

            warm, warm_cpu = _warm_up(dsn, schema, warmup_items(n_timers), procs, drain, log, CpuMeter(conn))
            warm_ids = set(warm)
            due_s = time.time() + _LEAD_S
            asyncio.run(_admin(dsn, schema, "enqueue", n_timers, due_s - time.time()))
            if time.time() >= due_s:
                raise RuntimeError(f"pgqueuer bench: enqueuing {n_timers} jobs took over {_LEAD_S} s")
            meter = CpuMeter(conn)
            meter.start_before([p.pid for p in procs], due_s)
            drain(n_timers, "pgqueuer bench: jobs queued", progress)
            elapsed_s = time.time() - due_s
            cpu = meter.stop(n_timers)
            reports = _executed(procs, log)
        ran = collections.Counter(job for report in reports for job in report)
        if len(ran) != n_timers + len(warm_ids) or set(ran.values()) != {1}:
            twice = sum(1 for c in ran.values() if c > 1)
            raise RuntimeError(f"pgqueuer bench: {len(ran)} distinct jobs ran for {n_timers} enqueued and "
                               f"{len(warm_ids)} of the warm-up, {twice} of them more than once")
        warmup = {"items": len(warm_ids), "per_process": sorted(len(warm_ids.intersection(r)) for r in reports),
                  **warm_cpu}
        return {"workers": workers, "batch_size": batch_size, "timers": n_timers, "fired_per_s": n_timers / elapsed_s,
                **cpu, "warmup": warmup}
    finally:
        procs_stop(procs)
        asyncio.run(_admin(dsn, schema, "uninstall"))


def _worker(dsn: str, batch_size: int) -> None:
    """Process entry: a QueueManager with a no-op entrypoint until SIGTERM; then prints the ids it ran
    as one JSON line. Its schema and prefix come from pgqueuer's own PGQUEUER_* variables."""
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries, QueueManager

    ran: list = []

    async def main() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            qm = QueueManager(Queries(AsyncpgDriver(conn)))

            @qm.entrypoint(_ENTRYPOINT)
            async def noop(job) -> None:
                if not ran:  # the warm-up waits until every worker has run a job
                    print("WARM", flush=True)
                ran.append(job.id)

            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, qm.shutdown.set)
            print("READY", flush=True)
            await qm.run(batch_size=batch_size)
        finally:
            await conn.close()

    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())
    print(json.dumps(ran), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] != ["worker"] or len(sys.argv) != 3 or not sys.argv[2].isdigit() or _DSN_ENV not in os.environ:
        sys.exit(f"usage: {_DSN_ENV}=postgresql://... python bench/run.py -m bench.pgqueuer_peer worker BATCH")
    _worker(os.environ[_DSN_ENV], int(sys.argv[2]))

"""``timerwheel-c run`` ends within a bound after SIGTERM, whatever the stop waits on: a commit that
waits on a row lock another session holds (each wait bounded, so that stop is a clean one), an ``async`` handler's call on a thread that never returns (asyncio's own default executor is
a ThreadPoolExecutor, whose threads the interpreter joins at exit), and a start that waits on a
store that does not answer. Without the bound each of these runners ran until SIGKILL.

Each runner gets its SIGTERM once its situation is in place (a file its handler writes, a line of the
start driver), and must exit 0 within ``STOP_S + EXIT_GRACE_S`` plus a liveness margin: the one
whose stop can finish says ``stopped`` last, the others say what they stopped waiting for. The three run at once (each waits out the same deadline) on
one throwaway PostgreSQL cluster. A runner stuck for good fails its test at the bound, never by a
slow machine: the margin is the liveness bound of every durable test.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from timerwheel_c.durable.service.cli import EXIT_GRACE_S, STOP_S
from timerwheel_c.durable.service.pool import DaemonExecutor
from durable_stop_handlers import ROW_LOCK_KIND, THREAD_KIND
from pg_cluster import throwaway_cluster
from waiting import LIVENESS_S, wait_until, wall_ms
from locations import TESTS as HELPERS_DIR

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

BOUND_S = STOP_S + EXIT_GRACE_S + LIVENESS_S
GAVE_UP = "ending the process without waiting more"


def _new_database(admin_dsn: str) -> str:
    import psycopg

    name = "stop_" + uuid.uuid4().hex[:12]
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return admin_dsn.rsplit("/", 1)[0] + "/" + name


def _schedule(url: str, kind: int) -> None:
    from timerwheel_c.durable import open_store, schedule

    store = open_store(url)
    try:
        schedule(store, "p", wall_ms(), kind, b"r")
    finally:
        store.close()


class Runner:
    """One ``timerwheel-c run`` (or the start driver) with its stderr in a file."""

    def __init__(self, tmp_path: Path, name: str, url: str, argv_head: list):
        self.dir = tmp_path / name
        self.dir.mkdir()
        self.err_path = self.dir / "stderr"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "TIMERWHEEL_C_STORE"))}
        env.update(PYTHONPATH=str(HELPERS_DIR), STOP_TEST_MARKS=str(self.dir), STOP_TEST_DSN=url)
        with open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, *argv_head, "run", "--store", url, "--handlers", "durable_stop_handlers:registry",
                 "--partition", "p"], cwd=self.dir, env=env, stdout=subprocess.DEVNULL, stderr=err)
        self.signalled_at = 0.0
        self.status = None
        self.took_s = None

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def signal_when(self, ready, what: str) -> None:
        wait_until(lambda: ready(self) or self.proc.poll() is not None, what)
        assert self.proc.poll() is None, f"the runner exited before {what}:\n{self.stderr()}"
        time.sleep(0.5)  # the stop then meets the situation, not its first moments
        self.signalled_at = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, until: float) -> None:
        try:
            self.status = self.proc.wait(max(0.0, until - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        else:
            self.took_s = time.monotonic() - self.signalled_at


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """The three runners, each signalled once its situation is in place, waited for together."""
    tmp_path = tmp_path_factory.mktemp("stop-bounded")
    with throwaway_cluster() as (dsn, _):
        row_lock_url, start_url = _new_database(dsn), _new_database(dsn)
        _schedule(row_lock_url, ROW_LOCK_KIND)
        thread_url = f"sqlite:///{tmp_path / 'thread.db'}"
        _schedule(thread_url, THREAD_KIND)
        runners = {
            "row lock": Runner(tmp_path, "row-lock", row_lock_url, ["-m", "timerwheel_c"]),
            "thread": Runner(tmp_path, "thread", thread_url, ["-m", "timerwheel_c"]),
            "start": Runner(tmp_path, "start", start_url, [str(HELPERS_DIR / "stop_during_start.py")]),
        }
        try:
            runners["row lock"].signal_when(lambda r: (r.dir / "row-locked").exists(), "the handler locked its row")
            runners["thread"].signal_when(lambda r: (r.dir / "thread-started").exists(), "the handler's thread started")
            runners["start"].signal_when(lambda r: "meta locked" in r.stderr(), "the store stopped answering")
            until = time.monotonic() + BOUND_S
            for runner in runners.values():
                runner.wait(until)
            yield runners
        finally:
            for runner in runners.values():
                if runner.proc.poll() is None:
                    runner.proc.kill()
                    runner.proc.wait()


def _check_ended(runner: Runner, waited_for: str) -> None:
    err = runner.stderr()
    assert runner.status is not None, f"still running {BOUND_S:.0f} s after SIGTERM:\n{err[-2000:]}"
    assert runner.status == 0, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert GAVE_UP in last and waited_for in last, err[-2000:]
    assert "Traceback" not in err


@pytest.mark.slow
def test_sigterm_ends_a_runner_whose_commit_waits_on_a_row_lock(stopped):
    """The handler's Done commits and waits on the row lock, but no longer than the service's bound
    on a lock wait (``Timing.lock_wait_ms``) at a time, retried with backoff: so the stop waits on nothing the
    other transaction holds and ends cleanly, saying that the outcome's commit had not finished."""
    runner = stopped["row lock"]
    err = runner.stderr()
    assert runner.status is not None, f"still running {BOUND_S:.0f} s after SIGTERM:\n{err[-2000:]}"
    assert runner.status == 0, err[-2000:]
    assert "lock timeout" in err  # the commit did wait on the row lock: the situation the test needs
    assert "stopping with 1 outcome(s) not committed" in err and err.strip().endswith("stopped"), err[-2000:]
    assert GAVE_UP not in err and "Traceback" not in err


@pytest.mark.slow
def test_sigterm_ends_a_runner_whose_async_handler_awaits_a_thread_that_never_returns(stopped):
    """The handler is cancelled at the stop's timeout, but the executor's thread runs on: the
    service's loop has a default executor of daemon threads, so neither ``asyncio.run`` nor the
    interpreter's exit joins it, and the stop is a clean one."""
    runner = stopped["thread"]
    err = runner.stderr()
    assert runner.status is not None, f"still running {BOUND_S:.0f} s after SIGTERM:\n{err[-2000:]}"
    assert runner.status == 0, err[-2000:]
    assert "stopping with 1 handler(s) still running" in err and err.strip().endswith("stopped"), err[-2000:]
    assert GAVE_UP not in err and "Traceback" not in err


@pytest.mark.slow
def test_sigterm_while_the_service_starts_on_a_store_that_does_not_answer_stops_it(stopped):
    """The service's start waits on the store's meta table, locked by another session; the signal
    received meanwhile was only recorded, and nothing looked at it until the start returned. The
    process ends within the bound, cleanly: the store's wait for the lock ends at its lock_wait_ms
    (a transient error, retried) and the stop goes on, or the stop gives up waiting on the store."""
    runner = stopped["start"]
    err = runner.stderr()
    assert runner.status == 0, f"status {runner.status} {BOUND_S:.0f} s after SIGTERM:\n{err[-2000:]}"
    assert "received SIGTERM while starting; stopping" in err and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.endswith("stopped") or (GAVE_UP in last and "closing the store" in last), err[-2000:]


def _minus(a, b=0):
    return a - b


def test_the_daemon_executor_runs_calls_and_its_shutdown_leaves_a_call_in_progress():
    """What the service's loop runs ``asyncio.to_thread`` on: no thread until the first call, calls
    with and without keyword arguments, and a shutdown that returns while a call still runs (that
    call is abandoned)."""
    executor = DaemonExecutor("stop-lazy", workers=2)
    assert not [t for t in threading.enumerate() if t.name.startswith("stop-lazy-")]  # none before a call
    assert executor.submit(_minus, 5, b=2).result(LIVENESS_S) == 3
    assert executor.submit(_minus, 5).result(LIVENESS_S) == 5
    gate = threading.Event()
    running = executor.submit(gate.wait, LIVENESS_S)
    executor.shutdown(wait=True)
    assert not running.done()
    gate.set()
    assert running.result(LIVENESS_S) is True


def test_asyncio_run_ends_while_a_to_thread_call_on_the_daemon_executor_still_runs():
    """``asyncio.run`` cancels the task awaiting the call, then shuts the default executor down: with
    asyncio's own ThreadPoolExecutor that waits for the call, which here would not return until the
    gate opens after the bound."""
    gate = threading.Event()

    async def main():
        asyncio.get_running_loop().set_default_executor(DaemonExecutor("stop-test"))
        asyncio.ensure_future(asyncio.to_thread(gate.wait, 10 * LIVENESS_S))
        await asyncio.sleep(0.05)  # the call is on its thread

    runner = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    runner.start()
    runner.join(LIVENESS_S)
    try:
        assert not runner.is_alive(), "asyncio.run waited for the call in progress"
    finally:
        gate.set()


_EXITS_WITHOUT_STOP = """
import sys, time
from timerwheel_c.durable import DurableTimerService, Done, SQLiteStore, TimerKind, TimerRegistry, schedule_many
registry = TimerRegistry()

@registry.handler(TimerKind(1))
def fire(ctx, timer):
    return Done()

store = SQLiteStore(sys.argv[1])
schedule_many(store, [("p", time.time_ns() // 10**6, TimerKind(1), b"r%d" % i, b"") for i in range(20000)])
DurableTimerService(store, registry, ["p"]).start()
time.sleep(float(sys.argv[2]))
sys.exit(0)  # no stop(): a web server's worker, a reloader's child
"""


@pytest.mark.slow
def test_a_process_that_exits_without_stopping_its_sqlite_service_exits_cleanly(tmp_path):
    """An application that starts the embedded service on SQLite and exits without stop(), its
    service busy firing: the interpreter's exit must not close the store's connection under the
    service's thread (an exit-time finalizer did: SIGSEGV in sqlite3_changes, 3 runs in 10)."""
    script = tmp_path / "exits.py"
    script.write_text(_EXITS_WITHOUT_STOP)
    for run in range(8):
        db = tmp_path / f"t{run}.db"
        done = subprocess.run([sys.executable, str(script), str(db), str(0.2 + 0.05 * run)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=LIVENESS_S * 6)
        assert done.returncode == 0, (run, done.returncode, done.stderr[-2000:])

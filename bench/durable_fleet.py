"""The fleet figure at scale: runner processes over 100,000 partitions on a PostgreSQL server with
default settings, one SIGKILLed; ``python bench/run.py -m bench.durable_fleet [--partitions 100000]
[--runners 4] [--pg-dsn DSN] [--pg-log PATH] [--json]``.

- A fresh schema of the server holds ``partitions`` partitions, one pending timer each, a day away
  (written in bulk, ``apply_across``), in the store's default number of shards.
- ``runners`` ``timerwheel-c run`` processes (``python bench/run.py -m bench.durable_fleet runner``,
  the store's URL in the environment, never on a command line that ``ps`` shows) serve the whole
  store as a fleet: they divide its shards. The run waits until every runner owns some.
- Probes: one partition per shard receives a timer due every :data:`PROBE_STEP_MS` over
  :data:`PROBE_SPAN_MS`, the first :data:`PROBE_LEAD_MS` after the probes are written (after the
  runners serve: no due time is fixed before a process it waits on has started). The handler commits
  one effect row per fire holding the runner's pid and the host's wall clock at the fire (runners
  share this host), so a fire committed twice shows as two rows.
- :data:`KILL_AFTER_MS` into the probes, the runner owning the most shards is SIGKILLed. Its session
  ends with its socket, so the server frees its advisory locks at once; a survivor notices at its next
  ownership check or change signal.
- ``takeover_s``: from the SIGKILL to the first fire, by a survivor, of a probe in a shard the killed
  runner owned (probes fall due every :data:`PROBE_STEP_MS` there, so this is the takeover to within
  that step); ``takeover_all_s``: to the first such fire in the last of those shards, when the
  killed runner's whole share is served again. ``handover_s``: from the SIGKILL until the survivors own every shard, read from
  ``pg_locks`` (:func:`~timerwheel_c.durable.storage.postgres.ownership.runners`) every
  :data:`_POLL_S`.
- ``not_once``: probes whose effect did not commit exactly once, once every probe is due and the
  fleet has had :data:`GRACE_S` to fire it. ``lock_errors``: lines saying "out of shared memory" in
  the runners' logs and, with ``--pg-log`` (the server's log file on this host), in what the server
  logged during the run. ``max_locks_per_transaction`` is reported: the goal is for the server's
  default (64).

It is the ``fleet`` workload of ``python bench/run.py`` (with a PostgreSQL server: ``--pg-dsn``), at
100,000 partitions and 4 runners (``--quick``: 2,000 partitions, so its goals show as n/a).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Optional
from urllib.parse import quote

from timerwheel_c.durable.storage.shards import shard_of
from timerwheel_c.durable.storage.store import Batch
from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerKind, TimerRegistry
from .goals import Goal, print_alone
from .procs import stop as procs_stop
from .report import Reporter, fmt
from .run import command
from .stores import add_pg_dsn, pg_dsn

__all__ = ["GOAL_AT", "goals", "main", "measure", "registry", "table"]

GOAL_AT = 100_000  # partitions the goals are set for
RUNNERS = 4
TAKEOVER_GOAL_S = 2.0
KIND = TimerKind(0xC5)
FIRED = b"fleet-fired/"  # effect rows: outside the timer rows' key space
PROBE_STEP_MS = 100
PROBE_SPAN_MS = 8_000
PROBE_LEAD_MS = 1_000
KILL_AFTER_MS = 2_000
GRACE_S = 60.0  # bound on the last probes firing after they are due, on a loaded machine
LOCK_ERROR = "out of shared memory"
FILL_CHUNK = 10_000
_DSN_ENV = "TIMERWHEEL_C_FLEET_BENCH_DSN"  # the runner's store URL, kept off its command line
_START_S = 120.0  # bound on the runners starting and dividing the shards
_POLL_S = 0.05


class Record(TimerHandler):
    """Done with one effect row per fire, ``fleet-fired/<reference>/<token>`` holding ``"<wall µs> <pid>"``."""

    kind = KIND

    def fire(self, ctx, timer):
        row = FIRED + timer.reference + b"/" + os.urandom(8).hex().encode()
        return Done(Batch().put(row, b"%d %d" % (time.time_ns() // 1000, os.getpid())))


registry = TimerRegistry().register(Record())


def _runner() -> int:
    """Process entry: ``timerwheel-c run`` with :data:`registry`, the store from the environment."""
    from timerwheel_c.cli import main as cli_main

    os.environ["TIMERWHEEL_C_STORE"] = os.environ[_DSN_ENV]
    return cli_main(["run", "--handlers", "bench.durable_fleet:registry"])


def _probe_partitions(shard_count: int) -> dict:
    """One partition name per shard: ``{shard: partition}`` (names enough to reach every shard of a store
    of up to a few thousand shards, the last one found kept)."""
    return {shard_of(name, shard_count): name for name in (f"probe{i}" for i in range(64 * shard_count))}


def _fill(store, partitions: int) -> None:
    far_ms = time.time_ns() // 1_000_000 + 86_400_000  # a day away: never due during the run
    for start in range(0, partitions, FILL_CHUNK):
        store.apply_across([(f"entity-{i}", Batch().put(keys.timer(far_ms, KIND, b"idle%d" % i), b""))
                            for i in range(start, min(start + FILL_CHUNK, partitions))])


def _os_pid(info) -> Optional[int]:
    """The runner's OS pid, from the application_name it gives itself (``... pid N #TOKEN``)."""
    from timerwheel_c.durable.storage.runner_name import parse_runner_name

    who = parse_runner_name(info.application_name)
    return who[1] if who else None


class _Fleet:
    def __init__(self, dsn: str, runners: int, logs: Path):
        self.schema = f"fleet_{uuid.uuid4().hex[:12]}"
        sep = "&" if "?" in dsn else "?"
        self.dsn, self.url, self.logs = dsn, f"{dsn}{sep}options={quote(f'-csearch_path={self.schema}')}", logs
        self.procs: list = []
        self.n = runners
        self.most_locks = 0

    def start(self) -> None:
        env = dict(os.environ, **{_DSN_ENV: self.url})
        for i in range(self.n):
            # cwd=/: the runner must import the installed timerwheel_c, never a checkout in the working directory.
            with open(self.logs / f"runner{i}.log", "w") as log:
                self.procs.append(subprocess.Popen(command("bench.durable_fleet", "runner"), env=env, cwd="/",
                                                   stdout=subprocess.DEVNULL, stderr=log))

    def owners(self, store, conn) -> dict:
        """``{os pid: shards}`` of the live runners, from pg_locks; samples the advisory locks held."""
        from timerwheel_c.durable.storage.postgres.ownership import runners

        held = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()[0]
        self.most_locks = max(self.most_locks, held)
        return {_os_pid(r): set(r.shards) for r in runners(store, conn)}

    def wait_divided(self, store, conn) -> dict:
        deadline = time.monotonic() + _START_S
        while True:
            owners = self.owners(store, conn)
            if len(owners) == self.n and all(owners.values()) and \
                    set().union(*owners.values()) == set(range(store.shard_count)):
                return owners
            dead = [p.returncode for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"durable_fleet: the {self.n} runners did not divide the shards within "
                                   f"{_START_S:g} s (exit statuses {dead}); their logs: {self.logs}")
            time.sleep(0.2)


def _lock_errors(logs: Path, pg_log: Optional[str], pg_log_from: int) -> int:
    count = sum(p.read_text(errors="replace").count(LOCK_ERROR) for p in logs.glob("runner*.log"))
    if pg_log is not None:
        with open(pg_log, "rb") as f:
            f.seek(pg_log_from)
            count += f.read().decode(errors="replace").count(LOCK_ERROR)
    return count


def measure(dsn: str, partitions: int = GOAL_AT, runners: int = RUNNERS, pg_log: Optional[str] = None,
            say=lambda text: None) -> dict:
    """One run (see the module docstring): ``{"partitions", "runners", "shards", "probes",
    "max_locks_per_transaction", "takeover_s", "takeover_all_s", "handover_s", "not_once", "lock_errors", "most_advisory_locks",
    "killed_shards"}``; ``takeover_s`` / ``handover_s`` None when they did not happen within the bound.

    Raises:
        RuntimeError: the runners did not start and divide the shards (their logs are kept and named).
        ValueError: ``runners`` < 2 (none would be left to take over) or ``partitions`` < 1, naming it.
    """
    import psycopg

    from timerwheel_c.durable.storage.postgres import PostgresStore

    if isinstance(runners, bool) or not isinstance(runners, int) or runners < 2:
        raise ValueError(f"runners must be an int >= 2 (one is killed, the others take over), got {runners!r}")
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise ValueError(f"partitions must be an int >= 1, got {partitions!r}")
    pg_log_from = os.path.getsize(pg_log) if pg_log is not None else 0
    logs = Path(tempfile.mkdtemp(prefix="timerwheel_c-fleet-"))
    fleet = _Fleet(dsn, runners, logs)
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {fleet.schema}")
    store = PostgresStore(fleet.url)
    try:
        conn = store.new_connection()
        row = conn.execute("SHOW max_locks_per_transaction").fetchone()
        assert row is not None
        max_locks = int(row[0])
        say(f"filling {partitions:,} partitions")
        _fill(store, partitions)
        say(f"starting {runners} runners")
        fleet.start()
        owners = fleet.wait_divided(store, conn)
        probe_of = _probe_partitions(store.shard_count)
        first_ms = time.time_ns() // 1_000_000 + PROBE_LEAD_MS
        dues = range(first_ms, first_ms + PROBE_SPAN_MS, PROBE_STEP_MS)
        batches = []
        for shard, p in probe_of.items():
            batch = Batch()
            for due in dues:
                batch.put(keys.timer(due, KIND, b"s%d-%d" % (shard, due)), b"")
            batches.append((p, batch))
        store.apply_across(batches)
        victim_pid = max(owners, key=lambda pid: len(owners[pid]))
        victim = next(p for p in fleet.procs if p.pid == victim_pid)
        killed_shards = sorted(owners[victim_pid])
        time.sleep(max(0.0, (first_ms + KILL_AFTER_MS) / 1000 - time.time()))
        say(f"SIGKILL of the runner owning shards {killed_shards}")
        kill_us = time.time_ns() // 1000
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        handover_s = None
        deadline = time.monotonic() + GRACE_S
        while handover_s is None and time.monotonic() < deadline:
            survivors = [shards for pid, shards in fleet.owners(store, conn).items() if pid != victim_pid]
            if set().union(*survivors) == set(range(store.shard_count)):
                handover_s = (time.time_ns() // 1000 - kill_us) / 1e6
            else:
                time.sleep(_POLL_S)
        fires: dict = {}

        def collect() -> None:
            fires.clear()
            for shard, p in probe_of.items():
                for key, value in store.scan(p, FIRED, FIRED[:-1] + b"0", limit=1_000_000).entries:
                    at_us, pid = (int(v) for v in value.split())
                    fires.setdefault(key[len(FIRED):].rsplit(b"/", 1)[0], []).append((at_us, pid, shard))

        wanted = len(probe_of) * len(dues)
        deadline = time.monotonic() + max(0.0, (dues[-1] / 1000 - time.time())) + GRACE_S
        while True:
            collect()
            if len(fires) >= wanted or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        time.sleep(1.0)  # a doubled effect would show up by now as a second row
        collect()
        first_us: dict = {}  # killed shard -> the first survivor fire there, µs after the SIGKILL
        for hits in fires.values():
            for at_us, pid, shard in hits:
                if shard in killed_shards and pid != victim_pid and at_us >= kill_us:
                    first_us[shard] = min(first_us.get(shard, at_us - kill_us), at_us - kill_us)
        conn.close()
    finally:
        procs_stop(fleet.procs)
        store.close()
        with contextlib.suppress(Exception), psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {fleet.schema} CASCADE")
    lock_errors = _lock_errors(logs, pg_log, pg_log_from)
    shutil.rmtree(logs, ignore_errors=True)  # kept only when the runners failed to start (named in the error)
    return {"partitions": partitions, "runners": runners, "shards": len(probe_of), "probes": wanted,
            "max_locks_per_transaction": max_locks, "killed_shards": killed_shards,
            "takeover_s": min(first_us.values()) / 1e6 if first_us else None,
            "takeover_all_s": max(first_us.values()) / 1e6 if len(first_us) == len(killed_shards) else None,
            "handover_s": handover_s,
            "not_once": wanted - sum(len(h) == 1 for h in fires.values()),
            "lock_errors": lock_errors, "most_advisory_locks": fleet.most_locks}


def unavailable(why: str) -> dict:
    """The figures of a run that could not measure (no server): every goal n/a."""
    return {"unavailable": why}


def goals(figures: dict) -> list[tuple[Goal, Optional[float]]]:
    """Takeover after a SIGKILL at most :data:`TAKEOVER_GOAL_S`, every probe fired exactly once and no
    lock-table error, with :data:`RUNNERS` runners over :data:`GOAL_AT` partitions on a server whose
    ``max_locks_per_transaction`` is the default (another server's run is not judged)."""
    ok = "unavailable" not in figures and figures.get("max_locks_per_transaction") == 64
    what = f"{RUNNERS} runners, {GOAL_AT:,} partitions, default server"

    def value(key: str) -> Optional[float]:
        return None if not ok or figures.get(key) is None else float(figures[key])

    return [(Goal("fleet", f"takeover after SIGKILL ({what})", TAKEOVER_GOAL_S, at_most=True, unit="s"),
             value("takeover_s")),
            (Goal("fleet", f"probes not fired exactly once ({what})", 0.0, at_most=True, unit="timers"),
             value("not_once")),
            (Goal("fleet", f"lock-table errors ({what})", 0.0, at_most=True, unit="errors"), value("lock_errors"))]


def table(rep: Reporter, figures: dict) -> None:
    """The run's figures, one row."""
    if "unavailable" in figures:
        rep.table("fleet: takeover after SIGKILL", ["status"], [[figures["unavailable"]]])
        return
    cells = [f"{figures['runners']}", f"{figures['partitions']:,}", f"{figures['max_locks_per_transaction']}",
             "-" if figures["takeover_s"] is None else fmt(figures["takeover_s"]),
             "-" if figures["takeover_all_s"] is None else fmt(figures["takeover_all_s"]),
             "-" if figures["handover_s"] is None else fmt(figures["handover_s"]),
             f"{figures['not_once']:,} of {figures['probes']:,}", f"{figures['lock_errors']:,}",
             f"{figures['most_advisory_locks']:,}"]
    rep.table("fleet: a runner SIGKILLed, on PostgreSQL (see bench/durable_fleet.py)",
              ["runners", "partitions", "max_locks_per_tx", "takeover s", "every shard s", "handover s", "not once",
               "lock errors", "most advisory locks"], [cells])


def main(argv=None) -> int:
    """``python bench/run.py -m bench.durable_fleet ...`` (``--help``); returns the exit status: 1 when a
    probe did not fire exactly once or a lock-table error was logged, 2 on a bad argument."""
    parser = argparse.ArgumentParser(prog="bench.durable_fleet", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=GOAL_AT, help=f"partitions (default {GOAL_AT:,})")
    parser.add_argument("--runners", type=int, default=RUNNERS, help=f"runner processes (default {RUNNERS})")
    parser.add_argument("--pg-log", default=None, metavar="PATH", help="the server's log file, to count lock-table errors")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_pg_dsn(parser)
    args = parser.parse_args(argv)
    dsn = pg_dsn(args.pg_dsn)
    if dsn is None or args.runners < 2 or args.partitions < 1:
        parser.print_usage(sys.stderr)
        print("bench.durable_fleet: error: " + ("--pg-dsn is required" if dsn is None else
              f"--runners must be >= 2 and --partitions >= 1, got {args.runners!r}, {args.partitions!r}"),
              file=sys.stderr)
        return 2
    figures = measure(dsn, args.partitions, args.runners, args.pg_log,
                      say=(lambda text: None) if args.json else (lambda text: print(text, flush=True)))
    set_at = None if (args.partitions, args.runners) == (GOAL_AT, RUNNERS) else f"{RUNNERS} runners, {GOAL_AT:,} partitions"
    verdicts = [goal.judge(value, set_at) for goal, value in goals(figures)]
    print_alone(figures, verdicts, table, args.json)
    return 1 if figures["not_once"] or figures["lock_errors"] else 0


if __name__ == "__main__":
    sys.exit(_runner() if sys.argv[1:] == ["runner"] else main(sys.argv[1:]))

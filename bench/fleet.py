"""Durable timers on PostgreSQL as a fleet: fired/s with 1 and 4 runner processes, and the
takeover time after a runner is SIGKILLed.

- Runners are separate processes (``python bench/run.py -m bench.fleet runner TABLE``, the DSN
  in the environment, never on a command line that ``ps`` shows), each a
  :class:`~timerwheel_c.durable.service.service.DurableTimerService` with ``fleet=True`` over the same
  list of 16 partitions, whose partitions they divide (advisory-lock ownership), and a no-op
  handler whose Done batch commits one effect row; the process prepared for the collector as
  ``timerwheel-c run`` prepares its own (:func:`~timerwheel_c.durable.service.process.prepare_process`); the default
  :class:`~timerwheel_c.durable.timers.runner.TickBudget`, as ``timerwheel-c run`` has (at most 1,024
  timers, 256 of one kind, per partition per tick), and, for the largest fleet, once more with
  :data:`LARGE_BUDGET` (no cap per kind), which shows what the cap per kind costs in round trips.
- The store keeps the server's settings (``synchronous_commit`` as configured: on by default,
  one WAL flush per commit), unlike the single-process durable bench.
- ``fired_per_s``: once every partition has its owner, ``n_timers`` rows spread over the
  partitions become due at one instant T0; the figure is ``n_timers`` over the time from T0
  until no timer row is left (:func:`.drain.wait_done`; the outcome that deletes a timer's row
  commits its effect row in the same transaction), after which the effect rows are counted.
- Warm-up: first, ``max(200, n_timers // 50)`` timers (:func:`.drain.warmup_items`) due at once
  over every partition, so some in every runner's (the run fails otherwise), are fired and waited
  for until every effect row is written; only then are the measured timers scheduled, due 1 s
  later, the meter starting :data:`.cpu_split.LEAD_S` before that instant (one started at it, after
  a poll of 20 ms, left out the fires that beat it: all 32 of a run of 32 timers). The figures are those of the steady state, per fired
  timer: costs paid once per process or session, which a run of 10,000 timers would otherwise
  spread over its fires, fall in the warm-up (a new server session's ~2 ms of server CPU, a
  session's first call of the set-based write function 4.3 to 4.9 ms, PL/pgSQL compiling it, the
  commit connection a runner opens at its first outcome). In 4 alternating pairs of runs of
  ``python bench/run.py -m bench.peers --pg-dsn DSN`` (2 vCPUs, load average 2.4 to 6.5), the
  runs' median CPU per fired timer, runner / server, went from 14 / 13.5 to 13 / 12 µs with 1
  runner and from 20 / 17 to 16.5 / 10 µs with 4 (whole µs: the meter counts 10 ms ticks). The
  warm-up's timers are checked like the measured ones (each effect once) and count in neither
  ``fired_per_s`` nor the CPU; the result's ``warmup`` gives their number (``items``), each
  runner's share (``per_process``) and their own CPU split per warm-up timer, their scheduling
  included: 450 to 650 / 50 to 100 µs with 1 runner, 200 to 450 / 250 to 300 µs with 4, as its
  timers come due as each partition's batch commits, in smaller ticks than the measured run's: an
  upper bound of the start-up costs, not their measure.
- The CPU split of that interval (:class:`.cpu_split.CpuMeter`): the runner processes' and the
  PostgreSQL server's CPU time, in µs per fired timer.
- With ``rounds`` > 1, each runner count runs that many times, round by round (a peer's runs, when
  given, right after each of ours, so that the machine's drift hits both alike); the figures are
  those of the median run.
- ``takeover_s``: after the run, one runner is SIGKILLed; the time until every partition is
  owned again by the survivors (read from ``pg_locks``), which includes the server noticing
  the closed connection and the survivors' next ownership check (1 s interval).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Callable, Optional

from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerRegistry
from timerwheel_c.durable.timers.runner import TickBudget
from timerwheel_c.durable.storage.store import Batch
from . import fleet_wakeup
from .cpu_split import CpuMeter
from .drain import wait_done, warmup_items
from .run import command
from .stores import dispose
from .procs import stop as procs_stop

__all__ = ["median_run", "run"]

PARTITIONS = [f"fleet{i:02d}" for i in range(16)]
_KIND = keys.TimerKind(1)
_EFFECT = b"E"  # effect rows: outside the timer space ("T")
_START_S = 60.0  # bound on runners starting and dividing the partitions
_POLL_S = 0.02


class _Noop(TimerHandler):
    kind = _KIND

    def fire(self, ctx, timer):
        return Done(Batch().put(_EFFECT + timer.reference, b""))


_DSN_ENV = "TIMERWHEEL_C_FLEET_DSN"
LARGE_BUDGET = TickBudget(max_fired=1024, max_per_kind=1024, max_scanned=4096)


def _runner(dsn: str, table: str, budget: str) -> None:
    """Process entry: serve the fleet's partitions until SIGTERM, with the default or the large budget."""
    from timerwheel_c.durable.storage.postgres import PostgresStore
    from timerwheel_c.durable.service.process import StopSignals, prepare_process
    from timerwheel_c.durable.service.service import DurableTimerService

    with StopSignals((signal.SIGTERM,)) as stop:
        store = PostgresStore(dsn, table=table)
        registry = TimerRegistry().register(_Noop())
        prepare_process()  # a process that exists to run the service, as timerwheel-c run prepares its own
        with DurableTimerService(store, registry, PARTITIONS, fleet=True,
                                 budget=LARGE_BUDGET if budget == "large" else TickBudget()):
            while stop.wait(1) is None:
                pass
        store.close()


def _wait(predicate, what: str, timeout_s: float = _START_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"fleet bench: timed out after {timeout_s} s waiting for {what}")
        time.sleep(_POLL_S)


def _effects(conn, table: str) -> int:
    from psycopg import sql

    query = sql.SQL("SELECT count(*) FROM {} WHERE key >= %s AND key < %s").format(sql.Identifier(table))
    return conn.execute(query, (_EFFECT, bytes([_EFFECT[0] + 1]))).fetchone()[0]


def _unsettled(conn, table: str, count: bool) -> int:
    """Timer rows left, scheduled or claimed, in the partitions' index ranges: how many (``count``), or
    whether any (0 or 1, a probe that stops at the first). The outcome that deletes a claimed row
    commits its effect row in the same transaction, so none left means every effect is written;
    the effect rows themselves have no index to count them by."""
    from psycopg import sql

    inner = sql.SQL("SELECT {} FROM {} WHERE partition = ANY(%s) AND key >= %s AND key < %s").format(
        sql.SQL("count(*)" if count else "1"), sql.Identifier(table))
    query = inner if count else sql.SQL("SELECT count(*) FROM ({} LIMIT 1) AS probe").format(inner)
    return conn.execute(query, (PARTITIONS, *keys.timer_range())).fetchone()[0]


def _fill(store, n_timers: int, due_ms: int, reference: bytes = b"%08d") -> dict:
    """Schedule ``n_timers`` timers due at ``due_ms``, spread round robin over the partitions, each
    named by ``reference`` % its number (a warm-up's differ from the measured run's, and so do their
    effect rows); returns ``{partition: how many}``."""
    spread = {}
    for p_index, partition in enumerate(PARTITIONS):
        batch = Batch()
        for i in range(p_index, n_timers, len(PARTITIONS)):
            batch.put(keys.timer(due_ms, _KIND, reference % i), b"")
        store.apply(partition, batch)
        spread[partition] = len(range(p_index, n_timers, len(PARTITIONS)))
    return spread


def _warm_up(store, conn, table: str, n_items: int, held: Callable[[], dict], pids: list) -> dict:
    """Fire ``n_items`` timers due now and wait until every one has its effect row, before the
    measured run (see the module's docstring); ``held()`` (``{partition: backend pid}`` of the
    runners' lock sessions) gives each runner its share. Returns ``{"items": n_items, "per_process":
    [items of each runner, in its partitions]}`` with the CPU split of the warm-up (the runner
    processes ``pids``': see :class:`.cpu_split.CpuMeter`), per warm-up timer.

    Raises:
        RuntimeError: a runner's partitions got no warm-up timer, the timers were not all fired
            within 600 s, an effect is missing or doubled, or the partitions changed hands meanwhile.
    """
    owners = held()
    meter = CpuMeter(conn)
    meter.start(pids)
    spread = _fill(store, n_items, time.time_ns() // 1_000_000, b"w%07d")
    per_runner: dict = {}
    for partition, pid in owners.items():
        per_runner[pid] = per_runner.get(pid, 0) + spread[partition]
    if len(owners) != len(PARTITIONS) or min(per_runner.values()) < 1:
        raise RuntimeError(f"fleet bench: a runner has no warm-up timer ({per_runner}, {len(owners)} partitions owned)")
    wait_done(n_items, lambda: _unsettled(conn, table, False) > 0, lambda: _unsettled(conn, table, True),
              None, 600, "fleet bench: warm-up timers unsettled")
    cpu = meter.stop(n_items)
    effects = _effects(conn, table)
    if effects != n_items:
        raise RuntimeError(f"fleet bench: {effects} effects for {n_items} warm-up timers (a duplicate or a loss)")
    if held() != owners:
        raise RuntimeError("fleet bench: the partitions changed hands during the warm-up")
    return {"items": n_items, "per_process": sorted(per_runner.values()), **cpu}


def _one(dsn: str, n_runners: int, n_timers: int, budget: str, takeover: bool, progress) -> dict:
    from timerwheel_c.durable.storage.postgres.ownership import holders
    from timerwheel_c.durable.storage.postgres import PostgresStore

    table = f"timerwheel_fleet_{os.getpid()}_{n_runners}_{budget}"
    store = PostgresStore(dsn, table=table)
    procs: list = []
    conn = store.new_connection()
    try:
        env = dict(os.environ, **{_DSN_ENV: dsn})
        procs = [subprocess.Popen(command("bench.fleet", "runner", table, budget), env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for _ in range(n_runners)]

        def held() -> dict:
            """Partition -> backend pid of the runner's lock connection that owns it."""
            return holders(store, PARTITIONS, conn, kinds=[_KIND.get()])

        def owners() -> dict:
            """Backend pid (of a runner's lock connection) -> how many partitions it owns."""
            now = held()
            return {pid: list(now.values()).count(pid) for pid in set(now.values())} if len(now) == len(PARTITIONS) else {}

        def divided() -> bool:
            # One read: a second could see the partitions mid-rebalance, held by no one.
            counts = owners()
            return len(counts) == n_runners and max(counts.values()) - min(counts.values()) <= 1

        _wait(divided, f"{n_runners} runners to divide {len(PARTITIONS)} partitions")
        warmup = _warm_up(store, conn, table, warmup_items(n_timers), held, [p.pid for p in procs])
        due_ms = time.time_ns() // 1_000_000 + 1000
        _fill(store, n_timers, due_ms)
        meter = CpuMeter(conn)
        meter.start_before([p.pid for p in procs], due_ms / 1000)
        wait_done(n_timers, lambda: _unsettled(conn, table, False) > 0, lambda: _unsettled(conn, table, True),
                  progress, 600, "fleet bench: timers unsettled")
        elapsed_s = time.time_ns() / 1e9 - due_ms / 1000
        cpu = meter.stop(n_timers)
        effects = _effects(conn, table)
        if effects != n_timers + warmup["items"]:
            raise RuntimeError(f"fleet bench: {effects} effects for {n_timers} timers and {warmup['items']} "
                               "of the warm-up (a duplicate or a loss)")
        result = {"runners": n_runners, "partitions": len(PARTITIONS), "timers": n_timers, "budget": budget,
                  "fired_per_s": n_timers / elapsed_s, **cpu, "warmup": warmup}
        if takeover:
            before = set(owners())
            procs[0].send_signal(signal.SIGKILL)
            killed = time.monotonic()
            procs[0].wait()
            # Taken over: every partition owned again, by the survivors' lock connections alone.
            _wait(lambda: len(owners()) == n_runners - 1 and set(owners()) <= before, "the takeover", 60)
            result["takeover_s"] = time.monotonic() - killed
        return result
    finally:
        procs_stop(procs)
        conn.close()
        dispose(store)


def median_run(runs: list) -> dict:
    """The run of median ``fired_per_s`` among ``runs`` (the lower middle one of an even count),
    with every run's fired/s in run order as ``fired_per_s_rounds``, and the ``takeover_s`` of
    whichever run measured it."""
    ordered = sorted(runs, key=lambda r: r["fired_per_s"])
    out = {k: v for k, v in ordered[(len(ordered) - 1) // 2].items() if k != "takeover_s"}
    takeover = [r["takeover_s"] for r in runs if "takeover_s" in r]
    if takeover:
        out["takeover_s"] = takeover[-1]
    out["fired_per_s_rounds"] = [r["fired_per_s"] for r in runs]
    return out


def run(dsn: str, n_timers: int = 8000, runner_counts=(1, 4), progress: Optional[Callable[[int], None]] = None,
        rounds: int = 1, peer: Optional[Callable[[int], None]] = None) -> dict:
    """Measure the fleet on the PostgreSQL server of ``dsn``; returns
    ``{"runners_1": {"fired_per_s": float, ...}, "runners_4": {..., "takeover_s": float},
    "runners_4_large_budget": {...}}`` (for ``runner_counts=(1, 4)``).

    Each entry also names its ``runners``, ``partitions`` (16), ``timers`` and ``budget``
    ("default" or "large", :data:`LARGE_BUDGET`), and gives the CPU split
    (``runner_cpu_us_per_fired``, ``server_cpu_us_per_fired``, ``cpu_note``: see
    :class:`.cpu_split.CpuMeter`); ``takeover_s`` (seconds from SIGKILL to
    every partition owned again) is measured with the largest fleet, default budget, in the
    last round. The default-budget entries are the median of ``rounds`` runs
    (:func:`median_run`); ``peer(n)``, when given, is called right after each of them with its
    runner count, to run a peer system interleaved with ours.
    ``new_partition_wakeup``: the lateness of a timer into a new partition in a fleet
    (:func:`bench.fleet_wakeup.run`). ``progress(k)`` is called with the number
    of timers just fired.

    Raises:
        ValueError: ``n_timers`` < 16, an empty ``runner_counts`` or ``rounds`` < 1.
        RuntimeError: the runners did not divide the partitions or fire every timer within
            the bounds (60 s to start, 600 s to fire), or an effect was doubled.
        psycopg.Error: the server cannot be reached.
    """
    if isinstance(n_timers, bool) or not isinstance(n_timers, int) or n_timers < len(PARTITIONS):
        raise ValueError(f"n_timers must be an int >= {len(PARTITIONS)}, got {n_timers!r}")
    counts = sorted(set(runner_counts))
    if not counts or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in counts):
        raise ValueError(f"runner_counts must hold ints >= 1, got {runner_counts!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
    runs: dict = {n: [] for n in counts}
    for r in range(rounds):
        for n in counts:
            runs[n].append(_one(dsn, n, n_timers, "default", r == rounds - 1 and n == counts[-1] and n > 1, progress))
            if peer is not None:
                peer(n)
    figures = {f"runners_{n}": median_run(runs[n]) for n in counts}
    figures[f"runners_{counts[-1]}_large_budget"] = _one(dsn, counts[-1], n_timers, "large", False, progress)
    figures["new_partition_wakeup"] = fleet_wakeup.run(dsn)
    return figures


if __name__ == "__main__":
    if sys.argv[1:2] != ["runner"] or len(sys.argv) != 4 or sys.argv[3] not in ("default", "large") \
            or _DSN_ENV not in os.environ:
        sys.exit(f"usage: {_DSN_ENV}=postgresql://... python bench/run.py -m bench.fleet runner TABLE default|large")
    _runner(os.environ[_DSN_ENV], sys.argv[2], sys.argv[3])

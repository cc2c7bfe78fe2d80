"""Durable service as a fleet member: cross-process wake-ups and concurrent handlers.

- ``wakeup_lateness_ms``: a runner *process* (this module run as ``__main__``, a
  :class:`DurableTimerService` with default settings) idles; this process writes
  :data:`WAKEUP_TIMERS` timers with the module-level :func:`timerwheel_c.durable.schedule`,
  one every :data:`WAKEUP_GAP_MS`, each due :data:`WAKEUP_LEAD_MS` after its write, so at
  most one is pending and the runner is idle when each arrives; the partition exists
  before the runner starts (steady state); ``wakeup_lateness_16p_ms`` (PostgreSQL) is the same
  with the timers spread round-robin over 16 partitions the runner serves. Lateness is the wall time
  from the due time to the start of ``fire`` in the runner (ms). Only the store's change
  signal can wake the runner in time (target: p99 <= 50 ms on both backends).
- ``fired_per_s_20ms``: :data:`IO_TIMERS` rows already due, a handler that sleeps 20 ms
  (an HTTP call, an email), at concurrency 1 and 16; fired/s from the service's start to
  the last commit, with ``duplicates`` (effects applied more than once, must be 0).
  Target: >= 500 fired/s at concurrency 16 on SQLite.
- ``watcher_idle_cpu_pct`` (SQLite): the CPU time of the idle change watcher's thread
  (Linux schedstat; elsewhere the process's CPU time with the watcher minus without it)
  over :data:`IDLE_CPU_S` seconds, in percent of one core (target: <= 1 %).
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from timerwheel_c.durable import DurableTimerService, SQLiteStore, schedule
from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerKind, TimerRegistry
from timerwheel_c.durable.storage.store import Batch, Store
from .run import command
from .stores import dispose

__all__ = ["IDLE_CPU_S", "IO_TIMERS", "WAKEUP_GAP_MS", "WAKEUP_LEAD_MS", "WAKEUP_TIMERS", "service_figures",
           "wakeup_lateness_ms"]

_KIND = TimerKind(2)
_P = "bench"
WAKEUP_TIMERS = 100
WAKEUP_GAP_MS = 60
WAKEUP_LEAD_MS = 50
IO_TIMERS = {1: 100, 16: 1200}  # rows per concurrency: about 2 s of work each at the target rates
IDLE_CPU_S = 2.0
_DSN_ENV = "TIMERWHEEL_C_BENCH_PG_DSN"  # the runner process reads the DSN here, never from its argv


class _Stamp(TimerHandler):
    """Records the fire's wall ms in an effect row per application (a double shows as two rows);
    sleeps ``sleep_s`` first (an I/O-bound handler)."""

    kind = _KIND

    def __init__(self, sleep_s: float = 0.0):
        self.sleep_s = sleep_s

    def fire(self, ctx, timer):
        fired_ms = time.time_ns() // 1_000_000
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return Done(Batch().put(b"effect/" + timer.reference + b"/" + os.urandom(6).hex().encode(), b"%d" % fired_ms))


def _effects(store: Store, partitions: tuple = (_P,)) -> dict:
    """reference -> [fire wall ms, one per application], over ``partitions``."""
    out: dict = {}
    for partition in partitions:
        after = None
        while True:
            page = store.scan(partition, b"effect/", b"effect0", after, 1000)
            for k, v in page.entries:
                out.setdefault(k.split(b"/")[1], []).append(int(v))
            if page.next is None:
                break
            after = page.next
    return out


def _open(target: str, dsn: Optional[str]) -> Store:
    """``sqlite:PATH``, or ``postgres:TABLE`` in the database of ``dsn``."""
    kind, _, name = target.partition(":")
    if kind == "postgres":
        from timerwheel_c.durable.storage.postgres import PostgresStore

        return PostgresStore(dsn or "", table=name, synchronous_commit="off")
    return SQLiteStore(name)


def wakeup_lateness_ms(target: str, dsn: Optional[str], n: int, progress, n_partitions: int = 1) -> list:
    """``wakeup_lateness_ms`` above for the store ``target`` (``sqlite:PATH`` or ``postgres:TABLE`` on
    ``dsn``) with ``n`` timers, round-robin over ``n_partitions`` partitions: one lateness (ms) per
    timer, in writing order; ``progress(1)`` per write.

    Raises:
        RuntimeError: the runner did not start, or timers did not fire within 30 s.
    """
    store = _open(target, dsn)
    partitions = (_P,) if n_partitions == 1 else tuple(f"{_P}{i:02d}" for i in range(n_partitions))
    # The partitions exist before the runner starts: a fleet runner (PostgreSQL, every partition)
    # takes a brand-new partition only at its next ownership check, up to a second later.
    for partition in partitions:
        store.apply(partition, Batch().put(b"partition-marker", b""))
    env = dict(os.environ)
    if dsn is not None:
        env[_DSN_ENV] = dsn
    with tempfile.TemporaryDirectory(prefix="timerwheel_c-wake-") as tmp:
        ready, log_path = Path(tmp) / "ready", Path(tmp) / "runner.log"
        # Its stderr goes to a file: a pipe nobody reads would block the runner once full.
        with open(log_path, "wb") as log_file:
            runner = subprocess.Popen(command(__name__, target, str(ready)), env=env, cwd=tmp,
                                      stdout=subprocess.DEVNULL, stderr=log_file)
        try:
            deadline = time.monotonic() + 60
            while not ready.exists():
                if runner.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the runner process did not start: {log_path.read_text(errors='replace')[-2000:]}")
                time.sleep(0.01)
            time.sleep(0.5)  # let it go idle
            dues = {}
            for i in range(n):
                ref = b"w%04d" % i
                dues[ref] = time.time_ns() // 1_000_000 + WAKEUP_LEAD_MS
                schedule(store, partitions[i % len(partitions)], dues[ref], _KIND, ref)
                time.sleep(WAKEUP_GAP_MS / 1000)
                if progress is not None:
                    progress(1)
            deadline = time.monotonic() + 30
            while len(_effects(store, partitions)) < n and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            runner.kill()
            runner.wait(10)
        fired = _effects(store, partitions)
        dispose(store)
        if len(fired) < n:
            # Which timers, and what the runner said, while its log still exists: a bare count says
            # neither whether the runner was stalled nor which write it missed.
            missing = b", ".join(sorted(set(dues) - set(fired))).decode()
            raise RuntimeError(f"only {len(fired)} of {n} cross-process timers fired within 30 s (not: {missing}); "
                               f"the runner's log: {log_path.read_text(errors='replace')[-2000:] or '(empty)'}")
    return [float(min(fired[ref]) - due) for ref, due in dues.items()]


def _fired_per_s_20ms(make_store: Callable[[], Store], concurrency: int, n: int, progress) -> dict:
    store = make_store()
    # The backlog is deliberate: the service's "falling behind" warnings would only clutter the bench output.
    quiet = logging.getLogger("timerwheel_c.durable")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        now_ms = time.time_ns() // 1_000_000
        store.apply_many(_P, [Batch().put(keys.timer(now_ms - 1000, _KIND, b"%06d" % i), b"")
                              for i in range(n)])
        t0 = time.perf_counter()
        with DurableTimerService(store, TimerRegistry().register(_Stamp(0.020)), [_P], concurrency=concurrency) as svc:
            deadline = time.monotonic() + 120
            seen = 0
            while svc.fired < n and time.monotonic() < deadline:
                time.sleep(0.01)
                if progress is not None and svc.fired > seen:
                    progress(svc.fired - seen)
                    seen = svc.fired
            elapsed_s = time.perf_counter() - t0
        applied = _effects(store)
    finally:
        quiet.setLevel(level)
        dispose(store)
    if len(applied) < n:
        raise RuntimeError(f"only {len(applied)} of {n} timers fired at concurrency {concurrency}")
    return {"timers": n, "fired_per_s": n / elapsed_s, "duplicates": sum(len(v) - 1 for v in applied.values())}


def _thread_cpu_s(native_id) -> Optional[float]:
    """CPU seconds of one thread of this process from Linux's schedstat (ns), or None elsewhere."""
    try:
        with open(f"/proc/self/task/{native_id}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _watcher_idle_cpu_pct(make_store: Callable[[], Store]) -> float:
    """The watcher thread's own CPU time where Linux reports it; else the process's CPU time with
    the watcher minus without it."""
    store = make_store()
    try:
        def cpu_share(watching: bool) -> float:
            watcher = store.watch(lambda: None) if watching else None
            native_id = getattr(watcher, "native_id", None)
            try:
                time.sleep(0.1)
                thread0, c0, t0 = _thread_cpu_s(native_id), time.process_time(), time.perf_counter()
                time.sleep(IDLE_CPU_S)
                thread1, c1, t1 = _thread_cpu_s(native_id), time.process_time(), time.perf_counter()
                if thread0 is not None and thread1 is not None:
                    return (thread1 - thread0) / (t1 - t0)
                return (c1 - c0) / (t1 - t0)
            finally:
                if watcher is not None:
                    watcher.close()

        watched = cpu_share(True)
        if _thread_cpu_s(threading.get_native_id()) is not None:  # the watcher thread's own time
            return watched * 100
        return max(0.0, watched - cpu_share(False)) * 100
    finally:
        dispose(store)


def service_figures(backend: str, tmp: str, dsn: Optional[str] = None, progress=None, max_timers: int = 10_000) -> dict:
    """The figures above for ``backend`` ("sqlite", files in ``tmp``; or "postgres" on ``dsn``), each
    with at most ``max_timers`` timers (a small run for tests; the sizes above otherwise).

    Returns ``{"wakeup_lateness_ms": [float], "fired_per_s_20ms": {"1": {...}, "16": {...}}}``
    plus ``"watcher_idle_cpu_pct"`` for SQLite and ``"wakeup_lateness_16p_ms"`` for PostgreSQL.

    Raises:
        RuntimeError: timers did not fire (a broken build).
    """
    counter = iter(range(1_000_000))

    def target() -> str:
        if backend == "postgres":
            return f"postgres:timerwheel_bench_svc_{os.getpid()}_{next(counter)}"
        return f"sqlite:{os.path.join(tmp, f'svc{next(counter)}.db')}"

    def make_store() -> Store:
        return _open(target(), dsn)

    figures: dict = {
        "wakeup_lateness_ms": wakeup_lateness_ms(target(), dsn, min(WAKEUP_TIMERS, max_timers), progress),
        "fired_per_s_20ms": {str(c): _fired_per_s_20ms(make_store, c, min(n, max_timers), progress)
                             for c, n in sorted(IO_TIMERS.items())},
    }
    if backend == "sqlite":
        figures["watcher_idle_cpu_pct"] = _watcher_idle_cpu_pct(make_store)
    else:
        figures["wakeup_lateness_16p_ms"] = wakeup_lateness_ms(target(), dsn, min(WAKEUP_TIMERS, max_timers),
                                                               progress, n_partitions=16)
    return figures


def _serve(target: str, ready: str) -> None:
    """The runner process: default settings, until killed."""
    DurableTimerService(_open(target, os.environ.get(_DSN_ENV)), TimerRegistry().register(_Stamp())).start()
    Path(ready).touch()
    while True:
        time.sleep(1)


if __name__ == "__main__":
    _serve(*sys.argv[1:3])

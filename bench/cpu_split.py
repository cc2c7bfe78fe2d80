"""Where the CPU time of a durable run goes: the runner processes and the PostgreSQL server, in
µs per fired timer, read from Linux's ``/proc``.

- Runner CPU: the user + system time (``/proc/PID/stat`` utime + stime, every thread of the
  process) of each runner or worker process over the measured interval.
- Server CPU: the PostgreSQL server's user + system time over the same interval: the
  postmaster's own time, plus that of its children which have exited (the postmaster reaps them,
  so a backend that ends during the run lands in its cutime + cstime), plus that of every live
  child (backends, WAL writer, checkpointer, autovacuum), except the backend of the meter's own
  connection: the bench's, on which it waits for the run to end (:mod:`.drain`), not the measured
  system's. That wait asks every 5 ms, and a backend woken from idle for a query costs the server
  44 µs of CPU for ``SELECT 1`` and 80 to 90 µs for the wait's probe (a 2-vCPU machine): 1.0 to
  3.4 µs per fired timer in fleet runs of 10,000 timers, counted as the run's before. The postmaster is found as the parent
  process of this session's backend (``pg_backend_pid()``), as ``ps`` shows it.

The server's share is known only when the server runs on this machine: a loopback or Unix-socket
DSN whose backend is a ``postgres`` process here. Otherwise (or without ``/proc``) the figure is
None and ``cpu_note`` says why. The server's figure includes whatever other clients of the same
server did during the interval.
"""
from __future__ import annotations

import os
import time
from typing import Optional

__all__ = ["LEAD_S", "CpuMeter"]

# Seconds before the measured items' due time that the interval begins (:meth:`CpuMeter.start_before`):
# a start read after the due time would leave out the fires that beat it (a sleep's overshoot, the
# bench's own poll), which favours whichever system fires first; idle workers and server cost next
# to nothing in this lead.
LEAD_S = 0.2

_PROC = "/proc"


def _stat(pid: int) -> Optional[list]:
    """The fields of ``/proc/PID/stat`` after the command name (state first), or None if gone."""
    try:
        with open(f"{_PROC}/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def _ticks(fields: list, children: bool = False) -> int:
    """utime + stime (fields 14 and 15 of proc(5)), and with ``children`` also cutime + cstime."""
    own = int(fields[11]) + int(fields[12])
    return own + int(fields[13]) + int(fields[14]) if children else own


def _comm(pid: int) -> str:
    try:
        with open(f"{_PROC}/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


class CpuMeter:
    """Measure runner and server CPU over an interval: ``start(runner_pids)``, then
    ``stop(fired)``, which returns ``{"runner_cpu_us_per_fired": float | None,
    "server_cpu_us_per_fired": float | None, "cpu_note": str | None}`` (µs of CPU per fired
    timer; ``cpu_note`` says why a figure is None).

    ``conn`` is an open psycopg connection to the measured server, used once here to find the
    postmaster; its own backend's CPU is left out of the server's (the bench's queries, not the run's).
    """

    def __init__(self, conn) -> None:
        self._tick_s = 1 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.0
        self._postmaster: Optional[int] = None
        self._own: Optional[int] = None  # the backend of ``conn``: the bench's, left out
        self._runners: list = []
        self._start = (0, 0)
        self.note: Optional[str] = None
        if not os.path.isdir(f"{_PROC}/self"):
            self.note = "no /proc on this system: CPU time is read from Linux's /proc"
            return
        host = conn.info.host or ""
        backend = conn.info.backend_pid
        fields = _stat(backend)
        local = host.startswith(("/", "127.")) or host in ("localhost", "::1")  # a Unix socket, or loopback
        if not local or fields is None or _comm(backend) != "postgres":
            self.note = (f"the PostgreSQL server ({host or 'default host'}) is not a process of this "
                         "machine: its CPU time cannot be read here")
            return
        self._postmaster = int(fields[1])
        self._own = backend

    def _server_ticks(self) -> int:
        assert self._postmaster is not None
        # A backend that ends while /proc is read moves from the live children to the postmaster's
        # cutime + cstime once reaped: read before it and after, it would be counted twice or not at
        # all (a service closing its connections as the interval ends lost nearly all of the
        # server's time so). So the children are read between two reads of the postmaster's, and
        # read again if it reaped one meanwhile.
        for _ in range(10):
            before = _stat(self._postmaster)
            total = 0
            for name in os.listdir(_PROC):
                pid = int(name) if name.isdigit() else 0
                fields = _stat(pid) if pid and pid != self._postmaster and pid != self._own else None
                if fields is not None and int(fields[1]) == self._postmaster:
                    total += _ticks(fields)
            after = _stat(self._postmaster)
            if before is not None and after is not None and _ticks(before, True) == _ticks(after, True):
                break
        return total + (_ticks(after, children=True) if after is not None else 0)

    def _runner_ticks(self) -> Optional[int]:
        fields = [_stat(pid) for pid in self._runners]
        return None if any(f is None for f in fields) else sum(_ticks(f) for f in fields if f is not None)

    def start(self, runner_pids: list) -> None:
        """Begin the interval; ``runner_pids``: the runner processes, alive until :meth:`stop`."""
        self._runners = list(runner_pids)
        if not os.path.isdir(f"{_PROC}/self"):
            return
        self._start = (self._runner_ticks() or 0, self._server_ticks() if self._postmaster is not None else 0)

    def start_before(self, runner_pids: list, due_s: float) -> None:
        """:meth:`start`, :data:`LEAD_S` before ``due_s`` (Unix epoch s, ``time.time()``'s), the due time of
        every measured item, at once if that has passed; both systems' runs begin their interval so."""
        time.sleep(max(0.0, due_s - LEAD_S - time.time()))
        self.start(runner_pids)

    def stop(self, fired: int) -> dict:
        """End the interval; the figures per ``fired`` timer (see the class)."""
        if not os.path.isdir(f"{_PROC}/self"):
            return {"runner_cpu_us_per_fired": None, "server_cpu_us_per_fired": None, "cpu_note": self.note}
        runner = self._runner_ticks()
        server = self._server_ticks() if self._postmaster is not None else None
        us = self._tick_s * 1e6 / max(fired, 1)
        note = self.note if runner is not None else "a runner process exited during the run"
        return {"runner_cpu_us_per_fired": None if runner is None else (runner - self._start[0]) * us,
                "server_cpu_us_per_fired": None if server is None else (server - self._start[1]) * us,
                "cpu_note": note}

"""The loopback load benchmark: an idle-timeout server under thousands of connections.

For each scheduler, a server subprocess (:mod:`bench.network_server`, the
line-echo idle-timeout server of ``examples/idle_timeout_server.py``, instrumented) keeps
one idle timeout per connection with asyncio's ``loop.call_later`` (cancel + re-arm per
message) or with :class:`timerwheel_c.aio.WheelScheduler` (``reschedule`` per message),
on the default loop and, when it imports, on uvloop. This process is the client: it opens
``connections`` loopback connections (127.0.0.1 only) on one loop (uvloop when
available, the same client for every scheduler) and each connection, with its own seeded
RNG, sends a small line, awaits the echo, waits a random interval (uniform in
[0.4, 0.6] timeouts) and sends again. A fraction (``SILENT_FRACTION``) falls silent at a
random moment of the run, so the server must close it after the idle timeout. At the
end each active connection hangs up right after its next echo.

Figures per scheduler (see :func:`run`): requests/s and per-request round-trip latency
seen by the client; server CPU time per request (its process CPU time over the requests
it answered, connection set-up and teardown included); idle closes fired against those
expected, with their lateness on the server's loop clock; early closes (must be 0).
"""
from __future__ import annotations

import asyncio
import json
import math
import random
import time
from typing import Any, Callable, Optional

from timerwheel_c.aio import WheelHandle, WheelScheduler
from .network_server import raise_fd_limit
from . import procs
from .run import command

__all__ = ["SILENT_FRACTION", "UNITS_PER_SCHEDULER", "overloaded", "run", "scheduler_names"]

SILENT_FRACTION = 0.2
CONNECT_CONCURRENCY = 200  # connects in flight at once: well under the listen backlog
MESSAGE = b"ping\n"
START_TIMEOUT_S = 30.0  # server start-up and each connect batch: a liveness bound only
DRAIN_GRACE_S = 2.0  # how long past the run a silent connection may take to be closed
UNITS_PER_SCHEDULER = 100  # progress units of one scheduler's run (percent)
# Each client socket takes an ephemeral port of 127.0.0.1 (Linux: ~28k by default).
MAX_CONNECTIONS = 20000


def _uvloop():
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop


def overloaded(*rows: dict) -> bool:
    """True when the server closed active connections (``unexpected_closes``) in any of ``rows``
    (a run's figures): it served fewer of them than asked, so its CPU per request compares with
    no other row, and a ratio of it would mislead."""
    return any(row.get("unexpected_closes") for row in rows)


def scheduler_names() -> list[str]:
    """The schedulers :func:`run` measures here, in order: uvloop ones only when it imports."""
    names = ["call_later", "WheelScheduler"]
    if _uvloop() is not None:
        names += ["uvloop call_later", "uvloop WheelScheduler"]
    return names


class _HangingUpClient(asyncio.Protocol):
    """What the clients of both loopback benchmarks share: hanging up on their own, and noting a loss.

    A subclass sets ``load`` (its ``closed(client)`` hears of each lost connection), ``transport``,
    ``timer`` (the handle of the next send, or None), ``closing`` and ``closed_at_s``.
    """

    load: Any
    transport: Any
    timer: Any
    closing: bool
    closed_at_s: Optional[float]

    def close(self) -> None:
        """Client-side hang-up: its close is not an idle close."""
        self.closing = True
        self.transport.close()

    def connection_lost(self, exc) -> None:
        self.closed_at_s = time.monotonic()
        if self.timer is not None:
            self.timer.cancel()
        self.load.closed(self)


class _Client(_HangingUpClient):
    """One connection's request loop: send, await the echo, sleep a random interval, repeat."""

    def __init__(self, load: "_Load", index: int) -> None:
        self.load = load
        rng = random.Random(load.seed * 1_000_003 + index)
        self.rng = rng
        self.silent = rng.random() < SILENT_FRACTION
        self.silent_after_ns = int(rng.uniform(0.0, load.silence_window_s) * 1e9)  # from the start
        self.transport: Any = None
        self.sent_ns = 0  # time.monotonic_ns() of the last send
        self.went_silent = False
        self.closed_at_s: Optional[float] = None
        self.closing = False  # we close it (end of run), so its close is not an idle close
        self.timer: Optional[WheelHandle] = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.send()

    def send(self) -> None:
        if self.closing:  # hung up while this send was armed
            return
        self.sent_ns = time.monotonic_ns()
        self.transport.write(MESSAGE)

    def data_received(self, data: bytes) -> None:
        load = self.load
        now_ns = time.monotonic_ns()
        if load.measuring:
            load.latency_us.append((now_ns - self.sent_ns) / 1000.0)
            load.replies += 1
        if self.closing:
            return
        if load.stopping:
            # Hang up right after an echo, when the server has just re-armed this
            # connection: a teardown burst must not read as idle closes.
            self.close()
            return
        if self.silent and load.started_ns and now_ns - load.started_ns >= self.silent_after_ns:
            self.went_silent = True
            return
        interval_s = self.rng.uniform(load.min_interval_s, load.max_interval_s)
        if self.timer is None:
            self.timer = load.timers.call_later(interval_s, self.send)
        else:
            self.timer.reschedule(interval_s)


class _Load:
    """The client side of one scheduler's run: all connections and what they observed."""

    def __init__(self, loop, port: int, connections: int, seconds: float, timeout_s: float,
                 seed: int, progress) -> None:
        self.loop = loop
        self.port = port
        self.connections = connections
        self.seconds = seconds
        self.timeout_s = timeout_s
        # Sends come 0.4 to 0.6 timeouts after the echo (10 requests/s per connection at
        # 200 ms): an active connection keeps 0.4 timeouts as margin against lag.
        self.min_interval_s = timeout_s * 0.4
        self.max_interval_s = timeout_s * 0.6
        # The client's own send timers: the same for every scheduler measured.
        self.timers = WheelScheduler(loop)
        # Silence starts early enough for its idle close to land inside the run.
        self.silence_window_s = max(0.0, seconds - 2 * timeout_s)
        self.seed = seed
        self.progress = progress
        self.clients: list[_Client] = []
        self.latency_us: list[float] = []
        self.replies = 0
        self.measuring = False
        self.stopping = False  # teardown: each active connection hangs up after its next echo
        self.started_ns = 0  # time.monotonic_ns() when the measured run began; 0 before
        self.open = 0
        self.all_closed = loop.create_future()
        self.units_reported = 0

    def closed(self, client: _Client) -> None:
        self.open -= 1
        if self.open == 0 and not self.all_closed.done():
            self.all_closed.set_result(None)

    def report(self, units: int) -> None:
        """Bring the progress reported for this run up to ``units`` (of UNITS_PER_SCHEDULER)."""
        if self.progress is not None and units > self.units_reported:
            self.progress(units - self.units_reported)
        self.units_reported = max(self.units_reported, units)

    def elapsed_s(self) -> float:
        return (time.monotonic_ns() - self.started_ns) / 1e9

    def report_elapsed(self) -> None:
        """The measured phase is 90% of a run's units; drain and teardown are the rest."""
        self.report(int(0.9 * UNITS_PER_SCHEDULER * min(1.0, self.elapsed_s() / self.seconds)))

    async def connect_all(self) -> None:
        loop = self.loop
        for first in range(0, self.connections, CONNECT_CONCURRENCY):
            batch = range(first, min(first + CONNECT_CONCURRENCY, self.connections))
            clients = [_Client(self, i) for i in batch]
            self.clients += clients
            self.open += len(clients)
            await asyncio.wait_for(asyncio.gather(*(
                loop.create_connection(lambda c=c: c, "127.0.0.1", self.port) for c in clients)),
                START_TIMEOUT_S)

    async def drive(self) -> float:
        """Run the load; returns the measured span in seconds (run plus drain)."""
        await self.connect_all()
        self.started_ns = time.monotonic_ns()
        self.measuring = True
        while self.elapsed_s() < self.seconds:
            await asyncio.sleep(0.05)
            self.report_elapsed()
        # Active connections keep talking while the silent ones' idle closes come due.
        drain_until_s = time.monotonic() + DRAIN_GRACE_S
        while time.monotonic() < drain_until_s and any(
                c.went_silent and c.closed_at_s is None for c in self.clients):
            await asyncio.sleep(0.01)
        measured_s = self.elapsed_s()
        self.measuring = False
        self.stopping = True
        for c in self.clients:
            if c.closed_at_s is None and c.went_silent:  # the server never closed it
                c.close()
        try:
            await asyncio.wait_for(asyncio.shield(self.all_closed), START_TIMEOUT_S)
        except asyncio.TimeoutError:
            for c in self.clients:
                if c.closed_at_s is None:
                    c.close()
            await asyncio.wait_for(self.all_closed, START_TIMEOUT_S)
        self.timers.close()
        self.report(UNITS_PER_SCHEDULER)
        return measured_s


def _client_figures(load: _Load, measured_s: float) -> dict:
    timeout_s = load.timeout_s
    silent = [c for c in load.clients if c.went_silent]
    lateness_ms = [(c.closed_at_s - c.sent_ns / 1e9 - timeout_s) * 1000.0
                   for c in silent if c.closed_at_s is not None and not c.closing]
    return {
        "requests_per_s": load.replies / measured_s,
        "latency_us": load.latency_us,
        "idle_closes_expected": len(silent),
        "client_idle_close_lateness_ms": lateness_ms,
        "client_early_closes": sum(1 for x in lateness_ms if x < 0),
        # an active connection the server closed: its gap outgrew the timeout (overload)
        "unexpected_closes": sum(1 for c in load.clients
                                 if not c.went_silent and not c.closing and c.closed_at_s is not None),
    }


def _run_one(server_args: list[str], connections: int, seconds: float, idle_timeout_ms: int,
             seed: int, progress) -> dict:
    cmd = command("bench.network_server", *server_args,
                  "--idle-timeout-ms", str(idle_timeout_ms), "--max-connections", str(connections))
    with procs.server(cmd, "benchmark server") as (server, port):
        uvloop = _uvloop()
        loop = uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()
        try:
            load = _Load(loop, port, connections, seconds, idle_timeout_ms / 1000.0, seed, progress)
            client_cpu0_s = time.process_time()
            measured_s = loop.run_until_complete(load.drive())
            client_cpu_s = time.process_time() - client_cpu0_s
        finally:
            loop.close()
        out, _ = server.communicate("STOP\n", timeout=START_TIMEOUT_S)
    stats = json.loads(out.strip().splitlines()[-1])
    figures = _client_figures(load, measured_s)
    return {
        "requests_per_s": figures.pop("requests_per_s"),
        "latency_us": figures.pop("latency_us"),
        "cpu_ns_per_request": stats["cpu_s"] * 1e9 / max(1, stats["requests"]),
        "idle_closes_expected": figures.pop("idle_closes_expected"),
        "idle_closes_fired": stats["idle_closes"],
        "idle_close_lateness_ms": stats["lateness_ms"],
        "early_closes": sum(1 for x in stats["lateness_ms"] if x < 0),
        **figures,
        "client_cpu_ns_per_request": client_cpu_s * 1e9 / max(1, stats["requests"]),
    }


_SERVER_ARGS = {
    "call_later": ["--scheduler", "call_later"],
    "WheelScheduler": ["--scheduler", "wheel"],
    "uvloop call_later": ["--scheduler", "call_later", "--uvloop"],
    "uvloop WheelScheduler": ["--scheduler", "wheel", "--uvloop"],
}


def run(connections: int = 2000, seconds: float = 5.0, idle_timeout_ms: int = 200,
        progress: Optional[Callable[[int], None]] = None, *, seed: int = 6) -> dict[str, dict]:
    """Run the loopback load once per scheduler and return the figures per scheduler name.

    Args:
        connections: concurrent loopback connections (each a socket in this process and
            one in the server; RLIMIT_NOFILE's soft limit is raised to fit).
        seconds: the measured run, in seconds, after all connections are open.
        idle_timeout_ms: the server's idle timeout, in ms.
        progress: None, or a callable given the number of progress units just completed;
            each scheduler's run is ``UNITS_PER_SCHEDULER`` (100) units, so the total is
            ``UNITS_PER_SCHEDULER * len(scheduler_names())``.
        seed: seeds every connection's RNG (silence, intervals).

    Returns:
        ``{name: figures}`` for each of :func:`scheduler_names`; figures are
        ``requests_per_s`` (float), ``latency_us`` (list of per-request round trips, µs),
        ``cpu_ns_per_request`` (server process CPU ns per answered request),
        ``idle_closes_expected`` / ``idle_closes_fired`` (int), ``idle_close_lateness_ms``
        (list, ms past the deadline on the server's loop clock), ``early_closes`` (int,
        closes before the deadline on the server's loop clock: must be 0), plus
        ``client_idle_close_lateness_ms`` / ``client_early_closes`` (the same in real
        time, seen by the client against its own send time: uvloop's clock is libuv's
        whole-ms loop time, trailing real time, so uvloop's call_later may close up to
        ~1 ms early here; WheelScheduler adds that lag as clock slack) and
        ``unexpected_closes`` (active connections the server closed: lag outgrew the
        timeout, a sign of overload) and ``client_cpu_ns_per_request`` (this process).

    Call it from synchronous code: the client runs its own event loop in this thread.

    Raises:
        TypeError / ValueError: a bad argument, or too few file descriptors allowed.
        RuntimeError: a server subprocess failed (the message carries its stderr tail),
            or an event loop is already running in this thread.
    """
    for name, value in (("connections", connections), ("idle_timeout_ms", idle_timeout_ms)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r}")
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value!r}")
    if connections > MAX_CONNECTIONS:
        raise ValueError(f"connections must be at most {MAX_CONNECTIONS} (ephemeral ports), "
                         f"got {connections!r}")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"seconds must be a number, got {seconds!r}")
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"seconds must be positive and finite, got {seconds!r}")
    raise_fd_limit(connections + 64)
    return {name: _run_one(_SERVER_ARGS[name], connections, seconds, idle_timeout_ms, seed, progress)
            for name in scheduler_names()}


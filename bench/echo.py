"""The timer-bound network benchmark: a lean length-prefixed echo with a deadline per request.

For each connection count, loop (default asyncio, uvloop when it imports) and timer kind, a
server subprocess (:mod:`bench.echo_server`) answers each request inside a
per-request deadline and re-arms the connection's idle timeout, with

- ``asyncio``: ``asyncio.timeout`` + ``TimerHandle.cancel()`` and ``loop.call_later``;
- ``WheelScheduler``: ``WheelScheduler.timeout`` + ``WheelHandle.reschedule``;
- ``KeyedTimers``: ``WheelScheduler.timeout`` + ``KeyedTimers.arm(connection id)``;

and the ``asyncio`` kind's code unchanged on timerwheel_c's ``EventLoop`` (loop ``EventLoop``),
whose own timers are on the wheel.

This process is the client (on uvloop when it imports, the same for every server): each
connection, with its own seeded RNG, sends a 16-byte request, awaits the echo and sends again
after a random pause, so the server sees about ``RATE_PER_S`` requests/s whatever the count. A
fraction (``SILENT_FRACTION``) sends one request and falls silent, so the server must close it
after the idle timeout (4 mean pauses).

Figures per run (see :func:`run`): the server's CPU time per request inside the measured window
(the protocol is lean, so timers are a visible share of it), requests/s, idle closes fired
against expected, and early closes: on the server's loop clock (must be 0) and in real time
seen by the client (uvloop's clock trails real time by up to 1-2 ms; asyncio's timers there
may close that early, WheelScheduler adds the lag as clock slack).
"""
from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from typing import Callable, Optional

from .goals import Goal
from .network import _HangingUpClient, _uvloop, overloaded
from .network_server import raise_fd_limit
from . import procs
from .run import command

__all__ = ["CPU_TARGET", "EVENT_LOOP_CPU_TARGET", "RATE_PER_S", "SILENT_FRACTION", "format_table", "loops", "goals",
           "pairs", "reference_loop", "run", "timer_kinds"]

RATE_PER_S = 6000          # requests/s the clients offer, in total
CPU_TARGET = 0.85          # WheelScheduler's server CPU per request, at most this times asyncio's
EVENT_LOOP_CPU_TARGET = 0.7  # EventLoop's, unchanged code, at most this times the default loop's at 10k
SILENT_FRACTION = 0.05
PAYLOAD = bytes(range(16))
FRAME = len(PAYLOAD).to_bytes(4, "big") + PAYLOAD
CONNECT_CONCURRENCY = 200
START_TIMEOUT_S = 60.0     # server start-up and each connect batch: a liveness bound only
WARMUP_S = 0.3
DRAIN_GRACE_S = 3.0        # how long past the idle timeout a silent connection may stay open
_KINDS = {"asyncio": "asyncio", "WheelScheduler": "wheel", "KeyedTimers": "keyed"}


def timer_kinds() -> list[str]:
    """The server's timer kinds, in table order (asyncio's only where asyncio.timeout exists)."""
    return [k for k in _KINDS if k != "asyncio" or hasattr(asyncio, "timeout")]


def loops() -> list[str]:
    """The server loops measured: ``asyncio``, and ``uvloop`` when it imports."""
    return ["asyncio"] + (["uvloop"] if _uvloop() is not None else [])


def pairs() -> list[tuple[str, str]]:
    """The (loop, timer kind) pairs measured, in table order: every kind on each of
    :func:`loops`, then the ``asyncio`` kind's unchanged code on ``EventLoop``."""
    out = [(loop_name, kind) for loop_name in loops() for kind in timer_kinds()]
    return out + ([("EventLoop", "asyncio")] if "asyncio" in timer_kinds() else [])


def reference_loop(loop_name: str) -> str:
    """The loop whose ``asyncio`` row a row's CPU is compared with: EventLoop's is the default loop's."""
    return "asyncio" if loop_name == "EventLoop" else loop_name


class _Client(_HangingUpClient):
    """One connection: request, echo, random pause, again; or one request and silence."""

    def __init__(self, load: "_Load", index: int) -> None:
        self.load = load
        self.rng = random.Random(load.seed * 1_000_003 + index)
        self.silent = self.rng.random() < SILENT_FRACTION
        self.received = 0
        self.sent_s = 0.0
        self.closed_at_s: Optional[float] = None
        self.closing = False
        self.timer = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        # Spread the first requests over one mean pause.
        self.timer = self.load.loop.call_later(self.rng.uniform(0, self.load.pause_s), self.send)

    def send(self) -> None:
        self.timer = None
        if self.load.stopping:
            self.close()
            return
        self.sent_s = time.monotonic()
        self.transport.write(FRAME)

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        while self.received >= len(FRAME):
            self.received -= len(FRAME)
            self.load.replies += 1
            if not self.silent and not self.load.stopping:
                pause_s = self.load.pause_s
                self.timer = self.load.loop.call_later(self.rng.uniform(0.5 * pause_s, 1.5 * pause_s), self.send)


class _Load:
    def __init__(self, loop, connections: int, idle_s: float, seed: int) -> None:
        self.loop = loop
        self.connections = connections
        self.pause_s = connections / RATE_PER_S
        self.idle_s = idle_s
        self.seed = seed
        self.clients: list[_Client] = []
        self.replies = 0
        self.stopping = False
        self.open = 0

    def closed(self, client: _Client) -> None:
        self.open -= 1

    async def connect_all(self, port: int) -> None:
        for first in range(0, self.connections, CONNECT_CONCURRENCY):
            batch = [_Client(self, i) for i in range(first, min(first + CONNECT_CONCURRENCY, self.connections))]
            self.clients += batch
            self.open += len(batch)
            await asyncio.wait_for(asyncio.gather(*(
                self.loop.create_connection(lambda c=c: c, "127.0.0.1", port) for c in batch)), START_TIMEOUT_S)

    async def drive(self, port: int, seconds: float, mark: Callable[[], None]) -> float:
        """Connect, mark the window, run ``seconds`` and until the silent ones are closed."""
        await self.connect_all(port)
        await asyncio.sleep(WARMUP_S)
        mark()
        started = time.monotonic()
        replies0 = self.replies
        deadline = started + max(seconds, self.pause_s + self.idle_s + DRAIN_GRACE_S)
        while time.monotonic() < started + seconds or (
                time.monotonic() < deadline and any(c.silent and c.closed_at_s is None for c in self.clients)):
            await asyncio.sleep(0.05)
        elapsed = time.monotonic() - started
        self.requests_per_s = (self.replies - replies0) / elapsed
        return elapsed

    async def hang_up(self) -> None:
        self.stopping = True
        for c in self.clients:
            if c.closed_at_s is None and not c.closing:
                c.close()
        end = time.monotonic() + START_TIMEOUT_S
        while self.open > 0 and time.monotonic() < end:
            await asyncio.sleep(0.01)


def _run_one(kind: str, loop_name: str, connections: int, seconds: float, seed: int) -> dict:
    idle_s = max(0.2, 4 * connections / RATE_PER_S)
    cmd = command("bench.echo_server", "--timers", _KINDS[kind],
                  "--idle-timeout-ms", str(round(idle_s * 1000)), "--max-connections", str(connections))
    if loop_name == "uvloop":
        cmd.append("--uvloop")
    elif loop_name == "EventLoop":
        cmd.append("--event-loop")
    with procs.server(cmd, "echo server") as (server, port):
        uvloop = _uvloop()
        loop = uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()
        try:
            load = _Load(loop, connections, idle_s, seed)

            def mark() -> None:
                assert server.stdin is not None
                server.stdin.write("MARK\n")
                server.stdin.flush()

            loop.run_until_complete(load.drive(port, seconds, mark))
            out, _ = server.communicate("STOP\n", timeout=START_TIMEOUT_S)
            loop.run_until_complete(load.hang_up())
        finally:
            loop.close()
    stats = json.loads(out.strip().splitlines()[-1])
    silent = [c for c in load.clients if c.silent]
    real_lateness_ms = [(c.closed_at_s - c.sent_s - idle_s) * 1000.0
                        for c in silent if c.closed_at_s is not None and not c.closing]
    return {
        "cpu_ns_per_request": stats["cpu_s"] * 1e9 / max(1, stats["requests"]),
        "requests": stats["requests"],
        "requests_per_s": load.requests_per_s,
        "idle_closes_expected": len(silent),
        "idle_closes_fired": stats["idle_closes"],
        "early_closes": sum(1 for x in stats["lateness_ms"] if x < 0),
        "client_early_closes": sum(1 for x in real_lateness_ms if x < 0),
        "unexpected_closes": sum(1 for c in load.clients
                                 if not c.silent and not c.closing and c.closed_at_s is not None),
    }


def run(connection_counts=(1000, 10000), seconds: float = 3.0, repeats: int = 3,
        progress: Optional[Callable[[int], None]] = None, *, seed: int = 6) -> list[dict]:
    """Run every (connections, loop, timer kind) ``repeats`` times, interleaved; returns rows.

    Args:
        connection_counts: loopback connections per run (RLIMIT_NOFILE is raised to fit).
        seconds: the least measured window per run, in seconds (it also waits for the
            silent connections' idle closes).
        repeats: runs per row; the CPU figure is their median, with min and max.
        progress: None, or called with 1 after each run (``len(rows) * repeats`` in all).
        seed: seeds every connection's RNG.

    Returns:
        One dict per row: ``connections``, ``loop``, ``timers``, ``cpu_ns_per_request``
        (median of the runs), ``cpu_ns_min``/``cpu_ns_max``, ``requests_per_s`` (median),
        ``idle_closes_expected``/``idle_closes_fired``/``early_closes``/``client_early_closes``/
        ``unexpected_closes`` (summed over the runs: early must be 0 on the loop clock).

    Raises:
        ValueError: a bad argument, or too few file descriptors allowed.
        RuntimeError: a server subprocess failed (its stderr tail in the message).
    """
    if repeats < 1 or seconds <= 0 or not connection_counts:
        raise ValueError(f"need repeats >= 1, seconds > 0 and connection counts, got "
                         f"{repeats!r}, {seconds!r}, {connection_counts!r}")
    raise_fd_limit(max(connection_counts) + 64)
    keys = [(n, loop_name, kind) for n in connection_counts for loop_name, kind in pairs()]
    runs: dict[tuple, list[dict]] = {key: [] for key in keys}
    for _ in range(repeats):  # interleaved: a burst of load from elsewhere hits every row alike
        for key in keys:
            runs[key].append(_run_one(key[2], key[1], key[0], seconds, seed))
            if progress is not None:
                progress(1)
    rows = []
    for (n, loop_name, kind), results in runs.items():
        cpu = [r["cpu_ns_per_request"] for r in results]
        rows.append({
            "connections": n, "loop": loop_name, "timers": kind,
            "cpu_ns_per_request": statistics.median(cpu), "cpu_ns_min": min(cpu), "cpu_ns_max": max(cpu),
            "requests_per_s": statistics.median(r["requests_per_s"] for r in results),
            **{field: sum(r[field] for r in results) for field in (
                "idle_closes_expected", "idle_closes_fired", "early_closes", "client_early_closes",
                "unexpected_closes")},
        })
    return rows


def format_table(rows: list[dict]) -> str:
    """The rows of :func:`run` as a plain-text table, CPU as a ratio to asyncio's timers on the
    same loop and connection count."""
    base = {(r["connections"], r["loop"]): r for r in rows if r["timers"] == "asyncio"}
    head = (f"{'conns':>6} {'loop':<8} {'timers':<15} {'CPU ns/req':>10} {'min-max':>13} {'vs asyncio':>10} "
            f"{'req/s':>7} {'idle fired/exp':>14} {'early loop/real':>15} {'overload':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        ref = base.get((r["connections"], reference_loop(r["loop"])))
        ratio = ("-" if ref is None or not ref["cpu_ns_per_request"] else "overload" if overloaded(r, ref)
                 else f"{r['cpu_ns_per_request'] / ref['cpu_ns_per_request']:.2f}x")
        lines.append(
            f"{r['connections']:>6} {r['loop']:<8} {r['timers']:<15} {r['cpu_ns_per_request']:>10.0f} "
            f"{r['cpu_ns_min']:>6.0f}-{r['cpu_ns_max']:<6.0f} {ratio:>10} {r['requests_per_s']:>7.0f} "
            f"{r['idle_closes_fired']:>6}/{r['idle_closes_expected']:<7} "
            f"{r['early_closes']:>7}/{r['client_early_closes']:<7} {r['unexpected_closes']:>8}")
    return "\n".join(lines)


def _cpu_ratio(row: dict, ref: Optional[dict]) -> Optional[float]:
    """``row``'s CPU per request over ``ref``'s; None when there is no reference, or when either row's
    server closed active connections (:func:`~.network.overloaded`): such a row measured less work."""
    if ref is None or not ref["cpu_ns_per_request"] or overloaded(row, ref):
        return None
    return row["cpu_ns_per_request"] / ref["cpu_ns_per_request"]


def goals(figures: dict) -> list[tuple[Goal, Optional[float]]]:
    """WheelScheduler's and KeyedTimers' server CPU per request at most ``CPU_TARGET`` times
    asyncio's timers' on the default loop, per connection count; EventLoop's (asyncio's timer
    code unchanged) at most ``EVENT_LOOP_CPU_TARGET`` times the default loop's at 10,000."""
    rows = figures["results"]
    base = {r["connections"]: r for r in rows if r["loop"] == "asyncio" and r["timers"] == "asyncio"}
    return [
        (Goal("echo", f"{r['timers']} / asyncio timers, CPU per request, {r['connections']:,} connections",
              CPU_TARGET, at_most=True),
         _cpu_ratio(r, base.get(r["connections"])))
        for r in rows if r["loop"] == "asyncio" and r["timers"] != "asyncio"
    ] + [
        (Goal("echo", f"EventLoop / asyncio loop, unchanged code, CPU per request, {r['connections']:,} connections",
              EVENT_LOOP_CPU_TARGET, at_most=True),
         _cpu_ratio(r, base.get(r["connections"])))
        for r in rows if r["loop"] == "EventLoop" and r["connections"] >= 10_000
    ]

"""The server side of the timer-bound echo benchmark (:mod:`bench.echo`).

Run as a subprocess, one per (loop, timers) pair::

    python bench/run.py -m bench.echo_server --timers asyncio|wheel|keyed [--uvloop|--event-loop] \
        --idle-timeout-ms 2000

A lean protocol, so that the timers are a visible share of the CPU per request: each request
is a 4-byte big-endian length and that many bytes, echoed back as is. Each connection has a
task that serves its requests one by one; per request it

- answers inside a per-request deadline: ``async with asyncio.timeout(...)`` or
  ``async with WheelScheduler.timeout(...)``, and
- re-arms the connection's idle timeout: ``TimerHandle.cancel()`` + ``loop.call_later``,
  ``WheelHandle.reschedule``, or ``KeyedTimers.arm(connection id, ...)``.

A connection idle for the timeout is closed; the close is stamped on the loop clock against
the connection's last request (negative lateness would be an early close).

Protocol with the parent, on stdin/stdout: ``READY <port>`` once listening on 127.0.0.1; a
``MARK`` line starts the measured window (CPU time and request count restart); a ``STOP`` line
(or EOF) ends it and prints one JSON line::

    {"requests": int, "cpu_s": float, "idle_closes": int, "lateness_ms": [float, ...]}

``cpu_s`` is the process CPU time (user + system, seconds) inside the window; ``requests`` the
requests answered inside it; ``lateness_ms`` every idle close of the run.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
from typing import Any, Callable, Optional

from timerwheel_c.aio import KeyedTimers, WheelScheduler
from .network_server import BACKLOG, measured_window, raise_fd_limit, run_server

HEADER_BYTES = 4
DEADLINE_S = 1.0  # the per-request deadline: never reached, its arming is what is measured
TIMERS = ("asyncio", "wheel", "keyed")


class _Server:
    """The listening side: timers, counters and the open connections by id."""

    def __init__(self, loop, timers: str, idle_s: float) -> None:
        self.loop = loop
        self.timers = timers
        self.idle_s = idle_s
        self.scheduler: Optional[WheelScheduler] = None
        self.keys: Optional[KeyedTimers] = None
        self.timeout: Any = getattr(asyncio, "timeout", None)
        if timers != "asyncio":
            self.scheduler = WheelScheduler(loop)
            self.timeout = self.scheduler.timeout
            if timers == "keyed":
                self.keys = self.scheduler.keyed(self.on_idle_key)
        self.connections: dict[int, _Connection] = {}
        self.ids = itertools.count()
        self.requests = 0
        self.lateness_ms: list[float] = []

    def on_idle_key(self, key: int) -> None:
        self.connections[key].on_idle()


class _Connection(asyncio.Protocol):
    """One client: the protocol buffers frames, a task answers them in order."""

    def __init__(self, server: _Server) -> None:
        self.server = server
        self.id = next(server.ids)
        self.buffer = bytearray()
        self.waiter: Optional[asyncio.Future] = None
        self.closed = False
        self.idle: Any = None  # a TimerHandle or WheelHandle; None with keyed timers
        self.last_s = 0.0

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.server.connections[self.id] = self
        self.rearm_idle()
        self.task = self.server.loop.create_task(self.serve())

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def connection_lost(self, exc) -> None:
        self.closed = True
        server = self.server
        del server.connections[self.id]
        if server.keys is not None:
            server.keys.cancel(self.id)
        else:
            self.idle.cancel()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def rearm_idle(self) -> None:
        server = self.server
        self.last_s = server.loop.time()
        if server.keys is not None:
            server.keys.arm(self.id, server.idle_s)
        elif server.scheduler is not None:
            if self.idle is None:
                self.idle = server.scheduler.call_later(server.idle_s, self.on_idle)
            else:
                self.idle.reschedule(server.idle_s)
        else:
            if self.idle is not None:
                self.idle.cancel()
            self.idle = server.loop.call_later(server.idle_s, self.on_idle)

    def on_idle(self) -> None:
        server = self.server
        # Rounded to the ns: sums of float seconds must not read as an early close.
        server.lateness_ms.append(round((server.loop.time() - self.last_s - server.idle_s) * 1000.0, 6))
        self.transport.close()

    def next_frame(self):
        buffer = self.buffer
        if len(buffer) < HEADER_BYTES:
            return None
        end = HEADER_BYTES + int.from_bytes(buffer[:HEADER_BYTES], "big")
        if len(buffer) < end:
            return None
        frame = bytes(buffer[:end])
        del buffer[:end]
        return frame

    async def serve(self) -> None:
        server = self.server
        while not self.closed:
            frame = self.next_frame()
            if frame is None:
                self.waiter = server.loop.create_future()
                await self.waiter
                continue
            async with server.timeout(DEADLINE_S):
                self.transport.write(frame)
            server.requests += 1
            self.rearm_idle()


async def _serve(timers: str, idle_s: float) -> dict:
    loop = asyncio.get_running_loop()
    server = _Server(loop, timers, idle_s)
    listener = await loop.create_server(lambda: _Connection(server), "127.0.0.1", 0, backlog=BACKLOG)
    requests, cpu_s = await measured_window(listener.sockets[0].getsockname()[1], lambda: server.requests)
    listener.close()
    if server.scheduler is not None:
        server.scheduler.close()
    return {"requests": requests, "cpu_s": cpu_s,
            "idle_closes": len(server.lateness_ms), "lateness_ms": server.lateness_ms}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timers", choices=TIMERS, required=True)
    parser.add_argument("--uvloop", action="store_true")
    parser.add_argument("--event-loop", action="store_true", help="timerwheel_c.aio.EventLoop")
    parser.add_argument("--idle-timeout-ms", type=int, required=True)
    parser.add_argument("--max-connections", type=int, default=10000)
    args = parser.parse_args(argv)
    if args.timers == "asyncio" and not hasattr(asyncio, "timeout"):
        parser.error("--timers asyncio needs asyncio.timeout (Python 3.11+)")
    raise_fd_limit(args.max_connections + 64)
    factory: Optional[Callable[[], asyncio.AbstractEventLoop]] = None
    if args.event_loop:
        from timerwheel_c.aio import new_event_loop

        factory = new_event_loop
    return run_server(_serve(args.timers, args.idle_timeout_ms / 1000.0), args.uvloop, factory)


if __name__ == "__main__":
    sys.exit(main())

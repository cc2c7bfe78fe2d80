"""The server side of the loopback load benchmark (:mod:`bench.network`).

Run as a subprocess, one per scheduler::

    python bench/run.py -m bench.network_server --scheduler call_later|wheel [--uvloop] \
        --idle-timeout-ms 200

It is the line-echo idle-timeout server of ``examples/idle_timeout_server.py`` (each line
is a message, echoed; the connection's idle timeout is re-armed per message: cancel +
``loop.call_later`` or ``WheelHandle.reschedule``), instrumented: it counts requests,
stamps each idle close's lateness on the loop clock, and measures its own CPU time.

Protocol with the parent: it prints ``READY <port>`` once listening on 127.0.0.1; it
stops when a line (or EOF) arrives on stdin, then prints one JSON line::

    {"requests": int, "cpu_s": float, "idle_closes": int, "lateness_ms": [float, ...]}

``cpu_s`` is the process CPU time (user + system, seconds) from READY to the stop line;
``lateness_ms`` holds, per idle close, loop time at the close minus (loop time of the
connection's last message + the timeout), in ms rounded to the ns: negative would be an
early close.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from typing import Callable

from timerwheel_c.aio import WheelScheduler

BACKLOG = 4096


def raise_fd_limit(needed: int) -> None:
    """Raise the soft RLIMIT_NOFILE towards the hard limit so ``needed`` sockets fit.

    Raises:
        ValueError: the hard limit is below ``needed``.
    """
    try:
        import resource
    except ImportError:  # Windows: no per-process descriptor limit to raise
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise ValueError(f"{needed} file descriptors needed, but RLIMIT_NOFILE's hard limit is {hard}")
    if soft != resource.RLIM_INFINITY and soft < needed:
        new_soft = hard if hard != resource.RLIM_INFINITY else needed
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, hard))
        except (ValueError, OSError) as exc:
            raise ValueError(f"{needed} file descriptors needed; raising RLIMIT_NOFILE from "
                             f"{soft} failed: {exc}") from exc


class _Stats:
    __slots__ = ("requests", "lateness_ms")

    def __init__(self) -> None:
        self.requests = 0
        self.lateness_ms: list[float] = []


class _Connection(asyncio.Protocol):
    """Echo each line; close after ``idle_timeout_s`` without one. Stamps the deadline."""

    __slots__ = ("_loop", "_scheduler", "_timeout_s", "_stats", "_transport", "_idle", "_deadline_s")

    def __init__(self, loop, scheduler: WheelScheduler | None, timeout_s: float, stats: _Stats) -> None:
        self._loop = loop
        self._scheduler = scheduler
        self._timeout_s = timeout_s
        self._stats = stats

    def connection_made(self, transport) -> None:
        self._transport = transport
        self._deadline_s = self._loop.time() + self._timeout_s
        timers = self._loop if self._scheduler is None else self._scheduler
        self._idle = timers.call_later(self._timeout_s, self._on_idle)

    def data_received(self, data: bytes) -> None:
        # The client sends whole lines and awaits each echo, so a chunk is whole lines.
        lines = data.count(b"\n")
        if not lines:
            return
        self._stats.requests += lines
        self._transport.write(data)
        self._deadline_s = self._loop.time() + self._timeout_s
        if self._scheduler is not None:
            self._idle.reschedule(self._timeout_s)
        else:
            self._idle.cancel()
            self._idle = self._loop.call_later(self._timeout_s, self._on_idle)

    def connection_lost(self, exc) -> None:
        self._idle.cancel()

    def _on_idle(self) -> None:
        # Rounded to the ns: both stamps are sums of float seconds, whose noise (~1e-13 s on
        # uvloop's whole-ms clock) must not read as an early close.
        self._stats.lateness_ms.append(round((self._loop.time() - self._deadline_s) * 1000.0, 6))
        self._transport.close()


async def _serve(scheduler_name: str, timeout_s: float) -> dict:
    loop = asyncio.get_running_loop()
    stats = _Stats()
    scheduler = WheelScheduler(loop) if scheduler_name == "wheel" else None
    server = await loop.create_server(lambda: _Connection(loop, scheduler, timeout_s, stats),
                                      "127.0.0.1", 0, backlog=BACKLOG)
    stop = loop.create_future()
    # A thread, not loop.connect_read_pipe: the same code on every loop and platform.
    threading.Thread(target=lambda: (sys.stdin.readline(), loop.call_soon_threadsafe(
        lambda: None if stop.done() else stop.set_result(None))), daemon=True).start()
    cpu0_s = time.process_time()
    print(f"READY {server.sockets[0].getsockname()[1]}", flush=True)
    await stop
    cpu_s = time.process_time() - cpu0_s
    server.close()
    if scheduler is not None:
        scheduler.close()
    return {"requests": stats.requests, "cpu_s": cpu_s, "idle_closes": len(stats.lateness_ms),
            "lateness_ms": stats.lateness_ms}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheduler", choices=["call_later", "wheel"], required=True)
    parser.add_argument("--uvloop", action="store_true")
    parser.add_argument("--idle-timeout-ms", type=int, required=True)
    parser.add_argument("--max-connections", type=int, default=10000)
    args = parser.parse_args(argv)
    raise_fd_limit(args.max_connections + 64)
    return run_server(_serve(args.scheduler, args.idle_timeout_ms / 1000.0), args.uvloop)


async def measured_window(port: int, requests: Callable[[], int]) -> tuple[int, float]:
    """Print ``READY <port>``, then follow the parent's stdin: a ``MARK`` line restarts the measured
    window, a ``STOP`` line (or EOF) ends it. ``requests()`` is the server's running request count.

    Returns ``(requests, cpu_s)`` inside the window: requests answered and process CPU time
    (user + system, seconds).
    """
    loop = asyncio.get_running_loop()
    commands: asyncio.Queue = asyncio.Queue()

    def read_stdin() -> None:
        for line in iter(sys.stdin.readline, ""):
            loop.call_soon_threadsafe(commands.put_nowait, line.strip())
        loop.call_soon_threadsafe(commands.put_nowait, "STOP")

    # A thread, not loop.connect_read_pipe: the same code on every loop and platform.
    threading.Thread(target=read_stdin, daemon=True).start()
    print(f"READY {port}", flush=True)
    cpu0_s, requests0 = time.process_time(), 0
    while (command := await commands.get()) != "STOP":
        if command == "MARK":
            cpu0_s, requests0 = time.process_time(), requests()
    cpu_s = time.process_time() - cpu0_s
    return requests() - requests0, cpu_s


def run_server(serve, use_uvloop: bool, loop_factory=None) -> int:
    """Run the coroutine ``serve`` on a new loop (``loop_factory()``'s if given, else uvloop's if
    ``use_uvloop``) and print its result as the one JSON line the parent reads; returns the exit
    status (0)."""
    loop: asyncio.AbstractEventLoop
    if loop_factory is not None:
        loop = loop_factory()
    elif use_uvloop:
        import uvloop
        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    try:
        result = loop.run_until_complete(serve)
    finally:
        loop.close()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

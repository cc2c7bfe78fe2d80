"""The server side of the aiohttp benchmark (:mod:`bench.http`).

Run as a subprocess, one per event loop::

    python bench/run.py -m bench.http_server --loop asyncio|EventLoop|uvloop

A real aiohttp application, its code the same on every loop: each request is answered inside
a per-request timeout (``asyncio.timeout``, or ``asyncio.wait_for`` before Python 3.11), and
aiohttp keeps each connection alive with its own keep-alive timer, re-armed after every
response (``loop.call_at``). So every request arms and cancels timers the loop owns.

Protocol with the parent, on stdin/stdout: ``READY <port>`` once listening on 127.0.0.1; a
``MARK`` line starts the measured window; a ``STOP`` line (or EOF) ends it and prints one JSON
line ``{"requests": int, "cpu_s": float}``: requests answered and process CPU time (user +
system, seconds) inside the window.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Callable, Optional

from .network_server import BACKLOG, measured_window, run_server

LOOPS = ("asyncio", "EventLoop", "uvloop")
REQUEST_TIMEOUT_S = 5.0   # never reached: its arming is what is measured
KEEPALIVE_S = 75.0        # aiohttp's default keep-alive timeout, re-armed per response


async def _serve() -> dict:
    from aiohttp import web

    counts = {"requests": 0}
    body = b"ok"

    async def reply() -> web.Response:
        return web.Response(body=body)

    async def handle(request: web.Request) -> web.Response:
        counts["requests"] += 1
        timeout = getattr(asyncio, "timeout", None)
        if timeout is None:
            return await asyncio.wait_for(reply(), REQUEST_TIMEOUT_S)
        async with timeout(REQUEST_TIMEOUT_S):
            return await reply()

    app = web.Application()
    app.router.add_get("/", handle)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=KEEPALIVE_S)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=BACKLOG)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    requests, cpu_s = await measured_window(port, lambda: counts["requests"])
    await runner.cleanup()
    return {"requests": requests, "cpu_s": cpu_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=LOOPS, required=True)
    args = parser.parse_args(argv)
    factory: Optional[Callable[[], asyncio.AbstractEventLoop]] = None
    if args.loop == "EventLoop":
        from timerwheel_c.aio import new_event_loop

        factory = new_event_loop
    return run_server(_serve(), args.loop == "uvloop", factory)


if __name__ == "__main__":
    sys.exit(main())

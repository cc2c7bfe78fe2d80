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
import json
import sys
import threading
import time

LOOPS = ("asyncio", "EventLoop", "uvloop")
REQUEST_TIMEOUT_S = 5.0   # never reached: its arming is what is measured
KEEPALIVE_S = 75.0        # aiohttp's default keep-alive timeout, re-armed per response


async def _serve() -> dict:
    from aiohttp import web

    loop = asyncio.get_running_loop()
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
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    commands: asyncio.Queue = asyncio.Queue()

    def read_stdin() -> None:
        for line in iter(sys.stdin.readline, ""):
            loop.call_soon_threadsafe(commands.put_nowait, line.strip())
        loop.call_soon_threadsafe(commands.put_nowait, "STOP")

    threading.Thread(target=read_stdin, daemon=True).start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"READY {port}", flush=True)
    cpu0_s, requests0 = time.process_time(), 0
    while (command := await commands.get()) != "STOP":
        if command == "MARK":
            cpu0_s, requests0 = time.process_time(), counts["requests"]
    cpu_s = time.process_time() - cpu0_s
    requests = counts["requests"] - requests0
    await runner.cleanup()
    return {"requests": requests, "cpu_s": cpu_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=LOOPS, required=True)
    args = parser.parse_args(argv)
    loop: asyncio.AbstractEventLoop
    if args.loop == "uvloop":
        import uvloop

        loop = uvloop.new_event_loop()
    elif args.loop == "EventLoop":
        from timerwheel_c.aio import new_event_loop

        loop = new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    try:
        result = loop.run_until_complete(_serve())
    finally:
        loop.close()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

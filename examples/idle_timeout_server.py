"""A line-echo TCP server that closes each connection once it has been idle for a timeout.

Each complete line a client sends is a message: the server echoes it back and resets
that connection's idle timeout. A connection that sends no complete line for
``--idle-timeout`` seconds is closed by the server (a partial line does not count, so a
slow trickle of bytes cannot hold a connection open). A line longer than
``MAX_LINE_BYTES`` (64 KiB, newline excluded) closes the connection at once, so a client
cannot grow the server's partial-line buffer without bound until its idle timeout.

The idle timeout is the per-connection timer a networking server keeps; the flag
``--scheduler`` picks who keeps it:

- ``call_later``: asyncio's timer heap, re-armed the usual way on every message
  (``handle.cancel()`` then ``loop.call_later(...)``: a new heap entry each time);
- ``wheel``: :class:`timerwheel_c.aio.WheelScheduler`, re-armed in place with
  ``handle.reschedule(...)`` (O(1) in the wheel; the loop holds a single wake-up);
- ``keyed`` (the default): one :class:`timerwheel_c.aio.KeyedTimers` for the whole server,
  keyed by connection id and re-armed with ``keys.arm(conn_id, ...)``: no timer object per
  connection at all.

Run::

    python examples/idle_timeout_server.py --port 8765 --idle-timeout 5 --scheduler keyed [--uvloop]
    # then, e.g.:  nc 127.0.0.1 8765   (type lines; stop typing for 5 s and it hangs up)

It prints ``listening on HOST:PORT`` once ready (``--port 0`` picks a free port). SIGINT
(Ctrl-C) and SIGTERM (``kill``, a service manager) both stop it the same way: it closes the
listening socket and every connection, prints ``stopped on SIGINT`` or ``stopped on SIGTERM``
and exits 0.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import signal
import sys

from timerwheel_c.aio import KeyedTimers, WheelScheduler

MAX_LINE_BYTES = 64 * 1024  # longest line accepted, in bytes (newline excluded)


class IdleTimeoutProtocol(asyncio.Protocol):
    """One connection: echo each line, close after ``idle_timeout_s`` (seconds) without one,
    or at once on a line over ``MAX_LINE_BYTES``.

    ``scheduler`` is a WheelScheduler, or None for plain ``loop.call_later``; ``open_transports``
    is the server's set of open connections, which this one joins while it is open. With
    ``keys`` (the server's KeyedTimers, ``scheduler`` then unused) the idle timeout is the key
    of this connection's id, whose callback finds the connection in ``by_id``.
    """

    _ids = itertools.count()

    def __init__(self, loop: asyncio.AbstractEventLoop, scheduler: WheelScheduler | None,
                 idle_timeout_s: float, open_transports: set, keys: KeyedTimers | None = None,
                 by_id: dict[int, IdleTimeoutProtocol] | None = None) -> None:
        self._loop = loop
        self._open_transports = open_transports
        self._scheduler = scheduler
        self._idle_timeout_s = idle_timeout_s
        self._keys = keys
        self._by_id = by_id
        self._id = next(self._ids)
        self._transport: asyncio.Transport | None = None
        self._idle = None  # the idle-timeout handle (asyncio TimerHandle or WheelHandle)
        self._partial = b""

    def connection_made(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._open_transports.add(transport)
        if self._keys is not None:
            self._by_id[self._id] = self
            self._keys.arm(self._id, self._idle_timeout_s)
            return
        timers = self._loop if self._scheduler is None else self._scheduler
        self._idle = timers.call_later(self._idle_timeout_s, self._on_idle)

    def data_received(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        if len(self._partial) > MAX_LINE_BYTES or any(len(line) > MAX_LINE_BYTES for line in lines):
            self._partial = b""
            self._transport.close()
            return
        if not lines:
            return
        self._transport.write(b"".join(line + b"\n" for line in lines))
        if self._keys is not None:
            self._keys.arm(self._id, self._idle_timeout_s)
        elif self._scheduler is not None:
            self._idle.reschedule(self._idle_timeout_s)
        else:
            self._idle.cancel()
            self._idle = self._loop.call_later(self._idle_timeout_s, self._on_idle)

    def connection_lost(self, exc: Exception | None) -> None:
        self._open_transports.discard(self._transport)
        if self._keys is not None:
            self._keys.cancel(self._id)
            self._by_id.pop(self._id, None)
        else:
            self._idle.cancel()

    def _on_idle(self) -> None:
        self._transport.close()


async def serve(host: str, port: int, idle_timeout_s: float, scheduler_name: str) -> str:
    """Serve until SIGINT or SIGTERM; prints ``listening on HOST:PORT`` (flushed) once bound.

    Returns the name of the signal that stopped it, after closing every connection.
    """
    loop = asyncio.get_running_loop()
    stopped_by: asyncio.Future = loop.create_future()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # SIGTERM's default action kills the process on the spot; a loop handler stops both
        # signals alike, at a point where the loop can close its sockets.
        try:
            loop.add_signal_handler(sig, lambda name=sig.name: stopped_by.done() or stopped_by.set_result(name))
        except NotImplementedError:  # Windows event loops: Ctrl-C raises KeyboardInterrupt (see main)
            break
    scheduler = WheelScheduler(loop) if scheduler_name in ("wheel", "keyed") else None
    open_transports: set = set()
    by_id: dict[int, IdleTimeoutProtocol] = {}
    keys = scheduler.keyed(lambda conn_id: by_id[conn_id]._on_idle()) if scheduler_name == "keyed" else None
    server = await loop.create_server(
        lambda: IdleTimeoutProtocol(loop, scheduler, idle_timeout_s, open_transports, keys, by_id), host, port)
    bound_host, bound_port = server.sockets[0].getsockname()[:2]
    print(f"listening on {bound_host}:{bound_port}", flush=True)
    try:
        return await stopped_by
    finally:
        server.close()
        # Server.wait_closed() waits for open connections (Python 3.12+): close them first.
        for transport in list(open_transports):
            transport.close()
        await server.wait_closed()
        if scheduler is not None:
            scheduler.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="TCP port (0: any free port)")
    parser.add_argument("--idle-timeout", type=float, default=5.0, metavar="SECONDS",
                        help="close a connection idle this long (seconds, default 5)")
    parser.add_argument("--scheduler", choices=["call_later", "wheel", "keyed"], default="keyed",
                        help="who keeps the idle timeouts (default: keyed)")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop")
    args = parser.parse_args(argv)
    if not 0 < args.idle_timeout < math.inf:  # NaN fails both comparisons
        parser.error(f"--idle-timeout must be a positive, finite number of seconds, got {args.idle_timeout}")
    if args.uvloop:
        import uvloop
        new_loop = uvloop.new_event_loop
    else:
        new_loop = asyncio.new_event_loop
    loop = new_loop()
    try:
        signal_name = loop.run_until_complete(serve(args.host, args.port, args.idle_timeout, args.scheduler))
    except KeyboardInterrupt:  # Ctrl-C where the loop has no signal handlers (Windows, or before serve set them)
        signal_name = "SIGINT"
    finally:
        loop.close()
    print(f"stopped on {signal_name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

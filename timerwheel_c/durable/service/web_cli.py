"""``timerwheel-c web``: serve the live status page of a store, on a machine that runs no runner.

    timerwheel-c web [--store URL] [--port PORT] [--host HOST] [--web-actions]

The page shows the fleet, each partition's owner,
due backlog, oldest due time and parked timers, a search of the pending timers and the
schedules. A runner serves the same page at ``/`` of ``timerwheel-c run --metrics-port``, with
fired/s and lateness drawn from its own counters, which this command has none of.

``--host`` is 127.0.0.1 (loopback) by default. ``--web-actions`` turns on the buttons that
change state (requeue, fire now, cancel, pause, resume); on a host other than loopback they
also need the token in ``$TIMERWHEEL_C_WEB_TOKEN`` (at least 16 characters besides spaces), which the operator types on the page.
The store URL, and its password, never appear on the page.

The command never creates a store, with or without ``--web-actions``: it runs no DDL, and a
database (or SQLite path) without one is refused ("no timerwheel_c store here").

Exit status: 0 after SIGINT/SIGTERM; 2, with one line on stderr, on a bad argument, an address
that cannot be bound, or a store that cannot be opened.
"""
from __future__ import annotations

import argparse
import logging
import sys

from ..._helptext import terminal_text
from ..storage.redact import redact
from .cli import _port, actions_allowed, make_page, store_url
from .logs import log_to_stderr

log = logging.getLogger("timerwheel_c.durable")

DEFAULT_PORT = 8080


def add_parser(sub) -> None:
    """Register the ``web`` subcommand on an argparse subparsers object."""
    p = sub.add_parser("web", help="serve the live status page of a store", description=terminal_text(__doc__),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", default=None, metavar="URL",
                   help="sqlite:///PATH or postgresql://USER@HOST/DB (a password is masked in every message); "
                        "default: $TIMERWHEEL_C_STORE")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT, metavar="PORT",
                   help=f"the port (0: any free one; default {DEFAULT_PORT})")
    p.add_argument("--host", default="127.0.0.1", metavar="HOST", help="the address (default 127.0.0.1, loopback only)")
    p.add_argument("--web-actions", action="store_true",
                   help="allow the page to requeue, fire now, cancel, pause and resume; off loopback, "
                        "a POST needs the token in $TIMERWHEEL_C_WEB_TOKEN")
    p.set_defaults(func=main)


def main(args) -> int:
    """Serve the page until SIGINT/SIGTERM; 0 then, 2 on a bad argument (one line on stderr)."""
    from .process import StopSignals
    from .web import serve_page

    try:
        url = store_url(args.store, "web")
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    log_to_stderr("INFO", url)
    if not actions_allowed("web", args.host, args.web_actions):
        return 2
    page = make_page("web", url, args.host, args.web_actions)
    if page is None:
        return 2
    try:
        server = serve_page(page, args.port, args.host)
    except OSError as exc:
        page.close()
        print(f"timerwheel-c web: --port {args.port} on {args.host!r}: {exc}", file=sys.stderr)
        return 2
    with StopSignals() as stop:
        log.info("serving the status page of %s on http://%s:%d/ (actions %s)", redact(url), server.host, server.port,
                 "on" if args.web_actions else "off")
        received = None
        while received is None:
            received = stop.wait(1.0)
        log.info("received %s; stopping", received.name)
    server.close()
    page.close()
    return 0

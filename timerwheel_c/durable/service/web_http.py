"""The HTTP server of the status page and of ``/metrics``: a :class:`ThreadingHTTPServer` on a daemon
thread (:class:`WebServer`) whose handler (:class:`PageHandler`) answers a few fixed GET routes and
hands every other request to a page object. Standard library only, so that the exporter and the
page share it without importing each other.
"""
from __future__ import annotations

import ipaddress
import logging
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict

__all__ = ["PageHandler", "WebServer", "bind", "host_only", "is_loopback"]

log = logging.getLogger("timerwheel_c.durable.web")

_MAX_BODY = 64 * 1024  # bytes of a POST read at most: a form is a few hundred


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) reaches this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_only(host_header: str) -> str:
    """The host of a Host header, without its port (``[::1]:8080`` -> ``::1``)."""
    if host_header.startswith("["):
        return host_header[1:].split("]", 1)[0]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


class _Server(ThreadingHTTPServer):
    """A :class:`ThreadingHTTPServer` on an IPv6 socket for an IPv6 address (``::1``, ``::``), which
    an IPv4 one cannot bind, that stays quiet when a client goes away mid-answer."""

    daemon_threads = True

    def __init__(self, address: tuple, handler: type):
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        # Bound to loopback: answer only to a loopback Host name, so that a page elsewhere that
        # rebinds its own name to 127.0.0.1 (DNS rebinding) cannot read it from a browser.
        self.loopback = is_loopback(address[0])
        super().__init__(address, handler)

    def handle_error(self, request, client_address) -> None:
        # A closed tab, a scraper's timeout: no fault of the server's, where socketserver would print
        # a traceback on stderr for each (a flood when clients drop connections).
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        log.warning("the HTTP server failed answering %s", client_address[0], exc_info=True)


def bind(host: str, port: int, handler: type = BaseHTTPRequestHandler) -> ThreadingHTTPServer:
    """A server of ``handler`` bound to ``host:port``, not yet serving.

    Raises:
        OSError: the address cannot be bound (e.g. the port is taken).
    """
    return _Server((host, port), handler)


class PageHandler(BaseHTTPRequestHandler):
    """Serves ``page`` (a :class:`~.web.StatusPage`, or None: 404 with ``not_found``) and ``routes`` (path -> a callable
    returning ``(status, content type, body)``, for GETs) on a :class:`ThreadingHTTPServer`."""

    page = None
    routes: Dict[str, Callable[[], tuple]] = {}
    # Seconds a connection may sit between reads (socketserver's socket timeout): a request that
    # promises a longer body than it sends must not hold a server thread for ever.
    timeout = 30.0
    not_found = b"not found\n"

    _head = False

    def do_GET(self):  # noqa: N802 -- http.server's name
        route = self.routes.get(self.path.split("?", 1)[0])
        if route is not None:
            if getattr(self.server, "loopback", False) and not is_loopback(host_only(self.headers.get("Host") or "")):
                self._send(421, {"Content-Type": "text/plain; charset=utf-8"},
                           b"this server answers to its loopback address only\n")
                return
            code, ctype, body = route()
            self._send(code, {"Content-Type": ctype}, body)
        else:
            self._page("GET", b"")

    def do_HEAD(self):  # noqa: N802 -- a probe or a load balancer may check with HEAD: GET's answer, no body
        self._head = True
        self.do_GET()

    def do_POST(self):  # noqa: N802
        try:
            length = min(int(self.headers.get("Content-Length", "0")), _MAX_BODY)
        except ValueError:
            length = 0
        self._page("POST", self.rfile.read(max(length, 0)))

    def _page(self, method: str, body: bytes) -> None:
        if self.page is None:
            self._send(404, {"Content-Type": "text/plain; charset=utf-8"}, self.not_found)
            return
        self._send(*self.page.respond(method, self.path, self.headers.get("Host"), body))

    def _send(self, code: int, headers: dict, body: bytes) -> None:
        self.send_response(code)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not self._head:
            self.wfile.write(body)

    def log_message(self, format, *args):  # noqa: A002 -- a refreshing page would flood stderr
        pass


# How often (s) the serving thread looks for a close(), which waits for that look: socketserver's
# default, 0.5 s, held every service's stop() and every CLI command that serves a page that long.
CLOSE_POLL_S = 0.05


class WebServer:
    """An HTTP server on a daemon thread: ``host``, ``port`` (the bound one, for port 0), ``close()``."""

    def __init__(self, handler: type, port: int, host: str, name: str):
        self._httpd = bind(host, port, handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": CLOSE_POLL_S},
                                        name=name, daemon=True)
        self._thread.start()
        self.host, self.port = self._httpd.server_address[:2]

    def close(self) -> None:
        """Stop serving and close the socket."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

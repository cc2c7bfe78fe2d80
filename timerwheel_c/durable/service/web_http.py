"""The HTTP server of the status page and of ``/metrics``: a :class:`ThreadingHTTPServer` on a daemon
thread (:class:`WebServer`) whose handler (:class:`PageHandler`) answers a few fixed GET routes and
hands every other request to a page object. Standard library only, so that the exporter and the
page share it without importing each other.
"""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict

__all__ = ["PageHandler", "WebServer"]

_MAX_BODY = 64 * 1024  # bytes of a POST read at most: a form is a few hundred


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


class WebServer:
    """An HTTP server on a daemon thread: ``host``, ``port`` (the bound one, for port 0), ``close()``."""

    def __init__(self, handler: type, port: int, host: str, name: str):
        self._httpd = ThreadingHTTPServer((host, port), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=name, daemon=True)
        self._thread.start()
        self.host, self.port = self._httpd.server_address[:2]

    def close(self) -> None:
        """Stop serving and close the socket."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

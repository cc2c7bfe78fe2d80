"""Opening a store from a URL, and keeping the URL's password out of every output.

A store URL is ``sqlite:///PATH`` (as in SQLAlchemy: three slashes, then the path, so
an absolute path gives four; ``sqlite:///:memory:`` for an in-memory database), or
``postgresql://...`` / ``postgres://...`` (a libpq URL or connection string; needs
psycopg 3, the ``postgres`` extra).

A PostgreSQL URL may carry a password (``postgresql://user:PASSWORD@host/db``, or
``password=PASSWORD`` in the query or in a keyword/value connection string, see the
PostgreSQL docs, "Connection Strings"). :func:`redact` is the one path by which a URL,
or any text that may quote one, reaches a log line, an exception message, a ``repr``,
or the bench's printed and JSON output; :class:`RedactingFormatter` applies it to log
records.
"""
from __future__ import annotations

import logging
import re
from urllib.parse import parse_qsl, unquote, urlsplit

from .store import Store

__all__ = ["RedactingFormatter", "log_to_stderr", "open_store", "redact"]

MASK = "***"
# scheme://user:PASSWORD@host: the password runs to the last "@" of the authority. It may hold
# whitespace (a mistyped URL is still printed back in an error): masking too much is harmless,
# stopping at a space would print the rest of the password.
_URL_PASSWORD = re.compile(r"(?P<keep>\b[A-Za-z][A-Za-z0-9+.-]*://[^:@/\s]*:)[^/]*(?=@)")
# password=PASSWORD or sslpassword=PASSWORD (libpq's client-key passphrase), in a URL query or a
# keyword/value string (quoted with '...' there).
_KEYWORD_PASSWORD = re.compile(r"(?P<keep>\b(?:ssl)?password\s*=\s*)(?:'(?:[^'\\]|\\.)*'|[^\s&'\"]*)",
                               re.IGNORECASE)


def _passwords(url: str) -> set[str]:
    """The password(s) ``url`` carries, raw and percent-decoded, to mask wherever they appear verbatim."""
    found: set[str] = set()
    try:
        parts = urlsplit(url)
        if parts.password:
            found |= {parts.password, unquote(parts.password)}
        found |= {v for k, v in parse_qsl(parts.query, keep_blank_values=False)
                  if k.lower() in ("password", "sslpassword")}
    except ValueError:  # not a URL (a keyword/value string, or a malformed one): the regexes still apply
        pass
    for match in _KEYWORD_PASSWORD.finditer(url):
        value = match.group(0)[len(match.group("keep")):]
        if value.startswith("'") and value.endswith("'") and len(value) >= 2:
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        found |= {value, unquote(value)}
    return {p for p in found if p}


def redact(text: str, *urls: str | None) -> str:
    """``text`` with every password replaced by ``***``.

    Masks the password of any URL or ``password=`` parameter that ``text`` quotes, and,
    wherever it appears verbatim (for example inside a driver's error message), the
    password of each of ``urls`` (the store URLs ``text`` may have come from; None is
    skipped). ``redact(url)`` is the URL fit to print.
    """
    secrets: set[str] = set()
    for url in urls:
        if url:
            secrets |= _passwords(url)
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, MASK)
    text = _URL_PASSWORD.sub(rf"\g<keep>{MASK}", text)
    return _KEYWORD_PASSWORD.sub(rf"\g<keep>{MASK}", text)


class RedactingFormatter(logging.Formatter):
    """A logging formatter whose output (message, arguments and traceback) has passed through
    :func:`redact` against ``urls``.

    A formatter, not a filter: a filter would have to rewrite the shared ``LogRecord``, which
    every later handler (a test's capture, an application's own handler) then sees mangled.
    ``timerwheel-c run`` and the bench set it on their stderr handler.
    """

    def __init__(self, fmt: str | None = None, *urls: str | None) -> None:
        super().__init__(fmt)
        self._urls = urls

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record), *self._urls)


def log_to_stderr(level: int | str, *urls: str | None) -> None:
    """Log to stderr at ``level`` (``logging.basicConfig``), every line passed through :func:`redact`
    against ``urls``: how the command-line entry points that take a store URL or DSN set up logging."""
    logging.basicConfig(level=level)
    formatter = RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s", *urls)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)

_SQLITE = "sqlite:///"


def open_store(url: str) -> Store:
    """Open the store named by ``url``.

    Raises:
        TypeError: ``url`` is not a str.
        ValueError: an unsupported scheme or an empty path, naming the URL (password masked).
        ImportError: a postgresql:// URL without psycopg installed; the message gives the
            install command, ``pip install 'timerwheel_c[postgres]'``.
        sqlite3.Error / psycopg.Error: the database cannot be opened.
    """
    if not isinstance(url, str):
        raise TypeError(f"store URL must be a str, got {type(url).__name__}")
    if url.startswith(_SQLITE):
        path = url[len(_SQLITE):]
        if not path:
            raise ValueError(f"store URL {redact(url)!r} has no path (use sqlite:///relative.db or sqlite:////abs/path.db)")
        from .sqlite import SQLiteStore

        return SQLiteStore(path)
    if url.startswith(("postgresql://", "postgres://")):
        try:
            from .postgres import PostgresStore
        except ModuleNotFoundError as exc:
            if exc.name != "psycopg":
                raise
            raise ModuleNotFoundError(
                "a postgresql:// store needs psycopg 3, which is not installed: "
                "pip install 'timerwheel_c[postgres]'", name="psycopg") from exc
        return PostgresStore(url)
    raise ValueError(f"unsupported store URL {redact(url)!r}: expected sqlite:///PATH or postgresql://...")

"""Logging set-up for the command-line entry points: every line passes through :func:`redact`."""
from __future__ import annotations

import logging

from ..storage.redact import redact

__all__ = ["RedactingFormatter", "log_to_stderr"]


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

"""Text from elsewhere made safe for one line of a log or a terminal.

A handler's exception, a store's error, a partition's name: applications and drivers write them, and
any of them may hold a newline (which would start a forged log line, with a level and a logger name
of its choosing) or a terminal's escape sequence (which would drive the operator's terminal).
:func:`printable` writes each such character as its Python escape, as ``repr`` does; every log line
of the durable layer that quotes such text passes it through here, a traceback's own lines included
(:func:`traceback_text`).
"""
from __future__ import annotations

import logging
import traceback

from .redact import redact

__all__ = ["log_traceback", "printable", "traceback_text"]


def printable(text: str) -> str:
    """``text`` with each character that is not printable (a newline, a tab, the ESC of a terminal
    escape sequence) written as its Python escape (``\\n``, ``\\x1b``): names and errors come from
    applications, and must neither break a table's rows or a log's lines nor drive the operator's terminal."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def traceback_text(error: BaseException) -> str:
    """The traceback of ``error`` as :func:`traceback.format_exception` gives it (its causes and
    contexts included), with no trailing newline, its passwords masked (:func:`.redact.redact`) and each
    exception's own line (its type and message, a note) :func:`printable`: only the traceback's own
    structure breaks lines."""
    top = traceback.TracebackException.from_exception(error)
    own: set = set()
    chain = [top]
    while chain:
        te = chain.pop()
        own.update(te.format_exception_only())
        chain.extend(t for t in (te.__cause__, te.__context__) if t is not None)
    text = "".join(printable(chunk[:-1]) + "\n" if chunk in own and chunk.endswith("\n") else chunk
                   for chunk in top.format())
    return redact(text.rstrip("\n"))


def log_traceback(log: logging.Logger, level: int, error: BaseException, msg: str, *args: object) -> None:
    """Log ``msg % args`` on ``log`` at ``level`` with ``error`` as the record's ``exc_info`` and
    :func:`traceback_text` as its ``exc_text``: what every ``logging.Formatter`` prints instead of
    formatting ``exc_info`` itself. A handler's exception may quote a database URL or hold a newline and
    a forged log line; whatever formatter the application's handlers use, none prints either."""
    if not log.isEnabledFor(level):
        return
    fn, lno, func, _ = log.findCaller(stacklevel=2)
    record = log.makeRecord(log.name, level, fn, lno, msg, args, (type(error), error, error.__traceback__), func)
    record.exc_text = traceback_text(error)
    log.handle(record)

"""What the operator commands print: aligned tables, times in local ISO form and UTC, durations in
words, and timer references (opaque bytes) as text where they are text.

Plain text from the standard library, so that the commands need nothing beyond the core install.
"""
from __future__ import annotations

import datetime as dt
import shlex
from typing import Optional

from ..storage.printable import printable
from ..storage.redact import redact

__all__ = ["in_words", "local_iso", "printable", "reference_text", "shell_word", "table", "utc_iso"]

_UNITS = ((86_400_000, "d"), (3_600_000, "h"), (60_000, "min"), (1_000, "s"))


def table(rows: list, columns: list) -> str:
    """``rows`` (dicts) as a table of ``columns`` (keys; headings are the keys upper-cased, ``_``
    as a space), each cell :func:`printable`, each column padded to its widest cell, trailing blanks
    stripped."""
    cells = [[c.upper().replace("_", " ") for c in columns]] + [[printable(str(r[c])) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in cells)


def shell_word(text: str) -> str:
    """``text`` as one word of a POSIX shell command an operator may paste: :func:`shlex.quote`'s
    form, or, where ``text`` holds a character that is not printable (which ``shlex.quote`` would
    print raw: a newline breaks the line, an ESC drives the terminal), bash's ``$'...'`` form with
    that character escaped (``\n``, ``\x1b``, ``\u2028``), which bash, zsh and ksh read back as ``text``."""
    if text.isprintable():
        return shlex.quote(text)
    return "$'" + "".join(_ansi_c(c) for c in text) + "'"


def _ansi_c(c: str) -> str:
    """One character of a ``$'...'`` word."""
    if c in "\\'":
        return "\\" + c
    if c.isprintable():
        return c
    code = ord(c)
    return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(c) or (
        f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")


def local_iso(ms: Optional[int], zone: Optional[dt.tzinfo] = None) -> str:
    """Unix epoch ``ms`` as ISO 8601 in ``zone`` (default: the machine's local zone), to the second
    (``2026-12-01T18:46:30+01:00``); ``-`` for None or a time outside ``datetime``'s range."""
    if ms is None:
        return "-"
    try:
        return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).astimezone(zone).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):  # beyond year 9999: keys allow due times up to 2**64-1 ms
        return "-"


def utc_iso(ms: int) -> Optional[str]:
    """Unix epoch ``ms`` as ISO 8601 in UTC, to the ms (``2026-12-01T17:46:30.123Z``), for scripts;
    None for a time outside ``datetime``'s range."""
    try:
        return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat(timespec="milliseconds")[:-6] + "Z"
    except (OverflowError, OSError, ValueError):
        return None


def in_words(ms: Optional[int], now_ms: int) -> str:
    """How far Unix epoch ``ms`` is from ``now_ms``, in words, to its two largest units:
    ``in 3 min``, ``2 h 5 min ago``, ``now`` within a second; ``-`` for None."""
    if ms is None:
        return "-"
    left = abs(ms - now_ms)
    if left < 1000:
        return "now"
    parts = []
    for size, unit in _UNITS:
        if left >= size:
            parts.append(f"{left // size} {unit}")
            left %= size
        elif parts:
            break
        if len(parts) == 2:
            break
    said = " ".join(parts)
    return f"in {said}" if ms > now_ms else f"{said} ago"


def reference_text(reference: bytes) -> Optional[str]:
    """``reference`` decoded as UTF-8 when it is printable text, else None (show its hex)."""
    try:
        text = reference.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if text.isprintable() else None


def first_line(exc: BaseException, url: Optional[str]) -> str:
    """The first line of ``exc``'s message (its type's name when empty), the password of ``url``
    masked: what a command prints of a store error (a driver's message may run to several lines)."""
    return redact((str(exc).strip().splitlines() or [type(exc).__name__])[0], url)

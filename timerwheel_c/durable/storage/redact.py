"""Keeping a store URL's password out of every output.

A PostgreSQL URL may carry a password (``postgresql://user:PASSWORD@host/db``, or
``password=PASSWORD`` in the query or in a keyword/value connection string, see the
PostgreSQL docs, "Connection Strings"). :func:`redact` is the one path by which a URL,
or any text that may quote one, reaches a log line, an exception message, a ``repr``,
or the bench's printed and JSON output.
"""
from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = ["redact"]

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

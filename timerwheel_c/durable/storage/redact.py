"""Keeping a store URL's password out of every output.

A PostgreSQL URL may carry a password (``postgresql://user:PASSWORD@host/db``, or
``password=PASSWORD`` in the query or in a keyword/value connection string, see the
PostgreSQL docs, "Connection Strings"), or leave it to a file it names (``service=NAME``,
``passfile=PATH``) or to the environment (``PGPASSWORD``, ``PGPASSFILE`` or ``~/.pgpass``,
``PGSERVICE``): of those a store remembers the one libpq connected with, see :func:`remember`. :func:`redact`
is the one path by which a URL, or any text that may quote one, reaches a log line, an
exception message, a ``repr``, or the bench's printed and JSON output.

A password is masked in two ways. Where a URL or a ``password=`` parameter quotes it, by its
place, whatever it is, a malformed URL's too (``USER:PASSWORD@HOST`` behind any prefix:
``postgresql:/u:pw@h``, ``postgresql//u:pw@h``, ``u:pw@h``). Anywhere else (a driver's message quoting it bare, a handler's error,
percent-encoded or inside a longer word alike), when it has at least :data:`MIN_VERBATIM`
characters and is no part of what its own URL names in the open (user, host, port, database), and
not a part of a URL's scheme name: masking a short or public one there would rewrite unrelated text ("1"
in "127.0.0.1", "postgres" in "postgresql://postgres@"), and where the mask fell would give the
password away, as Airflow found (apache/airflow#48791, its ``min_length_masked_secret``).
"""
from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = ["MIN_VERBATIM", "redact", "remember"]

MASK = "***"
#: The fewest characters of a password masked wherever it appears verbatim (see the module docstring).
MIN_VERBATIM = 5
# A URL's scheme name: a password found as a part of one ("postgres" in "postgresql://") is left
# there, where masking it would say what the password is; one that is the whole name is masked.
_SCHEME_NAME = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*(?=://)")
# scheme://user:PASSWORD@host: the password runs to the last "@" of the authority. It may hold
# whitespace (a mistyped URL is still printed back in an error): masking too much is harmless,
# stopping at a space would print the rest of the password.
# A "/" the password holds unencoded ends the authority for a URL parser, but it is still the
# password the user typed: then the mask runs to the last "@" before whitespace.
_URL_PASSWORD = re.compile(r"(?P<keep>\b[A-Za-z][A-Za-z0-9+.-]*://[^:@/\s]*:)(?:[^/]*(?=@)|\S*(?=@))")
# A mask already in place, as a value that ends there: a message with ``password=***`` quoted by a repr
# and redacted again keeps it as it is; read as a bare value, it took the repr's closing quote (and
# what followed it) into the mask.
_MASKED = r"\*\*\*(?=['\"]?(?:[\s:,;)&#]|$))"
# password=PASSWORD or sslpassword=PASSWORD (libpq's client-key passphrase). In a URL's query (after
# "?" or "&") the value ends at the next "&" that starts a parameter: a "&" of the password should be
# percent-encoded there, and where it is not ("password=Xy7&kP2q", which libpq refuses, quoting
# "kP2q"), the pieces without "=" that follow are the rest of the password; in a keyword/value string libpq ends it only at whitespace ("password=a&b" is "a&b"), or
# it is quoted with '...' (an unclosed quote runs to the end, and so does the mask).
_QUERY_PASSWORD = re.compile(r"(?P<keep>(?<=[?&])(?:ssl)?password=)"
                             rf"(?:{_MASKED}|[^&#\s]*(?:&[^&=#\s]*(?=[&#\s]|$))*)", re.IGNORECASE)
_KEYWORD_PASSWORD = re.compile(r"(?P<keep>(?<![?&\w])(?:ssl)?password\s*=\s*)"
                               rf"(?:{_MASKED}|'(?:[^'\\]|\\.)*'?|\S*)", re.IGNORECASE)
# USER:PASSWORD@HOST in a word of text that is no well-formed URL (``postgresql:/u:pw@h``,
# ``postgresql//u:pw@h``, ``postgresql:u:pw@h``, ``u:pw@h``, behind any prefix): from the first ":"
# that no "/" follows (a scheme's "postgresql:/" is not the user's) to the word's last "@" (the password
# may hold "@", "/" and ":"; one with whitespace is masked where it appears verbatim, see _passwords). Where
# the scheme's colon is that one (``postgresql:u:pw@h``) the user is masked too: harmless, as masking too
# much always is.
_LOOSE_PASSWORD = re.compile(r"(?P<keep>(?<!\S)[^\s:@]*(?::/+[^\s:@]*)*:)(?!/)\S*(?=@[^\s@]*(?!\S))")
_LOOSE_WHOLE = re.compile(r"(?P<keep>^[^\s:@]*(?::/+[^\s:@]*)*:)(?!/).*(?=@[^\s@]*$)", re.DOTALL)
def _unquote_keyword(value: str) -> str:
    """A keyword/value string's value as libpq reads it: without its quotes and backslash escapes."""
    if value.startswith("'"):
        value = value[1:-1] if value.endswith("'") and len(value) >= 2 else value[1:]
        value = re.sub(r"\\(.)", r"\1", value)
    return value


def _passwords(url: str) -> frozenset:
    """The password(s) ``url`` carries, raw and percent-decoded, to mask wherever they appear
    verbatim. Not those of a file it names (``service=``, ``passfile=``): libpq takes one of them,
    which the store remembers once it connects (:func:`remember`); the file's others are no secret
    of the store's, and masking them would rewrite every text that names them."""
    found: set[str] = set()
    try:
        parts = urlsplit(url)
        if parts.password:
            found |= {parts.password, unquote(parts.password)}
            # An unencoded "@" in the password: libpq ends the password at the first "@" and reads
            # the rest as the host, which its errors quote back ("failed to resolve host 'TAIL@db'").
            head, *tails = parts.password.split("@")
            found |= {head, *("@".join(tails[i:]) + "@" for i in range(len(tails)) if "".join(tails[i:]))}
        found |= {v for k, v in parse_qsl(parts.query, keep_blank_values=False)
                  if k.lower() in ("password", "sslpassword")}
    except ValueError:  # not a URL (a keyword/value string, or a malformed one): the regexes still apply
        pass
    for match in _QUERY_PASSWORD.finditer(url):
        pieces = match.group(0)[len(match.group("keep")):]
        found |= {pieces, unquote(pieces), *pieces.split("&")}
    for match in _KEYWORD_PASSWORD.finditer(url):
        value = _unquote_keyword(match.group(0)[len(match.group("keep")):])
        found |= {value, unquote(value)}
    if "://" not in url:  # a malformed URL: the USER:PASSWORD@ of its words, or of the whole text (whitespace and all)
        for pattern in (_LOOSE_PASSWORD, _LOOSE_WHOLE):
            found |= {m.group(0)[len(m.group("keep")):] for m in pattern.finditer(url)}
    return frozenset(p for p in found if p)


_KEYWORD_PUBLIC = re.compile(r"(?<![\w])(?:user|host|hostaddr|port|dbname)\s*=\s*'?([^'\s&]+)", re.IGNORECASE)


def _public(url: str) -> frozenset:
    """The user, host, port and database ``url`` names (as a URL or in keyword/value form), printed
    as they are."""
    found = set(_KEYWORD_PUBLIC.findall(url))
    if _SCHEME_NAME.match(url):  # a keyword/value string is no URL: its whole text would read as a path
        try:
            parts = urlsplit(url)
            found |= {parts.username, parts.hostname, str(parts.port) if parts.port else None, parts.path.lstrip("/")}
        except ValueError:  # a malformed URL (a bad port): the keyword form above is what it names
            pass
    return frozenset(p for p in found if p)


def _verbatim(url: str, passwords: frozenset | set | None = None) -> set:
    """The passwords of ``url`` (:func:`_passwords`), or ``passwords`` given for it, to mask wherever
    they appear: those of at least :data:`MIN_VERBATIM` characters that are no part of what it names in
    the open (:func:`_public`), whose masking would only rewrite those names."""
    public = _public(url)
    found = _passwords(url) if passwords is None else passwords
    return {p for p in found if len(p) >= MIN_VERBATIM and not any(p in name for name in public)}


# The passwords of the stores opened in this process that are masked wherever they appear
# (remember(), _verbatim()): by every redact(), so that a store's own password a handler's
# exception quotes bare (a parked row's last error, a log line) is masked as well as one in a URL.
# Only ever grows; a set is updated atomically under the GIL.
_REMEMBERED: set[str] = set()


def remember(url: str | None, password: str | None = None) -> None:
    """Mask the passwords the PostgreSQL connection string ``url`` carries (as :func:`redact`'s
    ``urls``) in every later :func:`redact` of this process, wherever they appear verbatim. A store
    calls it on its URL, once.

    With ``password``, mask that one instead: the password libpq connected to ``url`` with
    (``conn.info.password``), however libpq was given it (the URL, a ``service=`` or ``passfile=`` it
    names, ``PGPASSWORD``, the line of the password file that matched the connection, ``PGSERVICE``'s
    section). Each new connection of a store passes it, so that a handler's error quoting it is masked;
    libpq's own choice, not a reading of the files here: libpq takes one line of a password file (its
    password ending at the first unescaped ":"), and the others' passwords, another host's or user's
    ("postgres", a local server's), are no secret of the store's, which masked would rewrite every
    text that names them."""
    if url:
        _REMEMBERED.update(_verbatim(url, None if password is None else {password}))


def redact(text: str, *urls: str | None) -> str:
    """``text`` with every password replaced by ``***``.

    Masks the password of any URL or ``password=`` parameter that ``text`` quotes (the whole
    value: in a keyword/value string up to the next whitespace, or its closing quote), of any
    ``USER:PASSWORD@`` of a word (a malformed URL), and,
    wherever it appears verbatim but as a part of a URL's scheme name (for example inside a driver's error
    message, or percent-encoded), each password of ``urls`` (the store URLs ``text`` may have come
    from; None is skipped) and of the stores opened in this process (:func:`remember`): the ones
    they carry and the ones libpq connected them with, of at least
    :data:`MIN_VERBATIM` characters and no part of the user, host, port or database their own URL
    names. ``redact(url)`` is the URL fit to print; a text redacted again is unchanged.
    """
    secrets: set[str] = set(_REMEMBERED)
    for url in urls:
        if url:
            secrets |= _verbatim(url)
    text = _URL_PASSWORD.sub(rf"\g<keep>{MASK}", text)
    text = _QUERY_PASSWORD.sub(rf"\g<keep>{MASK}", text)
    text = _KEYWORD_PASSWORD.sub(rf"\g<keep>{MASK}", text)
    text = _LOOSE_PASSWORD.sub(rf"\g<keep>{MASK}", text)
    if not secrets:
        return text
    schemes = [m.span() for m in _SCHEME_NAME.finditer(text)]

    def mask(found: re.Match) -> str:
        start, end = found.span()
        inside = any(a <= start and end <= b and end - start < b - a for a, b in schemes)
        return found.group(0) if inside else MASK

    return re.sub("|".join(re.escape(s) for s in sorted(secrets, key=len, reverse=True)), mask, text)

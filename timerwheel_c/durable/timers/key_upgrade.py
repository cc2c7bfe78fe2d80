"""The in-place upgrade of a store written before the reserved key space (schema version
:data:`KEY_SPACE_SCHEMA_VERSION`), run once by the store, under its schema lock, in the transaction
that records the version (:mod:`..storage.upgrades`), which finds :func:`upgraded_partition` by the
entry point that ``pyproject.toml`` declares for it: importing this module registers nothing.

Before it, the library's tags were one letter with no 0x00 in front (``b"T"``, not ``b"\\x00T"``;
:mod:`.keys`), in the key space that applications' rows use too. Every row of one partition is
judged alone, by its key and value, as one of the old layouts:

- a timer row (``"T"``), a parked row (``"P"``), a schedule's row (``"R" | name`` whose value is a
  schedule's state), a durable-sleep mark (``"S" | 16-byte timer id`` whose value is a mark's), a
  last error's or a trace context's row (``"I"`` or ``"J"`` then 0x00, with a value of their
  shape): it moves to the same key behind 0x00 (:data:`keys.RESERVED`), its value unchanged;
- an identity row (``"I"`` or ``"J"`` then a kind, whose value is the key of a timer of that name):
  it is dropped, and every timer gains its identity row anew, as below;
- anything else (``b"Ticket/42"``, ``b"Result/42"``, a quarantined ``"Q"`` row, which no layout
  tells apart from an application's, a timer whose reference is too long for the 0x00 to fit in
  front of its backed-off key): it stays where it is, as an application's row.

Names. A store written before names existed (schema version 5 and below) may hold several timers of
one name (partition, kind, reference). The one due last keeps the name (for a backed-off or parked
timer, its original due time; ties by key); each other one is renamed, its reference followed by
``b"#dup"`` and a number from 2 up that no timer of the partition uses yet, so that it is found,
listed, rescheduled and cancelled by that name and fires with that reference. A schedule's
occurrences are never renamed (their reference is the schedule's name): the one due last holds the
occurrence's identity. A reference too long for the suffix keeps no name: that timer still fires.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from . import keys
from .schedule_state import ScheduleState

__all__ = ["KEY_SPACE_SCHEMA_VERSION", "DUPLICATE_SUFFIX", "upgraded_partition"]

KEY_SPACE_SCHEMA_VERSION = 9
DUPLICATE_SUFFIX = b"#dup"
_MARK_KEY_BYTES = 1 + 16  # "S" | a TimerId's 16 bytes
_ERROR_HEAD = 8 + 4  # a last error's value: original due_at_ms u64, attempt u32, then the text
_TRACE_HEAD = 8  # a trace context's value: due_at_ms u64, then the traceparent


def _timer(new_key: bytes) -> Optional[keys.TimerKey]:
    """The parsed timer or parked row ``new_key`` (an old key behind 0x00), or None."""
    try:
        return keys.parse_parked(new_key) if keys.is_parked_key(new_key) else keys.parse(new_key)
    except keys.MalformedKey:
        return None


def _is_identity(key: bytes, value: bytes) -> bool:
    """True when ``key`` is an old identity row: its value an old timer's key of that name."""
    tk = _timer(keys.RESERVED + value) if value[:1] in (b"T", b"P") else None
    return tk is not None and keys.identity_of(tk) == keys.RESERVED + key


def _moves(key: bytes, value: bytes) -> bool:
    """True when the old row (``key``, ``value``) is one of the layouts that move as they are."""
    tag, rest = key[:1], key[1:]
    if tag in (b"T", b"P"):
        return _timer(keys.RESERVED + key) is not None
    if tag == b"R":
        try:
            rest.decode("utf-8")
            ScheduleState.from_bytes(value)
        except ValueError:
            return False
        return 0 < len(rest) <= keys.MAX_REFERENCE_BYTES
    if tag == b"S":
        return len(key) == _MARK_KEY_BYTES and (value == b"F" or (len(value) == 9 and value[:1] == b"P"))
    if tag in (b"I", b"J") and rest[:1] == b"\x00":
        if rest[1:2] == b"\x00":  # a trace context: "I" 0x00 0x00 kind reference
            return len(rest) > 2 and rest[2] != 0 and len(value) > _TRACE_HEAD
        return len(rest) > 1 and rest[1] != 0 and len(value) >= _ERROR_HEAD
    return False


def upgraded_partition(rows: dict) -> dict:
    """The rewrite of :data:`KEY_SPACE_SCHEMA_VERSION` (declared in :data:`~..storage.upgrades.GROUP`):
    one partition's rows ``{key: value}`` in the old layouts, as the module docstring says they move.

    Raises:
        ValueError: a moved row's new key is held by another row already (an application's row that
            began with 0x00), naming it: the upgrade then writes nothing.
    """
    out: dict = {}
    timers: dict = {}  # identity key -> [(original due ms, new key, parsed)]
    for key, value in rows.items():
        if key[:1] in (b"I", b"J") and _is_identity(key, value):
            continue
        if not _moves(key, value):
            out[key] = value
            continue
        new = keys.RESERVED + key
        if new in rows:
            raise ValueError(f"the row {key[:64]!r} cannot move to {new[:64]!r}: a row holds that key already")
        out[new] = value
        tk = _timer(new) if key[:1] in (b"T", b"P") else None
        if tk is not None:
            timers.setdefault(keys.identity_of(tk), []).append((tk.original_due_at_ms, new, tk))
    taken = set(timers)
    for identity, found in timers.items():
        found.sort()
        *others, (_, newest, _) = found
        out[identity] = newest
        for _, key, tk in others:
            renamed = None if tk.occurrence else _free_name(key, tk, taken)
            if renamed is not None:
                out[renamed[1]] = out.pop(key)
                out[renamed[0]] = renamed[1]
    return out


def _free_name(key: bytes, tk: keys.TimerKey, taken: set) -> Optional[tuple]:
    """``(identity key, row key)`` of the timer row ``key`` (parsed: ``tk``) renamed to the first free
    duplicate name (its identity then added to ``taken``), or None when its reference is too long for
    the suffix."""
    n = 2
    while True:
        reference = tk.reference + DUPLICATE_SUFFIX + b"%d" % n
        if len(reference) > keys.MAX_REFERENCE_BYTES:
            return None
        identity = keys.identity(tk.kind, reference)
        if identity not in taken:
            taken.add(identity)
            return identity, _key_of(key, dataclasses.replace(tk, reference=reference))
        n += 1


def _key_of(key: bytes, tk: keys.TimerKey) -> bytes:
    """The key of the row ``tk`` in the form of the row ``key``: parked, backed off or scheduled."""
    if keys.is_parked_key(key):
        return keys.parked(tk.due_at_ms, tk)
    if tk.attempt:
        return keys.backoff(tk.due_at_ms, tk.kind, tk.attempt, tk.original_due_at_ms, tk.reference)
    return keys.timer(tk.due_at_ms, tk.kind, tk.reference)


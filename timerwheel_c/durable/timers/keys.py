"""Encoding of durable timer rows as ordered store keys, and the :class:`TimerKind` they carry.

Every timer row lives in the *timer space* of a partition: keys that begin with the
tag byte ``b"T"`` (0x54). Two layouts share that space; both put the *effective* due
time (the time the runner should look at the row, Unix epoch ms) right after the tag,
so one scan of the timer space in key order visits plain and backed-off rows
together, in due order::

    scheduled:   "T" | due_at_ms u64 BE | kind u8 | 0x00 | reference
    backed off:  "T" | retry_at_ms u64 BE | kind u8 | 0x01 | attempt u32 BE
                     | original due_at_ms u64 BE | reference

- ``due_at_ms`` / ``retry_at_ms``: 0 .. 2**64-1, Unix epoch milliseconds.
- ``kind``: 1..255 (0 is never written; see :class:`TimerKind`).
- The variant byte (0x00 / 0x01) sits after the kind, not in the tag, because a tag per
  variant would split the space in two ranges and break the single due-order scan.
- ``attempt``: 1.. (a scheduled row is attempt 0); saturates at 2**32-1.
- ``reference``: opaque bytes chosen by the caller (may be empty); it makes keys unique
  among timers of one kind due at the same millisecond.

Keys are big-endian so that byte order equals numeric order. Anything in the timer
space that is not one of these layouts is *malformed*: :func:`parse` raises
:class:`MalformedKey` (a ValueError), never crashes, and the runner keeps such rows and
counts them.

Quarantine: a malformed row that comes due is moved once, guarded, to
:func:`quarantine` of its key, ``"Q" | original key`` (tag ``b"Q"``, 0x51, outside the
timer space), value unchanged. It is retained for inspection, but later scans of the
due range no longer see it, so malformed rows cannot use up a tick's ``max_scanned``
ahead of real timers. :data:`QUARANTINE_RANGE` covers every quarantined row.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from ..storage.store import MAX_KEY_BYTES

__all__ = [
    "MAX_ATTEMPT",
    "MAX_DUE_MS",
    "MAX_REFERENCE_BYTES",
    "TAG",
    "MalformedKey",
    "QUARANTINE_RANGE",
    "QUARANTINE_TAG",
    "TimerKey",
    "TimerKind",
    "backoff",
    "check_uint",
    "due_range",
    "well_formed_head",
    "future_range",
    "parse",
    "quarantine",
    "timer",
]

TAG = b"T"
_SCHEDULED = 0x00
_BACKED_OFF = 0x01
_HEAD = struct.Struct(">QBB")  # effective due ms, kind, variant
_RETRY = struct.Struct(">IQ")  # attempt, original due ms
# The longest reference whose backed-off key (the longest key form) still fits a store key.
MAX_REFERENCE_BYTES = MAX_KEY_BYTES - len(TAG) - _HEAD.size - _RETRY.size
MAX_DUE_MS = 2**64 - 1
MAX_ATTEMPT = 2**32 - 1
_END = b"U"  # the first key after the timer space: TAG + 1
QUARANTINE_TAG = b"Q"
QUARANTINE_RANGE = (QUARANTINE_TAG, b"R")  # (start, end) of the quarantine space: tag, tag + 1


class TimerKind:
    """A timer kind, 1..255. Kind 0 is invalid; 0xF0..0xFE are reserved for tests and
    0xFF for :mod:`timerwheel_c.durable.sleep`.

    Raises:
        TypeError: ``n`` is not an int.
        ValueError: ``n`` is outside 1..255.
    """

    __slots__ = ("_n",)

    def __init__(self, n: "int | TimerKind"):
        if isinstance(n, TimerKind):
            n = n.get()
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"a timer kind must be an int, got {type(n).__name__} {n!r}")
        if not 1 <= n <= 255:
            raise ValueError(f"a timer kind must be in 1..255 (0 is invalid), got {n}")
        self._n = n

    def get(self) -> int:
        """The kind number, 1..255."""
        return self._n

    def __eq__(self, other):
        return isinstance(other, TimerKind) and other._n == self._n

    def __hash__(self):
        return hash(self._n)

    def __repr__(self):
        return f"TimerKind({self._n})"


class MalformedKey(ValueError):
    """A key in the timer space that matches neither layout; ``.key`` holds the raw bytes."""

    def __init__(self, key: bytes, why: str):
        super().__init__(f"malformed timer key {key!r}: {why}")
        self.key = key


@dataclass(frozen=True)
class TimerKey:
    """A parsed timer key.

    ``due_at_ms`` is the row's effective due time (the retry time for a backed-off row),
    ``original_due_at_ms`` the time the timer was scheduled for; both Unix epoch ms.
    ``attempt`` is 0 for a scheduled row.
    """

    due_at_ms: int
    kind: int
    reference: bytes
    attempt: int
    original_due_at_ms: int


def check_uint(name: str, value: object, top: int) -> int:
    """Return ``value`` if it is an int (not a bool) in ``0..top``.

    Raises:
        TypeError: not an int, naming ``name`` and the value.
        ValueError: outside ``0..top``, naming ``name`` and the value.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not 0 <= value <= top:
        raise ValueError(f"{name} must be in 0..{top}, got {value!r}")
    return value


def _check_kind(kind: object) -> int:
    if isinstance(kind, TimerKind):
        kind = kind.get()
    elif isinstance(kind, bool) or not isinstance(kind, int):
        raise TypeError(f"kind must be a TimerKind or an int 1..255, got {type(kind).__name__} {kind!r}")
    check_uint("kind", kind, 255)
    if kind == 0:
        raise ValueError("kind 0 is invalid (kinds are 1..255)")
    return kind


def _check_reference(reference: object) -> bytes:
    if not isinstance(reference, bytes):
        raise TypeError(f"reference must be bytes, got {type(reference).__name__} {reference!r}")
    if len(reference) > MAX_REFERENCE_BYTES:
        raise ValueError(
            f"reference must be at most {MAX_REFERENCE_BYTES} bytes, got {len(reference)} bytes starting {reference[:16]!r}")
    return reference


def timer(due_at_ms: int, kind, reference: bytes) -> bytes:
    """Key of a scheduled timer row.

    Args:
        due_at_ms: due time, Unix epoch ms, 0..2**64-1.
        kind: 1..255, an int or a :class:`TimerKind`.
        reference: opaque bytes, at most :data:`MAX_REFERENCE_BYTES` (2,027).

    Raises:
        TypeError: a non-int time or kind, a non-bytes reference.
        ValueError: a time or kind out of range, kind 0, a reference too long.
    """
    head = _HEAD.pack(check_uint("due_at_ms", due_at_ms, MAX_DUE_MS), _check_kind(kind), _SCHEDULED)
    return TAG + head + _check_reference(reference)


def backoff(retry_at_ms: int, kind, attempt: int, original_due_at_ms: int, reference: bytes) -> bytes:
    """Key of a backed-off row: due again at ``retry_at_ms`` (Unix epoch ms), attempt ``attempt`` (1..2**32-1).

    Raises the same errors as :func:`timer`; ``attempt`` 0 is a ValueError (that is a scheduled row).
    """
    if check_uint("attempt", attempt, MAX_ATTEMPT) == 0:
        raise ValueError("attempt must be >= 1 for a backed-off row, got 0")
    head = _HEAD.pack(check_uint("retry_at_ms", retry_at_ms, MAX_DUE_MS), _check_kind(kind), _BACKED_OFF)
    tail = _RETRY.pack(attempt, check_uint("original_due_at_ms", original_due_at_ms, MAX_DUE_MS))
    return TAG + head + tail + _check_reference(reference)


def parse(key: bytes) -> TimerKey:
    """Parse a timer key of either layout.

    Raises:
        MalformedKey: wrong tag, too short, unknown variant byte, kind 0 or attempt 0.
    """
    if not isinstance(key, bytes):
        raise TypeError(f"key must be bytes, got {type(key).__name__}")
    if key[:1] != TAG:
        raise MalformedKey(key, "not in the timer space (tag is not b'T')")
    if len(key) < 1 + _HEAD.size:
        raise MalformedKey(key, f"{len(key)} bytes, shorter than the {1 + _HEAD.size}-byte header")
    due_at_ms, kind, variant = _HEAD.unpack_from(key, 1)
    if kind == 0:
        raise MalformedKey(key, "kind 0")
    rest = 1 + _HEAD.size
    if variant == _SCHEDULED:
        return TimerKey(due_at_ms, kind, key[rest:], 0, due_at_ms)
    if variant != _BACKED_OFF:
        raise MalformedKey(key, f"unknown variant byte {variant:#04x}")
    if len(key) < rest + _RETRY.size:
        raise MalformedKey(key, "backed-off row without attempt and original due time")
    attempt, original = _RETRY.unpack_from(key, rest)
    if attempt == 0:
        raise MalformedKey(key, "backed-off row with attempt 0")
    return TimerKey(due_at_ms, kind, key[rest + _RETRY.size :], attempt, original)


def quarantine(key: bytes) -> bytes:
    """Key under which the runner keeps the malformed timer-space row ``key``: ``b"Q" + key``
    (outside the timer space, so due-range scans skip it).

    Raises:
        TypeError: ``key`` is not bytes.
    """
    if not isinstance(key, bytes):
        raise TypeError(f"key must be bytes, got {type(key).__name__} {key!r}")
    return QUARANTINE_TAG + key


def well_formed_head(key: bytes) -> bool:
    """True when ``key`` has one layout's full structure, so that :func:`parse` could only reject
    it for kind 0: a cheap test for hot paths that need only the kind byte ``key[9]``."""
    n = len(key)
    if key[:1] != TAG or n < 11:
        return False
    variant = key[10]
    return variant == _SCHEDULED or (variant == _BACKED_OFF and n >= 23 and key[11:15] != b"\0\0\0\0")


def due_range(now_ms: int) -> tuple[bytes, bytes]:
    """``(start, end)`` covering every timer-space key whose effective due time is <= ``now_ms``."""
    check_uint("now_ms", now_ms, MAX_DUE_MS)
    end = TAG + struct.pack(">Q", now_ms + 1) if now_ms < MAX_DUE_MS else _END
    return TAG, end


def future_range(now_ms: int) -> tuple[bytes, bytes]:
    """``(start, end)`` covering every timer-space key due strictly after ``now_ms`` (Unix epoch ms)."""
    return due_range(now_ms)[1], _END

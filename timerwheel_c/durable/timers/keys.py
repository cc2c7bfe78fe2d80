"""Encoding of durable timer rows as ordered store keys, and the :class:`TimerKind` they carry.

Every key the library writes begins with the reserved byte 0x00 (:data:`RESERVED`) and a
one-letter tag after it: the *internal key space*. An application's own rows (a handler's effects)
must not begin with 0x00 (:func:`check_application_key` refuses them where a handler's batch enters
the timer layer), so that they are never in a range the library scans, whatever their keys
otherwise: ``b"Ticket/42"`` is no timer row and ``b"Result/42"`` no schedule's row. Below, ``"T"``
stands for the two bytes ``b"\\x00T"``, and so on for every tag. Stores written before the
reservation, whose tags had no 0x00, are rewritten once when opened (:mod:`.key_upgrade`).

Every timer row lives in the *timer space* of a partition: keys that begin with the
tag :data:`TAG` (``b"\\x00T"``). Two layouts share that space; both put the *effective* due
time (the time the runner should look at the row, Unix epoch ms) right after the tag,
so one scan of the timer space in key order visits plain and backed-off rows
together, in due order::

    scheduled:   "T" | due_at_ms u64 BE | kind u8 | 0x00 | reference
    backed off:  "T" | retry_at_ms u64 BE | kind u8 | 0x01 | attempt u32 BE
                     | original due_at_ms u64 BE | reference

A recurring schedule's pending occurrence uses the same two layouts with the variant bytes 0x02
(scheduled) and 0x03 (backed off), its reference the schedule's name in UTF-8, so that the runner
knows to settle it against the schedule's row (``"R" | name``, :func:`schedule_row`). Its backed-off
form keeps the occurrence's *nominal* time as the original due time, so a retry fires the same
occurrence.

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

A key whose reference is longer than :data:`MAX_REFERENCE_BYTES` is malformed too: its
backed-off form would not fit a store key, so it could never be claimed.

Quarantine: a malformed row that comes due is moved once, guarded, to
:func:`quarantine` of its key: the same key with its tag replaced by ``"Q"`` (0x00 0x51,
outside the timer space), value unchanged, so the quarantine key is exactly as long as
the key and fits wherever the key did. It is retained for inspection, but later scans of
the due range no longer see it, so malformed rows cannot use up a tick's ``max_scanned``
ahead of real timers. :data:`QUARANTINE_RANGE` covers every quarantined row.

Durable-sleep marks (:mod:`.sleep`) live beside the timer space: ``"S" | timer id``
(:func:`sleep_mark`).

Parked timers: a timer whose handler failed its last allowed attempt
(:attr:`~.registry.TimerHandler.max_attempts`) moves, guarded, to its *parked* row, outside the
timer space, so that no scan of due rows ever sees it again. The parked key is the backed-off
layout with the tag ``"P"`` (0x00 0x50) and, in place of the retry time, the time it was parked::

    parked:      "P" | parked_at_ms u64 BE | kind u8 | variant (0x01 / 0x03) | attempt u32 BE
                     | original due_at_ms u64 BE | reference
    its value:   last error length u16 BE | last error (UTF-8, at most MAX_ERROR_BYTES) | the timer's value

so it is exactly as long as the backed-off key it replaces, and parked rows list in the order
they were parked (:data:`PARKED_RANGE`). The identity row of a parked timer points at its parked
row (a parked schedule occurrence: its schedule's occurrence identity), so writers find it by
name, :func:`~.writer.requeue` puts it back in the timer space and ``cancel`` removes it.

Identity rows give a pending timer its name, (partition, kind, reference), so that writers find it
without its due time::

    identity:    "I" | kind u8 | reference   ->  value: the timer's current key
    occurrence:  "J" | kind u8 | name        ->  value: the schedule's pending occurrence's key

Every write that moves a timer (a claim, a Reschedule, a by-name replace, reschedule or cancel)
rewrites or deletes its identity row in the same guarded batch, so at most one pending timer holds
an identity and its row says where that timer is: one extra row per timer. One move leaves it: the
claim of a plain timer's scheduled row for its first attempt (:func:`claim_keeps_identity`), the move
every fire makes, so that a fire writes its timer row once and both rows' deletes (three row writes).
The identity row then names the scheduled key, now gone, and a writer finds the claimed row in one
range of the timer space (:func:`first_claim`). An identity row whose
timer is gone (a row quarantined as unprocessable) is harmless: writers treat it as absent. Stores
written before identity rows existed gain them on open (:mod:`.key_upgrade`).

This module is the only place the layout lives. The store is told, as data
(:data:`SIGNALLED`, :func:`declare_signals`), which writes must wake runners: a scheduled
timer row (variant byte 0x00) and a sleep mark, not the backed-off rows that claims write.

The allocation of the byte after the reserved 0x00 of a key:

========  ==========================================================
``b"I"``  identity rows (kind, reference -> the timer's key); ``"I" | 0x00 | kind | reference``:
          a retrying timer's last error (:func:`last_error_row`; ``"J" | 0x00 ...`` an occurrence's);
          ``"I" | 0x00 | 0x00 | kind | reference``: the trace context its writer's span left
          (:func:`trace_context_row`; 0x00 0x00 is neither an identity row's kind nor a last error's)
``b"J"``  identity rows of schedules' pending occurrences
``b"P"``  parked timers (failed their last attempt; never scanned by runners)
``b"R"``  recurring schedules' rows (:mod:`.schedule_state`)
``b"Q"``  quarantined malformed timer rows
``b"S"``  durable-sleep marks
``b"T"``  timer rows (scheduled and backed off)
others    free for later internal rows
========  ==========================================================

Every key that does not begin with 0x00 is free for applications' own rows (a handler's effects),
never scanned. A store from before the reservation may still hold rows whose first byte is one of
these letters, which are not of these layouts: they are applications' rows, and stay where they are.
"""
from __future__ import annotations

import re
import struct
import weakref
from dataclasses import dataclass

from typing import Callable, Optional

from .codecs import codec_of
from ..storage.errors import PicklesItsArguments
from ..storage.store import MAX_KEY_BYTES, MAX_VALUE_BYTES, Batch, KeyPattern, Store, check_bytes

__all__ = [
    "IDENTITY_TAG",
    "last_error_row",
    "last_error_text",
    "last_error_value",
    "may_keep_an_error",
    "may_keep_a_trace_context",
    "trace_context_row",
    "trace_context_value",
    "trace_context_text",
    "KINDS",
    "MAX_ATTEMPT",
    "MAX_DUE_MS",
    "MAX_REFERENCE_BYTES",
    "MAX_TIMER_VALUE_BYTES",
    "MAX_ERROR_BYTES",
    "OCCURRENCE_IDENTITY_TAG",
    "PARKED_RANGE",
    "PARKED_TAG",
    "SCHEDULE_RANGE",
    "SCHEDULE_TAG",
    "RESERVED",
    "TAG",
    "MalformedKey",
    "QUARANTINE_RANGE",
    "QUARANTINE_TAG",
    "TimerKey",
    "TimerKind",
    "claim_keeps_identity",
    "first_claim",
    "backoff",
    "SIGNALLED",
    "SLEEP_MARK_TAG",
    "check_application_batch",
    "check_application_key",
    "check_uint",
    "check_value",
    "declare_signals",
    "due_range",
    "well_formed_head",
    "future_range",
    "head_kind",
    "identity",
    "identity_of",
    "occurrence_identity",
    "schedule_row",
    "is_parked_key",
    "is_timer_key",
    "parked",
    "error_bytes",
    "parked_parts",
    "parked_value",
    "next_attempt",
    "parse",
    "parse_parked",
    "quarantine",
    "sleep_mark",
    "timer",
    "timer_range",
]

RESERVED = b"\x00"  # the first byte of every key the library writes; refused in applications' rows
TAG = RESERVED + b"T"
_SCHEDULED = 0x00
_BACKED_OFF = 0x01
_OCCURRENCE = 0x02  # added to a variant: the row is a schedule's occurrence
_HEAD = struct.Struct(">QBB")  # effective due ms, kind, variant
_KIND_AT = len(TAG) + 8  # index of the kind byte
_VARIANT_AT = _KIND_AT + 1  # index of the variant byte
_RETRY = struct.Struct(">IQ")  # attempt, original due ms
# The longest reference whose backed-off key (the longest key form) still fits a store key.
MAX_REFERENCE_BYTES = MAX_KEY_BYTES - len(TAG) - _HEAD.size - _RETRY.size
MAX_DUE_MS = 2**64 - 1
MAX_ATTEMPT = 2**32 - 1
_new = object.__new__
_END = RESERVED + b"U"  # the first key after the timer space: TAG + 1
QUARANTINE_TAG = RESERVED + b"Q"
QUARANTINE_RANGE = (QUARANTINE_TAG, RESERVED + b"R")  # (start, end) of the quarantine space: tag, tag + 1
SLEEP_MARK_TAG = RESERVED + b"S"
IDENTITY_TAG = RESERVED + b"I"
_IDENTITY_TAG_BYTES, _TAG_BYTES = len(IDENTITY_TAG), len(TAG)  # the slices of the functions a re-arm calls
OCCURRENCE_IDENTITY_TAG = RESERVED + b"J"
SCHEDULE_TAG = RESERVED + b"R"
SCHEDULE_RANGE = (SCHEDULE_TAG, RESERVED + b"S")  # (start, end) of the schedules' rows
PARKED_TAG = RESERVED + b"P"
PARKED_RANGE = (PARKED_TAG, QUARANTINE_TAG)  # (start, end) of the parked rows: tag, tag + 1
MAX_ERROR_BYTES = 1_000  # the longest last error a parked row keeps, in UTF-8 bytes
_ERROR_LENGTH = struct.Struct(">H")
# The largest value a timer (or a schedule's occurrences) fires with, in bytes: the store's limit
# less the room a parked row takes for its last error, so that a timer that can be written can be parked.
MAX_TIMER_VALUE_BYTES = MAX_VALUE_BYTES - _ERROR_LENGTH.size - MAX_ERROR_BYTES
# The writes that must wake runners and sleepers through the store's change signal.
SIGNALLED = [KeyPattern(TAG, _VARIANT_AT, _SCHEDULED), KeyPattern(TAG, _VARIANT_AT, _OCCURRENCE),
             KeyPattern(SLEEP_MARK_TAG)]


_KIND_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}\Z")


def check_kind_name(name: object) -> str:
    """Return ``name`` if it is a valid kind name: 1 to 64 ASCII letters, digits and ``._:-``, the
    first a letter or a digit (``"send-reminder"``).

    Raises:
        TypeError: not a str; ValueError: not of that form, naming it.
    """
    if not isinstance(name, str):
        raise TypeError(f"a kind name must be a str, got {type(name).__name__} {name!r}")
    if not _KIND_NAME.match(name):
        raise ValueError(f"a kind name must be 1 to 64 ASCII letters, digits and '._:-', starting with a letter or "
                         f"a digit, got {name!r}")
    return name


class TimerKind(int):
    """A timer kind, 1..255, and an int: ``TimerKind(1) == 1``, ``int(TimerKind(1)) == 1``, and equal
    kinds hash alike whichever form they take. Kind 0 is invalid; 0xF0..0xFE are reserved for tests
    and 0xFF for :mod:`timerwheel_c.durable.timers.sleep`.

    ``name`` (optional, :func:`check_kind_name`): what the kind is for (``TimerKind(1,
    "send-reminder")``). A store records each kind's name when a writer or a runner first uses it,
    and refuses one that names the kind otherwise (:mod:`.kind_names`); logs and the CLI show it.
    ``codec`` (optional, :mod:`.codecs`): ``"json"``, a :class:`~.codecs.Codec` or a ``(dumps, loads)``
    pair: writers then take any value it encodes and handlers receive the decoded value.

    Raises:
        TypeError: ``n`` is not an int (a bool is refused too), a name not a str, a bad codec.
        ValueError: ``n`` is outside 1..255, a malformed name.
    """

    name: "str | None"
    codec: object

    def __new__(cls, n: "int | TimerKind", name: "str | None" = None, codec: object = None):
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"a timer kind must be an int, got {type(n).__name__} {n!r}")
        if not 1 <= n <= 255:
            raise ValueError(f"a timer kind must be in 1..255 (0 is invalid), got {int(n)}")
        self = super().__new__(cls, n)
        self.name = None if name is None else check_kind_name(name)
        self.codec = codec_of(codec)
        return self

    def get(self) -> int:
        """The kind number, 1..255, as a plain int."""
        return int(self)

    def __repr__(self):
        named = "" if self.name is None else f", {self.name!r}"
        return f"TimerKind({int(self)}{named})"

    __str__ = __repr__


# Every kind, built once: a runner names the kind of each row it fires, and TimerKind() checks its
# argument each time (index by the kind number, 1..255, of a parsed key).
KINDS = (None,) + tuple(TimerKind(n) for n in range(1, 256))


class MalformedKey(PicklesItsArguments, ValueError):
    """A key in the timer space that matches neither layout; ``.key`` holds the raw bytes and ``.why``
    what is wrong with them (without the bytes, for a log line that names the row its own way)."""

    def __init__(self, key: bytes, why: str):
        super().__init__(f"malformed timer key {key!r}: {why}")
        self.key = key
        self.why = why
        self._arguments = ((key, why), {})


@dataclass(frozen=True)
class TimerKey:
    """A parsed timer key.

    ``due_at_ms`` is the row's effective due time (the retry time for a backed-off row),
    ``original_due_at_ms`` the time the timer was scheduled for; both Unix epoch ms.
    ``attempt`` is 0 for a scheduled row. For a parked row (:func:`parse_parked`), ``due_at_ms``
    is the time it was parked and ``attempt`` the attempts it used.
    """

    due_at_ms: int
    kind: int
    reference: bytes
    attempt: int
    original_due_at_ms: int
    occurrence: bool = False


def check_value(name: str, value: object) -> bytes:
    """``value`` if it is bytes of at most :data:`MAX_TIMER_VALUE_BYTES`: what a timer fires with.

    Raises:
        TypeError: not bytes, naming ``name``. ValueError: longer, naming ``name`` and its length.
    """
    raw = check_bytes(name, value)
    if len(raw) > MAX_TIMER_VALUE_BYTES:
        raise ValueError(f"{name} must be at most {MAX_TIMER_VALUE_BYTES:,} bytes, got {len(raw):,} bytes")
    return raw


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
        return int(kind)
    if isinstance(kind, bool) or not isinstance(kind, int):
        raise TypeError(f"kind must be a TimerKind or an int 1..255, got {type(kind).__name__} {kind!r}")
    if not 1 <= kind <= 255:
        raise ValueError(f"kind must be in 1..255, got {kind!r}")
    return kind


def _check_reference(reference: object) -> bytes:
    if not isinstance(reference, bytes):
        raise TypeError(f"reference must be bytes, got {type(reference).__name__} {reference!r}")
    if len(reference) > MAX_REFERENCE_BYTES:
        raise ValueError(
            f"reference must be at most {MAX_REFERENCE_BYTES} bytes, got {len(reference)} bytes starting {reference[:16]!r}")
    return reference


def timer(due_at_ms: int, kind, reference: bytes, *, occurrence: bool = False) -> bytes:
    """Key of a scheduled timer row.

    Args:
        due_at_ms: due time, Unix epoch ms, 0..2**64-1.
        kind: 1..255, an int or a :class:`TimerKind`.
        reference: opaque bytes, at most :data:`MAX_REFERENCE_BYTES` (2,024).
        occurrence: the row is a schedule's pending occurrence (``reference``: its name).

    Raises:
        TypeError: a non-int time or kind, a non-bytes reference.
        ValueError: a time or kind out of range, kind 0, a reference too long.
    """
    if (type(due_at_ms) is int and 0 <= due_at_ms <= MAX_DUE_MS and type(kind) is TimerKind
            and type(reference) is bytes and len(reference) <= MAX_REFERENCE_BYTES):
        # A writer's common case (as identity's): nothing to check that the types and bounds do not promise.
        return TAG + _HEAD.pack(due_at_ms, kind, _SCHEDULED | (_OCCURRENCE if occurrence else 0)) + reference
    head = _HEAD.pack(check_uint("due_at_ms", due_at_ms, MAX_DUE_MS), _check_kind(kind),
                      _SCHEDULED | (_OCCURRENCE if occurrence else 0))
    return TAG + head + _check_reference(reference)


def backoff(retry_at_ms: int, kind, attempt: int, original_due_at_ms: int, reference: bytes, *,
            occurrence: bool = False) -> bytes:
    """Key of a backed-off row: due again at ``retry_at_ms`` (Unix epoch ms), attempt ``attempt`` (1..2**32-1).

    Raises the same errors as :func:`timer`; ``attempt`` 0 is a ValueError (that is a scheduled row).
    """
    if check_uint("attempt", attempt, MAX_ATTEMPT) == 0:
        raise ValueError("attempt must be >= 1 for a backed-off row, got 0")
    head = _HEAD.pack(check_uint("retry_at_ms", retry_at_ms, MAX_DUE_MS), _check_kind(kind),
                      _BACKED_OFF | (_OCCURRENCE if occurrence else 0))
    tail = _RETRY.pack(attempt, check_uint("original_due_at_ms", original_due_at_ms, MAX_DUE_MS))
    return TAG + head + tail + _check_reference(reference)


def next_attempt(tk: TimerKey, retry_at_ms: int, attempt: int) -> bytes:
    """:func:`backoff` for the timer ``tk``, parsed from a well-formed key (so its kind, original due time
    and reference need no check again): its key backed off to ``retry_at_ms`` (Unix epoch ms,
    0..:data:`MAX_DUE_MS`) at ``attempt`` (1..:data:`MAX_ATTEMPT`), which the caller clamped."""
    head = _HEAD.pack(retry_at_ms, tk.kind, _BACKED_OFF | (_OCCURRENCE if tk.occurrence else 0))
    return TAG + head + _RETRY.pack(attempt, tk.original_due_at_ms) + tk.reference


def first_claim(key: bytes) -> Optional[tuple]:
    """Where to look for the row that the first claim of the scheduled row ``key`` moved it to: that
    claim leaves the identity row naming ``key`` (one row write per fire fewer), so a writer that finds
    ``key`` gone looks here. ``(start, end, suffix)``: the claimed key is in ``[start, end)`` (its retry
    time is the claim's time plus a backoff, never before the due time; ``end`` is the end of the timer
    space) and ends with ``suffix`` after its retry time (kind, variant, attempt 1, original due time,
    reference), which no other timer's key does. None when ``key`` is no plain scheduled row (a
    backed-off, parked or occurrence row, or malformed), whose every move rewrites the identity row.
    """
    if not is_timer_key(key) or len(key) < len(TAG) + _HEAD.size or key[_VARIANT_AT] != _SCHEDULED:
        return None
    due_at_ms, kind, _ = _HEAD.unpack_from(key, len(TAG))
    tail = bytes((kind, _BACKED_OFF)) + _RETRY.pack(1, due_at_ms) + key[len(TAG) + _HEAD.size:]
    return key[:_KIND_AT], _END, tail


def scheduled_fields(key: bytes) -> Optional[tuple]:
    """``(due_at_ms, kind, reference)`` of ``key`` when it is a well-formed plain timer's scheduled
    row (attempt 0, not a schedule's occurrence: what :func:`parse` gives as a TimerKey), else None
    (any other layout, or a key :func:`parse` refuses): a claim's look at the row it meets most, which
    makes no TimerKey. With :func:`first_claimed_key`, the claim of that row."""
    if len(key) <= _VARIANT_AT or key[_VARIANT_AT] != _SCHEDULED or key[:len(TAG)] != TAG or key.__class__ is not bytes:
        return None
    due_at_ms, kind, _ = _HEAD.unpack_from(key, len(TAG))
    reference = key[len(TAG) + _HEAD.size:]
    if kind == 0 or len(reference) > MAX_REFERENCE_BYTES:
        return None
    return due_at_ms, kind, reference


def first_claimed_key(due_at_ms: int, kind: int, reference: bytes, retry_at_ms: int) -> bytes:
    """:func:`next_attempt` of the scheduled row :func:`scheduled_fields` read (``due_at_ms``, ``kind``,
    ``reference``) backed off to ``retry_at_ms`` (Unix epoch ms, 0..:data:`MAX_DUE_MS`) at attempt 1:
    the key its first claim moves it to."""
    return TAG + _HEAD.pack(retry_at_ms, kind, _BACKED_OFF) + _RETRY.pack(1, due_at_ms) + reference


def claim_keeps_identity(tk: TimerKey) -> bool:
    """True when the claim of the row ``tk`` leaves its identity row as it is (a plain timer's first
    attempt, which :func:`first_claim` finds); every other move points the identity row at the new key."""
    return tk.attempt == 0 and not tk.occurrence


def parse(key: bytes) -> TimerKey:
    """Parse a timer key of either layout.

    Raises:
        MalformedKey: wrong tag, too short, unknown variant byte, kind 0 or attempt 0.
    """
    if not isinstance(key, bytes):
        raise TypeError(f"key must be bytes, got {type(key).__name__}")
    if key[:len(TAG)] != TAG:
        raise MalformedKey(key, f"not in the timer space (its tag is not {TAG!r})")
    return _parse_tail(key)


def _parse_tail(key: bytes) -> TimerKey:
    """Parse ``key`` after its tag (either layout; every tag is as long as :data:`TAG`)."""
    if len(key) < len(TAG) + _HEAD.size:
        raise MalformedKey(key, f"{len(key)} bytes, shorter than the {len(TAG) + _HEAD.size}-byte header")
    due_at_ms, kind, variant = _HEAD.unpack_from(key, len(TAG))
    if kind == 0:
        raise MalformedKey(key, "kind 0")
    rest = len(TAG) + _HEAD.size
    if variant > _BACKED_OFF | _OCCURRENCE:
        raise MalformedKey(key, f"unknown variant byte {variant:#04x}")
    occurrence = bool(variant & _OCCURRENCE)
    if variant & _BACKED_OFF == 0:
        attempt, original = 0, due_at_ms
    else:
        if len(key) < rest + _RETRY.size:
            raise MalformedKey(key, "backed-off row without attempt and original due time")
        attempt, original = _RETRY.unpack_from(key, rest)
        if attempt == 0:
            raise MalformedKey(key, "backed-off row with attempt 0")
        rest += _RETRY.size
    reference = key[rest:]
    if len(reference) > MAX_REFERENCE_BYTES:
        raise MalformedKey(key, f"a {len(reference)}-byte reference, longer than {MAX_REFERENCE_BYTES}: "
                                "its backed-off key would not fit a store key")
    # Every claimed row is parsed: its fields go in with one dict update, where the frozen dataclass's
    # __init__ would make a Python call and six object.__setattr__ calls. Its values are ints, bytes
    # and a bool, so the dict stays untracked by the cyclic collector.
    parsed = _new(TimerKey)
    parsed.__dict__.update(due_at_ms=due_at_ms, kind=kind, reference=reference, attempt=attempt,
                           original_due_at_ms=original, occurrence=occurrence)
    return parsed


def parked(parked_at_ms: int, tk: TimerKey) -> bytes:
    """Key of the parked row of the timer ``tk`` (parsed from its timer row), parked at
    ``parked_at_ms`` (Unix epoch ms) after ``tk.attempt`` (>= 1) attempts.

    Raises:
        TypeError / ValueError: as :func:`backoff` (attempt 0 included).
    """
    return PARKED_TAG + backoff(parked_at_ms, tk.kind, tk.attempt, tk.original_due_at_ms, tk.reference,
                                occurrence=tk.occurrence)[len(TAG):]


def parse_parked(key: bytes) -> TimerKey:
    """Parse a parked row's key (:func:`parked`): ``due_at_ms`` is when it was parked.

    Raises:
        MalformedKey: not a parked key, or its rest is malformed as :func:`parse` says.
    """
    if not is_parked_key(key):
        raise MalformedKey(key, f"not a parked row (its tag is not {PARKED_TAG!r})")
    tk = _parse_tail(key)
    if not tk.attempt:
        raise MalformedKey(key, "a parked row without attempt and original due time")
    return tk


def is_parked_key(key: bytes) -> bool:
    """True when ``key`` is a parked row's (starts with :data:`PARKED_TAG`), well-formed or not."""
    return isinstance(key, bytes) and key[:len(PARKED_TAG)] == PARKED_TAG


def parked_value(last_error: str, value: bytes) -> bytes:
    """A parked row's value: the timer's ``value`` behind ``last_error`` (a str, cut to
    :data:`MAX_ERROR_BYTES` UTF-8 bytes on a character boundary, marked with an ellipsis)."""
    raw = error_bytes(last_error)
    return _ERROR_LENGTH.pack(len(raw)) + raw + check_bytes("value", value)


def error_bytes(last_error: str) -> bytes:
    """``last_error`` as UTF-8 (surrogates backslash-escaped), cut to :data:`MAX_ERROR_BYTES` bytes on a
    character boundary and marked with an ellipsis when it was longer."""
    raw = last_error.encode("utf-8", "backslashreplace")
    if len(raw) > MAX_ERROR_BYTES:
        ellipsis = "\u2026".encode()
        raw = raw[:MAX_ERROR_BYTES - len(ellipsis)].decode("utf-8", "ignore").encode() + ellipsis
    return raw


def parked_parts(data: bytes) -> tuple:
    """``(last error str, the timer's value bytes)`` of a parked row's value (:func:`parked_value`).

    Raises:
        ValueError: a value too short for its error's length.
    """
    if len(data) < _ERROR_LENGTH.size:
        raise ValueError(f"a parked row's value is at least {_ERROR_LENGTH.size} bytes, got {data[:16]!r}")
    (n,) = _ERROR_LENGTH.unpack_from(data)
    end = _ERROR_LENGTH.size + n
    if end > len(data):
        raise ValueError(f"a parked row's value holds {len(data)} bytes, shorter than its {n}-byte error")
    return data[_ERROR_LENGTH.size:end].decode("utf-8", "replace"), data[end:]


def quarantine(key: bytes) -> bytes:
    """Key under which the runner keeps the malformed timer-space row ``key``: ``key`` with its tag
    replaced by :data:`QUARANTINE_TAG` (outside the timer space, so due-range scans skip it), the same length.

    Raises:
        TypeError: ``key`` is not bytes.
        ValueError: ``key`` is not in the timer space.
    """
    if not isinstance(key, bytes):
        raise TypeError(f"key must be bytes, got {type(key).__name__} {key!r}")
    if not is_timer_key(key):
        raise ValueError(f"only a timer-space key (tag {TAG!r}) is quarantined, got {key[:16]!r}")
    return QUARANTINE_TAG + key[len(TAG):]


def identity(kind, reference: bytes) -> bytes:
    """Key of the identity row of the timer (``kind``, ``reference``) of a partition.

    Raises:
        TypeError / ValueError: as :func:`timer` for a bad kind or reference.
    """
    if type(kind) is TimerKind and type(reference) is bytes and len(reference) <= MAX_REFERENCE_BYTES:
        # A runner's own case, once per fire (a kind of KINDS, a parsed reference): nothing to check
        # that the type does not already promise, so no call to the checks.
        return IDENTITY_TAG + bytes((kind,)) + reference
    return IDENTITY_TAG + bytes((_check_kind(kind),)) + _check_reference(reference)


def identity_of(tk: TimerKey) -> bytes:
    """Key of the identity row of the parsed timer ``tk`` (for an occurrence, its schedule's)."""
    return (OCCURRENCE_IDENTITY_TAG if tk.occurrence else IDENTITY_TAG) + bytes((tk.kind,)) + tk.reference


_LAST_ERROR = struct.Struct(">QI")  # original due_at_ms, attempt


def last_error_row(identity_key: bytes) -> bytes:
    """Key of the row keeping the last error of the retrying timer whose identity row is
    ``identity_key``: that key with a 0x00 after its tag, where an identity row has its kind (never
    0), so that it is no identity row's key and no scan of identity rows is needed to tell them apart."""
    return identity_key[:_IDENTITY_TAG_BYTES] + b"\x00" + identity_key[_IDENTITY_TAG_BYTES:]


def last_error_value(tk: TimerKey, last_error: str) -> bytes:
    """The value of :func:`last_error_row` for the failed attempt ``tk.attempt`` of the timer ``tk``
    (its claimed row): the attempt it belongs to, then the error as a parked row keeps it."""
    return _LAST_ERROR.pack(tk.original_due_at_ms, tk.attempt) + error_bytes(last_error)


def last_error_text(value: Optional[bytes], tk: TimerKey) -> Optional[str]:
    """The last error kept in ``value`` (of :func:`last_error_row`, or None) when it belongs to the
    retrying timer ``tk`` (the same original due time, and ``tk``'s attempt or the one before, which
    is in flight), else None: a row left by an earlier timer of that name is never shown."""
    if value is None or len(value) < _LAST_ERROR.size:
        return None
    original_due_at_ms, attempt = _LAST_ERROR.unpack_from(value)
    if original_due_at_ms != tk.original_due_at_ms or attempt not in (tk.attempt, tk.attempt - 1):
        return None
    return bytes(value[_LAST_ERROR.size:]).decode("utf-8", "replace")


def may_keep_a_trace_context(tk: TimerKey) -> bool:
    """True when the parsed timer ``tk`` may have a :func:`trace_context_row`: a timer by name may
    (:func:`~.writer.schedule` keeps its writer's), a schedule's occurrence never has one (no writer
    keeps one for an occurrence), so its fire neither reads nor deletes that row."""
    return not tk.occurrence


def trace_context_row(identity_key: bytes) -> bytes:
    """Key of the row keeping the W3C trace context of the span that scheduled the timer whose
    identity row is ``identity_key``: that key with 0x00 0x00 after its tag (a last error's row has
    its kind, never 0, after its one 0x00), so that it is neither an identity row nor a last error's."""
    return identity_key[:_IDENTITY_TAG_BYTES] + b"\x00\x00" + identity_key[_IDENTITY_TAG_BYTES:]


_TRACED_DUE = struct.Struct(">Q")  # the original due_at_ms of the timer the context belongs to


def trace_context_value(due_at_ms: int, traceparent: bytes) -> bytes:
    """The value of :func:`trace_context_row` for the timer scheduled at ``due_at_ms`` (Unix epoch
    ms): that due time, then its writer's ``traceparent`` header (ASCII bytes, 55 for version 00)."""
    return _TRACED_DUE.pack(due_at_ms) + traceparent


def trace_context_text(value: Optional[bytes], tk: TimerKey) -> Optional[str]:
    """The ``traceparent`` kept in ``value`` (of :func:`trace_context_row`, or None) when it belongs
    to the timer ``tk`` (the same original due time), else None: a row an earlier timer of that name
    left (its runner without tracing, so it never deleted it) is never linked."""
    if value is None or len(value) <= _TRACED_DUE.size or _TRACED_DUE.unpack_from(value)[0] != tk.original_due_at_ms:
        return None
    return bytes(value[_TRACED_DUE.size:]).decode("ascii", "replace")


def may_keep_an_error(key: bytes) -> bool:
    """True when the timer row ``key`` (a parked or backed-off one) may have a :func:`last_error_row`
    to delete with it: a scheduled row never has."""
    tag = key[:_TAG_BYTES]
    return tag == PARKED_TAG or (tag == TAG and len(key) > _VARIANT_AT and bool(key[_VARIANT_AT] & _BACKED_OFF))


def occurrence_identity(kind, name: bytes) -> bytes:
    """Key of the identity row of the pending occurrence of the schedule ``name`` (UTF-8 bytes) of ``kind``."""
    return OCCURRENCE_IDENTITY_TAG + bytes((_check_kind(kind),)) + _check_reference(name)


def schedule_row(name: bytes) -> bytes:
    """Key of the row of the schedule ``name`` (UTF-8 bytes, at most :data:`MAX_REFERENCE_BYTES`)."""
    return SCHEDULE_TAG + _check_reference(name)


def check_application_key(key: bytes) -> bytes:
    """``key`` if an application may write it: a key that does not begin with :data:`RESERVED`
    (0x00), which the library keeps for its own rows.

    Raises:
        ValueError: ``key`` begins with 0x00, naming it.
    """
    if key[:len(RESERVED)] == RESERVED:
        raise ValueError(f"the key {key[:64]!r} begins with 0x00, which timerwheel_c reserves for its own rows: "
                         "an application's rows must use keys that begin with any other byte")
    return key


def check_application_batch(batch: Batch) -> Batch:
    """``batch`` if none of its writes goes to a reserved key (:func:`check_application_key`): what a
    handler's outcome may commit. Its guards may name any key (a read changes no row).

    Raises:
        ValueError: a write to a key that begins with 0x00, naming the key.
    """
    for key, _ in batch.writes:
        if key[:len(RESERVED)] == RESERVED:  # the check inline: it runs for each write of each fire's outcome
            check_application_key(key)
    return batch


def is_timer_key(key: bytes) -> bool:
    """True when ``key`` is in the timer space (starts with the tag), well-formed or not."""
    return key[:len(TAG)] == TAG


def sleep_mark(reference: bytes) -> bytes:
    """Key of the durable-sleep mark of the timer id ``reference`` (bytes)."""
    return SLEEP_MARK_TAG + reference


def declare_signals(store: Store) -> None:
    """Tell ``store`` which writes its change signal must follow (:data:`SIGNALLED`); cheap after the
    first call on a store. Writers and runners call it before they write or wait. The store object
    that declared last, successfully, is not told again (a write by name calls this each time: the
    store's own check of the patterns is most of a microsecond, and a backend keeps what it was told
    per store object anyway, as PostgreSQL's does).

    Raises:
        StoreError: the store failed.
    """
    global _declared_last
    if _declared_last() is store:
        return
    store.signal_writes(SIGNALLED)
    try:
        _declared_last = weakref.ref(store)
    except TypeError:  # a store that takes no weak reference is told at every call
        pass


def _nothing() -> None:
    return None


# A weak reference to the store that declare_signals told last (or a function returning None): a
# strong one would keep a dropped store, and its connection, alive.
_declared_last: Callable[[], Optional[Store]] = _nothing


def well_formed_head(key: bytes) -> bool:
    """True when ``key`` has one layout's full structure, so that :func:`parse` could only reject
    it for kind 0 or an over-long reference: a cheap test for hot paths that need only the kind."""
    n = len(key)
    rest = len(TAG) + _HEAD.size
    if key[:len(TAG)] != TAG or n < rest:
        return False
    variant = key[_VARIANT_AT] & ~_OCCURRENCE
    if variant == _SCHEDULED:
        return key[_VARIANT_AT] <= _BACKED_OFF | _OCCURRENCE
    return variant == _BACKED_OFF and n >= rest + _RETRY.size and key[rest:rest + 4] != b"\0\0\0\0"


def head_kind(key: bytes) -> Optional[int]:
    """The kind byte of ``key`` when it has one layout's full header (:func:`well_formed_head`), else
    None: the runner's cheap look at a row's kind, without a full :func:`parse`."""
    return key[_KIND_AT] if well_formed_head(key) else None


def due_range(now_ms: int) -> tuple[bytes, bytes]:
    """``(start, end)`` covering every timer-space key whose effective due time is <= ``now_ms``."""
    check_uint("now_ms", now_ms, MAX_DUE_MS)
    end = TAG + struct.pack(">Q", now_ms + 1) if now_ms < MAX_DUE_MS else _END
    return TAG, end


def timer_range() -> tuple:
    """``(start, end)`` covering the whole timer space, scheduled and backed-off rows, in due order."""
    return TAG, _END


def future_range(now_ms: int) -> tuple[bytes, bytes]:
    """``(start, end)`` covering every timer-space key due strictly after ``now_ms`` (Unix epoch ms)."""
    return due_range(now_ms)[1], _END

"""Codecs: how a kind's timer values are stored, when they are not bytes already.

A timer's value is stored as bytes. A kind given a codec (``TimerKind(1, "send-reminder",
codec="json")``) lets writers take any value the codec encodes (``schedule(..., {"user": 7})``),
its handler receive the decoded value as ``timer.value``, and a ``Reschedule`` it returns carry a
value of the same kind, encoded when the outcome is settled. A value left out (the writers'
default ``b""``, a schedule added without ``--value``) is stored empty and reaches the handler as
None, whatever the codec. Without a codec (the default) values stay bytes, as stored. A value the
codec cannot decode is that attempt's failure, with the codec's error as the timer's last error.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Optional

from ..storage.store import check_bytes

__all__ = ["JSON", "Codec", "codec_of", "decoded", "encoded"]


@dataclass(frozen=True)
class Codec:
    """``dumps(value) -> bytes`` and ``loads(bytes) -> value``, named for messages."""

    dumps: Callable[[object], bytes]
    loads: Callable[[bytes], object]
    name: str = "custom"


def _json_dumps(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


#: JSON as UTF-8, compact; what ``codec="json"`` names.
JSON = Codec(_json_dumps, json.loads, "json")


def codec_of(codec: object) -> Optional[Codec]:
    """``codec`` as a :class:`Codec`: None (values stay bytes), ``"json"``, a Codec, or a
    ``(dumps, loads)`` pair of callables.

    Raises:
        TypeError: anything else, naming it.
    """
    if codec is None or isinstance(codec, Codec):
        return codec
    if codec == "json":
        return JSON
    if isinstance(codec, tuple) and len(codec) == 2 and all(callable(f) for f in codec):
        return Codec(codec[0], codec[1])
    raise TypeError(f"codec must be None, 'json', a Codec or a (dumps, loads) pair of callables, got "
                    f"{type(codec).__name__} {codec!r}")


def encoded(kind: object, value: object, name: str = "value") -> bytes:
    """``value`` as stored for a timer of ``kind``: encoded by the kind's codec if it has one, else
    ``value`` itself, which must then be bytes; ``name`` names it in the errors.

    A value left out (empty bytes, the writers' default) stays empty: :func:`decoded` gives None
    for it.

    Raises:
        TypeError: a value that is not bytes for a kind without a codec, or a codec whose ``dumps``
            did not return bytes; whatever the codec's ``dumps`` raises (TypeError, ValueError).
        ValueError: text the codec cannot encode as UTF-8 (a str with a lone surrogate), naming it.
    """
    codec = getattr(kind, "codec", None)
    if codec is None:
        return check_bytes(name, value)
    if isinstance(value, (bytes, bytearray)) and not value:
        return b""
    try:
        raw = codec.dumps(value)
    except UnicodeEncodeError as exc:  # a str with a lone surrogate: UTF-8 has no bytes for it
        raise ValueError(f"{name} of kind {int(kind)} holds text with no UTF-8 for its {codec.name} codec "  # type: ignore[call-overload]
                         f"({exc.reason}), got {value!r:.200}") from None
    return check_bytes(f"{name} encoded by the {codec.name} codec of kind {int(kind)}", raw)  # type: ignore[call-overload]


def decoded(codec: Codec, raw: bytes) -> object:
    """A stored value as a handler of a kind with ``codec`` receives it: None for an empty one (a
    value left out, see :func:`encoded`), else ``codec.loads(raw)``.

    Raises:
        whatever the codec's ``loads`` raises.
    """
    return None if not raw else codec.loads(raw)

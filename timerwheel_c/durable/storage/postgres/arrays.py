"""Array parameters in PostgreSQL's binary format, dumped without a call per element.

psycopg 3 dumps a Python list element by element in Python (``psycopg.types.array``): a call,
a length word and two appends per element. The store's set-based statements send a dozen arrays
of keys and values per chunk of timers, so that loop was a large share of the runner's CPU time
per fired timer. These lists (:class:`ByteaArray`, :class:`TextArray`, :class:`Int4Array`,
:class:`Int8Array`, :class:`TidArray`) carry their element type, and their dumpers build the whole binary array
(the ``array_send`` layout: a header, one dimension, then a length word and the bytes of each
element; see PostgreSQL's ``src/backend/utils/adt/arrayfuncs.c``) in one comprehension
and one ``bytes.join``. Register them on a connection with :func:`register`; a plain list still goes
through psycopg's own dumper.
"""
from __future__ import annotations

import struct
from functools import partial

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

__all__ = ["ByteaArray", "Int4Array", "Int8Array", "TextArray", "TidArray", "register"]

_HEAD = struct.Struct(">iiiii")  # ndim, has-null flag, element oid, length, lower bound
_EMPTY = struct.Struct(">iii")  # ndim 0, no nulls, element oid
_LEN = struct.Struct(">i").pack
_NULL = _LEN(-1)
_BYTEA_OID, _TEXT_OID, _INT4_OID, _INT8_OID, _TID_OID = 17, 25, 23, 20, 27
_INT4 = partial(struct.Struct(">ii").pack, 4)  # an element: its length word (4), then the value
_INT8 = partial(struct.Struct(">iq").pack, 8)


class ByteaArray(list):
    """A ``bytea[]`` parameter: bytes elements, or None for NULL."""


class TextArray(list):
    """A ``text[]`` parameter: str elements (sent as UTF-8)."""


class Int4Array(list):
    """An ``int[]`` parameter: int elements within int4."""


class Int8Array(list):
    """A ``bigint[]`` parameter: int elements within int8."""


class TidArray(list):
    """A ``tid[]`` parameter: elements in ``tidsend``'s 6 bytes (block u32, offset u16, big-endian, as
    the server sends a ctid in binary), or None for NULL."""


def _dump_buffers(items: list, oid: int) -> bytes:
    if not items:
        return _EMPTY.pack(0, 0, oid)
    if None in items:
        head = _HEAD.pack(1, 1, oid, len(items), 1)
        return head + b"".join([_NULL if item is None else _LEN(len(item)) + item for item in items])
    # No NULL (most arrays): the length words and the elements interleaved by slice assignment, the
    # per-element work in C (map), not a comprehension's bytecode and a concatenation per element.
    parts: list = [b""] * (2 * len(items))
    parts[::2] = map(_LEN, map(len, items))
    parts[1::2] = items
    return _HEAD.pack(1, 0, oid, len(items), 1) + b"".join(parts)


def _dump_ints(items: list, oid: int, element) -> bytes:
    if not items:
        return _EMPTY.pack(0, 0, oid)
    return _HEAD.pack(1, 0, oid, len(items), 1) + b"".join(map(element, items))


class _ByteaArrayDumper(Dumper):
    format = Format.BINARY
    oid = 1001  # bytea[]

    def dump(self, obj: list) -> bytes:
        return _dump_buffers(obj, _BYTEA_OID)


class _TextArrayDumper(Dumper):
    format = Format.BINARY
    oid = 1009  # text[]

    def dump(self, obj: list) -> bytes:
        return _dump_buffers(list(map(str.encode, obj)), _TEXT_OID)


class _Int4ArrayDumper(Dumper):
    format = Format.BINARY
    oid = 1007  # int4[]

    def dump(self, obj: list) -> bytes:
        return _dump_ints(obj, _INT4_OID, _INT4)


class _Int8ArrayDumper(Dumper):
    format = Format.BINARY
    oid = 1016  # int8[]

    def dump(self, obj: list) -> bytes:
        return _dump_ints(obj, _INT8_OID, _INT8)


class _TidArrayDumper(Dumper):
    format = Format.BINARY
    oid = 1010  # tid[]

    def dump(self, obj: list) -> bytes:
        return _dump_buffers(obj, _TID_OID)


def register(conn: psycopg.Connection) -> psycopg.Connection:
    """Dump this module's list types on ``conn`` with their binary dumpers; returns ``conn``."""
    adapters = conn.adapters
    adapters.register_dumper(ByteaArray, _ByteaArrayDumper)
    adapters.register_dumper(TextArray, _TextArrayDumper)
    adapters.register_dumper(Int4Array, _Int4ArrayDumper)
    adapters.register_dumper(Int8Array, _Int8ArrayDumper)
    adapters.register_dumper(TidArray, _TidArrayDumper)
    return conn

"""The PostgreSQL store's array parameters (storage/postgres/arrays.py): the bytes its dumpers send are
psycopg's own binary dump of the same list, and an array without NULL costs no Python bytecode per
element (the store sends a dozen such arrays per chunk of fired timers)."""
from __future__ import annotations

import struct
import sys

import pytest

psycopg = pytest.importorskip("psycopg")

from psycopg.adapt import PyFormat, Transformer  # noqa: E402

from timerwheel_c.durable.storage.postgres import arrays  # noqa: E402

_BYTEA_OID = 17


def _psycopg_dump(items: list) -> bytes:
    """psycopg's own binary dump of the plain list ``items`` (its dumper per element, in Python)."""
    return bytes(Transformer().get_dumper(items, PyFormat.BINARY).dump(items))


@pytest.mark.parametrize("items", [
    [b"\x00T\x01", b"", b"x" * 300],
    [b"a", None, b""],
    [None, b"z"],
])
def test_a_bytea_array_is_dumped_as_psycopg_dumps_it(items):
    """``ByteaArray``'s dump is byte for byte psycopg's binary dump of the same list, with and without
    NULLs, so the server reads the same array whichever path built it. Deterministic, no server."""
    assert arrays._ByteaArrayDumper(arrays.ByteaArray).dump(arrays.ByteaArray(items)) == _psycopg_dump(items)


def test_an_empty_bytea_array_has_no_dimension():
    """An empty array is sent with ndim 0 (as ``array_send`` writes one): no length, no lower bound."""
    assert arrays._ByteaArrayDumper(arrays.ByteaArray).dump(arrays.ByteaArray()) == b"\x00" * 8 + b"\x00\x00\x00\x11"


def _lines_run(items: list) -> int:
    """How many lines of arrays.py run (sys.settrace line events) to dump ``items``."""
    count = 0
    code = arrays._dump_buffers.__code__.co_filename

    def trace(frame, event, arg):
        nonlocal count
        if frame.f_code.co_filename != code:
            return None
        if event == "line":
            count += 1
        return trace

    sys.settrace(trace)
    try:
        arrays._dump_buffers(items, _BYTEA_OID)
    finally:
        sys.settrace(None)
    return count


def test_an_array_without_null_runs_no_bytecode_per_element():
    """The dump of 1,000 keys runs as many lines as that of 10: the length words and the elements are
    interleaved in C, not in a comprehension that runs a line (a pack call and a concatenation) per
    element. An array with a NULL may still take the per-element path. Deterministic: it counts
    trace events, no timing."""
    small, large = _lines_run([b"k%03d" % i for i in range(10)]), _lines_run([b"k%04d" % i for i in range(1000)])
    assert small > 0  # the tracer saw the dump at all
    assert large == small


def _array(oid: int, elements: list) -> bytes:
    """``array_send``'s bytes of a one-dimension array of element type ``oid`` holding ``elements``
    (each its binary form, or None for NULL): the layout the dumpers must give."""
    if not elements:
        return bytes(8) + oid.to_bytes(4, "big")
    has_null = any(e is None for e in elements)
    head = b"".join(n.to_bytes(4, "big") for n in (1, int(has_null), oid, len(elements), 1))
    return head + b"".join(b"\xff\xff\xff\xff" if e is None else len(e).to_bytes(4, "big") + e for e in elements)


def test_a_long_bytea_element_is_dumped_as_psycopg_dumps_it():
    """An element longer than the prepacked length words (a key is at most 2,048 bytes, a value may be
    longer) still gives psycopg's bytes. Deterministic, no server."""
    items = [b"x" * 5000, b"k"]
    assert arrays._ByteaArrayDumper(arrays.ByteaArray).dump(arrays.ByteaArray(items)) == _psycopg_dump(items)


def test_a_bytea_array_of_nulls_alone_is_a_null_per_element():
    """An array whose every element is NULL (the move targets of a list of which no batch moves its
    row) is its header and a NULL word per element. Deterministic, no server."""
    dumped = arrays._ByteaArrayDumper(arrays.ByteaArray).dump(arrays.ByteaArray([None, None, None]))
    assert dumped == _array(_BYTEA_OID, [None, None, None])


@pytest.mark.parametrize("items", [
    ["fleet03", "fleet03", "fleet11", "fleet03"],
    ["é-partition", "", "日本", "é-partition"],
    ["one"],
    [],
])
def test_a_text_array_is_each_name_in_utf8(items):
    """``TextArray``'s dump, each distinct element framed once, is the ``text[]`` of the names in UTF-8,
    in order: repeated, non-ASCII and empty names, and no element. Deterministic, no server."""
    dumped = arrays._TextArrayDumper(arrays.TextArray).dump(arrays.TextArray(items))
    assert dumped == _array(25, [name.encode() for name in items])


class _CountingName(str):
    """A partition name that counts its encodings."""

    encoded = 0

    def encode(self, *args, **kwargs):
        _CountingName.encoded += 1
        return super().encode(*args, **kwargs)


def test_a_text_array_encodes_each_distinct_name_once():
    """A write sends each batch's partition name once per row of several arrays: 3,000 elements of 3
    names are encoded 3 times, not 3,000. Deterministic: it counts calls, no timing."""
    names = [_CountingName(f"fleet{i:02d}") for i in range(3)]
    _CountingName.encoded = 0
    dumped = arrays._TextArrayDumper(arrays.TextArray).dump(arrays.TextArray(names * 1000))
    assert dumped.count(b"fleet01") == 1000  # every element was sent
    assert _CountingName.encoded == 3


@pytest.mark.parametrize("items", [[1, 1, 2, 2, 3], [0, -1, 2**31 - 1, -2**31], [7]])
def test_an_int4_array_holds_each_value_as_psycopg_packs_it(items):
    """``Int4Array``'s dump, one C array of length words and values, is the array header and then each
    element's length word (4) and big-endian value, as psycopg's int4 binary dumper packs it: the
    set-based write's batch numbers. Deterministic, no server."""
    element = psycopg.types.numeric.Int4BinaryDumper(int)
    dumped = arrays._Int4ArrayDumper(arrays.Int4Array).dump(arrays.Int4Array(items))
    assert dumped == _array(23, [bytes(element.dump(i)) for i in items])


def test_an_int4_array_refuses_a_value_past_int4():
    """A value outside int4 is refused, never sent cut to its low bytes. Deterministic, no server."""
    with pytest.raises((OverflowError, ValueError, struct.error)):
        arrays._Int4ArrayDumper(arrays.Int4Array).dump(arrays.Int4Array([1, 2**31]))

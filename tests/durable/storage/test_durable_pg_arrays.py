"""The PostgreSQL store's array parameters (storage/postgres/arrays.py): the bytes its dumpers send are
psycopg's own binary dump of the same list, and an array without NULL costs no Python bytecode per
element (the store sends a dozen such arrays per chunk of fired timers)."""
from __future__ import annotations

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

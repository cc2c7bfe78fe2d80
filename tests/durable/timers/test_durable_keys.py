"""Timer key encoding: round trips, due order across both layouts, malformed detection, bad input."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.registry import TimerKind

dues = st.integers(0, 2**64 - 1)
kinds = st.integers(1, 255)
refs = st.binary(max_size=12)
attempts = st.integers(1, 2**32 - 1)


@st.composite
def rows(draw):
    if draw(st.booleans()):
        due, kind, ref = draw(dues), draw(kinds), draw(refs)
        return keys.timer(due, kind, ref), (due, kind, 0, due, ref)
    due, kind, att, orig, ref = draw(dues), draw(kinds), draw(attempts), draw(dues), draw(refs)
    return keys.backoff(due, kind, att, orig, ref), (due, kind, att, orig, ref)


@settings(max_examples=300, deadline=None)
@given(st.lists(rows(), min_size=1, max_size=20))
def test_round_trip_and_due_order(items):
    """Both layouts parse back to their fields, and bytes order sorts by effective due time first,
    so one scan covers scheduled and backed-off rows in due order; pure function, cannot flake."""
    for key, (due, kind, att, orig, ref) in items:
        tk = keys.parse(key)
        assert (tk.due_at_ms, tk.kind, tk.attempt, tk.original_due_at_ms, tk.reference) == (due, kind, att, orig, ref)
    ordered = sorted(items, key=lambda kv: kv[0])
    assert [f[0] for _, f in ordered] == sorted(f[0] for _, f in items)


@settings(max_examples=200, deadline=None)
@given(rows(), st.integers(0, 2**64 - 1))
def test_due_range_is_exactly_due_rows(item, now_ms):
    """due_range(now) contains a key iff its effective due <= now; future_range the rest."""
    key, (due, *_rest) = item
    start, end = keys.due_range(now_ms)
    assert (start <= key < end) == (due <= now_ms)
    fstart, fend = keys.future_range(now_ms)
    assert (fstart <= key < fend) == (due > now_ms)


@settings(max_examples=300, deadline=None)
@given(rows(), st.integers(0, 2**64 - 1), st.booleans())
def test_a_first_claims_key_is_the_parsed_rows_next_attempt(item, retry_at_ms, occurrence):
    """scheduled_fields reads a plain timer's scheduled row as parse does (due time, kind, reference),
    and first_claimed_key of those fields is next_attempt of the parsed row at attempt 1: the claim's
    shortcut for the row it meets most makes the key the general path makes. A backed-off row or a
    schedule's occurrence is left to parse (None). Pure functions, cannot flake."""
    key, (due, kind, att, orig, ref) = item
    if occurrence and att == 0:
        key = keys.timer(due, kind, ref, occurrence=True)
    fields = keys.scheduled_fields(key)
    if att or occurrence:
        assert fields is None
        return
    assert fields == (due, kind, ref)
    assert keys.first_claimed_key(*fields, retry_at_ms) == keys.next_attempt(keys.parse(key), retry_at_ms, 1)


@pytest.mark.parametrize(
    "raw",
    [b"T", b"T\x00\x00", b"T" + bytes(8) + b"\x00\x00", b"T" + bytes(8) + b"\x05\x07ref",
     b"T" + bytes(8) + b"\x05\x01\x00\x00", b"T" + bytes(8) + b"\x05\x01" + bytes(12), b"X" + bytes(10), b""],
)
def test_malformed_keys_raise_malformed_key(raw):
    """Short keys, kind 0, unknown variants, attempt 0 and foreign tags raise MalformedKey (a ValueError),
    and the claim's shortcut for scheduled rows reads none of them (it leaves them to parse)."""
    with pytest.raises(keys.MalformedKey) as info:
        keys.parse(raw)
    assert info.value.key == raw and isinstance(info.value, ValueError)
    assert keys.scheduled_fields(raw) is None


def test_bad_input_is_rejected_specifically():
    """Wrong types are TypeErrors, out-of-range values ValueErrors naming the value."""
    for kind in (0, 256, -1):  # one message for every kind out of range, naming the range and the value
        with pytest.raises(ValueError, match=rf"kind must be in 1\.\.255, got {kind}$"):
            keys.timer(1, kind, b"")
    with pytest.raises(ValueError, match="-1"):
        keys.timer(-1, 1, b"")
    with pytest.raises(ValueError, match="due_at_ms"):
        keys.timer(2**64, 1, b"")
    with pytest.raises(TypeError, match="reference"):
        keys.timer(1, 1, "ref")
    with pytest.raises(TypeError, match="due_at_ms"):
        keys.timer(1.5, 1, b"")
    with pytest.raises(TypeError):
        keys.timer(True, 1, b"")
    with pytest.raises(ValueError, match="attempt"):
        keys.backoff(1, 1, 0, 1, b"")
    with pytest.raises(TypeError):
        keys.parse("T")
    assert keys.timer(5, TimerKind(7), b"r") == keys.timer(5, 7, b"r")


@pytest.mark.parametrize("kind", [{}, {"x": 1}, "7", 7.0, None, True, b"\x07"])
def test_kind_of_wrong_type_is_a_type_error_naming_it(kind):
    """A kind that is neither a TimerKind nor an int is a TypeError naming the value, even when it
    has a ``.get`` method (a dict once failed with "get expected at least 1 argument")."""
    for make in (lambda: keys.timer(5, kind, b""), lambda: keys.backoff(5, kind, 1, 5, b"")):
        with pytest.raises(TypeError, match="kind must be a TimerKind or an int") as info:
            make()
        assert repr(kind) in str(info.value)

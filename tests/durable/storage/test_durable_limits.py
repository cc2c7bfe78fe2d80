"""Every limit is checked once, when a row is written, the same on every backend: so any row that can be
written can also be read, claimed, backed off and quarantined, with the longest partition name and the
longest key at once (incompressible bytes, the worst case for PostgreSQL's index entries)."""
from __future__ import annotations

import os

import pytest

from timerwheel_c.durable import Every, Reschedule, add_schedule, get_timer, schedule
from timerwheel_c.durable.storage.store import (MAX_KEY_BYTES, MAX_PARTITION_BYTES, MAX_VALUE_BYTES, Batch, Committed,
                                                Equals, check_partition)
from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerKind, TimerRegistry
from timerwheel_c.durable.timers.runner import run_due

NOW = 1_700_000_000_000
KIND = 0xF0
LONGEST = "\U0001F600" * (MAX_PARTITION_BYTES // 4)  # 256 bytes of UTF-8 in 64 characters


class Fires(TimerHandler):
    kind = TimerKind(KIND)

    def __init__(self):
        self.seen = []

    def fire(self, ctx, timer):
        self.seen.append(timer.reference)
        return Done()


def test_partition_names_over_the_limit_are_refused_alike_on_every_backend(durable_store):
    """A name of 257 UTF-8 bytes is a ValueError naming the limit on every backend (SQLite would store it,
    PostgreSQL's index might not); 256 bytes in 4-byte characters is accepted."""
    assert len(LONGEST.encode()) == MAX_PARTITION_BYTES and check_partition(LONGEST) == LONGEST
    for bad in (LONGEST + "a", "a" * (MAX_PARTITION_BYTES + 1)):
        with pytest.raises(ValueError, match=f"at most {MAX_PARTITION_BYTES} bytes"):
            durable_store.apply(bad, Batch().put(b"k", b"v"))
    assert durable_store.partitions() == []


def test_the_longest_key_in_the_longest_partition_can_be_written_read_and_moved(durable_store):
    """A key of MAX_KEY_BYTES random bytes in a partition of MAX_PARTITION_BYTES: written, read, and moved
    guarded to another key of the same length in one apply_many (what a claim and a quarantine do)."""
    key, other = os.urandom(MAX_KEY_BYTES), os.urandom(MAX_KEY_BYTES)
    value = os.urandom(4096)
    assert durable_store.apply(LONGEST, Batch().put(key, value)) == Committed()
    assert durable_store.get(LONGEST, key) == value
    moved = durable_store.apply_many(LONGEST, [Batch().require(Equals(key, value)).delete(key).put(other, value)])
    assert moved == [Committed()] and durable_store.get(LONGEST, other) == value
    with pytest.raises(ValueError, match=f"at most {MAX_KEY_BYTES} bytes"):
        Batch().put(key + b"x", value)


def test_a_timer_with_the_longest_reference_is_claimed_backed_off_and_fired(durable_store):
    """The longest reference keys.timer accepts has a backed-off key that still fits: the runner claims
    the row (writing that key) and fires it, in the longest partition."""
    reference = os.urandom(keys.MAX_REFERENCE_BYTES)
    durable_store.apply(LONGEST, Batch().put(keys.timer(NOW - 1, KIND, reference), b""))
    handler = Fires()
    report = run_due(durable_store, LONGEST, TimerRegistry().register(handler), NOW)
    assert report.fired == 1 and handler.seen == [reference]
    assert durable_store.scan(LONGEST, *keys.due_range(2**64 - 1)).entries == []


def test_a_timer_key_at_the_store_limit_is_quarantined_not_retried(durable_store):
    """A well-formed-looking timer key of MAX_KEY_BYTES, written through the plain store API, has a
    reference too long to back off: it is malformed, moved once to its quarantine key (as long as the
    key, so it fits) and never scanned again. Likewise a malformed key at the limit."""
    at_limit = keys.timer(NOW - 2, KIND, b"") + os.urandom(MAX_KEY_BYTES - len(keys.timer(0, KIND, b"")))
    garbage = keys.TAG + b"\x00" * 8 + bytes([KIND, 0x07]) + os.urandom(MAX_KEY_BYTES - len(keys.TAG) - 10)
    assert len(at_limit) == len(garbage) == MAX_KEY_BYTES
    for key in (at_limit, garbage):
        durable_store.apply(LONGEST, Batch().put(key, b"?"))
    registry = TimerRegistry().register(Fires())
    report = run_due(durable_store, LONGEST, registry, NOW)
    assert report.malformed == 2 and report.fired == 0
    for key in (at_limit, garbage):
        assert durable_store.get(LONGEST, key) is None
        assert len(keys.quarantine(key)) == MAX_KEY_BYTES and durable_store.get(LONGEST, keys.quarantine(key)) == b"?"
    again = run_due(durable_store, LONGEST, registry, NOW)
    assert (again.malformed, again.scanned) == (0, 0)


def test_a_value_over_the_limit_is_refused_when_written_and_the_longest_is_stored(durable_store):
    """A value of MAX_VALUE_BYTES + 1 is a ValueError naming the limit when the batch is made, before
    any backend sees it; one of MAX_VALUE_BYTES is written and read back whole."""
    with pytest.raises(ValueError, match=f"at most {MAX_VALUE_BYTES:,} bytes, got {MAX_VALUE_BYTES + 1:,}"):
        Batch().put(b"k", bytes(MAX_VALUE_BYTES + 1))
    longest = os.urandom(MAX_VALUE_BYTES)
    assert isinstance(durable_store.apply("p", Batch().put(b"k", longest)), Committed)
    assert durable_store.get("p", b"k") == longest


def test_a_timer_value_is_refused_over_its_limit_and_the_longest_can_be_parked(durable_store):
    """A timer's value (schedule, a schedule's occurrences, a Reschedule outcome) may be at most
    MAX_TIMER_VALUE_BYTES: a parked row adds the longest last error to it and stays within the store's
    limit. One byte more is a ValueError naming the limit, and nothing is written."""
    longest = bytes(keys.MAX_TIMER_VALUE_BYTES)
    too_long = longest + b"x"
    assert len(keys.parked_value("e" * 10 * keys.MAX_ERROR_BYTES, longest)) <= MAX_VALUE_BYTES
    needle = f"at most {keys.MAX_TIMER_VALUE_BYTES:,} bytes"
    with pytest.raises(ValueError, match=needle):
        schedule(durable_store, "p", NOW, KIND, b"r", too_long)
    with pytest.raises(ValueError, match=needle):
        add_schedule(durable_store, "p", "s", Every(60), KIND, too_long)
    with pytest.raises(ValueError, match=needle):
        Reschedule(NOW, too_long)
    assert durable_store.partitions() == []
    schedule(durable_store, "p", NOW, KIND, b"r", longest)
    assert get_timer(durable_store, "p", KIND, b"r").value == longest

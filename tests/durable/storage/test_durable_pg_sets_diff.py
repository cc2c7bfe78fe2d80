"""PostgreSQL's set-based write of many batches at once (``apply_across``, and ``apply_many`` from
``SETS_FROM`` batches) against the contract's own rule, batch by batch: random lists of guarded
batches over a few keys of two partitions, with claim-shaped moves among them (a guard on a row,
its delete, its value put under another key; a RowMove) and outcome-shaped ones (a guard on a row, its delete
among other writes; a RowConsume), give each batch the result, and leave the rows, that
applying the batches one by one in order to a dict gives. Rows are read and moved first, so that
writes find their rows at the places noted (a stale place among them), and by key otherwise.
Needs TIMERWHEEL_C_TEST_PG_DSN."""
from __future__ import annotations

import itertools
import os
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from timerwheel_c.durable.storage.store import Absent, Batch, Committed, Equals, PreconditionFailed, RowConsume, RowMove

pytest.importorskip("psycopg")

PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
pytestmark = pytest.mark.skipif(not PG_DSN, reason="TIMERWHEEL_C_TEST_PG_DSN is not set")

KEYS = [b"k%02d" % i for i in range(64)]
VALUES = [b"v%d" % i for i in range(2)]
PARTS = ["a", "b"]


# Built once: hypothesis caches no sampled_from of a list, and building one per draw (and validating
# it) took a quarter of the time this test spends drawing its examples.
_VALUE = st.sampled_from(VALUES)
_VALUE_OR_NONE = st.one_of(st.none(), _VALUE)
_PART = st.sampled_from(PARTS)


class _Move(RowMove):
    def __init__(self, key: bytes, value: bytes, to: bytes):
        self.key, self.value, self.to = key, value, to


class _Consume(RowConsume):
    def __init__(self, key: bytes, value: bytes, writes: list):
        self.key, self.value, self.writes = key, value, writes


@st.composite
def _batch(draw, keys: list, take: bool) -> Batch:
    """A batch on some of ``keys`` (with ``take``, each drawn key removed from it): a claim's shape (a
    guard on a row, its delete, its value or another put under a second key), an outcome's (a guard on
    a row, its delete among up to three other writes), or up to two guards and three writes."""
    def key() -> bytes:
        # By its index: the one choice sampled_from(keys) makes, with no strategy built per draw.
        i = draw(st.integers(0, len(keys) - 1))
        return keys.pop(i) if take else keys[i]
    shape = draw(st.integers(0, 4))
    if shape == 3:  # a runner's claim of a first attempt: a RowMove, which the store takes from its fields
        return _Move(key(), draw(_VALUE), key())
    if shape == 4:  # a runner's outcome: a RowConsume, its row's delete among up to three other writes
        at, value = key(), draw(_VALUE)
        writes = [(key(), draw(_VALUE_OR_NONE)) for _ in range(draw(st.integers(0, 3)))]
        writes.insert(draw(st.integers(0, len(writes))), (at, None))
        return _Consume(at, value, writes)
    if shape == 0:
        at, to, value = key(), key(), draw(_VALUE)
        return Batch().require(Equals(at, value)).delete(at).put(to, draw(_VALUE))
    if shape == 1:  # an outcome's: a guard on a row, its delete among up to three other writes
        at, value = key(), draw(_VALUE)
        writes: list = []
        for _ in range(draw(st.integers(0, 3))):
            writes.append((key(), draw(_VALUE_OR_NONE)))
        writes.insert(draw(st.integers(0, len(writes))), (at, None))
        batch = Batch().require(Equals(at, value))
        for k, v in writes:
            batch.put(k, v) if v is not None else batch.delete(k)
        return batch
    batch = Batch()
    for _ in range(draw(st.integers(0, 2))):
        k = key()
        batch.require(Absent(k) if draw(st.booleans()) else Equals(k, draw(_VALUE)))
    for _ in range(draw(st.integers(1, 3))):
        k = key()
        value = draw(_VALUE_OR_NONE)
        batch.put(k, value) if value is not None else batch.delete(k)
    return batch


@st.composite
def _items(draw) -> list:
    """8 to 16 ``(partition, batch)`` items, of both partitions or of one. Independent ones (no key of a partition touched by two
    batches, the set-based write's condition) take each key from a pool of their partition's unused
    ones; the others may reuse keys, and a list that does goes batch by batch."""
    independent, mixed = draw(st.booleans()), draw(st.booleans())
    unused = {p: list(KEYS) for p in PARTS}
    items: list = []
    for _ in range(draw(st.integers(8, 16))):
        p = draw(_PART) if mixed else "a"
        if len(unused[p]) < 5:
            break
        items.append((p, draw(_batch(unused[p] if independent else KEYS, independent))))
    return items


# Each key holds a row, of either value, or none: a guard holds about as often as it fails.
_rows = st.lists(st.sampled_from([None, *VALUES]), min_size=len(KEYS), max_size=len(KEYS)).map(
    lambda values: {k: v for k, v in zip(KEYS, values) if v is not None})
_states = st.fixed_dictionaries({p: _rows for p in PARTS})


def _model(rows: dict, batch: Batch):
    """The contract's rule for one batch on ``rows`` (changed in place): every guard judged in order
    on the rows before the batch, the first that fails named and nothing written; else the writes."""
    for guard in batch.guards:
        value = rows.get(guard.key)
        if not (value is None if isinstance(guard, Absent) else value == guard.value):
            return PreconditionFailed(guard.key)
    for key, value in batch.writes:
        if value is None:
            rows.pop(key, None)
        else:
            rows[key] = value
    return Committed()


@pytest.fixture(scope="module")
def store():
    from bench.stores import dispose
    from timerwheel_c.durable.storage.postgres import PostgresStore

    store = PostgresStore(PG_DSN, table=f"timerwheel_setsdiff_{uuid.uuid4().hex[:12]}")
    yield store
    dispose(store)


_run = itertools.count()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(state=_states, items=_items(), across=st.booleans(), stale=st.booleans())
def test_the_set_based_write_gives_each_batch_what_one_by_one_gives(store, state, items, across, stale):
    run = next(_run)
    part = {p: f"{p}{run}" for p in PARTS}  # fresh partitions: the examples share one table
    for p, rows in state.items():
        if rows:
            batch = Batch()
            for key, value in rows.items():
                batch.put(key, value)
            assert store.apply(part[p], batch) == Committed()
    # Their places noted, as a runner's due scan notes them; a stale one when a row moves meanwhile.
    store.scan_many([(part[p], b"k", b"l", None, 100) for p in PARTS])
    if stale and state["a"]:
        key = next(iter(state["a"]))
        store.apply(part["a"], Batch().delete(key).put(b"j", b"x"))
        store.apply(part["a"], Batch().put(key, state["a"][key]).delete(b"j"))
    expected_rows = {p: dict(rows) for p, rows in state.items()}
    expected = [_model(expected_rows[p], batch) for p, batch in items]
    if across:
        got = store.apply_across([(part[p], batch) for p, batch in items])
    else:  # one partition's batches, set-based from SETS_FROM of them
        only = [(p, batch) for p, batch in items if p == "a"]
        expected = [result for (p, _), result in zip(items, expected) if p == "a"]
        expected_rows["b"] = state["b"]
        got = store.apply_many(part["a"], [batch for _, batch in only])
    assert got == expected
    for p in PARTS:
        assert dict(store.scan(part[p], b"", b"\xff", limit=100).entries) == expected_rows[p]

"""PostgreSQL's set-based write of version 17 (``<table>_write_sets``): a row the store read (a due scan)
or moved (a claim) is consumed next at the place it was seen, its ctid, without a descent of the primary
key; a place is only a hint, so a stale one (the row moved since, or another row now there) still
writes the guarded row by key, and a guard that fails still fails alone. A store of version 16 gains
the function when opened, and a new table compares its partitions bytewise (COLLATE "C"). The wake
trigger's condition is the patterns' own test, row for row. Needs TIMERWHEEL_C_TEST_PG_DSN."""
from __future__ import annotations

import os
import uuid

import pytest

from timerwheel_c.durable.storage.store import Absent, Batch, Committed, Equals, KeyPattern, PreconditionFailed, RowConsume, RowMove

psycopg = pytest.importorskip("psycopg")

PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
pytestmark = pytest.mark.skipif(not PG_DSN, reason="TIMERWHEEL_C_TEST_PG_DSN is not set")

DUE = 1_700_000_000_000
NOW = DUE + 60_000
KIND = 0x31
PARTITIONS = ["a", "b", "c"]
N = 12  # timers per partition, more than SETS_FROM in all


@pytest.fixture
def store():
    from pg_tables import counted_store

    with counted_store(PG_DSN, "timerwheel_wsets") as store:
        _refuse_fallback(store)
        yield store


def _refuse_fallback(store) -> None:
    """A list the server refuses is applied again batch by batch (each refused alone), which leaves the
    same rows: here that would hide an error of the set-based write itself, so it fails the test."""
    real = store._apply_in_one_transaction

    def apply(partition, batches, protect):
        assert not protect, "the set-based write failed and the batches went one by one"
        return real(partition, batches, protect)
    store._apply_in_one_transaction = apply


def _key_descents(store) -> int:
    """The scans of the table's primary key so far, as the server counts them (its counters flushed by
    the store's own connection first, then read on it)."""
    conn = store._connection()
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return conn.execute("SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelid = to_regclass(%s)",
                        (f"{store.table}_pkey",)).fetchone()[0]


def _place(store, partition: str, key: bytes):
    row = store._connection().execute(f"SELECT tidsend(ctid) FROM {store.table} WHERE partition = %s AND key = %s",
                                      (partition, key)).fetchone()
    return None if row is None else bytes(row[0])


def _rows(store, partition: str) -> dict:
    return dict(store.scan(partition, b"", b"\xff", limit=1000).entries)


def _fill(store) -> None:
    for p in PARTITIONS:
        store.apply(p, Batch().put(b"other", b"o"))
        for i in range(N):
            store.apply(p, Batch().put(b"k%03d" % i, b"v%d" % i))


def _moves(prefix: bytes, to: bytes) -> list:
    """A claim-shaped batch per row: consume ``prefix``+i, put its value under ``to``+i."""
    return [(p, Batch().require(Equals(prefix + b"%03d" % i, b"v%d" % i)).delete(prefix + b"%03d" % i)
             .put(to + b"%03d" % i, b"v%d" % i)) for p in PARTITIONS for i in range(N)]


def test_rows_read_then_moved_then_deleted_are_found_at_their_places_not_by_key(store):
    """A due scan notes each row's place; the claim-shaped moves of those rows find them there (no scan of
    the primary key per row), and note where each moved row now is (the place the server reports); the
    outcome-shaped writes that consume the moved rows find them there too, deleting them."""
    _fill(store)
    pages = store.scan_many([(p, b"k", b"l", None, 100) for p in PARTITIONS])
    assert [len(page.entries) for page in pages] == [N] * len(PARTITIONS)
    before = _key_descents(store)
    assert store.apply_across(_moves(b"k", b"m")) == [Committed()] * (N * len(PARTITIONS))
    moved = _key_descents(store)
    for p in PARTITIONS:
        for i in range(N):
            assert store._places.by_partition[p][b"m%03d" % i] == _place(store, p, b"m%03d" % i)
    checked = _key_descents(store)  # the checks' own reads by key
    outcomes = [(p, Batch().require(Equals(b"m%03d" % i, b"v%d" % i)).delete(b"m%03d" % i))
                for p in PARTITIONS for i in range(N)]
    assert store.apply_across(outcomes) == [Committed()] * (N * len(PARTITIONS))
    after = _key_descents(store)
    for p in PARTITIONS:
        assert _rows(store, p) == {b"other": b"o"}
    # No scan of the primary key for a row consumed at its place, where a write by key scanned it once
    # per row (a put's ON CONFLICT still probes it for its key, as before).
    assert (moved - before, after - checked) == (0, 0)
    assert not any(store._places.by_partition[p] for p in PARTITIONS)  # every place taken by its write
    # By key (no places noted): a scan per consumed row.
    _fill(store)
    store.apply_across(_moves(b"k", b"n"))
    assert _key_descents(store) - after >= N * len(PARTITIONS)


_READS = [0]  # reads of the guards and writes of the counted batches below


def _counting(prop: property) -> property:
    """``prop`` (a batch's property), counting each read in _READS."""
    def read(self) -> list:
        _READS[0] += 1
        return prop.fget(self)  # type: ignore[misc]
    return property(read)


class _CountedMove(RowMove):
    guards = _counting(RowMove.guards)  # type: ignore[assignment]
    writes = _counting(RowMove.writes)  # type: ignore[assignment]

    def __init__(self, key: bytes, value: bytes, to: bytes):
        self.key, self.value, self.to = key, value, to


class _CountedConsume(RowConsume):
    guards = _counting(RowConsume.guards)  # type: ignore[assignment]

    def __init__(self, key: bytes, value: bytes, writes: list):
        self.key, self.value, self.writes = key, value, writes


def test_row_moves_are_written_from_their_fields_at_their_places(store):
    """A list of RowMoves (a runner's claims of first attempts) goes to the set-based write from each
    move's key, value and target alone, never building its guards and writes, and each row is moved at
    the place the due scan noted (no scan of the primary key per row); a move whose row changed since
    fails alone, the others written."""
    _fill(store)
    store.scan_many([(p, b"k", b"l", None, 100) for p in PARTITIONS])
    store.apply("a", Batch().require(Equals(b"k005", b"v5")).put(b"k005", b"changed"))
    _READS[0] = 0
    before = _key_descents(store)
    moves = [(p, _CountedMove(b"k%03d" % i, b"v%d" % i, b"m%03d" % i)) for p in PARTITIONS for i in range(N)]
    results = store.apply_across(moves)
    descents = _key_descents(store) - before
    assert results == [PreconditionFailed(b"k005") if (p, m.key) == ("a", b"k005") else Committed() for p, m in moves]
    assert _READS[0] == 0
    # Each moved at its place: the one failed move is then tried by key (a place is only a hint).
    assert descents <= 1, descents
    for p in PARTITIONS:
        kept = {b"k005": b"changed"} if p == "a" else {}
        assert _rows(store, p) == {b"other": b"o", **kept,
                                   **{b"m%03d" % i: b"v%d" % i for i in range(N) if (p, i) != ("a", 5)}}


def test_row_consumes_are_written_from_their_fields_at_their_places(store):
    """A list of RowConsumes (a runner's outcomes) goes to the set-based write from each consumed row's
    key and value and the writes, never building its guard, each row consumed at the place its claim
    left it (no scan of the primary key per row: one read per partition of the range of its other
    deletes), a put of the consumed value moving the row there; one whose row changed fails alone."""
    _fill(store)
    store.scan_many([(p, b"k", b"l", None, 100) for p in PARTITIONS])
    assert store.apply_across(_moves(b"k", b"m")) == [Committed()] * (N * len(PARTITIONS))
    _READS[0] = 0
    assert store.apply_across([("a", _CountedConsume(b"m003", b"other", [(b"e003", b"x"), (b"m003", None)]))] +
                              [("b", _CountedConsume(b"m%03d" % i, b"wrong", [(b"m%03d" % i, None)])) for i in range(8)]) == \
        [PreconditionFailed(b"m003")] + [PreconditionFailed(b"m%03d" % i) for i in range(8)]
    items = [(p, _CountedConsume(b"m%03d" % i, b"v%d" % i, [(b"e%03d" % i, b"v%d" % i), (b"m%03d" % i, None),
                                                           (b"i%03d" % i, None)])) for p in PARTITIONS for i in range(N)]
    before = _key_descents(store)
    assert store.apply_across(items) == [Committed()] * len(items)
    descents = _key_descents(store) - before
    assert _READS[0] == 0
    # One range read per partition, and by key the nine rows whose places the failed consumes took.
    assert descents == len(PARTITIONS) + 9, descents
    for p in PARTITIONS:
        assert _rows(store, p) == {b"other": b"o", **{b"e%03d" % i: b"v%d" % i for i in range(N)}}


def test_the_other_deletes_read_each_partitions_range_once_when_it_holds_few_rows(store):
    """Outcome-shaped batches: each consumes its row and deletes two more keys, one that holds a row
    and one that never did (an identity row, a trace context). In a partition whose range of keys to
    delete holds few other rows, one read of that range finds them all (the present ones deleted at
    their places, no descent per absent key); a partition whose range holds many other rows is deleted
    key by key. Either way the rows left are those a delete per key leaves."""
    _fill(store)
    for p in PARTITIONS:
        store.apply(p, Batch().put(b"i", b"x"))  # within each range, deleted by no one
        for i in range(N):
            store.apply(p, Batch().put(b"j%03d" % i, b"here"))
    crowded = PARTITIONS[-1]
    for i in range(4 * N):  # rows of other names between its keys to delete, more than the bound
        store.apply(crowded, Batch().put(b"i%05d" % i, b"other"))
    store.scan_many([(p, b"k", b"l", None, 100) for p in PARTITIONS])
    items = [(p, Batch().require(Equals(b"k%03d" % i, b"v%d" % i)).delete(b"k%03d" % i).delete(b"j%03d" % i)
              .delete(b"h%03d" % i)) for p in PARTITIONS for i in range(N)]
    before = _key_descents(store)
    assert store.apply_across(items) == [Committed()] * (N * len(PARTITIONS))
    descents = _key_descents(store) - before
    for p in PARTITIONS:
        others = {b"i%05d" % i: b"other" for i in range(4 * N)} if p == crowded else {}
        assert _rows(store, p) == {b"other": b"o", b"i": b"x", **others}
    # one read per partition, and for the crowded one a descent per key to delete (2 N), none per row elsewhere
    assert descents == len(PARTITIONS) + 2 * N, descents


def test_a_stale_place_is_only_a_hint(store):
    """Places that no longer hold the guarded row: the row moved away and back (a new version elsewhere),
    another row now at that place, a place past the table's end. The writes find each guarded row by key
    all the same; a batch whose guard fails there fails alone, naming its key; nothing else is written."""
    _fill(store)
    store.scan_many([(p, b"k", b"l", None, 100) for p in PARTITIONS])
    places = store._places.by_partition
    for p in PARTITIONS:
        store.apply(p, Batch().require(Equals(b"k000", b"v0")).delete(b"k000").put(b"t000", b"v0"))
        store.apply(p, Batch().require(Equals(b"t000", b"v0")).delete(b"t000").put(b"k000", b"v0"))  # back, elsewhere
        places[p][b"k001"] = places[p][b"k002"]  # another row's place
        places[p][b"k003"] = b"\x00\x01\x00\x00\x00\x01"  # a block past the end
        store.apply(p, Batch().put(b"k004", b"changed"))  # its guard now fails
    results = store.apply_across(_moves(b"k", b"m"))
    assert results == [PreconditionFailed(b"k004") if i == 4 else Committed() for p in PARTITIONS for i in range(N)]
    for p in PARTITIONS:
        assert _rows(store, p) == {b"other": b"o", b"k004": b"changed",
                                   **{b"m%03d" % i: b"v%d" % i for i in range(N) if i != 4}}


def test_moves_at_their_places_to_keys_that_hold_rows_overwrite_them(store):
    """A move's key is taken on trust; where one holds a row, the call runs again probing each move's key
    (see version 13): the rows found at their places move where the key is free, and are deleted and put
    over the row where it is not, as the batch-by-batch loop leaves them."""
    _fill(store)
    for p in PARTITIONS:
        store.apply(p, Batch().put(b"m003", b"old").put(b"m007", b"old"))
    store.scan_many([(p, b"k", b"l", None, 100) for p in PARTITIONS])
    assert store.apply_across(_moves(b"k", b"m")) == [Committed()] * (N * len(PARTITIONS))
    for p in PARTITIONS:
        assert _rows(store, p) == {b"other": b"o", **{b"m%03d" % i: b"v%d" % i for i in range(N)}}


def test_a_failed_batch_leaves_the_others_written_with_their_deletes_and_puts(store):
    """The general path of a call in which some batch fails (a guard besides the consumed row's, or the
    consumed row's own): the batches that held do all their writes (the move, a delete, a put), the others
    none, each naming its first failed guard."""
    _fill(store)
    store.scan_many([(p, b"k", b"l", None, 100) for p in PARTITIONS])
    items = []
    for p in PARTITIONS:
        for i in range(N):
            batch = Batch()
            if i == 2:
                batch.require(Absent(b"other"))  # fails: the row is there
            batch.require(Equals(b"k%03d" % i, b"v%d" % i if i != 5 else b"wrong"))
            batch.delete(b"k%03d" % i).put(b"m%03d" % i, b"v%d" % i if i != 5 else b"wrong")
            batch.put(b"x%03d" % i, b"x").delete(b"gone%03d" % i)
            items.append((p, batch))
    for p in PARTITIONS:
        store.apply(p, Batch().put(b"gone%03d" % 7, b"g"))
    results = store.apply_across(items)
    expect = {2: PreconditionFailed(b"other"), 5: PreconditionFailed(b"k005")}
    assert results == [expect.get(i, Committed()) for p in PARTITIONS for i in range(N)]
    for p in PARTITIONS:
        written = {b"m%03d" % i: b"v%d" % i for i in range(N) if i not in expect}
        written.update({b"x%03d" % i: b"x" for i in range(N) if i not in expect})
        kept = {b"k%03d" % i: b"v%d" % i for i in expect}
        assert _rows(store, p) == {b"other": b"o", **written, **kept}


def test_a_store_of_version_16_gains_the_write_by_place_when_opened(store):
    """A store recorded at version 16, without version 17's functions, is brought to the current version
    by its next open, under the schema lock, and claims and outcomes over several partitions then fire
    every timer once."""
    from psycopg import sql

    from timerwheel_c.durable.storage.postgres import SCHEMA_VERSION, PostgresStore
    from timerwheel_c.durable.timers.registry import Done, TimerRegistry
    from timerwheel_c.durable.timers.runner import RunReport, claim_due_across, commit_across, fire
    from timerwheel_c.durable.timers.tick import TickBudget
    from timerwheel_c.durable.timers.writer import schedule

    for p in PARTITIONS:
        for i in range(N):
            schedule(store, p, DUE + i, KIND, b"r%03d" % i, b"v")
    conn = store._connection()
    conn.execute(sql.SQL("DROP FUNCTION {}").format(store._names["write_sets_at"]))
    conn.execute(sql.SQL("DROP FUNCTION {}").format(store._names["write_sets"]))
    conn.execute(f"UPDATE {store.table}_meta SET value = '16' WHERE name = 'schema_version'")
    upgraded = PostgresStore(PG_DSN, table=store.table)
    _refuse_fallback(upgraded)
    try:
        conn = upgraded._connection()
        assert conn.execute(f"SELECT value FROM {store.table}_meta WHERE name = 'schema_version'").fetchone()[0] == str(
            SCHEMA_VERSION)
        assert conn.execute("SELECT to_regproc(%s) IS NOT NULL", (f"{store.table}_write_sets_at",)).fetchone()[0]
        registry = TimerRegistry()
        registry.handler(KIND)(lambda ctx, timer: Done())
        budget = TickBudget(1000, 1000, 1000, 60_000)
        claims = claim_due_across(upgraded, [(p, budget, None) for p in PARTITIONS], registry, NOW)
        assert [len(c.timers) for c in claims] == [N] * len(PARTITIONS)
        settled = {p: [(c, fire(upgraded, p, NOW, c, RunReport())) for c in cl.timers] for p, cl in zip(PARTITIONS, claims)}
        assert sum(r.fired for r in commit_across(upgraded, settled).values()) == N * len(PARTITIONS)
        for p in PARTITIONS:
            assert _rows(upgraded, p) == {}
    finally:
        upgraded.close()


def test_a_table_made_before_version_17_keeps_its_collation():
    """A table created by an earlier version (its partitions in the database's collation) is brought to
    the current version without a rewrite of its key: the collation stays, and the store reads and writes
    by place and by key as any other."""
    from bench.stores import dispose
    from timerwheel_c.durable.storage.postgres import PostgresStore

    table = f"timerwheel_wsets_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_DSN, autocommit=True) as conn:  # the table as versions 1 to 16 create it
        conn.execute(f"CREATE TABLE {table} (partition text NOT NULL, key bytea NOT NULL, value bytea NOT NULL, "
                     "PRIMARY KEY (partition, key))")
    store = PostgresStore(PG_DSN, table=table)
    _refuse_fallback(store)
    try:
        assert _collation(store) == "default"
        _fill(store)
        store.scan_many([(p, b"k", b"l", None, 100) for p in PARTITIONS])
        assert store.apply_across(_moves(b"k", b"m")) == [Committed()] * (N * len(PARTITIONS))
        for p in PARTITIONS:
            assert _rows(store, p) == {b"other": b"o", **{b"m%03d" % i: b"v%d" % i for i in range(N)}}
    finally:
        dispose(store)


def _collation(store) -> str:
    return store._connection().execute(
        "SELECT coalesce(c.collname, 'default') FROM pg_attribute a LEFT JOIN pg_collation c ON c.oid = a.attcollation "
        "AND a.attcollation <> 100 WHERE a.attrelid = to_regclass(%s) AND a.attname = 'partition'", (store.table,)).fetchone()[0]


def test_a_new_table_compares_its_partitions_bytewise(store):
    """Created at version 17: the partition column is COLLATE "C", so partitions list in Python's str order
    (code point order, which bytewise UTF-8 keeps), as SQLite's BINARY lists them."""
    assert _collation(store) == "C"
    names = ["b", "B", "a", "Z", "é", "e", "_", "a b", "ab"]
    for name in names:
        store.apply(name, Batch().put(b"k", b"v"))
    assert store.partitions() == sorted(names)


@pytest.mark.parametrize("patterns", [
    [KeyPattern(b"\x00T", 11, 0), KeyPattern(b"\x00T", 11, 2), KeyPattern(b"\x00S")],
    [KeyPattern(b"a\xff"), KeyPattern(b"\xff\xff", 1, 0xff), KeyPattern(b"", 0, 7), KeyPattern(b"", 3, 0)],
    [KeyPattern(b"")],
])
def test_the_wake_triggers_condition_is_the_patterns_own_test(store, patterns):
    """The trigger's WHEN (ranges of keys and get_byte behind a length check) holds for exactly the keys
    KeyPattern.matches accepts: prefixes that end in 0xff or are all 0xff, a position at or past a key's
    end, the empty prefix; evaluated by the server for keys of every length around the positions."""
    from timerwheel_c.durable.storage.postgres.store import when_clause

    keys = [b"", b"\x00", b"\x07", b"\xff", b"\xff\xff", b"\xff\xff\xff", b"\xff\xfe\xff", b"a", b"a\xff", b"a\xff\x00",
            b"b", b"\x00S", b"\x00S1", b"\x00T", b"\x00U", b"\x07\x00\x00\x00", b"\x07\x00\x00\x01"]
    keys += [b"\x00T" + bytes(9) + bytes([v]) + rest for v in (0, 1, 2, 3) for rest in (b"", b"r")]
    keys += [b"\x00T" + bytes(8)]
    conn = store._connection()
    condition = when_clause(patterns).as_string(conn).replace("NEW.key", "k")
    got = conn.execute(f"SELECT k, {condition} FROM unnest(%s::bytea[]) AS k", (keys,)).fetchall()
    assert [(bytes(k), bool(hit)) for k, hit in got] == [(k, any(p.matches(k) for p in patterns)) for k in keys]


def test_places_are_forgotten_all_at_once_past_their_limit(monkeypatch):
    """Places noted and never taken (rows read, then not claimed) are bounded: past LIMIT notes, every
    place noted so far is forgotten, and noting starts over with the new ones."""
    from timerwheel_c.durable.storage.postgres.store import _Places

    monkeypatch.setattr(_Places, "LIMIT", 10)
    places = _Places()
    places.note("a", [b"k1", b"k2"], [b"\x00" * 6, b"\x01" * 6])
    places.note_moved(["a", "b"], [b"m1", b"m2"], [2], [b"\x02" * 6])
    assert places.take("a", b"k2") == b"\x01" * 6 and places.take("a", b"k2") is None
    assert places.take("b", b"m2") == b"\x02" * 6 and places.take("c", b"m2") is None
    places.note("a", [b"x%d" % i for i in range(8)], [b"\x03" * 6] * 8)  # 11 noted: all before forgotten
    assert places.take("a", b"k1") is None and places.take("a", b"x7") == b"\x03" * 6
    assert places.count == 8

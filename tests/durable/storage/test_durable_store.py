"""The store contract: every backend (the ``durable_store`` fixture's params) must pass all of it."""
from __future__ import annotations

import os
import re
import sqlite3
import threading

import pytest

from timerwheel_c.durable.storage.errors import PermanentStoreError
from timerwheel_c.durable.storage.sqlite import SQLiteStore
from timerwheel_c.durable.storage.store import (COMMITTED, Absent, Batch, Committed, Equals, Page, PreconditionFailed,
                                                 RowConsume, RowMove, SchemaVersionError)

P = "p"


def put_all(store, items, partition=P):
    batch = Batch()
    for k, v in items:
        batch.put(k, v)
    assert store.apply(partition, batch) == Committed()


def test_get_put_delete(durable_store):
    """A put is visible to get, a delete removes it, a missing key reads None; deterministic."""
    assert durable_store.get(P, b"a") is None
    put_all(durable_store, [(b"a", b"1")])
    assert durable_store.get(P, b"a") == b"1"
    assert durable_store.apply(P, Batch().delete(b"a")) == Committed()
    assert durable_store.get(P, b"a") is None
    assert durable_store.apply(P, Batch().delete(b"missing")) == Committed()


def test_get_through_reads_a_row_and_the_row_its_value_names(durable_store):
    """get_through(P, key): (the value at key, the value of the row of P whose key that value is), each
    None when missing, never a row of another partition; the same through own_write. Deterministic."""
    put_all(durable_store, [(b"name", b"row"), (b"row", b"v"), (b"dangling", b"gone"), (b"empty", b""), (b"", b"root")])
    put_all(durable_store, [(b"gone", b"of another partition")], partition="q")
    cases = {b"name": (b"row", b"v"), b"dangling": (b"gone", None), b"missing": (None, None), b"empty": (b"", b"root")}
    assert {key: durable_store.get_through(P, key) for key in cases} == cases
    with durable_store.own_write(P) as tx:
        assert {key: tx.get_through(key) for key in cases} == cases
    with pytest.raises(TypeError, match="key"):
        durable_store.get_through(P, "name")


def test_a_closed_store_raises_on_every_call_and_opens_no_session(durable_store):
    """After close() every call raises PermanentStoreError and nothing is written: a closed
    PostgresStore used to open a new session and commit on it, a session nothing closed."""
    from timerwheel_c.durable.timers.writer import schedule

    put_all(durable_store, [(b"a", b"1")])
    durable_store.close()
    calls = [lambda: durable_store.get(P, b"a"), lambda: durable_store.get_through(P, b"a"),
             lambda: durable_store.scan(P, b"", b"\xff"), lambda: durable_store.apply(P, Batch().put(b"b", b"2")),
             lambda: schedule(durable_store, P, 2_000_000_000_000, 1, b"after-close")]
    if hasattr(durable_store, "new_connection"):  # PostgreSQL's LISTEN session
        calls.append(lambda: durable_store.watch(lambda: None))
    for call in calls:
        with pytest.raises(PermanentStoreError):
            call()
    durable_store.close()  # closing again is allowed
    if hasattr(durable_store, "async_pools"):
        with pytest.raises(PermanentStoreError, match="closed"):
            durable_store.async_pools()


def test_scan_order_bounds_and_paging(durable_store):
    """scan returns start <= key < end, key > after, in bytes order, paged by limit with .next; deterministic."""
    items = [(bytes([i]) + b"x" * (i % 3), bytes([i])) for i in range(0, 40)] + [(b"", b"empty"), (b"\xff\xff", b"top")]
    put_all(durable_store, items)
    want = sorted(k for k, _ in items if b"\x05" <= k < b"\x20")
    got, after = [], None
    while True:
        page = durable_store.scan(P, b"\x05", b"\x20", after, limit=7)
        assert isinstance(page, Page) and len(page.entries) <= 7
        got.extend(k for k, _ in page.entries)
        if page.next is None:
            break
        assert page.next == page.entries[-1][0]
        after = page.next
    assert got == want
    # exact fit: a page that ends the range has next None
    assert durable_store.scan(P, b"", b"\x00", None, limit=1).next is None
    assert durable_store.scan(P, b"", b"\x00", None, limit=1).entries == [(b"", b"empty")]
    # after below start does not widen the range; after inside skips
    assert [k for k, _ in durable_store.scan(P, b"\x05", b"\x07", b"\x01").entries] == [b"\x05xx", b"\x06"]
    assert [k for k, _ in durable_store.scan(P, b"\x05", b"\x07", b"\x05xx").entries] == [b"\x06"]
    # bytes order, not length order: b"\x06" < b"\x06\x00"
    put_all(durable_store, [(b"\x06\x00", b"")])
    assert [k for k, _ in durable_store.scan(P, b"\x06", b"\x07").entries] == [b"\x06", b"\x06\x00"]


def test_partitions_are_isolated(durable_store):
    """Keys, scans and guards of one partition never see another's; partitions() lists the non-empty ones."""
    put_all(durable_store, [(b"k", b"a")], "one")
    put_all(durable_store, [(b"k", b"b")], "two")
    assert durable_store.get("one", b"k") == b"a" and durable_store.get("two", b"k") == b"b"
    assert durable_store.scan("three", b"", b"\xff").entries == []
    assert durable_store.apply("three", Batch().require(Absent(b"k")).put(b"k", b"c")) == Committed()
    assert durable_store.partitions() == ["one", "three", "two"]


def test_guards_all_or_nothing(durable_store):
    """A failing guard writes nothing and names its key; passing guards commit every write; deterministic."""
    put_all(durable_store, [(b"a", b"1"), (b"b", b"2")])
    batch = Batch().require(Equals(b"a", b"1")).require(Absent(b"b")).put(b"c", b"3").delete(b"a")
    assert durable_store.apply(P, batch) == PreconditionFailed(b"b")
    assert durable_store.get(P, b"c") is None and durable_store.get(P, b"a") == b"1"
    assert durable_store.apply(P, Batch().require(Equals(b"a", b"other"))) == PreconditionFailed(b"a")
    assert durable_store.apply(P, Batch().require(Equals(b"zz", b""))) == PreconditionFailed(b"zz")
    ok = Batch().require(Equals(b"a", b"1")).require(Absent(b"c")).put(b"c", b"3").delete(b"a").put(b"b", b"9")
    assert durable_store.apply(P, ok) == Committed()
    assert [(k, v) for k, v in durable_store.scan(P, b"", b"\xff").entries] == [(b"b", b"9"), (b"c", b"3")]


def test_guarded_delete_then_rewrite_and_repeated_guards(durable_store):
    """Guards on a key the batch deletes first and then rewrites, and two guards on one key, behave
    exactly as "all guards first, then all writes in order"; a later failing guard undoes it all."""
    put_all(durable_store, [(b"k", b"1"), (b"j", b"2")])
    b = Batch().require(Equals(b"k", b"1")).require(Equals(b"k", b"1")).delete(b"k").put(b"k", b"3")
    assert durable_store.apply(P, b) == Committed() and durable_store.get(P, b"k") == b"3"
    assert durable_store.apply(P, Batch().require(Equals(b"k", b"3")).require(Equals(b"k", b"9")).delete(b"k")) \
        == PreconditionFailed(b"k")
    assert durable_store.apply(P, Batch().require(Equals(b"k", b"3")).require(Absent(b"k")).delete(b"k")) \
        == PreconditionFailed(b"k")
    b = Batch().require(Equals(b"k", b"3")).require(Equals(b"j", b"wrong")).delete(b"k")
    assert durable_store.apply(P, b) == PreconditionFailed(b"j") and durable_store.get(P, b"k") == b"3"
    assert durable_store.apply(P, Batch().require(Equals(b"k", b"3")).delete(b"k").delete(b"k")) == Committed()
    assert durable_store.get(P, b"k") is None


def test_one_guard_rule_through_apply_and_apply_many(durable_store):
    """The conditional-delete shortcut (store.consumed_write) applies to the last guard only, when it is
    Equals and the key's first write deletes it; the same batches give the same results whether applied
    one by one or in one apply_many, on every backend."""
    from timerwheel_c.durable.storage.store import consumed_write

    assert consumed_write(Batch().require(Absent(b"x")).require(Equals(b"k", b"1")).put(b"y", b"").delete(b"k")) == 1
    assert consumed_write(Batch().require(Equals(b"k", b"1")).require(Absent(b"x")).delete(b"k")) == -1
    assert consumed_write(Batch().require(Equals(b"k", b"1")).put(b"k", b"2").delete(b"k")) == -1
    assert consumed_write(Batch().delete(b"k")) == -1

    def batches():
        return [
            Batch().require(Equals(b"k", b"1")).require(Absent(b"x")).delete(b"k"),  # shortcut not taken
            Batch().require(Absent(b"x")).require(Equals(b"k", b"1")).put(b"y", b"1").delete(b"k"),  # gone already
            Batch().require(Equals(b"j", b"2")).require(Equals(b"j", b"2")).delete(b"j").put(b"j", b"3"),
            Batch().require(Equals(b"j", b"3")).require(Absent(b"j")).delete(b"j"),
        ]

    expected = [Committed(), PreconditionFailed(b"k"), Committed(), PreconditionFailed(b"j")]
    put_all(durable_store, [(b"k", b"1"), (b"j", b"2")])
    assert [durable_store.apply(P, b) for b in batches()] == expected
    one_by_one = dict(durable_store.scan(P, b"", b"\xff").entries)
    durable_store.apply(P, Batch().delete(b"j").delete(b"k").delete(b"y"))
    put_all(durable_store, [(b"k", b"1"), (b"j", b"2")])
    assert durable_store.apply_many(P, batches()) == expected
    assert dict(durable_store.scan(P, b"", b"\xff").entries) == one_by_one == {b"j": b"3"}


def test_writes_apply_in_order(durable_store):
    """Later writes to the same key win inside one batch."""
    assert durable_store.apply(P, Batch().put(b"k", b"1").delete(b"k").put(b"k", b"2")) == Committed()
    assert durable_store.get(P, b"k") == b"2"
    assert durable_store.apply(P, Batch().put(b"j", b"1").delete(b"j")) == Committed()
    assert durable_store.get(P, b"j") is None


def test_compare_and_set_is_atomic_across_threads(durable_store):
    """8 threads each do 50 guarded increments with retry; the final count is exactly 400 only if
    guard checks and writes are atomic. Cannot flake: retries make progress, the count is exact."""
    put_all(durable_store, [(b"n", b"0")])

    def worker():
        for _ in range(50):
            while True:
                cur = durable_store.get(P, b"n")
                nxt = str(int(cur) + 1).encode()
                if durable_store.apply(P, Batch().require(Equals(b"n", cur)).put(b"n", nxt)) == Committed():
                    break

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert durable_store.get(P, b"n") == b"400"


def test_apply_many_guards_each_batch_on_its_own(durable_store):
    """apply_many returns one result per batch; a failed guard fails (and writes nothing of) only its
    own batch, in whichever position; later batches see earlier committed writes; deterministic."""
    put_all(durable_store, [(b"a", b"1"), (b"b", b"2")])
    batches = [
        Batch().require(Equals(b"a", b"1")).delete(b"a").put(b"a2", b"1"),
        Batch().require(Absent(b"b")).put(b"lost", b"x").delete(b"b"),
        Batch().require(Equals(b"a2", b"1")).put(b"seen", b"yes"),
        Batch().require(Equals(b"a", b"1")).put(b"lost2", b"x"),
        Batch().put(b"plain", b"p"),
    ]
    assert durable_store.apply_many(P, batches) == [
        Committed(), PreconditionFailed(b"b"), Committed(), PreconditionFailed(b"a"), Committed()]
    rows = dict(durable_store.scan(P, b"", b"\xff", limit=100).entries)
    assert rows == {b"a2": b"1", b"b": b"2", b"seen": b"yes", b"plain": b"p"}
    assert durable_store.apply_many(P, []) == []



def test_committed_batches_share_one_result(durable_store):
    """Every committed batch's result, from apply, apply_many and apply_across, is the one shared
    COMMITTED: a result that holds nothing costs the cyclic collector no object per batch (a runner
    commits two per fired timer); deterministic."""
    results = [durable_store.apply(P, Batch().put(b"a", b"1"))]
    results += durable_store.apply_many(P, [Batch().put(b"b", b"2"), Batch().require(Equals(b"b", b"2")).delete(b"b")])
    results += durable_store.apply_across([(P, Batch().require(Equals(b"a", b"1")).delete(b"a")),
                                           ("q", Batch().put(b"c", b"3"))])
    assert len(results) == 5
    assert all(result is COMMITTED for result in results), results


def test_sqlite_apply_many_runs_its_statements_on_one_cursor(tmp_path):
    """An apply_many of many batches leaves the connection no weak reference per statement: each
    ``Connection.execute`` makes a cursor of its own and registers it with the connection, a few of the
    collector's objects per batch, while one cursor serves the whole call. sqlite3 drops the
    references of dead cursors only every 200 cursors made, and a fresh store has made a few dozen:
    40 batches of four statements each (savepoint, guard, write, release) on cursors of their own
    would leave 160 behind; deterministic. The list of those references is found as the one holding
    a probe cursor's: the connection shows it to the collector only from Python 3.10 on, and on 3.10
    beside a list of its statements' references, which grows by each statement first prepared."""
    import gc
    import weakref

    store = SQLiteStore(str(tmp_path / "s.db"))
    try:
        probe = store._db.cursor()
        probe_refs = weakref.getweakrefs(probe)
        cursor_refs = [r for r in gc.get_referrers(*probe_refs) if isinstance(r, list) and r is not probe_refs]
        assert len(cursor_refs) == 1, "the connection's list of its cursors' references is found"
        before = sum(len(r) for r in cursor_refs)
        batches = [Batch().require(Absent(b"k%d" % i)).put(b"k%d" % i, b"v") for i in range(40)]
        assert store.apply_many(P, batches) == [Committed()] * 40
        assert sum(len(r) for r in cursor_refs) - before <= 1
    finally:
        store.close()

def _random_batches(rng, keys: list, n: int) -> list:
    """``n`` random batches over ``keys``: guards of every kind (an Equals that holds or not, Absent),
    often in the shape of a claim or an outcome (the last guard Equals(K, V) consumed by K's delete)."""
    out = []
    for _ in range(n):
        batch = Batch()
        for _ in range(rng.randrange(3)):
            k = rng.choice(keys)
            batch.require(Absent(k) if rng.random() < 0.4 else Equals(k, rng.choice([b"0", b"1"])))
        consume = rng.random() < 0.5
        if consume:
            k = rng.choice(keys)
            batch.require(Equals(k, rng.choice([b"0", b"1"]))).delete(k)
        for _ in range(rng.randrange(4)):
            k = rng.choice(keys)
            batch.put(k, rng.choice([b"0", b"1"])) if rng.random() < 0.7 else batch.delete(k)
        out.append(batch)
    return out


def test_own_write_judges_each_guard_on_the_rows_as_they_stand(durable_store):
    """Inside one ``own_write`` block a guard holds only on the row as it stands: a guard on a value
    other than the one read fails, and once a batch has written, a guard on what was read before it
    is judged on the written row (a backend may judge a guard on its own earlier read only while no
    write of its own came between)."""
    with durable_store.own_write(P) as tx:
        assert tx.get(b"k") is None
        assert isinstance(tx.apply(Batch().require(Equals(b"k", b"other")).put(b"x", b"1")), PreconditionFailed)
        assert tx.apply(Batch().require(Absent(b"k")).put(b"k", b"1")) == COMMITTED
        assert isinstance(tx.apply(Batch().require(Absent(b"k")).put(b"k", b"2")), PreconditionFailed)
        assert tx.get(b"k") == b"1"
        assert tx.apply(Batch().require(Equals(b"k", b"1")).require(Absent(b"x")).put(b"k", b"3")) == COMMITTED
        assert isinstance(tx.apply(Batch().require(Equals(b"k", b"1")).put(b"k", b"4")), PreconditionFailed)
    assert durable_store.get(P, b"k") == b"3" and durable_store.get(P, b"x") is None


def test_sqlite_own_write_judges_a_guard_on_a_row_it_read_without_reading_it_again(tmp_path):
    """SQLite's ``own_write`` holds the file's write lock from ``BEGIN IMMEDIATE``, so a row it read
    stays as read until its own batch writes: a guard on that row costs no second statement (a
    re-arm by name's whole sequence of statements: the test below)."""
    store = SQLiteStore(tmp_path / "timers.db")
    try:
        statements: list = []
        store._db.set_trace_callback(statements.append)
        with store.own_write(P) as tx:
            tx.get(b"a")
            assert tx.apply(Batch().require(Absent(b"a")).put(b"a", b"1")) == COMMITTED
            assert isinstance(tx.apply(Batch().require(Absent(b"a")).put(b"a", b"2")), PreconditionFailed)
        reads = [s for s in statements if s.startswith("SELECT value FROM timerwheel_kv")]
        assert len(reads) == 2, statements  # the first guard judged on the read, the second read again
    finally:
        store.close()


def test_a_sqlite_rearm_by_name_is_one_read_and_two_writing_calls(tmp_path):
    """A re-arm by name on the store's own connection: ``BEGIN IMMEDIATE``, one read (the name's row,
    the timer's row it names and the shard count, in one statement), the deletes of the timer's row
    and of its trace context's in one call, the puts of the new timer row and of the name's row in
    another, ``COMMIT``: no read of its own for the count (PRAGMA data_version), and no guarded
    delete, its guard judged on the row read under the write lock. The name still maps to one timer."""
    from timerwheel_c.durable import get_timer, schedule
    from timerwheel_c.durable.timers import keys

    store = SQLiteStore(tmp_path / "timers.db")
    try:
        schedule(store, P, 2_000_000_000_000, 2, b"ref")
        calls: list = []
        store._db.set_trace_callback(calls.append)
        schedule(store, P, 2_000_000_000_001, 2, b"ref")
        store._db.set_trace_callback(None)
        assert [s.split()[0] for s in calls] == ["BEGIN", "SELECT", "DELETE", "DELETE", "INSERT", "INSERT", "COMMIT"], calls
        assert "timerwheel_meta" in calls[1] and not [s for s in calls if "data_version" in s or "value = x" in s]
        assert get_timer(store, P, 2, b"ref").due_at_ms == 2_000_000_000_001
        timer_rows = store.scan(P, *keys.timer_range(), limit=10).entries
        assert [key for key, _ in timer_rows] == [keys.timer(2_000_000_000_001, 2, b"ref")]
    finally:
        store.close()


def test_sqlite_put_over_a_stored_key_rewrites_its_value_and_leaves_the_shard_index_alone(tmp_path):
    """A put over a stored key (a re-arm's identity row, a rewritten effect row) sets the value: its
    program deletes nothing from the shard index, where INSERT OR REPLACE deleted the row from it and
    inserted it again. The row reads back with its new value."""
    from timerwheel_c.durable.storage.sqlite.rows import QUERIES

    store = SQLiteStore(tmp_path / "timers.db")
    try:
        ops = [row[1] for row in store._db.execute("EXPLAIN " + QUERIES["put"], (P, b"k", b"v", 0))]
        assert "IdxDelete" not in ops
        put_all(store, [(b"\x00Tk", b"1")])  # a key the index by shard holds (SHARD_SPACE)
        put_all(store, [(b"\x00Tk", b"2")])
        assert store.get(P, b"\x00Tk") == b"2"
        assert store._db.execute("SELECT count(*) FROM timerwheel_kv INDEXED BY timerwheel_kv_shard WHERE shard >= 0 "
                                 "AND substr(key, 1, 2) >= x'0050' AND substr(key, 1, 2) < x'0055'").fetchone()[0] == 1
    finally:
        store.close()


@pytest.mark.parametrize("backend, index_version, reads, bounds", [
    ("sqlite", 14, ("scan_shard", "occupied_shards", "first_in_shards"),
     r"substr\(key, 1, 2\) >= x'([0-9a-f]+)' AND substr\(key, 1, 2\) < x'([0-9a-f]+)'"),
    ("postgres", 16, ("scan_shards",), r"key >= '\\x([0-9a-f]+)'::bytea AND key < '\\x([0-9a-f]+)'::bytea"),
], ids=["sqlite", "postgres"])
def test_the_partial_index_by_shard_and_its_reads_spell_shard_space(backend, index_version, reads, bounds):
    """The partial index by shard and every read by shard within SHARD_SPACE repeat its bounds as SQL
    literals (a planner uses a partial index only for a statement whose WHERE implies its terms), so a
    change of SHARD_SPACE that misses one of them would index, or read, the wrong rows."""
    from timerwheel_c.durable.storage.sqlfiles import migrations, queries
    from timerwheel_c.durable.storage.store import SHARD_SPACE

    expected = [tuple(bound.hex() for bound in SHARD_SPACE)]
    index = dict(migrations(backend))[index_version]
    assert re.findall(bounds, index.split("CREATE INDEX", 1)[1]) == expected
    for name in reads:
        assert re.findall(bounds, queries(backend)[name]) == expected, name


def test_sqlite_reads_by_shard_search_the_partial_index_and_other_rows_write_no_entry(tmp_path):
    """The index by shard holds only SHARD_SPACE (the rows passes read by shard), so SQLite uses it only
    for a statement whose WHERE repeats its terms: every read by shard of that space searches it (a
    plan without it would scan the whole table each pass). A row outside the space (a name, a
    schedule, an application's row) writes no entry: 2,000 of them, put at scattered keys with no
    checkpoint running, append about one WAL frame (page) each, where the index made it about two;
    a read by shard of their range still answers, by a scan."""
    import random

    from timerwheel_c.durable.storage.shards import shard_of
    from timerwheel_c.durable.storage.sqlite.rows import QUERIES
    from timerwheel_c.durable.storage.store import SHARD_SPACE

    # 4 kB pages: few enough page splits among 4,200 rows that one frame per row stands out from two.
    store = SQLiteStore(tmp_path / "t.db", checkpoint_interval_s=3600, page_size=4096)
    try:
        db = store._db
        for name in ("scan_shard", "occupied_shards", "first_in_shards"):
            sql = QUERIES[name].replace("{shards}", "(?)")
            args = (0, *SHARD_SPACE, 10) if name == "scan_shard" else (0, *SHARD_SPACE)
            plan = " ".join(row[3] for row in db.execute("EXPLAIN QUERY PLAN " + sql, args))
            assert "USING COVERING INDEX timerwheel_kv_shard" in plan or "USING INDEX timerwheel_kv_shard" in plan, (name, plan)
        # The index's terms must not compare the bare key column: SQLite would judge a statement's
        # "key >= ?" against them by its bound value, and prepare the statement again whenever that
        # value changes (every range scan of a partition, at about 2.5 times the cost).
        (index,) = db.execute("SELECT sql FROM sqlite_master WHERE name = 'timerwheel_kv_shard'").fetchone()
        assert not re.search(r"\bkey\s*[<>=]", index.split("WHERE", 1)[1]), index
        page = db.execute("PRAGMA page_size").fetchone()[0]
        wal = tmp_path / "t.db-wal"
        n = 2000
        names = [b"\x00I%08d" % i for i in range(n)] + [b"Ticket/%08d" % i for i in range(n)]
        random.Random(7).shuffle(names)
        put_all(store, [(k, b"v") for k in names[:200]])
        before = wal.stat().st_size
        for i in range(200, 200 + n):
            store.apply(P, Batch().put(names[i], b"v"))
        assert (wal.stat().st_size - before) / (page + 24) / n < 1.5  # each frame: a 24-byte header and a page
        assert store.scan_shards([shard_of(P, store.shard_count)], b"Ticket/", b"Ticket0", 3)[0] == [
            (P, k, b"v") for k in sorted(k for k in names[:200 + n] if k.startswith(b"Ticket/"))[:3]]
    finally:
        store.close()


def test_sqlite_scan_of_many_shards_probes_them_in_one_statement_and_reads_only_those_that_hold_rows(tmp_path):
    """A pass over idle shards costs one statement, not one per shard (one per 500 shards), and so
    does a read of each shard's first row however many hold rows; a longer read scans only the
    shards that hold rows. Each call also reads the recorded shard count once (another handle may
    have resharded). Each still returns every shard's rows in the range, in key order, at most
    ``limit``, in request order, with [] for the others."""
    from timerwheel_c.durable.storage.shards import shard_of

    store = SQLiteStore(tmp_path / "timers.db", shard_count=1200)
    try:
        statements: list = []
        store._db.set_trace_callback(statements.append)
        shards = list(range(1200))
        start, end = b"\x00Ta", b"\x00Tz"  # in the rows passes read by shard (SHARD_SPACE)
        assert store.scan_shards(shards, start, end, 10) == [[]] * 1200
        assert len(statements) == 1 + 3  # the shard count, then 1200 shards, 500 per probe
        parts = [f"p{i}" for i in range(40)]
        for p in parts:
            store.apply(p, Batch().put(b"\x00Tm2", p.encode()).put(b"\x00Tm1", p.encode()).put(b"\x00Tzz", b"out"))
        held = {shard_of(p, 1200) for p in parts}
        for limit, expected_statements in ((1, 1 + 3), (3, 1 + 3 + len(held))):
            statements.clear()
            found = store.scan_shards(shards, start, end, limit)
            assert len(statements) == expected_statements
            for shard, rows in zip(shards, found):
                expect = sorted((key, p, p.encode()) for p in parts if shard_of(p, 1200) == shard
                                for key in (b"\x00Tm1", b"\x00Tm2"))
                assert [(bytes(k), p, bytes(v)) for p, k, v in rows] == expect[:limit]
    finally:
        store.close()


@pytest.mark.parametrize("shared", [False, True], ids=["own-keys", "shared-keys"])
def test_apply_many_agrees_with_one_apply_per_batch(durable_store, shared):
    """apply_many gives each batch the result, and leaves the rows, that one apply per batch in order
    gives (a reference SQLite store): with batches that each touch keys of their own, which a backend
    may judge all at once against the state before the call, and with batches sharing keys, which it
    must judge in order. Seeded, so it cannot flake; both situations are asserted to arise."""
    import random

    rng = random.Random(20261201 + shared)
    committed = failed = 0
    for round_ in range(25):
        n = rng.randrange(1, 12)
        if shared:
            keys = [b"s%d" % i for i in range(4)]
            batches = _random_batches(rng, keys, n)
        else:
            batches = [b for i in range(n) for b in _random_batches(rng, [b"o%d.%d" % (i, j) for j in range(3)], 1)]
        rows = [(k, rng.choice([b"0", b"1"])) for k in sorted({k for b in batches for k, _ in b.writes}) if rng.random() < 0.6]
        partition = f"r{round_}"
        reference = SQLiteStore(":memory:")
        try:
            for store in (durable_store, reference):
                if rows:
                    put_all(store, rows, partition)
            expected = [reference.apply(partition, b) for b in batches]
            assert durable_store.apply_many(partition, batches) == expected
            assert durable_store.scan(partition, b"", b"\xff", limit=100) == reference.scan(partition, b"", b"\xff", limit=100)
        finally:
            reference.close()
        committed += expected.count(Committed())
        failed += len(expected) - expected.count(Committed())
    assert committed > 10 and failed > 10  # both outcomes arose


def test_postgres_sends_only_lists_of_many_independent_batches_to_the_set_based_statement(pg_table):
    """A single batch (a by-name schedule or cancel) and a list shorter than SETS_FROM go batch by batch,
    where the set-based statement's fixed cost would double the server's time per call; a list of
    SETS_FROM independent batches (a runner's claim) goes set-based. Counted on the store's own calls,
    which still reach the server, and the results checked."""
    from timerwheel_c.durable.storage.postgres import PostgresStore
    from timerwheel_c.durable.storage.postgres.store import SETS_FROM

    store = PostgresStore(os.environ["TIMERWHEEL_C_TEST_PG_DSN"], table=pg_table)
    calls = []
    real = store._apply_sets
    store._apply_sets = lambda sets: calls.append(len(sets.bp)) or real(sets)
    try:
        assert store.apply(P, Batch().require(Absent(b"one")).put(b"one", b"1")) == Committed()
        assert store.apply(P, Batch().require(Equals(b"one", b"1")).delete(b"one").put(b"two", b"1")) == Committed()
        few = [Batch().put(b"f%d" % i, b"x") for i in range(SETS_FROM - 1)]
        assert store.apply_many(P, few) == [Committed()] * len(few)
        assert calls == []
        many = [Batch().require(Equals(b"f%d" % i, b"x")).delete(b"f%d" % i) for i in range(SETS_FROM - 1)]
        many.append(Batch().require(Absent(b"one")).put(b"one", b"2"))
        assert store.apply_many(P, many) == [Committed()] * SETS_FROM
        assert calls == [SETS_FROM]
        assert store.scan(P, b"", b"\xff", limit=10).entries == [(b"one", b"2"), (b"two", b"1")]
    finally:
        store.close()


def test_scan_many_answers_each_request_as_scan_does(durable_store):
    """scan_many gives, per request and in order, the page scan gives: bounds, after, limit, paging,
    other partitions and a partition without rows."""
    put_all(durable_store, [(b"a", b"1"), (b"b", b"2"), (b"c", b"3"), (b"d", b"4")])
    put_all(durable_store, [(b"b", b"q")], partition="other")
    requests = [(P, b"", b"\xff", None, 2), (P, b"", b"\xff", b"b", 5), (P, b"b", b"d", None, 5), ("other", b"", b"\xff", None, 1),
                ("empty", b"", b"\xff", None, 3), (P, b"b", b"c", b"a", 1), (P, b"a", b"\xff", b"d", 9)]
    assert durable_store.scan_many(requests) == [durable_store.scan(*r) for r in requests]
    assert durable_store.scan_many([(P, b"", b"\xff", None, 2)])[0] == Page([(b"a", b"1"), (b"b", b"2")], b"b")
    assert durable_store.scan_many([]) == []


def test_apply_across_judges_each_batch_on_its_own_and_keeps_partitions_apart(durable_store):
    """apply_across returns one result per item, in order: the batches of a partition apply in their
    order (a later one sees an earlier one's writes), a failed guard fails only its own batch, and the
    same key in two partitions is two rows (the results and rows are those of one apply per batch)."""
    put_all(durable_store, [(b"k", b"1")], partition="x")
    put_all(durable_store, [(b"k", b"2")], partition="y")
    items = [
        ("x", Batch().require(Equals(b"k", b"1")).delete(b"k").put(b"k2", b"1")),  # a claim-shaped move
        ("y", Batch().require(Equals(b"k", b"1")).delete(b"k")),  # y holds 2: fails alone
        ("x", Batch().require(Equals(b"k2", b"1")).put(b"seen", b"x")),  # sees the move before it
        ("z", Batch().require(Absent(b"k")).put(b"k", b"z")),
        ("y", Batch().require(Equals(b"k", b"2")).delete(b"k").put(b"effect", b"y")),
    ]
    assert durable_store.apply_across(items) == [
        Committed(), PreconditionFailed(b"k"), Committed(), Committed(), Committed()]
    rows = {p: dict(durable_store.scan(p, b"", b"\xff").entries) for p in "xyz"}
    assert rows == {"x": {b"k2": b"1", b"seen": b"x"}, "y": {b"effect": b"y"}, "z": {b"k": b"z"}}
    independent = [(p, Batch().require(Equals(b"effect", b"y")).delete(b"effect")) for p in "xyz"]
    assert durable_store.apply_across(independent) == [
        PreconditionFailed(b"effect"), Committed(), PreconditionFailed(b"effect")]
    assert durable_store.apply_across([]) == []


class _Move(RowMove):
    def __init__(self, key: bytes, value: bytes, to: bytes):
        self.key, self.value, self.to = key, value, to


def test_a_row_move_moves_its_row_guarded_on_its_value(durable_store):
    """A RowMove is the batch ``require(Equals(key, value)).delete(key).put(to, value)``, read-only: as a
    list of moves (every backend's set-based path, from SETS_FROM batches) and alone, its row moves
    when it holds the value, its guard fails alone when it does not, and a move onto a key that holds
    a row overwrites it."""
    moves = [_Move(b"k%02d" % i, b"v", b"m%02d" % i) for i in range(10)]
    put_all(durable_store, [(b"k%02d" % i, b"v" if i != 3 else b"changed") for i in range(10)] + [(b"m07", b"old")])
    assert moves[0].guards == [Equals(b"k00", b"v")] and moves[0].writes == [(b"k00", None), (b"m00", b"v")]
    with pytest.raises(TypeError, match="read-only"):
        moves[0].put(b"x", b"y")
    assert durable_store.apply_across([(P, m) for m in moves]) == [
        PreconditionFailed(b"k03") if i == 3 else Committed() for i in range(10)]
    expected = {b"k03": b"changed", **{b"m%02d" % i: b"v" for i in range(10) if i != 3}}
    assert dict(durable_store.scan(P, b"", b"\xff").entries) == expected
    assert durable_store.apply_many(P, [_Move(b"m%02d" % i, b"v", b"n%02d" % i) for i in range(10) if i != 3]) == \
        [Committed()] * 9
    assert durable_store.apply(P, _Move(b"k03", b"v", b"m03")) == PreconditionFailed(b"k03")
    assert durable_store.apply(P, _Move(b"k03", b"changed", b"n00")) == Committed()
    assert dict(durable_store.scan(P, b"", b"\xff").entries) == {
        b"n00": b"changed", **{b"n%02d" % i: b"v" for i in range(1, 10) if i != 3}}


class _Consume(RowConsume):
    def __init__(self, key: bytes, value: bytes, writes: list):
        self.key, self.value, self.writes = key, value, writes


def test_a_row_consume_is_its_guard_on_the_row_and_its_writes(durable_store):
    """A RowConsume is the batch ``require(Equals(key, value))`` with its writes, read-only: in a list
    (every backend's set-based path, from SETS_FROM batches) and alone, it writes when its row holds
    the value (a put of that value moving the row there), fails alone when not, and one of another
    shape (its row not deleted, or a key written twice) is written as the same Batch would be."""
    put_all(durable_store, [(b"k%02d" % i, b"v" if i != 2 else b"changed") for i in range(10)] + [(b"x", b"1")])
    consumes = [_Consume(b"k%02d" % i, b"v", [(b"e%02d" % i, b"v" if i % 2 else b"w"), (b"k%02d" % i, None), (b"x%02d" % i, None)])
                for i in range(8)]
    consumes.append(_Consume(b"k08", b"v", [(b"e08", b"1"), (b"e08", None)]))  # its row not deleted
    consumes.append(_Consume(b"k09", b"v", [(b"k09", None), (b"x", None), (b"k09", b"again")]))  # written twice
    assert consumes[0].guards == [Equals(b"k00", b"v")]
    with pytest.raises(TypeError, match="read-only"):
        consumes[0].require(Absent(b"x"))
    assert durable_store.apply_many(P, consumes) == [
        PreconditionFailed(b"k02") if i == 2 else Committed() for i in range(10)]
    expected = {b"k02": b"changed", b"k08": b"v", b"k09": b"again",
                **{b"e%02d" % i: b"v" if i % 2 else b"w" for i in range(8) if i != 2}}
    assert dict(durable_store.scan(P, b"", b"\xff").entries) == expected
    assert durable_store.apply(P, _Consume(b"k02", b"v", [(b"k02", None)])) == PreconditionFailed(b"k02")
    assert durable_store.apply_across([("q", _Consume(b"k02", b"v", [(b"k02", None)])),
                                      (P, _Consume(b"k02", b"changed", [(b"k02", None), (b"y", b"changed")]))]) == [
        PreconditionFailed(b"k02"), Committed()]
    assert durable_store.get(P, b"y") == b"changed" and durable_store.get(P, b"k02") is None


def test_scan_many_and_apply_across_bad_arguments(durable_store):
    """Each request and item is checked as scan and apply check theirs, naming the bad value."""
    with pytest.raises(TypeError, match="requests must be a list"):
        durable_store.scan_many((P, b"", b"\xff", None, 1))
    with pytest.raises(TypeError, match="scan request"):
        durable_store.scan_many([(P, b"", b"\xff")])
    with pytest.raises(ValueError, match="limit must be >= 1"):
        durable_store.scan_many([(P, b"", b"\xff", None, 0)])
    with pytest.raises(TypeError, match="items must be a list"):
        durable_store.apply_across({P: Batch()})
    with pytest.raises(TypeError, match="pair"):
        durable_store.apply_across([Batch()])
    with pytest.raises(TypeError, match="batch must be a Batch"):
        durable_store.apply_across([(P, "not a batch")])
    with pytest.raises(ValueError, match="non-empty"):
        durable_store.apply_across([("", Batch())])


def test_apply_many_bad_arguments(durable_store):
    """A non-list, or a non-Batch anywhere in the list, is a TypeError naming it, and nothing is written."""
    with pytest.raises(TypeError, match="list"):
        durable_store.apply_many(P, Batch().put(b"k", b"v"))
    with pytest.raises(TypeError, match="'nope'"):
        durable_store.apply_many(P, [Batch().put(b"k", b"v"), "nope"])
    with pytest.raises(ValueError, match="non-empty"):
        durable_store.apply_many("", [])
    assert durable_store.get(P, b"k") is None


def test_bad_arguments(durable_store):
    """Wrong types are TypeErrors and bad values ValueErrors, naming the value."""
    with pytest.raises(TypeError, match="partition"):
        durable_store.get(b"p", b"k")
    with pytest.raises(ValueError, match="non-empty"):
        durable_store.get("", b"k")
    with pytest.raises(TypeError, match="'k'"):
        durable_store.get(P, "k")
    with pytest.raises(ValueError, match="limit"):
        durable_store.scan(P, b"", b"\xff", limit=0)
    with pytest.raises(TypeError, match="limit"):
        durable_store.scan(P, b"", b"\xff", limit=1.5)
    with pytest.raises(TypeError, match="after"):
        durable_store.scan(P, b"", b"\xff", after="x")
    with pytest.raises(TypeError, match="Batch"):
        durable_store.apply(P, [(b"k", b"v")])
    with pytest.raises(TypeError, match="value"):
        Batch().put(b"k", "v")
    with pytest.raises(TypeError, match="guard"):
        Batch().require((b"k", b"v"))
    with pytest.raises(TypeError):
        Equals(b"k", None)


def test_partition_names_are_valid_alike_on_every_backend(durable_store):
    """A partition holding NUL (which PostgreSQL's text refuses) or a lone surrogate (not UTF-8)
    is a ValueError naming it on every backend, never a driver error on one and a write on another."""
    for bad in ("p\x00q", "p\udc80"):
        with pytest.raises(ValueError, match="partition must") as exc:
            durable_store.apply(bad, Batch().put(b"k", b"v"))
        assert repr(bad) in str(exc.value)
        with pytest.raises(ValueError, match="partition must"):
            durable_store.get(bad, b"k")
    assert durable_store.get("p\u00e9\u6f22", b"k") is None  # any other unicode name is fine


def test_scan_limit_beyond_int64_means_every_row(durable_store):
    """A scan limit of any size (2**63, 2**70) returns every row, as a large one does, instead of
    overflowing the backend's integer."""
    put_all(durable_store, [(b"a", b"1"), (b"b", b"2")])
    for limit in (1 << 63, 1 << 70):
        page = durable_store.scan(P, b"", b"\xff", limit=limit)
        assert page.entries == [(b"a", b"1"), (b"b", b"2")] and page.next is None


def test_sqlite_file_persists_and_is_shared(tmp_path):
    """A SQLite file store keeps committed data across close/reopen, and a second connection's guarded
    commit sees the first's writes (the cross-process serialization two services rely on)."""
    path = tmp_path / "t.db"
    with SQLiteStore(path) as a, SQLiteStore(path) as b:
        assert a.apply(P, Batch().require(Absent(b"k")).put(b"k", b"1")) == Committed()
        assert b.apply(P, Batch().require(Absent(b"k")).put(b"k", b"2")) == PreconditionFailed(b"k")
    with SQLiteStore(str(path)) as c:
        assert c.get(P, b"k") == b"1"
        assert c._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_sqlite_bad_constructor_arguments(tmp_path):
    """Constructor arguments are validated with specific exceptions."""
    with pytest.raises(TypeError, match="path"):
        SQLiteStore(42)
    with pytest.raises(ValueError, match="busy_timeout_ms"):
        SQLiteStore(tmp_path / "x.db", busy_timeout_ms=-1)
    with pytest.raises(ValueError, match="synchronous"):
        SQLiteStore(tmp_path / "x.db", synchronous="SOMETIMES")
    # SQLite opens "" as a private temporary database, another one per connection: refused.
    with pytest.raises(ValueError, match="path must name a SQLite file .*got ''"):
        SQLiteStore("")


@pytest.mark.parametrize("path", ["a\x00b.db", "\x00"])
def test_a_path_with_a_nul_is_a_value_error_naming_the_path(tmp_path, path):
    """No file name holds a NUL: sqlite3 raised a bare "embedded null byte", naming neither the argument
    nor its value. It is a ValueError naming both, whatever else the store is asked."""
    for create in (True, False):
        with pytest.raises(ValueError, match=f"path must not contain NUL, got {re.escape(repr(path))}"):
            SQLiteStore(path, create=create)


@pytest.mark.parametrize("busy_timeout_ms", [2**31, 2**32 + 3000, 2**63, 2**64, -1])
def test_a_busy_timeout_sqlite_would_wrap_is_refused_naming_it(tmp_path, busy_timeout_ms):
    """SQLite takes its busy timeout as a C int: 2**31 ms and more wrapped (2**31 to 0, so a write
    failed at once on a lock). Any value outside 0..2**31-1 is a ValueError naming it, before a file
    is made; the largest one is taken."""
    with pytest.raises(ValueError, match=f"busy_timeout_ms must be 0..2147483647 .*got {busy_timeout_ms}"):
        SQLiteStore(tmp_path / "x.db", busy_timeout_ms=busy_timeout_ms)
    assert not (tmp_path / "x.db").exists()
    with SQLiteStore(tmp_path / "x.db", busy_timeout_ms=2**31 - 1) as store:
        assert store._db.execute("PRAGMA busy_timeout").fetchone()[0] == 2**31 - 1


@pytest.mark.parametrize("lock_wait_ms", [2**31, 2**63, 0])
def test_a_sibling_lock_wait_past_a_c_int_is_refused_naming_it(tmp_path, lock_wait_ms):
    """open_sibling's lock_wait_ms becomes a backend's C-int wait (PostgreSQL's lock_timeout takes at
    most INT_MAX ms): one outside 1..2**31-1 is refused on every backend, not first on the server."""
    with SQLiteStore(tmp_path / "x.db") as store, \
            pytest.raises(ValueError, match=f"lock_wait_ms must be 1..2147483647 .*got {lock_wait_ms}"):
        store.open_sibling(lock_wait_ms=lock_wait_ms)


@pytest.mark.parametrize("page_size", [1000, 256, 131072, 0, True, "1024", 1024.0])
def test_a_bad_page_size_is_refused_naming_it(tmp_path, page_size):
    """page_size must be a power of two from 512 to 65536 (SQLite's own range): anything else is a
    ValueError naming it, before a file is made."""
    with pytest.raises(ValueError, match=f"page_size .*got {re.escape(repr(page_size))}"):
        SQLiteStore(tmp_path / "x.db", page_size=page_size)
    assert not (tmp_path / "x.db").exists()


def test_a_new_file_gets_the_page_size_and_an_existing_one_keeps_its_own(tmp_path):
    """A store creates its file with DEFAULT_PAGE_SIZE pages (1 kB: a commit writes each page it
    changed whole into the WAL), or with those asked for. A file made before, with 4 kB pages
    (SQLite's default, and every earlier version's), keeps them: its rows read and write as before."""
    from timerwheel_c.durable.storage.sqlite.store import DEFAULT_PAGE_SIZE
    assert DEFAULT_PAGE_SIZE == 1024
    with SQLiteStore(tmp_path / "new.db") as store:
        put_all(store, [(b"k", b"v" * 3000)])  # longer than a page: spills into overflow pages
    with SQLiteStore(tmp_path / "big.db", page_size=8192) as store:
        put_all(store, [(b"k", b"v")])
    old = sqlite3.connect(tmp_path / "old.db")
    old.execute("PRAGMA page_size=4096")
    old.execute("PRAGMA journal_mode=WAL")
    old.close()
    with SQLiteStore(tmp_path / "old.db") as store:
        put_all(store, [(b"k", b"v")])
    with SQLiteStore(tmp_path / "old.db", page_size=512) as store:
        put_all(store, [(b"j", b"w")])
        assert [store.get(P, b"k"), store.get(P, b"j")] == [b"v", b"w"]
    with SQLiteStore(tmp_path / "new.db") as store:
        assert store.get(P, b"k") == b"v" * 3000
    for name, size in (("new.db", 1024), ("big.db", 8192), ("old.db", 4096)):
        db = sqlite3.connect(tmp_path / name)
        assert db.execute("PRAGMA page_size").fetchone()[0] == size, name
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok", name
        db.close()


def test_a_relative_sqlite_path_keeps_naming_its_file_after_the_process_changes_directory(tmp_path, monkeypatch):
    """A store opened on a relative path, then a chdir (a daemon's chdir("/"), a test's): its later
    connections, the checkpoint thread's and the change watcher's, open the file the store opened,
    never a new one in the new directory (where its checkpoints and change signal went, the store's
    own WAL grew unchecked and a timer written by another process fired up to max_sleep_s late)."""
    (tmp_path / "app").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "app")
    store = SQLiteStore("timers.db", checkpoint_interval_s=0.01)
    try:
        monkeypatch.chdir(tmp_path / "elsewhere")
        seen = threading.Event()
        with store.watch(seen.set):
            other = SQLiteStore(tmp_path / "app" / "timers.db")
            other.apply("p", Batch().put(b"k", b"v"))
            other.close()
            assert seen.wait(10), "the watcher never saw another connection's write"
        assert os.listdir(tmp_path / "elsewhere") == []
    finally:
        store.close()


def test_a_sqlite_store_dropped_without_close_is_freed_with_its_thread(tmp_path):
    """A store the program drops without close(), as a short script does: it is collected, and its
    checkpoint thread ends with it (the thread held the store, so each such store kept a thread and
    three file descriptors for good), and its connection is closed."""
    import gc
    import weakref

    import sqlite3

    for path in (tmp_path / "t.db", ":memory:"):
        store = SQLiteStore(path)
        thread, db = store._checkpointer, store._db
        gone = weakref.ref(store)
        del store
        gc.collect()
        assert gone() is None
        if thread is not None:
            thread.join(10)
            assert not thread.is_alive()
        # Its connection closed with it, as close() closes it: sqlite3 collecting an open one warns
        # (ResourceWarning, Python 3.13+).
        with pytest.raises(sqlite3.ProgrammingError, match="closed database"):
            db.execute("SELECT 1")


def test_sqlite_open_errors_name_the_path_and_the_cause(tmp_path):
    """A SQLite file that cannot be opened raises PermanentStoreError naming the path and why
    (a missing directory, a directory, an unwritable place); a URL given as a path is a ValueError
    pointing at open_store, its password masked. Nothing is created on the way."""
    missing = tmp_path / "no" / "such" / "x.db"
    with pytest.raises(PermanentStoreError, match=rf"{missing}'.*directory .* does not exist"):
        SQLiteStore(missing)
    with pytest.raises(PermanentStoreError, match=rf"{tmp_path}'.*is a directory"):
        SQLiteStore(tmp_path)
    if os.path.isdir("/proc"):  # not writable, even for root
        with pytest.raises(PermanentStoreError, match="/proc/x.db"):
            SQLiteStore("/proc/x.db")
    with pytest.raises(ValueError, match=r"'sqlite:///x.db'.*open_store"):
        SQLiteStore("sqlite:///x.db")
    with pytest.raises(ValueError, match=r"postgresql://u:\*\*\*@h/d") as raised:
        SQLiteStore("postgresql://u:hunter2@h/d")
    assert "hunter2" not in str(raised.value)
    assert not missing.parent.exists() and not os.path.exists("sqlite:")


def test_sqlite_rejects_a_bool_checkpoint_interval(tmp_path):
    """checkpoint_interval_s=True is a ValueError naming the value, like every other bool where a number goes."""
    with pytest.raises(ValueError, match="checkpoint_interval_s.*True"):
        SQLiteStore(tmp_path / "x.db", checkpoint_interval_s=True)


@pytest.mark.parametrize("name", ["checkpoint_interval_s", "watch_interval_s"])
@pytest.mark.parametrize("interval_s", [float("inf"), float("nan"), 1e300, 2**64, 86_400.5, 0, -1])
def test_an_interval_a_background_thread_cannot_wait_is_refused_naming_it(tmp_path, name, interval_s):
    """The checkpoint and change-signal threads wait their interval on an Event: one past
    threading.TIMEOUT_MAX (inf, 1e300, 2**64) killed the thread at its first wait with an
    OverflowError nobody saw, so the WAL was never checkpointed or no change ever signalled. Any
    interval that is not finite, > 0 and at most a day is a ValueError naming it, before a file is made."""
    with pytest.raises(ValueError, match=f"{name} must be a finite number of seconds > 0 and at most 86400 .*"
                                         f"got {re.escape(repr(interval_s))}"):
        SQLiteStore(tmp_path / "x.db", **{name: interval_s})
    assert not (tmp_path / "x.db").exists()


def test_a_day_long_interval_leaves_the_background_threads_alive(tmp_path):
    """The longest interval taken, a day, is one the threads can wait: both are still alive once they
    have begun their wait (a wait they could not take ends a thread at once)."""
    with SQLiteStore(tmp_path / "x.db", checkpoint_interval_s=86_400, watch_interval_s=86_400) as store, \
            store.watch(lambda: None):
        threading.Event().wait(0.1)
        alive = {t.name for t in threading.enumerate() if t.is_alive()}
        assert {"sqlite-checkpoint", "sqlite-watcher"} <= alive


def test_sqlite_schema_version_is_recorded_and_a_newer_one_refused(tmp_path):
    """Opening writes the schema version row once; a file whose row says a newer version raises
    SchemaVersionError naming both versions (concurrent openers are serialized by BEGIN IMMEDIATE)."""
    from timerwheel_c.durable.storage.sqlite import SCHEMA_VERSION

    path = tmp_path / "t.db"
    SQLiteStore(path).close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT value FROM timerwheel_meta WHERE name = 'schema_version'").fetchall() == [(str(SCHEMA_VERSION),)]
    with db:
        db.execute("UPDATE timerwheel_meta SET value = ? WHERE name = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    db.close()
    with pytest.raises(SchemaVersionError, match=rf"{path}'.*version {SCHEMA_VERSION + 1}.*version {SCHEMA_VERSION}"):
        SQLiteStore(path)


def test_a_sqlite_store_opened_before_a_newer_version_upgraded_the_file_refuses_its_writes(tmp_path):
    """A process still running when a newer timerwheel_c upgrades the file (a rolling upgrade) went
    on writing rows in its own layout: an earlier version's runner, so left running, fired a timer the
    upgrade had moved a second time, and its writer's timers were never read by the new code. Each
    write on the store's own connection (a batch, a write by name, a runner's claim) now reads the
    recorded version with the shard count and raises SchemaVersionError naming both versions; nothing
    is written, no handler runs, and reads go on."""
    from timerwheel_c.durable import Done, TimerKind, TimerRegistry, get_timer, run_due, schedule
    from timerwheel_c.durable.storage.sqlite import SCHEMA_VERSION

    path = tmp_path / "t.db"
    kind, fired = TimerKind(1), []
    registry = TimerRegistry()
    registry.handler(kind)(lambda ctx, timer: fired.append(timer.reference) or Done())
    with SQLiteStore(path) as store:
        schedule(store, "p", 1_000_000_000_000, kind, b"due", b"v")
        db = sqlite3.connect(path)
        with db:
            db.execute("UPDATE timerwheel_meta SET value = ? WHERE name = 'schema_version'", (str(SCHEMA_VERSION + 1),))
        before = db.execute("SELECT * FROM timerwheel_kv ORDER BY partition, key").fetchall()
        newer = rf"{path}'.*version {SCHEMA_VERSION + 1}.*version {SCHEMA_VERSION}"
        with pytest.raises(SchemaVersionError, match=newer):
            store.apply_many("p", [Batch().put(b"app", b"x")])
        with pytest.raises(SchemaVersionError, match=newer):
            schedule(store, "p", 2_000_000_000_000, kind, b"later", b"v")
        with pytest.raises(SchemaVersionError, match=newer):
            run_due(store, "p", registry, 1_000_000_000_001)
        assert fired == []
        assert db.execute("SELECT * FROM timerwheel_kv ORDER BY partition, key").fetchall() == before
        assert get_timer(store, "p", kind, b"due").state == "scheduled"
        db.close()


def test_a_sqlite_file_whose_version_row_is_gone_is_refused_unchanged(tmp_path):
    """A store whose meta table lost its version row (edited, or its page damaged) was read as one from
    before the version row and upgraded from there: the upgrade failed half way ("duplicate column
    name: shard"), which named no cause. Every open now raises SchemaError saying the version is
    missing from a store of a later version, and writes nothing."""
    from timerwheel_c.durable.storage.store import SchemaError

    path = tmp_path / "t.db"
    with SQLiteStore(path) as store:
        put_all(store, [(b"k", b"v")])
    db = sqlite3.connect(path)
    with db:
        db.execute("DELETE FROM timerwheel_meta WHERE name = 'schema_version'")
    before = db.execute("SELECT * FROM timerwheel_kv").fetchall(), db.execute("SELECT * FROM timerwheel_meta").fetchall()
    db.close()
    for options in ({}, {"read_only": True}, {"create": False}):
        with pytest.raises(SchemaError, match=rf"{path}'.*records no schema_version.*later version"):
            SQLiteStore(path, **options)
    db = sqlite3.connect(path)
    assert (db.execute("SELECT * FROM timerwheel_kv").fetchall(), db.execute("SELECT * FROM timerwheel_meta").fetchall()) == before
    db.close()


@pytest.mark.slow
def test_sixteen_processes_open_a_new_sqlite_file_at_once_without_error(tmp_path, open_at_once):
    """16 processes open the same new SQLite file at the same moment: all exit 0, the schema being
    created once under BEGIN IMMEDIATE."""
    db = tmp_path / "t.db"
    assert open_at_once(f"sqlite:///{db}") == []
    with SQLiteStore(db) as store:
        assert store.partitions() == []


def test_store_reprs_are_informative_and_never_hold_a_password(durable_store):
    """Every store's repr names its backend and where it is (path, or user@host:port/db and table),
    never a password."""
    text = repr(durable_store)
    assert text.startswith(("SQLiteStore(", "PostgresStore(")) and "password" not in text
    if "Postgres" in text:
        assert "table=" in text
    else:
        assert "synchronous=" in text


def test_delegating_store_passes_every_call_on_and_still_validates(tmp_path):
    """Delegating (the base of the stores that observe another) passes scan, get, apply, apply_many and
    partitions to the inner store, validating arguments first; a non-Store inner is a TypeError."""
    from bench.stores import Delegating

    with SQLiteStore(tmp_path / "t.db") as inner:
        store = Delegating(inner)
        assert store.apply(P, Batch().put(b"a", b"1")) == Committed()
        assert store.apply_many(P, [Batch().require(Absent(b"a")), Batch().put(b"b", b"2")]) == [
            PreconditionFailed(b"a"), Committed()]
        assert store.get(P, b"b") == b"2" and store.partitions() == [P]
        assert [k for k, _ in store.scan(P, b"", b"\xff").entries] == [b"a", b"b"]
        assert repr(store).startswith("Delegating(SQLiteStore(")
        with pytest.raises(TypeError, match="limit"):
            store.scan(P, b"", b"\xff", limit="2")
    with pytest.raises(TypeError, match="Store"):
        Delegating(object())


def test_scan_shards_reads_each_shard_across_its_partitions_in_key_order(durable_store):
    """scan_shards answers, per shard and in the order asked, the rows in [start, end) of every partition
    of that shard (shard_of, the one hash every backend records), in key order (ties by partition),
    at most ``limit``; a shard with no rows gives []. Row-for-row what a scan of each partition gives."""
    from timerwheel_c.durable.storage.shards import shard_of

    count = durable_store.shard_count
    names = [f"entity-{i}" for i in range(40)] + ["é-ünïcode"]
    for i, name in enumerate(names):
        durable_store.apply(name, Batch().put(b"k%03d" % (i % 7), name.encode()).put(b"z", b"-").put(b"a", b"-"))
    by_shard: dict = {}
    for name in names:
        by_shard.setdefault(shard_of(name, count), []).append(name)
    assert len(by_shard) > 1, "the names spread over several shards, so each read must keep them apart"
    shards = sorted(by_shard, reverse=True)
    expected = [sorted((k, p, v) for p in by_shard[s] for k, v in durable_store.scan(p, b"k", b"l").entries)
                for s in shards]
    got = durable_store.scan_shards(shards, b"k", b"l", 1000)
    assert got == [[(p, k, v) for k, p, v in rows] for rows in expected]
    assert durable_store.scan_shards(shards, b"k", b"l", 2) == [rows[:2] for rows in got]
    # A limit per shard: each shard read as deep as its own.
    limits = [1 + i % 3 for i in range(len(shards))]
    assert durable_store.scan_shards(shards, b"k", b"l", limits) == [rows[:n] for rows, n in zip(got, limits)]
    empty = next(s for s in range(count) if s not in by_shard) if len(by_shard) < count else None
    if empty is not None:
        assert durable_store.scan_shards([empty], b"", b"\xff", 5) == [[]]
    assert durable_store.scan_shards([], b"", b"\xff", 5) == []


def test_scan_shards_bad_arguments(durable_store):
    """A shard outside the store's, given twice, or not an int, and scan's own checks, each name the value."""
    count = durable_store.shard_count
    with pytest.raises(ValueError, match=f"shard {count} is out of range"):
        durable_store.scan_shards([count], b"", b"\xff", 1)
    with pytest.raises(ValueError, match="shard 0 is given twice"):
        durable_store.scan_shards([0, 0], b"", b"\xff", 1)
    with pytest.raises(TypeError, match="a shard must be an int"):
        durable_store.scan_shards(["0"], b"", b"\xff", 1)
    with pytest.raises(TypeError, match="shards must be a list"):
        durable_store.scan_shards((0,), b"", b"\xff", 1)
    with pytest.raises(ValueError, match="limit must be >= 1"):
        durable_store.scan_shards([0], b"", b"\xff", 0)
    with pytest.raises(TypeError, match="start must be bytes"):
        durable_store.scan_shards([0], "", b"\xff", 1)
    with pytest.raises(ValueError, match=r"limit must hold one limit per shard \(1\), got 2"):
        durable_store.scan_shards([0], b"", b"\xff", [1, 2])
    with pytest.raises(ValueError, match="limit must be >= 1"):
        durable_store.scan_shards([0], b"", b"\xff", [0])


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_store_from_before_shards_upgrades_in_place_and_keeps_its_rows_reachable(backend, tmp_path):
    """A store at the schema version before shards (the shard column, its index and the recorded count
    taken away again) gets them back on open, under the schema lock: every stored row is then in the
    shard of its partition, and the count asked for by that open is recorded."""
    from timerwheel_c.durable.storage.shards import shard_of

    if backend == "sqlite":
        from timerwheel_c.durable.storage.sqlite import SQLiteStore as cls

        open_store = lambda **kw: cls(tmp_path / "old.db", **kw)  # noqa: E731
    else:
        dsn = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
        if not dsn:
            pytest.skip("set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to test PostgresStore")
        import uuid

        from timerwheel_c.durable.storage.postgres import PostgresStore as cls

        table = f"timerwheel_test_{uuid.uuid4().hex[:16]}"
        open_store = lambda **kw: cls(dsn, table=table, **kw)  # noqa: E731
    store = open_store()
    for name in ("a", "b", "c", "d", "e"):
        store.apply(name, Batch().put(b"k", name.encode()))
    meta = "timerwheel_meta" if backend == "sqlite" else f"{store.table}_meta"
    kv = "timerwheel_kv" if backend == "sqlite" else store.table
    view = "timerwheel_timers" if backend == "sqlite" else f"{store.table}_timers"  # came with version 10
    before = [
        f"DROP VIEW {view}", f"DROP INDEX {kv}_shard", f"ALTER TABLE {kv} DROP COLUMN shard",
        f"DELETE FROM {meta} WHERE name = 'shard_count'",
        f"UPDATE {meta} SET value = '7' WHERE name = 'schema_version'"]  # shards came with version 8
    if backend == "sqlite":
        store.close()
        db = sqlite3.connect(tmp_path / "old.db")
        with db:
            for statement in before:
                db.execute(statement)
        db.close()
    else:
        with store.new_connection() as conn:
            for statement in before:
                conn.execute(statement)
        store.close()
    store = open_store(shard_count=5)
    try:
        assert store.shard_count == 5
        found = store.scan_shards(list(range(5)), b"", b"\xff", 10)
        assert sorted(row for rows in found for row in rows) == [(n, b"k", n.encode()) for n in "abcde"]
        assert all(shard_of(p, 5) == s for s, rows in enumerate(found) for p, _, _ in rows)
        again = open_store(shard_count=9)  # an existing store keeps its own count
        assert again.shard_count == 5
        again.close()
    finally:
        if backend == "postgres":
            from bench.stores import dispose

            dispose(store)
        else:
            store.close()


def test_reshard_moves_every_row_to_its_shard_under_the_new_count_and_records_it(durable_store, tmp_path):
    """reshard(n) recomputes every row's shard (shard_of with the new count) and records n: a store
    opened afterwards has n shards, and scan_shards over them finds every row where shard_of says.
    A bad count is a ValueError naming it, and nothing changes. After another handle's reshard,
    scan_every_shard reads by the count recorded now, not the one this object last read."""
    from timerwheel_c.durable.storage.shards import shard_of

    names = [f"e{i}" for i in range(30)]
    for name in names:
        durable_store.apply(name, Batch().put(b"k", name.encode()))
    with pytest.raises(ValueError, match="shard_count must be 1..4096, got 0"):
        durable_store.reshard(0)
    durable_store.reshard(7)
    assert durable_store.shard_count == 7
    found = durable_store.scan_shards(list(range(7)), b"", b"\xff", 100)
    assert sorted(p for rows in found for p, _, _ in rows) == sorted(names)
    assert all(shard_of(p, 7) == s for s, rows in enumerate(found) for p, _, _ in rows)
    durable_store.apply("later", Batch().put(b"k", b"v"))  # a write after it lands in the new shard
    assert ("later", b"k", b"v") in durable_store.scan_shards([shard_of("later", 7)], b"", b"\xff", 100)[0]
    if hasattr(durable_store, "table"):  # PostgreSQL: another store object on the same table
        again = type(durable_store)(os.environ["TIMERWHEEL_C_TEST_PG_DSN"], table=durable_store.table)
    elif durable_store.path != ":memory:":
        again = type(durable_store)(durable_store.path)
    else:
        return  # a private in-memory database: no other handle can open it
    assert again.shard_count == 7
    again.reshard(3)  # another handle's reshard: this object still counts 7 shards
    assert durable_store.shard_count == 7
    found = durable_store.scan_every_shard(b"", b"\xff", 100)
    assert len(found) == 3 == durable_store.shard_count
    assert sorted(p for rows in found for p, _, _ in rows) == sorted([*names, "later"])
    again.close()


@pytest.mark.parametrize("write", ["apply", "apply_across", "own_write", "joined"])
def test_a_sqlite_store_opened_before_another_handles_reshard_writes_by_the_new_count(tmp_path, write):
    """A store object opened with 64 shards keeps writing after another handle (another process,
    as an operator's) resharded the file to 4: each write takes the count recorded when it writes
    (inside its own statement), so every row lies in a shard a pass reads (it used to record the old
    count's shard, and such a timer never fired, not even after every process restarted); a pass by
    it reads the new count."""
    import sqlite3

    from timerwheel_c.durable import SQLiteStore
    from timerwheel_c.durable.storage.shards import shard_of

    path = tmp_path / "s.db"
    with SQLiteStore(path, shard_count=64) as app:
        with SQLiteStore(path) as admin:
            admin.reshard(4)
        names = [f"user/{i}" for i in range(40)]
        assert any(shard_of(n, 64) >= 4 for n in names)  # the old count would put rows past the new one
        for name in names:
            batch = Batch().put(b"k", name.encode())
            if write == "apply":
                app.apply(name, batch)
            elif write == "apply_across":
                app.apply_across([(name, batch)])
            elif write == "own_write":
                with app.own_write(name) as tx:
                    tx.apply(batch)
            else:
                conn = sqlite3.connect(path)
                with app.joined(conn, name) as tx:
                    tx.apply(batch)
                conn.commit()
                conn.close()
        assert sorted(p for rows in app.scan_shards(list(range(4)), b"", b"\xff", 100) for p, _, _ in rows) == \
            sorted(names)
        assert app.shard_count == 4
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM timerwheel_kv WHERE shard >= 4").fetchone() == (0,)


@pytest.mark.parametrize("write", ["apply", "apply_many", "own_write", "by_name"])
def test_a_sqlite_store_that_wrote_before_another_handles_reshard_writes_by_the_new_count_after_it(tmp_path, write):
    """The store's own writes bind each row's shard by the count they read once and keep while no
    other connection commits (PRAGMA data_version), or, for a write by name, by the count its first
    read returns beside the rows it reads: a store that wrote under 64 shards, then saw another
    handle reshard the file to 4, writes every later row in a shard of the 4, and after a reshard of
    its own, by the count it recorded."""
    from timerwheel_c.durable import schedule
    from timerwheel_c.durable.storage.shards import shard_of

    path = tmp_path / "s.db"
    names = [f"user/{i}" for i in range(40)]
    assert any(shard_of(n, 64) >= 4 for n in names)

    def write_all(store, value):
        for name in names:
            batch = Batch().put(b"k", value)
            if write == "apply":
                store.apply(name, batch)
            elif write == "apply_many":
                assert store.apply_many(name, [batch, Batch().put(b"k2", value)]) == [COMMITTED] * 2
            elif write == "by_name":  # a re-arm after the first round: its name's row and its timer's row
                schedule(store, name, 2_000_000_000_000 + len(value), 2, b"ref")
            else:
                with store.own_write(name) as tx:
                    tx.apply(batch)

    def shards_of_rows():
        with sqlite3.connect(path) as db:
            return set(db.execute("SELECT partition, shard FROM timerwheel_kv"))

    with SQLiteStore(path, shard_count=64) as app:
        write_all(app, b"before")
        assert shards_of_rows() == {(n, shard_of(n, 64)) for n in names}
        with SQLiteStore(path) as admin:
            admin.reshard(4)
        write_all(app, b"after")
        assert shards_of_rows() == {(n, shard_of(n, 4)) for n in names}
        app.reshard(16)
        write_all(app, b"again")
        assert shards_of_rows() == {(n, shard_of(n, 16)) for n in names}


def test_a_sqlite_write_reads_the_shard_count_once_while_no_other_connection_commits(tmp_path):
    """A write transaction on the store's own connection binds its rows' shard (no read of the meta
    table per row, as the put statement of a caller's connection makes): it asks PRAGMA data_version
    once, and reads the recorded count again only after another connection committed; a transaction
    that writes no row asks nothing; a list of one batch needs no savepoint."""
    from timerwheel_c.durable.storage.shards import shard_of

    path = tmp_path / "s.db"
    with SQLiteStore(path, shard_count=8) as store:
        store.apply(P, Batch().put(b"a", b"1"))
        statements: list = []
        store._db.set_trace_callback(statements.append)
        try:
            store.apply_many(P, [Batch().put(b"b", b"2").put(b"c", b"3"), Batch().put(b"d", b"4")])
            assert sum("data_version" in s for s in statements) == 1
            assert not [s for s in statements if "timerwheel_meta" in s]
            statements.clear()
            store.apply(P, Batch().delete(b"d"))
            assert not [s for s in statements if "data_version" in s or "timerwheel_meta" in s]
            with sqlite3.connect(path) as other:
                other.execute("INSERT INTO timerwheel_kv (partition, key, value, shard) VALUES ('q', x'01', x'', 0)")
            statements.clear()
            store.apply_many(P, [Batch().put(b"e", b"5")])
            assert len([s for s in statements if "timerwheel_meta" in s]) == 1
            # A list of one batch runs in its transaction alone: no savepoint around it.
            assert [s.split()[0] for s in statements] == ["BEGIN", "PRAGMA", "SELECT", "INSERT", "COMMIT"]
        finally:
            store._db.set_trace_callback(None)
        with sqlite3.connect(path) as db:
            assert set(db.execute("SELECT shard FROM timerwheel_kv WHERE partition = ?", (P,))) == {(shard_of(P, 8),)}


@pytest.mark.parametrize("recorded", ["5000", "8abc", "16.9", "-3", "1e1", "abc", "0", None])
@pytest.mark.parametrize("write", ["apply", "own_write", "joined", "by_name"])
def test_a_sqlite_write_refuses_a_recorded_shard_count_that_is_none(tmp_path, recorded, write):
    """A write takes its rows' shard from the count the meta table records when it writes (inside its
    put statement, or read in its transaction after another connection's commit: the store wrote
    under a good count first; a write by name reads it with its first read). A count there that is
    no shard count (an edited or damaged table; None: the row deleted) is a SchemaError naming the
    row, and nothing is written: SQLite's CAST reads "5000" or "8abc" as a number, which put a row in
    a shard no pass reads."""
    from timerwheel_c.durable import schedule
    from timerwheel_c.durable.storage.store import SchemaError

    path = tmp_path / "s.db"
    with SQLiteStore(path, shard_count=8) as store:
        store.apply("before", Batch().put(b"k", b"v"))
        db = sqlite3.connect(path, isolation_level=None)
        if recorded is None:
            db.execute("DELETE FROM timerwheel_meta WHERE name = 'shard_count'")
        else:
            db.execute("UPDATE timerwheel_meta SET value = ? WHERE name = 'shard_count'", (recorded,))
        with pytest.raises(SchemaError, match="records no shard count of 1..4096"):
            if write == "apply":
                store.apply(P, Batch().put(b"k", b"v"))
            elif write == "own_write":
                with store.own_write(P) as tx:
                    tx.apply(Batch().put(b"k", b"v"))
            elif write == "by_name":
                schedule(store, P, 2_000_000_000_000, 2, b"ref")
            else:
                conn = sqlite3.connect(path)
                try:
                    with store.joined(conn, P) as tx:
                        tx.apply(Batch().put(b"k", b"v"))
                finally:
                    conn.rollback()
                    conn.close()
        assert db.execute("SELECT partition FROM timerwheel_kv").fetchall() == [("before",)]
        db.close()


def test_a_whole_store_listing_after_another_handles_reshard_lists_every_timer(tmp_path):
    """A store object that only writes and lists, opened with 2 shards, while another handle
    reshards the file to 64: a listing of the whole store reads the count first, so it lists every
    timer (it read the 2 shards it knew, and listed 2 of 41)."""
    from timerwheel_c.durable import list_timers, schedule

    path = tmp_path / "s.db"
    with SQLiteStore(path, shard_count=2) as app:
        schedule(app, "warmup", 1_800_000_000_000, 1, b"w")
        with SQLiteStore(path) as admin:
            admin.reshard(64)
        for i in range(40):
            schedule(app, f"p{i}", 1_800_000_000_000, 1, b"r")
        assert len(list_timers(app, None)) == 41


def test_a_sqlite_pass_after_another_handles_reshard_reads_the_new_count(tmp_path):
    """A runner's store object learns the new count at its next pass (scan_shards), so rows in the
    shards the new count adds are read from the pass after."""
    from timerwheel_c.durable import SQLiteStore

    path = tmp_path / "s.db"
    with SQLiteStore(path, shard_count=4) as runner, SQLiteStore(path) as admin:
        runner.scan_shards(list(range(4)), b"", b"\xff", 10)
        admin.reshard(64)
        admin.apply("someone", Batch().put(b"k", b"v"))
        runner.scan_shards(list(range(4)), b"", b"\xff", 10)
        assert runner.shard_count == 64
        found = runner.scan_shards(list(range(64)), b"", b"\xff", 10)
        assert [p for rows in found for p, _, _ in rows] == ["someone"]


def test_record_labels_keeps_the_first_text_of_each_name_and_labels_reads_them_by_prefix(durable_store):
    """The labels contract on every backend: a name's first recorded text stays (a second writer gets
    it back), and labels() returns the recorded ones whose name starts with the prefix."""
    assert durable_store.record_labels({"kind:1": "send-reminder"}) == {"kind:1": "send-reminder"}
    assert durable_store.record_labels({"kind:1": "other", "kind:2": "digest", "x:1": "y"}) == {
        "kind:1": "send-reminder", "kind:2": "digest", "x:1": "y"}
    assert durable_store.labels("kind:") == {"kind:1": "send-reminder", "kind:2": "digest"}
    assert durable_store.labels() == {"kind:1": "send-reminder", "kind:2": "digest", "x:1": "y"}


def test_sqlite_checkpoint_thread_outlives_failing_to_open_its_connection(tmp_path, monkeypatch, caplog):
    """The checkpoint thread whose connection cannot be opened (no file descriptor left: EMFILE) tries
    again at its next round, says so at WARNING once the failures last, and checkpoints once it can:
    the WAL starts over. It died at its first failure, and the WAL, which nothing else checkpoints,
    grew without end."""
    import logging

    from timerwheel_c.durable.storage.sqlite import store as sqlite_store

    monkeypatch.setattr(sqlite_store, "WAL_RESTART_FRAMES", 50)
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_WARN_S", 0.05)
    opened = sqlite_store._checkpoint_connection
    failures = []

    def no_descriptor_at_first(file, busy_timeout_ms):
        if len(failures) < 20:
            failures.append(file)
            raise sqlite3.OperationalError("unable to open database file")
        return opened(file, busy_timeout_ms)

    monkeypatch.setattr(sqlite_store, "_checkpoint_connection", no_descriptor_at_first)
    with caplog.at_level(logging.WARNING, logger="timerwheel_c.durable"):
        store = SQLiteStore(tmp_path / "timers.db", checkpoint_interval_s=0.01)
        try:
            _commit_until_the_wal_starts_over(store, tmp_path / "timers.db-wal")
        finally:
            store.close()
    assert len(failures) == 20
    assert any("WAL checkpoints of" in r.getMessage() and "unable to open" in r.getMessage() for r in caplog.records)


def test_sqlite_wal_starts_over_under_a_steady_stream_of_commits(tmp_path, monkeypatch):
    """A passive checkpoint never lets a WAL start over while commits keep arriving, so the file grew
    for as long as they did; past WAL_RESTART_FRAMES frames the checkpoint thread starts it over, in
    place while the commits go on: the file stops growing. Commits without pause until the WAL's header
    says it started over (a generous liveness bound, not a speed), then as many again, which write
    over the file's pages, and every row written stays readable."""

    from timerwheel_c.durable.storage.sqlite import store as sqlite_store

    monkeypatch.setattr(sqlite_store, "WAL_RESTART_FRAMES", 50)
    store = SQLiteStore(tmp_path / "timers.db", checkpoint_interval_s=0.01)
    wal = tmp_path / "timers.db-wal"
    try:
        written = _commit_until_the_wal_starts_over(store, wal)
        written += _commit_until_the_wal_starts_over(store, wal, first=written)
        assert len(store.scan(P, b"k", b"l", limit=written + 1).entries) == written
    finally:
        store.close()


def test_sqlite_checkpoint_thread_truncates_a_long_wal_once_commits_stop(tmp_path, monkeypatch):
    """A WAL started over in place under a stream of commits keeps its length on disk while they go
    on; once a round of the checkpoint thread finds no commit since the last (or fewer than
    WAL_RESTART_FRAMES frames) in a file longer than that many, it truncates the file, so a burst of
    writes leaves no long WAL behind. Every row written stays readable."""
    import time

    from timerwheel_c.durable.storage.sqlite import store as sqlite_store

    monkeypatch.setattr(sqlite_store, "WAL_RESTART_FRAMES", 50)
    store = SQLiteStore(tmp_path / "timers.db", checkpoint_interval_s=0.01)
    wal = tmp_path / "timers.db-wal"
    try:
        written = _commit_until_the_wal_starts_over(store, wal)
        assert wal.stat().st_size > 50 * (1024 + 24)
        deadline = time.monotonic() + 60  # a generous liveness bound, not a speed
        while wal.stat().st_size > 50 * (1024 + 24) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert wal.stat().st_size <= 50 * (1024 + 24)
        assert len(store.scan(P, b"k", b"l", limit=written + 1).entries) == written
    finally:
        store.close()


def _wal_round(wal) -> int:
    """The checkpoint sequence number in the header of the WAL file ``wal`` (sqlite.org/fileformat.html,
    4.1): one more each time the WAL starts over, in place or truncated; -1 before its header is written."""
    try:
        with open(wal, "rb") as file:
            header = file.read(16)
    except FileNotFoundError:
        return -1
    return int.from_bytes(header[12:16], "big") if len(header) == 16 else -1


def _commit_until_the_wal_starts_over(store, wal, first: int = 0) -> int:
    """Commit rows (keys from ``first`` on) without pause until the WAL file ``wal`` starts over (a
    checkpoint restarted it: its header's checkpoint sequence number moves on), within a generous
    liveness bound, not a speed; returns how many were written."""
    import time

    store.apply(P, Batch().put(b"k%06d" % first, b"v" * 200))
    started, written, deadline = _wal_round(wal), 1, time.monotonic() + 60
    while time.monotonic() < deadline:
        store.apply(P, Batch().put(b"k%06d" % (first + written), b"v" * 200))
        written += 1
        if _wal_round(wal) != started:
            return written
    pytest.fail(f"the WAL never started over, {wal.stat().st_size} bytes after {written} commits")


class _Reads(Batch):
    """A batch that counts the reads of its ``guards`` and ``writes``, built anew at each read as a
    runner's first claims and bare outcomes build theirs (so that no list waits in flight with them)."""

    def __init__(self, guards: list, writes: list):
        self._lists = (guards, writes)
        self.reads = 0

    @property  # type: ignore[override]
    def guards(self) -> list:
        self.reads += 1
        return list(self._lists[0])

    @property  # type: ignore[override]
    def writes(self) -> list:
        self.reads += 1
        return list(self._lists[1])


def test_an_apply_reads_a_batchs_guards_and_writes_once_each(durable_store):
    """A batch may build its guards and writes at each read (the runner's claims and outcomes do, a
    list and a guard per read): every backend's own apply_many and apply_across read each once per
    batch of a guarded move or a consumed row, however many times the rule of the consumed write
    looks at them (SQLite reads the writes once more, to look for a put before its transaction reads
    the shard count), and apply them as a Batch of the same lists. Deterministic: it counts reads."""
    if "generic" in type(durable_store).__name__.lower():
        pytest.skip("the contract's generic apply_many is one apply per batch, no runner's path")
    put_all(durable_store, [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")])
    move = _Reads([Equals(b"a", b"1")], [(b"a", None), (b"a2", b"1")])
    consume = _Reads([Equals(b"b", b"2")], [(b"b", None), (b"b-name", None)])
    assert durable_store.apply_many(P, [move, consume]) == [COMMITTED, COMMITTED]
    across = _Reads([Equals(b"c", b"3")], [(b"c", None)])
    assert durable_store.apply_across([(P, across)]) == [COMMITTED]
    assert [durable_store.get(P, k) for k in (b"a", b"a2", b"b", b"c")] == [None, b"1", None, None]
    assert max(move.reads, consume.reads, across.reads) <= (3 if isinstance(durable_store, SQLiteStore) else 2)

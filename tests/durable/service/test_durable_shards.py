"""Shards: a service serving the whole store passes over shards, never over partitions one by one.

The property: with 100,000 partitions each holding one timer a day away, a timer written by another
connection, due shortly, still fires, never before its due time and within a generous liveness bound,
and, structurally, the passes read the store by shard: not one per-partition read of the idle
partitions and no listing of them, counted through the store itself (a Delegating wrapper around the
real store, no mock). The lateness figure against the number of partitions is the bench's job.
"""
from __future__ import annotations

import hashlib
import threading

import pytest

from timerwheel_c.durable import schedule
from timerwheel_c.durable.service.service import DurableTimerService
from timerwheel_c.durable.storage.open import open_store
from timerwheel_c.durable.storage.store import COMMITTED, Absent, Batch
from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerKind, TimerRegistry
from bench.stores import Delegating, dispose
from waiting import wait_until, wall_ms

KIND = 0xF3
PARTITIONS = 100_000
LIVENESS_S = 30.0
CHUNK = 10_000


class Counting(Delegating):
    """The real store, counting the partitions its reads name one by one and its shard reads."""

    def __init__(self, inner):
        super().__init__(inner)
        self.lock = threading.Lock()
        self.partition_reads = 0  # scan and scan_many requests, one per partition named
        self.listings = 0  # partitions(): a walk over every partition
        self.shard_reads = 0
        self.shard_rows = 0

    def _scan(self, partition, start, end, after, limit):
        with self.lock:
            self.partition_reads += 1
        return super()._scan(partition, start, end, after, limit)

    def _scan_many(self, requests):
        with self.lock:
            self.partition_reads += len(requests)
        return self.inner.scan_many(requests)

    def _partitions(self):
        with self.lock:
            self.listings += 1
        return super()._partitions()

    def _scan_shards(self, shards, start, end, limit):
        rows = super()._scan_shards(shards, start, end, limit)
        with self.lock:
            self.shard_reads += 1
            self.shard_rows += sum(len(r) for r in rows)
        return rows

    def counts(self) -> tuple:
        with self.lock:
            return self.partition_reads, self.listings, self.shard_reads, self.shard_rows


class Stamp(TimerHandler):
    kind = TimerKind(KIND)

    def __init__(self):
        self.fired: dict = {}
        self.cond = threading.Condition()

    def fire(self, ctx, timer):
        with self.cond:
            self.fired.setdefault(timer.reference, []).append(wall_ms())
            self.cond.notify_all()
        return Done()


@pytest.mark.slow
def test_a_new_timer_fires_among_100k_idle_partitions_and_passes_read_by_shard(store_url):
    """100,000 partitions x 1 timer a day away, written in bulk; a service serves the whole store
    (max_sleep_s an hour, so only the change signal wakes it). Another connection writes a timer due
    300 ms later: it fires once, not early, within LIVENESS_S; meanwhile no pass listed the partitions
    or read one partition's rows for an idle one (a pass over partitions one by one would read 100,000),
    and each shard read returned at most a handful of rows per shard."""
    writer = open_store(store_url)
    inner = open_store(store_url)
    store = Counting(inner)
    try:
        far = wall_ms() + 86_400_000
        items = [(f"entity-{i}", Batch().put(keys.timer(far + i, KIND, b"idle-%d" % i), b"")) for i in range(PARTITIONS)]
        for at in range(0, PARTITIONS, CHUNK):
            assert all(type(r).__name__ == "Committed" for r in writer.apply_across(items[at:at + CHUNK]))
        del items
        handler = Stamp()
        with DurableTimerService(store, TimerRegistry().register(handler), max_sleep_s=3600):
            wait_until(lambda: store.counts()[2] >= 2, "the service's first pass")
            before = store.counts()
            due = wall_ms() + 300
            schedule(writer, "entity-new", due, KIND, b"new")
            with handler.cond:
                assert handler.cond.wait_for(lambda: b"new" in handler.fired, LIVENESS_S), "the new timer never fired"
            after = store.counts()
        assert handler.fired == {b"new": handler.fired[b"new"]} and len(handler.fired[b"new"]) == 1
        assert due <= handler.fired[b"new"][0] <= due + LIVENESS_S * 1000
        reads, listings, shard_reads, shard_rows = (a - b for a, b in zip(after, before))
        assert shard_reads >= 2, "the passes read by shard (the situation under test arose)"
        assert listings == 0 and after[1] == 0, "no pass walked the partitions"
        # The new timer's own partition is read by its claim and its outcome's commit; never the idle ones.
        assert reads < 50, f"{reads} per-partition reads: the passes looked at partitions one by one"
        assert shard_rows <= shard_reads * 2 * store.shard_count, shard_rows
    finally:
        dispose(writer)
        inner.close()


class Ordered(TimerHandler):
    """Records (partition, due ms) in the order fired."""

    kind = TimerKind(KIND)

    def __init__(self):
        self.fired: list = []
        self.lock = threading.Lock()

    def fire(self, ctx, timer):
        with self.lock:
            self.fired.append((ctx.partition, timer.due_at_ms, timer.reference))
        return Done()


def test_a_backlog_beyond_one_shard_read_fires_whole_and_each_partition_in_due_order(tmp_path):
    """300 partitions x 10 timers already due, interleaved in due time, served by shard with one
    handler at a time: each pass's shard read reaches a few rows per shard (the read comes back full,
    the situation under test), yet every timer fires exactly once, and each partition's timers fire
    in their due order."""
    from timerwheel_c.durable.storage.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "t.db", shard_count=4)
    try:
        base = wall_ms() - 60_000
        items = [(f"p{p}", Batch().put(keys.timer(base + i * 300 + p, KIND, b"%d-%d" % (p, i)), b""))
                 for p in range(300) for i in range(10)]
        assert all(type(r).__name__ == "Committed" for r in store.apply_across(items))
        handler = Ordered()
        with DurableTimerService(store, TimerRegistry().register(handler), concurrency=1):
            wait_until(lambda: len(handler.fired) >= 3000, "3,000 timers to fire", LIVENESS_S * 2)
        refs = [r for _, _, r in handler.fired]
        assert len(refs) == len(set(refs)) == 3000
        by_partition: dict = {}
        for partition, due, _ in handler.fired:
            by_partition.setdefault(partition, []).append(due)
        assert len(by_partition) == 300 and all(d == sorted(d) for d in by_partition.values())
    finally:
        store.close()


def test_the_partitions_bench_reports_each_count_and_judges_its_goal_only_at_its_size(capsys, monkeypatch):
    """bench.durable_partitions at a tiny size: a p50 and p99 per partition count (never judged here),
    with effect rows whose keys begin with "T" beside the idle timers, and its goal reported as not
    applicable, since it is set at 100,000 partitions; a negative count of effect rows is refused."""
    import json

    from bench import durable_partitions

    monkeypatch.delenv("TIMERWHEEL_C_STORE", raising=False)
    with pytest.raises(SystemExit) as refused:
        durable_partitions.main(["--effect-rows", "-1"])
    assert refused.value.code == 2 and "-1" in capsys.readouterr().err
    assert durable_partitions.main(["--partitions", "1", "30", "--timers", "2", "--effect-rows", "500", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["effect_rows"] == 500 and durable_partitions.EFFECT_PREFIX[:1] == b"T"
    assert sorted(figures["results"]["sqlite"]) == ["1", "30"]
    assert all(len(f["lateness_ms"]) == 2 and f["p99_ms"] >= f["p50_ms"] for f in figures["results"]["sqlite"].values())
    [verdict] = figures["goals"]
    assert verdict["met"] is None and verdict["set_at"] == "100,000 partitions" and verdict["name"].startswith("sqlite ")


def test_a_timer_without_a_partition_lies_in_the_one_its_reference_names_and_is_found_again(store_url):
    """schedule() and schedule_many() with partition None put the timer in the partition derived from
    its reference ("ref:" and 16 hex digits, the same in every process and version), the same for every
    kind; get_timer(), reschedule() and cancel() with None find it there; a named partition is kept."""
    from timerwheel_c.durable import get_timer
    from timerwheel_c.durable.timers.bulk import schedule_many
    from timerwheel_c.durable.timers.partitions import partition_of
    from timerwheel_c.durable.timers.writer import cancel, reschedule

    store = open_store(store_url)
    try:
        due = wall_ms() + 3_600_000
        schedule(store, None, due, KIND, b"order-42")
        schedule_many(store, [(None, due, KIND, b"order-43"), ("named", due, KIND, b"order-44")])
        derived = partition_of(None, b"order-42")
        assert derived == "ref:" + hashlib.blake2b(b"order-42", digest_size=8).hexdigest()
        assert partition_of(None, b"order-42") == derived and partition_of("named", b"order-42") == "named"
        assert set(store.partitions()) == {derived, partition_of(None, b"order-43"), "named"}
        assert get_timer(store, None, KIND, b"order-42").due_at_ms == due
        assert get_timer(store, None, KIND, b"order-43") is not None
        assert reschedule(store, None, due + 1, KIND, b"order-42")
        assert get_timer(store, derived, KIND, b"order-42").due_at_ms == due + 1
        assert cancel(store, None, KIND, b"order-42") and get_timer(store, None, KIND, b"order-42") is None
    finally:
        dispose(store)


def test_a_left_out_partition_needs_a_bytes_reference():
    """With partition None, a reference that is not bytes is a TypeError naming it (nothing derived)."""
    from timerwheel_c.durable.timers.partitions import partition_of

    with pytest.raises(TypeError, match="reference must be bytes, got str 'order-42'"):
        partition_of(None, "order-42")


def test_a_lone_service_follows_a_reshard_made_while_it_runs(store_url):
    """A service serving every shard without a fleet (fleet=False) reads the store's shard count again
    once an ownership interval of its clock has passed: timers written after another handle doubled
    the count, into shards the old count does not have, fire. On PostgreSQL it read only the old
    count's shards until it restarted (a reshard refuses only while fleet runners hold the store's locks)."""
    from timerwheel_c.durable.storage.shards import shard_of
    from timerwheel_c.durable.timers.timing import ManualClock

    store, admin = open_store(store_url), open_store(store_url)
    clock, h = ManualClock(), Stamp()
    try:
        before = store.shard_count
        with DurableTimerService(store, TimerRegistry().register(h), None, fleet=False, max_sleep_s=3600,
                                 summary_interval_s=3600, clock=clock) as svc:
            wait_until(lambda: svc.passes >= 1, "the first pass", LIVENESS_S)
            admin.reshard(2 * before)
            names = [f"user/{i}" for i in range(200) if shard_of(f"user/{i}", 2 * before) >= before][:5]
            assert names
            for name in names:
                schedule(admin, name, wall_ms() - 1000, KIND, name.encode())
            clock.advance(svc.timing.ownership_interval_s)
            svc.schedule(names[0], wall_ms() - 1000, KIND, b"kick")  # a pass after the interval
            with h.cond:
                assert h.cond.wait_for(lambda: len(h.fired) == len(names) + 1, LIVENESS_S), h.fired
        assert store.shard_count == 2 * before
    finally:
        admin.close()
        dispose(store)


def test_a_postgres_store_and_its_siblings_adopt_the_count_a_runner_reads(schema_url):
    """A runner whose store was opened before (or while) another handle resharded it read the old
    count. Its ownership reads the recorded count at each evaluation, and the store and the siblings
    its claims run on then own, read and lock by it: the same shard lock as a store opened afterwards,
    so that their guarded commits on a partition still wait for each other."""
    with open_store(schema_url) as admin, open_store(schema_url) as stale:
        before = stale.shard_count
        claims = stale.open_sibling()
        try:
            admin.reshard(before + 3)
            runner = stale.ownership(None, kinds=[KIND], check_interval_s=3600)
            try:
                assert runner.owned() == list(range(before + 3))
            finally:
                runner.close()
            assert stale.shard_count == claims.shard_count == before + 3
            with open_store(schema_url) as fresh:
                assert all(claims.shard_lock(f"user/{i}") == fresh.shard_lock(f"user/{i}") for i in range(50))
        finally:
            claims.close()


def test_listing_the_whole_store_reads_by_shard_in_due_order(store_url, monkeypatch):
    """list_timers(store, None) lists the pending timers of every partition: those that will fire by
    due time, then the parked ones, with kind, state and limit as for one partition. It reads by
    shard, as a pass does (not one read per partition, no listing of them; the operator's ``timers
    list`` and the status page's search read so), and reads on past a full page of rows that share
    one key (the same due time, kind and reference in many partitions)."""
    from timerwheel_c.durable import list_timers, run_due
    from timerwheel_c.durable.timers import writer

    class Fails(TimerHandler):
        kind = TimerKind(KIND - 1)
        max_attempts = 1

        def fire(self, ctx, timer):
            raise RuntimeError("declined")

    monkeypatch.setattr(writer, "_STORE_PAGE_MAX", 3)  # pages of 3 rows a shard: many reads on
    store = Counting(open_store(store_url))
    try:
        due = wall_ms() + 3_600_000
        for i in range(40):
            schedule(store.inner, f"p{i}", due, KIND, b"same")
            schedule(store.inner, f"p{i}", due + 1 + i % 7, KIND, b"own%d" % i)
        schedule(store.inner, "p3", wall_ms() - 1000, KIND - 1, b"bad")
        assert run_due(store.inner, "p3", TimerRegistry().register(Fails()), wall_ms()).parked == 1
        before = store.counts()
        listed = list_timers(store, None)
        assert store.counts()[:2] == before[:2]  # no read of one partition, no listing of them
        assert store.counts()[2] > before[2]
        assert len(listed) == 81 and listed[-1].state == "parked" and listed[-1].reference == b"bad"
        assert [t.due_at_ms for t in listed[:-1]] == sorted(t.due_at_ms for t in listed[:-1])
        assert {(t.partition, t.reference) for t in listed[:-1]} == \
            {(f"p{i}", r) for i in range(40) for r in (b"same", b"own%d" % i)}
        assert list_timers(store, None, limit=5) == listed[:5]
        assert list_timers(store, None, kind=KIND - 1) == list_timers(store, None, state="parked") == listed[-1:]
        assert list_timers(store, None, state="scheduled", limit=1000) == listed[:-1]
        # A filter that reads many pages of one shard before its match (a shard read on past its second page).
        for i in range(20):
            schedule(store.inner, "one", due + 100 + i, KIND, b"n%d" % i)
        schedule(store.inner, "one", due + 200, KIND - 2, b"needle")
        assert [t.reference for t in list_timers(store, None, kind=KIND - 2)] == [b"needle"]
        # Rows of one key are read on in the store's own order of their partitions (a database's
        # collation), whatever Python's order of them is.
        for i in range(12):
            schedule(store.inner, f"{i % 4}{chr(65 + i)}{i}", due + 300, KIND, b"same-key")
        listed = list_timers(KeyOrderReversed(store.inner), None, limit=1000)
        same = sorted(t.partition for t in listed if t.reference == b"same-key")
        assert same == sorted(f"{i % 4}{chr(65 + i)}{i}" for i in range(12))
        assert len(listed) == len({(t.partition, t.reference) for t in listed})
    finally:
        dispose(store.inner)


class KeyOrderReversed(Delegating):
    """The real store, giving each shard's rows of one key in the reverse of Python's order of their
    partitions, the same in every read, as a database whose collation orders names otherwise does."""

    def _scan_shards(self, shards, start, end, limit):
        out = []
        for rows in super()._scan_shards(shards, start, end, limit):
            by_key: dict = {}
            for row in rows:
                by_key.setdefault(row[1], []).append(row)
            out.append([row for key in sorted(by_key) for row in sorted(by_key[key], key=lambda r: r[0], reverse=True)])
        return out


@pytest.mark.parametrize("path", ["apply", "copy", "apply_sets", "joined", "ajoined"])
def test_a_postgres_writer_opened_before_a_reshard_reads_the_new_count_at_its_next_write(schema_url, path):
    """A store object that read the shard count before another handle resharded the store takes, at
    its next write on any path (a batch, a COPY of new rows, the set-based statement, a write in the
    caller's transaction, sync or async), the lock of the partition's shard under the new count, as
    every store opened since does: the write runs only at the recorded count, and otherwise reads it
    and runs again. It kept locking by its old count, so its guarded commits and those of a runner
    opened afterwards did not wait for each other."""
    import asyncio

    import psycopg

    from timerwheel_c.durable.storage.postgres.copy import MIN_ROWS

    with open_store(schema_url) as admin, open_store(schema_url) as stale:
        before = stale.shard_count
        admin.reshard(before + 5)
        partition = next(p for p in (f"user/{i}" for i in range(1000)) if stale.shard_lock(p) != admin.shard_lock(p))
        if path == "apply":
            assert stale.apply(partition, Batch().put(b"k", b"v")) == COMMITTED
        elif path == "copy":
            batch = Batch()
            for i in range(MIN_ROWS):
                batch.require(Absent(b"k%d" % i)).put(b"k%d" % i, b"v")
            assert stale.apply(partition, batch) == COMMITTED
        elif path == "apply_sets":
            assert stale.apply_across([(f"{partition}/{i}", Batch().put(b"k", b"v")) for i in range(40)]) == [COMMITTED] * 40
        elif path == "joined":
            with psycopg.connect(admin._dsn, autocommit=False) as conn:
                with stale.joined(conn, partition) as tx:
                    assert tx.apply(Batch().put(b"k", b"v")) == COMMITTED
                conn.commit()
        else:
            async def write():
                async with await psycopg.AsyncConnection.connect(admin._dsn) as conn:
                    async with stale.ajoined(conn, partition) as tx:
                        assert await tx.apply(Batch().put(b"k", b"v")) == COMMITTED
                    await conn.commit()
            asyncio.run(write())
        assert stale.shard_count == before + 5
        assert stale.shard_lock(partition) == admin.shard_lock(partition)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_write_in_a_transaction_whose_snapshot_predates_a_reshard_asks_for_it_again(schema_url, mode):
    """A caller's SERIALIZABLE transaction that took its snapshot before another handle resharded
    the store reads the old count, by whose locks no write may run any more: a write in it is a
    TransientStoreError saying to run the transaction again, and the store keeps the count recorded
    now. The async write adopted the snapshot's old count for the store and all its siblings; the
    sync one tried ten times and blamed ten reshards."""
    import asyncio

    import psycopg

    from timerwheel_c.durable import aio
    from timerwheel_c.durable.storage.errors import TransientStoreError

    with open_store(schema_url) as admin, open_store(schema_url) as store:
        before = store.shard_count
        due = wall_ms() + 3_600_000
        if mode == "sync":
            with psycopg.connect(admin._dsn) as conn:
                conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
                conn.execute("SELECT 1 FROM pg_class LIMIT 1")  # the snapshot is taken
                admin.reshard(before + 2)
                store.refresh_shard_count()
                with pytest.raises(TransientStoreError, match="resharded after the caller's transaction took its snapshot"):
                    schedule(store, "p", due, KIND, b"x", conn=conn)
        else:
            async def write():
                async with await psycopg.AsyncConnection.connect(admin._dsn) as conn:
                    await conn.set_isolation_level(psycopg.IsolationLevel.SERIALIZABLE)
                    async with conn.transaction(force_rollback=True):
                        await conn.execute("SELECT 1 FROM pg_class LIMIT 1")
                        admin.reshard(before + 2)
                        store.refresh_shard_count()
                        with pytest.raises(TransientStoreError, match="resharded after the caller's transaction"):
                            await aio.schedule(store, "p", due, KIND, b"x", conn=conn)
            asyncio.run(write())
        assert store.shard_count == before + 2
        schedule(store, "p", due, KIND, b"x")  # a transaction begun after it writes as ever


def test_a_postgres_write_queued_behind_a_reshard_runs_by_the_new_count(schema_url):
    """A write by a store that read the old count, started while a reshard waits for its lock of the
    table, waits for that reshard, then finds the count changed, reads it and runs by the new lock:
    the count is judged once the write's locks are held, not in the snapshot its statement began
    with (where it passed at the old count and ran by the old shard's lock, beside writers at the new
    count, guarded commits on one partition then not waiting for each other)."""
    import threading

    import psycopg

    from timerwheel_c.durable.storage.shards import shard_of

    with open_store(schema_url) as admin:
        admin.reshard(4)
        with open_store(schema_url) as stale, psycopg.connect(admin._dsn) as blocker, \
                psycopg.connect(admin._dsn, autocommit=True) as watcher:
            partition = next(p for p in (f"user/{i}" for i in range(1000)) if shard_of(p, 4) != shard_of(p, 8))

            def waiting() -> int:  # sessions waiting for a lock of the store's table
                return watcher.execute("SELECT count(*) FROM pg_locks WHERE NOT granted "
                                       "AND relation = 'timerwheel_kv'::regclass").fetchone()[0]

            blocker.execute("SELECT 1 FROM timerwheel_kv LIMIT 1")  # the reshard waits for this reader
            resharding = threading.Thread(target=admin.reshard, args=(8,))
            resharding.start()
            wait_until(lambda: waiting() >= 1, "the reshard to wait for the table", LIVENESS_S)
            outcome: list = []
            writing = threading.Thread(target=lambda: outcome.append(stale.apply(partition, Batch().put(b"k", b"v"))))
            writing.start()
            wait_until(lambda: waiting() >= 2, "the write to queue behind it", LIVENESS_S)
            blocker.rollback()
            resharding.join(LIVENESS_S)
            writing.join(LIVENESS_S)
        assert outcome == [COMMITTED] and stale.shard_count == 8
        assert stale.shard_lock(partition) == admin.shard_lock(partition)

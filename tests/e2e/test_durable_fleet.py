"""PostgreSQL as a fleet: runner processes (``timerwheel-c run`` without ``--partition``) divide the
partitions, take over a SIGKILLed runner's share, give a late runner its share, and still commit every
timer's effect exactly once; concurrent opens and schema versions. Every test uses its own schema on the
real server of ``TIMERWHEEL_C_TEST_PG_DSN`` (the runners reach it through ``search_path``), and bounds
are generous (seconds) so a loaded machine cannot make them flake."""
from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.storage.store import Batch, Committed, Equals, PreconditionFailed, SchemaVersionError
from waiting import wait_until, wall_ms
from locations import TESTS as HELPERS_DIR

CURRENT = 17  # timerwheel_c.durable.storage.postgres.SCHEMA_VERSION (psycopg may be missing at collection)

PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
pytestmark = [
    pytest.mark.skipif(not PG_DSN, reason="set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to test the fleet"),
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals"),
]

EFFECT_KIND = 0xF3  # tests/durable_handlers.py: Done with one distinct effect row per application
SHARDS = 16  # the stores here are made with 16 shards, and the partitions are one per shard: a fleet over
# the whole store divides its shards, so owning a shard here is owning its one partition


def _one_partition_per_shard() -> dict:
    from timerwheel_c.durable.storage.shards import shard_of

    by_shard: dict = {}
    i = 0
    while len(by_shard) < SHARDS:
        by_shard.setdefault(shard_of(f"p{i:02d}", SHARDS), f"p{i:02d}")
        i += 1
    return by_shard


PARTITION_OF_SHARD = _one_partition_per_shard()
PARTITIONS = sorted(PARTITION_OF_SHARD.values())
TAKEOVER_S = 10.0
LIVENESS_S = 60.0
_OWNS = re.compile(r"owns (\d+) of (\d+) shards \((\d+) runners\): \[(.*)\]")



class Runner:
    """One ``python -m timerwheel_c run`` process; a thread follows its log for ownership lines."""

    def __init__(self, url: str, tmp_path, handlers: str = "durable_handlers:registry"):
        env = dict(os.environ, PYTHONPATH=str(HELPERS_DIR))
        # cwd=tmp_path: never import the checkout's timerwheel_c instead of the installed one.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "timerwheel_c", "run", "--store", url, "--handlers", handlers],
            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.shards: list = []  # the shards it owns, as it last logged them
        self.owned: list = []  # their partitions, in a store of SHARDS shards with one partition each
        self.lines: list = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            m = _OWNS.search(line)
            if m:
                self.shards = [int(n) for n in re.findall(r"\d+", m.group(4))]
                self.owned = [PARTITION_OF_SHARD[n] for n in self.shards if n in PARTITION_OF_SHARD]

    def wait_serving(self):
        """Wait until the process logs that it serves: a bound measured from then excludes its start-up."""
        wait_until(lambda: any("serving" in line for line in self.lines) or self.proc.poll() is not None,
                   "the runner to serve", LIVENESS_S)
        assert self.proc.poll() is None, "".join(self.lines)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)


@pytest.fixture
def runners(schema_url, tmp_path):
    started: list = []

    def start(n=1, handlers="durable_handlers:registry"):
        new = [Runner(schema_url, tmp_path, handlers) for _ in range(n)]
        started.extend(new)
        return new

    yield start
    for r in started:
        r.stop()



def open_store(url):
    from timerwheel_c.durable.storage.postgres import PostgresStore

    return PostgresStore(url, shard_count=SHARDS)


def anchor(store):
    """One far-future row per partition, so the partitions exist before the runners start."""
    for p in PARTITIONS:
        store.apply(p, Batch().put(keys.timer(wall_ms() + 3_600_000, EFFECT_KIND, b"anchor"), b""))


def schedule_due(store, n_per_partition, tag=b"t"):
    now = wall_ms()
    for p in PARTITIONS:
        batch = Batch()
        for i in range(n_per_partition):
            batch.put(keys.timer(now - 1000 + i % 100, EFFECT_KIND, tag + b"%05d" % i), b"")
        store.apply(p, batch)


def effect_counts(store):
    """(partition, reference) -> how many times its effect committed."""
    counts: collections.Counter = collections.Counter()
    for p in PARTITIONS:
        for k, _ in store.scan(p, b"effect/", b"effect0", limit=100_000).entries:
            counts[(p, k.split(b"/")[1])] += 1
    return counts


def balanced(rs, share):
    owned = [set(r.owned) for r in rs]
    return all(len(o) == share for o in owned) and set().union(*owned) == set(PARTITIONS)


def disjoint(rs):
    owned = [set(r.owned) for r in rs]
    return sum(len(o) for o in owned) == len(set().union(*owned))


@pytest.mark.slow
def test_four_runners_divide_sixteen_partitions_and_fire_each_timer_once(runners, schema_url):
    """4 runners over 16 partitions settle on 4 disjoint partitions each (asserted before any timer is
    due); then 8,000 due timers (500 per partition) all fire, each effect committed exactly once, and
    every partition's effects come from the one runner that owns it."""
    with open_store(schema_url) as store:
        anchor(store)
        rs = runners(4)
        wait_until(lambda: balanced(rs, 4), "4 partitions per runner", LIVENESS_S)
        owner_of = {p: i for i, r in enumerate(rs) for p in r.owned}
        schedule_due(store, 500)
        wait_until(lambda: sum(effect_counts(store).values()) >= 8000, "8,000 effects", LIVENESS_S)
        time.sleep(0.5)  # a doubled effect would show up by now as a count of 2
        counts = effect_counts(store)
        assert len(counts) == 8000 and set(counts.values()) == {1}
        assert balanced(rs, 4) and disjoint(rs)
        assert {p for p, _ in counts} == set(PARTITIONS)
        assert owner_of == {p: i for i, r in enumerate(rs) for p in r.owned}


@pytest.mark.slow
def test_sigkilled_runner_partitions_are_taken_over_and_nothing_is_lost_or_doubled(runners, schema_url):
    """4 balanced runners; 8,000 due timers; one runner is SIGKILLed once some effects (not all) are
    committed (asserted). Its 4 partitions are owned by the 3 survivors within 10 s, and in the end
    every timer's effect is committed exactly once (rows the dead runner had claimed come back after
    their 5 s backoff)."""
    with open_store(schema_url) as store:
        anchor(store)
        rs = runners(4)
        wait_until(lambda: balanced(rs, 4), "4 partitions per runner", LIVENESS_S)
        victim, survivors = rs[0], rs[1:]
        orphaned = set(victim.owned)
        schedule_due(store, 500)
        wait_until(lambda: sum(effect_counts(store).values()) >= 200, "the first effects", LIVENESS_S)
        victim.proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        victim.proc.wait()
        assert sum(effect_counts(store).values()) < 8000, "the kill landed after the run had ended"
        wait_until(lambda: orphaned <= set().union(*(set(r.owned) for r in survivors)),
                   "the survivors to own the dead runner's partitions", TAKEOVER_S)
        assert time.monotonic() - killed_at < TAKEOVER_S
        wait_until(lambda: sum(effect_counts(store).values()) >= 8000, "8,000 effects", LIVENESS_S)
        time.sleep(0.5)
        counts = effect_counts(store)
        assert len(counts) == 8000 and set(counts.values()) == {1}
        assert disjoint(survivors) and all(len(r.owned) <= 6 for r in survivors)


@pytest.mark.slow
def test_a_takeover_releases_the_dead_runners_claims_at_once_and_fires_each_once(runners, schema_url):
    """2 balanced runners; one timer per partition whose first attempt hangs, so every row sits
    claimed (attempt 1) by its owner. One runner is SIGKILLed: the survivor takes its 8 partitions
    over and, once the dead runner has not come back for the grace (two check intervals), releases
    the rows it had claimed, which fire (attempt 2) long before the retry time of their claim (the
    handler's 30 s backoff they would otherwise wait out), each exactly once."""
    hang_kind = 0xF2  # tests/durable_handlers.py FirstHangs
    with open_store(schema_url) as store:
        anchor(store)
        rs = runners(2)
        wait_until(lambda: balanced(rs, 8), "8 partitions per runner", LIVENESS_S)
        victim, survivor = rs
        orphaned = set(victim.owned)
        now = wall_ms()
        for p in PARTITIONS:
            store.apply(p, Batch().put(keys.timer(now, hang_kind, b"h-" + p.encode()), b""))

        def claimed_rows():
            rows = {}
            for p in PARTITIONS:
                for k, _ in store.scan(p, *keys.timer_range(), limit=100).entries:
                    tk = keys.parse(k)
                    if tk.kind == hang_kind and tk.attempt == 1:
                        rows[p] = tk.due_at_ms
            return rows

        wait_until(lambda: len(claimed_rows()) == 16, "every row claimed by its owner", LIVENESS_S)
        retry_at = claimed_rows()
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()

        def fired():
            out = {}
            for p in orphaned:
                for _, v in store.scan(p, b"effect/", b"effect0", limit=100).entries:
                    out.setdefault(p, []).append(int(v))
            return out

        wait_until(lambda: set(fired()) == orphaned, "the dead runner's rows to fire on the survivor", LIVENESS_S)
        time.sleep(0.5)
        got = fired()
        assert all(len(v) == 1 for v in got.values()), got
        assert all(got[p][0] < retry_at[p] for p in orphaned), {p: (got[p][0], retry_at[p]) for p in orphaned}
        assert not any(k.startswith(b"effect/") for p in set(PARTITIONS) - orphaned
                       for k, _ in store.scan(p, b"effect/", b"effect0", limit=10).entries)


@pytest.mark.slow
def test_rows_of_a_kind_fire_whenever_a_live_runner_has_it_even_beside_runners_without_it(runners, schema_url):
    """A runner without the Effect kind (an older deploy) owns all 16 partitions; 160 Effect timers come
    due; a runner with the kind is started beside it. Runners group by kinds, so the new one serves
    every partition for its kinds, and the older one leaves the rows it cannot fire in place: all 160
    effects commit, each exactly once, within the takeover bound of the new runner serving (its
    start-up, slow on a loaded machine, is not counted)."""
    with open_store(schema_url) as store:
        anchor(store)
        [old] = runners(1, "durable_handlers:registry_without_effect")
        wait_until(lambda: set(old.owned) == set(PARTITIONS), "the old runner to own every partition", LIVENESS_S)
        schedule_due(store, 10)
        time.sleep(1.0)  # the old runner has passed over the rows it cannot fire
        assert sum(effect_counts(store).values()) == 0
        [new] = runners(1)
        new.wait_serving()
        started = time.monotonic()
        wait_until(lambda: sum(effect_counts(store).values()) >= 160, "160 effects", LIVENESS_S)
        assert time.monotonic() - started < TAKEOVER_S + 5
        time.sleep(0.5)
        counts = effect_counts(store)
        assert len(counts) == 160 and set(counts.values()) == {1}
        assert set(old.owned) == set(PARTITIONS) and set(new.owned) == set(PARTITIONS)


@pytest.mark.slow
def test_a_runner_started_later_gets_its_share(runners, schema_url):
    """3 runners own 16 partitions (6, 5 and 5); a 4th started later owns some within
    10 s of serving, and then every runner holds exactly 4, disjoint, covering all 16."""
    with open_store(schema_url) as store:
        anchor(store)
        rs = runners(3)
        wait_until(lambda: all(len(r.owned) <= 6 for r in rs) and disjoint(rs)
                   and set().union(*(set(r.owned) for r in rs)) == set(PARTITIONS), "3 runners to cover 16 partitions", LIVENESS_S)
        [late] = runners(1)
        late.wait_serving()
        wait_until(lambda: late.owned, "the late runner's first partitions", TAKEOVER_S + 5)
        wait_until(lambda: balanced(rs + [late], 4), "4 partitions per runner", TAKEOVER_S + 5)


@pytest.mark.slow
def test_sixteen_processes_open_a_new_store_at_once_without_error(schema_url, open_at_once):
    """16 processes open the same not-yet-created PostgreSQL store at the same moment: all exit 0 (the
    schema is created once, under an advisory lock), and the schema version row is there."""
    assert open_at_once(schema_url) == []
    import psycopg

    with psycopg.connect(schema_url) as conn:
        assert conn.execute("SELECT value FROM timerwheel_kv_meta WHERE name = 'schema_version'").fetchone() == (str(CURRENT),)


def test_a_newer_schema_version_is_refused_naming_both_versions(schema_url):
    """A store whose meta row says a newer schema version fails to open with SchemaVersionError naming
    both versions; the table is left untouched."""
    import psycopg

    open_store(schema_url).close()
    with psycopg.connect(schema_url, autocommit=True) as conn:
        conn.execute("UPDATE timerwheel_kv_meta SET value = '99' WHERE name = 'schema_version'")
    with pytest.raises(SchemaVersionError, match=rf"version 99.*version {CURRENT}") as info:
        open_store(schema_url)
    assert (info.value.found, info.value.supported) == (99, CURRENT)


def test_a_version_one_table_is_upgraded_in_place(schema_url):
    """A table from before the version row (its one-batch apply function, no meta table) is upgraded on
    open: rows kept, version row written, the old function dropped and the store usable."""
    import psycopg

    with psycopg.connect(schema_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE timerwheel_kv (partition text NOT NULL, key bytea NOT NULL,"
                     " value bytea NOT NULL, PRIMARY KEY (partition, key))")
        conn.execute("INSERT INTO timerwheel_kv VALUES ('p', 'k', 'v')")
        conn.execute("CREATE FUNCTION timerwheel_kv_apply() RETURNS int LANGUAGE sql AS 'SELECT 1'")
    with open_store(schema_url) as store:
        assert store.get("p", b"k") == b"v"
        assert store.apply_many("p", [Batch().put(b"k2", b"v2")]) and store.get("p", b"k2") == b"v2"
    with psycopg.connect(schema_url) as conn:
        assert conn.execute("SELECT value FROM timerwheel_kv_meta WHERE name = 'schema_version'").fetchone() == (str(CURRENT),)
        assert conn.execute("SELECT to_regproc('timerwheel_kv_apply')").fetchone() == (None,)


def test_a_version_two_store_is_upgraded_in_place(schema_url):
    """A version-2 store (apply_many without the consume argument) is upgraded on open: its function is
    replaced by the current one (no overload left behind) and the store works."""
    import psycopg

    with psycopg.connect(schema_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE timerwheel_kv (partition text NOT NULL, key bytea NOT NULL,"
                     " value bytea NOT NULL, PRIMARY KEY (partition, key))")
        conn.execute("CREATE TABLE timerwheel_kv_meta (name text PRIMARY KEY, value text NOT NULL)")
        conn.execute("INSERT INTO timerwheel_kv_meta VALUES ('schema_version', '2')")
        conn.execute("CREATE FUNCTION timerwheel_kv_apply_many(text, bigint, int[], bytea[], bytea[], boolean[],"
                     " int[], bytea[], bytea[]) RETURNS bytea[] LANGUAGE sql AS 'SELECT NULL::bytea[]'")
    with open_store(schema_url) as store:
        assert store.apply_many("p", [Batch().put(b"k", b"v")]) and store.get("p", b"k") == b"v"
    with psycopg.connect(schema_url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_proc WHERE proname = 'timerwheel_kv_apply_many'"
                            " AND pronamespace = current_schema()::regnamespace").fetchone() == (1,)


def test_a_version_six_store_is_upgraded_in_place(schema_url):
    """A version-6 store (before the set-based apply function) is upgraded on open: its rows kept, the
    function created, the version recorded, and a claim-shaped apply_many (independent batches, the
    set-based path) commits and refuses each batch on its own guard."""
    import psycopg

    with open_store(schema_url) as store:
        store.apply("p", Batch().put(b"a", b"1").put(b"b", b"2"))
    with psycopg.connect(schema_url, autocommit=True) as conn:
        conn.execute("DROP FUNCTION timerwheel_kv_apply_sets")
        conn.execute("UPDATE timerwheel_kv_meta SET value = '6' WHERE name = 'schema_version'")
    with open_store(schema_url) as store:
        assert store.apply_many("p", [Batch().require(Equals(b"a", b"1")).delete(b"a").put(b"a2", b"1"),
                                      Batch().require(Equals(b"b", b"9")).delete(b"b").put(b"b2", b"2")]) \
            == [Committed(), PreconditionFailed(b"b")]
        assert dict(store.scan("p", b"", b"\xff").entries) == {b"a2": b"1", b"b": b"2"}
    with psycopg.connect(schema_url) as conn:
        assert conn.execute("SELECT value FROM timerwheel_kv_meta WHERE name = 'schema_version'").fetchone() \
            == (str(CURRENT),)
        assert conn.execute("SELECT to_regproc('timerwheel_kv_apply_sets') IS NOT NULL").fetchone() == (True,)


def test_ownership_repr_and_arguments(schema_url):
    """The ownership object validates its arguments and its repr names no password."""
    from timerwheel_c.durable.storage.postgres.ownership import PartitionOwnership

    with open_store(schema_url) as store:
        with pytest.raises(TypeError, match="'p'"):
            PartitionOwnership(store, "p")
        with pytest.raises(ValueError, match="check_interval_s"):
            PartitionOwnership(store, None, check_interval_s=0)
        with pytest.raises(TypeError, match="PostgresStore"):
            PartitionOwnership(object())
        own = store.ownership(["a", "b"])
        try:
            assert own.owned() == ["a", "b"]
            assert "password" not in repr(own) and "2 partitions" in repr(own)
        finally:
            own.close()


@pytest.mark.slow
def test_fleet_bench_reports_fired_per_s_and_takeover():
    """The fleet bench with 1 and 2 runner processes reports fired/s for each (and for 2 with the large
    budget) and the takeover time of the larger fleet; only shapes and the 10 s takeover bound are
    asserted, never a speed."""
    from bench import fleet

    figures = fleet.run(PG_DSN, 160, (1, 2))
    assert set(figures) == {"runners_1", "runners_2", "runners_2_large_budget", "new_partition_wakeup"}
    wakeup = figures.pop("new_partition_wakeup")
    assert wakeup["timers"] == 20 and 0 <= wakeup["lateness_p50_ms"] <= wakeup["lateness_p99_ms"]
    assert all(f["fired_per_s"] > 0 and f["timers"] == 160 and f["partitions"] == 16 for f in figures.values())
    assert [f["budget"] for f in figures.values()] == ["default", "default", "large"]
    assert "takeover_s" not in figures["runners_1"] and 0 < figures["runners_2"]["takeover_s"] < TAKEOVER_S
    with pytest.raises(ValueError, match="n_timers"):
        fleet.run(PG_DSN, 3)


def test_service_fleet_mode_follows_the_store_and_the_arguments(schema_url, tmp_path):
    """DurableTimerService divides partitions by default on PostgreSQL with partitions=None, not with a
    pinned list or fleet=False; fleet=True on SQLite (which cannot divide) is a ValueError naming the
    store, and a non-bool fleet a TypeError."""
    from timerwheel_c.durable import DurableTimerService, SQLiteStore, TimerRegistry

    with open_store(schema_url) as store:
        assert DurableTimerService(store, TimerRegistry()).ownership is not None
        assert DurableTimerService(store, TimerRegistry(), ["a"]).ownership is None
        assert DurableTimerService(store, TimerRegistry(), ["a"], fleet=True).ownership.partitions == ["a"]
        assert DurableTimerService(store, TimerRegistry(), fleet=False).ownership is None
        with pytest.raises(TypeError, match="'yes'"):
            DurableTimerService(store, TimerRegistry(), fleet="yes")
    with SQLiteStore(tmp_path / "t.db") as sqlite_store:
        assert DurableTimerService(sqlite_store, TimerRegistry()).ownership is None
        with pytest.raises(ValueError, match="SQLiteStore"):
            DurableTimerService(sqlite_store, TimerRegistry(), fleet=True)


def test_ownership_shares_join_leave_and_holders(schema_url):
    """Three ownership objects (three connections, as three runners) over 4 partitions: alone, one owns
    all 4; when a second joins, each settles on 2, disjoint; with a third the shares are 2, 1 and 1,
    covering all 4; when one closes (its locks go with its connection) the others take its
    partitions back. holders() agrees, read from pg_locks. Each step re-evaluates explicitly
    (recheck), so no timing is involved."""
    from timerwheel_c.durable.storage.postgres.ownership import holders

    parts = ["a", "b", "c", "d"]
    with open_store(schema_url) as store:
        a, b, c = (store.ownership(parts, check_interval_s=3600) for _ in range(3))
        try:
            def settle(*owners):
                for _ in range(3):  # a release by one is seen by the others on their next evaluation
                    for o in owners:
                        o.recheck()
                        o.owned()
                return [o.owned() for o in owners]

            assert settle(a) == [parts]
            got_a, got_b = settle(a, b)
            assert len(got_a) == len(got_b) == 2 and sorted(got_a + got_b) == parts
            shares = settle(a, b, c)
            assert sorted(len(s) for s in shares) == [1, 1, 2] and sorted(sum(shares, [])) == parts
            assert set(holders(store, parts)) == set(parts) and len(set(holders(store, parts).values())) == 3
            c.close()
            # The server drops a closed session's locks as its backend exits, a moment after the close.
            wait_until(lambda: len(set(holders(store, parts).values())) < 3, "the closed runner's locks to go", LIVENESS_S)
            got_a, got_b = settle(a, b)
            assert sorted(got_a + got_b) == parts and len(got_a) == len(got_b) == 2
            assert holders(store, ["a", "b"]) == {}  # another group: nobody owns its partitions
        finally:
            for o in (a, b, c):
                o.close()


def test_a_reshard_is_refused_while_a_fleet_runner_holds_the_stores_locks(schema_url):
    """A fleet runner owns and reads shards by the count it opened with: reshard() while one holds the
    store's locks (an ownership object with a kind, as a runner's) is a RuntimeError naming how many,
    and nothing changes; once it has closed, the reshard goes through. It used to go through at
    once, and the live runners left most timers unread until they restarted."""
    with open_store(schema_url) as store:
        before, wanted = store.shard_count, store.shard_count + 3
        runner = store.ownership(None, kinds=[7], check_interval_s=3600)
        try:
            assert runner.owned()  # connected: it holds its locks
            with pytest.raises(RuntimeError, match=r"1 fleet runner\(s\) of table .* are running: stop them"):
                store.reshard(wanted)
            assert store.shard_count == before
            with open_store(schema_url) as again:
                assert again.shard_count == before
        finally:
            runner.close()
        wait_until(lambda: _reshard_went_through(store, wanted), "the closed runner's locks to go", LIVENESS_S)
        with open_store(schema_url) as again:
            assert again.shard_count == wanted


def _reshard_went_through(store, count: int) -> bool:
    """Reshard ``store`` to ``count``; False while a runner's locks (a closed one's, until its backend
    exits) still refuse it."""
    try:
        store.reshard(count)
    except RuntimeError:
        return False
    return True


def test_partitions_sharing_a_lock_key_move_together_and_stay_owned(schema_url, monkeypatch):
    """Two partitions whose 32-bit lock keys collide (forced here by a coarse key function) share one
    lock: they are owned together, by one runner, and never left unowned; the shares count them as
    one unit."""
    from timerwheel_c.durable.storage.postgres import ownership as pg_ownership

    monkeypatch.setattr(pg_ownership, "_int32", lambda name: 7 if name in ("a", "b") else 9)
    with open_store(schema_url) as store:
        one, two = store.ownership(["a", "b", "c"], check_interval_s=3600), store.ownership(["a", "b", "c"], check_interval_s=3600)
        try:
            for _ in range(3):
                for o in (one, two):
                    o.recheck()
                    o.owned()
            shares = sorted([one.owned(), two.owned()], key=len)
            assert shares == [["c"], ["a", "b"]]
            assert pg_ownership.holders(store, ["a", "b", "c"]).keys() == {"a", "b", "c"}
        finally:
            one.close()
            two.close()


def test_a_timer_in_a_brand_new_partition_fires_without_waiting_for_the_periodic_ownership_check(schema_url):
    """A fleet service whose periodic ownership check is an hour away (check_interval_s set to 3600
    s after its first check) owns the anchored partitions. A timer is written, by another store
    handle as by another process, into a partition that did not exist: the change signal makes the
    service re-check ownership at once, so the timer fires (within the liveness bound) instead of an
    hour later (its shard is owned already: the fleet divides shards)."""
    from timerwheel_c.durable import DurableTimerService, TimerRegistry
    from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerKind
    from timerwheel_c.durable.timers.writer import schedule

    class Stamp(TimerHandler):
        kind = TimerKind(EFFECT_KIND)

        def fire(self, ctx, timer):
            return Done(Batch().put(b"effect/" + timer.reference, b"1"))

    with open_store(schema_url) as store, open_store(schema_url) as writer_store:
        anchor(store)
        with DurableTimerService(store, TimerRegistry().register(Stamp())) as svc:
            wait_until(lambda: len(svc.ownership.owned()) == len(PARTITIONS), "the anchored partitions owned", LIVENESS_S)
            svc.ownership.check_interval_s = 3600.0
            svc.ownership.recheck()
            svc.ownership.owned()  # the next periodic check is an hour from now
            time.sleep(0.5)
            schedule(writer_store, "fresh", wall_ms() + 100, EFFECT_KIND, b"new")
            wait_until(lambda: store.get("fresh", b"effect/new") is not None, "the timer in the new partition",
                       LIVENESS_S)
            from timerwheel_c.durable.storage.shards import shard_of

            assert shard_of("fresh", SHARDS) in svc.ownership.owned()  # a fleet over the store owns shards


@pytest.mark.slow
def test_two_runners_over_20k_partitions_on_a_default_server_hold_locks_bounded_by_shards(tmp_path):
    """A server of the test's own with PostgreSQL's default lock table (max_locks_per_transaction 64 x
    max_connections 100: 6,400 entries, asserted), 20,000 partitions each holding one due timer, and a
    fleet of 2 runners over the whole store. Runners own shards and every guarded commit locks its
    partitions' shards, so the advisory locks held at any moment stay within a few times the shard
    count (sampled from pg_locks), no runner logs "out of shared memory", and every timer's effect
    commits exactly once. Holding a lock per partition, as runners once did, needs 20,000 entries."""
    from pg_cluster import throwaway_cluster
    from timerwheel_c.durable.storage.postgres import PostgresStore

    n = 20_000
    with throwaway_cluster() as (dsn, _):
        with PostgresStore(dsn) as store:
            with store.new_connection() as conn:
                assert conn.execute("SHOW max_locks_per_transaction").fetchone() == ("64",)
            now = wall_ms()
            items = [(f"entity-{i}", Batch().put(keys.timer(now - 1000, EFFECT_KIND, b"e%05d" % i), b""))
                     for i in range(n)]
            for at in range(0, n, 5_000):
                assert set(map(type, store.apply_across(items[at:at + 5_000]))) == {Committed}
            everything = list(range(store.shard_count))

            def effects() -> collections.Counter:
                counts: collections.Counter = collections.Counter()
                for rows in store.scan_shards(everything, b"effect/", b"effect0", 10 * n):
                    counts.update(key.split(b"/")[1] for _, key, _ in rows)
                return counts

            rs = [Runner(dsn, tmp_path) for _ in range(2)]
            most_locks = 0
            try:
                with store.new_connection() as conn:
                    def locks_held() -> int:
                        nonlocal most_locks
                        held = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()[0]
                        most_locks = max(most_locks, held)
                        return held

                    wait_until(lambda: locks_held() >= 0 and sum(effects().values()) >= n, f"{n:,} effects",
                               LIVENESS_S * 3)
                wait_until(lambda: sorted(rs[0].shards + rs[1].shards) == everything, "the two runners to divide "
                           "every shard", LIVENESS_S)
                time.sleep(0.5)  # a doubled effect would show up by now as a count of 2
                counts = effects()
            finally:
                for r in rs:
                    r.stop()
            assert len(counts) == n and set(counts.values()) == {1}
            logs = "".join(line for r in rs for line in r.lines)
            assert "out of shared memory" not in logs, logs[-2000:]
            assert 0 < most_locks <= 4 * store.shard_count, most_locks

"""The reserved internal key space: every row the library writes has a key that begins with 0x00
(timers/keys.py), so an application's own rows, whatever their keys otherwise, are never in a range
the library scans, never read as timers or schedules; applications' keys that begin with 0x00 are
refused where a handler's batch enters the timer layer. Stores written before the reservation are
rewritten once, in place, when opened (timers/key_upgrade.py), on SQLite and PostgreSQL.

Counted, never timed: what a pass reads is counted through the store, row by row."""
from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from bench.stores import Delegating
from timerwheel_c.cli import main
from timerwheel_c.durable import (Done, Every, SQLiteStore, TimerRegistry, add_schedule, cancel, get_timer, list_schedules,
                                  list_timers, open_store, run_due, schedule, TimerHandler)
from timerwheel_c.durable.storage.shards import DEFAULT_SHARD_COUNT, shard_of
from timerwheel_c.durable.storage.store import Batch
from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.key_upgrade import KEY_SPACE_SCHEMA_VERSION

P = "p"
KIND = 7
NOW = 1_800_000_000_000  # 2027-01-15, Unix epoch ms
APP_ROWS = 20_000  # enough that a walk over them could not pass for a look at a few rows


class CountingReads(Delegating):
    """Counts the rows each read returns: a scan's entries, a get's one row."""

    def __init__(self, inner):
        super().__init__(inner)
        self.rows_read = 0

    def _scan(self, partition, start, end, after, limit):
        page = super()._scan(partition, start, end, after, limit)
        self.rows_read += len(page.entries)
        return page

    def _get(self, partition, key):
        self.rows_read += 1
        return super()._get(partition, key)


class Fires(TimerHandler):
    kind = KIND

    def __init__(self, effects=None):
        self.effects = effects
        self.fired: list = []

    def fire(self, ctx, timer):
        self.fired.append(timer.reference)
        return Done(self.effects)


@pytest.fixture
def store(durable_store):
    return durable_store


def test_a_pass_reads_none_of_many_app_rows_named_like_the_timer_tag(store):
    """20,000 effect rows b"Ticket/N", which the letter T once put in the timer space (where a pass
    looking for the next due timer walked them all, malformed rows, to find none), and one timer due:
    the pass fires it and finds nothing else pending from a handful of rows. A second pass, with
    nothing due, reads as little."""
    batch = Batch()
    for i in range(APP_ROWS):
        batch.put(b"Ticket/%d" % i, b"1")
    store.apply(P, batch)
    schedule(store, P, NOW - 1, KIND, b"now")
    counting = CountingReads(store)
    handler = Fires()
    registry = TimerRegistry().register(handler)
    report = run_due(counting, P, registry, NOW)
    assert handler.fired == [b"now"] and report.next_wake_ms is None  # the situation arose
    assert counting.rows_read < 50, f"a pass read {counting.rows_read} rows for 1 timer"
    assert run_due(counting, P, registry, NOW).fired == 0 and counting.rows_read < 100
    assert store.get(P, b"Ticket/0") == b"1"


def test_an_app_row_named_like_the_schedule_tag_is_no_schedule(store, tmp_path, capsys):
    """An effect row b"Result/42" (once in the schedules' range) is never read as a schedule:
    list_schedules lists the one schedule there is."""
    store.apply(P, Batch().put(b"Result/42", b"not a schedule").put(b"R", b"").put(b"S", b"x"))
    add_schedule(store, P, "beat", Every(60), KIND)
    assert [(s.partition, s.name) for s in list_schedules(store)] == [(P, "beat")]


def test_the_schedules_cli_lists_past_an_app_row(tmp_path, capsys):
    """`timerwheel-c schedules list` on a store holding b"Result/42" lists its schedule."""
    url = "sqlite:///" + str(tmp_path / "s.db")
    with open_store(url) as store:
        store.apply(P, Batch().put(b"Result/42", b"not a schedule"))
        add_schedule(store, P, "beat", Every(60), KIND)
    assert main(["schedules", "list", "--store", url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "beat" in lines[1]


def test_an_app_key_beginning_with_0x00_is_refused_naming_it(store, caplog):
    """A handler whose batch writes a key that begins with 0x00 fails that attempt, with an error that
    names the key; nothing of its batch is written and the timer backs off."""
    with pytest.raises(ValueError, match=r"the key b'\\x00Tmine' begins with 0x00"):
        keys.check_application_key(b"\x00Tmine")
    assert keys.check_application_key(b"Ticket/1") == b"Ticket/1"
    handler = Fires(Batch().put(b"effect", b"1").put(b"\x00Tforged", b""))
    schedule(store, P, NOW - 1, KIND, b"r")
    with caplog.at_level("WARNING", logger="timerwheel_c.durable"):
        report = run_due(store, P, TimerRegistry().register(handler), NOW)
    assert report.fired == 0 and report.failed == 1
    assert "\\x00Tforged" in caplog.text and "begins with 0x00" in caplog.text
    assert store.get(P, b"effect") is None and store.get(P, b"\x00Tforged") is None
    assert get_timer(store, P, KIND, b"r").state == "retrying"


# -- stores written before the reservation -----------------------------------------------------------

def _previous_layout(rows: list) -> list:
    """``rows`` ((partition, key, value), written by this version) as the version before the
    reservation wrote them: each library key without its 0x00, an identity row's value (a key) too."""
    out = []
    for partition, key, value in rows:
        if key[:1] == keys.RESERVED:
            if key[:2] in (keys.IDENTITY_TAG, keys.OCCURRENCE_IDENTITY_TAG) and key[2:3] != b"\x00":
                value = value[1:]
            key = key[1:]
        out.append((partition, key, value))
    return out


def _write_then_downgrade(url: str) -> list:
    """Fill the store at ``url`` through today's API, then rewrite its rows in the previous layout and
    record schema version 8 (the version before this one); returns the rows as they were."""
    with open_store(url) as store:
        schedule(store, P, NOW + 1000, KIND, b"alpha", b"A")
        schedule(store, P, NOW + 2000, KIND, b"beta", b"B")
        add_schedule(store, P, "beat", Every(60, start=NOW), KIND, b"S")
        store.apply(P, Batch().put(b"Ticket/42", b"app").put(b"Result/42", b"app"))
    if url.startswith("sqlite:"):
        with sqlite3.connect(url[len("sqlite:///"):]) as db:
            rows = db.execute("SELECT partition, key, value FROM timerwheel_kv").fetchall()
            db.execute("DELETE FROM timerwheel_kv")
            db.executemany("INSERT INTO timerwheel_kv (partition, key, value, shard) VALUES (?, ?, ?, ?)",
                           [(p, k, v, shard_of(p, DEFAULT_SHARD_COUNT)) for p, k, v in _previous_layout(rows)])
            db.execute("UPDATE timerwheel_meta SET value = '8' WHERE name = 'schema_version'")
        return rows
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = [(p, bytes(k), bytes(v)) for p, k, v in conn.execute("SELECT partition, key, value FROM timerwheel_kv")]
        with conn.transaction():
            conn.execute("DELETE FROM timerwheel_kv")
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO timerwheel_kv VALUES (%s, %s, %s)", _previous_layout(rows))
            conn.execute("UPDATE timerwheel_kv_meta SET value = '8' WHERE name = 'schema_version'")
    return rows


def test_a_store_from_before_the_reservation_moves_its_rows_on_open(store_url):
    """A store of the previous layout (today's rows with their 0x00 taken off, schema version 7), with
    two app rows in the old timer and schedule ranges, is rewritten once when opened: every row is
    back at today's key, the app rows untouched, and timers, names and schedules work."""
    before = _write_then_downgrade(store_url)
    assert any(k[:1] == b"T" for _, k, _ in _previous_layout(before))  # the old layout was written
    with open_store(store_url) as store:
        after = store.scan(P, b"", b"\xff", None, 1000).entries
        assert sorted(after) == sorted((k, v) for _, k, v in before)
        assert {(t.reference, t.value) for t in list_timers(store, P)} == {(b"alpha", b"A"), (b"beta", b"B"), (b"beat", b"S")}
        assert [s.name for s in list_schedules(store)] == ["beat"]
        assert cancel(store, P, KIND, b"alpha") is True and get_timer(store, P, KIND, b"alpha") is None
        assert store.get(P, b"Ticket/42") == b"app" and store.get(P, b"Result/42") == b"app"
    with open_store(store_url) as store:  # a second open changes nothing
        assert {t.reference for t in list_timers(store, P)} == {b"beta", b"beat"}


FIXTURE = Path(__file__).parent / "data" / "durable_store_schema2.db"


def test_duplicate_names_from_before_names_stay_reachable(tmp_path):
    """tests/durable/timers/data/durable_store_schema2.db (schema version 2, before names) with a second and a third
    timer named (p, 7, b"alpha") added in that layout: after the upgrade the one due last keeps the
    name; the others are renamed b"alpha#dup2" and b"alpha#dup3", found, listed and cancelled by
    those names; a schedule() of b"alpha" replaces the newest and makes no new timer."""
    path = tmp_path / "old.db"
    shutil.copy(FIXTURE, path)
    alpha = keys.parse(keys.RESERVED + _old_key(path, b"alpha"))
    later, latest = alpha.due_at_ms + 60_000, alpha.due_at_ms + 120_000
    with sqlite3.connect(path) as db:
        db.executemany("INSERT INTO timerwheel_kv VALUES ('p', ?, ?)",
                       [(keys.timer(latest, 7, b"alpha")[1:], b"A3"), (keys.timer(later, 7, b"alpha")[1:], b"A2")])
    with SQLiteStore(path) as store:
        assert (get_timer(store, "p", 7, b"alpha").value, get_timer(store, "p", 7, b"alpha").due_at_ms) == (b"A3", latest)
        named = {t.reference: t.value for t in list_timers(store, "p", kind=7)}
        assert {r: named[r] for r in (b"alpha", b"alpha#dup2", b"alpha#dup3")} == {
            b"alpha": b"A3", b"alpha#dup2": b"A", b"alpha#dup3": b"A2"}
        assert cancel(store, "p", 7, b"alpha#dup2") is True and get_timer(store, "p", 7, b"alpha#dup2") is None
        count = len(list_timers(store, "p"))
        schedule(store, "p", latest + 1, 7, b"alpha", b"A4")
        assert len(list_timers(store, "p")) == count and get_timer(store, "p", 7, b"alpha").value == b"A4"
        assert get_timer(store, "p", 7, b"alpha#dup3").value == b"A2"
        assert store.get("p", b"T\x00junk") == b"M" and store.get("p", b"user-row") == b"U"
    with sqlite3.connect(path) as db:
        version = db.execute("SELECT value FROM timerwheel_meta WHERE name = 'schema_version'").fetchone()[0]
        assert int(version) >= KEY_SPACE_SCHEMA_VERSION


def test_the_rows_passes_read_by_shard_lie_in_the_space_sqlite_indexes_by_shard():
    """The parked rows and the timer rows (the ranges passes read by shard) lie in the storage layer's
    SHARD_SPACE, and SQLite's partial index and its reads by shard spell that space's bounds: a key
    layout that drifted from it would leave every pass scanning the whole table, correctly and slowly."""
    from timerwheel_c.durable.storage.sqlite.rows import QUERIES
    from timerwheel_c.durable.storage.sqlite.store import _MIGRATIONS
    from timerwheel_c.durable.storage.store import SHARD_SPACE

    start, end = SHARD_SPACE
    for lo, hi in (keys.PARKED_RANGE, keys.timer_range(), keys.due_range(NOW), keys.future_range(NOW)):
        assert start <= lo <= hi <= end, (lo, hi)
    terms = f"substr(key, 1, 2) >= x'{start.hex()}' AND substr(key, 1, 2) < x'{end.hex()}'"
    assert terms in dict(_MIGRATIONS)[14]
    for name in ("scan_shard", "occupied_shards", "first_in_shards"):
        assert terms in " ".join(QUERIES[name].split()), name


FIXTURE_12 = Path(__file__).parent / "data" / "durable_store_schema12.db"


def test_a_store_of_schema_12_keeps_its_timers_when_its_index_by_shard_narrows(tmp_path):
    """tests/durable/timers/data/durable_store_schema12.db, written by the previous version (schema 12:
    an index by shard over every row): named timers in three partitions, a schedule, a timer backed
    off after a failure, a parked one, and an application's row in each partition. Opened, its index
    by shard holds only the rows passes read by shard; the view shows what it showed, and every
    timer is listed, found and cancelled by name, re-armed and fired, through a read by shard too."""
    from timerwheel_c.durable.storage.sqlite import SCHEMA_VERSION

    path = tmp_path / "old.db"
    shutil.copy(FIXTURE_12, path)
    with sqlite3.connect(path) as db:
        view = db.execute("SELECT * FROM timerwheel_timers ORDER BY partition, kind, reference").fetchall()
    assert len(view) == 9
    with SQLiteStore(path) as store:
        db = store._db
        assert db.execute("SELECT value FROM timerwheel_meta WHERE name = 'schema_version'").fetchone() == (
            str(SCHEMA_VERSION),)
        (index,) = db.execute("SELECT sql FROM sqlite_master WHERE name = 'timerwheel_kv_shard'").fetchone()
        assert "WHERE substr(key, 1, 2) >= x'0050' AND substr(key, 1, 2) < x'0055'" in index
        assert db.execute("SELECT * FROM timerwheel_timers ORDER BY partition, kind, reference").fetchall() == view
        assert store.partitions() == ["orders/1", "orders/2", "users/7"]
        assert {(t.reference, t.state) for t in list_timers(store, "users/7")} == {
            (b"remind", "scheduled"), (b"expire", "scheduled"), (b"fails", "retrying"), (b"parks", "parked")}
        assert [s.name for s in list_schedules(store)] == ["beat"]
        assert cancel(store, "orders/2", 7, b"remind") is True and get_timer(store, "orders/2", 7, b"remind") is None
        due = get_timer(store, "orders/1", 7, b"remind").due_at_ms
        schedule(store, "orders/1", due - 30_000, 7, b"remind", b"R2", if_exists="replace")
        assert [t.value for t in list_timers(store, "orders/1", kind=7) if t.reference == b"remind"] == [b"R2"]
        shard = shard_of("orders/1", store.shard_count)
        assert [bytes(k) for p, k, _ in store.scan_shards([shard], *keys.due_range(due), 10)[0] if p == "orders/1"] == sorted(
            [keys.timer(view[0][4], 7, b"beat", occurrence=True), keys.timer(due - 30_000, 7, b"remind")])
        handler = Fires()
        run_due(store, "orders/1", TimerRegistry().register(handler), due)
        assert sorted(handler.fired) == [b"beat", b"remind"]
        assert all(store.get(p, b"Ticket/42") == b"app" for p in store.partitions())


def test_the_key_space_rewrite_is_found_by_its_declared_entry_point():
    """The storage layer finds the timer layer's rewrite by the entry point the package declares,
    under the schema version that brings a store into the reserved key space: no import registers it,
    and the storage layer imports nothing of the timer layer to find it."""
    from timerwheel_c.durable.storage.upgrades import declared_rewrites
    from timerwheel_c.durable.timers.key_upgrade import upgraded_partition

    assert declared_rewrites() == {KEY_SPACE_SCHEMA_VERSION: upgraded_partition}


def _old_key(path: Path, reference: bytes) -> bytes:
    """The key of the fixture's old-layout timer row of ``reference``."""
    with sqlite3.connect(path) as db:
        (key,) = db.execute("SELECT key FROM timerwheel_kv WHERE partition = 'p' AND hex(key) LIKE ?",
                            ("54%" + reference.hex().upper(),)).fetchone()
    return key

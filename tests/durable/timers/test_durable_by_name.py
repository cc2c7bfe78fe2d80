"""Timers by name: a pending timer's identity is (partition, kind, reference), at most one pending
timer holds it, and schedule / cancel / reschedule / get_timer / list_timers find it without its
due time, whether it is scheduled or retrying after a failed attempt. Every test drives the runner
with its own clock (run_due's now_ms), so none waits and none can flake on timing."""
from __future__ import annotations

import shutil
import threading
import time
import sqlite3
from pathlib import Path

import pytest

from timerwheel_c.durable import (Done, PendingTimer, Reschedule, Retry, SQLiteStore, TimerExists, TimerHandler,
                                  TimerKind, TimerRegistry, cancel, get_timer, list_timers, reschedule, run_due,
                                  schedule)
from timerwheel_c.durable.timers import keys
from waiting import LIVENESS_S

P = "named"
KIND = 0xF3
DUE = 1_800_000_000_000  # Unix epoch ms


class Recording(TimerHandler):
    """Records each fire as (reference, due_at_ms, value, attempt) and answers with ``answer(timer)``."""

    kind = TimerKind(KIND)

    def __init__(self, answer=lambda timer: Done()):
        self.fired: list = []
        self.answer = answer

    def fire(self, ctx, timer):
        self.fired.append((timer.reference, timer.due_at_ms, timer.value, timer.attempt))
        return self.answer(timer)


def timer_rows(store, partition=P):
    return store.scan(partition, *keys.timer_range()).entries


def test_timer_kind_is_an_int():
    assert TimerKind(1) == 1 and 1 == TimerKind(1) and int(TimerKind(1)) == 1
    assert hash(TimerKind(7)) == hash(7) and {TimerKind(7): "x"}[7] == "x"
    assert repr(TimerKind(3)) == "TimerKind(3)" and TimerKind(TimerKind(3)) == 3
    with pytest.raises(ValueError, match="got 0"):
        TimerKind(0)
    with pytest.raises(TypeError, match="bool"):
        TimerKind(True)


def test_replace_moves_the_one_timer_of_a_name(durable_store):
    schedule(durable_store, P, DUE, KIND, b"idle", b"v1")
    schedule(durable_store, P, DUE + 5000, KIND, b"idle", b"v2")
    schedule(durable_store, P, DUE + 9000, KIND, b"idle", b"v3", if_exists="replace")
    assert timer_rows(durable_store) == [(keys.timer(DUE + 9000, KIND, b"idle"), b"v3")]
    assert get_timer(durable_store, P, KIND, b"idle") == PendingTimer(P, TimerKind(KIND), b"idle", b"v3", DUE + 9000,
                                                                      0, "scheduled")


def test_keep_leaves_the_pending_timer_and_error_raises_timer_exists(durable_store):
    first = schedule(durable_store, P, DUE, KIND, b"dedup", b"first")
    assert schedule(durable_store, P, DUE + 1, KIND, b"dedup", b"second", if_exists="keep") == first
    with pytest.raises(TimerExists, match=r"kind 243 reference b'dedup', due 1800000000000 ms \(scheduled\)") as info:
        schedule(durable_store, P, DUE + 2, KIND, b"dedup", b"third", if_exists="error")
    assert isinstance(info.value, ValueError) and info.value.timer.value == b"first"
    assert timer_rows(durable_store) == [(first, b"first")]
    # Other kinds, references and partitions are other names.
    schedule(durable_store, P, DUE, KIND - 1, b"dedup", if_exists="error")
    schedule(durable_store, P, DUE, KIND, b"dedup2", if_exists="error")
    schedule(durable_store, "other", DUE, KIND, b"dedup", if_exists="error")
    assert len(timer_rows(durable_store)) == 3


def test_an_unknown_if_exists_is_a_value_error_naming_it(durable_store):
    with pytest.raises(ValueError, match="'upsert'"):
        schedule(durable_store, P, DUE, KIND, b"r", if_exists="upsert")
    assert timer_rows(durable_store) == []


def test_a_timer_moved_while_it_is_listed_is_listed_once_where_it_was_read_last(tmp_path):
    """A listing read in two pages, the first timer moved past the first page by another connection
    between them (as a claim moves a row to its retry time): it is listed once, at its new place, and
    every other timer once. It was listed twice, at both places."""
    from bench.stores import Delegating
    from timerwheel_c.durable.storage.store import Batch

    store = SQLiteStore(tmp_path / "list.db")
    n = 10_050  # two pages of a listing with limit 20,000 (a page holds at most 10,000 rows)
    batch = Batch()
    for i in range(n):
        batch.put(keys.timer(DUE + i, KIND, b"%05d" % i), b"").put(keys.identity(KIND, b"%05d" % i),
                                                                    keys.timer(DUE + i, KIND, b"%05d" % i))
    store.apply(P, batch)
    pages = []

    class MovedMeanwhile(Delegating):
        def _scan(self, partition, start, end, after, limit):
            page = super()._scan(partition, start, end, after, limit)
            if not pages:
                assert reschedule(store, P, DUE + n, KIND, b"00000")  # past the first page
            pages.append(len(page.entries))
            return page

    listed = [t.reference for t in list_timers(MovedMeanwhile(store), P, limit=20_000)]
    assert len(pages) >= 2 and pages[0] < n
    assert len(listed) == len(set(listed)) == n and listed[-1] == b"00000"
    store.close()


def test_a_callers_own_write_object_without_get_through_still_writes_by_name(durable_store):
    """A store of the caller's own whose ``own_write`` gives an object with ``get``, ``scan`` and
    ``apply`` only (as before ``get_through`` existed): the writers read the two rows in turn through
    its ``get``, and every by-name write works."""
    from timerwheel_c.durable.timers.steps import run_steps
    from timerwheel_c.durable.timers.writer import cancel_steps, schedule_steps

    class OnlyGet:
        def get(self, key):
            return durable_store.get(P, key)

        def scan(self, start, end, limit):
            return durable_store.scan(P, start, end, limit=limit).entries

        def apply(self, batch):
            return durable_store.apply(P, batch)

    run_steps(schedule_steps(durable_store, P, DUE, KIND, b"plain", b"", "replace"), OnlyGet())
    run_steps(schedule_steps(durable_store, P, DUE + 1, KIND, b"plain", b"", "replace"), OnlyGet())
    assert get_timer(durable_store, P, KIND, b"plain").due_at_ms == DUE + 1
    assert run_steps(cancel_steps(durable_store, P, KIND, b"plain"), OnlyGet()) is True
    assert get_timer(durable_store, P, KIND, b"plain") is None


def test_reschedule_get_and_list(durable_store):
    assert reschedule(durable_store, P, DUE, KIND, b"a") is False
    assert get_timer(durable_store, P, KIND, b"a") is None
    schedule(durable_store, P, DUE + 3000, KIND, b"a", b"va")
    schedule(durable_store, P, DUE + 1000, KIND, b"b", b"vb")
    schedule(durable_store, P, DUE + 2000, KIND - 1, b"c", b"vc")
    assert reschedule(durable_store, P, DUE, KIND, b"a") is True
    assert reschedule(durable_store, P, DUE, KIND, b"a") is True  # already there
    assert get_timer(durable_store, P, KIND, b"a").due_at_ms == DUE
    assert get_timer(durable_store, P, KIND, b"a").value == b"va"
    assert [t.reference for t in list_timers(durable_store, P)] == [b"a", b"b", b"c"]
    assert [t.reference for t in list_timers(durable_store, P, kind=KIND)] == [b"a", b"b"]
    assert [t.reference for t in list_timers(durable_store, P, limit=1)] == [b"a"]
    assert list_timers(durable_store, P, state="retrying") == []
    with pytest.raises(ValueError, match="'done'"):
        list_timers(durable_store, P, state="done")
    with pytest.raises(ValueError, match="0"):
        list_timers(durable_store, P, limit=0)


def test_a_retrying_timer_is_found_replaced_and_cancelled_by_name(durable_store):
    """A failed attempt moves the row to a backoff key the caller cannot know; the name still finds it."""
    handler = Recording(lambda timer: Retry())
    registry = TimerRegistry().register(handler)
    schedule(durable_store, P, DUE, KIND, b"flaky", b"v")
    assert run_due(durable_store, P, registry, DUE).failed == 1
    pending = get_timer(durable_store, P, KIND, b"flaky")
    assert (pending.state, pending.attempt) == ("retrying", 1) and pending.due_at_ms > DUE
    assert list_timers(durable_store, P, state="retrying") == [pending]
    with pytest.raises(TimerExists, match="retrying"):
        schedule(durable_store, P, DUE, KIND, b"flaky", if_exists="error")
    assert cancel(durable_store, P, KIND, b"flaky") is True
    assert cancel(durable_store, P, KIND, b"flaky") is False
    assert timer_rows(durable_store) == []
    assert run_due(durable_store, P, registry, DUE + 3_600_000).fired == 0
    assert len(handler.fired) == 1

    # Replace resets a retrying timer to a fresh one at the new due time.
    schedule(durable_store, P, DUE, KIND, b"flaky2")
    run_due(durable_store, P, registry, DUE)
    schedule(durable_store, P, DUE + 10, KIND, b"flaky2", b"fresh")
    assert get_timer(durable_store, P, KIND, b"flaky2") == PendingTimer(P, TimerKind(KIND), b"flaky2", b"fresh",
                                                                        DUE + 10, 0, "scheduled")
    assert len(timer_rows(durable_store)) == 1


def test_timer_exists_carries_the_retrying_timers_last_error(durable_store):
    """``TimerExists.timer`` is the pending timer as ``get_timer`` reads it: for a retrying one, with
    its last attempt's error, kept in a row of its own (it was None), from ``schedule`` and from
    ``schedule_many`` alike."""
    from timerwheel_c.durable import schedule_many

    def fail(timer):
        raise ConnectionError("gateway down")

    schedule(durable_store, P, DUE, KIND, b"flaky", b"v")
    assert run_due(durable_store, P, TimerRegistry().register(Recording(fail)), DUE).failed == 1
    pending = get_timer(durable_store, P, KIND, b"flaky")
    assert pending.state == "retrying" and pending.last_error == "ConnectionError: gateway down"
    with pytest.raises(TimerExists) as raised:
        schedule(durable_store, P, DUE + 1, KIND, b"flaky", if_exists="error")
    assert raised.value.timer == pending
    with pytest.raises(TimerExists) as raised:
        schedule_many(durable_store, [(P, DUE + 1, KIND, b"flaky", b"")], if_exists="error")
    assert raised.value.timer == pending


def test_a_timer_cancelled_while_its_handler_runs_does_not_fire_again(durable_store):
    def cancel_self(timer):
        assert cancel(durable_store, P, KIND, timer.reference) is True
        return Retry()

    handler = Recording(cancel_self)
    registry = TimerRegistry().register(handler)
    schedule(durable_store, P, DUE, KIND, b"gone")
    run_due(durable_store, P, registry, DUE)
    assert run_due(durable_store, P, registry, DUE + 3_600_000).fired == 0
    assert len(handler.fired) == 1 and timer_rows(durable_store) == []


def test_a_timer_replaced_while_its_handler_runs_fires_at_its_new_time_only(durable_store):
    def replace_self(timer):
        if timer.value == b"old":
            schedule(durable_store, P, DUE + 60_000, KIND, timer.reference, b"new")
        return Done()

    handler = Recording(replace_self)
    registry = TimerRegistry().register(handler)
    schedule(durable_store, P, DUE, KIND, b"moved", b"old")
    report = run_due(durable_store, P, registry, DUE)
    assert report.raced == 1  # the old attempt's Done lost to the replace
    assert get_timer(durable_store, P, KIND, b"moved").value == b"new"
    run_due(durable_store, P, registry, DUE + 60_000)
    assert [v for _, _, v, _ in handler.fired] == [b"old", b"new"]
    assert get_timer(durable_store, P, KIND, b"moved") is None
    assert durable_store.scan(P, b"", b"\xff").entries == []


def _claim_first_attempt(store, registry):
    """Claim the due rows of ``P`` for their first attempt, as a runner does before it fires them."""
    from timerwheel_c.durable.timers.claim import claim_due

    claims = claim_due(store, P, registry, DUE)
    assert claims.error is None
    return claims.timers


def _commit_done(store, claimed):
    """Fire and commit ``claimed`` (its handler answers Done) as the runner does; the RunReport."""
    from timerwheel_c.durable.timers.runner import RunReport, commit_outcomes, fire

    report = RunReport()
    commit_outcomes(store, P, [(c, fire(store, P, DUE, c, report)) for c in claimed], report)
    return report


def test_a_first_claim_leaves_the_identity_row_and_the_name_still_finds_the_claimed_row(durable_store):
    """A first attempt's claim moves the row and leaves the identity row naming the scheduled key (no
    write to it: a fire writes the timer row once and deletes both rows). Found by name all the same,
    past more than one page of other timers due before its retry time: get_timer shows it retrying,
    schedule(if_exists="error") finds it pending, and cancel removes it, so that its attempt's commit
    fails its guard and nothing fires it again."""
    registry = TimerRegistry().register(Recording())
    schedule(durable_store, P, DUE, KIND, b"claimed", b"v")
    for i in range(300):  # due after it and before its retry time: rows the search reads past
        schedule(durable_store, P, DUE + 1 + i, KIND, b"later%03d" % i)
    [claimed] = _claim_first_attempt(durable_store, registry)
    scheduled = keys.timer(DUE, KIND, b"claimed")
    assert claimed.timer.key != scheduled
    assert durable_store.get(P, keys.identity(KIND, b"claimed")) == scheduled
    pending = get_timer(durable_store, P, KIND, b"claimed")
    assert (pending.state, pending.attempt, pending.value) == ("retrying", 1, b"v")
    assert pending.due_at_ms == keys.parse(claimed.timer.key).due_at_ms
    with pytest.raises(TimerExists, match="retrying"):
        schedule(durable_store, P, DUE, KIND, b"claimed", if_exists="error")
    assert cancel(durable_store, P, KIND, b"claimed") is True
    assert get_timer(durable_store, P, KIND, b"claimed") is None
    report = _commit_done(durable_store, [claimed])
    assert (report.fired, report.raced) == (0, 1)
    assert durable_store.get(P, keys.identity(KIND, b"claimed")) is None
    assert len(durable_store.scan(P, *keys.timer_range(), limit=1000).entries) == 300


def test_a_cancel_that_read_the_row_before_its_first_claim_fails_its_guard_and_finds_it_again(durable_store):
    """The claim commits between a cancel's read of the scheduled row and its write: the identity row
    still names that key, so only the cancel's guard on the row itself (Equals) sees the move. The
    cancel's first write fails, its second finds the claimed row and removes it; the attempt's
    commit then loses its guard. Without the row's guard the cancel would delete a row that was gone,
    answer True, and the timer would fire. Driven step by step: no thread, no timing."""
    from timerwheel_c.durable.storage.store import PartitionCalls
    from timerwheel_c.durable.timers.steps import run_steps
    from timerwheel_c.durable.timers.writer import cancel_steps

    registry = TimerRegistry().register(Recording())
    schedule(durable_store, P, DUE, KIND, b"raced", b"v")
    scheduled, claimed = keys.timer(DUE, KIND, b"raced"), []

    class Calls(PartitionCalls):
        def get_through(self, key):
            named, value = super().get_through(key)
            if named == scheduled and value is not None and not claimed:
                claimed.extend(_claim_first_attempt(durable_store, registry))  # the claim lands right after the read
            return named, value

        def apply(self, batch):
            applied.append(super().apply(batch))
            return applied[-1]

    applied = []
    assert run_steps(cancel_steps(durable_store, P, KIND, b"raced"), Calls(durable_store, P)) is True
    assert len(claimed) == 1  # the situation to test: the claim committed between the read and the write
    assert [type(r).__name__ for r in applied] == ["PreconditionFailed", "Committed"]
    report = _commit_done(durable_store, claimed)
    assert (report.fired, report.raced) == (0, 1)
    assert durable_store.scan(P, b"", b"\xff").entries == []


def test_a_handlers_reschedule_keeps_the_name(durable_store):
    handler = Recording(lambda timer: Reschedule(timer.due_at_ms + 1000, b"again") if timer.value == b"" else Done())
    registry = TimerRegistry().register(handler)
    schedule(durable_store, P, DUE, KIND, b"chain")
    run_due(durable_store, P, registry, DUE)
    pending = get_timer(durable_store, P, KIND, b"chain")
    assert (pending.due_at_ms, pending.value, pending.state) == (DUE + 1000, b"again", "scheduled")
    assert cancel(durable_store, P, KIND, b"chain") is True
    assert durable_store.scan(P, b"", b"\xff").entries == []


FIXTURE = Path(__file__).parent / "data" / "durable_store_schema2.db"


def test_a_store_written_by_the_previous_version_gains_names_on_open(tmp_path):
    """tests/durable/timers/data/durable_store_schema2.db was written by the version before timers had names (schema
    version 2): two scheduled timers in partition p, one in q, a timer backed off after a failed
    attempt, a malformed timer row and a user row. Opening it upgrades it in place, once: every
    timer is then found by name, and nothing else changes."""
    path = tmp_path / "old.db"
    shutil.copy(FIXTURE, path)
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM timerwheel_meta").fetchall() == [("2",)]
        before = db.execute("SELECT partition, key, value FROM timerwheel_kv ORDER BY 1, 2").fetchall()
    assert len(before) == 6
    with SQLiteStore(path) as store:
        assert [(t.reference, t.state, t.value) for t in list_timers(store, "p")] == [
            (b"alpha", "scheduled", b"A"), (b"beta", "scheduled", b"B"), (b"retrying", "retrying", b"R")]
        assert get_timer(store, "q", 9, b"gamma").value == b"G"
        assert cancel(store, "p", 7, b"retrying") is True
        schedule(store, "p", 1_900_000_000_000, 7, b"alpha", b"A2")
        assert [(t.reference, t.value) for t in list_timers(store, "p")] == [(b"beta", b"B"), (b"alpha", b"A2")]
        assert store.get("p", b"T\x00junk") == b"M" and store.get("p", b"user-row") == b"U"
    with SQLiteStore(path) as store:  # a second open changes nothing
        assert len(list_timers(store, "p")) == 2
    with sqlite3.connect(path) as db:
        from timerwheel_c.durable.storage.sqlite import SCHEMA_VERSION

        assert db.execute("SELECT value FROM timerwheel_meta WHERE name = 'schema_version'").fetchall() == [(str(SCHEMA_VERSION),)]


@pytest.mark.skipif(not __import__("os").environ.get("TIMERWHEEL_C_TEST_PG_DSN"),
                    reason="needs TIMERWHEEL_C_TEST_PG_DSN")
def test_a_postgres_store_from_the_previous_version_gains_names_on_open():
    """A PostgreSQL table at schema version 5 (the version before names) holding timer rows without
    identity rows, as the previous version wrote them, is upgraded on open under the schema lock."""
    import os
    import uuid

    import psycopg

    from bench.stores import dispose
    from timerwheel_c.durable.storage.postgres import PostgresStore

    dsn = os.environ["TIMERWHEEL_C_TEST_PG_DSN"]
    table = f"timerwheel_test_{uuid.uuid4().hex[:16]}"
    store = PostgresStore(dsn, table=table)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            # The layout of that version: the same keys without the reserved 0x00 in front.
            conn.execute(f"INSERT INTO {table} (partition, key, value) VALUES ('p', %s, 'A'), ('p', %s, 'R')",
                         (keys.timer(DUE, 7, b"alpha")[1:], keys.backoff(DUE + 5000, 7, 2, DUE - 1000, b"retrying")[1:]))
            conn.execute(f"UPDATE {table}_meta SET value = '5' WHERE name = 'schema_version'")
        store.close()
        store = PostgresStore(dsn, table=table)
        assert [(t.reference, t.attempt) for t in list_timers(store, "p")] == [(b"alpha", 0), (b"retrying", 2)]
        assert cancel(store, "p", 7, b"retrying") is True and cancel(store, "p", 7, b"alpha") is True
        assert store.scan("p", b"", b"\xff").entries == []
    finally:
        dispose(store)


def test_a_timer_moved_by_another_connection_is_never_missing_by_name(store_url):
    """A pending timer is found by name at every instant while another connection keeps moving it (as
    a runner's claim, a reschedule or a parking does: its row and identity row rewritten in one
    commit): get_timer never answers None for it, and reschedule never answers False. Reading the
    identity row and then the row it points at, in two statements, used to find the row gone when a
    move committed between them. Counted, not timed: it holds however the threads interleave."""
    from timerwheel_c.durable import open_store

    with open_store(store_url) as mover, open_store(store_url) as reader:
        schedule(mover, P, DUE, KIND, b"r")
        stop = threading.Event()
        moves, mover_refused = [0], [0]

        def move():
            while not stop.is_set():
                mover_refused[0] += not reschedule(mover, P, DUE + moves[0] % 2 * 1000, KIND, b"r")
                moves[0] += 1

        thread = threading.Thread(target=move)
        thread.start()
        missing = refused = rounds = 0
        try:
            # 300 rounds, and on until the timer has moved 10 times during them (within the liveness
            # bound): on a loaded machine the mover may win the write lock only a few times in 300.
            deadline_s = time.monotonic() + LIVENESS_S
            while rounds < 300 or (moves[0] < 10 and time.monotonic() < deadline_s):
                missing += get_timer(reader, P, KIND, b"r") is None
                refused += not reschedule(reader, P, DUE + 5000, KIND, b"r")
                rounds += 1
        finally:
            stop.set()
            thread.join()
        assert moves[0] >= 10  # the situation to test: the timer kept moving during the reads
        assert (missing, refused, mover_refused[0]) == (0, 0, 0)

"""Scheduling without a service: the module-level schedule() and cancel(), the due-time forms they
take (int Unix epoch ms, timezone-aware datetime), the unit-mistake warning, and the service's
wrappers (its kind check against the registry)."""
from __future__ import annotations

import datetime as dt
import logging
import time

import pytest

from timerwheel_c.durable import DurableContext, Reschedule, cancel, schedule
from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerKind, TimerRegistry
from timerwheel_c.durable.service.service import DurableTimerService
from timerwheel_c.durable.timers.claim import UNKNOWN_KIND_GRACE_MS
from timerwheel_c.durable.timers.timing import ManualClock
from waiting import wait_until

P = "w"
KIND = 0xF7
DUE = 1_800_000_000_000  # 2027-01-15, Unix epoch ms


def rows(store):
    return [(keys.parse(k), v) for k, v in store.scan(P, *keys.timer_range()).entries]


def test_schedule_writes_the_row_and_cancel_by_name_removes_it_once(store):
    key = schedule(store, P, DUE, KIND, b"ref", b"val")
    assert key == keys.timer(DUE, KIND, b"ref")
    [(tk, v)] = rows(store)
    assert (tk.due_at_ms, tk.kind, tk.reference, tk.attempt, v) == (DUE, KIND, b"ref", 0, b"val")
    assert schedule(store, P, DUE, TimerKind(KIND), b"ref", b"new") == key  # same name: replaced
    assert [v for _, v in rows(store)] == [b"new"]
    assert cancel(store, P, KIND, b"ref") is True
    assert cancel(store, P, KIND, b"ref") is False
    assert rows(store) == []
    assert store.scan(P, b"", b"\xff").entries == []  # the identity row went with it


@pytest.mark.parametrize("args, exc, names", [
    ((None, P, DUE, KIND, b"r"), TypeError, "store"),
    (("STORE", "", DUE, KIND, b"r"), ValueError, "partition"),
    (("STORE", P, "soon", KIND, b"r"), TypeError, "'soon'"),
    (("STORE", P, 1.5e12, KIND, b"r"), TypeError, "1500000000000.0"),
    (("STORE", P, -1, KIND, b"r"), ValueError, "-1"),
    (("STORE", P, 2**64, KIND, b"r"), ValueError, str(2**64)),
    (("STORE", P, DUE, 0, b"r"), ValueError, "kind must be in 1..255, got 0"),
    (("STORE", P, DUE, 256, b"r"), ValueError, "256"),
    (("STORE", P, DUE, KIND, "r"), TypeError, "'r'"),
    (("STORE", P, dt.datetime(2030, 1, 1), KIND, b"r"), ValueError, "naive"),
])
def test_bad_arguments_raise_naming_the_value_and_write_nothing(store, args, exc, names):
    args = tuple(store if a == "STORE" else a for a in args)
    with pytest.raises(exc, match=names):
        schedule(*args)
    if args[0] is store and args[2] == DUE:
        with pytest.raises(exc, match=names):
            cancel(args[0], args[1], args[3], args[4])
    assert rows(store) == []


def test_bad_value_raises(store):
    with pytest.raises(TypeError, match="value"):
        schedule(store, P, DUE, KIND, b"r", "text")


def test_aware_datetime_is_taken_exactly_as_unix_epoch_ms(store):
    """An aware datetime in any zone names the same instant as its Unix epoch ms."""
    utc = dt.datetime.fromtimestamp(DUE / 1000, dt.timezone.utc)
    tokyo = utc.astimezone(dt.timezone(dt.timedelta(hours=9)))
    assert schedule(store, P, tokyo, KIND, b"r") == keys.timer(DUE, KIND, b"r")
    assert cancel(store, P, KIND, b"r") is True
    assert Reschedule(tokyo, b"").due_at_ms == DUE


def test_due_time_in_seconds_is_warned_about(store, caplog):
    """int(time.time()) + 5 is seconds: accepted (it is a valid, if old, ms time) but logged at WARNING
    through the library's logger, naming the value; a real ms time is not."""
    seconds = int(time.time()) + 5
    with caplog.at_level(logging.WARNING, logger="timerwheel_c.durable"):
        schedule(store, P, DUE, KIND, b"ms")
        assert caplog.records == []
        schedule(store, P, seconds, KIND, b"s")
    (record,) = caplog.records
    assert record.name == "timerwheel_c.durable" and str(seconds) in record.getMessage()
    assert "seconds" in record.getMessage()


def test_due_time_in_us_or_ns_is_warned_about(store, caplog):
    """time.time_ns() is ns: as ms it lies millennia ahead and would never fire. Accepted (a valid
    ms time) but logged at WARNING naming the value; so is a µs time."""
    ns, us = time.time_ns(), time.time_ns() // 1000
    with caplog.at_level(logging.WARNING, logger="timerwheel_c.durable"):
        schedule(store, P, ns, KIND, b"ns")
        schedule(store, P, us, KIND, b"us")
    assert [str(ns) in r.getMessage() or str(us) in r.getMessage() for r in caplog.records] == [True, True]
    assert all("divide by" in r.getMessage() for r in caplog.records)


def test_store_keys_and_timer_references_have_one_size_limit_on_every_backend(durable_store):
    """A key over MAX_KEY_BYTES is a ValueError naming its length before any backend sees it (PostgreSQL's
    index would refuse it with a driver error, SQLite would take it); a timer reference is limited so
    that its longest key form, the backed-off key, still fits."""
    from timerwheel_c.durable.storage.store import MAX_KEY_BYTES, Batch

    with pytest.raises(ValueError, match=f"at most {MAX_KEY_BYTES} bytes, got {MAX_KEY_BYTES + 1} bytes"):
        Batch().put(b"k" * (MAX_KEY_BYTES + 1), b"v")
    durable_store.apply(P, Batch().put(b"k" * MAX_KEY_BYTES, b"v"))
    assert durable_store.get(P, b"k" * MAX_KEY_BYTES) == b"v"
    longest = b"r" * keys.MAX_REFERENCE_BYTES
    assert len(keys.backoff(DUE, KIND, 2**32 - 1, DUE, longest)) == MAX_KEY_BYTES
    schedule(durable_store, P, DUE, KIND, longest)
    with pytest.raises(ValueError, match=f"reference must be at most {keys.MAX_REFERENCE_BYTES} bytes"):
        schedule(durable_store, P, DUE, KIND, longest + b"r")


def test_naive_datetime_is_refused_by_every_entry_point(store):
    naive = dt.datetime(2030, 1, 1)
    with pytest.raises(ValueError, match="timezone-aware"):
        Reschedule(naive, b"")
    with pytest.raises(ValueError, match="timezone-aware"):
        DurableContext(store, "exec").sleep_until(naive)


class Nop(TimerHandler):
    kind = TimerKind(KIND)

    def fire(self, ctx, timer):
        return Done()


def test_service_schedule_refuses_a_kind_without_handler_but_the_runner_tolerates_rows_of_it(store):
    """The service's schedule() raises for a kind its registry cannot fire, naming the kind and the
    registered ones, and writes nothing; a row of that kind written some other way is still backed
    off by the runner (moved later with no attempt counted: never fired, never lost). The runner's
    grace for an unknown kind (10 s) passes on a ManualClock the test advances, not in real time."""
    clock = ManualClock()
    svc = DurableTimerService(store, TimerRegistry().register(Nop()), [P], clock=clock)
    with pytest.raises(ValueError, match=r"kind 200 has no handler.*\[247\]"):
        svc.schedule(P, DUE, 200, b"x")
    assert rows(store) == []
    due = clock.wall_ns() // 1_000_000 - 10
    schedule(store, P, due, 200, b"x")
    with svc:
        wait_until(lambda: svc.passes >= 1 and clock.waiting >= 1, "the service asleep on the clock")
        clock.advance(UNKNOWN_KIND_GRACE_MS / 1000)
        wait_until(lambda: [tk for tk, _ in rows(store) if tk.due_at_ms > due], "the row backed off", 20.0)
    assert [(tk.kind, tk.attempt, tk.due_at_ms > due) for tk, _ in rows(store)] == [(200, 0, True)]


def test_service_schedule_and_cancel_wrap_the_module_functions(store):
    svc = DurableTimerService(store, TimerRegistry().register(Nop()), [P])
    aware = dt.datetime.fromtimestamp(DUE / 1000, dt.timezone.utc)
    assert svc.schedule(P, aware, KIND, b"r") == keys.timer(DUE, KIND, b"r")
    assert svc.cancel(P, KIND, b"r") is True and svc.cancel(P, KIND, b"r") is False
    with pytest.raises(ValueError, match="not served"):
        svc.schedule("elsewhere", DUE, KIND, b"r")


def test_a_write_on_sqlite_reads_and_commits_in_one_transaction_and_one_that_raises_rolls_back(tmp_path):
    """On SQLite a by-name write's reads and its guarded batch run in one BEGIN IMMEDIATE transaction,
    the reads with no read transaction of their own; a write that raises (``if_exists="error"`` over
    a pending timer) rolls it back, writes nothing and leaves the file's write lock free."""
    import sqlite3

    from timerwheel_c.durable import TimerExists
    from timerwheel_c.durable.storage.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "timers.db")
    try:
        schedule(store, P, DUE, KIND, b"ref", b"v1")
        statements: list = []
        store._db.set_trace_callback(statements.append)
        schedule(store, P, DUE + 1, KIND, b"ref", b"v2")
        begins = [i for i, s in enumerate(statements) if s.startswith("BEGIN")]
        reads = [i for i, s in enumerate(statements) if s.startswith("SELECT") and "timerwheel_kv" in s]
        assert len(begins) == 1 and statements[begins[0]] == "BEGIN IMMEDIATE" and statements[-1] == "COMMIT"
        assert reads and min(reads) > begins[0]
        statements.clear()
        with pytest.raises(TimerExists):
            schedule(store, P, DUE + 2, KIND, b"ref", b"v3", if_exists="error")
        assert statements[-1] == "ROLLBACK"
        store._db.set_trace_callback(None)
        other = sqlite3.connect(tmp_path / "timers.db", timeout=0, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # raises "database is locked" were the write lock still held
        other.execute("ROLLBACK")
        other.close()
        assert [v for _, v in rows(store)] == [b"v2"]
    finally:
        store.close()

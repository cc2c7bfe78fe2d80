"""Regression tests for durable-timer bugs found by adversarial testing.

Each test was xfail(strict=True) until its fix landed; all are fixed now.
"""
import threading

import pytest

from timerwheel_c.durable import (
    Batch, Done, DurableTimerService, SQLiteStore, TimerHandler, TimerKind, TimerRegistry, keys, run_due,
)


class _Mark(TimerHandler):
    kind = TimerKind(1)

    def fire(self, ctx, timer):
        return Done(Batch().put(b"done/" + timer.reference, b"1"))


def test_malformed_rows_do_not_starve_due_timers():
    """Never lost: malformed rows are kept and counted, but they must not stop well-formed due
    timers from firing. With 600 malformed rows (kind byte 0) due before one real timer, every
    tick spent its whole max_scanned (512) on them, stopped on budget and never reached the timer.
    Now each is counted once and moved to the quarantine range, so the timer fires. Deterministic: explicit now_ms, no threads."""
    store = SQLiteStore(":memory:")
    registry = TimerRegistry().register(_Mark())
    b = Batch()
    for i in range(600):
        b.put(keys.TAG + (1).to_bytes(8, "big") + b"\x00" + i.to_bytes(4, "big"), b"")
    b.put(keys.timer(2, 1, b"real"), b"v")
    store.apply("p", b)
    malformed = 0
    for tick in range(20):
        malformed += run_due(store, "p", registry, 1_000 + tick * 10_000).malformed
    assert malformed == 600, "each malformed row is counted once (then quarantined)"
    assert store.get("p", b"done/real") == b"1"
    kept = store.scan("p", *keys.QUARANTINE_RANGE, limit=1000).entries
    assert len(kept) == 600, "malformed rows are retained, not lost"


def test_start_after_stop_does_not_hang():
    """``start()`` returns (or raises) promptly whatever came before: after ``stop()`` on a service
    that never started, ``start()`` once waited forever on an event its thread never sets. Checked
    from a daemon thread with a 5 s bound, so a hang fails the test instead of the suite."""
    svc = DurableTimerService(SQLiteStore(":memory:"), TimerRegistry(), ["p"])
    svc.stop()
    outcome = []

    def go():
        try:
            svc.start()
            outcome.append("started")
        except Exception as exc:  # a clear RuntimeError is an acceptable fix
            outcome.append(type(exc).__name__)
        finally:
            svc.stop()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "start() after stop() hung"
    assert outcome == ["RuntimeError"], "the documented lifecycle is one-shot: start after stop raises"


def test_run_with_unopenable_store_is_a_clear_error(tmp_path, capsys):
    """Bad input gets a clear, specific error: ``timerwheel-c run --store sqlite:////no/such/dir/x.db``
    (or a file that is not a database) once escaped as a ``sqlite3.OperationalError`` traceback
    with exit 1, unlike the other bad arguments, which print one line and exit 2."""
    from timerwheel_c.cli import main

    not_a_db = tmp_path / "not-a-db"
    not_a_db.write_bytes(b"this is not sqlite" * 100)
    for url in (f"sqlite:///{tmp_path}/no/such/dir/x.db", f"sqlite:///{not_a_db}"):
        assert main(["run", "--store", url, "--handlers", "timerwheel_c.durable:TimerRegistry"]) == 2
        assert url in capsys.readouterr().err


def test_infinite_max_sleep_is_rejected_or_works():
    """Bad input gets a clear exception up front, never a broken service: ``max_sleep_s=inf``
    once passed the constructor's ``> 0`` check, then every pass died in ``int(inf * 1e9)``
    (OverflowError) and the thread restarted its loop every 50 ms, logging a traceback each time.
    Either ValueError at construction or a service that runs without such failures is fine."""
    import logging
    import time

    records = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Collect()
    logger = logging.getLogger("timerwheel_c.durable")
    logger.addHandler(handler)
    try:
        try:
            svc = DurableTimerService(SQLiteStore(":memory:"), TimerRegistry(), ["p"], max_sleep_s=float("inf"))
        except ValueError:
            return
        with svc:
            time.sleep(0.5)
        assert not [r for r in records if "failed" in r], records[:3]
    finally:
        logger.removeHandler(handler)


def test_run_with_empty_partition_is_a_clear_error(tmp_path, capsys):
    """``--partition ''`` is a bad argument: exit 2 and one line naming it, no traceback, and the
    store is not even created."""
    from timerwheel_c.cli import main

    db = tmp_path / "x.db"
    assert main(["run", "--store", f"sqlite:///{db}", "--handlers", "timerwheel_c.durable:TimerRegistry", "--partition", ""]) == 2
    err = capsys.readouterr().err
    assert "--partition" in err and "''" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not db.exists()


def test_run_with_refused_postgres_is_a_clear_error(capsys):
    """A refused PostgreSQL connection (port 1 on loopback: nothing listens there) exits 2 with one
    line naming the URL, its password redacted."""
    pytest.importorskip("psycopg")
    from timerwheel_c.cli import main

    url = "postgresql://postgres:sekrit@127.0.0.1:1/postgres?connect_timeout=5"
    assert main(["run", "--store", url, "--handlers", "timerwheel_c.durable:TimerRegistry"]) == 2
    err = capsys.readouterr().err
    assert "postgresql://postgres:***@127.0.0.1:1/postgres" in err and "sekrit" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan"), 0, -1.0])
def test_max_sleep_must_be_finite_and_positive(bad):
    """``max_sleep_s`` must be finite and > 0 seconds: a ValueError naming the value, at construction."""
    with pytest.raises(ValueError, match="max_sleep_s must be finite and > 0 seconds, got " + repr(bad)):
        DurableTimerService(SQLiteStore(":memory:"), TimerRegistry(), ["p"], max_sleep_s=bad)
    with pytest.raises(TypeError, match="max_sleep_s"):
        DurableTimerService(SQLiteStore(":memory:"), TimerRegistry(), ["p"], max_sleep_s="5")

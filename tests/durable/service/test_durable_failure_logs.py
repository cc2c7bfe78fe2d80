"""How a service logs its failed store calls (``Recorder.store_failed``): a store-wide refusal (a
full disk, a read-only server) fails every partition's calls, and a call that gets through between
them ends that partition's run of failures, so each retry is the first of a run. At most one WARNING
(or ERROR) per kind of call, error type and code per STORE_FAILURE_LOG_EVERY_S, the next one saying
how many were left out. On a full disk a runner logged about three WARNINGs a second, one per
partition and retry, each "(1 in a row)"."""
from __future__ import annotations

import logging

from timerwheel_c.durable.service.metrics import STORE_FAILURE_LOG_EVERY_S, Recorder
from timerwheel_c.durable.storage.errors import PermanentStoreError, TransientStoreError


def _logged(caplog, level: int) -> list:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_a_store_wide_refusal_logs_one_warning_per_interval_whatever_the_partitions(caplog):
    now_s = [1000.0]
    recorder = Recorder(monotonic=lambda: now_s[0])
    full = TransientStoreError("SQLite database 'x.db': database or disk is full (SQLITE_FULL)", "SQLITE_FULL")
    with caplog.at_level(logging.DEBUG, logger="timerwheel_c.durable"):
        for _ in range(3):
            for partition in ("a", "b", "c", "d"):
                recorder.store_failed(full, 1, f"commit on partition {partition!r}", 0.05, kind="commit")
            now_s[0] += 1.0
        warnings = _logged(caplog, logging.WARNING)
        assert len(warnings) == 1 and "commit on partition 'a'" in warnings[0] and "disk is full" in warnings[0]
        assert len(_logged(caplog, logging.DEBUG)) == 11  # the others: kept, at DEBUG
        # Another kind of call, or another error, is its own: logged at once.
        recorder.store_failed(full, 1, "pass on partition 'a'", 0.05, kind="pass")
        recorder.store_failed(TransientStoreError("PostgreSQL: read-only (SQLSTATE 25006)", "25006"), 1,
                              "commit on partition 'a'", 0.05, kind="commit")
        assert len(_logged(caplog, logging.WARNING)) == 3
        # Once the interval has passed, the next first failure logs again, saying how many were left out.
        now_s[0] += STORE_FAILURE_LOG_EVERY_S
        recorder.store_failed(full, 1, "commit on partition 'b'", 0.05, kind="commit")
        last = _logged(caplog, logging.WARNING)[-1]
        assert "commit on partition 'b'" in last and "11 more like it" in last, last
    assert recorder.transient_errors == 15


def test_an_unexpected_store_error_logs_its_traceback_once_per_interval(caplog):
    now_s = [0.0]
    recorder = Recorder(monotonic=lambda: now_s[0])
    replaced = PermanentStoreError("SQLite database 'x.db' was deleted or replaced since this store opened it")
    with caplog.at_level(logging.DEBUG, logger="timerwheel_c.durable"):
        for failures in range(1, 6):
            recorder.store_failed(replaced, failures, "pass", 5.0)
            now_s[0] += 5.0
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and errors[0].exc_info is not None
        now_s[0] += STORE_FAILURE_LOG_EVERY_S
        recorder.store_failed(replaced, 6, "pass", 5.0)
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 2 and "4 more like it" in errors[1].getMessage()
    assert recorder.other_errors == 6


def test_distinct_unexpected_errors_each_reach_error(caplog):
    """Each distinct unexpected error (another message, another partition) is logged at ERROR at once:
    only the same one again is held back. Keyed by kind alone, one partition's error hid another's
    for as long as both failed."""
    recorder = Recorder(monotonic=lambda: 0.0)
    with caplog.at_level(logging.DEBUG, logger="timerwheel_c.durable"):
        for _ in range(3):
            recorder.store_failed(ValueError("bad row in c"), 1, "pass on partition 'c'", 5.0, kind="pass")
            recorder.store_failed(ValueError("bad row in d"), 1, "pass on partition 'd'", 5.0, kind="pass")
            recorder.store_failed(PermanentStoreError("no such table"), 1, "pass on partition 'd'", 5.0, kind="pass")
    errors = _logged(caplog, logging.ERROR)
    assert len(errors) == 3 and {"'c'" in e for e in errors} == {True, False}, errors


def test_the_failures_remembered_for_the_limit_stay_bounded(caplog):
    """Unexpected errors whose message differs every time (a row's key in it) are each logged, and
    the failures remembered for the limit stay bounded: those past their interval are forgotten."""
    from timerwheel_c.durable.service import metrics

    now_s = [0.0]
    recorder = Recorder(monotonic=lambda: now_s[0])
    with caplog.at_level(logging.ERROR, logger="timerwheel_c.durable"):
        for i in range(5 * metrics._LOGGED_KEYS_MAX):  # all within one interval
            recorder.store_failed(ValueError(f"bad row {i}"), 1, "pass", 5.0)
            assert len(recorder._logged) <= metrics._LOGGED_KEYS_MAX
        recorder.store_failed(ValueError("bad row 0"), 1, "pass", 5.0)  # forgotten: logged again
    assert len(_logged(caplog, logging.ERROR)) == 5 * metrics._LOGGED_KEYS_MAX + 1


def test_a_store_errors_text_is_logged_on_one_line_with_its_control_characters_escaped(caplog):
    """A store error's text (a driver's message, which may quote what an application wrote) holding a
    newline and a terminal's escape is logged escaped, as repr shows them, in the transient warning's
    message and in the unexpected error's traceback: no forged log line, no raw escape."""
    forged = "2026-12-05 19:00:00,000 CRITICAL timerwheel_c.durable: FAKE"
    recorder = Recorder(monotonic=lambda: 0.0)
    caplog.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    with caplog.at_level(logging.DEBUG, logger="timerwheel_c.durable"):
        recorder.store_failed(TransientStoreError(f"busy \x1b[2J{forged}", "X"), 1, "pass", 0.05, kind="pass")
        recorder.store_failed(PermanentStoreError(f"gone\n{forged}\x1b[2J"), 1, "commit", 0.05)
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.ERROR]  # the situation to test
    text = caplog.text
    assert "\x1b" not in text and "\\x1b[2J" in text and f"gone\\n{forged}" in text
    assert not any(line.startswith(forged) for line in text.splitlines()), text

"""Attempts and parking, driven through run_due with the test's own clock (now_ms) on every store
backend: a timer whose handler fails its last attempt (``max_attempts``) is parked (kept with its
attempt count, original due time and last error, never scanned or fired again) and requeue puts it
back; the logs name the timer decoded, never by its raw key. Each tick runs at the row's retry
time, so no test waits on a real clock and none can flake on timing."""
from __future__ import annotations

import logging

import pytest

from timerwheel_c.durable import (Done, Every, Retry, TimerHandler, TimerKind, TimerRegistry, add_schedule, aio,
                                  cancel, get_schedule, get_timer, list_timers, requeue, resume_schedule, run_due,
                                  schedule)
from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.registry import DEFAULT_MAX_ATTEMPTS

P = "park"
KIND = 0xF2
NOW = 1_800_000_000_000  # Unix epoch ms
MIN = 60_000


class Failing(TimerHandler):
    """Answers each fire with ``answer(timer)`` (default: raise); records every timer it saw."""

    kind = TimerKind(KIND)

    def __init__(self, max_attempts=3, answer=None):
        self.max_attempts = max_attempts
        self.answer = answer
        self.seen: list = []

    def fire(self, ctx, timer):
        self.seen.append(timer)
        if self.answer is None:
            raise RuntimeError(f"boom on attempt {timer.attempt}")
        return self.answer(timer)


def retry_time(store, reference=b"r"):
    """The due time of the timer's next attempt (its row's effective due time)."""
    return get_timer(store, P, KIND, reference).due_at_ms


def run_to_the_end(store, handler, reference=b"r", ticks=100):
    """Tick at each retry time until the timer is parked or gone; returns the ticks' reports."""
    registry = TimerRegistry().register(handler)
    reports = []
    for _ in range(ticks):
        timer = get_timer(store, P, KIND, reference)
        if timer is None or timer.state == "parked":
            return reports
        reports.append(run_due(store, P, registry, max(timer.due_at_ms, NOW)))
    raise AssertionError(f"not parked after {ticks} ticks")


@pytest.mark.parametrize("how", ["raise", "no-outcome", "retry"])
def test_last_failed_attempt_parks_the_timer(durable_store, how, caplog):
    """An exception, a return value that is not an outcome (a forgotten ``return Done()``) and Retry
    each count as a failed attempt: after the third of max_attempts=3 the timer is parked with its
    attempt count, original due time, value and last error, listed as parked, and later ticks
    neither scan nor fire it."""
    answers = {"raise": None, "no-outcome": lambda t: None, "retry": lambda t: Retry()}
    handler = Failing(3, answers[how])
    schedule(durable_store, P, NOW, KIND, b"r", b"payload")
    with caplog.at_level(logging.CRITICAL, logger="timerwheel_c.durable"):
        reports = run_to_the_end(durable_store, handler)
    assert [t.attempt for t in handler.seen] == [1, 2, 3]
    assert [r.failed for r in reports] == [1, 1, 1] and [r.parked for r in reports] == [0, 0, 1]
    assert reports[-1].parked_kinds == {KIND: 1}
    timer = get_timer(durable_store, P, KIND, b"r")
    assert (timer.state, timer.attempt, timer.due_at_ms, timer.value) == ("parked", 3, NOW, b"payload")
    assert timer.last_error == {"raise": "RuntimeError: boom on attempt 3",
                                "no-outcome": "the handler returned None, not Done, Reschedule or Retry",
                                "retry": "Retry: the handler asked to try again later"}[how]
    assert timer.parked_at_ms is not None and timer.parked_at_ms >= NOW
    assert list_timers(durable_store, P, state="parked") == [timer] == list_timers(durable_store, P)
    assert list_timers(durable_store, P, state="retrying") == []
    far = NOW + 365 * 24 * 3600 * 1000
    report = run_due(durable_store, P, TimerRegistry().register(handler), far)
    assert (report.scanned, report.fired, report.failed, len(handler.seen)) == (0, 0, 0, 3)
    assert report.next_wake_ms is None  # a parked timer is no reason to wake


def test_max_attempts_none_retries_past_the_default(durable_store, caplog):
    """max_attempts=None retries for ever: past the default's 20 attempts the timer is still retrying,
    with its last attempt's error."""
    handler = Failing(None)
    registry = TimerRegistry().register(handler)
    schedule(durable_store, P, NOW, KIND, b"r")
    with caplog.at_level(logging.CRITICAL, logger="timerwheel_c.durable"):
        for _ in range(DEFAULT_MAX_ATTEMPTS + 5):
            run_due(durable_store, P, registry, retry_time(durable_store))
    timer = get_timer(durable_store, P, KIND, b"r")
    assert (timer.state, timer.attempt, timer.last_error) == ("retrying", DEFAULT_MAX_ATTEMPTS + 5,
                                                              f"RuntimeError: boom on attempt {DEFAULT_MAX_ATTEMPTS + 5}")


def test_a_row_due_with_its_attempts_used_is_parked_not_fired(durable_store, caplog):
    """A row that comes due with attempt == max_attempts already claimed (its runner died during
    that attempt: the claim counted it) is parked by the claim, the handler never called, with a
    last error saying the runner stopped during that attempt."""
    handler = Failing(2, lambda t: Done())
    # The row as a claim of attempt 2 leaves it: backed off, its identity row pointing at it.
    claimed = keys.backoff(NOW + 10_000, KIND, 2, NOW, b"r")
    schedule(durable_store, P, NOW, KIND, b"r", b"v")
    durable_store.apply(P, keys_moved(durable_store, claimed))
    with caplog.at_level(logging.DEBUG, logger="timerwheel_c.durable"):
        report = run_due(durable_store, P, TimerRegistry().register(handler), NOW + 10_000)
    assert handler.seen == [] and (report.parked, report.fired, report.parked_kinds) == (1, 0, {KIND: 1})
    timer = get_timer(durable_store, P, KIND, b"r")
    assert (timer.state, timer.attempt, timer.value) == ("parked", 2, b"v")
    assert "stopped during attempt 2 of 2" in timer.last_error
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "parked" in record.getMessage() and "reference 'r' attempt 2 of 2" in record.getMessage()


def keys_moved(store, claimed):
    """The batch that moves the timer ``r`` to ``claimed``, as a claim does."""
    from timerwheel_c.durable.storage.store import Batch

    key = keys.timer(NOW, KIND, b"r")
    return (Batch().delete(key).put(claimed, store.get(P, key)).put(keys.identity(KIND, b"r"), claimed))


@pytest.mark.parametrize("state", ["parked", "retrying"])
def test_requeue_resets_attempts_and_the_timer_fires(durable_store, state, caplog):
    """requeue puts a parked or a retrying timer back to scheduled, due now by default (or at
    ``due_at``), its attempt count reset and its value kept; the next tick fires it as attempt 1."""
    handler = Failing(2)
    registry = TimerRegistry().register(handler)
    schedule(durable_store, P, NOW, KIND, b"r", b"payload")
    with caplog.at_level(logging.CRITICAL, logger="timerwheel_c.durable"):
        if state == "parked":
            run_to_the_end(durable_store, handler)
        else:
            run_due(durable_store, P, registry, NOW)
    assert get_timer(durable_store, P, KIND, b"r").state == state
    assert requeue(durable_store, P, NOW + MIN, KIND, b"r") is True
    timer = get_timer(durable_store, P, KIND, b"r")
    assert (timer.state, timer.attempt, timer.due_at_ms, timer.value, timer.last_error) == (
        "scheduled", 0, NOW + MIN, b"payload", None)
    assert list_timers(durable_store, P, state="parked") == []
    handler.answer = lambda t: Done()
    report = run_due(durable_store, P, registry, NOW + MIN)
    assert report.fired == 1 and handler.seen[-1].attempt == 1 and handler.seen[-1].value == b"payload"
    assert get_timer(durable_store, P, KIND, b"r") is None


def test_requeue_defaults_to_now_and_a_missing_timer_is_false(durable_store):
    """requeue without due_at makes the timer due now (wall clock); with no timer of that name it
    returns False and writes nothing."""
    import time

    schedule(durable_store, P, NOW + 10 * MIN, KIND, b"r")
    before = time.time_ns() // 1_000_000
    assert requeue(durable_store, P, None, KIND, b"r") is True
    after = time.time_ns() // 1_000_000
    assert before <= get_timer(durable_store, P, KIND, b"r").due_at_ms <= after
    assert requeue(durable_store, P, kind=KIND, reference=b"missing") is False
    assert get_timer(durable_store, P, KIND, b"missing") is None


def test_aio_requeue_forwards_to_requeue(durable_store, caplog):
    """``await aio.requeue`` is the sync requeue on the store's writer thread."""
    import asyncio

    handler = Failing(1)
    schedule(durable_store, P, NOW, KIND, b"r")
    with caplog.at_level(logging.CRITICAL, logger="timerwheel_c.durable"):
        run_to_the_end(durable_store, handler)
    assert asyncio.run(aio.requeue(durable_store, P, NOW, KIND, b"r")) is True
    assert get_timer(durable_store, P, KIND, b"r").state == "scheduled"
    assert asyncio.run(aio.requeue(durable_store, P, None, KIND, b"nobody")) is False


def test_a_parked_timer_is_cancelled_and_replaced_by_name(durable_store, caplog):
    """A parked timer keeps its name: cancel removes it, and schedule replaces it even with
    if_exists="keep" or "error" (a failed timer does not hold its name against a new start)."""
    handler = Failing(1)
    schedule(durable_store, P, NOW, KIND, b"r")
    with caplog.at_level(logging.CRITICAL, logger="timerwheel_c.durable"):
        run_to_the_end(durable_store, handler)
    schedule(durable_store, P, NOW + MIN, KIND, b"r", b"new", if_exists="error")
    timer = get_timer(durable_store, P, KIND, b"r")
    assert (timer.state, timer.value, timer.due_at_ms) == ("scheduled", b"new", NOW + MIN)
    assert list_timers(durable_store, P, state="parked") == []
    with caplog.at_level(logging.CRITICAL, logger="timerwheel_c.durable"):
        run_to_the_end(durable_store, handler)
    assert cancel(durable_store, P, KIND, b"r") is True
    assert get_timer(durable_store, P, KIND, b"r") is None and list_timers(durable_store, P) == []


def test_failures_are_logged_by_name_at_their_levels(durable_store, caplog):
    """Each failed attempt logs one WARNING naming the timer decoded (partition, kind with its
    handler's class, reference as text or hex, attempt of max, due time in ISO UTC) with the error;
    the traceback goes at DEBUG for the attempts before the last and at ERROR for the one that parks
    the timer. No record carries a raw key."""
    handler = Failing(2)
    binary = b"\x00\xffref"
    schedule(durable_store, P, NOW, KIND, binary)
    with caplog.at_level(logging.DEBUG, logger="timerwheel_c.durable"):
        run_to_the_end(durable_store, handler, binary)
    name = f"partition 'park' kind {KIND} (Failing) reference hex {binary.hex()}"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"timer {name} attempt 1 of 2 due 2027-01-15T08:00:00.000Z failed: RuntimeError: boom on attempt 1; "
        f"tried again at 2027-01-15T08:00:05.000Z",
        f"timer {name} attempt 2 of 2 due 2027-01-15T08:00:00.000Z failed: RuntimeError: boom on attempt 2; "
        "it was the last attempt"]
    tracebacks = [(r.levelno, r.exc_info[1].args[0]) for r in caplog.records if r.exc_info]
    assert tracebacks == [(logging.DEBUG, "boom on attempt 1"), (logging.ERROR, "boom on attempt 2")]
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert error.getMessage().startswith(f"timer {name} attempt 2 of 2") and "parked" in error.getMessage()
    for r in caplog.records:
        text = r.getMessage()
        assert "\\x" not in text and "b'T" not in text and "b'P" not in text, text


def test_last_error_is_redacted_and_bounded_on_a_character_boundary(durable_store, caplog):
    """A last error quoting a store URL keeps its password out of the parked row and the logs, and
    an error message of 4,000 two-byte characters is cut to MAX_ERROR_BYTES of valid UTF-8."""
    secret = "s3cr3t-pw"
    url = f"postgresql://app:{secret}@db.example/timers"

    def answer(timer):
        if timer.reference == b"url":
            raise ConnectionError(f"cannot reach {url}")
        raise ValueError("é" * 4000)

    handler = Failing(1, answer)
    schedule(durable_store, P, NOW, KIND, b"url")
    schedule(durable_store, P, NOW, KIND, b"long")
    with caplog.at_level(logging.DEBUG, logger="timerwheel_c.durable"):
        run_due(durable_store, P, TimerRegistry().register(handler), NOW)
    url_timer = get_timer(durable_store, P, KIND, b"url")
    assert url_timer.last_error == "ConnectionError: cannot reach postgresql://app:***@db.example/timers"
    assert all(secret not in r.getMessage() for r in caplog.records)
    long_error = get_timer(durable_store, P, KIND, b"long").last_error
    assert long_error.startswith("ValueError: éé") and long_error.endswith("\u2026")
    assert len(long_error.encode("utf-8")) <= keys.MAX_ERROR_BYTES
    assert len(long_error.encode("utf-8")) > keys.MAX_ERROR_BYTES - 4  # cut at the bound, not far before it


def test_a_parked_occurrence_pauses_its_schedule_and_resume_continues_it(durable_store, caplog):
    """An occurrence whose last attempt fails is parked and its schedule paused (listed as parked,
    the schedule reported paused, nothing more fires); resume_schedule drops the parked occurrence
    and continues the schedule, the missed occurrence fired under its misfire policy."""
    handler = Failing(2)
    registry = TimerRegistry().register(handler)
    add_schedule(durable_store, P, "tick", Every(60, start=NOW), KIND)
    with caplog.at_level(logging.CRITICAL, logger="timerwheel_c.durable"):
        run_due(durable_store, P, registry, NOW + MIN)
        [pending] = list_timers(durable_store, P)
        run_due(durable_store, P, registry, pending.due_at_ms)
    assert [(t.due_at_ms, t.attempt) for t in handler.seen] == [(NOW + MIN, 1), (NOW + MIN, 2)]
    [parked] = list_timers(durable_store, P)
    assert (parked.state, parked.reference, parked.attempt, parked.due_at_ms) == ("parked", b"tick", 2, NOW + MIN)
    assert get_schedule(durable_store, P, "tick").paused
    report = run_due(durable_store, P, registry, NOW + 10 * MIN)
    assert (report.scanned, len(handler.seen)) == (0, 2)
    handler.answer = lambda t: Done()
    assert resume_schedule(durable_store, P, "tick")
    assert list_timers(durable_store, P, state="parked") == []
    run_due(durable_store, P, registry, NOW + 10 * MIN)
    assert handler.seen[-1].due_at_ms == NOW + 10 * MIN and handler.seen[-1].attempt == 1  # misfire "once"
    info = get_schedule(durable_store, P, "tick")
    assert not info.paused and info.next_fire_ms == NOW + 11 * MIN


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-1, ValueError), (2**32, ValueError), (True, TypeError),
                                        (2.5, TypeError), ("3", TypeError)])
def test_bad_max_attempts_is_refused_naming_the_value(bad, error):
    """max_attempts must be an int in 1..2**32-1 (the most attempts a row's key counts) or None:
    register refuses anything else, naming the value."""
    handler = Failing(bad)
    with pytest.raises(error, match="max_attempts") as info:
        TimerRegistry().register(handler)
    assert repr(bad) in str(info.value)


def test_parked_keys_and_values_round_trip():
    """The parked layout: the backed-off key with tag P and the park time, parsed back; a parked
    value gives back the error and the timer's value, the error cut on a character boundary."""
    tk = keys.parse(keys.backoff(NOW + 5000, KIND, 3, NOW, b"ref", occurrence=True))
    key = keys.parked(NOW + 7000, tk)
    assert keys.is_parked_key(key) and keys.PARKED_RANGE[0] <= key < keys.PARKED_RANGE[1]
    assert not keys.is_timer_key(key) and keys.is_parked_key(key)
    back = keys.parse_parked(key)
    assert (back.due_at_ms, back.kind, back.attempt, back.original_due_at_ms, back.reference, back.occurrence) == (
        NOW + 7000, KIND, 3, NOW, b"ref", True)
    with pytest.raises(keys.MalformedKey):
        keys.parse_parked(keys.timer(NOW, KIND, b"ref"))
    assert keys.parked_parts(keys.parked_value("oops", b"\x00value")) == ("oops", b"\x00value")
    error, value = keys.parked_parts(keys.parked_value("€" * 1000, b"v"))
    assert value == b"v" and len(error.encode()) <= keys.MAX_ERROR_BYTES and set(error[:-1]) == {"€"}


def test_claim_and_commit_logs_name_rows_never_by_raw_key(durable_store, caplog):
    """The log lines of the claim and commit phases name a timer as the failure lines do, and a
    malformed row by a hex prefix: an outcome batch whose own guard fails names the timer and the
    guarded row as text, and a malformed row kept in place (its quarantine key taken) names its key
    in hex. No record carries raw key bytes."""
    from timerwheel_c.durable.storage.store import Batch, Equals

    bad = keys.TAG + b"\x00"
    durable_store.apply(P, Batch().put(bad, b"new").put(keys.quarantine(bad), b"old"))
    schedule(durable_store, P, NOW, KIND, b"t0")
    handler = Failing(3, lambda t: Done(Batch().require(Equals(b"done/t0", b"x"))))
    with caplog.at_level(logging.DEBUG, logger="timerwheel_c.durable"):
        report = run_due(durable_store, P, TimerRegistry().register(handler), NOW)
    assert (report.failed, report.malformed) == (1, 1)
    messages = [r.getMessage() for r in caplog.records]
    assert f"partition 'park' malformed row {bad.hex()} kept in place (its quarantine guard failed)" in messages
    [guard] = [m for m in messages if "failed its guard" in m]
    assert guard.startswith(f"timer partition 'park' kind {KIND} (Failing) reference 't0' attempt 1 of 3 due ")
    assert "on the row 'done/t0'" in guard
    assert all("\\x" not in m and "b'T" not in m for m in messages), messages


class Unprintable(Exception):
    """An exception whose ``str()`` itself raises (as a buggy ``__str__`` does)."""

    def __str__(self):
        raise RuntimeError("__str__ failed")


class BadRepr:
    """A return value whose ``repr()`` raises."""

    def __repr__(self):
        raise RuntimeError("__repr__ failed")


@pytest.mark.parametrize("answer", ["unprintable", "bad-repr"])
def test_a_failure_that_cannot_be_printed_still_parks_the_timer(durable_store, answer, caplog):
    """A handler raising an exception whose ``str()`` raises, or returning an object whose
    ``repr()`` raises, is a failure like any other: its last attempt parks the timer with a last
    error naming the type (as the traceback module prints such an exception), instead of the error
    escaping the runner and leaving the row claimed."""
    def fail(timer):
        if answer == "unprintable":
            raise Unprintable()
        return BadRepr()

    schedule(durable_store, P, NOW, KIND, b"r")
    with caplog.at_level(logging.DEBUG, logger="timerwheel_c.durable"):
        run_due(durable_store, P, TimerRegistry().register(Failing(1, fail)), NOW)
    parked = get_timer(durable_store, P, KIND, b"r")
    assert (parked.state, parked.attempt) == ("parked", 1)
    assert ("Unprintable" if answer == "unprintable" else "BadRepr") in parked.last_error


def test_a_huge_error_message_is_bounded_in_the_log_lines_too(durable_store, caplog):
    """An exception message a hundred times MAX_ERROR_BYTES is cut to MAX_ERROR_BYTES in the WARNING
    and ERROR lines that quote it, as in the parked row, so that a failing timer cannot flood the logs
    each attempt."""
    schedule(durable_store, P, NOW, KIND, b"r")

    def fail(timer):
        raise ValueError("x" * (100 * keys.MAX_ERROR_BYTES))

    with caplog.at_level(logging.WARNING, logger="timerwheel_c.durable"):
        run_due(durable_store, P, TimerRegistry().register(Failing(1, fail)), NOW)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 2  # the failure at WARNING, the parking at ERROR: the situation to test
    assert all(len(line.encode()) < keys.MAX_ERROR_BYTES + 500 for line in lines), [len(x) for x in lines]


def test_a_password_in_a_handlers_exception_is_masked_in_the_logged_tracebacks(durable_store, caplog):
    """A handler raising an error that quotes a database URL with its password: the tracebacks logged
    at DEBUG (an attempt before the last) and ERROR (the one that parks it) mask the password as the
    messages do, whatever formatter the application's handlers use; the record still carries the
    exception itself (``exc_info``) for handlers that report it."""
    secret = "tr4ceb4ck-pw"

    def fail(timer):
        raise ConnectionError(f"cannot reach postgresql://app:{secret}@db.example/orders")

    schedule(durable_store, P, NOW, KIND, b"r")
    with caplog.at_level(logging.DEBUG, logger="timerwheel_c.durable"):
        run_to_the_end(durable_store, Failing(2, fail))
    with_traceback = [r for r in caplog.records if r.exc_info]
    assert [r.levelno for r in with_traceback] == [logging.DEBUG, logging.ERROR]  # the situation to test
    assert "Traceback" in caplog.text and "postgresql://app:***@db.example" in caplog.text
    assert secret not in caplog.text
    assert all(isinstance(r.exc_info[1], ConnectionError) for r in with_traceback)


FORGED = "2026-12-05 19:00:00,000 CRITICAL timerwheel_c.durable: FAKE"


def test_a_handlers_message_cannot_forge_a_log_line_or_drive_a_terminal(durable_store, caplog):
    """A handler raising an error whose message holds a newline, a line shaped like a log record and a
    terminal's escape: every line logged of its failures (the attempt retried, the one that parks it,
    and their tracebacks, as any formatter prints them) shows the message on one line with its control
    characters escaped, as repr shows them and as the partitions and references already are."""

    def fail(timer):
        raise RuntimeError(f"x\n{FORGED}\x1b[2J")

    schedule(durable_store, P, NOW, KIND, b"r")
    caplog.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    with caplog.at_level(logging.DEBUG, logger="timerwheel_c.durable"):
        run_to_the_end(durable_store, Failing(2, fail))
    assert [r.levelno for r in caplog.records if r.exc_info] == [logging.DEBUG, logging.ERROR]  # the situation
    text = caplog.text
    assert "\x1b" not in text and f"x\\n{FORGED}\\x1b[2J" in text
    assert not any(line.startswith(FORGED) for line in text.splitlines()), text


@pytest.mark.parametrize("given", ["url", "passfile=", "service=", "PGPASSWORD", "PGPASSFILE", "PGSERVICE"])
def test_a_stores_own_password_quoted_bare_by_a_handler_is_masked_in_the_parked_row_and_the_logs(
        schema_url, caplog, tmp_path, monkeypatch, given):
    """A handler's exception quoting the store's password bare (not in a URL or a ``password=``
    parameter, which are masked whatever the password): the store remembers its password when it
    opens, however libpq is given it (in the URL, in a password file or service section the URL
    names, or from the environment: ``PGPASSWORD``, the password file, a ``PGSERVICE`` section), so the
    parked row's last error and the log lines mask it too (they kept one from the environment). The
    password file's other lines are no secret of the store's: a URL that named the file masked them
    all, an ordinary word among them included, wherever it appeared."""
    from timerwheel_c.durable.storage.postgres import PostgresStore
    from timerwheel_c.durable.storage.redact import redact

    monkeypatch.delenv("PGPASSWORD", raising=False)
    secret = f"bare-St0re-pw-{given}"  # the test server trusts loopback: any password connects
    url = schema_url
    if given == "url":
        url = schema_url.replace("://postgres@", f"://postgres:{secret}@", 1)
        assert secret in url
    elif given == "PGPASSWORD":
        monkeypatch.setenv("PGPASSWORD", secret)
    elif given in ("PGPASSFILE", "passfile="):
        # libpq takes the line that matches the connection, its password ending at the first unescaped
        # ":" (so SECRET of "...:SECRET:tail"); the other lines' passwords (another host's, another
        # user's) are no secret of the store's, and an ordinary word among them stays unmasked.
        (tmp_path / "pgpass").write_text("# a comment\r\nnohost.invalid:1:*:nobody:Another-Hosts-Word\r\n"
                                         f"*:*:*:postgres:{secret}:tail\r\n")
        (tmp_path / "pgpass").chmod(0o600)  # libpq ignores a password file others can read
        if given == "passfile=":
            url += ("&" if "?" in url else "?") + f"passfile={tmp_path / 'pgpass'}"
        else:
            monkeypatch.setenv("PGPASSFILE", str(tmp_path / "pgpass"))
    else:
        (tmp_path / "pg_service.conf").write_text(f"[timers]\npassword={secret}\n[other]\npassword=Another-Hosts-Word\n")
        monkeypatch.setenv("PGSERVICEFILE", str(tmp_path / "pg_service.conf"))
        if given == "service=":
            url += ("&" if "?" in url else "?") + "service=timers"
        else:
            monkeypatch.setenv("PGSERVICE", "timers")

    def fail(timer):
        raise RuntimeError(f"the vault answered {secret} for this job")

    with PostgresStore(url) as store:
        schedule(store, P, NOW, KIND, b"r")
        with caplog.at_level(logging.DEBUG, logger="timerwheel_c.durable"):
            run_to_the_end(store, Failing(1, fail))
        parked = get_timer(store, P, KIND, b"r")
    assert parked.state == "parked" and "the vault answered *** for this job" in parked.last_error
    assert secret not in parked.last_error and secret not in caplog.text
    assert redact("Another-Hosts-Word") == "Another-Hosts-Word"

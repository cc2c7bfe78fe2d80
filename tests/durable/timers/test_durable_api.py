"""The durable API's convenience forms: function handlers, relative due times, bulk writes. Each
test drives time by hand (an explicit ``now_ms`` to run_due) or waits within a generous liveness
bound for a timer already due, so none depends on the machine's speed."""
from __future__ import annotations

import logging
import time

import pytest

from timerwheel_c.durable import DurableTimerService, TimerKind, TimerRegistry, get_timer, schedule
from timerwheel_c.durable.storage.store import Batch
from timerwheel_c.durable.timers.registry import Done, FunctionHandler
from timerwheel_c.durable.timers.runner import run_due

P = "api"
NOW = 1_700_000_000_000
LIVENESS_S = 30


@pytest.fixture
def store(durable_store):
    return durable_store


def test_a_sync_function_handler_fires_and_keeps_its_options(store, caplog):
    """@registry.handler registers a plain function under its kind, returns it unchanged, and its
    max_attempts parks the timer after that many failures, logged under the function's name."""
    registry = TimerRegistry()
    seen = []

    @registry.handler(TimerKind(5), max_attempts=1)
    def expire(ctx, timer):
        seen.append((ctx.partition, timer.reference, timer.value))
        if timer.reference == b"bad":
            raise RuntimeError("boom")
        return Done(Batch().put(b"done/" + timer.reference, timer.value))

    assert callable(expire) and not isinstance(expire, FunctionHandler)
    assert isinstance(registry.get(5), FunctionHandler) and registry.get(5).max_attempts == 1
    schedule(store, P, NOW - 10, 5, b"ok", b"v")
    schedule(store, P, NOW - 5, 5, b"bad", b"w")
    with caplog.at_level(logging.WARNING, logger="timerwheel_c.durable"):
        run_due(store, P, registry, NOW)
    assert seen == [(P, b"ok", b"v"), (P, b"bad", b"w")]
    assert store.get(P, b"done/ok") == b"v" and get_timer(store, P, 5, b"ok") is None
    assert get_timer(store, P, 5, b"bad").state == "parked"
    assert "kind 5 (test_a_sync_function_handler_fires_and_keeps_its_options.<locals>.expire)" in caplog.text


def test_an_async_function_handler_is_awaited_by_the_service(store):
    """An ``async def`` registered with the decorator is awaited on the service's loop: its timer,
    already due, fires within the liveness bound."""
    registry = TimerRegistry()

    @registry.handler(6)
    async def remind(ctx, timer):
        return Done(Batch().put(b"reminded/" + timer.reference, b"1"))

    with DurableTimerService(store, registry, [P]) as service:
        service.schedule(P, time.time_ns() // 1_000_000 - 1, 6, b"u1")
        deadline = time.monotonic() + LIVENESS_S
        while store.get(P, b"reminded/u1") is None and time.monotonic() < deadline:
            time.sleep(0.01)
    assert store.get(P, b"reminded/u1") == b"1"


class Remind:
    """A handler object whose ``__call__`` is an ``async def``, as a class that keeps a client would be."""

    def __init__(self, tag: bytes):
        self.tag = tag

    async def __call__(self, ctx, timer):
        return Done(Batch().put(b"reminded/" + timer.reference, self.tag + b" " + timer.value["to"].encode()))


def test_an_object_with_an_async_call_is_awaited_by_the_service_and_run_due(store):
    """An object whose ``__call__`` is an ``async def`` (with a codec's decoding around it, too) is an async
    handler: the service awaits it on its loop and run_due on a loop of its own. It was called as a sync
    function, and each attempt failed on the coroutine it returned, never awaited, until it parked."""
    remind = TimerKind(7, "remind", codec="json")
    registry = TimerRegistry()
    registry.handler(remind)(Remind(b"service"))
    with DurableTimerService(store, registry, [P]) as service:
        service.schedule(P, time.time_ns() // 1_000_000 - 1, remind, b"u1", {"to": "ann"})
        deadline = time.monotonic() + LIVENESS_S
        while store.get(P, b"reminded/u1") is None and not service.failed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert service.failed == 0 and store.get(P, b"reminded/u1") == b"service ann"
    registry = TimerRegistry()
    registry.handler(remind)(Remind(b"run_due"))
    schedule(store, P, NOW - 1, remind, b"u2", {"to": "bo"})
    report = run_due(store, P, registry, NOW)
    assert report.failed == 0 and store.get(P, b"reminded/u2") == b"run_due bo"


def test_the_handler_decorator_checks_its_arguments_when_it_decorates():
    """A bad kind or option, a kind taken twice or a non-callable raise at decoration time, naming the value."""
    registry = TimerRegistry()
    with pytest.raises(ValueError, match="256"):
        registry.handler(256)(lambda ctx, timer: Done())
    with pytest.raises(ValueError, match="max_attempts"):
        registry.handler(1, max_attempts=0)(lambda ctx, timer: Done())
    with pytest.raises(TypeError, match="callable"):
        registry.handler(1)("not a function")
    registry.handler(1)(lambda ctx, timer: Done())
    with pytest.raises(ValueError, match="already registered"):
        registry.handler(1)(lambda ctx, timer: Done())


@pytest.fixture
def host_now(monkeypatch):
    """Relative due times count from this fixed 'now' (ms), not the wall clock."""
    from timerwheel_c.durable.timers import due

    monkeypatch.setattr(due, "relative_base_ms", lambda: NOW)
    return NOW


def test_a_timedelta_or_delay_seconds_is_due_that_long_from_now(store, host_now):
    """A timedelta where the due time goes, or ``delay=`` seconds (rounded up to the ms, never early),
    counts from now: schedule, reschedule, the service's writers and a Reschedule outcome alike."""
    import datetime

    from timerwheel_c.durable import Reschedule, reschedule

    schedule(store, P, datetime.timedelta(minutes=5), 1, b"a")
    assert get_timer(store, P, 1, b"a").due_at_ms == host_now + 300_000
    schedule(store, P, None, 1, b"b", b"v", delay=1.0001)
    assert get_timer(store, P, 1, b"b").due_at_ms == host_now + 1001
    assert reschedule(store, P, None, 1, b"b", delay=60)
    assert get_timer(store, P, 1, b"b").due_at_ms == host_now + 60_000
    assert reschedule(store, P, datetime.timedelta(microseconds=1), 1, b"a")
    assert get_timer(store, P, 1, b"a").due_at_ms == host_now + 1
    assert Reschedule(datetime.timedelta(seconds=2), b"").due_at_ms == host_now + 2000
    # The longest timedelta (about 2.7 million years) is a due time still, never an OverflowError.
    schedule(store, P, datetime.timedelta.max, 1, b"c")
    assert get_timer(store, P, 1, b"c").due_at_ms == host_now + datetime.timedelta.max // datetime.timedelta(milliseconds=1) + 1


def test_an_aware_datetime_between_two_ms_is_due_at_the_later_never_before_it(store):
    """A datetime holds us: one 0.9 ms past a whole ms was due at that ms (rounded down), so its timer
    could fire up to 0.999 ms before the instant given. It is rounded up, as a timedelta and delay= are;
    a whole ms stays as it is, and an instant a fraction of a ms before 1970 is still refused. A trigger's
    start and end, which bound occurrences rather than fire, stay rounded down."""
    import datetime

    from timerwheel_c.durable import Every, Reschedule

    utc = datetime.timezone.utc
    at = datetime.datetime(2027, 1, 15, 8, 0, 0, 900, tzinfo=utc)  # 0.9 ms past a whole ms
    whole_ms = (at.replace(microsecond=0) - datetime.datetime(1970, 1, 1, tzinfo=utc)) // datetime.timedelta(milliseconds=1)
    schedule(store, P, at, 1, b"a")
    schedule(store, P, at.replace(microsecond=0), 1, b"b")
    assert (get_timer(store, P, 1, b"a").due_at_ms, get_timer(store, P, 1, b"b").due_at_ms) == (whole_ms + 1, whole_ms)
    assert Reschedule(at, b"").due_at_ms == whole_ms + 1
    with pytest.raises(ValueError, match="1970"):
        schedule(store, P, datetime.datetime(1969, 12, 31, 23, 59, 59, 999_900, tzinfo=utc), 1, b"c")
    assert get_timer(store, P, 1, b"c") is None
    # A trigger's start and end bound whole-ms occurrences: rounded down, an occurrence falls after (by)
    # the ms exactly when it falls after (by) the instant.
    every = Every(60, start=at, end=at + datetime.timedelta(minutes=5))
    assert (every.start_ms, every.end_ms, every.next_after(0)) == (whole_ms, whole_ms + 300_000, whole_ms + 60_000)


def test_a_bad_relative_due_time_is_refused_naming_it(store, host_now):
    """A negative delay or timedelta, a non-finite or non-number delay, and a delay given with a due
    time are refused with one line naming the value; nothing is written."""
    import datetime

    cases = [((datetime.timedelta(seconds=-1),), {}, ValueError, "days=-1"),
             ((None,), {"delay": -0.5}, ValueError, "-0.5"),
             ((None,), {"delay": float("nan")}, ValueError, "nan"),
             ((None,), {"delay": "5"}, TypeError, "'5'"),
             ((None,), {"delay": True}, TypeError, "True"),
             ((NOW + 5,), {"delay": 5}, TypeError, "not both"),
             ((None,), {}, TypeError, "NoneType"),
             ((None,), {"delay": 1e300}, ValueError, "delay must end by the latest due time.*1e\\+300"),
             # Finite, but its ms overflow a float (1e308 * 1000 is inf): the same ValueError, no OverflowError.
             ((None,), {"delay": 1e308}, ValueError, "delay must end by the latest due time.*1e\\+308"),
             ((None,), {"delay": 2**70}, ValueError, "delay .*1180591620717411303424")]
    for due, kwargs, error, named in cases:
        with pytest.raises(error, match=named):
            schedule(store, P, *due, 1, b"x", **kwargs)
    assert get_timer(store, P, 1, b"x") is None


def test_the_async_writer_takes_a_delay(store, host_now):
    """``await aio.schedule(..., delay=)`` and ``aio.reschedule(..., delay=)`` count from now as the sync ones do."""
    import asyncio

    from timerwheel_c.durable import aio

    async def main():
        await aio.schedule(store, P, None, 2, b"c", delay=3)
        assert get_timer(store, P, 2, b"c").due_at_ms == host_now + 3000
        assert await aio.reschedule(store, P, None, 2, b"c", delay=4)

    asyncio.run(main())
    assert get_timer(store, P, 2, b"c").due_at_ms == host_now + 4000


def _pending(store, partition):
    from timerwheel_c.durable import list_timers

    return {(int(t.kind), t.reference): (t.due_at_ms, t.value) for t in list_timers(store, partition, limit=10_000)}


def _rows(store, partition):
    """Every stored row of ``partition``: a timer written twice must leave no second row behind."""
    return store.scan(partition, b"", b"\xff" * 8, limit=100_000).entries


def test_schedule_many_writes_every_timer_by_name_across_partitions_and_chunks(store, monkeypatch):
    """Timers of two partitions, more than a chunk each, with and without a value, all end pending
    under their names, as a loop of schedule() leaves them; each can be cancelled by name."""
    from timerwheel_c.durable import cancel, schedule_many
    from timerwheel_c.durable.timers import bulk

    monkeypatch.setattr(bulk, "CHUNK", 3)
    timers = [(f"p{i % 2}", NOW + i, 1 + i % 3, b"r%d" % i, b"v%d" % i) for i in range(10)]
    schedule_many(store, iter(timers + [("p0", NOW + 99, 4, b"bare")]))
    expected = {p: {} for p in ("p0", "p1")}
    for partition, due, kind, reference, value in timers + [("p0", NOW + 99, 4, b"bare", b"")]:
        expected[partition][(kind, reference)] = (due, value)
    assert _pending(store, "p0") == expected["p0"] and _pending(store, "p1") == expected["p1"]
    assert cancel(store, "p1", 2, b"r1") and get_timer(store, "p1", 2, b"r1") is None


@pytest.mark.parametrize("chunk", [2000, 2])
def test_schedule_many_keeps_the_name_rules_of_schedule(store, monkeypatch, chunk):
    """With a name already pending or given twice: "replace" moves it (the last given wins, no stray
    row left), "keep" leaves it, "error" writes every other timer and then raises TimerExists
    naming the pending one; in one chunk or many."""
    from timerwheel_c.durable import TimerExists, schedule_many
    from timerwheel_c.durable.timers import bulk

    monkeypatch.setattr(bulk, "CHUNK", chunk)
    schedule(store, P, NOW, 1, b"old", b"was")
    rows_before = len(_rows(store, P))
    schedule_many(store, [(P, NOW + 1, 1, b"old", b"new"), (P, NOW + 2, 1, b"dup", b"a"), (P, NOW + 3, 1, b"dup", b"b")])
    assert _pending(store, P) == {(1, b"old"): (NOW + 1, b"new"), (1, b"dup"): (NOW + 3, b"b")}
    assert len(_rows(store, P)) == rows_before + 2
    schedule_many(store, [(P, NOW + 7, 1, b"old", b"kept?"), (P, NOW + 8, 1, b"k", b"new")], if_exists="keep")
    assert _pending(store, P)[(1, b"old")] == (NOW + 1, b"new") and _pending(store, P)[(1, b"k")] == (NOW + 8, b"new")
    with pytest.raises(TimerExists, match="reference b'old'") as raised:
        schedule_many(store, [(P, NOW + 9, 1, b"old", b"x"), (P, NOW + 9, 1, b"e", b"y")], if_exists="error")
    assert raised.value.timer.due_at_ms == NOW + 1
    assert _pending(store, P)[(1, b"e")] == (NOW + 9, b"y") and _pending(store, P)[(1, b"old")] == (NOW + 1, b"new")


def test_schedule_many_of_a_full_chunk_keeps_the_name_rules_too(store):
    """A chunk large enough for PostgreSQL's COPY of new rows (300 timers) with one name already
    pending: that chunk's first write fails as a whole, and the timers end as a loop of schedule()
    leaves them (the pending one replaced, or kept, no stray row); with every name new, one write."""
    from timerwheel_c.durable import schedule_many

    schedule(store, P, NOW, 1, b"r150", b"was")
    timers = [(P, NOW + i, 1, b"r%d" % i, b"v%d" % i) for i in range(300)]
    schedule_many(store, timers, if_exists="keep")
    assert _pending(store, P)[(1, b"r150")] == (NOW, b"was") and len(_pending(store, P)) == 300
    schedule_many(store, timers)
    assert _pending(store, P) == {(1, b"r%d" % i): (NOW + i, b"v%d" % i) for i in range(300)}
    assert len(_rows(store, P)) == 600
    schedule_many(store, [("fresh", NOW, 1, b"n%d" % i) for i in range(300)])
    assert len(_rows(store, "fresh")) == 600


def test_schedule_many_checks_every_timer_before_writing_any(store):
    """A bad timer anywhere in the input (a naive datetime, a kind out of range, a str reference, a
    wrong shape, a value longer than schedule() takes) or a bad if_exists raises naming it, and
    nothing is written."""
    import datetime

    from timerwheel_c.durable import schedule_many
    from timerwheel_c.durable.timers.keys import MAX_TIMER_VALUE_BYTES

    good = (P, NOW, 1, b"good", b"")
    cases = [((P, datetime.datetime(2030, 1, 1), 1, b"r", b""), ValueError, r"timers\[1\]: .*naive"),
             ((P, NOW, 256, b"r", b""), ValueError, r"timers\[1\]: .*256"),
             ((P, NOW, 1, "r", b""), TypeError, r"timers\[1\]: .*reference"),
             ((P, NOW, 1), TypeError, r"timers\[1\] must be a tuple"),
             (("", NOW, 1, b"r", b""), ValueError, r"timers\[1\]: .*partition"),
             ((P, NOW, 1, b"r", bytes(MAX_TIMER_VALUE_BYTES + 1)), ValueError, r"timers\[1\]: value must be at most")]
    for bad, error, named in cases:
        with pytest.raises(error, match=named):
            schedule_many(store, [good, bad])
    with pytest.raises(ValueError, match="'upsert'"):
        schedule_many(store, [good], if_exists="upsert")
    assert _pending(store, P) == {}


class _CodecRefusal(ValueError):
    """A codec's own error whose constructor takes other arguments than one message."""

    def __init__(self, field: str, why: str):
        super().__init__(f"{field}: {why}")


def _refusing_dumps(value):
    raise _CodecRefusal("when", "no such field")


def test_schedule_many_names_the_timer_whatever_error_its_value_s_codec_raises(store):
    """schedule_many names the bad timer's index whatever the codec raised: the JSON codec's refusal
    of a str with no UTF-8 (a lone surrogate), and a codec's own error class, each a ValueError naming
    the index, the class and its message, with the codec's own error as its cause. The index was added
    by building the raised class again from one message, which these refuse: the call raised
    TypeError("function takes exactly 5 arguments (1 given)"), naming neither the timer nor the value.
    Nothing is written."""
    from timerwheel_c.durable import schedule_many

    json_kind, own_kind = TimerKind(9, "send-reminder", codec="json"), TimerKind(10, "own", codec=(_refusing_dumps, bytes))
    good = (P, NOW, json_kind, b"good", {"user": 7})
    with pytest.raises(ValueError, match=r"timers\[1\]: value .*UTF-8.*'order-\\udcff'") as refused:
        schedule_many(store, [good, (P, NOW, json_kind, b"r", {"name": "order-\udcff"})])
    assert isinstance(refused.value.__cause__, ValueError)
    with pytest.raises(ValueError, match=r"timers\[1\]: _CodecRefusal: when: no such field") as refused:
        schedule_many(store, [good, (P, NOW, own_kind, b"r", 1)])
    assert type(refused.value.__cause__) is _CodecRefusal
    assert _pending(store, P) == {}


def test_the_json_codec_refuses_a_str_with_no_utf8_naming_the_value(store):
    """A str holding a lone surrogate has no UTF-8: schedule() raises a ValueError naming the value,
    where it raised UnicodeEncodeError's bare "'utf-8' codec can't encode character"."""
    kind = TimerKind(9, "send-reminder", codec="json")
    with pytest.raises(ValueError, match=r"value .*UTF-8.*'order-\\udcff'"):
        schedule(store, P, NOW, kind, b"r", {"name": "order-\udcff"})
    assert _pending(store, P) == {}


def test_the_api_bench_rows_measure_both_forms(tmp_path):
    """bench.durable_api's rows run end to end on a small load: a fire cost for each handler form,
    and schedule_many beside a loop of schedule(), every figure a positive number."""
    import itertools

    from bench.durable_api import bulk_figures, fire_figures
    from timerwheel_c.durable import SQLiteStore

    counter = itertools.count()

    def make_store():
        return SQLiteStore(tmp_path / f"b{next(counter)}.db")

    fire = fire_figures(make_store, 50, 1)
    bulk = bulk_figures(make_store, 50, 1)
    assert all(v > 0 for v in (*fire.values(), *bulk.values())), (fire, bulk)


def test_a_kind_name_is_recorded_once_and_a_disagreeing_writer_or_runner_is_refused(store_url):
    """The first writer of a named kind records its name in the store; a writer or a service (in
    another process: another store object) naming that kind otherwise is refused with one line
    naming both names, before it writes or starts; a kind without a name is never checked."""
    from timerwheel_c.durable import KindNameMismatch, open_store, schedule_many
    from timerwheel_c.durable.timers.kind_names import kind_names

    first, other = open_store(store_url), open_store(store_url)
    try:
        schedule(first, P, NOW, TimerKind(1, "send-reminder"), b"a")
        schedule(other, P, NOW, TimerKind(1, "send-reminder"), b"b")
        schedule(other, P, NOW, 1, b"c")
        assert kind_names(other) == {1: "send-reminder"}
        with pytest.raises(KindNameMismatch, match="kind 1 is named 'expire-ticket' here but 'send-reminder'"):
            schedule(other, P, NOW, TimerKind(1, "expire-ticket"), b"d")
        with pytest.raises(KindNameMismatch, match="'expire-ticket'"):
            schedule_many(other, [(P, NOW, TimerKind(1, "expire-ticket"), b"e")])
        registry = TimerRegistry()
        registry.handler(TimerKind(1, "expire-ticket"))(lambda ctx, timer: Done())
        service = DurableTimerService(other, registry, [P])
        with pytest.raises(KindNameMismatch, match="'send-reminder' in the store"):
            service.start()
        assert get_timer(first, P, 1, b"d") is None and get_timer(first, P, 1, b"e") is None
    finally:
        first.close()
        other.close()


def test_a_codec_kind_takes_any_value_and_hands_the_handler_it_decoded(store, caplog):
    """With ``codec="json"`` a writer takes a dict and the handler (named in logs by the kind's name)
    receives it decoded; a stored value that does not decode is a failed attempt naming the
    codec's error, not a crash; a kind without a codec stays bytes only."""
    from timerwheel_c.durable import schedule_many

    kind = TimerKind(9, "send-reminder", codec="json")
    registry = TimerRegistry()
    seen = []

    @registry.handler(kind, max_attempts=1)
    def remind(ctx, timer):
        seen.append(timer.value)
        return Done()

    schedule(store, P, NOW - 3, kind, b"u1", {"user": 7, "text": "héllo"})
    schedule_many(store, [(P, NOW - 2, kind, b"u2", [1, 2])])
    schedule(store, P, NOW - 1, 9, b"raw", b"not json")
    with caplog.at_level(logging.WARNING, logger="timerwheel_c.durable"):
        run_due(store, P, registry, NOW)
    assert seen == [{"user": 7, "text": "héllo"}, [1, 2]]
    parked = get_timer(store, P, 9, b"raw")
    assert parked.state == "parked" and "JSONDecodeError" in parked.last_error
    assert "kind 9 'send-reminder' (" in caplog.text
    with pytest.raises(TypeError, match="value must be bytes"):
        schedule(store, P, NOW, 3, b"x", {"user": 7})
    with pytest.raises(TypeError, match="codec"):
        TimerKind(3, "x", codec="yaml")


def test_the_writers_and_the_timer_handed_to_a_handler_are_typed_for_a_codec_s_values():
    """A kind with a codec takes any value its codec encodes (the README schedules a dict), and the
    handler is handed it decoded: the annotations a type checker reads (the package ships py.typed)
    say so, where ``value: bytes`` made the documented calls type errors, and ``timer.value["user"]``
    in a handler too."""
    from timerwheel_c.durable import DueTimer, add_schedule, aio
    from timerwheel_c.durable.service.service import DurableTimerService as Service

    # As written (the modules use postponed annotations), so that no other annotation is evaluated.
    for writer in (schedule, Service.schedule, aio.schedule, add_schedule, aio.add_schedule):
        assert writer.__annotations__["value"] == "object", writer
    assert DueTimer.__annotations__["value"] == "Any"

def test_a_codec_kind_s_schedules_reschedules_and_left_out_values_go_through_its_codec(store):
    """A codec kind's value is encoded wherever one is written: a schedule's (add_schedule took only
    bytes, and its default b"" failed every occurrence's decoding, parking it and pausing the
    schedule) and a Reschedule's (a handler given a dict could not return one); a value left out
    reaches the handler as None. A Reschedule value the kind cannot store is that attempt's failure,
    naming it."""
    from timerwheel_c.durable import Every, Reschedule, add_schedule, get_schedule

    kind = TimerKind(9, "report", codec="json")
    registry = TimerRegistry()
    seen = []

    @registry.handler(kind, max_attempts=1)
    def report(ctx, timer):
        seen.append((timer.reference, timer.value))
        if timer.reference == b"counter" and timer.value["n"] < 2:
            return Reschedule(timer.due_at_ms + 1, {"n": timer.value["n"] + 1})
        return Done()

    @registry.handler(TimerKind(3), max_attempts=1)
    def raw(ctx, timer):
        return Reschedule(timer.due_at_ms + 1, {"not": "bytes"})

    start = NOW - 1500
    add_schedule(store, P, "nightly", Every(1, start=start), kind, {"region": "eu"})
    add_schedule(store, P, "bare", Every(1, start=start), kind)
    schedule(store, P, NOW - 10, kind, b"counter", {"n": 0})
    schedule(store, P, NOW - 10, kind, b"left-out")
    schedule(store, P, NOW - 10, 3, b"raw", b"")
    for _ in range(3):
        run_due(store, P, registry, NOW + 10)
    assert (b"nightly", {"region": "eu"}) in seen and (b"bare", None) in seen
    assert [value for reference, value in seen if reference == b"counter"] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert (b"left-out", None) in seen
    assert not get_schedule(store, P, "nightly").paused and not get_schedule(store, P, "bare").paused
    parked = get_timer(store, P, 3, b"raw")
    assert parked.state == "parked" and "Reschedule.value must be bytes, got dict" in parked.last_error
    with pytest.raises(TypeError, match="not JSON serializable"):
        add_schedule(store, P, "bad", Every(1), kind, {1, 2})
    with pytest.raises(TypeError, match="value must be bytes, got dict"):
        add_schedule(store, P, "bad", Every(1), 3, {"region": "eu"})


def test_a_stored_trigger_is_read_without_the_warnings_its_making_gave(store, caplog):
    """A schedule started at the epoch (an aware datetime, the usual way to align a schedule on the
    hour) or ending after the year 5000 is warned of at most when it is made, never again on
    every read: get_schedule, listings and each claimed occurrence decode the stored trigger."""
    import datetime

    from timerwheel_c.durable import Every, add_schedule, get_schedule, list_schedules

    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    add_schedule(store, P, "hourly", Every(3600, start=epoch, end=2**62), TimerKind(1))
    registry = TimerRegistry().register(FunctionHandler(lambda ctx, timer: Done(), TimerKind(1)))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert get_schedule(store, P, "hourly").trigger.start_ms == 0
        assert [info.name for info in list_schedules(store, P)] == ["hourly"]
        assert run_due(store, P, registry, NOW).fired == 1
    assert "before 1973" not in caplog.text and "year 5000" not in caplog.text, caplog.text


def test_every_takes_intervals_up_to_timedelta_max():
    """Every's message says intervals go up to timedelta.max: it takes it (it rounded up past the
    ms a timedelta holds, and was refused), and refuses what is longer."""
    import datetime

    from timerwheel_c.durable import Every

    assert Every(datetime.timedelta.max, start=0).interval_ms == datetime.timedelta.max // datetime.timedelta(milliseconds=1)
    with pytest.raises(ValueError, match="interval must be from 1 ms"):
        Every(datetime.timedelta.max.total_seconds() * 2, start=0)


def test_timers_list_and_show_give_the_kind_names_the_store_records(store_url):
    """``timerwheel-c timers list`` shows a named kind as its number and name (``kind_name`` in the
    JSON, null for a kind without one), ``timers show`` and ``fleet status`` the same: read from the
    store by the command's own store object (tests/cli_run.py), never from the writer's."""
    import json

    from cli_run import run_cli
    from timerwheel_c.durable import open_store

    with open_store(store_url) as writer:
        schedule(writer, P, NOW, TimerKind(3, "send-reminder"), b"r1")
        schedule(writer, P, NOW + 1, 4, b"r2")

    def cli(*args):
        out = run_cli(*args, "--store", store_url, env={"TIMERWHEEL_C_STORE": None})
        assert out.returncode == 0, out.stderr
        return out.stdout

    rows = json.loads(cli("timers", "list", "--json"))
    assert [(r["kind"], r["kind_name"]) for r in rows] == [(3, "send-reminder"), (4, None)]
    assert "kinds: 3 send-reminder" in cli("fleet", "status")
    assert "3 send-reminder" in cli("timers", "list").splitlines()[1]
    assert "3 send-reminder" in cli("timers", "show", "--partition", P, "--kind", "3", "--reference", "r1")


def test_a_handlers_backoff_sets_the_delays_between_its_attempts(store):
    """A Backoff(base 1 s, factor 3, cap 5 s) retries a failing timer 1 s, 3 s, then 5 s after each
    attempt's tick (driven by hand), where the default would wait 5 s, 10 s, 20 s; jitter only ever
    shortens a delay, by at most its fraction."""
    from timerwheel_c.durable import Backoff, Retry

    registry = TimerRegistry()

    @registry.handler(1, backoff=Backoff(base_s=1, factor=3, cap_s=5), max_attempts=None)
    def failing(ctx, timer):
        return Retry()

    schedule(store, P, NOW, 1, b"r")
    now = NOW
    for delay_ms in (1000, 3000, 5000, 5000):
        assert run_due(store, P, registry, now).failed == 1
        timer = get_timer(store, P, 1, b"r")
        assert (timer.state, timer.due_at_ms) == ("retrying", now + delay_ms)
        now += delay_ms
    jittered = Backoff(base_s=10, jitter=0.5)
    assert all(5000 <= jittered.delay_ms(1) <= 10_000 for _ in range(200))
    for bad in (dict(base_s=0), dict(factor=0.5), dict(base_s=5, cap_s=1), dict(jitter=2), dict(base_s=float("inf"))):
        with pytest.raises(ValueError, match="Backoff"):
            Backoff(**bad)
    with pytest.raises(TypeError, match="Backoff"):
        registry.handler(2, backoff=5)(failing)


def test_a_jittered_backoff_shortens_the_retry_and_never_the_claims_lease(store, monkeypatch):
    """A Backoff with jitter, at its largest draw (its 60 s cut to 60 ms): a claim holds the row for the
    60 s the jitter would shorten, so a claim 1 s later (another runner, while the call may still run)
    finds nothing to take, and a call that fails is tried again its jittered 60 ms after the failure.
    The claim's lease was the jittered delay: that later claim took the row again, 60 ms into a call,
    and started the timer twice at once."""
    from timerwheel_c.durable import Backoff, Retry
    from timerwheel_c.durable.timers import tick
    from timerwheel_c.durable.timers.claim import claim_due
    from timerwheel_c.durable.timers.runner import RunReport, settle

    monkeypatch.setattr(tick._RNG, "random", lambda: 0.999)
    registry = TimerRegistry()

    @registry.handler(1, backoff=Backoff(base_s=60, cap_s=60, jitter=1.0))
    def slow(ctx, timer):
        return Retry()

    schedule(store, P, NOW - 1, 1, b"r")
    first = claim_due(store, P, registry, NOW)
    assert [c.timer.reference for c in first.timers] == [b"r"]
    assert claim_due(store, P, registry, NOW + 1_000).timers == []
    store.apply(P, settle(P, first.timers[0], RunReport(), Retry(), now_ms=NOW + 10))
    timer = get_timer(store, P, 1, b"r")
    assert timer.state == "retrying" and NOW + 10 < timer.due_at_ms <= NOW + 10 + 61


def test_retry_with_a_delay_is_tried_again_that_long_after_its_tick(store):
    """Retry(delay=0.25) moves the retry to 250 ms after the tick (not the 5 s backoff), counted as a
    failed attempt and not as a fire; its last attempt parks the timer whatever the delay."""
    from timerwheel_c.durable import Retry

    registry = TimerRegistry()

    @registry.handler(1, max_attempts=2)
    def soon(ctx, timer):
        return Retry(delay=0.25)

    schedule(store, P, NOW, 1, b"r")
    report = run_due(store, P, registry, NOW)
    assert (report.failed, report.fired) == (1, 0)
    timer = get_timer(store, P, 1, b"r")
    assert (timer.state, timer.attempt, timer.due_at_ms) == ("retrying", 1, NOW + 250)
    assert run_due(store, P, registry, NOW + 249).failed == 0
    assert run_due(store, P, registry, NOW + 250).parked == 1
    assert get_timer(store, P, 1, b"r").state == "parked"
    for bad, error in ((-1, ValueError), (float("nan"), ValueError), ("1", TypeError), (True, TypeError)):
        with pytest.raises(error, match="Retry.delay"):
            Retry(delay=bad)


def _fire_all(store, registry, now_ms):
    """run_due at ``now_ms`` until a round fires and moves nothing (each occurrence owed comes due in turn)."""
    fired = 0
    for _ in range(100):
        report = run_due(store, P, registry, now_ms)
        fired += report.fired
        if not report.fired and not report.moved:
            return fired
    raise AssertionError("run_due kept firing")


@pytest.mark.parametrize("limit, fired", [(dict(max_runs=3), 3), (dict(end=NOW + 2500), 2)])
def test_a_schedule_stops_after_its_end_or_max_runs_and_says_so(store, limit, fired):
    """Every(1 s) with max_runs=3 fires 3 occurrences, with end 2.5 s after its start 2, however long
    the runners keep going (time driven by hand, the misfire policy 'all' owing every one); the
    store's schedule then reports itself ended, with its runs counted."""
    from timerwheel_c.durable import Every, add_schedule, get_schedule

    registry = TimerRegistry()
    seen = []

    @registry.handler(1)
    def tick(ctx, timer):
        seen.append(timer.due_at_ms)
        return Done()

    add_schedule(store, P, "tick", Every(1, start=NOW, **limit), 1, misfire="all", catchup_window_s=3600)
    assert not get_schedule(store, P, "tick").ended
    assert _fire_all(store, registry, NOW + 10_000) == fired
    assert _fire_all(store, registry, NOW + 20_000) == 0
    assert seen == [NOW + 1000 * (i + 1) for i in range(fired)]
    info = get_schedule(store, P, "tick")
    assert info.ended and info.next_fire_ms is None and info.runs == (3 if "max_runs" in limit else 0)


@pytest.mark.parametrize("misfire, extra, fired", [
    ("once", {}, [3000]),
    ("skip", dict(misfire_grace_s=3600), [1000, 2000, 3000]),
    ("all", dict(catchup_window_s=3600), [1000, 2000, 3000]),
])
def test_a_schedule_whose_end_passed_while_no_runner_served_it_fires_what_it_owed(store, misfire, extra, fired):
    """Every(1 s) from NOW to NOW + 3 s, first served at NOW + 10 s (an outage past its end): each
    policy fires the occurrences it owed up to the end ("once" the last of them, as APScheduler's
    coalescing does), never one past the end, and the schedule then reports itself ended."""
    from timerwheel_c.durable import Every, add_schedule, get_schedule

    registry = TimerRegistry()
    seen = []

    @registry.handler(1)
    def tick(ctx, timer):
        seen.append(timer.due_at_ms - NOW)
        return Done()

    add_schedule(store, P, "tick", Every(1, start=NOW, end=NOW + 3000), 1, misfire=misfire, **extra)
    assert _fire_all(store, registry, NOW + 10_000) == len(fired)
    assert seen == fired
    info = get_schedule(store, P, "tick")
    assert info.ended and info.next_fire_ms is None


def test_end_and_max_runs_are_stored_with_the_trigger_and_checked():
    """end and max_runs survive the stored form (a trigger stored without them reads as before), and
    an end not after the start, a max_runs below 1 or not an int are refused naming the value."""
    from timerwheel_c.durable import Cron, Every
    from timerwheel_c.durable.timers.triggers import trigger_from_dict

    for trigger in (Every(60, start=NOW, end=NOW + 3_600_000, max_runs=5),
                    Cron("0 3 * * *", "Europe/London", start=NOW, max_runs=2)):
        assert trigger_from_dict(trigger.to_dict()) == trigger
    plain = Every(60, start=NOW)
    assert "end_ms" not in plain.to_dict() and trigger_from_dict(plain.to_dict()).max_runs is None
    assert "at most 5 runs" in str(Every(60, start=NOW, max_runs=5))
    with pytest.raises(ValueError, match="end must be after the start"):
        Every(60, start=NOW, end=NOW)
    with pytest.raises(ValueError, match="max_runs must be >= 1"):
        Cron("* * * * *", max_runs=0)
    with pytest.raises(TypeError, match="max_runs"):
        Every(60, max_runs="3")


def test_schedules_list_says_a_schedule_has_ended(store_url):
    """``timerwheel-c schedules list`` shows 'ended' where the next fire time would be, and the JSON
    gives ended and runs (the command run in-process, tests/cli_run.py)."""
    import json

    from cli_run import run_cli
    from timerwheel_c.durable import Every, add_schedule, open_store

    with open_store(store_url) as store:
        add_schedule(store, P, "once", Every(1, start=NOW, max_runs=1), 1)
        registry = TimerRegistry()
        registry.handler(1)(lambda ctx, timer: Done())
        assert _fire_all(store, registry, NOW + 5000) == 1

    def cli(*args):
        out = run_cli("schedules", "list", "--store", store_url, *args, env={"TIMERWHEEL_C_STORE": None})
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert "ended" in cli().splitlines()[1]
    [row] = json.loads(cli("--json"))
    assert row["ended"] is True and row["runs"] == 1


def test_a_retrying_timer_keeps_its_last_error_until_it_is_done_or_moved(store):
    """After a failed attempt a retrying timer reports that attempt's error (get_timer and
    list_timers alike); a later success, a cancel or a replace leaves no error behind, so a new
    timer of the same name never shows an old one."""
    from timerwheel_c.durable import cancel, list_timers

    registry = TimerRegistry()
    answers = {b"a": [RuntimeError("db down"), None], b"b": [ValueError("bad input")]}

    @registry.handler(1)
    def flaky(ctx, timer):
        error = answers[timer.reference].pop(0) if answers[timer.reference] else None
        if error is not None:
            raise error
        return Done()

    schedule(store, P, NOW, 1, b"a")
    schedule(store, P, NOW, 1, b"b")
    run_due(store, P, registry, NOW)
    assert get_timer(store, P, 1, b"a").last_error == "RuntimeError: db down"
    assert {t.reference: t.last_error for t in list_timers(store, P)} == {b"a": "RuntimeError: db down",
                                                                          b"b": "ValueError: bad input"}
    rows_with_errors = len(_rows(store, P))
    assert cancel(store, P, 1, b"b") and len(_rows(store, P)) == rows_with_errors - 3  # row, identity, error
    run_due(store, P, registry, get_timer(store, P, 1, b"a").due_at_ms)
    assert get_timer(store, P, 1, b"a") is None and _rows(store, P) == []
    schedule(store, P, NOW, 1, b"a")
    assert get_timer(store, P, 1, b"a").last_error is None


def test_a_runner_whose_handlers_name_a_kind_otherwise_exits_2_with_one_line(tmp_path):
    """``timerwheel-c run`` with handlers naming kind 1 'expire-ticket', on a store that records it as
    'send-reminder', exits 2 with one line naming both, never serving (run as a real process)."""
    import os
    import subprocess
    import sys

    from timerwheel_c.durable import SQLiteStore

    db = tmp_path / "timers.db"
    with SQLiteStore(db) as store:
        schedule(store, P, NOW, TimerKind(1, "send-reminder"), b"a")
    (tmp_path / "other_app.py").write_text(
        "from timerwheel_c.durable import Done, TimerKind, TimerRegistry\n"
        "registry = TimerRegistry()\n"
        "registry.handler(TimerKind(1, 'expire-ticket'))(lambda ctx, timer: Done())\n")
    out = subprocess.run([sys.executable, "-m", "timerwheel_c", "run", "--store", f"sqlite:///{db}", "--handlers",
                          "other_app:registry"], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(tmp_path)),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith("timerwheel-c run: kind 1 is named 'expire-ticket' here but 'send-reminder' in the store")


def test_reschedule_takes_schedules_order_and_the_former_one_with_a_deprecation_warning(store):
    """reschedule(store, partition, due_at, kind, reference), as schedule() orders them, moves the
    timer with no warning, and so do keywords; the former order (kind, reference, due_at), told apart
    by the bytes reference where the kind goes, moves it too with a DeprecationWarning naming the new
    order; the service's and the awaitable reschedule agree. A missing kind or reference is a TypeError."""
    import asyncio
    import warnings

    from timerwheel_c.durable import aio, reschedule

    schedule(store, P, NOW, 3, b"r")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reschedule(store, P, NOW + 1, 3, b"r") and get_timer(store, P, 3, b"r").due_at_ms == NOW + 1
        assert reschedule(store, P, kind=3, reference=b"r", due_at_ms=NOW + 2)
        assert asyncio.run(aio.reschedule(store, P, NOW + 3, TimerKind(3), b"r"))
    assert get_timer(store, P, 3, b"r").due_at_ms == NOW + 3
    with pytest.warns(DeprecationWarning, match=r"reschedule\(store, partition, due_at_ms, kind, reference\)"):
        assert reschedule(store, P, 3, b"r", NOW + 4)
    with pytest.warns(DeprecationWarning, match="schedule\\(\\)'s order"):
        assert asyncio.run(aio.reschedule(store, P, 3, b"r", NOW + 5))
    assert get_timer(store, P, 3, b"r").due_at_ms == NOW + 5
    service = DurableTimerService(store, TimerRegistry().register(FunctionHandler(lambda ctx, timer: Done(), 3)), [P])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert service.reschedule(P, NOW + 6, 3, b"r")
    with pytest.warns(DeprecationWarning):
        assert service.reschedule(P, 3, b"r", NOW + 7)
    assert get_timer(store, P, 3, b"r").due_at_ms == NOW + 7
    with pytest.raises(TypeError, match="a kind and a reference"):
        reschedule(store, P, NOW)


def test_requeue_takes_schedules_order_and_the_former_one_with_a_deprecation_warning(store):
    """requeue(store, partition, due_at, kind, reference), as schedule() orders them, moves the
    timer with no warning, and so do keywords; the former order (kind, reference, due_at, or no
    due_at for now), told apart by the bytes reference where the kind goes, moves it too with a
    DeprecationWarning naming the new order; the awaitable requeue agrees. A missing kind or
    reference is a TypeError naming requeue."""
    import asyncio
    import warnings

    from timerwheel_c.durable import aio, requeue

    schedule(store, P, NOW, 3, b"r")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert requeue(store, P, NOW + 1, 3, b"r") and get_timer(store, P, 3, b"r").due_at_ms == NOW + 1
        assert requeue(store, P, kind=3, reference=b"r", due_at=NOW + 2)
        assert asyncio.run(aio.requeue(store, P, NOW + 3, TimerKind(3), b"r"))
        assert not requeue(store, P, None, 3, b"missing")
    assert get_timer(store, P, 3, b"r").due_at_ms == NOW + 3
    with pytest.warns(DeprecationWarning, match=r"requeue\(store, partition, due_at, kind, reference\)"):
        assert requeue(store, P, 3, b"r", NOW + 4)
    assert get_timer(store, P, 3, b"r").due_at_ms == NOW + 4
    with pytest.warns(DeprecationWarning, match="schedule\\(\\)'s order"):
        assert asyncio.run(aio.requeue(store, P, 3, b"r", NOW + 5))
    assert get_timer(store, P, 3, b"r").due_at_ms == NOW + 5
    before_ms = int(time.time() * 1000)
    with pytest.warns(DeprecationWarning):
        assert requeue(store, P, 3, b"r")  # due now: later than NOW, not before this call
    assert get_timer(store, P, 3, b"r").due_at_ms >= before_ms
    with pytest.raises(TypeError, match="requeue needs a kind and a reference"):
        requeue(store, P, NOW)


def test_every_writer_refuses_a_kind_the_store_names_otherwise(store_url):
    """cancel, reschedule, requeue and add_schedule, from a store object that has checked nothing
    yet (another process's), whose TimerKind names kind 1 otherwise than the store records, raise
    KindNameMismatch naming both names and change nothing, as schedule() does; add_schedule of a
    kind not yet named records its name, and with the recorded name each of them writes on."""
    from timerwheel_c.durable import (Every, KindNameMismatch, add_schedule, cancel, get_schedule, open_store, requeue,
                                      reschedule)
    from timerwheel_c.durable.timers.kind_names import kind_names

    first, other = open_store(store_url), open_store(store_url)
    wrong, right = TimerKind(1, "expire-ticket"), TimerKind(1, "send-reminder")
    try:
        schedule(first, P, NOW, right, b"a")
        for write in (lambda: cancel(other, P, wrong, b"a"), lambda: reschedule(other, P, NOW + 1, wrong, b"a"),
                      lambda: requeue(other, P, NOW + 2, wrong, b"a"),
                      lambda: add_schedule(other, P, "hourly", Every(3600), wrong)):
            with pytest.raises(KindNameMismatch, match="kind 1 is named 'expire-ticket' here but 'send-reminder'"):
                write()
        assert get_timer(first, P, 1, b"a").due_at_ms == NOW and get_schedule(first, P, "hourly") is None
        add_schedule(other, P, "daily", Every(86400), TimerKind(2, "send-digest"))
        assert kind_names(first) == {1: "send-reminder", 2: "send-digest"}
        assert reschedule(other, P, NOW + 1, right, b"a") and requeue(other, P, NOW + 2, right, b"a")
        assert cancel(other, P, right, b"a") and get_timer(first, P, 1, b"a") is None
    finally:
        first.close()
        other.close()


@pytest.mark.parametrize("due", [2 ** 64, 10 ** 30])
def test_a_due_time_out_of_range_is_refused_without_the_year_5000_warning(store, caplog, due):
    """A due time beyond the store's range is refused with one ValueError naming the argument given
    (``due_at_ms`` or ``delay``): no WARNING that it looks like us or ns comes first (the CLI's one
    line on stderr would be two)."""
    with caplog.at_level(logging.WARNING, logger="timerwheel_c.durable"):
        with pytest.raises(ValueError, match="due_at_ms must be in"):
            schedule(store, "p", due, 1, b"r", b"")
        with pytest.raises(ValueError, match="delay must end by the latest due time"):
            schedule(store, "p", None, 1, b"r", b"", delay=float(due))
    assert "year 5000" not in caplog.text
    assert get_timer(store, "p", 1, b"r") is None


def test_schedule_many_refuses_two_names_for_one_kind_in_one_call(store):
    """schedule_many checks every timer's kind name, not only the first one given for each kind: a
    later timer naming that kind otherwise is refused, as that timer's schedule() would be, and
    nothing of the call is written, not even the first name as the kind's (once it was recorded,
    and a later writer's right name refused for good)."""
    from timerwheel_c.durable import KindNameMismatch, list_timers, schedule_many

    timers = [(P, NOW, TimerKind(1, "send-reminder"), b"a"), (P, NOW, 1, b"b"),
              (P, NOW, TimerKind(1, "expire-ticket"), b"c")]
    in_call = "kind 1 is named 'expire-ticket' here but 'send-reminder' in an earlier timer of this call"
    with pytest.raises(KindNameMismatch, match=in_call):
        schedule_many(store, timers)
    assert list_timers(store, P) == []
    schedule(store, P, NOW, TimerKind(1, "expire-ticket"), b"d")  # the name the call did not record
    with pytest.raises(KindNameMismatch, match=in_call):
        schedule_many(store, timers)
    with pytest.raises(KindNameMismatch, match="'send-reminder' here but 'expire-ticket' in the store"):
        schedule_many(store, timers[:2])
    assert [t.reference for t in list_timers(store, P)] == [b"d"]
    schedule_many(store, [(P, NOW, TimerKind(1, "expire-ticket"), b"e"), (P, NOW, 1, b"f")])
    assert [t.reference for t in list_timers(store, P)] == [b"d", b"e", b"f"]


def test_every_public_exception_pickles_with_its_message_and_attributes():
    """A process pool's worker that raises one hands it to the parent by pickle: each comes back
    equal in type, message and attributes (BaseException's pickling passes the message alone to
    ``__init__``, which the ones that take other arguments refused)."""
    import pickle

    from timerwheel_c.durable import KindNameMismatch, PendingTimer, TimerExists
    from timerwheel_c.durable.storage.errors import PermanentStoreError, TransientStoreError
    from timerwheel_c.durable.storage.store import NoStoreError, SchemaError, SchemaVersionError
    from timerwheel_c.durable.timers.keys import MalformedKey
    from timerwheel_c.errors import ReleaseTimerClosed

    timer = PendingTimer("p", 3, b"r", 1_800_000_000_000, 1_800_000_000_000, 0, "scheduled", b"v")
    errors = [
        KindNameMismatch(3, "billing", "mail", where="earlier in this bulk write"), TimerExists(timer),
        MalformedKey(b"\x00Tbad", "too short"), SchemaVersionError("table 't'", 99, 14),
        TransientStoreError("lost", "08006"), PermanentStoreError("refused", "42501"), SchemaError("old"),
        NoStoreError("no timerwheel_c store here"), ReleaseTimerClosed("closed"),
    ]
    for error in errors:
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error) and vars(back) == vars(error), error


@pytest.mark.parametrize("timers", [None, 42, "p", b"p"], ids=["None", "int", "str", "bytes"])
def test_schedule_many_of_no_iterable_is_a_type_error_naming_timers(store, timers):
    """``schedule_many(store, None)`` said only "'NoneType' object is not iterable", naming nothing; a str
    was read as its characters. Either call, sync or async, now names ``timers`` and what it got."""
    import asyncio

    from timerwheel_c.durable import aio, schedule_many

    with pytest.raises(TypeError, match=f"timers must be an iterable of timer tuples, got {type(timers).__name__}"):
        schedule_many(store, timers)
    with pytest.raises(TypeError, match=f"timers must be an iterable of timer tuples, got {type(timers).__name__}"):
        asyncio.run(aio.schedule_many(store, timers))

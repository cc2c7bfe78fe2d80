"""A durable service's metrics and health: ``/metrics`` scraped over real loopback HTTP and parsed
with prometheus_client's own parser while timers fire; ``/healthz`` 503 when the service thread is
stopped or its PostgreSQL store is down (a throwaway cluster stopped and restarted), 200 again
after. Counts are compared only after every timer has fired, so no assertion depends on timing
beyond generous liveness bounds."""
from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request

import pytest

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from timerwheel_c.durable.service.exporter import health, register, serve  # noqa: E402
from timerwheel_c.durable.service.metrics import MetricsSnapshot, Recorder  # noqa: E402
from timerwheel_c.durable.service.service import DurableTimerService  # noqa: E402
from timerwheel_c.durable.storage.sqlite import SQLiteStore  # noqa: E402
from timerwheel_c.durable.timers import writer  # noqa: E402
from timerwheel_c.durable.timers.registry import Done, Retry, TimerHandler, TimerKind, TimerRegistry  # noqa: E402
from timerwheel_c.durable.timers.timing import ManualClock  # noqa: E402
from pg_cluster import throwaway_cluster  # noqa: E402
from waiting import LIVENESS_S, advance_until, wait_until, wall_ms  # noqa: E402

P = "m"
OK_KIND, FAIL_KIND = 0xE1, 0xE2


class Counting(TimerHandler):
    def __init__(self, kind, outcome):
        self.kind = TimerKind(kind)
        self.outcome = outcome
        self.calls = 0
        self.cond = threading.Condition()

    def fire(self, ctx, timer):
        with self.cond:
            self.calls += 1
            self.cond.notify_all()
        return self.outcome

    def wait_for(self, n):
        with self.cond:
            assert self.cond.wait_for(lambda: self.calls >= n, LIVENESS_S), f"{self.calls} of {n} calls"


def scrape(server, path="/metrics"):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def samples(text):
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_scraped_over_http_count_what_fired(tmp_path):
    """Scraped while timers fire (each scrape must parse), then once all have fired: fired and
    failed by kind equal the handlers' calls, the lateness histogram counts every first attempt,
    parked is present at 0, the backlog of the served partition is 0 and nothing is in flight. The
    service's time is a ManualClock, moved on in steps while it sleeps between the due times."""
    clock = ManualClock()
    store = SQLiteStore(tmp_path / "m.db")
    ok, bad = Counting(OK_KIND, Done()), Counting(FAIL_KIND, Retry())
    now = clock.wall_ns() // 1_000_000
    for i in range(40):
        writer.schedule(store, P, now + 10 * i, OK_KIND, b"ok%d" % i)
    for i in range(5):
        writer.schedule(store, P, now + 10 * i, FAIL_KIND, b"bad%d" % i)
    svc = DurableTimerService(store, TimerRegistry().register(ok).register(bad), [P], clock=clock, wall_ns=clock.wall_ns)
    server = serve(svc, 0)
    try:
        with svc:
            scrapes = []

            def scraped_until_all_fired() -> bool:
                status, text = scrape(server)
                assert status == 200
                samples(text)  # parses mid-run
                scrapes.append(status)
                return ok.calls >= 40

            advance_until(clock, scraped_until_all_fired, 0.05, "40 timers fired while scraped", LIVENESS_S)
            ok.wait_for(40)
            bad.wait_for(5)
            wait_until(lambda: svc.fired >= 40 and svc.failed >= 5, "outcomes committed")
            assert scrapes
            # The backlog is recounted at most once a second on the service's clock: move it on until
            # a count taken after the fires.
            advance_until(clock, lambda: svc.metrics().due_backlog.get(P) == 0, 0.5, "the backlog recounted empty",
                          LIVENESS_S)
            got = samples(scrape(server)[1])
            assert got[("timerwheel_fired_total", (("kind", str(OK_KIND)), ("kind_name", "")))] == 40
            assert got[("timerwheel_failed_total", (("kind", str(FAIL_KIND)), ("kind_name", "")))] == 5
            assert got[("timerwheel_fired_total", (("kind", str(FAIL_KIND)), ("kind_name", "")))] == 0
            assert got[("timerwheel_parked_total", (("kind", str(OK_KIND)), ("kind_name", "")))] == 0
            assert got[("timerwheel_lateness_seconds_count", ())] == 45
            assert got[("timerwheel_lateness_seconds_bucket", (("le", "+Inf"),))] == 45
            assert got[("timerwheel_due_backlog", (("partition", P),))] == 0
            assert got[("timerwheel_owned_partitions", ())] == 1
            assert got[("timerwheel_handlers_in_flight", ())] == 0
            assert got[("timerwheel_store_errors_total", (("class", "transient"),))] == 0
            assert scrape(server, "/healthz") == (200, "ok\n")
    finally:
        server.close()
        store.close()


def test_backlog_counts_due_rows_and_snapshot_is_frozen(tmp_path):
    """With no handler slot free (concurrency 1, a handler blocked), rows due wait in the store and
    show in the backlog; the snapshot is a frozen dataclass."""
    store = SQLiteStore(tmp_path / "b.db")
    gate = threading.Event()

    class Blocking(TimerHandler):
        kind = TimerKind(OK_KIND)

        def fire(self, ctx, timer):
            gate.wait(LIVENESS_S)
            return Done()

    now = wall_ms() - 1000
    for i in range(300):
        writer.schedule(store, P, now + i, OK_KIND, b"%d" % i)
    svc = DurableTimerService(store, TimerRegistry().register(Blocking()), [P], concurrency=1)
    try:
        with svc:
            wait_until(lambda: svc.in_flight == 1, "a handler in flight")
            m = svc.metrics()
            assert isinstance(m, MetricsSnapshot)
            with pytest.raises(AttributeError):
                m.running = False  # type: ignore[misc]
            assert m.handlers_in_flight == 1
            assert 200 < m.due_backlog[P] <= 300  # the rest is claimed: queued or in flight
            gate.set()
    finally:
        gate.set()
        store.close()


def test_register_in_an_applications_registry(tmp_path):
    """register() adds the figures to a registry of the application's own, which formats them."""
    store = SQLiteStore(tmp_path / "r.db")
    svc = DurableTimerService(store, TimerRegistry().register(Counting(OK_KIND, Done())), [P])
    registry = prometheus_client.CollectorRegistry()
    register(svc, registry)
    text = prometheus_client.generate_latest(registry).decode()
    assert "timerwheel_owned_partitions 1.0" in text
    svc.stop()
    store.close()


def test_metrics_by_kind_carry_the_kinds_name_beside_its_number(tmp_path):
    """A kind whose handler names it (``TimerKind(n, "send-reminder")``) is labelled with that name
    in every figure by kind, fired or not; a kind without a name gets an empty ``kind_name``."""
    store = SQLiteStore(tmp_path / "names.db")
    named = Counting(OK_KIND, Done())
    named.kind = TimerKind(OK_KIND, "send-reminder")
    writer.schedule(store, P, wall_ms(), named.kind, b"r")
    svc = DurableTimerService(store, TimerRegistry().register(named).register(Counting(FAIL_KIND, Retry())), [P])
    registry = prometheus_client.CollectorRegistry()
    register(svc, registry)
    try:
        with svc:
            named.wait_for(1)
            wait_until(lambda: svc.fired >= 1, "the outcome committed")
            got = samples(prometheus_client.generate_latest(registry).decode())
    finally:
        store.close()
    assert got[("timerwheel_fired_total", (("kind", str(OK_KIND)), ("kind_name", "send-reminder")))] == 1
    for family in ("failed", "parked"):
        assert got[(f"timerwheel_{family}_total", (("kind", str(OK_KIND)), ("kind_name", "send-reminder")))] == 0
    assert got[("timerwheel_parked_total", (("kind", str(FAIL_KIND)), ("kind_name", "")))] == 0
    assert svc.metrics().kind_names == {OK_KIND: "send-reminder"}


def test_a_second_service_in_one_registry_is_refused(tmp_path):
    """Two services' series in one registry would be duplicates that a scrape cannot tell apart:
    the second register() raises ValueError, as prometheus_client does for any duplicate name."""
    store = SQLiteStore(tmp_path / "two.db")
    registry = prometheus_client.CollectorRegistry()
    services = [DurableTimerService(store, TimerRegistry().register(Counting(OK_KIND, Done())), [p])
                for p in (P, P + "-other")]
    register(services[0], registry)
    with pytest.raises(ValueError, match="timerwheel_"):
        register(services[1], registry)
    assert prometheus_client.generate_latest(registry).decode().count("timerwheel_owned_partitions 1.0") == 1
    for svc in services:
        svc.stop()
    store.close()


def test_healthz_503_when_the_thread_is_stopped(tmp_path):
    """200 while the thread runs; 503 naming the reason once stop() ended it."""
    store = SQLiteStore(tmp_path / "h.db")
    svc = DurableTimerService(store, TimerRegistry().register(Counting(OK_KIND, Done())), [P], max_sleep_s=0.2)
    server = serve(svc, 0)
    try:
        svc.start()
        wait_until(lambda: scrape(server, "/healthz")[0] == 200, "healthy after start")
        svc.stop()
        status, body = scrape(server, "/healthz")
        assert status == 503 and body == "service thread not running\n"
    finally:
        server.close()
        store.close()



class Blocking(TimerHandler):
    """Holds its handler slot until ``gate`` is set."""

    kind = TimerKind(OK_KIND)

    def __init__(self):
        self.gate = threading.Event()

    def fire(self, ctx, timer):
        self.gate.wait(LIVENESS_S)
        return Done()


def test_healthz_stays_200_while_every_handler_slot_is_busy(tmp_path):
    """A runner whose every handler slot runs a long handler, with more rows due, makes no pass (it
    has no room to claim into) for longer than the health bound: it is working, not stuck, and
    /healthz stays 200 (a liveness probe must not kill it mid-work); the rows fire once slots free.
    The service's time is a ManualClock: the test moves it past the bound instead of waiting."""
    clock = ManualClock()
    store = SQLiteStore(tmp_path / "busy.db")
    for i in range(3):
        writer.schedule(store, P, clock.wall_ns() // 1_000_000 - 1, OK_KIND, b"r%d" % i)
    handler = Blocking()
    svc = DurableTimerService(store, TimerRegistry().register(handler), [P], concurrency=1, max_sleep_s=0.2,
                              clock=clock, wall_ns=clock.wall_ns)
    try:
        svc.start()
        bound_s = 1.0
        wait_until(lambda: svc.in_flight == 1, "the one slot busy")
        for _ in range(15):  # 3 s in steps of the service's longest sleep, waking any pass it would make
            clock.advance(0.2)
        # the situation to test: the one slot busy and no pass for longer than the bound
        wait_until(lambda: svc.in_flight == 1 and (svc.metrics(0).last_progress_age_s or 0) > 2 * bound_s,
                   "a busy slot and no pass for twice the bound")
        assert health(svc, stale_after_s=bound_s)[0], health(svc, stale_after_s=bound_s)
        handler.gate.set()
        wait_until(lambda: not writer.list_timers(store, P), "every row fired once the slot freed")
    finally:
        handler.gate.set()
        svc.stop()
        store.close()

def test_healthz_503_when_every_slot_is_held_by_a_call_past_its_timeout(tmp_path):
    """A sync call past its handler's timeout_s is failed, but its thread cannot be stopped and
    holds its slot: with every slot so held and no pass for longer than the bound, /healthz is
    503 saying so (a liveness probe's restart ends those threads), where it said "ok: busy" for
    ever. ``handlers_overdue`` counts them; the slot and the health come back when the call returns."""
    clock = ManualClock()
    store = SQLiteStore(tmp_path / "hung.db")
    for i in range(2):
        writer.schedule(store, P, clock.wall_ns() // 1_000_000 - 1, OK_KIND, b"r%d" % i)
    handler = Blocking()
    handler.timeout_s = 0.1  # real seconds: the watchdog times calls on the host's monotonic clock
    svc = DurableTimerService(store, TimerRegistry().register(handler), [P], concurrency=1, max_sleep_s=0.2,
                              clock=clock, wall_ns=clock.wall_ns)
    try:
        svc.start()
        bound_s = 1.0
        wait_until(lambda: svc.metrics(0).handlers_overdue == 1, "the one slot held past its timeout")
        for _ in range(15):
            clock.advance(0.2)
        wait_until(lambda: (svc.metrics(0).last_progress_age_s or 2 * bound_s + 1) > 2 * bound_s, "no pass")
        ok, reason = health(svc, stale_after_s=bound_s)
        assert not ok and reason.startswith("all 1 handler slot(s) held by calls past their handler's timeout_s"), reason
        handler.gate.set()
        wait_until(lambda: svc.metrics(0).handlers_overdue == 0 and svc.in_flight == 0, "the call returned")
        clock.advance(0.2)
        wait_until(lambda: health(svc, stale_after_s=bound_s)[0], "healthy again once a pass runs")
    finally:
        handler.gate.set()
        svc.stop()
        store.close()


@pytest.mark.slow
def test_healthz_503_while_postgres_is_down_and_200_after():
    """A service on a throwaway PostgreSQL cluster: healthy; the cluster stopped: 503 within the
    bound (1 s here) plus the store's own time-outs; the cluster started again: 200."""
    with throwaway_cluster() as (dsn, pg_ctl):
        _healthz_through_an_outage(dsn, pg_ctl)


def _healthz_through_an_outage(dsn, pg_ctl):
    from timerwheel_c.durable.storage.postgres import PostgresStore

    store = PostgresStore(dsn)
    svc = DurableTimerService(store, TimerRegistry().register(Counting(OK_KIND, Done())), [P], max_sleep_s=0.2)
    server = serve(svc, 0, stale_after_s=1.0)
    try:
        svc.start()
        wait_until(lambda: scrape(server, "/healthz")[0] == 200, "healthy after start")
        pg_ctl("stop", "-m", "fast")
        wait_until(lambda: scrape(server, "/healthz")[0] == 503, "unhealthy with the store down")
        assert "no clean pass or store round trip" in scrape(server, "/healthz")[1]
        assert not health(svc, 1.0)[0]
        pg_ctl("start")
        wait_until(lambda: scrape(server, "/healthz")[0] == 200, "healthy again with the store back")
    finally:
        server.close()
        svc.stop()
        store.close()


def test_metrics_answer_while_the_fleet_ownership_waits_on_the_store(schema_url):
    """In a fleet, an evaluation of the ownership holds its lock through its round trips, for as long
    as a server that does not answer (frozen, partitioned) keeps them waiting; the lock is held here
    as such an evaluation holds it. /metrics and /healthz still answer, with the ownership last known,
    instead of each scrape waiting (and leaving a thread behind) until the server answers."""
    from timerwheel_c.durable import open_store

    store = open_store(schema_url)
    svc = DurableTimerService(store, TimerRegistry().register(Counting(OK_KIND, Done())), None, fleet=True,
                              max_sleep_s=0.2)
    server = serve(svc, 0)
    try:
        svc.start()
        assert svc.ownership is not None
        wait_until(lambda: scrape(server, "/healthz")[0] == 200, "healthy after start")
        answers: list = []
        with svc.ownership._lock:
            scraper = threading.Thread(target=lambda: answers.extend(scrape(server, p) for p in ("/metrics", "/healthz")),
                                       daemon=True)
            scraper.start()
            scraper.join(LIVENESS_S)
        assert [status for status, _ in answers] == [200, 200], answers
        # A fleet over the whole store owns shards: this lone runner, all of them.
        assert samples(answers[0][1])[("timerwheel_owned_partitions", ())] == len(svc.ownership.last_owned()) == store.shard_count
    finally:
        server.close()
        svc.stop()
        store.close()


def test_without_prometheus_client_the_error_says_how_to_install_it(tmp_path, monkeypatch):
    """prometheus_client missing (None in sys.modules, as when it is not installed): serve() and
    register() raise ModuleNotFoundError naming the extra, and metrics() still works."""
    import sys

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    store = SQLiteStore(tmp_path / "x.db")
    svc = DurableTimerService(store, TimerRegistry().register(Counting(OK_KIND, Done())), [P])
    try:
        for call in (lambda: serve(svc, 0), lambda: register(svc)):
            with pytest.raises(ModuleNotFoundError, match=r"pip install 'timerwheel_c\[metrics\]'"):
                call()
        assert svc.metrics().fired == {}
    finally:
        svc.stop()
        store.close()


class SlowThenRaise(TimerHandler):
    """Sleeps ``sleep_s`` then raises, with one attempt: every timer it fires is parked."""

    max_attempts = 1

    def __init__(self, kind, sleep_s):
        self.kind = TimerKind(kind)
        self.sleep_s = sleep_s
        self.calls = 0
        self.lock = threading.Lock()

    def fire(self, ctx, timer):
        time.sleep(self.sleep_s)
        with self.lock:
            self.calls += 1
        raise RuntimeError("refused by the downstream service")


def test_metrics_give_the_timers_parked_now_and_a_histogram_of_handler_durations(tmp_path):
    """Three timers whose one attempt fails are parked: ``timerwheel_parked_timers`` of the partition
    reads 3 (the timers parked now, where ``timerwheel_parked_total`` counts parkings by this runner).
    ``timerwheel_handler_seconds`` counts every handler call (the 3 slow ones, which each took at
    least 0.3 s, and 4 quick ones): none of the slow calls falls in a bucket below 0.3 s."""
    store = SQLiteStore(tmp_path / "p.db")
    ok, slow = Counting(OK_KIND, Done()), SlowThenRaise(FAIL_KIND, 0.3)
    now = wall_ms()
    for i in range(4):
        writer.schedule(store, P, now, OK_KIND, b"ok%d" % i)
    for i in range(3):
        writer.schedule(store, P, now, FAIL_KIND, b"slow%d" % i)
    svc = DurableTimerService(store, TimerRegistry().register(ok).register(slow), [P])
    server = serve(svc, 0)
    try:
        with svc:
            # The counts first: a backlog counted before the parkings commit stands for BACKLOG_EVERY_S (1 s).
            wait_until(lambda: sum(svc.metrics(0).parked.values()) == 3 and svc.fired >= 4, "three parked, four fired")
            wait_until(lambda: svc.metrics().parked_timers.get(P) == 3, "three timers parked now")
            got = samples(scrape(server)[1])
            assert got[("timerwheel_parked_timers", (("partition", P),))] == 3
            assert got[("timerwheel_handler_seconds_count", ())] == 7
            assert got[("timerwheel_handler_seconds_bucket", (("le", "0.25"),))] <= 4
            assert got[("timerwheel_handler_seconds_bucket", (("le", "+Inf"),))] == 7
            assert got[("timerwheel_handler_seconds_sum", ())] >= 0.9
    finally:
        server.close()
        store.close()


def test_healthz_and_metrics_answer_head_as_get(tmp_path):
    """HEAD /healthz and HEAD /metrics answer with GET's status and headers and no body (a load
    balancer's or an uptime checker's probe), not 501."""
    import http.client

    store = SQLiteStore(tmp_path / "h.db")
    svc = DurableTimerService(store, TimerRegistry().register(Counting(OK_KIND, Done())), [P])
    server = serve(svc, 0)
    try:
        with svc:
            wait_until(lambda: health(svc)[0], "the service healthy")
            for path in ("/healthz", "/metrics"):
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
                try:
                    conn.request("GET", path)
                    got = conn.getresponse()
                    body = got.read()
                    conn.request("HEAD", path)
                    head = conn.getresponse()
                    assert head.status == got.status == 200
                    assert head.read() == b""
                    assert head.getheader("Content-Type") == got.getheader("Content-Type")
                    assert int(head.getheader("Content-Length")) > 0 and body
                finally:
                    conn.close()
    finally:
        server.close()
        store.close()


def test_a_fires_lateness_and_duration_are_observed_in_one_call():
    """The executor observes each call's duration, and a first attempt's lateness, in one Recorder
    call under one lock (per fire), not one call and one lock each: a retry's lateness (None) is not
    observed, a negative lateness counts as 0. Deterministic: it reads the histograms back."""
    recorder = Recorder()
    recorder.fire_ended(0.25, 0.5)
    recorder.fire_ended(None, 1.5)
    recorder.fire_ended(-1.0, 0.0)
    lateness, duration = recorder.counts()[3:]
    assert (lateness.count, lateness.sum_s) == (2, 0.25)
    assert (duration.count, duration.sum_s) == (3, 2.0)


def _get(url: str, host: str | None = None) -> int:
    req = urllib.request.Request(url)
    if host is not None:
        req.add_header("Host", host)
    try:
        with urllib.request.urlopen(req, timeout=LIVENESS_S) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_loopback_exporter_answers_only_to_a_loopback_host_name(tmp_path):
    """/metrics and /healthz on a loopback address refuse a foreign Host header (421), as the status
    page does: a site that rebinds its own name to 127.0.0.1 must not read the partition names from
    a browser. A loopback name, with or without its port, is served."""
    with SQLiteStore(tmp_path / "m.db") as store:
        svc = DurableTimerService(store, TimerRegistry().register(Counting(OK_KIND, Done())), [P])
        server = serve(svc, 0)
        try:
            base = f"http://127.0.0.1:{server.port}"
            for path in ("/metrics", "/healthz"):
                assert _get(base + path, host=f"attacker.example:{server.port}") == 421
                assert _get(base + path, host="attacker.example") == 421
            assert _get(base + "/metrics") == 200
            assert _get(base + "/metrics", host=f"localhost:{server.port}") == 200
        finally:
            server.close()


def test_an_exporter_binds_an_ipv6_address(tmp_path):
    """``--metrics-host ::1`` (and the page's ``--host ::1``) bind an IPv6 socket; they used to fail
    with "Address family for hostname not supported"."""
    import socket

    try:
        socket.socket(socket.AF_INET6).close()
    except OSError:
        pytest.skip("no IPv6 here")
    from timerwheel_c.durable.service.exporter import check_address

    with SQLiteStore(tmp_path / "m.db") as store:
        svc = DurableTimerService(store, TimerRegistry().register(Counting(OK_KIND, Done())), [P])
        check_address(0, "::1")
        server = serve(svc, 0, host="::1")
        try:
            assert _get(f"http://[::1]:{server.port}/metrics") == 200
        finally:
            server.close()


def test_a_client_gone_mid_answer_prints_no_traceback(capfd, caplog):
    """A client that drops its connection (a closed tab, a scraper's timeout) is no error of the
    server's: nothing on stderr and nothing logged, where socketserver printed a traceback for each.
    Any other failure is logged with its traceback."""
    from timerwheel_c.durable.service.web_http import bind

    server = bind("127.0.0.1", 0)
    try:
        for gone in (ConnectionResetError(104, "reset"), BrokenPipeError(32, "pipe"), TimeoutError("timed out")):
            try:
                raise gone
            except OSError:
                server.handle_error(None, ("127.0.0.1", 5555))
        assert "Traceback" not in capfd.readouterr().err and not caplog.records
        try:
            raise RuntimeError("a handler's own bug")
        except RuntimeError:
            server.handle_error(None, ("127.0.0.1", 5555))
        assert "a handler's own bug" in caplog.text
    finally:
        server.server_close()


def test_a_service_reading_the_store_by_shard_counts_its_backlog_by_shard(tmp_path, monkeypatch):
    """Serving the whole store, the service reads it by shard, and so counts: ``timerwheel_parked_timers``
    has a series per shard holding parked timers, labelled ``shard``, never one per partition (a count
    per partition from a shard's first rows named only some partitions, and those short: one with
    1,200 parked timers hid another of the same shard). Each count stops at BACKLOG_CAP, lowered from
    1,000 to 50 here: firing and parking the 1,200 timers past the cap took most of the test's time."""
    from timerwheel_c.durable import schedule_many
    from timerwheel_c.durable.service import metrics
    from timerwheel_c.durable.storage.shards import shard_of

    monkeypatch.setattr(metrics, "BACKLOG_CAP", 50)
    BACKLOG_CAP = metrics.BACKLOG_CAP

    store = SQLiteStore(tmp_path / "s.db", shard_count=4)
    big = "tenant-a"
    small = next(f"tenant-{i}" for i in range(100) if shard_of(f"tenant-{i}", 4) == shard_of(big, 4) and i)
    other = next(f"tenant-{i}" for i in range(100) if shard_of(f"tenant-{i}", 4) != shard_of(big, 4))
    now = wall_ms()
    for partition, n in ((big, BACKLOG_CAP + 200), (small, 5), (other, 3)):
        schedule_many(store, [(partition, now, FAIL_KIND, b"t%d" % i) for i in range(n)])
    slow = SlowThenRaise(FAIL_KIND, 0)
    svc = DurableTimerService(store, TimerRegistry().register(slow))
    server = serve(svc, 0)
    try:
        with svc:
            # The counts first: a backlog counted before the parkings commit stands for BACKLOG_EVERY_S (1 s).
            wait_until(lambda: sum(svc.metrics(0).parked.values()) == BACKLOG_CAP + 208, "the timers parked", LIVENESS_S)
            wait_until(lambda: sum(svc.metrics().parked_timers_by_shard.values()) == BACKLOG_CAP + 3,
                       "the timers parked now, by shard", LIVENESS_S)
            m = svc.metrics()
            # Every shard has its series, 0 when it holds none: a series that vanished once a backlog
            # drained showed no data where a sum should read 0.
            assert m.parked_timers_by_shard == {**dict.fromkeys(range(4), 0), shard_of(big, 4): BACKLOG_CAP,
                                                shard_of(other, 4): 3}
            assert m.due_backlog_by_shard == dict.fromkeys(range(4), 0)
            assert m.parked_timers == {} and m.due_backlog == {}
            got = samples(scrape(server)[1])
            assert got[("timerwheel_parked_timers", (("shard", str(shard_of(other, 4))),))] == 3
            assert [got[("timerwheel_due_backlog", (("shard", str(shard)),))] for shard in range(4)] == [0] * 4
            assert not [k for k in got if k[0] in ("timerwheel_parked_timers", "timerwheel_due_backlog")
                        and dict(k[1]).get("partition")]
    finally:
        server.close()
        store.close()


def test_a_sync_call_past_its_timeout_is_as_late_as_its_start_not_its_timeout(tmp_path):
    """A first attempt that starts on time and runs past its ``timeout_s`` observes the lateness of
    its start (0 here): it observed the instant the timeout was noticed, ten seconds of the service's
    clock later (the handler moves the ManualClock while it runs; the timeout is real time)."""
    clock = ManualClock()
    store = SQLiteStore(tmp_path / "late.db")
    gate = threading.Event()

    class Hung(TimerHandler):
        kind = TimerKind(OK_KIND)
        timeout_s = 0.3
        max_attempts = 1

        def fire(self, ctx, timer):
            clock.advance(10.0)
            gate.wait(LIVENESS_S)
            return Done()

    writer.schedule(store, P, clock.wall_ns() // 1_000_000, OK_KIND, b"hung")
    svc = DurableTimerService(store, TimerRegistry().register(Hung()), [P], clock=clock, wall_ns=clock.wall_ns)
    try:
        svc.start()
        wait_until(lambda: svc.metrics(0).lateness.count == 1, "the timed-out call observed")
        assert svc.metrics(0).lateness.sum_s == 0.0
    finally:
        gate.set()
        svc.stop()
        store.close()


def test_a_jittered_occurrence_fired_within_its_jitter_window_is_not_late(tmp_path):
    """A schedule with 1.5 s of jitter, its runner's ManualClock moved to 0.1 s before each occurrence's
    jittered time, then stepped 50 ms at a time: each occurrence fires at its jittered time, within
    its window, and observes no lateness. Jitter counted as lateness (the nominal time was
    subtracted), up to the whole jitter per occurrence."""
    from timerwheel_c.durable import Every, add_schedule, get_schedule

    clock = ManualClock()
    start_ms = clock.wall_ns() // 1_000_000
    store = SQLiteStore(tmp_path / "jitter.db")
    add_schedule(store, P, "jittered", Every(2, start=start_ms, jitter_s=1.5), OK_KIND)
    handler = Counting(OK_KIND, Done())
    svc = DurableTimerService(store, TimerRegistry().register(handler), [P], max_sleep_s=0.05, clock=clock,
                              wall_ns=clock.wall_ns)
    try:
        svc.start()
        next_ms = start_ms - 1
        for n in (1, 2):
            # The occurrence after the last one fired, once its reschedule committed.
            wait_until(lambda after=next_ms: get_schedule(store, P, "jittered").next_fire_ms > after, f"occurrence {n} set")
            next_ms = get_schedule(store, P, "jittered").next_fire_ms
            # One move to just short of it: steps of 50 ms across the window took some 80 polls of 20 ms.
            wait_until(lambda: clock.waiting and svc.queued == svc.in_flight == 0, "the service asleep")
            clock.advance(max(0.0, (next_ms - 100) / 1000 - clock.wall_ns() / 1e9))
            advance_until(clock, lambda calls=n: handler.calls >= calls, 0.05, f"occurrence {n} fired", service=svc)
        lateness = svc.metrics(0).lateness
        # At most one step late each: an occurrence due in a step's last ms fires at the step's end.
        assert lateness.count >= 2 and lateness.sum_s <= 0.05 * lateness.count
    finally:
        svc.stop()
        store.close()


def test_a_jittered_occurrence_fired_late_counts_from_its_own_draw(tmp_path):
    """A schedule with an hour of jitter whose occurrence fires 10 s after its jittered time (the runner
    was down): 10 s of lateness, not 0. Counted from the end of the jitter window, a delay of up to an
    hour went unseen."""
    from timerwheel_c.durable import Every, add_schedule, get_schedule

    clock = ManualClock()
    start_ms = clock.wall_ns() // 1_000_000
    store = SQLiteStore(tmp_path / "jitter.db")
    add_schedule(store, P, "jittered", Every(7200, start=start_ms, jitter_s=3600), OK_KIND)
    info = get_schedule(store, P, "jittered")
    clock.advance((info.next_fire_ms - start_ms) / 1000 + 10.0)
    handler = Counting(OK_KIND, Done())
    svc = DurableTimerService(store, TimerRegistry().register(handler), [P], max_sleep_s=0.05, clock=clock,
                              wall_ns=clock.wall_ns)
    try:
        svc.start()
        # Its lateness is counted as the call ends, after the handler has counted the call.
        advance_until(clock, lambda: svc.metrics(0).lateness.count >= 1, 0.05, "the late occurrence fired")
        lateness = svc.metrics(0).lateness
        assert handler.calls == lateness.count == 1 and 10.0 <= lateness.sum_s <= 10.0 + LIVENESS_S
    finally:
        svc.stop()
        store.close()


@pytest.mark.parametrize("partitions", [None, [P]])
def test_healthz_503_when_reads_answer_but_no_claim_commits(tmp_path, partitions):
    """A store that answers reads but fails every write (a full disk: ENOSPC on the WAL), due rows
    waiting: /healthz turns 503 past its bound, whether the runner serves named partitions or the
    whole store by shard. By shard, the pass's read of the shards counted as a clean pass, and it
    stayed 200 while nothing could fire. The service's time is a ManualClock."""
    from bench.stores import Delegating
    from timerwheel_c.durable.storage.errors import TransientStoreError

    class WritesFail(Delegating):
        def _apply_many(self, partition, batches):
            raise TransientStoreError("database or disk is full")

    clock = ManualClock()
    inner = SQLiteStore(tmp_path / "full.db")
    writer.schedule(inner, P, clock.wall_ns() // 1_000_000 - 1, OK_KIND, b"due")
    svc = DurableTimerService(WritesFail(inner), TimerRegistry().register(Counting(OK_KIND, Done())), partitions,
                              max_sleep_s=0.2, clock=clock, wall_ns=clock.wall_ns)
    logging_level = logging.getLogger("timerwheel_c.durable").level
    logging.getLogger("timerwheel_c.durable").setLevel(logging.CRITICAL)  # the failed claims' warnings
    try:
        svc.start()
        advance_until(clock, lambda: svc.passes >= 3, 0.2, "passes whose claims fail")
        clock.advance(3.0)  # past the bound
        passes = svc.passes
        advance_until(clock, lambda: svc.passes >= passes + 3, 0.2, "more passes whose claims fail")
        assert not health(svc, stale_after_s=2.0)[0] and svc.fired == 0, health(svc, stale_after_s=2.0)
    finally:
        logging.getLogger("timerwheel_c.durable").setLevel(logging_level)
        svc.stop()
        inner.close()


def test_scrapes_while_the_store_stalls_queue_one_backlog_count_not_one_each(tmp_path):
    """While the store thread is held (a store that stalls), each scrape's backlog count times out;
    the scrapes after the first wait for that count instead of queuing one each, so a store back from
    a stall of minutes meets one scan of the served partitions, not one per scrape of the stall,
    ahead of the service's next pass. The service's time is a ManualClock, moved past the count's
    reuse bound between scrapes."""
    clock = ManualClock()
    store = SQLiteStore(tmp_path / "stall.db")
    svc = DurableTimerService(store, TimerRegistry().register(Counting(OK_KIND, Done())), [P], max_sleep_s=0.2, clock=clock,
                              wall_ns=clock.wall_ns)
    counts = []
    try:
        svc.start()
        counting = svc.claimer.backlog
        svc.claimer.backlog = lambda: counts.append(1) or counting()  # type: ignore[method-assign]
        stall = threading.Event()
        held = svc.claimer.pool.submit(stall.wait)
        for _ in range(5):
            clock.advance(2.0)
            assert svc.metrics(backlog_timeout_s=0.01).due_backlog == {}  # timed out: empty, as documented
        stall.set()
        held.result(timeout=LIVENESS_S)
        svc.claimer.pool.submit(lambda: None).result(timeout=LIVENESS_S)  # every count queued before it has run
        assert len(counts) == 1, counts
        clock.advance(2.0)
        assert svc.metrics(backlog_timeout_s=LIVENESS_S).due_backlog == {P: 0}
    finally:
        svc.stop()
        store.close()

"""The live status page (``timerwheel-c web`` and ``/`` of ``run --metrics-port``), in a real browser:
Debian's chromium and chromedriver driven by selenium, given both paths so that nothing downloads a
browser. A known store (SQLite, and PostgreSQL when the test server is set) must show its figures;
a search finds a timer; a requeue from the page works with actions on and is refused with them
off; a hostile reference renders as text and runs nothing; no page logs a console error. Each
browser wait is a liveness bound (30 s), never a speed: a loaded machine cannot make them flake.
Screenshots of a runner's page (chart included) and of a PostgreSQL fleet's are written to build/,
their paths printed."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from timerwheel_c.durable import TimerHandler, TimerKind, TimerRegistry, get_timer, open_store, run_due, schedule
from timerwheel_c.durable.service.web import StatusPage, TOKEN_ENV, RateHistory, quantile, serve_page
from timerwheel_c.durable.timers.schedules import add_schedule
from timerwheel_c.durable.timers.triggers import Cron
from waiting import LIVENESS_S, wait_until, wall_ms
from locations import CHECKOUT, TESTS as HELPERS_DIR

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SCREENSHOT = CHECKOUT / "build" / "status-page.png"
KIND = 7
# Under pytest-xdist (the README's test command) these tests run on one worker, in one chromium.
pytestmark = pytest.mark.xdist_group("chromium")
MIN_MS = 60_000
HOSTILE = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">&amp;\u202e"'


class Broken(TimerHandler):
    kind = TimerKind(KIND)
    max_attempts = 1

    def fire(self, ctx, timer):
        raise RuntimeError(f"no such order {timer.reference!r}")


@pytest.fixture(scope="module")
def chromium():
    """A headless chromium of the system (skipped, saying why, without it or without selenium)."""
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip(f"no {CHROMIUM} and {CHROMEDRIVER}: apt-get install chromium chromium-driver (.ci/run does)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra)")
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"  # selenium-manager, were it ever asked, must not reach the network
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1360,1500"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


@pytest.fixture
def browser(chromium):
    """The module's chromium on a blank page, its console emptied: a page of an earlier test, whose
    server is gone, may have logged its failed reloads."""
    chromium.get("about:blank")
    console_errors(chromium)
    return chromium


def console_errors(driver) -> list:
    """The console's errors since the last call (reading the log empties it)."""
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


@pytest.fixture
def known(store_url):
    """A known store: p1 'order-1' due in 3 min and 'late-1' 2 min overdue, p2 'order-2' parked (its only
    attempt raised), p3 a hostile reference due in an hour, and a schedule in Europe/Paris. Returns the URL."""
    now = wall_ms()
    with open_store(store_url) as store:
        schedule(store, "p1", now + 3 * MIN_MS, KIND, b"order-1")
        schedule(store, "p1", now - 2 * MIN_MS, KIND, b"late-1")
        schedule(store, "p2", now - MIN_MS, KIND, b"order-2")
        assert run_due(store, "p2", TimerRegistry().register(Broken()), now).parked == 1
        schedule(store, "p3", now + 60 * MIN_MS, KIND, HOSTILE.encode())
        add_schedule(store, "p1", "nightly", Cron("30 2 * * *", "Europe/Paris"), KIND)
    return store_url


def serving(url: str, **kwargs):
    """A page on its own store of ``url``, served on a free loopback port: ``(page, server, base URL)``."""
    page = StatusPage(open_store(url), url, **kwargs)
    server = serve_page(page, 0, kwargs.get("host", "127.0.0.1"))
    return page, server, f"http://127.0.0.1:{server.port}"


@pytest.fixture
def served(known):
    """``served(**StatusPage arguments)``: the base URL of a page of the known store; closed at teardown."""
    opened = []

    def serve(**kwargs):
        page, server, base = serving(known, **kwargs)
        opened.append((page, server))
        return base

    yield serve
    for page, server in opened:
        server.close()
        page.close()


def wait_text(driver, css: str, needle: str) -> str:
    """The text of ``css`` once it holds ``needle`` (liveness bound). Read in one script call: the
    page's reload replaces its sections, so an element found in one call may be gone in the next."""
    seen = {}

    def holds() -> bool:
        seen["text"] = driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0])).map(function (e) { return e.innerText; })"
            ".join(' ')", css)
        return needle in seen["text"]

    wait_until(holds, f"{needle!r} in {css}")
    return seen["text"]


def test_the_page_shows_the_figures_of_a_known_store(browser, served, known):
    """Each partition's due backlog, oldest due time and parked count, the schedule's next fire in
    its own zone, and no console error."""
    browser.get(served())
    partitions = wait_text(browser, "#partitions", "p2")
    rows = {cells[0]: cells for cells in (line.split("\t") for line in partitions.splitlines()[1:])}
    assert set(rows) == {"p1", "p2", "p3"}, partitions
    # partition, owner, due backlog, oldest due, parked: late-1 is due, order-1 not yet
    assert rows["p1"][2] == "1" and re.search(r"\(\d+ min( \d+ s)? ago\)", rows["p1"][3]) and rows["p1"][4] == "0"
    assert (rows["p2"][2], rows["p2"][3], rows["p2"][4]) == ("0", "-", "1") and rows["p3"][4] == "0", rows
    summary = browser.find_element("id", "summary").text
    assert "1\nparked" in summary and "3\npartitions" in summary and "1\ndue now" in summary, summary
    schedules = browser.find_element("id", "schedules").text
    assert "nightly" in schedules and re.search(r"T02:30:00\+0[12]:00", schedules) and "active" in schedules, schedules
    fleet = browser.find_element("id", "fleet").text
    if known.startswith("sqlite"):
        assert "SQLite store records no runners" in fleet
    else:
        assert "No live runner" in fleet
    assert console_errors(browser) == []


def test_a_search_by_part_of_a_reference_finds_the_timer(browser, served):
    """Typing a part of a reference in the search form lists that timer with its state, attempt,
    last error and due time, and no other."""
    from selenium.webdriver.common.by import By

    browser.get(served())
    box = browser.find_element(By.NAME, "reference")
    box.send_keys("der-2")
    box.submit()
    timers = wait_text(browser, "#timers", "order-2")
    assert "order-1" not in timers and "late-1" not in timers
    row = timers.splitlines()[1].split("\t")
    assert row[:5] == ["p2", "7", "order-2", "parked", "1"] and row[6] == "RuntimeError: no such order b'order-2'", row
    browser.get(served().rstrip("/") + "/?kind=7&state=scheduled&partition=p1")
    timers = wait_text(browser, "#timers", "order-1")
    assert "late-1" in timers and "order-2" not in timers
    assert console_errors(browser) == []


def test_a_requeue_from_the_page_puts_a_parked_timer_back_when_actions_are_on(browser, served, known):
    """The requeue button of a parked timer makes it scheduled, attempt 0, due now; the page says so."""
    from selenium.webdriver.common.by import By

    before_ms = wall_ms()
    browser.get(served(actions=True) + "/?state=parked")
    wait_text(browser, "#timers", "order-2")
    browser.find_element(By.CSS_SELECTOR, "#timers button[value^='requeue ']").click()
    note = wait_text(browser, "#note", "requeue")
    assert "order-2" in note and "p2" in note, note
    with open_store(known) as store:
        timer = get_timer(store, "p2", KIND, b"order-2")
    assert (timer.state, timer.attempt) == ("scheduled", 0)
    assert before_ms <= timer.due_at_ms <= wall_ms()
    assert console_errors(browser) == []


def test_actions_are_refused_when_off(browser, served, known):
    """With actions off the page has no button, and a POST made from the page itself, token and all
    (the form's own fields), is refused with 403 and changes nothing."""
    from selenium.webdriver.common.by import By

    browser.get(served() + "/?state=parked")
    wait_text(browser, "#timers", "order-2")
    assert browser.find_elements(By.CSS_SELECTOR, "button[name=act]") == []
    status = browser.execute_async_script("""
        var done = arguments[arguments.length - 1];
        fetch("/action", {method: "POST", headers: {"Content-Type": "application/x-www-form-urlencoded"},
                          body: "token=x&act=" + encodeURIComponent("requeue 7 " + arguments[0] + " 7032")})
          .then(function (r) { done(r.status); });""", b"order-2".hex())
    assert status == 403
    with open_store(known) as store:
        assert get_timer(store, "p2", KIND, b"order-2").state == "parked"
    console_errors(browser)  # the refused fetch is logged as a failed resource: expected here


def test_a_hostile_reference_renders_as_text_and_runs_nothing(browser, served):
    """A reference holding markup is shown character for character, and neither its script nor its
    img's handler runs (escaped, and the page's Content-Security-Policy allows no other script)."""
    from selenium.webdriver.common.by import By

    browser.get(served(actions=True) + "/?partition=p3")
    wait_text(browser, "#timers", "<script>")
    cell = browser.find_element(By.CSS_SELECTOR, "#timers td.ref")
    assert cell.text == HOSTILE.replace("\u202e", "\\u202e")  # an invisible control is shown as its escape
    assert browser.find_elements(By.CSS_SELECTOR, "#timers td.ref *") == []
    assert browser.execute_script("return window.pwned === undefined")
    button = browser.find_element(By.CSS_SELECTOR, "#timers button[value^='cancel ']")
    assert button.get_attribute("value") == f"cancel {KIND} {HOSTILE.encode().hex()} {b'p3'.hex()}"
    assert console_errors(browser) == []


def test_the_page_reloads_its_figures_in_place(browser, served, known):
    """A timer written after the page loaded shows up without a reload (the page's own script)."""
    browser.get(served())
    wait_text(browser, "#partitions", "p3")
    with open_store(known) as store:
        schedule(store, "p4", wall_ms() + MIN_MS, KIND, b"new")
    wait_text(browser, "#partitions", "p4")
    assert console_errors(browser) == []


def test_rate_history_gives_fired_per_second_and_lateness_quantiles():
    """Samples driven by a hand clock: 50 fired over 10 s is 5/s; 100 first attempts, 90 within 5 ms
    and 10 between 1 and 2.5 s, put p50 in the first bucket and p99 in the 1-2.5 s bucket."""
    clock = [0.0]
    counts = [(0, [(0.005, 0), (float("inf"), 0)])]
    history = RateHistory(lambda: (counts[0][0], tuple(_cumulative(counts[0][1]))), clock=lambda: clock[0], keep_s=60)
    history.sample()
    assert history.series() == []
    clock[0], counts[0] = 10.0, (50, [(0.005, 90), (1.0, 0), (2.5, 10)])
    history.sample()
    [(ago_s, per_s, p50, p99)] = history.series()
    assert (ago_s, per_s) == (0.0, 5.0)
    assert 0 < p50 <= 0.005 and 1.0 < p99 <= 2.5
    clock[0] = 100.0
    history.sample()  # the first two samples are past keep_s: dropped
    assert history.series() == []
    clock[0] = 110.0
    history.sample()
    assert history.series() == [(0.0, 0.0, None, None)]  # nothing fired: no quantile
    assert quantile([0] * 15, 0.5) is None


def _cumulative(buckets: list) -> list:
    """``(bound, n)`` pairs given per bucket, as the cumulative counts of every bucket of the histogram."""
    from timerwheel_c.durable.service.metrics import LATENESS_BUCKETS_S

    per = dict(buckets)
    out, total = [], 0
    for bound in LATENESS_BUCKETS_S + (float("inf"),):
        total += per.get(bound, 0)
        out.append((bound, total))
    return out


def _request(base: str, path: str, data: bytes | None = None, host: str | None = None):
    req = urllib.request.Request(base + path, data=data)
    if host is not None:
        req.add_header("Host", host)
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(req, timeout=LIVENESS_S) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def test_off_loopback_actions_need_the_operators_token(known, monkeypatch):
    """Bound beyond loopback, the page holds no token of its own: a POST without the operator's token,
    or with a wrong one, is refused (403); with it, the action runs (303 back to the page). Without a
    token set, actions off loopback are refused at construction, naming the variable."""
    with pytest.raises(ValueError, match=TOKEN_ENV):
        StatusPage(open_store(known), known, actions=True, host="0.0.0.0").close()
    page, server, base = serving(known, actions=True, host="0.0.0.0", token="s3cret-token")
    try:
        status, _, body = _request(base, "/?state=parked")
        assert status == 200 and 'type="password" name="token"' in body and "s3cret-token" not in body
        act = "act=" + f"requeue {KIND} {b'order-2'.hex()} {b'p2'.hex()}".replace(" ", "+")
        for form in (act, act + "&token=wrong"):
            status, _, body = _request(base, "/action", form.encode())
            assert status == 403 and "token" in body
        status, headers, _ = _request(base, "/action", (act + "&token=s3cret-token").encode())
        assert status == 303 and headers["Location"].startswith("/?note=requeue")
    finally:
        server.close()
        page.close()


def test_a_loopback_page_refuses_another_host_name_and_sends_a_strict_policy(served):
    """A request naming a host other than loopback (DNS rebinding) is refused with 421; the page
    itself carries a Content-Security-Policy allowing only its own script, and no caching."""
    base = served()
    status, _, _ = _request(base, "/", host="attacker.example:80")
    assert status == 421
    status, headers, body = _request(base, "/")
    assert status == 200 and headers["Cache-Control"] == "no-store"
    assert "script-src 'sha256-" in headers["Content-Security-Policy"] and "default-src 'none'" in headers[
        "Content-Security-Policy"]
    assert _request(base, "/nope")[0] == 404


class FreezingProxy:
    """A TCP proxy on a free loopback port to ``host:port`` that forwards nothing while ``thawed`` is
    clear, its connections kept open: a store that neither answers nor fails, as a frozen server or a
    host gone without a word is (no lock or statement timeout of the server's ends that wait)."""

    def __init__(self, host: str, port: int):
        self.thawed = threading.Event()
        self.thawed.set()
        self._to = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self._to)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                self.thawed.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            source.close()
            sink.close()

    def close(self) -> None:
        self._listener.close()


def test_a_store_that_does_not_answer_holds_no_request_and_says_so(schema_url, monkeypatch):
    """A store that neither answers nor fails (a frozen server) answers each reload of the page and
    each action within STORE_WAIT_S with a line saying so, where each waited for ever, a thread more
    per reload of each open tab; the page reads again once the store answers, and an action that timed
    out may still complete then."""
    import timerwheel_c.durable.service.web as web

    monkeypatch.setattr(web, "STORE_WAIT_S", 0.5)
    with open_store(schema_url) as store:
        schedule(store, "p1", wall_ms() + MIN_MS, KIND, b"order-1")
    where = urlsplit(schema_url)
    proxy = FreezingProxy(where.hostname, where.port or 5432)
    page, server, base = serving(where._replace(netloc=f"{where.username}@127.0.0.1:{proxy.port}").geturl(), actions=True)
    act = "act=" + f"cancel {KIND} {b'order-1'.hex()} {b'p1'.hex()}".replace(" ", "+") + "&token=" + page.form_token
    try:
        assert page.read({})["error"] is None
        proxy.thawed.clear()
        for _ in range(3):  # the first read waits on the store; the next find it still waiting
            status, _, body = _request(base, "/")
            assert status == 200 and ("did not answer within 0.5 s" in body or "busy with an earlier call" in body), body
        status, _, body = _request(base, "/action", act.encode())
        assert status == 503 and "the store failed" in body, body
        proxy.thawed.set()
        wait_until(lambda: page.read({})["error"] is None, "the page reads again once the store answers")
        status, _, _ = _request(base, "/action", act.encode())  # the cancel again, if the first did not run
        assert status in (303, 409)
        with open_store(schema_url) as store:
            assert get_timer(store, "p1", KIND, b"order-1") is None
    finally:
        proxy.thawed.set()
        server.close()
        page.close()
        proxy.close()


def _started_port(proc: subprocess.Popen) -> int:
    """The port a ``web`` or ``run`` process logs it serves on (it binds port 0)."""
    for line in proc.stderr:  # type: ignore[union-attr]
        found = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
        if found:
            return int(found.group(1))
    raise AssertionError(f"the process ended ({proc.wait(LIVENESS_S)}) before it served")


def test_the_web_command_serves_the_page_without_the_store_password(known, tmp_path):
    """``timerwheel-c web --port 0`` serves the page; neither the store URL nor a password in it is
    in the HTML; SIGTERM ends it with status 0. (The test server trusts loopback, so a password in
    the URL is accepted and unused.)"""
    url = known.replace("postgresql://postgres@", "postgresql://postgres:pw-9f3c1a@", 1)
    with open_store(url) as store:
        store.partitions()
    proc = subprocess.Popen([sys.executable, "-m", "timerwheel_c", "web", "--store", url, "--port", "0"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        port = _started_port(proc)
        status, _, body = _request(f"http://127.0.0.1:{port}", "/?reference=order")
        assert status == 200 and "order-2" in body and "order-1" in body
        assert "pw-9f3c1a" not in body and url not in body and known not in body
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(LIVENESS_S) == 0


@pytest.mark.parametrize("argv, needle", [
    (["web", "--host", "0.0.0.0", "--web-actions"], TOKEN_ENV),
    (["run", "--handlers", "durable_handlers:registry", "--metrics-port", "0", "--metrics-host", "0.0.0.0",
      "--web-actions"], TOKEN_ENV),
    (["run", "--handlers", "durable_handlers:registry", "--web-actions"], "--metrics-port")])
def test_actions_off_loopback_without_a_token_or_without_a_page_are_refused(argv, needle, tmp_path):
    """One line naming what is missing, exit 2, and no SQLite file created."""
    store = tmp_path / "never.db"
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    env["PYTHONPATH"] = str(HELPERS_DIR)
    out = subprocess.run([sys.executable, "-m", "timerwheel_c", *argv, "--store", f"sqlite:///{store}"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=LIVENESS_S, env=env)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and needle in out.stderr, out.stderr
    assert not store.exists()


def screenshot(browser, request, path: Path) -> None:
    """Save the browser's window as the PNG ``path`` and print where, for a person to look at."""
    path.parent.mkdir(exist_ok=True)
    browser.save_screenshot(str(path))
    with request.getfixturevalue("capsys").disabled():
        print(f"\nstatus page screenshot: {path}")
    assert path.stat().st_size > 10_000


def test_a_runner_serves_the_page_with_its_chart_beside_metrics(browser, tmp_path, request):
    """``run --metrics-port 0`` serves the page at ``/`` beside ``/metrics``; once the runner fired a
    timer, the chart of its own counters is drawn. The screenshot of that page is written to
    build/status-page.png (its path printed) for a person to look at."""
    url = f"sqlite:///{tmp_path / 'timers.db'}"
    now = wall_ms()
    with open_store(url) as store:
        for i in range(20):
            schedule(store, f"p{i % 4}", now - i * 1000, 0xF3, f"order-{i}".encode())
        schedule(store, "p1", now - MIN_MS, KIND, b"order-parked")
        assert run_due(store, "p1", TimerRegistry().register(Broken()), now).parked == 1
        schedule(store, "p2", now + 30 * MIN_MS, 0xF3, b"later")
        add_schedule(store, "p0", "nightly-report", Cron("30 2 * * *", "Europe/Paris"), KIND)
    env = dict(os.environ, PYTHONPATH=str(HELPERS_DIR))
    proc = subprocess.Popen([sys.executable, "-m", "timerwheel_c", "run", "--store", url, "--handlers",
                             "durable_handlers:registry", "--metrics-port", "0", "--web-actions"],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{_started_port(proc)}"
        assert "timerwheel_fired_total" in _request(base, "/metrics")[2]
        browser.get(base + "/?state=parked")
        wait_text(browser, "#rates", "fired/s")  # two samples of the counters: the first interval drawn
        wait_text(browser, "#partitions", "p3")
        screenshot(browser, request, SCREENSHOT)
        assert browser.find_elements("css selector", "#rates svg polyline")
        assert console_errors(browser) == []
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(LIVENESS_S) == 0


def test_the_fleet_shows_a_live_postgresql_runner_with_its_heartbeat(browser, schema_url, tmp_path, request):
    """A runner on PostgreSQL is listed with its host, OS pid, kinds, partitions and a heartbeat age
    (its ownership check runs about every second, so the age stays within a generous bound), and
    owns the partition in the partitions table. Its screenshot goes to build/status-page-fleet.png."""
    import socket

    with open_store(schema_url) as store:
        schedule(store, "q0", wall_ms() + 60 * MIN_MS, 0xF3, b"r")
    env = dict(os.environ, PYTHONPATH=str(HELPERS_DIR))
    proc = subprocess.Popen([sys.executable, "-m", "timerwheel_c", "run", "--store", schema_url, "--handlers",
                             "durable_handlers:registry"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    page, server, base = serving(schema_url)
    try:
        browser.get(base)
        fleet = wait_text(browser, "#fleet", f"\t{proc.pid}\t")
        cells = fleet.splitlines()[1].split("\t")
        # A fleet over the whole store owns shards: this lone runner, all 64 of them.
        assert cells[0] == socket.gethostname() and cells[1] == str(proc.pid) and cells[5] == "shards 0-63", cells
        beat = re.fullmatch(r"(\d+\.\d) s ago", cells[6])
        assert beat and float(beat.group(1)) < LIVENESS_S, cells
        owner = wait_text(browser, "#partitions", f"pid {proc.pid}")
        assert f"{socket.gethostname()} pid {proc.pid}" in owner
        screenshot(browser, request, SCREENSHOT.with_name("status-page-fleet.png"))
        assert console_errors(browser) == []
    finally:
        server.close()
        page.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(LIVENESS_S) == 0


def test_a_search_names_a_bad_field_and_stops_reading_at_its_bound(known, monkeypatch):
    """A kind outside 1..255 or an unknown state is a line on the page naming the value, never an
    error page; a search reads at most SCAN_LIMIT timers, whatever it filters on, and then says
    that more may match."""
    import timerwheel_c.durable.service.web as web

    page = StatusPage(open_store(known), known)
    try:
        for query, needle in (({"kind": "300"}, "'300'"), ({"kind": "x"}, "'x'"), ({"state": "gone"}, "'gone'")):
            data = page.read(query)
            assert data["timers"] is None and needle in data["search_error"], data["search_error"]
        assert [t.reference for t in page.read({"reference": "order"})["timers"]] == [b"order-1", b"order-2"]
        monkeypatch.setattr(web, "SCAN_LIMIT", 2)
        data = page.read({"reference": "order"})
        assert data["more"] and len(data["timers"]) <= 1, data["timers"]
        # Every timer read counts, whatever the search filters on: a kind no timer has stops there
        # too (it read the whole store at each refresh).
        data = page.read({"kind": "200"})
        assert data["more"] and data["timers"] == [], data
    finally:
        page.close()


def test_each_action_changes_what_it_names_and_nothing_else(known):
    """fire-now makes a scheduled timer due now; requeue refuses a scheduled one (409, it is for
    parked or retrying timers); cancel removes one; pause and resume flip a schedule; a malformed or
    unknown action is a 400 naming it."""
    from timerwheel_c.durable.service.web import Refused
    from timerwheel_c.durable.timers.schedules import get_schedule

    page = StatusPage(open_store(known), known, actions=True)

    def act(action: str, target: bytes, partition: str, kind: int = KIND) -> str:
        return page.act({"token": page.form_token, "act": f"{action} {kind} {target.hex()} {partition.encode().hex()}"})

    try:
        before_ms = wall_ms()
        assert act("fire-now", b"order-1", "p1").startswith("fire-now: partition 'p1'")
        timer = get_timer(page.store, "p1", KIND, b"order-1")
        assert timer.state == "scheduled" and before_ms <= timer.due_at_ms <= wall_ms()
        with pytest.raises(Refused, match="nothing pending") as refused:
            act("requeue", b"late-1", "p1")
        assert refused.value.status == 409
        act("cancel", b"late-1", "p1")
        assert get_timer(page.store, "p1", KIND, b"late-1") is None
        act("pause", b"nightly", "p1", 0)
        assert get_schedule(page.store, "p1", "nightly").paused
        act("resume", b"nightly", "p1", 0)
        assert not get_schedule(page.store, "p1", "nightly").paused
        for form, needle in (({"act": "requeue 7 zz 7031"}, "malformed"), ({"act": "requeue 7 00 p1"}, "malformed"),
                             ({"act": "drop 7 00 7031"}, "'drop'")):
            with pytest.raises(Refused, match=needle) as refused:
                page.act({"token": page.form_token, **form})
            assert refused.value.status == 400
        assert get_timer(page.store, "p2", KIND, b"order-2").state == "parked"
    finally:
        page.close()


def test_a_schedules_occurrence_is_shown_as_one_and_offers_no_timer_action(known):
    """The schedule 'nightly' has a pending occurrence in p1, and a one-off timer of that kind and
    name is scheduled beside it: the page lists both, the occurrence as "schedule nightly" with no
    button (the timer actions name a one-off timer; a schedule is paused or resumed in its own
    table), the one-off timer with its buttons."""
    from timerwheel_c.durable.service.web_page import render

    page = StatusPage(open_store(known), known, actions=True)
    try:
        schedule(page.store, "p1", wall_ms() + 5 * MIN_MS, KIND, b"nightly")
        data = page.read({"partition": "p1", "reference": "nightly"})
        assert sorted(t.schedule for t in data["timers"]) == [False, True]
        html = render(data, {"partition": "p1"}, actions=True, loopback=True, form_token=page.form_token)
        rows = [row for row in html.split("<tr>") if "nightly" in row and "<td class=ref>" in row]
        occurrence = [row for row in rows if "schedule nightly" in row]
        assert len(rows) == 2 and len(occurrence) == 1 and "<button" not in occurrence[0]
        assert "cancel" in [row for row in rows if row not in occurrence][0]
    finally:
        page.close()


def test_a_button_acts_on_its_own_rows_partition_whatever_characters_its_name_holds(store_url):
    """A partition named with a tab (shown as "\\t"), a no-break space or a line separator: each row's
    cancel button, submitted as rendered, cancels that row's timer, never the timer of the partition
    literally named "tab\\there" beside it (the button used to carry the shown text, which named that
    one); a schedule's pause button pauses its own. A search submitted again from the form's fields
    finds the same partition."""
    from html import unescape

    from timerwheel_c.durable.service.web_page import render
    from timerwheel_c.durable.timers.schedules import get_schedule

    names = ["tab\tthere", "tab\\there", "nbsp\xa0here", "eu\u2028west"]
    with open_store(store_url) as store:
        for name in names:
            schedule(store, name, wall_ms() + 60 * MIN_MS, KIND, b"order")
        add_schedule(store, "eu\u2028west", "nightly", Cron("30 2 * * *", "Europe/Paris"), KIND)
    page = StatusPage(open_store(store_url), store_url, actions=True)
    try:
        for name in ("tab\tthere", "nbsp\xa0here", "eu\u2028west"):
            html = render(page.read({"partition": name}), {"partition": name}, actions=True, loopback=True,
                          form_token=page.form_token)
            (typed,) = re.findall(r'<input name="partition" value="([^"]*)"', html)
            assert unescape(typed) == name  # sent back as it was typed
            values = [unescape(v) for v in re.findall(r'name="act" value="([^"]*)"', html)]
            (cancel,) = [v for v in values if v.startswith("cancel ")]
            assert page.act({"token": page.form_token, "act": cancel}).startswith("cancel: partition " + repr(name))
            assert get_timer(page.store, name, KIND, b"order") is None
            if name == "eu\u2028west":
                (pause,) = [v for v in values if v.startswith("pause ")]
                page.act({"token": page.form_token, "act": pause})
                assert get_schedule(page.store, name, "nightly").paused
        assert get_timer(page.store, "tab\\there", KIND, b"order") is not None  # the look-alike is untouched
    finally:
        page.close()


def test_a_search_with_partition_and_kind_finds_the_exact_reference_and_the_others_holding_it(store_url):
    """With a partition and a kind given, the timer named exactly by the text comes first, and the
    timers whose reference holds it follow, as the form says "a part of one finds it" (the exact one
    used to be the only one found, with no word that more matched)."""
    with open_store(store_url) as store:
        for reference in (b"order-1", b"order-100", b"order-12", b"other"):
            schedule(store, "p1", wall_ms() + 60 * MIN_MS, KIND, reference)
    page = StatusPage(open_store(store_url), store_url)
    try:
        data = page.read({"partition": "p1", "kind": str(KIND), "reference": "order-1"})
        assert [t.reference for t in data["timers"]] == [b"order-1", b"order-100", b"order-12"]
        assert not data["more"]
    finally:
        page.close()


def test_only_an_action_of_the_page_puts_a_line_in_its_done_box(known):
    """The green box says what an action just did: a link that brings its own ``note`` (or a forged
    signature) shows nothing there; the redirect an action answers with shows its line."""
    page, server, base = serving(known, actions=True)
    try:
        status, _, body = _request(base, "/?note=cancelled+every+timer")
        assert status == 200 and 'id="note"' not in body and "cancelled every timer" not in body
        status, _, body = _request(base, "/?note=cancelled+every+timer&sig=" + "0" * 32)
        assert status == 200 and 'id="note"' not in body
        act = f"requeue {KIND} {b'order-2'.hex()} {b'p2'.hex()}".replace(" ", "+")
        status, headers, _ = _request(base, "/action", f"act={act}&token={page.form_token}".encode())
        assert status == 303
        status, _, body = _request(base, headers["Location"])
        assert status == 200 and 'id="note">requeue: partition' in body
    finally:
        server.close()


def test_the_page_reads_a_bounded_number_of_partitions_and_says_how_many_there_are(store_url, monkeypatch):
    """Past PAGE_PARTITIONS partitions (each costs two scans, every refresh) the page reads and shows
    the first ones in name order, says how many there are in all and that the search reads any
    other, and marks its sums as those of the partitions it read; the search still finds a timer of
    a partition past them."""
    import timerwheel_c.durable.service.web as web
    from timerwheel_c.durable.service.web_page import render

    monkeypatch.setattr(web, "PAGE_PARTITIONS", 3)
    with open_store(store_url) as store:
        for i in range(7):
            schedule(store, f"p{i}", wall_ms() - MIN_MS, KIND, b"order")
    page = StatusPage(open_store(store_url), store_url)
    try:
        data = page.read({})
        assert [p["partition"] for p in data["fleet"]["partitions"]] == ["p0", "p1", "p2"]
        assert data["fleet"]["partitions_total"] == 7
        html = render(data, {}, actions=False, loopback=True, form_token="")
        assert "The first 3 of 7 partitions" in html and "due now (first 3)" in html
        assert [t.partition for t in page.read({"partition": "p6"})["timers"]] == ["p6"]
    finally:
        page.close()


def test_the_page_reads_the_schedules_by_shard_with_a_bound_per_shard(store_url, monkeypatch):
    """The page's schedules come from one read by shard, at most PAGE_SCHEDULES_PER_SHARD a shard, so a
    refresh costs the same with a million partitions as with one (it used to scan every partition);
    a schedule of any partition is there, in partition and name order, and a shard holding more than
    the page read is said, with the command that lists them all."""
    import timerwheel_c.durable.service.web as web
    from timerwheel_c.durable.service.web_page import render

    with open_store(store_url) as store:
        for partition, name in (("zz-last", "b"), ("zz-last", "a"), ("aa-first", "c")):
            add_schedule(store, partition, name, Cron("30 2 * * *", "Europe/Paris"), KIND)
    page = StatusPage(open_store(store_url), store_url)
    try:
        data = page.read({})
        assert [(s.partition, s.name) for s in data["schedules"]] == [("aa-first", "c"), ("zz-last", "a"), ("zz-last", "b")]
        assert not data["schedules_more"]
        monkeypatch.setattr(web, "PAGE_SCHEDULES_PER_SHARD", 1)
        data = page.read({})
        assert data["schedules_more"] and len(data["schedules"]) < 3
        assert "timerwheel-c schedules list</code> gives them all" in render(data, {}, actions=False, loopback=True,
                                                                           form_token="")
    finally:
        page.close()

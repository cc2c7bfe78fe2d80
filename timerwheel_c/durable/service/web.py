"""The live status page of a durable timer store, served at ``/`` by ``timerwheel-c web`` and by
``timerwheel-c run --metrics-port`` (beside ``/metrics`` and ``/healthz``).

What it reads, through the same functions as the operator commands (``fleet status``,
``timers list``, ``schedules list``), on a store connection of its own:

- the fleet: the live runners (PostgreSQL only: SQLite records none), each with its host, OS pid,
  since when it is a member, its kinds, its partitions, and its heartbeat age: how long ago its
  lock connection last ran its ownership check (``pg_stat_activity.state_change``, measured on the
  server's clock; a fleet runner's loop checks about every second);
- per partition: its owner(s), its due backlog, its oldest due time and how late that is, its
  parked timers;
- the timers a search names (partition, kind, state, a reference or a part of one), with state,
  attempt, last error and due time;
- the schedules: next fire time in the schedule's zone, paused or not, last run;
- on a runner's page only: fired/s and lateness p50/p99 over the last :data:`HISTORY_S` seconds,
  from the service's own counters (:class:`RateHistory`).

Plain HTML and inline SVG, with a few lines of inline script that reload the figures every
:data:`~.web_page.REFRESH_S` seconds: no build step, nothing fetched from elsewhere. Every value from the
store is HTML-escaped (references and errors may hold anything), and a Content-Security-Policy
lets only the page's own script run. No store URL (nor its password) is ever on the page. A
request waits for the store :data:`STORE_WAIT_S` (10 s) at most, one store call at a time: a store
that does not answer (a frozen server) makes each reload say so instead of holding it.

Actions (requeue a parked or retrying timer, fire one now, cancel one, pause or resume a
schedule) are off unless the page is made with ``actions=True`` (``--web-actions``). A POST then
carries a token: on loopback the page holds a per-process one in its forms (so a page of another
site cannot post to it); bound elsewhere, the operator types the token given in
``$TIMERWHEEL_C_WEB_TOKEN``. On loopback a request naming another host is refused (DNS
rebinding). Sources: OWASP's CSRF prevention cheat sheet (synchronizer tokens), MDN on
Content-Security-Policy.
"""
from __future__ import annotations

import hmac
import secrets
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple, TypeVar
from urllib.parse import parse_qs, urlencode, urlsplit

from ..storage.errors import StoreError, TransientStoreError
from ..timers.keys import TimerKind
from ..timers.schedules import pause_schedule, resume_schedule, schedules_by_shard
from ..timers.writer import STATES, cancel, get_timer, requeue, timers_in_order
from .cli_text import first_line
from .fleet import status
from .metrics import LATENESS_BUCKETS_S
from .web_http import PageHandler, WebServer, host_only, is_loopback
from .web_page import HISTORY_S, SCRIPT_SHA256, message_page, render

__all__ = ["ACTIONS", "HISTORY_S", "TOKEN_ENV", "RateHistory", "StatusPage", "WebServer", "is_loopback",
           "serve_page"]

TOKEN_ENV = "TIMERWHEEL_C_WEB_TOKEN"
SAMPLE_EVERY_S = 5.0  # a runner's counters are sampled this often (s) for the chart
SEARCH_LIMIT = 100  # timers a search shows at most
# Partitions the page reads and shows at most, the first in name order: two scans each, every refresh.
PAGE_PARTITIONS = 200
PAGE_SCHEDULES_PER_SHARD = 50  # schedules the page reads per shard at most, in one scan of them all
SCAN_LIMIT = 10_000  # timers read at most for a search, whatever it filters on
ACTIONS = ("requeue", "fire-now", "cancel", "pause", "resume")
_TIMER_ACTIONS = ACTIONS[:3]
# Seconds a request waits for the store (the page's read, an action) before it answers that the store
# did not: a store that holds its connections open and never answers (a frozen server, a table lock, a
# host gone without a word) held each request for ever, and each open tab's reload added one more.
STORE_WAIT_S = 10.0


Response = Tuple[int, Dict[str, str], bytes]
T = TypeVar("T")

# Headers of every response: no caching of live figures, no framing, only the page's own script.
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-" + SCRIPT_SHA256 + "'; "
                               "connect-src 'self'; img-src data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
}


class RateHistory:
    """Fired/s and lateness quantiles of a service over the last ``keep_s`` seconds, from samples
    of its cumulative counters (:meth:`DurableTimerService.metrics`) taken by :meth:`sample`.

    ``counts()`` returns ``(fired so far, lateness buckets)``: the buckets cumulative
    ``(upper bound s, count)`` pairs ending with ``(inf, n)``, as
    :class:`~.metrics.LatenessHistogram` keeps them. ``clock``: seconds, monotonic (injected by tests).
    """

    def __init__(self, counts: Callable[[], tuple], clock: Callable[[], float] = time.monotonic,
                 keep_s: float = HISTORY_S):
        self._counts = counts
        self._clock = clock
        self._keep_s = keep_s
        self._lock = threading.Lock()
        self._samples: List[tuple] = []  # (at_s, fired, bucket counts)

    def sample(self) -> None:
        """Record the counters now, dropping samples older than ``keep_s``."""
        fired, buckets = self._counts()
        at_s = self._clock()
        with self._lock:
            self._samples.append((at_s, fired, tuple(n for _, n in buckets)))
            while self._samples and self._samples[0][0] < at_s - self._keep_s:
                self._samples.pop(0)

    def series(self) -> list:
        """One point per interval between samples, oldest first: ``(seconds before the last sample,
        fired per second, lateness p50 s, lateness p99 s)``; the quantiles are None for an interval
        in which no first attempt fired."""
        with self._lock:
            samples = list(self._samples)
        if not samples:
            return []
        last_s = samples[-1][0]
        out = []
        for (t0, f0, b0), (t1, f1, b1) in zip(samples, samples[1:]):
            if t1 <= t0:
                continue
            delta = [n1 - n0 for n0, n1 in zip(b0, b1)]
            out.append((last_s - t1, (f1 - f0) / (t1 - t0), quantile(delta, 0.5), quantile(delta, 0.99)))
        return out


def quantile(cumulative: list, q: float) -> Optional[float]:
    """The ``q`` quantile (s) of a lateness histogram's cumulative counts (one per bound of
    :data:`~.metrics.LATENESS_BUCKETS_S`, then +Inf), interpolated within its bucket as Prometheus'
    ``histogram_quantile`` does; the largest finite bound when it falls in +Inf; None when empty."""
    total = cumulative[-1] if cumulative else 0
    if total <= 0:
        return None
    rank = q * total
    below, low_s = 0, 0.0
    for bound_s, n in zip(LATENESS_BUCKETS_S, cumulative):
        if n >= rank:
            return low_s + (bound_s - low_s) * ((rank - below) / (n - below) if n > below else 1.0)
        below, low_s = n, bound_s
    return LATENESS_BUCKETS_S[-1]


class Refused(Exception):
    """An action the page will not run: ``status`` is the HTTP status, the message says why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class StatusPage:
    """The page of the store ``store`` (a store the page owns: :meth:`close` closes it).

    ``url``: the store's URL, only to mask its password in an error shown on the page.
    ``service``: the runner's service when the page is served by one (its counters feed the chart).
    ``actions``: allow the state-changing actions. ``host``: the address the page is bound to.
    ``token``: what a POST must carry when ``host`` is not loopback (required then with ``actions``).

    Raises:
        ValueError: ``actions`` on a non-loopback ``host`` without a ``token``, naming :data:`TOKEN_ENV`.
    """

    def __init__(self, store, url: Optional[str] = None, *, service=None, actions: bool = False,
                 host: str = "127.0.0.1", token: Optional[str] = None):
        self.loopback = is_loopback(host)
        if actions and not self.loopback and not token:
            raise ValueError(f"actions on a page bound to {host!r} (not loopback) need a token: set ${TOKEN_ENV}")
        self.store = store
        self._url = url
        self.actions = actions
        self._token = token
        # On loopback the page's own forms carry this one: a page of another site cannot read it.
        self.form_token = secrets.token_urlsafe(24) if self.loopback else ""
        # Signs the line an action leaves on the page it redirects to: a link of anyone's cannot make
        # the page say, in its box for what was just done, what was never done.
        self._note_key = secrets.token_bytes(16)
        self._store_lock = threading.Lock()  # one store call at a time (see _on_store)
        self.history: Optional[RateHistory] = None
        self._sampling = threading.Event()
        if service is not None:
            def counts() -> tuple:
                m = service.metrics(backlog_timeout_s=0)
                return sum(m.fired.values()), m.lateness.buckets

            self.history = RateHistory(counts)
            self.history.sample()
            threading.Thread(target=self._sample_until_closed, name="timerwheel-web-sampler", daemon=True).start()

    def _sample_until_closed(self) -> None:
        while not self._sampling.wait(SAMPLE_EVERY_S):
            self.history.sample()  # type: ignore[union-attr]  # set before the thread starts

    def close(self) -> None:
        """Stop sampling and close the store."""
        self._sampling.set()
        self.store.close()

    def now_ms(self) -> int:
        """Now, in Unix epoch ms (the durable layer's clock)."""
        return time.time_ns() // 1_000_000

    # -- reading ---------------------------------------------------------------------------------

    def read(self, query: dict) -> dict:
        """What the page shows for ``query`` (the search: ``partition``, ``kind``, ``state``,
        ``reference``, as strings): ``fleet`` (:func:`~.fleet.status`, with ``heartbeat_ms``
        per runner), ``schedules`` (up to :data:`PAGE_SCHEDULES_PER_SHARD` of each shard; ``schedules_more``: a shard
        holds more), ``timers`` (None without a search), ``search_error``,
        ``error`` (a store error, one line, password masked), ``history``, ``now_ms``."""
        now_ms = self.now_ms()
        out: dict = {"now_ms": now_ms, "fleet": None, "schedules": [], "schedules_more": False, "timers": None, "more": False,
                     "search_error": None, "error": None,
                     "history": None if self.history is None else self.history.series()}
        try:
            out.update(self._on_store(lambda: self._read_store(query, now_ms)))
        except StoreError as exc:
            out["error"] = first_line(exc, self._url)
        return out

    def _read_store(self, query: dict, now_ms: int) -> dict:
        """:meth:`read`'s figures from the store; a call that outlives its request fills no dict of
        that request's."""
        out: dict = {}
        out["fleet"] = fleet = status(self.store, now_ms, PAGE_PARTITIONS)
        if fleet["runners"]:
            from ..storage.postgres.activity import heartbeats

            beats = heartbeats(self.store, [r["backend_pid"] for r in fleet["runners"]])
            for r in fleet["runners"]:
                r["heartbeat_ms"] = beats.get(r["backend_pid"])
        out["schedules"], out["schedules_more"] = schedules_by_shard(self.store, PAGE_SCHEDULES_PER_SHARD)
        if any(query.get(k) for k in ("partition", "kind", "state", "reference")):
            try:
                out["timers"], out["more"] = self._search(query)
            except (TypeError, ValueError) as exc:
                out["search_error"] = str(exc)
        return out

    def _on_store(self, call: Callable[[], T]) -> T:
        """``call()``, one store call at a time, on a thread of its own that this request waits for at
        most :data:`STORE_WAIT_S` in all (for the call before it, then for it), so that a store that never
        answers holds no request, and holds one thread, the call in flight, whatever the reloads.

        Raises:
            TransientStoreError: the store did not answer in time. What ``call`` raised.
        """
        deadline_s = time.monotonic() + STORE_WAIT_S
        if not self._store_lock.acquire(timeout=STORE_WAIT_S):
            raise TransientStoreError(f"the store has been busy with an earlier call of this page for {STORE_WAIT_S:g} s")
        done = threading.Event()
        result: dict = {}

        def run() -> None:
            try:
                result["value"] = call()
            except BaseException as exc:  # noqa: BLE001 -- handed to the waiting request, which raises it
                result["error"] = exc
            finally:
                self._store_lock.release()
                done.set()

        threading.Thread(target=run, name="timerwheel-web-store", daemon=True).start()
        if not done.wait(max(0.0, deadline_s - time.monotonic())):
            raise TransientStoreError(f"the store did not answer within {STORE_WAIT_S:g} s (the call may still complete)")
        if "error" in result:
            raise result["error"]
        return result["value"]

    def _search(self, query: dict) -> tuple:
        """``(timers, more)``: up to :data:`SEARCH_LIMIT` pending timers matching ``query``, and
        whether more may match (more matched, or the search stopped after reading
        :data:`SCAN_LIMIT` timers). Raises ValueError naming a bad field."""
        partition = query.get("partition") or None
        kind_text = query.get("kind") or ""
        kind = None
        if kind_text:
            try:
                kind = int(TimerKind(int(kind_text)))
            except ValueError:
                raise ValueError(f"kind must be a timer kind number 1..255, got {kind_text!r}") from None
        state = query.get("state") or None
        if state is not None and state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}, got {state!r}")
        needle = query.get("reference") or ""
        found: list = []
        exact = None
        if partition is not None and kind is not None and needle:
            # The timer of that very name first, found by name whatever the scan budget; then the
            # others whose reference holds the text, as the form promises.
            exact = get_timer(self.store, partition, kind, needle.encode("utf-8", "surrogateescape"))
            if exact is not None and (state is None or exact.state == state):
                found.append(exact)
        # Every timer read counts against the budget, whatever it is filtered on: each refresh reads
        # them again, and a search that matches little would otherwise read the whole store. The
        # whole store is read by shard (timers_in_order), never one read per partition.
        names = {(t.partition, t.kind, t.reference, t.schedule) for t in found}
        for read, t in enumerate(timers_in_order(self.store, partition, state=state, page=SEARCH_LIMIT + 1), 1):
            name = (t.partition, t.kind, t.reference, t.schedule)
            if ((kind is None or t.kind == kind) and (state is None or t.state == state)
                    and (not needle or needle in t.reference.decode("utf-8", "replace") or needle.lower() == t.reference.hex())
                    and name not in names):  # a timer moved between two reads comes again: listed once
                names.add(name)
                found.append(t)
            if len(found) > SEARCH_LIMIT or read >= SCAN_LIMIT:
                return found[:SEARCH_LIMIT], True
        return found, False

    # -- acting ----------------------------------------------------------------------------------

    def act(self, form: dict) -> str:
        """Run the action a POSTed ``form`` names; what happened, one line.

        ``form``: ``token``, and ``act`` = ``"ACTION KIND HEX PARTITION_HEX"`` (a timer's kind, its
        reference in hex, its partition's UTF-8 in hex; for ``pause``/``resume`` KIND is 0 and HEX the
        schedule's name in hex).

        Raises:
            Refused: actions are off (403), a wrong or missing token (403), a malformed form (400),
                nothing pending of that name (409).
        """
        if not self.actions:
            raise Refused(403, "actions are off on this page (start it with --web-actions)")
        token = form.get("token", "")
        if not any(t and hmac.compare_digest(token.encode(), t.encode()) for t in (self.form_token, self._token)):
            raise Refused(403, "wrong or missing action token")
        try:
            action, kind_text, ref_hex, partition_hex = form.get("act", "").split(" ", 3)
            kind = int(kind_text)
            reference = bytes.fromhex(ref_hex)
            partition = bytes.fromhex(partition_hex).decode("utf-8", "surrogateescape")
        except ValueError:
            raise Refused(400, f"malformed action {form.get('act', '')!r}") from None
        if action not in ACTIONS:
            raise Refused(400, f"unknown action {action!r}: one of {', '.join(ACTIONS)}")
        shown = reference.decode("utf-8", "replace")
        try:
            if action in _TIMER_ACTIONS:
                done = self._on_store(lambda: self._act_on_timer(action, partition, kind, reference))
            else:
                change = pause_schedule if action == "pause" else resume_schedule
                done = self._on_store(lambda: change(self.store, partition, shown))
        except (TypeError, ValueError) as exc:
            raise Refused(400, str(exc)) from None
        except StoreError as exc:
            raise Refused(503, f"the store failed: {first_line(exc, self._url)}") from None
        what = f"partition {partition!r} kind {kind} reference {shown!r}" if action in _TIMER_ACTIONS else \
            f"schedule {shown!r} of partition {partition!r}"
        if not done:
            raise Refused(409, f"{action}: nothing pending as {what}")
        return f"{action}: {what}"

    def _act_on_timer(self, action: str, partition: str, kind: int, reference: bytes) -> bool:
        if action == "cancel":
            return cancel(self.store, partition, kind, reference)
        timer = get_timer(self.store, partition, kind, reference)
        if timer is None or (action == "requeue" and timer.state == "scheduled"):
            return False  # requeue moves a parked or retrying timer; fire-now moves any
        return requeue(self.store, partition, self.now_ms(), kind, reference)

    # -- HTTP ------------------------------------------------------------------------------------

    def _signed(self, note: str) -> str:
        return hmac.new(self._note_key, note.encode("utf-8", "surrogateescape"), "sha256").hexdigest()[:32]

    def respond(self, method: str, target: str, host_header: Optional[str], body: bytes = b"") -> Response:
        """The response to one request (``target``: its path and query; ``host_header``: its Host
        header): ``(status, headers, body)``. Never raises on bad input: it gets a 4xx page."""
        if self.loopback and not is_loopback(host_only(host_header or "")):
            return _html(421, message_page("Refused", f"this page answers to its loopback address only, "
                                                      f"not to the host {host_header!r}"))
        parts = urlsplit(target)
        if method == "GET" and parts.path == "/":
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            note = query.pop("note", None)
            if note is not None and hmac.compare_digest(query.pop("sig", ""), self._signed(note)):
                query["note"] = note
            return _html(200, render(self.read(query), query, actions=self.actions, loopback=self.loopback,
                                     form_token=self.form_token))
        if method == "POST" and parts.path == "/action":
            form = {k: v[-1] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
            try:
                done = self.act(form)
            except Refused as exc:
                return _html(exc.status, message_page("Refused", str(exc)))
            back = {k: v for k, v in parse_qs(form.get("back", "")).items() if k in ("partition", "kind", "state", "reference")}
            back["note"], back["sig"] = [done], [self._signed(done)]
            return 303, {"Location": "/?" + urlencode(back, doseq=True), **SECURITY_HEADERS}, b""
        return _html(404, message_page("Not found", f"no page at {parts.path!r}: the status page is at /"))


def _html(status_code: int, text: str) -> Response:
    return status_code, {"Content-Type": "text/html; charset=utf-8", **SECURITY_HEADERS}, text.encode("utf-8")


def serve_page(page: StatusPage, port: int, host: str = "127.0.0.1") -> WebServer:
    """Serve ``page`` at ``/`` on ``host:port`` (port 0: any free one) from a daemon thread.

    Raises:
        OSError: the address cannot be bound.
    """
    handler = type("StatusPageHandler", (PageHandler,), {"page": page})
    return WebServer(handler, port, host, "timerwheel-web")

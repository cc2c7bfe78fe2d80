"""A durable service's figures for monitoring: :class:`MetricsSnapshot` (what
:meth:`DurableTimerService.metrics` returns) and the :class:`Recorder` that keeps them.

The figures and their Prometheus names (:mod:`~timerwheel_c.durable.service.exporter` serves them):

=================================  ===================================================================
``timerwheel_fired_total``         outcomes committed (Done or Reschedule), by kind
``timerwheel_failed_total``        fires that failed (raised, Retry, an invalid outcome, a lost guard,
                                   a refused or dropped commit), by kind; the row backs off
``timerwheel_parked_total``        timers parked after their last attempt (the handler's
                                   ``max_attempts``), by kind
``timerwheel_lateness_seconds``    histogram of fire time minus due time (s), first attempts only:
                                   a retry is late by its backoff, by design; a schedule's
                                   occurrence counts from the end of its jitter window
``timerwheel_handler_seconds``     histogram of handler call durations (s), every attempt, whatever
                                   its outcome
``timerwheel_due_backlog``         rows due now (not yet fired) per served partition, counted up to
                                   :data:`BACKLOG_CAP` each, at most once per :data:`BACKLOG_EVERY_S`;
                                   for a runner serving the whole store (or a fleet's share of it), per
                                   shard it reads (label ``shard``): a count per partition would cost a
                                   scan per partition, and a series each
``timerwheel_parked_timers``       timers parked now (waiting for an operator) per served partition,
                                   or per shard as the due backlog, counted up to :data:`BACKLOG_CAP`
                                   each, with the due backlog
``timerwheel_owned_partitions``    partitions this runner serves now (serving the whole store: the
                                   shards it reads, all of them or a fleet's share)
``timerwheel_store_errors_total``  failed store calls, by ``transient`` or ``permanent``
``timerwheel_handlers_in_flight``  handlers running now
=================================  ===================================================================

The figures by kind carry the kind's number and, when its handler names it
(``TimerKind(1, "send-reminder")``, the name the store records), its name: the labels ``kind`` and
``kind_name`` (empty for a kind without a name).

No import of ``prometheus_client`` here: the snapshot is plain data for any monitoring system.
"""
from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Tuple

from ..storage.errors import is_transient
from ..storage.printable import log_traceback, printable
from ..storage.store import Store
from ..timers import keys
from ..timers.runner import RunReport
from ..timers.writer import list_timers
from .activity import Activity

__all__ = ["BACKLOG_CAP", "BACKLOG_EVERY_S", "DURATION_BUCKETS_S", "Histogram", "LATENESS_BUCKETS_S", "MetricsSnapshot",
           "Recorder", "STORE_FAILURE_LOG_EVERY_S", "due_backlog", "parked_count", "shard_backlog"]

# Seconds: from a healthy runner's few ms to the minutes of a stalled one (the upper bounds of
# Prometheus' cumulative buckets; +Inf is implied).
LATENESS_BUCKETS_S: Tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                                         300.0)
# Seconds: from a handler that writes one row (about a ms) to one that calls a slow service.
DURATION_BUCKETS_S: Tuple[float, ...] = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                                         60.0, 300.0)
BACKLOG_CAP = 1_000  # due rows counted per partition at most: a scrape costs the store one page-sized scan each
BACKLOG_EVERY_S = 1.0  # the backlog is counted at most this often (s): scrapes closer together reuse it
#: The least seconds between two WARNINGs (or ERRORs) of one kind of failed store call: a store-wide
#: refusal (a full disk, a read-only server) fails every partition's calls, and a call that gets
#: through between them (a read, a commit that fits the pages left) ends that partition's run of
#: failures, so each retry began a run of its own and logged as its first: about 3 a second on a full
#: disk. The ones left out go to DEBUG, and the next one logged says how many.
STORE_FAILURE_LOG_EVERY_S = 60.0
_LOGGED_KEYS_MAX = 1_024  # the failures remembered for that limit, past which the old ones are forgotten

log = logging.getLogger("timerwheel_c.durable")


def due_backlog(store: Store, partition: str, now_ms: int) -> Tuple[int, Optional[int]]:
    """``(rows of partition due at now_ms, counted up to BACKLOG_CAP; the earliest one's due time)``:
    due times are Unix epoch ms, a retrying row's the time of its next attempt, None when nothing is due.
    Costs one page-sized scan of the due range, since rows are kept in due order.

    Raises:
        StoreError: the store failed.
    """
    start, end = keys.due_range(now_ms)
    n, after, oldest_ms = 0, None, None
    while n < BACKLOG_CAP:
        page = store.scan(partition, start, end, after, BACKLOG_CAP - n)
        for key, _ in page.entries:
            if oldest_ms is None:
                try:
                    oldest_ms = keys.parse(key).due_at_ms
                except keys.MalformedKey:  # quarantined once a runner reaches it; the next row tells
                    pass
        n += len(page.entries)
        if page.next is None:
            break
        after = page.next
    return n, oldest_ms


def shard_backlog(store: Store, shards: list, now_ms: int) -> tuple:
    """``({shard: due rows}, {shard: parked timers})`` of every one of ``shards`` (0 for one that holds
    none: a gauge that vanished once a backlog drained showed no data, where a sum should read 0), at
    ``now_ms`` (Unix epoch ms), each counted up to :data:`BACKLOG_CAP`: two :meth:`Store.scan_shards`
    of up to that many rows per shard, so a scrape costs the same with a million idle partitions as
    with one. By shard, not by partition: a shard's first rows name only some of its partitions,
    and would count those short.

    Raises:
        StoreError: the store failed.
    """
    due = {shard: len(rows) for shard, rows in zip(shards, store.scan_shards(shards, *keys.due_range(now_ms), BACKLOG_CAP))}
    parked = {shard: sum(1 for _, key, _ in rows if keys.is_parked_key(key))
              for shard, rows in zip(shards, store.scan_shards(shards, *keys.PARKED_RANGE, BACKLOG_CAP))}
    return due, parked


def parked_count(store: Store, partition: str) -> int:
    """Timers parked in ``partition`` now, counted up to :data:`BACKLOG_CAP` (one page-sized scan).

    Raises:
        StoreError: the store failed.
    """
    return len(list_timers(store, partition, state="parked", limit=BACKLOG_CAP))


@dataclass(frozen=True)
class Histogram:
    """A cumulative histogram of seconds (lateness, handler durations), as Prometheus keeps one.

    ``buckets``: ``(upper bound s, count of observations <= it)`` pairs, ending with
    ``(inf, count)``. ``sum_s``: the sum of all observations (s). ``count``: how many.
    """

    buckets: Tuple[Tuple[float, int], ...]
    sum_s: float
    count: int


@dataclass(frozen=True)
class MetricsSnapshot:
    """The figures of one service at one moment (see the module docstring for their meaning).

    ``fired`` / ``failed`` / ``parked``: counts by kind number (1..255). ``kind_names``: the name of
    each kind whose handler names it, by kind number. ``store_errors``:
    ``{"transient": n, "permanent": n}``. ``due_backlog`` / ``parked_timers``: due rows and timers
    parked now, by served partition (each counted up to :data:`BACKLOG_CAP`, so 1000 reads "at least
    1000"; empty when the store could not be read); ``due_backlog_by_shard`` /
    ``parked_timers_by_shard``: the same by shard number, for a service that reads the store by shard
    (serving all of it, or a fleet's share), whose two by partition are then empty. ``lateness`` / ``handler_duration``: histograms (s).
    ``owned_partitions``, ``handlers_in_flight``: gauges; ``handlers_overdue``: of those, the calls
    past their handler's ``timeout_s`` (failed: a sync call's thread left to finish, an ``async`` call that
    ignored its cancel left to run, each holding its slot until it returns). ``running``: the service thread is
    alive. ``last_progress_age_s``: seconds since a pass's claim round trip last
    succeeded (None before the first; an idle service passes at least every ``max_sleep_s``).
    """

    fired: Mapping[int, int]
    failed: Mapping[int, int]
    parked: Mapping[int, int]
    lateness: Histogram
    handler_duration: Histogram
    due_backlog: Mapping[str, int]
    parked_timers: Mapping[str, int]
    owned_partitions: int
    store_errors: Mapping[str, int]
    handlers_in_flight: int
    running: bool
    last_progress_age_s: "float | None"
    kind_names: Mapping[int, str] = field(default_factory=dict)
    due_backlog_by_shard: Mapping[int, int] = field(default_factory=dict)
    parked_timers_by_shard: Mapping[int, int] = field(default_factory=dict)
    handlers_overdue: int = 0


class _Buckets:
    """The counts behind one :class:`Histogram` (the caller holds the lock)."""

    def __init__(self, bounds_s: Tuple[float, ...]):
        self.bounds_s = bounds_s
        self.counts = [0] * (len(bounds_s) + 1)
        self.sum_s = 0.0

    def observe(self, seconds: float) -> None:
        self.observe_all([seconds])

    def observe_all(self, seconds: list) -> None:
        counts, bounds, bucket = self.counts, self.bounds_s, bisect.bisect_left
        total = 0.0
        for s in seconds:
            if s < 0.0:
                s = 0.0
            counts[bucket(bounds, s)] += 1
            total += s
        self.sum_s += total

    def snapshot(self) -> Histogram:
        cumulative, total = [], 0
        for bound, n in zip(self.bounds_s + (float("inf"),), self.counts):
            total += n
            cumulative.append((bound, total))
        return Histogram(tuple(cumulative), self.sum_s, total)


class Recorder:
    """The one place a service's stages count their work, read by :meth:`DurableTimerService.metrics`
    (thread-safe: the loop, the store thread and the commit thread count).

    Args:
        activity: the service's log of its work (:class:`~.activity.Activity`), told every count.
        monotonic: the clock (s) that spaces the logs of failed store calls
            (:data:`STORE_FAILURE_LOG_EVERY_S`): real time, as the log's reader reads it.

    Totals: ``fired`` (outcomes committed), ``failed`` (fires that failed, see the module docstring),
    ``errors`` (failed store calls) split into ``transient_errors`` and ``other_errors``.
    """

    def __init__(self, activity: Optional[Activity] = None, monotonic: Callable[[], float] = time.monotonic):
        self.activity = Activity(60.0) if activity is None else activity
        self._monotonic = monotonic
        self._lock = threading.Lock()
        # (kind of call, error type, code) of a transient error, (call, error type, message's first line)
        # of any other -> (monotonic s it was last logged at, left out since)
        self._logged: "OrderedDict[tuple, Tuple[float, int]]" = OrderedDict()
        self._fired: Counter = Counter()
        self._failed: Counter = Counter()
        self._parked: Counter = Counter()
        self._lateness = _Buckets(LATENESS_BUCKETS_S)
        self._duration = _Buckets(DURATION_BUCKETS_S)
        self.fired_total = self.failed_total = 0
        self.transient_errors = self.other_errors = 0

    def count(self, report: RunReport) -> None:
        """Add a claim's, a settle's or a commit's :class:`RunReport` (totals and counts by kind)."""
        with self._lock:
            self.fired_total += report.fired
            self.failed_total += report.failed
            self._fired.update(report.fired_kinds)
            self._failed.update(report.failed_kinds)
            self._parked.update(report.parked_kinds)
        self.activity.count(report)

    def store_failed(self, exc: BaseException, failures: int, what: str, delay_s: float,
                     kind: Optional[str] = None) -> float:
        """Count and log the failed store call ``what`` (``failures`` in a row, retried in ``delay_s``
        seconds); returns ``delay_s``. Transient errors log at WARNING for the first of a run (DEBUG
        after: a failover fails every retry until it ends), any other at ERROR with its traceback. A
        transient error of one ``kind`` of call (default: ``what``; "commit" for every partition's
        commits), type and code, or any other of one ``what`` and message, is logged at most once
        per :data:`STORE_FAILURE_LOG_EVERY_S`, the rest at DEBUG: a passing refusal is the same
        whatever partition meets it, where each distinct unexpected error must reach ERROR."""
        transient = is_transient(exc)
        first = (str(exc).strip().splitlines() or [""])[0]
        key = (kind or what, type(exc), getattr(exc, "code", None)) if transient else (what, type(exc), first)
        left_out: Optional[int] = None  # None: logged at DEBUG
        with self._lock:
            if transient:
                self.transient_errors += 1
            else:
                self.other_errors += 1
            if failures == 1 or not transient:
                now_s = self._monotonic()
                last_s, skipped = self._logged.pop(key, (None, 0))
                if last_s is None or now_s - last_s >= STORE_FAILURE_LOG_EVERY_S:
                    last_s, left_out = now_s, skipped
                    skipped = 0
                else:
                    skipped += 1
                # Last the one met last; messages that differ every time (a row's key in them) must
                # not grow it for ever: the one met longest ago is forgotten (it logs again, if met).
                self._logged[key] = (last_s, skipped)
                if len(self._logged) > _LOGGED_KEYS_MAX:
                    self._logged.popitem(last=False)
        more = f" ({left_out} more like it since the last one logged, at DEBUG)" if left_out else ""
        if transient:
            log.log(logging.WARNING if left_out is not None else logging.DEBUG,
                    "durable timer %s failed (%d in a row) on a transient store error, %s: %s; retrying in %.2f s%s",
                    what, failures, type(exc).__name__, printable(first), delay_s, more)
        else:
            log_traceback(log, logging.ERROR if left_out is not None else logging.DEBUG, exc,
                          "durable timer %s failed (%d in a row) on an unexpected store error; retrying in %.2f s%s",
                          what, failures, delay_s, more)
        return delay_s

    def fire_ended(self, lateness_s: Optional[float], took_s: float) -> None:
        """Observe one handler call: its duration ``took_s`` (s) and, for a first attempt, its
        lateness ``lateness_s`` (s; negative counts as 0: never early by design; None for a retry)."""
        self.fires_ended([] if lateness_s is None else [lateness_s], [took_s])

    def fires_ended(self, lateness_s: list, took_s: list) -> None:
        """Observe handler calls: the durations ``took_s`` (s) of all, the lateness ``lateness_s`` (s,
        negative counting as 0) of the first attempts among them. One call and one lock per run of
        calls (a worker's chunk)."""
        with self._lock:
            self._lateness.observe_all(lateness_s)
            self._duration.observe_all(took_s)

    def counts(self) -> tuple:
        """``(fired, failed, parked, lateness Histogram, handler duration Histogram)`` copied under the lock."""
        with self._lock:
            return (dict(self._fired), dict(self._failed), dict(self._parked), self._lateness.snapshot(),
                    self._duration.snapshot())

    def store_errors(self) -> dict:
        """``{"transient": n, "permanent": n}``: failed store calls so far."""
        with self._lock:
            return {"transient": self.transient_errors, "permanent": self.other_errors}

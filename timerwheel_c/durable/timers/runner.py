"""``run_due``: one tick of the durable-timer runner, and the phases it is made of.

A tick scans a partition's due rows (effective due <= ``now_ms``, Unix epoch ms) in
pages (up to 512 rows, within the budget), in due order, and fires each through its kind's handler, within a
:class:`TickBudget`. The tick is four phases, which a caller may also drive itself
(for example to fire handlers concurrently):

1. :func:`claim_due`: claim the due rows, many per :meth:`Store.apply_many` round trip;
2. the handler's ``fire`` for each claimed row, then the pure :func:`settle`, which
   turns its outcome (or exception) into the guarded batch to commit;
3. :func:`commit_outcomes`: commit many outcomes in one ``apply_many`` round trip;
4. :func:`next_wake`: when to run the partition again.

:func:`run_due` is their sequential composition.

Claim before fire
-----------------
Before calling ``fire`` the runner *claims* the row: one guarded write moves it from
its key K to its next backoff key K' (attempt + 1, due ``now_ms + backoff``, value and
original due time unchanged), ``require(Equals(K, value))``, committed (with the
claims of the other rows of its chunk, each guarded on its own row) before any of
them fires. Only then does it call ``fire``. So a handler that kills the process still has its attempt counted, and the
row comes back after a growing backoff instead of in a hot loop.

The handler's outcome then commits (with others, each on its own guard) guarded on the *claimed* row,
``require(Equals(K', value))`` plus the delete of K' (and, for a Reschedule, the put of
the new key). Effects inside the batch are therefore applied at most once per timer
row: each commit consumes the exact row it is guarded on, and a row can be consumed
once. If ``fire`` overruns its backoff and a second runner re-claims K' (moving it to
K''), the first runner's commit fails on its guard (counted as ``raced``) and only the
second may commit. If the process dies between claim and commit, the row waits at K'
and is fired again after the backoff: effects *outside* the batch must be idempotent.

Failures
--------
An exception, a :class:`Retry`, an invalid outcome or a failed commit of the handler's
batch leave the row at its claimed backoff key; the delay of attempt ``a`` is
``min(5 s * 2**(a-1), 600 s)``. Unknown kinds are moved to their next backoff key the
same way (guarded, never fired) and logged once per kind per registry through the
``timerwheel_c.durable`` logger (logging, not :mod:`warnings`: this runs in a service
thread whose output goes to logs).

Malformed rows
--------------
A due row whose key does not parse is counted (``malformed``) and moved once, guarded
(``require(Equals(K, value))``, ``require(Absent(Q))``), to its quarantine key
``Q = keys.quarantine(K)`` outside the timer space, value unchanged: retained, never
lost, but no later tick scans it again. Left in the due range, malformed rows would
use up ``max_scanned`` on every tick and starve the real timers behind them. The move
counts as progress. If the guard fails (another runner moved it, or a quarantined row
with that key already exists) the row is left where it is.
"""
from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import Optional

from . import keys
from .registry import Done, DueTimer, Reschedule, Retry, TimerContext, TimerHandler, TimerRegistry
from ..storage.store import Absent, Batch, Committed, Equals, Store, check_partition

__all__ = [
    "BACKOFF_BASE_MS", "BACKOFF_CAP_MS", "NO_PROGRESS_WAKE_MS", "PAGE", "ClaimedTimer", "Claims", "RunReport",
    "TickBudget", "backoff_ms", "claim_due", "commit_outcomes", "fire", "next_wake", "run_due", "settle",
]

log = logging.getLogger("timerwheel_c.durable")

PAGE = 64  # rows claimed per round trip, at most
SCAN_PAGE = 512  # rows read per scan of the due range, at most
# Per registry: the mean fire time (s) its handlers took in the last run_due, which sizes the
# first chunk of the next one (a registry never seen starts with one row).
_FIRE_TIME_S: "weakref.WeakKeyDictionary[TimerRegistry, float]" = weakref.WeakKeyDictionary()
BACKOFF_BASE_MS = 5_000
BACKOFF_CAP_MS = 600_000
NO_PROGRESS_WAKE_MS = 5_000


def backoff_ms(attempt: int) -> int:
    """Delay before attempt ``attempt`` (>= 1) is due, in ms: ``min(5 s * 2**(attempt-1), 600 s)``."""
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    return BACKOFF_CAP_MS if attempt > 8 else min(BACKOFF_BASE_MS << (attempt - 1), BACKOFF_CAP_MS)


def _clamped(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"TickBudget.{name} must be an int, got {type(value).__name__} {value!r}")
    return max(1, value)


@dataclass(frozen=True)
class TickBudget:
    """Limits of one :func:`run_due` tick; each is clamped to at least 1.

    ``max_fired``: handler calls per tick. ``max_per_kind``: handler calls per kind per
    tick (lowered by a handler's ``max_per_tick``); rows over it are deferred.
    ``max_scanned``: rows looked at. ``max_elapsed_ms``: monotonic ms since the tick began,
    checked before each row is claimed (rows already claimed are always fired).

    The defaults let one pass of a partition fire a backlog of 1,024 timers in a handful of
    commits (claims and outcomes are batched per chunk), while no kind takes more than a
    quarter of a pass: on PostgreSQL with synchronous commit, commits, not handler calls,
    bound the fired/s of a runner.
    """

    max_fired: int = 1024
    max_per_kind: int = 256
    max_scanned: int = 4096
    max_elapsed_ms: int = 10_000

    def __post_init__(self):
        for name in ("max_fired", "max_per_kind", "max_scanned", "max_elapsed_ms"):
            object.__setattr__(self, name, _clamped(name, getattr(self, name)))


@dataclass
class RunReport:
    """What one tick did.

    ``fired``: outcomes committed (Done or Reschedule). ``raced``: rows another runner
    took first (a claim or commit lost its guard on the row). ``failed``: fires that
    raised, returned Retry or an invalid outcome, or whose batch failed to commit; the
    row stays backed off. ``unknown``: rows of unregistered kinds, backed off.
    ``deferred``: rows over their kind's cap. ``malformed``: rows whose key does not
    parse, moved to their quarantine key (see the module docstring). ``scanned``: rows
    looked at. ``moved``: rows this tick moved off the due range (claims and quarantines
    committed: the progress that decides ``next_wake_ms``). ``stopped_on_budget``: a
    budget limit ended the tick with due rows left. ``earliest_put_ms``: the earliest due
    time (Unix epoch ms) of a timer row that a committed outcome wrote, or None.
    ``next_wake_ms``: when to run again (Unix epoch ms, never before ``now_ms``), or None
    when no timer is left; set by :func:`next_wake`.
    """

    fired: int = 0
    raced: int = 0
    failed: int = 0
    unknown: int = 0
    deferred: int = 0
    malformed: int = 0
    scanned: int = 0
    moved: int = 0
    stopped_on_budget: bool = False
    earliest_put_ms: Optional[int] = None
    next_wake_ms: Optional[int] = None


@dataclass(frozen=True)
class ClaimedTimer:
    """A row :func:`claim_due` claimed: fire ``timer`` with ``handler``, then :func:`settle`.

    ``timer.key`` is the claimed (backed-off) key and ``timer.value`` the row's value:
    the outcome's commit is guarded on exactly that row.
    """

    handler: TimerHandler
    timer: DueTimer


@dataclass
class Claims:
    """What :func:`claim_due` returns: the ``timers`` it claimed, in due order, and the
    ``report`` counting this tick so far (scanned, raced, unknown, deferred, malformed,
    moved, stopped_on_budget); pass the same report on to :func:`settle`,
    :func:`commit_outcomes` and :func:`next_wake`."""

    timers: list = field(default_factory=list)
    report: RunReport = field(default_factory=RunReport)


class _Claimer:
    """Walks a partition's due range page by page, choosing the rows a tick may fire
    (per the budget) and claiming them in one ``apply_many`` per call."""

    def __init__(self, store: Store, partition: str, registry: TimerRegistry, now_ms: int, budget: TickBudget):
        self.store = store
        self.partition = partition
        self.registry = registry
        self.now_ms = now_ms
        self.budget = budget
        self.report = RunReport()
        self.calls = 0
        self.per_kind: dict[int, int] = {}
        self.capped: set[int] = set()  # kinds whose cap this tick has reached
        self.started = time.monotonic()
        self.start, self.end = keys.due_range(now_ms)
        self.pending: list = []  # rows of the current page not looked at yet
        self.after: Optional[bytes] = None
        self.exhausted = False

    def over_budget(self) -> bool:
        b = self.budget
        elapsed_ms = (time.monotonic() - self.started) * 1000
        return self.report.scanned >= b.max_scanned or self.calls >= b.max_fired or elapsed_ms >= b.max_elapsed_ms

    @property
    def done(self) -> bool:
        return self.report.stopped_on_budget or (self.exhausted and not self.pending)

    def claim(self, max_rows: int) -> list:
        """Claim up to ``max_rows`` rows to fire (fewer at the end of a page, of the range, or
        of the budget) in one round trip; returns the :class:`ClaimedTimer` list."""
        batches, rows = self.select(max_rows)
        return self.claimed(rows, self.store.apply_many(self.partition, batches))

    def select(self, max_rows: int) -> tuple:
        """Choose up to ``max_rows`` rows to fire, scanning a page if none is pending: returns the
        claim batches (unknown kinds and malformed rows met on the way move too) and what
        :meth:`claimed` needs to read their results."""
        report = self.report
        while not self.pending and not self.exhausted:
            # Rows a capped kind defers cost a scan but no claim: read what is left of max_scanned
            # in one page (up to SCAN_PAGE), not in pages of 64.
            limit = max(1, min(SCAN_PAGE, self.budget.max_scanned - report.scanned))
            page = self.store.scan(self.partition, self.start, self.end, self.after, limit)
            self.pending = list(reversed(page.entries))
            self.exhausted = page.next is None
            self.after = page.next
        batches: list = []
        # (kind of row, key, value, parsed key or error, handler)
        rows: list = []
        fires = 0
        while self.pending and fires < max_rows:
            if self.over_budget():
                report.stopped_on_budget = True
                break
            key, value = self.pending.pop()
            report.scanned += 1
            if key[9:10] and key[9] in self.capped and keys.well_formed_head(key):
                # A row of a kind already at its cap: defer without a full parse. A single-kind
                # backlog otherwise costs a parse per deferred row, up to max_scanned per tick.
                report.deferred += 1
                continue
            try:
                tk = keys.parse(key)
            except keys.MalformedKey as exc:
                report.malformed += 1
                q = keys.quarantine(key)
                batches.append(Batch().require(Equals(key, value)).require(Absent(q)).delete(key).put(q, value))
                rows.append(("malformed", key, value, exc, None))
                continue
            handler = self.registry.get(tk.kind)
            if handler is not None:
                cap = self.budget.max_per_kind
                if handler.max_per_tick is not None:
                    cap = min(cap, handler.max_per_tick)
                count = self.per_kind.get(tk.kind, 0) + 1
                self.per_kind[tk.kind] = count
                if count >= cap:
                    self.capped.add(tk.kind)
                self.calls += 1
                fires += 1
            claimed = _claimed_key(self.now_ms, tk)
            batches.append(Batch().require(Equals(key, value)).delete(key).put(claimed, value))
            rows.append(("fire" if handler is not None else "unknown", claimed, value, tk, handler))
        return batches, rows

    def claimed(self, rows: list, results: list) -> list:
        """Count the results of :meth:`select`'s batches; return the rows claimed for firing."""
        report = self.report
        claims = []
        for (what, key, value, info, handler), result in zip(rows, results):
            committed = isinstance(result, Committed)
            if what == "malformed":
                if committed:
                    report.moved += 1
                    log.debug("partition %r: quarantined %s as %r", self.partition, info, keys.quarantine(info.key))
                else:
                    log.warning("partition %r: kept %s in place (its quarantine guard failed)", self.partition, info)
                continue
            if not committed:
                report.raced += 1
                continue
            report.moved += 1
            if what == "unknown":
                report.unknown += 1
                if self.registry.first_unknown(info.kind):
                    log.warning("partition %r: no handler for timer kind %d; backing its rows off", self.partition, info.kind)
                continue
            timer = DueTimer(info.original_due_at_ms, keys.TimerKind(info.kind), info.reference, value, info.attempt + 1, key)
            claims.append(ClaimedTimer(handler, timer))
        return claims


def _claimed_key(now_ms: int, tk: keys.TimerKey) -> bytes:
    """The row's next backoff key: attempt + 1, due ``now_ms + backoff``, original due time kept."""
    attempt = min(tk.attempt + 1, keys.MAX_ATTEMPT)
    retry_at = min(now_ms + backoff_ms(attempt), keys.MAX_DUE_MS)
    return keys.backoff(retry_at, tk.kind, attempt, tk.original_due_at_ms, tk.reference)


def _check_args(partition, registry, now_ms, budget) -> int:
    check_partition(partition)
    if not isinstance(registry, TimerRegistry):
        raise TypeError(f"registry must be a TimerRegistry, got {type(registry).__name__} {registry!r}")
    if not isinstance(budget, TickBudget):
        raise TypeError(f"budget must be a TickBudget, got {type(budget).__name__} {budget!r}")
    return keys.check_uint("now_ms", now_ms, keys.MAX_DUE_MS)


def claim_due(store: Store, partition: str, registry: TimerRegistry, now_ms: int, budget: TickBudget = TickBudget()) -> Claims:
    """Phase 1 of a tick: claim every due row of ``partition`` that ``budget`` lets fire.

    Scans the due range (effective due <= ``now_ms``, Unix epoch ms) in pages of up to
    :data:`SCAN_PAGE` rows and claims up to :data:`PAGE` rows per :meth:`Store.apply_many` round trip:
    each claim moves its row to the next backoff key (the attempt counted before any
    fire), guarded on the row. Rows of unknown kinds back off and malformed rows move to
    quarantine in the same round trips. ``max_elapsed_ms`` is checked before each row.
    The caller fires each :class:`ClaimedTimer` (its handler's ``fire``, in any order,
    concurrently if it likes), turns each outcome into a batch with :func:`settle`,
    commits them with :func:`commit_outcomes` and ends with :func:`next_wake`.

    Raises:
        TypeError / ValueError: bad arguments.
        Exception: whatever the store raises; claims already committed stay (their rows
        come back after the backoff).
    """
    now_ms = _check_args(partition, registry, now_ms, budget)
    claimer = _Claimer(store, partition, registry, now_ms, budget)
    timers: list = []
    while not claimer.done:
        timers.extend(claimer.claim(PAGE))
    return Claims(timers, claimer.report)


def fire(store: Store, partition: str, now_ms: int, claimed: ClaimedTimer, report: RunReport) -> Optional[Batch]:
    """Call ``claimed``'s handler and :func:`settle` its outcome (or exception); returns the batch
    to commit, or None for a counted failure."""
    ctx = TimerContext(store, partition, now_ms)
    try:
        outcome = claimed.handler.fire(ctx, claimed.timer)
    except Exception as exc:
        return settle(partition, claimed, report, error=exc)
    return settle(partition, claimed, report, outcome)


def settle(partition: str, claimed: ClaimedTimer, report: RunReport, outcome: object = None,
           error: Optional[BaseException] = None) -> Optional[Batch]:
    """Phase 2, pure: turn a handler's ``outcome`` (or the exception ``error`` it raised) into the
    batch that commits it, guarded on the claimed row; or count a failure in ``report`` and
    return None (the row stays at its backoff key).

    Done / Reschedule: the outcome's batch, plus ``require(Equals(claimed key, value))`` and
    the delete of the claimed row, plus for a Reschedule ``require(Absent(new key))`` and its
    put. Failures (logged as by :func:`run_due`): an exception, Retry, anything else
    returned, a non-Batch outcome batch, a bad Reschedule or one to the row's own due time.
    """
    timer = claimed.timer
    if error is not None:
        report.failed += 1
        log.error("partition %r: handler for kind %d raised on %r", partition, timer.kind.get(), timer.key,
                  exc_info=(type(error), error, error.__traceback__))
        return None
    if isinstance(outcome, Retry):
        report.failed += 1
        return None
    if not isinstance(outcome, (Done, Reschedule)):
        report.failed += 1
        log.error("partition %r: handler for kind %d returned %r, not Done/Reschedule/Retry", partition, timer.kind.get(), outcome)
        return None
    batch = Batch()
    if outcome.batch is not None:
        if not isinstance(outcome.batch, Batch):
            report.failed += 1
            log.error("partition %r: outcome batch is %r, not a Batch", partition, outcome.batch)
            return None
        batch.extend(outcome.batch)
    batch.require(Equals(timer.key, timer.value)).delete(timer.key)
    if isinstance(outcome, Reschedule):
        try:
            new_key = keys.timer(outcome.due_at_ms, timer.kind, timer.reference)
        except (TypeError, ValueError) as exc:
            report.failed += 1
            log.error("partition %r: bad Reschedule %r: %s", partition, outcome, exc)
            return None
        if new_key == keys.timer(timer.due_at_ms, timer.kind, timer.reference):
            report.failed += 1
            log.error("partition %r: Reschedule to the row's own due time %d does not move it", partition, timer.due_at_ms)
            return None
        # Absent: a reschedule must never overwrite (lose) another timer's row.
        batch.require(Absent(new_key)).put(new_key, outcome.value)
    return batch


def commit_outcomes(store: Store, partition: str, settled: list, report: RunReport) -> None:
    """Phase 3: commit many outcomes in one :meth:`Store.apply_many` round trip.

    ``settled``: ``(ClaimedTimer, Batch)`` pairs from :func:`settle` (pairs whose batch is
    None are skipped). Each batch is guarded on its own claimed row, so one failed guard
    fails only its outcome. Counts into ``report``: ``fired`` per commit (and
    ``earliest_put_ms``), ``raced`` when the claimed row was taken by another runner,
    ``failed`` when the handler's own guard failed (logged at INFO; the row stays backed off).

    Raises:
        Exception: whatever the store raises; the uncommitted rows stay at their backoff keys.
    """
    pairs = [(c, b) for c, b in settled if b is not None]
    if pairs:
        _count_outcomes(partition, pairs, store.apply_many(partition, [b for _, b in pairs]), report)


def _count_outcomes(partition: str, pairs: list, results: list, report: RunReport) -> None:
    for (claimed, batch), result in zip(pairs, results):
        key = claimed.timer.key
        if isinstance(result, Committed):
            report.fired += 1
            for k, v in batch.writes:
                if v is not None and k[:1] == keys.TAG:
                    try:
                        due_ms = keys.parse(k).due_at_ms
                    except keys.MalformedKey:
                        continue
                    if report.earliest_put_ms is None or due_ms < report.earliest_put_ms:
                        report.earliest_put_ms = due_ms
        elif result.key == key:
            report.raced += 1
        else:
            report.failed += 1
            log.info("partition %r: batch of %r failed its guard on %r; row stays backed off", partition, key, result.key)


def next_wake(store: Store, partition: str, now_ms: int, report: RunReport) -> Optional[int]:
    """Phase 4: set and return ``report.next_wake_ms`` (Unix epoch ms, or None).

    ``now_ms`` when due rows were left (deferred or stopped on budget) and this tick made
    progress (moved some row off the due range); ``now_ms + 5 s`` when rows were left but
    nothing moved; otherwise the earliest of the next future due time (one scan) and
    ``report.earliest_put_ms``, never earlier than ``now_ms``; None when the partition
    holds no well-formed timer.
    """
    if report.stopped_on_budget or report.deferred:
        report.next_wake_ms = now_ms if report.moved else now_ms + NO_PROGRESS_WAKE_MS
        return report.next_wake_ms
    candidates = [t for t in (_next_future_due(store, partition, now_ms), report.earliest_put_ms) if t is not None]
    report.next_wake_ms = max(min(candidates), now_ms) if candidates else None
    return report.next_wake_ms


def _next_future_due(store: Store, partition: str, now_ms: int) -> Optional[int]:
    start, end = keys.future_range(now_ms)
    after = None
    while True:
        page = store.scan(partition, start, end, after, PAGE)
        for key, _ in page.entries:
            try:
                return keys.parse(key).due_at_ms
            except keys.MalformedKey:
                continue
        if page.next is None:
            return None
        after = page.next


def run_due(store: Store, partition: str, registry: TimerRegistry, now_ms: int, budget: TickBudget = TickBudget()) -> RunReport:
    """Fire the due timers of one partition, within ``budget``; return a :class:`RunReport`.

    The sequential composition of the phases: claim a chunk of rows, fire each with
    :func:`fire`, then commit the chunk's outcomes in the same ``apply_many`` round trip
    (one transaction) as the next chunk's claims, each batch guarded on its own row;
    repeat, then :func:`next_wake`. A chunk holds as many rows as the measured mean fire time
    (of this tick, else of the registry's previous tick; one row for a registry never
    seen) lets finish within what is left of ``max_elapsed_ms``, at most a page: a slow
    handler cannot stretch a tick far past its budget, and fast handlers get full pages.

    Args:
        store: the backend.
        partition: the partition to serve.
        registry: handlers by kind.
        now_ms: the tick's time, Unix epoch ms; rows with effective due <= now_ms are due,
            and backoff delays count from it.
        budget: limits of this tick.

    Raises:
        TypeError / ValueError: bad arguments.
        Exception: whatever the store raises (e.g. ``sqlite3.OperationalError``); rows
        already processed stay processed, the rest wait for the next tick.
    """
    now_ms = _check_args(partition, registry, now_ms, budget)
    claimer = _Claimer(store, partition, registry, now_ms, budget)
    report = claimer.report
    per_fire_s = _FIRE_TIME_S.get(registry)
    fired_s, fires = 0.0, 0
    pairs: list = []  # the previous chunk's outcomes, committed with the next chunk's claims
    while not claimer.done:
        left_s = budget.max_elapsed_ms / 1000 - (time.monotonic() - claimer.started)
        chunk = 1 if per_fire_s is None else PAGE if per_fire_s <= 0 else max(1, min(PAGE, int(left_s / per_fire_s)))
        claims, rows = claimer.select(chunk)
        results = store.apply_many(partition, [b for _, b in pairs] + claims)
        _count_outcomes(partition, pairs, results[:len(pairs)], report)
        claimed = claimer.claimed(rows, results[len(pairs):])
        t0 = time.monotonic()
        settled = [(c, fire(store, partition, now_ms, c, report)) for c in claimed]
        fired_s += time.monotonic() - t0
        fires += len(claimed)
        pairs = [(c, b) for c, b in settled if b is not None]
        if fires:
            per_fire_s = fired_s / fires
    if pairs:
        _count_outcomes(partition, pairs, store.apply_many(partition, [b for _, b in pairs]), report)
    if fires:
        _FIRE_TIME_S[registry] = fired_s / fires
    next_wake(store, partition, now_ms, report)
    return report

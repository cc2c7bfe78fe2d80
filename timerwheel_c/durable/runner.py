"""``run_due``: one tick of the durable-timer runner.

A tick scans a partition's due rows (effective due <= ``now_ms``, Unix epoch ms) in
pages of 64, in due order, and fires each through its kind's handler, within a
:class:`TickBudget`.

Claim before fire
-----------------
Before calling ``fire`` the runner *claims* the row: one guarded commit moves it from
its key K to its next backoff key K' (attempt + 1, due ``now_ms + backoff``, value and
original due time unchanged), ``require(Equals(K, value))``. Only then does it call
``fire``. So a handler that kills the process still has its attempt counted, and the
row comes back after a growing backoff instead of in a hot loop.

The handler's outcome then commits guarded on the *claimed* row,
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
from dataclasses import dataclass
from typing import Optional

from . import keys
from .registry import Done, DueTimer, Reschedule, Retry, TimerContext, TimerKind, TimerRegistry
from .store import Absent, Batch, Committed, Equals, PreconditionFailed, Store, check_partition

__all__ = ["BACKOFF_BASE_MS", "BACKOFF_CAP_MS", "NO_PROGRESS_WAKE_MS", "PAGE", "RunReport", "TickBudget", "backoff_ms", "run_due"]

log = logging.getLogger("timerwheel_c.durable")

PAGE = 64
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
    ``max_scanned``: rows looked at. ``max_elapsed_ms``: monotonic ms since the tick began.
    """

    max_fired: int = 128
    max_per_kind: int = 32
    max_scanned: int = 512
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
    looked at. ``stopped_on_budget``: a budget limit ended the tick with due rows left.
    ``next_wake_ms``: when to run again (Unix epoch ms, never before ``now_ms``), or None
    when no timer is left.
    """

    fired: int = 0
    raced: int = 0
    failed: int = 0
    unknown: int = 0
    deferred: int = 0
    malformed: int = 0
    scanned: int = 0
    stopped_on_budget: bool = False
    next_wake_ms: Optional[int] = None


class _Tick:
    """State of one run_due call."""

    def __init__(self, store, partition, registry, now_ms, budget):
        self.store = store
        self.partition = partition
        self.registry = registry
        self.now_ms = now_ms
        self.budget = budget
        self.report = RunReport()
        self.calls = 0
        self.per_kind: dict[int, int] = {}
        self.capped: set[int] = set()  # kinds whose cap this tick has reached
        self.moved = 0  # rows this tick moved out of the due range (progress)
        self.earliest_put: Optional[int] = None
        self.started = time.monotonic()

    def over_budget(self) -> bool:
        b = self.budget
        elapsed_ms = (time.monotonic() - self.started) * 1000
        return self.report.scanned >= b.max_scanned or self.calls >= b.max_fired or elapsed_ms >= b.max_elapsed_ms

    def note_put(self, due_at_ms: int) -> None:
        if self.earliest_put is None or due_at_ms < self.earliest_put:
            self.earliest_put = due_at_ms

    def claim(self, key: bytes, value: bytes, tk: keys.TimerKey) -> Optional[bytes]:
        """Move the row to its next backoff key; return that key, or None if another runner won."""
        attempt = min(tk.attempt + 1, keys.MAX_ATTEMPT)
        retry_at = min(self.now_ms + backoff_ms(attempt), keys.MAX_DUE_MS)
        claimed = keys.backoff(retry_at, tk.kind, attempt, tk.original_due_at_ms, tk.reference)
        result = self.store.apply(self.partition, Batch().require(Equals(key, value)).delete(key).put(claimed, value))
        if isinstance(result, PreconditionFailed):
            self.report.raced += 1
            return None
        self.moved += 1
        return claimed

    def quarantine(self, key: bytes, value: bytes, why: keys.MalformedKey) -> None:
        """Move a malformed row out of the timer space, guarded, keeping its value."""
        q = keys.quarantine(key)
        batch = Batch().require(Equals(key, value)).require(Absent(q)).delete(key).put(q, value)
        if isinstance(self.store.apply(self.partition, batch), Committed):
            self.moved += 1
            log.debug("partition %r: quarantined %s as %r", self.partition, why, q)
        else:
            log.warning("partition %r: kept %s in place (its quarantine guard failed)", self.partition, why)

    def row(self, key: bytes, value: bytes) -> None:
        report = self.report
        report.scanned += 1
        if key[9:10] and key[9] in self.capped and keys.well_formed_head(key):
            # A row of a kind already at its cap: defer without a full parse. A single-kind
            # backlog otherwise costs a parse per deferred row, up to max_scanned per tick.
            report.deferred += 1
            return
        try:
            tk = keys.parse(key)
        except keys.MalformedKey as exc:
            report.malformed += 1
            self.quarantine(key, value, exc)
            return
        handler = self.registry.get(tk.kind)
        if handler is None:
            if self.claim(key, value, tk) is not None:
                report.unknown += 1
                if self.registry.first_unknown(tk.kind):
                    log.warning("partition %r: no handler for timer kind %d; backing its rows off", self.partition, tk.kind)
            return
        cap = self.budget.max_per_kind
        if handler.max_per_tick is not None:
            cap = min(cap, handler.max_per_tick)
        count = self.per_kind.get(tk.kind, 0) + 1
        self.per_kind[tk.kind] = count
        if count >= cap:
            self.capped.add(tk.kind)
        self.calls += 1
        claimed = self.claim(key, value, tk)
        if claimed is None:
            return
        timer = DueTimer(tk.original_due_at_ms, TimerKind(tk.kind), tk.reference, value, tk.attempt + 1, claimed)
        self.fire(handler, claimed, value, timer)

    def fire(self, handler, claimed: bytes, value: bytes, timer: DueTimer) -> None:
        report = self.report
        try:
            outcome = handler.fire(TimerContext(self.store, self.partition, self.now_ms), timer)
        except Exception:
            report.failed += 1
            log.exception("partition %r: handler for kind %d raised on %r", self.partition, timer.kind.get(), claimed)
            return
        if isinstance(outcome, Retry):
            report.failed += 1
            return
        if not isinstance(outcome, (Done, Reschedule)):
            report.failed += 1
            log.error("partition %r: handler for kind %d returned %r, not Done/Reschedule/Retry", self.partition, timer.kind.get(), outcome)
            return
        batch = Batch()
        if outcome.batch is not None:
            if not isinstance(outcome.batch, Batch):
                report.failed += 1
                log.error("partition %r: outcome batch is %r, not a Batch", self.partition, outcome.batch)
                return
            batch.extend(outcome.batch)
        batch.require(Equals(claimed, value)).delete(claimed)
        if isinstance(outcome, Reschedule):
            try:
                new_key = keys.timer(outcome.due_at_ms, timer.kind, timer.reference)
            except (TypeError, ValueError) as exc:
                report.failed += 1
                log.error("partition %r: bad Reschedule %r: %s", self.partition, outcome, exc)
                return
            if new_key == keys.timer(timer.due_at_ms, timer.kind, timer.reference):
                report.failed += 1
                log.error("partition %r: Reschedule to the row's own due time %d does not move it", self.partition, timer.due_at_ms)
                return
            # Absent: a reschedule must never overwrite (lose) another timer's row.
            batch.require(Absent(new_key)).put(new_key, outcome.value)
        result = self.store.apply(self.partition, batch)
        if isinstance(result, Committed):
            report.fired += 1
            for k, v in batch.writes:
                if v is not None and k[:1] == keys.TAG:
                    try:
                        self.note_put(keys.parse(k).due_at_ms)
                    except keys.MalformedKey:
                        pass
        elif result.key == claimed:
            report.raced += 1
        else:
            report.failed += 1
            log.info("partition %r: batch of %r failed its guard on %r; row stays backed off", self.partition, claimed, result.key)

    def next_future_due(self) -> Optional[int]:
        start, end = keys.future_range(self.now_ms)
        after = None
        while True:
            page = self.store.scan(self.partition, start, end, after, PAGE)
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

    Args:
        store: the backend.
        partition: the partition to serve.
        registry: handlers by kind.
        now_ms: the tick's time, Unix epoch ms; rows with effective due <= now_ms are due,
            and backoff delays count from it.
        budget: limits of this tick.

    ``next_wake_ms``: ``now_ms`` when due rows were left (deferred or stopped
    on budget) and this tick made progress (moved some row off the due range);
    ``now_ms + 5 s`` when rows were left but nothing moved; otherwise the earliest of the
    next future due time and the earliest timer key a commit of this tick wrote; never
    earlier than ``now_ms``; None when the partition holds no well-formed timer.

    Raises:
        TypeError / ValueError: bad arguments.
        Exception: whatever the store raises (e.g. ``sqlite3.OperationalError``); rows
        already processed stay processed, the rest wait for the next tick.
    """
    check_partition(partition)
    if not isinstance(registry, TimerRegistry):
        raise TypeError(f"registry must be a TimerRegistry, got {type(registry).__name__} {registry!r}")
    if not isinstance(budget, TickBudget):
        raise TypeError(f"budget must be a TickBudget, got {type(budget).__name__} {budget!r}")
    tick = _Tick(store, partition, registry, keys._check_u("now_ms", now_ms, keys.MAX_DUE_MS), budget)
    report = tick.report
    start, end = keys.due_range(now_ms)
    after = None
    while not report.stopped_on_budget:
        page = store.scan(partition, start, end, after, PAGE)
        for key, value in page.entries:
            if tick.over_budget():
                report.stopped_on_budget = True
                break
            tick.row(key, value)
        if page.next is None:
            break
        after = page.next
    if report.stopped_on_budget or report.deferred:
        report.next_wake_ms = now_ms if tick.moved else now_ms + NO_PROGRESS_WAKE_MS
        return report
    candidates = [t for t in (tick.next_future_due(), tick.earliest_put) if t is not None]
    report.next_wake_ms = max(min(candidates), now_ms) if candidates else None
    return report

"""Phase 1 of a tick: claim a partition's due rows before any of them fires.

A claim moves a row from its key K to its next backoff key K' (attempt + 1, due
``now_ms + backoff``, value and original due time unchanged) and points the timer's identity row
(:func:`~.keys.identity`) at K' (but for a first attempt, whose writers find K' by
:func:`~.keys.first_claim`), guarded on ``Equals(K, value)``, many claims per :meth:`Store.apply_many`
round trip. So every attempt
is counted before ``fire``: a handler that kills the process still has its attempt counted,
and the row comes back after a growing backoff instead of in a hot loop. A claimed row whose
handler is never called (a runner stopping with rows queued) is given its attempt back by
:func:`refund_rows`, so attempts count calls, not claims.

What a scan meets, and what becomes of it (each a record type below, never a tagged tuple):

- a row of a registered kind: claimed to fire (:class:`ClaimedTimer`); a schedule's occurrence is
  claimed by :func:`~.schedules.claim_occurrence`, which may instead move the schedule on unfired;
- a row of a kind this registry lacks: left in place for :data:`UNKNOWN_KIND_GRACE_MS` after
  its due time, so that a runner that has the kind (another service on the store, or another
  group of a fleet, see :mod:`timerwheel_c.durable.storage.postgres.ownership`) fires it; after that it
  is moved :data:`UNKNOWN_KIND_BACKOFF_MS` later and logged once per kind, so rows nobody can
  fire do not clog the due range. That move charges no attempt (no handler was called): in a
  rolling deploy, the runner that has the kind still finds every attempt of ``max_attempts``
  left. A row never tried keeps the scheduled layout, which has a single due time, so its due
  time becomes the retry time;
- a row whose key does not parse (*malformed*), or whose claim the store refuses for its content or that has
  no valid backoff key (*unprocessable*): moved once, guarded, to its quarantine key
  ``keys.quarantine(K)`` outside the timer space, value unchanged, retained but never scanned
  again; a row that cannot even be quarantined is left, counted ``stuck`` and listed, never
  retried within the tick. A refusal of the store as a whole (a transient one: a read-only server,
  a full disk) is no row's fault: the row stays in place, untouched, for a later pass;
- a row of a registered kind whose attempts are used up (``attempt >= max_attempts``: the process
  died during its last attempt, or that attempt's outcome did not commit): parked instead of
  fired again (:mod:`.parking`), in one guarded move, with a last error saying so;
- a row in ``exclude`` (a caller's rows in flight): skipped, so a process never claims again
  a row it is still firing.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, ClassVar, Container, Mapping, Optional, Union

from . import keys, names, parking, schedule_state, schedules
from .registry import DueTimer, TimerHandler, TimerRegistry, check_registry, due_timer
from .tick import DEFAULT_BUDGET, RunReport, TickBudget, backoff_ms, lease_ms
from ..storage.errors import is_transient
from ..storage.printable import printable
from ..storage.shards import shard_of, shard_wide
from ..storage.store import Absent, Batch, Committed, Equals, Page, Refused, RowMove, Store, check_partition, equals_read

__all__ = ["CLOCK_EVERY", "PAGE", "SCAN_PAGE", "UNKNOWN_KIND_BACKOFF_MS", "UNKNOWN_KIND_GRACE_MS", "ClaimedAs", "ClaimedTimer", "Claims",
           "claim_due", "claim_due_across", "due_request", "first_backoff_ms", "refund_rows", "release_claims", "release_range",
           "release_rows"]

log = logging.getLogger("timerwheel_c.durable")

PAGE = 64  # rows claimed per round trip, at most
SCAN_PAGE = 512  # rows read per scan of the due range, at most
# A claim reads its clock for ``TickBudget.max_elapsed_ms`` before its first row of each round trip and
# then every this many rows: choosing a row takes microseconds, a read of a service's clock a few
# calls, once per row a tenth of a claim's cost. The budget is then overrun by at most this many
# rows' choosing (a fraction of a millisecond), never by a round trip.
CLOCK_EVERY = 32
UNKNOWN_KIND_GRACE_MS = 10_000
_NONE_EXCLUDED: Mapping = MappingProxyType({})  # claim_due_across's default: no partition's rows skipped
_UNSEEN = object()  # a kind this claim has not worked out its first claim of yet (see Claimer._first)
# How much later a row of a kind nobody claimed within its grace comes back. Constant, as such a
# move counts no attempt: with the grace, each such row costs one move per 40 s.
UNKNOWN_KIND_BACKOFF_MS = 30_000


@dataclass(frozen=True)
class ClaimedTimer:
    """A row :func:`claim_due` claimed: fire ``timer`` with ``handler``, then settle its outcome.

    ``timer.key`` is the claimed (backed-off) key and ``timer.value`` the row's value:
    the outcome's commit is guarded on exactly that row.
    """

    handler: TimerHandler
    timer: DueTimer
    schedule: Optional[bytes] = None  # a schedule's occurrence: the schedule's state its claim read

    #: Whether the record holds its timer's fields itself (``due_at_ms``, ``kind``, ``reference``,
    #: ``value``, ``attempt``, ``key``, as :class:`DueTimer` names them), as a subclass whose ``timer``
    #: is made at each read does: the runner then reads them off the record, no DueTimer made for it.
    holds_fields: ClassVar[bool] = False

    def lateness_ms(self, fired_ms: int) -> int:
        """How late, in ms, a fire that started at ``fired_ms`` (Unix epoch ms) was (>= 0): counted
        from the timer's due time, or for a schedule's occurrence from its row's due time (its nominal
        time plus its own jitter draw), so that jitter alone is never lateness and a delay past the
        draw always is; from the end of its jitter window if the schedule's state no longer names it."""
        due_ms = self.timer.due_at_ms
        if self.schedule is not None:
            state = schedule_state.ScheduleState.from_bytes(self.schedule)
            if state.next_nominal_ms == due_ms and state.next_fire_ms is not None:
                due_ms = state.next_fire_ms
            else:
                due_ms += state.trigger.jitter_ms
        return max(0, fired_ms - due_ms)


@dataclass
class Claims:
    """What :func:`claim_due` returns: the ``timers`` it claimed, in due order, the ``report``
    counting this tick so far, and the ``error`` (a store error) that ended the claiming early,
    or None. Claims committed before an error are kept: their rows are claimed and must fire."""

    timers: list = field(default_factory=list)
    report: RunReport = field(default_factory=RunReport)
    error: Optional[Exception] = None


class _ToFire(Batch):
    """A row chosen to fire, and the batch that claims it (its guards and writes: the move from
    ``key`` to ``claimed_key``), then ``handler`` fires the timer of its fields (``due_at_ms``,
    ``kind``, ``reference``, ``value``, ``attempt``, ``claimed_key``, as :class:`DueTimer` names
    them but ``claimed_key``, its ``key``; ``schedule``: for a schedule's occurrence, the schedule's
    state its claim read).

    One object per row: the record is its claim's batch, and holds the fields of the timer the
    handler gets, not the parsed key, nor a :class:`DueTimer` (:attr:`Claimer.claimed_as` makes its
    record of the row from the fields, and a service's record makes the DueTimer for the call: one
    made here as well was a second per fire). Every container alive per row through the claim's
    round trip costs the cyclic collector (see :meth:`Claimer.select`)."""

    def __init__(self, guards: list, writes: list, key: bytes, value: bytes, due_at_ms: int, kind: keys.TimerKind,
                 reference: bytes, attempt: int, claimed_key: bytes, handler: TimerHandler,
                 schedule: Optional[bytes] = None):
        self.guards = guards
        self.writes = writes
        self.key = key
        self.value = value
        self.due_at_ms = due_at_ms
        self.kind = kind
        self.reference = reference
        self.attempt = attempt
        self.claimed_key = claimed_key
        self.handler = handler
        self.schedule = schedule


class _ToFireFirst(RowMove, _ToFire):
    """A plain timer's first attempt chosen to fire (the row a claim meets most): the move of ``key``
    to ``claimed_key`` (the :class:`~timerwheel_c.durable.storage.store.RowMove` to ``to``, the same
    key), guarded on the row's ``value``, which a store may apply from these fields alone."""

    schedule = None
    attempt = 1

    def __init__(self, key: bytes, value: bytes, due_at_ms: int, kind: keys.TimerKind, reference: bytes,
                 claimed_key: bytes, handler: TimerHandler):  # not _ToFire's: no lists to take
        self.key = key
        self.value = value
        self.due_at_ms = due_at_ms
        self.kind = kind
        self.reference = reference
        self.claimed_key = self.to = claimed_key
        self.handler = handler


@dataclass(frozen=True)
class _ToAdvance:
    """A schedule's occurrence row whose claim moves the schedule on without firing (``batch``)."""

    key: bytes
    value: bytes
    batch: Batch


@dataclass(frozen=True)
class _ToBackOff:
    """A row of a kind nobody claimed within its grace: its claim moves it from ``key`` to ``claimed_key``."""

    key: bytes
    claimed_key: bytes
    value: bytes
    parsed: keys.TimerKey


@dataclass(frozen=True)
class _ToQuarantine:
    """A row that cannot be claimed (``why``): moved to its quarantine key."""

    key: bytes
    value: bytes
    why: str
    malformed: bool


@dataclass(frozen=True)
class _ToPark:
    """A row whose attempts are used up: ``batch`` parks it (``last_error`` says why)."""

    key: bytes
    value: bytes
    parsed: keys.TimerKey
    handler: TimerHandler
    batch: Batch
    last_error: str


_Row = Union[_ToFire, _ToAdvance, _ToBackOff, _ToQuarantine, _ToPark]

#: What a claim makes of each row it claimed to fire: ``claimed_as(partition, now_ms, handler, due_at_ms,
#: kind, reference, value, attempt, key, schedule)``, the claimed timer's fields in :class:`DueTimer`'s
#: order, gives the :class:`ClaimedTimer` (or a subclass: a caller's own record of the row, made once
#: instead of wrapping a ClaimedTimer, which may hold the fields with no DueTimer made until the call)
#: that the claim returns.
ClaimedAs = Callable[[str, int, TimerHandler, int, keys.TimerKind, bytes, Any, int, bytes, Optional[bytes]],
                     ClaimedTimer]


def _claimed_timer(partition: str, now_ms: int, handler: TimerHandler, due_at_ms: int, kind: keys.TimerKind,
                   reference: bytes, value: Any, attempt: int, key: bytes, schedule: Optional[bytes]) -> ClaimedTimer:
    return ClaimedTimer(handler, due_timer(due_at_ms, kind, reference, value, attempt, key), schedule)


def _claimed_key(now_ms: int, tk: keys.TimerKey, handler: Optional[TimerHandler],
                 lease_of: Optional[Callable[[TimerHandler, int], int]] = None) -> bytes:
    """The row's next backoff key: attempt + 1, due ``now_ms +`` the handler's lease (its backoff, or
    its timeout_s and a margin, :func:`~.tick.lease_ms`; ``lease_of(handler, attempt)`` when given: a
    claim's, worked out once per claim: the lease is the same for every row of that attempt), original
    due time kept."""
    attempt = min(tk.attempt + 1, keys.MAX_ATTEMPT)
    if handler is None:
        lease = backoff_ms(attempt)
    elif lease_of is None:
        lease = lease_ms(attempt, handler.backoff, handler.timeout_s)
    else:
        lease = lease_of(handler, attempt)
    return keys.next_attempt(tk, min(now_ms + lease, keys.MAX_DUE_MS), attempt)


def _moved_key(tk: keys.TimerKey, due_ms: int, attempt: int) -> bytes:
    """The key of the timer ``tk`` due at ``due_ms`` (Unix epoch ms) with ``attempt`` attempts
    counted: the scheduled layout for 0 (which has one due time), else the backed-off layout."""
    if attempt == 0:
        return keys.timer(due_ms, tk.kind, tk.reference, occurrence=tk.occurrence)
    return keys.next_attempt(tk, due_ms, attempt)


def _move_writes(key: bytes, value: bytes, claimed_key: bytes, tk: keys.TimerKey, keeps_identity: bool = False) -> list:
    """The writes of a claim's move of the row ``key`` (parsed ``tk``) to ``claimed_key``: the row, then
    its identity row pointed at its new key, unless ``keeps_identity`` (a first attempt's claim, whose
    writers find the row without: :func:`~.keys.claim_keeps_identity`); guarded by ``Equals(key, value)``.
    The batch's fields are filled directly: every key here was built or parsed by keys, so Batch.put's
    checks would only repeat theirs."""
    if keeps_identity:
        return [(key, None), (claimed_key, value)]
    return [(key, None), (claimed_key, value), (keys.identity_of(tk), claimed_key)]


def _quarantine_batch(row: _ToQuarantine) -> Batch:
    q = keys.quarantine(row.key)
    return Batch().require(Equals(row.key, row.value)).require(Absent(q)).delete(row.key).put(q, row.value)


class Claimer:
    """Walks a partition's due range page by page, choosing the rows a tick may fire
    (per the budget) and claiming them in one ``apply_many`` per call."""

    def __init__(self, store: Store, partition: str, registry: TimerRegistry, now_ms: int, budget: TickBudget,
                 exclude: Container[bytes] = (), clock: Callable[[], float] = time.monotonic,
                 first_page: Optional[Page] = None, grace_ms: int = UNKNOWN_KIND_GRACE_MS,
                 claimed_as: ClaimedAs = _claimed_timer):
        self.store = store
        self.claimed_as = claimed_as
        self.grace_ms = grace_ms
        self.partition = partition
        self.registry = registry
        self.now_ms = now_ms
        self.budget = budget
        self.exclude = exclude
        self.clock = clock
        self.report = RunReport()
        self.calls = 0
        self.per_kind: dict = {}
        self.capped: set = set()  # kinds whose cap this tick has reached
        self.kind_count = len(registry.kinds())  # once every one is capped, no row left can fire
        self.started = clock()
        self.start, self.end = keys.due_range(now_ms)
        self.pending: list = []  # rows of the current page not looked at yet, last first
        self.refused: list = []  # rows whose claim the store refused: quarantined next round trip
        self.after: Optional[bytes] = None
        self.exhausted = False
        self.leases: dict = {}  # (id(handler), attempt) -> lease ms: see _lease_ms
        self.firsts: dict = {}  # kind -> how a first attempt of it is claimed: see _first
        if first_page is not None:  # read already, by the request due_request() gives
            self._take(first_page)

    def over_budget(self) -> bool:
        b = self.budget
        elapsed_ms = (self.clock() - self.started) * 1000
        return self.report.scanned >= b.max_scanned or self.calls >= b.max_fired or elapsed_ms >= b.max_elapsed_ms

    @property
    def done(self) -> bool:
        return not self.refused and (self.report.stopped_on_budget or (self.exhausted and not self.pending))

    def claim(self, max_rows: int) -> list:
        """Claim up to ``max_rows`` rows to fire in one round trip; returns the :class:`ClaimedTimer` list."""
        rows, batches = self.select(max_rows)
        return self.claimed(rows, self.store.apply_many(self.partition, batches))

    def select(self, max_rows: int) -> tuple:
        """Choose up to ``max_rows`` rows to fire, scanning a page if none is pending; returns
        ``(row records, claim batches)``, two lists in step (rows to back off or quarantine ride along).

        Two lists, not a pair per row: the rows of a pass live through its claim's round trip,
        long enough for the collector's young passes to meet them, and each container they hold
        is one more to count and promote towards the full collections that walk the whole heap."""
        rows = self.refused
        batches = [_quarantine_batch(r) for r in rows]
        self.refused = []
        report = self.report
        while not self.pending and not self.exhausted:
            # A claim that used up its budget reads no page it cannot claim from; nor does one whose every
            # kind has reached its cap: the rows after would all be deferred, a backlog of one kind read
            # (up to max_scanned) for nothing, in every pass that claims from it.
            if self.over_budget() or 0 < self.kind_count <= len(self.capped):
                report.stopped_on_budget = True
                return rows, batches
            # Rows a capped kind defers cost a scan but no claim: read what is left of max_scanned
            # in one page (up to SCAN_PAGE), not in pages of 64.
            limit = max(1, min(SCAN_PAGE, self.budget.max_scanned - report.scanned))
            self._take(self.store.scan(self.partition, self.start, self.end, self.after, limit))
        fires = 0
        exclude, capped, pending, budget = self.exclude, self.capped, self.pending, self.budget
        firsts, scheduled_fields = self.firsts, keys.scheduled_fields
        clock_in = 0  # rows until the clock is read again (see CLOCK_EVERY)
        while pending and fires < max_rows:
            if report.scanned >= budget.max_scanned or self.calls >= budget.max_fired:
                report.stopped_on_budget = True
                break
            if clock_in <= 0:
                if (self.clock() - self.started) * 1000 >= budget.max_elapsed_ms:
                    report.stopped_on_budget = True
                    break
                clock_in = CLOCK_EVERY
            clock_in -= 1
            key, value = pending.pop()
            report.scanned += 1
            if key in exclude:
                report.busy += 1
                continue
            if capped and keys.head_kind(key) in capped:
                # A row of a kind already at its cap: deferred without a full parse (inline: a
                # single-kind backlog costs one such look per row, up to max_scanned per tick).
                report.deferred += 1
                continue
            scheduled = scheduled_fields(key)
            if scheduled is not None:
                # A plain timer's first attempt, the row met most: claimed here, with what its kind needs
                # worked out once per claim (see _first), and no call per row but the row's own objects.
                due_at_ms, kind_number, reference = scheduled
                first = firsts.get(kind_number, _UNSEEN)
                if first is _UNSEEN:
                    first = self._first(kind_number)
                if first is not None:
                    handler, retry_at_ms, kind, cap = first
                    claimed_key = keys.first_claimed_key(due_at_ms, kind_number, reference, retry_at_ms)
                    self._count_call(kind_number, cap)
                    fire = _ToFireFirst(key, value, due_at_ms, kind, reference, claimed_key, handler)
                    rows.append(fire)
                    batches.append(fire)
                    fires += 1
                    continue
            row = self._choose(key, value)
            if row is None:
                continue
            if isinstance(row, _ToFire):
                batch: Batch = row
            elif isinstance(row, _ToQuarantine):
                try:
                    batch = _quarantine_batch(row)
                except ValueError:  # its quarantine key is past the store's key limit
                    self._stuck(key, "its quarantine key would be longer than the store's key limit")
                    continue
            elif isinstance(row, _ToBackOff):
                batch = Batch([Equals(key, value)], _move_writes(key, value, row.claimed_key, row.parsed))
            else:
                batch = row.batch
            rows.append(row)
            batches.append(batch)
            fires += isinstance(row, _ToFire)
        return rows, batches

    def _take(self, page: Page) -> None:
        self.pending = list(reversed(page.entries))
        self.exhausted = page.next is None
        self.after = page.next

    def _choose(self, key: bytes, value: bytes) -> Optional[_Row]:
        """What to do with the due row ``key`` (neither excluded nor of a capped kind): a record, or
        None to leave it (counted)."""
        report = self.report
        try:
            tk = keys.parse(key)
        except keys.MalformedKey as exc:
            return _ToQuarantine(key, value, exc.why, malformed=True)
        handler = self.registry.get(tk.kind)
        try:
            claimed_key = _claimed_key(self.now_ms, tk, handler, self._lease_ms)
        except ValueError as exc:  # no valid backoff key (e.g. past the key limit)
            return _ToQuarantine(key, value, f"no backoff key: {exc}", malformed=False)
        if handler is None:
            grace_ends_ms = tk.due_at_ms + self.grace_ms
            if grace_ends_ms > self.now_ms:
                report.unknown_waiting += 1
                if report.earliest_unknown_ms is None or grace_ends_ms < report.earliest_unknown_ms:
                    report.earliest_unknown_ms = grace_ends_ms
                return None
            return _ToBackOff(key, _moved_key(tk, min(self.now_ms + UNKNOWN_KIND_BACKOFF_MS, keys.MAX_DUE_MS),
                                              tk.attempt), value, tk)
        if parking.exhausted(handler, tk.attempt):
            try:
                park = self._park(key, value, tk, handler)
            except ValueError as exc:
                return _ToQuarantine(key, value, f"its schedule's row is unreadable: {exc}", malformed=False)
            if park is not None:
                return park
        claim = None
        if tk.occurrence:
            try:
                claim = schedules.claim_occurrence(self.store, self.partition, key, value, tk, self.now_ms,
                                                   handler.backoff, handler.timeout_s)
            except ValueError as exc:
                return _ToQuarantine(key, value, f"its schedule's row is unreadable: {exc}", malformed=False)
            if claim is None:
                return None
            if claim.nominal_ms is None:
                return _ToAdvance(key, value, claim.batch)
        self._count_call(tk.kind, self._cap(handler))
        kind: keys.TimerKind = keys.KINDS[tk.kind]  # type: ignore[assignment]  # a parsed key's kind is 1..255, never KINDS[0]
        if claim is not None and claim.claimed_key is not None:
            assert claim.nominal_ms is not None  # an occurrence to fire has its nominal time
            return _ToFire(claim.batch.guards, claim.batch.writes, key, value, claim.nominal_ms, kind, tk.reference,
                           tk.attempt + 1, claim.claimed_key, handler, claim.state)
        if tk.attempt == 0 and not tk.occurrence:  # a first attempt keeps its identity row (keys.claim_keeps_identity)
            return _ToFireFirst(key, value, tk.original_due_at_ms, kind, tk.reference, claimed_key, handler)
        # Once per row claimed, inline: the writes _move_writes makes.
        writes = [(key, None), (claimed_key, value), (keys.identity_of(tk), claimed_key)]
        return _ToFire([equals_read(key, value)], writes, key, value, tk.original_due_at_ms, kind, tk.reference,
                       tk.attempt + 1, claimed_key, handler)

    def _first(self, kind: int) -> Optional[tuple]:
        """How this claim claims a plain timer's first attempt of ``kind``, worked out once per claim:
        ``(handler, retry_at_ms, TimerKind, cap)`` (the row moves to its backed-off key due at
        ``retry_at_ms``, Unix epoch ms; it counts against ``cap`` rows of its kind), or None when the row takes :meth:`_choose`'s
        look: no handler (its grace), or no attempt left (its park)."""
        handler = self.registry.get(kind)
        first = None
        if handler is not None and not parking.exhausted(handler, 0):
            retry_at_ms = min(self.now_ms + self._lease_ms(handler, 1), keys.MAX_DUE_MS)
            first = (handler, retry_at_ms, keys.KINDS[kind], self._cap(handler))
        self.firsts[kind] = first
        return first

    def _cap(self, handler: TimerHandler) -> int:
        """The rows of ``handler``'s kind this tick may fire: the budget's cap per kind, or the handler's
        own ``max_per_tick`` if lower."""
        cap = self.budget.max_per_kind
        return cap if handler.max_per_tick is None else min(cap, handler.max_per_tick)

    def _count_call(self, kind: int, cap: int) -> None:
        """Count a row of ``kind`` chosen to fire, against the tick's cap and ``cap``, its kind's."""
        count = self.per_kind.get(kind, 0) + 1
        self.per_kind[kind] = count
        if count >= cap:
            self.capped.add(kind)
        self.calls += 1

    def _lease_ms(self, handler: TimerHandler, attempt: int) -> int:
        """How long a claim of ``attempt`` holds a row of ``handler`` (:func:`~.tick.lease_ms`, which no
        jitter shortens), worked out once per claim (see :func:`_claimed_key`)."""
        cached = self.leases.get((id(handler), attempt))
        if cached is None:
            cached = self.leases[(id(handler), attempt)] = lease_ms(attempt, handler.backoff, handler.timeout_s)
        return cached

    def _park(self, key: bytes, value: bytes, tk: keys.TimerKey, handler: TimerHandler) -> Optional[_ToPark]:
        """The park of the row ``key``, whose attempts are used up; None for an occurrence of a schedule
        that is gone (its claim deletes it, as any such occurrence).

        Raises:
            ValueError: an occurrence whose schedule's row is malformed.
        """
        last_error = parking.STOPPED_DURING.format(attempt=tk.attempt, max_attempts=handler.max_attempts)
        batch = parking.park_timer(key, value, tk, self.now_ms, last_error)
        if tk.occurrence:
            state = self.store.get(self.partition, keys.schedule_row(tk.reference))
            if state is None:
                return None
            schedules.park_occurrence(batch, tk.reference, state)
        return _ToPark(key, value, tk, handler, batch, last_error)

    def _stuck(self, key: bytes, why: str) -> None:
        self.report.stuck += 1
        self.report.stuck_keys.append(key)
        log.error("%s can be neither claimed nor quarantined (%s); left in place, not retried by this runner",
                  names.row_name(self.partition, key, registry=self.registry), printable(why))

    def claimed(self, rows: list, results: list) -> list:
        """Count the results of the batches of :meth:`select`'s ``rows``; return the rows claimed for
        firing, each made by :attr:`claimed_as`."""
        report = self.report
        claims = []
        make, partition, now_ms = self.claimed_as, self.partition, self.now_ms
        moved = 0  # rows claimed to fire, counted once at the end: the common case costs no other look
        for row, result in zip(rows, results):
            if result.__class__ is Committed and (row.__class__ is _ToFireFirst or row.__class__ is _ToFire):
                moved += 1
                claims.append(make(partition, now_ms, row.handler, row.due_at_ms, row.kind, row.reference, row.value,
                                   row.attempt, row.claimed_key, row.schedule))
                continue
            if isinstance(row, _ToQuarantine):
                self._quarantined(row, result)
                continue
            if isinstance(result, Refused):
                if is_transient(result.error):
                    # A store-wide refusal (a read-only server, a full disk), not one of this row's
                    # content: left in place for a later pass, which backs off as a whole while it lasts.
                    continue
                self.refused.append(_ToQuarantine(row.key, row.value,
                                                  f"claim refused by the store: {result.error}", malformed=False))
                continue
            if not isinstance(result, Committed):
                report.raced += 1
                continue
            report.moved += 1
            if isinstance(row, _ToAdvance):
                continue
            if isinstance(row, _ToPark):
                self._parked(row)
                continue
            if isinstance(row, _ToBackOff):
                report.unknown += 1
                if self.registry.first_unknown(row.parsed.kind):
                    log.warning("partition %r: no handler for timer kind %d in any runner within %d ms of its "
                                "due time; backing its rows off", self.partition, row.parsed.kind, self.grace_ms)
                continue
            claims.append(make(partition, now_ms, row.handler, row.due_at_ms, row.kind, row.reference, row.value,
                               row.attempt, row.claimed_key, row.schedule))
        report.moved += moved
        return claims

    def _parked(self, row: _ToPark) -> None:
        report, kind = self.report, row.parsed.kind
        report.parked += 1
        report.parked_kinds[kind] = report.parked_kinds.get(kind, 0) + 1
        log.error("%s parked: %s", names.timer_name(self.partition, kind, row.parsed.reference, handler=row.handler,
                                                    attempt=row.parsed.attempt, due_at_ms=row.parsed.original_due_at_ms,
                                                    occurrence=row.parsed.occurrence), printable(row.last_error))

    def _quarantined(self, row: _ToQuarantine, result) -> None:
        report = self.report
        if isinstance(result, Committed):
            report.moved += 1
            if row.malformed:
                report.malformed += 1
            else:
                report.unprocessable += 1
                log.error("%s quarantined: %s", names.row_name(self.partition, row.key, registry=self.registry),
                          printable(row.why))
        elif isinstance(result, Refused):
            if not is_transient(result.error):  # a store-wide refusal leaves the row for a later pass
                self._stuck(row.key, f"{row.why}; quarantine refused: {result.error}")
        else:
            if row.malformed:
                report.malformed += 1
            log.warning("%s kept in place (its quarantine guard failed)",
                        names.row_name(self.partition, row.key, registry=self.registry))


def check_args(partition, registry, now_ms, budget) -> int:
    """Check a tick's arguments; return ``now_ms``.

    Raises:
        TypeError / ValueError: naming the bad argument.
    """
    check_partition(partition)
    check_registry(registry)
    if not isinstance(budget, TickBudget):
        raise TypeError(f"budget must be a TickBudget, got {type(budget).__name__} {budget!r}")
    return keys.check_uint("now_ms", now_ms, keys.MAX_DUE_MS)


def due_request(partition: str, now_ms: int, budget: TickBudget = DEFAULT_BUDGET, max_rows: int = SCAN_PAGE) -> tuple:
    """The :meth:`Store.scan_many` request for the first page of a claim of ``partition`` at ``now_ms``
    (Unix epoch ms) within ``budget`` that may fire ``max_rows`` rows: its answer may be passed to
    :func:`claim_due` as ``first_page``, so that one round trip reads the due rows of many partitions.
    The page holds no more rows than the claim may fire (a claim that needs more reads on); within
    that, as many as the claim's own first read, which also reads past a kind's cap."""
    start, end = keys.due_range(now_ms)
    return partition, start, end, None, max(1, min(SCAN_PAGE, budget.max_scanned, budget.max_per_kind, max_rows))


def claim_due(store: Store, partition: str, registry: TimerRegistry, now_ms: int, budget: TickBudget = DEFAULT_BUDGET,
              *, exclude: Container[bytes] = (), clock: Callable[[], float] = time.monotonic,
              first_page: Optional[Page] = None, grace_ms: int = UNKNOWN_KIND_GRACE_MS,
              claimed_as: ClaimedAs = _claimed_timer) -> Claims:
    """Claim every due row of ``partition`` that ``budget`` lets fire (see the module docstring).

    Scans the due range (effective due <= ``now_ms``, Unix epoch ms) in pages of up to
    :data:`SCAN_PAGE` rows and claims up to :data:`PAGE` rows per :meth:`Store.apply_many` round
    trip. ``exclude``: keys to skip (rows the caller has in flight). ``clock``: monotonic
    seconds, for ``max_elapsed_ms``. ``grace_ms``: how long after its due time a row of a kind
    ``registry`` lacks is left for a runner that has it (ms). ``first_page``: the answer to :func:`due_request`, read by the
    caller (with other partitions' in one :meth:`Store.scan_many`), or None to read it here. ``claimed_as``: what each
    row claimed becomes (:data:`ClaimedAs`; by default a :class:`ClaimedTimer`). The caller fires each :class:`ClaimedTimer`, settles
    and commits the outcomes and ends with :func:`~.runner.next_wake`.

    A store error after some round trips committed ends the claiming there and is returned
    as ``Claims.error``, with the rows already claimed: they must still fire.

    Raises:
        TypeError / ValueError: bad arguments.
        StoreError (or another exception from the store): the first round trip failed.
    """
    now_ms = check_args(partition, registry, now_ms, budget)
    claimer = Claimer(store, partition, registry, now_ms, budget, exclude, clock, first_page, grace_ms, claimed_as)
    timers: list = []
    while not claimer.done:
        try:
            timers.extend(claimer.claim(PAGE))
        except Exception as exc:
            if not timers:
                raise
            return Claims(timers, claimer.report, exc)
    return Claims(timers, claimer.report)


def claim_due_across(store: Store, requests: list, registry: TimerRegistry, now_ms: int, *,
                     exclude: Mapping[str, Container[bytes]] = _NONE_EXCLUDED, clock: Callable[[], float] = time.monotonic,
                     grace_ms: int = UNKNOWN_KIND_GRACE_MS, claimed_as: ClaimedAs = _claimed_timer) -> list:
    """:func:`claim_due` for many partitions at one ``now_ms`` (Unix epoch ms), their first claim
    round trip shared: one :meth:`Store.apply_across` claims every row of every partition's first
    page that its budget lets fire (one statement and one commit for them all: the page holds no
    more rows than the budget, see :func:`due_request`); a partition then claims whatever its budget
    leaves on its own, :data:`PAGE` rows per round trip. Claiming the first page in pieces of a
    :data:`PAGE` cost a round trip each, one after another, most of a pass's time.

    ``requests``: ``(partition, budget, first_page)`` triples (``first_page`` as :func:`claim_due`
    takes it); ``exclude``: ``{partition: keys to skip}`` (each partition's rows the caller has in
    flight: two partitions may hold rows of one key); ``grace_ms`` and ``claimed_as`` as :func:`claim_due` takes them. Returns one :class:`Claims` per request, in order. Errors stay where they arose: an
    error reading a partition's rows is that partition's ``Claims.error``; when the shared round
    trip fails (nothing of it was written: a lock on one partition that it waited on past the
    store's bound, say), each partition claims those rows in a round trip of its own, so that the
    error is the error of the partition that raised it and the others are claimed; a transient error
    there (that lock wait) is its shard's too: the shard's partitions after it get that error with no
    round trip, so a pass waits a held shard lock out once, not once per partition of the shard.

    Raises:
        TypeError / ValueError: bad arguments.
    """
    claimers: list = []
    rows: list = []  # per request: (row records, claim batches) as Claimer.select gives them
    errors: list = []
    for partition, budget, first_page in requests:
        check_args(partition, registry, now_ms, budget)
        claimer = Claimer(store, partition, registry, now_ms, budget, exclude.get(partition, ()), clock, first_page,
                          grace_ms, claimed_as)
        claimers.append(claimer)
        try:
            rows.append(claimer.select(budget.max_fired))
            errors.append(None)
        except Exception as exc:
            rows.append(([], []))
            errors.append(exc)
    timers: list = [[] for _ in claimers]
    items = [(c.partition, b) for c, (_, bs) in zip(claimers, rows) for b in bs]
    try:
        results = store.apply_across(items) if items else []
    except Exception as exc:
        if sum(1 for rs, _ in rows if rs) < 2:
            errors = [exc if rs else e for (rs, _), e in zip(rows, errors)]
        else:
            held: dict = {}  # shard -> the error of one of its partitions' own claim, if shard_wide
            for i, (claimer, (rs, bs)) in enumerate(zip(claimers, rows)):
                if rs:
                    shard = shard_of(claimer.partition, store.shard_count)
                    if shard in held:
                        errors[i] = held[shard]
                        continue
                    try:
                        timers[i] = claimer.claimed(rs, store.apply_many(claimer.partition, bs))
                    except Exception as own:
                        errors[i] = own
                        if shard_wide(own):
                            held[shard] = own
    else:
        at = 0
        for i, (claimer, (rs, _)) in enumerate(zip(claimers, rows)):
            timers[i] = claimer.claimed(rs, results[at:at + len(rs)])
            at += len(rs)
    out = []
    for claimer, claimed, error in zip(claimers, timers, errors):
        while error is None and not claimer.done:
            try:
                claimed.extend(claimer.claim(PAGE))
            except Exception as exc:
                error = exc
        out.append(Claims(claimed, claimer.report, error))
    return out


def first_backoff_ms(registry: Optional[TimerRegistry] = None) -> int:
    """The longest first lease (ms) a claim of ``registry``'s handlers waits: the default backoff,
    or a handler's own (:class:`~.tick.Backoff`, or its ``timeout_s`` and a margin,
    :func:`~.tick.lease_ms`), whichever is longer."""
    handlers = [] if registry is None else [registry.get(kind) for kind in registry.kinds()]
    return max([backoff_ms(1)] + [lease_ms(1, h.backoff, h.timeout_s) for h in handlers if h is not None])


def release_range(now_ms: int, registry: Optional[TimerRegistry] = None) -> tuple[bytes, bytes]:
    """``(start, end)`` of the keys :func:`release_claims` looks at: rows due after ``now_ms`` (Unix
    epoch ms) and within the longest first backoff of ``registry``'s handlers after it
    (:func:`first_backoff_ms`), where a runner's first-attempt claims wait."""
    end_ms = min(now_ms + first_backoff_ms(registry), keys.MAX_DUE_MS)
    return keys.due_range(now_ms)[1], keys.due_range(end_ms)[1]


def release_claims(store: Store, partition: str, now_ms: int, registry: Optional[TimerRegistry] = None) -> int:
    """Make due at ``now_ms`` the rows of ``partition`` that a runner claimed for their first
    attempt and has not settled: backed-off rows at attempt 1 whose retry time lies within the
    longest first backoff of ``registry``'s handlers (the default one without it) after ``now_ms``
    (Unix epoch ms). For a partition just taken over from a
    runner that died, whose claims would otherwise wait out their backoff. Each row moves
    guarded on itself (its attempt kept, so the next claim counts attempt 2), hence at most
    once. A row at attempt 1 that backs off after a failed first try is released too: it is
    retried early once, which costs nothing but the early try. Returns how many moved.

    Raises:
        StoreError (or another exception from the store).
    """
    start, end = release_range(now_ms, registry)
    moved, after = 0, None
    while True:
        page = store.scan(partition, start, end, after, SCAN_PAGE)
        batches = []
        for key, value in page.entries:
            try:
                tk = keys.parse(key)
            except keys.MalformedKey:
                continue
            if tk.attempt == 1:
                batches.append(_due_now(key, value, tk, now_ms))
        if batches:
            moved += sum(isinstance(r, Committed) for r in store.apply_many(partition, batches))
        if page.next is None:
            return moved
        after = page.next


def release_rows(store: Store, partition: str, claimed: list, now_ms: int) -> int:
    """Make due at ``now_ms`` (Unix epoch ms) the claimed rows ``claimed`` (:class:`ClaimedTimer`
    list) of ``partition`` that a runner stopping gives up unsettled, so that another runner fires
    them now instead of after their backoff. Each row moves guarded on itself (its attempt kept,
    so a row given up during its handler's last attempt is parked by the next claim, as if its
    runner had died), so a row whose outcome committed meanwhile is left alone. Returns how many moved.

    Raises:
        StoreError (or another exception from the store).
    """
    batches = [_due_now(c.timer.key, c.timer.value, keys.parse(c.timer.key), now_ms) for c in claimed]
    if not batches:
        return 0
    return sum(isinstance(r, Committed) for r in store.apply_many(partition, batches))


def refund_rows(store: Store, partition: str, claimed: list, now_ms: int) -> int:
    """Give back the attempt that claiming counted to the claimed rows ``claimed`` (:class:`ClaimedTimer`
    list) of ``partition`` whose handler was never called (rows a stopping runner had queued), and
    make them due at ``now_ms`` (Unix epoch ms): the next claim counts the same attempt again, so
    a timer with ``max_attempts=1`` still fires. A row claimed for its first attempt goes back to
    its scheduled key at its original due time. Each row moves guarded on itself, so a row another
    runner took meanwhile is left alone. Returns how many moved.

    Only for rows no handler was called for: a row given up during its handler keeps its attempt
    (:func:`release_rows`), since that call may have had effects.

    Raises:
        StoreError (or another exception from the store).
    """
    batches = []
    for c in claimed:
        tk = keys.parse(c.timer.key)
        attempt = tk.attempt - 1
        batches.append(_due_now(c.timer.key, c.timer.value, tk, tk.original_due_at_ms if attempt == 0 else now_ms,
                                attempt))
    if not batches:
        return 0
    return sum(isinstance(r, Committed) for r in store.apply_many(partition, batches))


def _due_now(key: bytes, value: bytes, tk: keys.TimerKey, due_ms: int, attempt: Optional[int] = None) -> Batch:
    """The guarded move of the backed-off row ``key`` to its key due at ``due_ms`` (Unix epoch ms) with
    ``attempt`` attempts counted (None: its own)."""
    now_key = _moved_key(tk, due_ms, tk.attempt if attempt is None else attempt)
    # The identity row follows the timer to its new key, so the timer stays reachable by name.
    return Batch().require(Equals(key, value)).delete(key).put(now_key, value).put(keys.identity_of(tk), now_key)

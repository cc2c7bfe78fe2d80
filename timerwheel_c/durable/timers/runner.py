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
Before calling ``fire`` the runner *claims* the row (see :mod:`.claim`): one guarded write
moves it to its next backoff key K', committed before the row fires.
The handler's outcome then commits (with others, each on its own guard) guarded on the *claimed* row,
``require(Equals(K', value))`` plus the delete of K' (and, for a Reschedule, the put of
the new key). Effects inside the batch are therefore applied at most once per timer
row: each commit consumes the exact row it is guarded on, and a row can be consumed
once. If ``fire`` overruns its backoff and a second runner re-claims K' (moving it to
K''), the first runner's commit fails on its guard (counted as ``raced``) and only the
second may commit. If the process dies between claim and commit, the row waits at K'
and is fired again after the backoff (or at once, when a fleet runner takes the partition
over: :func:`release_claims`): effects *outside* the batch must be idempotent.

Failures
--------
An exception (any, ``SystemExit`` and ``KeyboardInterrupt`` included: they are the
handler's, not the runner's), a :class:`Retry`, an invalid outcome, a failed commit of the
handler's batch or one the store refuses leave the row at its claimed backoff key; the delay
of attempt ``a`` is ``min(5 s * 2**(a-1), 600 s)``. The handler's last attempt
(``max_attempts``) that fails parks the timer instead (:mod:`.parking`). Unknown kinds,
malformed and unprocessable rows: see :mod:`.claim`.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from . import keys, names, parking, schedules, tracing
from .codecs import encoded
from .due import span_ms
from .claim import (PAGE, ClaimedTimer, Claimer, Claims, check_args, claim_due, claim_due_across, due_request,
                    release_claims)
from .registry import Done, Reschedule, Retry, TimerContext, TimerRegistry, is_async
from .tick import BACKOFF_BASE_MS, BACKOFF_CAP_MS, DEFAULT_BUDGET, RunReport, TickBudget, backoff_ms
from ..storage.printable import printable
from ..storage.store import Absent, Batch, Committed, Equals, Page, Refused, RowConsume, Store, equals_read

__all__ = [
    "BACKOFF_BASE_MS", "BACKOFF_CAP_MS", "NO_PROGRESS_WAKE_MS", "PAGE", "Attempt", "ClaimedTimer", "Claims", "Pace",
    "RunReport", "TickBudget", "backoff_ms", "claim_due", "claim_due_across", "commit_across", "commit_outcomes", "commit_records", "consumed", "due_request", "fire",
    "needs_wake_scan", "next_wake", "past_timeout", "release_claims", "run_due", "settle", "wake_request",
]

log = logging.getLogger("timerwheel_c.durable")

NO_PROGRESS_WAKE_MS = 5_000
_TRACED = tracing.ENABLED  # decided once: without opentelemetry-api a fire pays no tracing check beyond this
_TAG_LEN = len(keys.TAG)
_new = object.__new__


class Attempt:
    """One handler call, timed, its error caught: ``with Attempt(clock, wall_ms) as a: a.outcome = fire(...)``
    (or ``await``). Afterwards ``started_ms`` (Unix epoch ms), ``took_s`` (seconds on ``clock``),
    ``outcome`` and ``error`` (the exception it raised, or None) describe it.

    Everything the handler raises is its own failure, ``SystemExit`` and ``KeyboardInterrupt``
    included: only the thread that runs the service may end it. The exceptions let through are
    :class:`asyncio.CancelledError` and ``GeneratorExit`` when ``cancelled_by_caller()`` says the caller
    cancelled the call (a stop, a timeout it turns into its own error; the latter ends the coroutine of a
    call abandoned at a stop, when the collector closes it)."""

    __slots__ = ("_clock", "_started", "started_ms", "took_s", "outcome", "error", "_cancelled_by_caller")

    def __init__(self, clock: Callable[[], float], wall_ms: Callable[[], int],
                 cancelled_by_caller: Callable[[], bool] = lambda: False):
        self._clock = clock
        self.started_ms = wall_ms()
        self._started = 0.0
        self.took_s = 0.0
        self.outcome: object = None
        self.error: Optional[BaseException] = None
        self._cancelled_by_caller = cancelled_by_caller

    def __enter__(self) -> "Attempt":
        self._started = self._clock()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.took_s = self._clock() - self._started
        if exc is None:
            return False
        if not isinstance(exc, Exception) and self._cancelled_by_caller():
            if isinstance(exc, GeneratorExit):
                # The call's coroutine closed by the collector, abandoned at a stop with its loop (it
                # ignored the cancel): it must end, and may at the interpreter's exit, with no import left.
                return False
            # Only a BaseException can be asyncio's CancelledError, and one raised means asyncio is
            # loaded: importing it here costs a lookup, and spares a process without asyncio its import.
            import asyncio

            if isinstance(exc, asyncio.CancelledError):
                return False
        self.error = exc
        return True


def past_timeout(timeout_s: Optional[float], what: str) -> TimeoutError:
    """The failure of a handler call that ran past its ``timeout_s`` (s); ``what`` says what became of it."""
    return TimeoutError(f"handler ran past its timeout_s={timeout_s} s; {what}")


def fire(store: Store, partition: str, now_ms: int, claimed: ClaimedTimer, report: RunReport,
         clock: Callable[[], float] = time.monotonic) -> Batch:
    """Call ``claimed``'s handler and :func:`settle` its outcome (or exception); returns the batch
    to commit (for a counted failure, the one that records it or parks the timer). An ``async def``
    handler is awaited as the service awaits it (:func:`_awaited`); a sync one is called here."""
    handler = claimed.handler
    context = TimerContext(store, partition, now_ms)
    with Attempt(clock, lambda: now_ms) as attempt:
        if is_async(handler.fire):
            attempt.outcome = _awaited(handler, context, claimed.timer, now_ms)
        elif _TRACED:
            attempt.outcome = tracing.fire(handler, context, claimed.timer, now_ms)
        else:
            attempt.outcome = handler.fire(context, claimed.timer)
    return settle(partition, claimed, report, attempt.outcome, attempt.error, now_ms=now_ms)


def _awaited(handler, context: TimerContext, timer, started_ms: int) -> object:
    """The outcome of an ``async def`` handler called by :func:`fire`, run on an event loop of its own
    (the thread's current loop, if any, left as it is: :func:`run_due` is sync) as the service runs it:
    in its tracing span, cancelled past its ``timeout_s``; then, as :func:`asyncio.run` ends, the tasks
    it left are cancelled and the loop's async generators and default executor shut down.

    Raises:
        RuntimeError: an event loop runs in this thread (which it would block): the attempt's failure,
            the handler never called.
        TimeoutError: it ran past its ``timeout_s`` (s), and was cancelled.
    """
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("run_due() cannot run an async def handler from a thread whose event loop is running: "
                           "call it through asyncio.to_thread, or serve the timers with a DurableTimerService")

    async def call() -> object:
        called = tracing.fire_async(handler, context, timer, started_ms) if _TRACED else handler.fire(context, timer)
        if handler.timeout_s is None:
            return await called
        task = asyncio.current_task()
        expired: list = []

        def expire() -> None:
            expired.append(True)
            task.cancel()  # type: ignore[union-attr]  # call() runs as a task

        expiry = asyncio.get_running_loop().call_later(handler.timeout_s, expire)
        try:
            outcome = await called
        except asyncio.CancelledError:
            if not expired:
                raise
            raise past_timeout(handler.timeout_s, "cancelled") from None
        finally:
            expiry.cancel()
        if expired:  # it swallowed the cancel and returned late: failed, its outcome dropped, as the service does
            raise past_timeout(handler.timeout_s, "it ignored the cancel")
        return outcome

    # A loop of its own, not asyncio.run, which would also unset the thread's current loop.
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(call())
    finally:
        try:
            left = asyncio.all_tasks(loop)
            if left:  # gather() of nothing would make its future on the thread's current loop, not this one
                for task in left:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()


def settle(partition: str, claimed: ClaimedTimer, report: RunReport, outcome: object = None,
           error: Optional[BaseException] = None, *, now_ms: Optional[int] = None,
           wall_ms: Optional[Callable[[], int]] = None, still_running: bool = False) -> Batch:
    """Phase 2, pure: turn a handler's ``outcome`` (or the exception ``error`` it raised) into the
    batch that commits it, guarded on the claimed row; or count a failure in ``report`` and
    return the :class:`~.parking.RetryLater` batch that records its error (the row stays at its
    backoff key, or moves to a ``Retry(delay=)``'s), or, for a failure of the handler's last
    attempt, the :class:`~.parking.Parking` batch that parks the timer (parked at ``now_ms``, Unix
    epoch ms; None: ``wall_ms()``, or without it the host's wall clock, read only for a failure,
    which alone needs the time: a service's clock costs a few calls per read). ``still_running``: the
    failure is a call past its ``timeout_s`` whose thread runs on, so its row stays at its claimed
    key, held for the lease, where a failed call's row moves to its backoff after the failure.

    Done / Reschedule: the outcome's batch, plus ``require(Equals(claimed key, value))`` and
    the delete of the claimed row, plus for a Done the delete of the timer's identity row, for a
    Reschedule ``require(Absent(new key))``, its put and the identity row pointed at it (the timer
    keeps its name). Failures (logged as :mod:`.parking` says): an exception, Retry, anything else
    returned, a non-Batch outcome batch or one that writes a key beginning with 0x00 (reserved for the
    library's rows, :func:`~.keys.check_application_key`), a bad Reschedule or one to the row's own
    due time.
    """
    timer: Any = claimed if claimed.holds_fields else claimed.timer  # a Job's timer is made at each read
    if error is not None:
        return _failed(partition, claimed, report, now_ms, wall_ms, error=error, still_running=still_running)
    if outcome.__class__ is not Done:  # Done, nearly every fire's outcome, needs none of these looks
        if isinstance(outcome, Retry):
            why = "Retry: the handler asked to try again later"
            if outcome.delay is None:
                return _failed(partition, claimed, report, now_ms, wall_ms, why=why, asked=True)
            return _failed(partition, claimed, report, now_ms, wall_ms, why=f"{why}, in {outcome.delay} s",
                           asked=True, retry_in_ms=span_ms(outcome.delay))
        if not isinstance(outcome, (Done, Reschedule)):
            return _failed(partition, claimed, report, now_ms, wall_ms, why=parking.wrong_outcome(outcome))
    deletes = consumed(outcome, claimed.schedule, timer)
    if deletes is not None:
        return _Consumed(timer.key, timer.value, deletes)
    given = outcome.batch
    # Per fire: the batch's lists are filled directly where Batch's methods would only repeat a check
    # already made (a type checked here, a key the guard just checked or keys built as bytes), and the
    # batch is made without Batch.__init__ (a call, and a call per default list).
    batch = _new(Batch)
    if given is None:
        batch.guards, batch.writes = [], []
    else:
        if not isinstance(given, Batch):
            return _failed(partition, claimed, report, now_ms, wall_ms,
                           why=f"the outcome's batch is {type(given).__name__}, not a Batch")
        if not claimed.handler._writes_reserved_keys:
            try:
                keys.check_application_batch(given)
            except ValueError as exc:
                return _failed(partition, claimed, report, now_ms, wall_ms, why=f"the outcome's batch: {exc}")
        batch.guards, batch.writes = given.guards[:], given.writes[:]
    if claimed.schedule is not None:
        if isinstance(outcome, Reschedule):
            return _failed(partition, claimed, report, now_ms, wall_ms,
                           why="a schedule's occurrence cannot be rescheduled (it returned a Reschedule)")
        # The schedule's guard first: the claimed row's guard stays last, checked by its own delete.
        schedules.settle_occurrence(batch, timer.reference, timer.due_at_ms, claimed.schedule)
        batch.require(Equals(timer.key, timer.value)).delete(timer.key)
        # An occurrence never has a trace context (keys.may_keep_a_trace_context): only its kept last error.
        if timer.attempt > 1:
            batch.delete(keys.last_error_row(keys.identity_of(keys.parse(timer.key))))
        return batch
    # The guard on the claimed row also guards the identity row: every by-name write that moves or
    # removes this timer deletes the claimed row in the same batch.
    identity = keys.identity(timer.kind, timer.reference)
    key, value = timer.key, timer.value
    if outcome.__class__ is Done and not batch.guards and key.__class__ is bytes and value.__class__ is bytes:
        # A Done whose batch guards nothing (nearly every Done with writes): guarded on the claimed row
        # alone, a RowConsume, which a store writes from that row's fields and the writes.
        done = _new(_DoneWrites)
        done.key, done.value, done.writes = key, value, batch.writes
        done.writes.append((key, None))
        done.writes.append((identity, None))
        return _forget_error(done, timer, identity) if _TRACED or timer.attempt > 1 else done
    if key.__class__ is bytes and value.__class__ is bytes:  # a claim's key, a value read from the store
        guard = equals_read(key, value)
    else:
        guard = Equals(key, value)  # a TypeError naming what is not bytes
    batch.guards.append(guard)
    batch.writes.append((key, None))
    if isinstance(outcome, Reschedule):
        try:
            new_key = keys.timer(outcome.due_at_ms, timer.kind, timer.reference)
        except (TypeError, ValueError) as exc:
            return _failed(partition, claimed, report, now_ms, wall_ms, why=f"a bad Reschedule: {exc}")
        try:  # a codec kind's value as its handler received it: encoded here, as a writer encodes it
            value = keys.check_value("Reschedule.value", encoded(claimed.handler.kind, outcome.value, "Reschedule.value"))
        except Exception as exc:  # a codec's own error, whatever its type
            return _failed(partition, claimed, report, now_ms, wall_ms, why=f"a bad Reschedule: {type(exc).__name__}: {exc}")
        if new_key == keys.timer(timer.due_at_ms, timer.kind, timer.reference):
            return _failed(partition, claimed, report, now_ms, wall_ms,
                           why=f"a Reschedule to the timer's own due time {timer.due_at_ms} ms does not move it")
        # Absent: a reschedule must never overwrite (lose) another timer's row.
        batch.require(Absent(new_key)).put(new_key, value).put(identity, new_key)
    else:
        batch.writes.append((identity, None))
    # A first attempt's outcome without the tracing extra, the common case, deletes nothing more.
    return _forget_error(batch, timer, identity) if _TRACED or timer.attempt > 1 else batch


class _DoneWrites(RowConsume):
    """The batch of a plain timer whose handler returned ``Done(batch)`` with a batch of writes and no
    guard: those writes, then the delete of the claimed row ``key`` (guarded on its ``value``, the only
    guard) and of the timer's identity row (and :func:`_forgotten`'s), in ``writes``."""


class _Consumed(RowConsume):
    """The batch of a plain timer whose handler returned a bare ``Done()`` (nearly every fire's
    outcome): the delete of the claimed row ``key``, guarded on its ``value``, then of each of
    ``deletes`` (its identity row, then :func:`_forgotten`'s), a tuple of bytes, which the collector
    stops tracking at its first pass: it waits for its commit alongside every other row in flight."""

    __slots__ = ("key", "value", "deletes")

    def __init__(self, key: bytes, value: bytes, deletes: tuple):  # not Batch's: its fields are these
        self.key = key
        self.value = value
        self.deletes = deletes

    @property
    def writes(self) -> list:  # type: ignore[override]  # read-only in place of Batch's field
        writes = [(self.key, None)]
        for key in self.deletes:
            writes.append((key, None))
        return writes


def consumed(outcome: object, schedule: Optional[bytes], timer) -> Optional[tuple]:
    """The keys a bare ``Done()`` of a plain timer deletes beside its claimed row (its identity row,
    then :func:`_forgotten`'s) if ``outcome`` is one (``schedule`` None) and ``timer`` (a
    :class:`DueTimer`, or a record with its fields) has a claimed key and value of bytes (a claim's
    key, a value read from the store): the outcome :func:`settle` makes a :class:`_Consumed` of; None
    for any other. A tuple of bytes, which the collector stops tracking at its first pass, so that a
    record waiting for its commit may keep it in place of the batch (see :func:`commit_records`)."""
    if outcome.__class__ is Done and outcome.batch is None and schedule is None:
        if timer.key.__class__ is bytes and timer.value.__class__ is bytes:
            identity = keys.identity(timer.kind, timer.reference)
            return (identity, *_forgotten(timer, identity))
    return None


def _forget_error(batch: Batch, timer, identity: bytes) -> Batch:
    """``batch`` with the deletes of :func:`_forgotten` (keys built as bytes: no check of Batch.delete)."""
    for key in _forgotten(timer, identity):
        batch.writes.append((key, None))
    return batch


def _forgotten(timer, identity: bytes) -> tuple:
    """The rows a plain timer's outcome deletes beside its claimed row and its identity row
    ``identity``: its kept last error, when an earlier attempt may have left one (a first attempt's
    outcome, the common case, deletes nothing more), and, when fires are traced, its writer's trace
    context (a runner without tracing leaves it: the next write of that name deletes or replaces it,
    and it links no later timer, whose due time differs)."""
    if timer.attempt > 1:
        return (keys.last_error_row(identity), keys.trace_context_row(identity)) if _TRACED \
            else (keys.last_error_row(identity),)
    return (keys.trace_context_row(identity),) if _TRACED else ()


def _failed(partition: str, claimed: ClaimedTimer, report: RunReport, now_ms: Optional[int],
            wall_ms: Optional[Callable[[], int]], *,
            error: Optional[BaseException] = None, why: Optional[str] = None, asked: bool = False,
            retry_in_ms: Optional[int] = None, still_running: bool = False) -> Batch:
    """Count and log a failed attempt; return the :class:`~.parking.RetryLater` batch that keeps its
    last error (the row stays backed off) and moves its retry to ``retry_in_ms`` from ``now_ms`` (a
    ``Retry(delay=)``), or the batch that parks the timer when this was its last attempt (``now_ms``
    None: ``wall_ms()``, or without it the host's wall clock)."""
    report.failed += 1
    timer, handler = claimed.timer, claimed.handler
    tk = keys.parse(timer.key)
    last_error = parking.last_error_of(error, why)
    last = parking.exhausted(handler, timer.attempt)
    if now_ms is None:
        now_ms = parking.wall_ms() if wall_ms is None else wall_ms()
    if retry_in_ms is None and not still_running and (
            handler.timeout_s is not None or (handler.backoff is not None and handler.backoff.jitter)):
        # The claim held the row for its lease (the handler's timeout_s, or its backoff without the
        # jitter): a call that failed sooner is retried its backoff, jittered, after the failure, as it
        # would be without either.
        backoff = backoff_ms(timer.attempt, handler.backoff)
        if tk.due_at_ms > now_ms + backoff:
            retry_in_ms = backoff
    retry_key = None
    if not last and retry_in_ms is not None:
        retry_key = keys.backoff(min(now_ms + retry_in_ms, keys.MAX_DUE_MS), tk.kind, tk.attempt,
                                 tk.original_due_at_ms, tk.reference, occurrence=tk.occurrence)
    parking.log_failure(partition, handler, tk, timer.attempt, timer.due_at_ms, last_error, error,
                        retry_at_ms=None if last else keys.parse(retry_key or timer.key).due_at_ms, asked=asked)
    if not last:
        # The error is kept beside the row, guarded on it, for get_timer and `timers list` to show.
        identity = keys.identity_of(tk)
        batch = parking.RetryLater().require(Equals(timer.key, timer.value))
        if retry_key is not None and retry_key != timer.key:
            batch.delete(timer.key).put(retry_key, timer.value).put(identity, retry_key)
        return batch.put(keys.last_error_row(identity), keys.last_error_value(tk, last_error))
    batch = parking.park_timer(timer.key, timer.value, tk, now_ms, last_error)
    if claimed.schedule is not None:
        schedules.park_occurrence(batch, timer.reference, claimed.schedule)
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
    pairs = [pair for pair in settled if pair[1] is not None]
    if pairs:
        batches = [b for _, b in pairs]
        _count_outcomes(partition, [c for c, _ in pairs], batches, store.apply_many(partition, batches), report)


def commit_across(store: Store, settled: dict) -> dict:
    """Phase 3 for many partitions: :func:`commit_outcomes` of every partition in one
    :meth:`Store.apply_across` call (one round trip and one commit on PostgreSQL).

    ``settled``: ``{partition: [(ClaimedTimer, Batch or None), ...]}``. Returns ``{partition:
    RunReport}`` counting each partition's outcomes as :func:`commit_outcomes` does.

    Raises:
        Exception: whatever the store raises, for the call as a whole; the uncommitted rows stay
        at their backoff keys.
    """
    pairs = {p: [pair for pair in s if pair[1] is not None] for p, s in settled.items()}
    return _commit_each({p: [c for c, _ in ps] for p, ps in pairs.items()},
                        {p: [b for _, b in ps] for p, ps in pairs.items()}, store)


def commit_records(store: Store, settled: dict) -> dict:
    """:func:`commit_across` of records that carry their outcome's batch (as the service's jobs do, in
    ``record.batch``, never None): ``settled`` is ``{partition: [record, ...]}``. A record that
    :attr:`~ClaimedTimer.holds_fields` may carry the :func:`consumed` keys of its bare ``Done()`` in
    place of the batch, which is made here, as the commit reads it: a batch waiting for the commit
    with every row in flight is one more tracked container per row for the collector's passes to
    count and promote, the tuple of bytes none past their first. Nor is a pair made per outcome, for
    the same reason.

    Raises:
        Exception: as :func:`commit_across`.
    """
    return _commit_each(settled, {p: [r.batch if r.batch.__class__ is not tuple else _Consumed(r.key, r.value, r.batch)
                                      for r in rs] for p, rs in settled.items()}, store)


def _commit_each(claims: dict, batches: dict, store: Store) -> dict:
    """Every partition's ``batches`` (of ``claims``, lists in step) in one ``apply_across``; each
    partition's results counted into a :class:`RunReport` of its own."""
    results = store.apply_across([(p, b) for p, bs in batches.items() for b in bs])
    reports, at = {}, 0
    for partition, bs in batches.items():
        report = reports[partition] = RunReport()
        _count_outcomes(partition, claims[partition], bs, results[at:at + len(bs)], report)
        at += len(bs)
    return reports


def _count_outcomes(partition: str, claims: list, batches: list, results: list, report: RunReport) -> None:
    """Count into ``report`` the ``results`` of the outcome ``batches`` of ``claims``, three lists in step."""
    fired = 0  # Done and Reschedule outcomes committed, the common case: counted at the end
    fired_kinds: dict = {}  # TimerKind -> of those
    for claimed, batch, result in zip(claims, batches, results):
        cls = batch.__class__
        if result.__class__ is Committed and (cls is _Consumed or cls is _DoneWrites or cls is Batch):
            # Neither a Parking nor a RetryLater; a _Consumed puts no row.
            fired += 1
            kind = claimed.kind if claimed.holds_fields else claimed.timer.kind  # a Job's timer is made at each read
            fired_kinds[kind] = fired_kinds.get(kind, 0) + 1
            if cls is not _Consumed:
                for k, v in batch.writes:
                    if v is not None and k[:_TAG_LEN] == keys.TAG:  # keys.is_timer_key inline: per put of each outcome
                        _put_due(report, k)
            continue
        key = claimed.timer.key
        kind = claimed.timer.kind.get()
        parks = isinstance(batch, parking.Parking)
        retries = isinstance(batch, parking.RetryLater)  # a failure, counted when it was settled
        if isinstance(result, Committed) and parks:
            report.parked += 1
            report.parked_kinds[kind] = report.parked_kinds.get(kind, 0) + 1
        elif isinstance(result, Committed):
            if not retries:
                report.fired += 1
                report.fired_kinds[kind] = report.fired_kinds.get(kind, 0) + 1
            else:
                _left_backed_off(report, key)
            for k, v in batch.writes:
                if v is not None and k[:_TAG_LEN] == keys.TAG:  # keys.is_timer_key inline: per put of each outcome
                    _put_due(report, k)
        elif isinstance(result, Refused):
            # This outcome alone fails; the row stays backed off and fires again (the handler may
            # answer differently then): never requeued in front of the other commits.
            if not (parks or retries):  # their failed attempt is counted already
                _count_failed(report, kind)
            _left_backed_off(report, key)
            log.error("%s: the store refused its outcome batch (%s: %s); it stays backed off",
                      _name(partition, claimed), type(result.error).__name__, printable(str(result.error)))
        elif result.key == key:
            report.raced += 1
        elif parks:
            log.info("%s: its parking failed its guard; it parks when it next comes due",
                     _name(partition, claimed))
        elif retries:
            log.info("%s: the record of its failure failed its guard (the timer moved meanwhile)", _name(partition, claimed))
        else:
            _count_failed(report, kind)
            _left_backed_off(report, key)
            log.info("%s: its outcome batch failed its guard on the row %s; it stays backed off",
                     _name(partition, claimed), names.reference_text(result.key))
    if fired:
        report.fired += fired
        counts = report.fired_kinds
        for kind, n in fired_kinds.items():
            counts[kind.get()] = counts.get(kind.get(), 0) + n


def _put_due(report: RunReport, key: bytes) -> None:
    """An outcome committed a put of the timer row ``key``: its due time may be the earliest."""
    try:
        due_ms = keys.parse(key).due_at_ms
    except keys.MalformedKey:
        return
    if report.earliest_put_ms is None or due_ms < report.earliest_put_ms:
        report.earliest_put_ms = due_ms


def _left_backed_off(report: RunReport, key: bytes) -> None:
    """The claimed row ``key`` stays at its backoff key, due at its retry time, which may have passed
    while the handler ran (the runner's last wake skipped it, in flight then): wake for it."""
    due_ms = keys.parse(key).due_at_ms
    if report.earliest_put_ms is None or due_ms < report.earliest_put_ms:
        report.earliest_put_ms = due_ms


def _name(partition: str, claimed: ClaimedTimer) -> str:
    timer = claimed.timer
    return names.timer_name(partition, timer.kind, timer.reference, handler=claimed.handler, attempt=timer.attempt,
                            due_at_ms=timer.due_at_ms, occurrence=claimed.schedule is not None)


def _count_failed(report: RunReport, kind: int) -> None:
    report.failed += 1
    report.failed_kinds[kind] = report.failed_kinds.get(kind, 0) + 1


def wake_request(partition: str, now_ms: int) -> tuple:
    """The :meth:`Store.scan_many` request for the first page :func:`next_wake` reads (the rows due
    after ``now_ms``, Unix epoch ms), whose answer may be passed to it as ``future``."""
    start, end = keys.future_range(now_ms)
    return partition, start, end, None, 1


def next_wake(store: Store, partition: str, now_ms: int, report: RunReport, future: Optional[Page] = None) -> Optional[int]:
    """Phase 4: set and return ``report.next_wake_ms`` (Unix epoch ms, or None).

    ``now_ms`` when due rows were left (deferred or stopped on budget) and this tick made
    progress (moved some row off the due range); ``now_ms + 5 s`` when rows were left but
    nothing moved; otherwise the earliest of the next future due time (one scan, not read when
    ``report.earliest_put_ms`` or ``report.earliest_unknown_ms`` is ``now_ms`` or earlier, which
    makes the answer ``now_ms`` whatever it finds) and those two, never earlier than ``now_ms``; None
    when the partition holds no well-formed timer. ``future``: the answer to :func:`wake_request`, read by the caller
    (with other partitions' in one :meth:`Store.scan_many`), or None to read it here.
    """
    if not needs_wake_scan(report):
        report.next_wake_ms = now_ms if report.moved else now_ms + NO_PROGRESS_WAKE_MS
        return report.next_wake_ms
    known = [t for t in (report.earliest_put_ms, report.earliest_unknown_ms) if t is not None]
    if known and min(known) <= now_ms:
        # A row this tick put (or left) is due already: the wake is now whatever the scan would find,
        # so it is not read (a tick catching up a backlog, a schedule's missed occurrences).
        report.next_wake_ms = now_ms
        return now_ms
    future_due = _next_future_due(store, partition, now_ms, future)
    candidates = known if future_due is None else known + [future_due]
    report.next_wake_ms = max(min(candidates), now_ms) if candidates else None
    return report.next_wake_ms


def needs_wake_scan(report: RunReport) -> bool:
    """Whether :func:`next_wake` reads the store for ``report`` (it does not when rows were left)."""
    return not (report.stopped_on_budget or report.deferred)


def _next_future_due(store: Store, partition: str, now_ms: int, page: Optional[Page] = None) -> Optional[int]:
    # The first row is read alone (wake_request): it is nearly always a well-formed key, and the
    # rows after it (the claimed rows in flight, a backlog of thousands) would be read for nothing.
    if page is None:
        page = store.scan(*wake_request(partition, now_ms))
    start, end = keys.future_range(now_ms)
    after = None
    while True:
        if page is None:
            page = store.scan(partition, start, end, after, PAGE)
        for key, _ in page.entries:
            try:
                return keys.parse(key).due_at_ms
            except keys.MalformedKey:
                continue
        if page.next is None:
            return None
        after, page = page.next, None


@dataclass
class Pace:
    """What :func:`run_due` learned of its handlers' speed: ``fire_s``, the mean seconds per fire of
    the last tick that fired (None before any). Pass the same Pace to every tick of one runner so
    that a tick's first chunk is sized from the previous one's: one row for a runner never seen."""

    fire_s: Optional[float] = None


def run_due(store: Store, partition: str, registry: TimerRegistry, now_ms: int, budget: TickBudget = DEFAULT_BUDGET,
            *, pace: Optional[Pace] = None, clock: Callable[[], float] = time.monotonic) -> RunReport:
    """Fire the due timers of one partition, within ``budget``; return a :class:`RunReport`.

    The sequential composition of the phases: claim a chunk of rows, fire each with
    :func:`fire` (an ``async def`` handler on an event loop of its own; from a thread whose loop is
    running, that is the attempt's failure), then commit the chunk's outcomes in the same ``apply_many`` round trip
    (one transaction) as the next chunk's claims, each batch guarded on its own row;
    repeat, then :func:`next_wake`. A chunk holds as many rows as the mean fire time (of
    this tick, else ``pace.fire_s``; one row without either) lets finish within what is left
    of ``max_elapsed_ms``, at most a page: a slow handler cannot stretch a tick far past its
    budget, and fast handlers get full pages.

    Args:
        store: the backend.
        partition: the partition to serve.
        registry: handlers by kind.
        now_ms: the tick's time, Unix epoch ms; rows with effective due <= now_ms are due,
            and backoff delays count from it.
        budget: limits of this tick.
        pace: the runner's :class:`Pace`, read and updated (None: a fresh one).
        clock: monotonic seconds (default :func:`time.monotonic`), for the budget and the pace.

    Raises:
        TypeError / ValueError: bad arguments.
        StoreError (or another exception from the store): rows already processed stay
            processed, the rest wait for the next tick.
    """
    now_ms = check_args(partition, registry, now_ms, budget)
    pace = Pace() if pace is None else pace
    claimer = Claimer(store, partition, registry, now_ms, budget, clock=clock)
    report = claimer.report
    per_fire_s = pace.fire_s
    fired_s, fires = 0.0, 0
    pairs: list = []  # the previous chunk's outcomes, committed with the next chunk's claims
    while not claimer.done:
        left_s = budget.max_elapsed_ms / 1000 - (clock() - claimer.started)
        chunk = 1 if per_fire_s is None else PAGE if per_fire_s <= 0 else max(1, min(PAGE, int(left_s / per_fire_s)))
        rows, batches = claimer.select(chunk)
        results = store.apply_many(partition, [b for _, b in pairs] + batches)
        _count_outcomes(partition, [c for c, _ in pairs], [b for _, b in pairs], results[:len(pairs)], report)
        claimed = claimer.claimed(rows, results[len(pairs):])
        t0 = clock()
        settled = [(c, fire(store, partition, now_ms, c, report, clock)) for c in claimed]
        fired_s += clock() - t0
        fires += len(claimed)
        pairs = [(c, b) for c, b in settled if b is not None]
        if fires:
            per_fire_s = fired_s / fires
    if pairs:
        commit_outcomes(store, partition, pairs, report)
    if fires:
        pace.fire_s = fired_s / fires
    next_wake(store, partition, now_ms, report)
    return report

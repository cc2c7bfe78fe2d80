"""Timers by name, from any process: :func:`schedule`, :func:`cancel`, :func:`reschedule`,
:func:`requeue`, :func:`get_timer` and :func:`list_timers` write and read timer rows directly.

A pending timer is named by its identity (partition, kind, reference), and a partition holds at most
one pending timer per identity: its identity row (:func:`~.keys.identity`) says where the timer is,
scheduled, backed off after a failed attempt, or parked after its last (:mod:`.parking`); while a
first attempt is claimed it names the scheduled key still, and the claimed row is found from it
(:func:`~.keys.first_claim`). Every write here reads the identity row and the timer's row and commits
guarded on both (``Equals``), moving or deleting that row in the same batch; a claim or an outcome
that moves the timer meanwhile fails the guard, and the write reads again. This is the
named job of APScheduler's ``add_job(id=..., replace_existing=...)`` and procrastinate's queueing
lock, kept in the store's guarded batches.

A web or API process that only *writes* timers needs neither a registry nor a running service: it
writes the row, and the store's change signal (:meth:`Store.watch`) wakes every runner serving the
partition, in this process or another. :class:`timerwheel_c.durable.service.service.DurableTimerService`
wraps these, adding a check of the kind against its registry and an in-process wake-up.

With ``conn=``, :func:`schedule`, :func:`cancel` and :func:`reschedule` write through the caller's
own open connection instead, inside its transaction, so that a timer and the application's own rows
commit together or not at all (River's ``InsertTx``, procrastinate's ``connection=``). Each writer is
written once, as steps (:mod:`.steps`) that :func:`write` runs on either connection and that
:mod:`timerwheel_c.durable.aio` awaits on a psycopg ``AsyncConnection``.
"""
from __future__ import annotations

import dataclasses
import heapq
import warnings
from dataclasses import dataclass
from typing import Iterator, Optional, TypeVar

from . import keys, parking, tracing
from .codecs import encoded
from .due import due_at_ms_of, due_or_delay
from .kind_names import check_kind_names
from .partitions import partition_of
from .steps import APPLY, GET, GET_THROUGH, SCAN, Steps, run_steps
from ..storage.errors import PicklesItsArguments
from ..storage.joined import joined
from ..storage.store import Absent, Batch, Committed, Equals, PartitionCalls, Store, check_partition, check_store

__all__ = ["IF_EXISTS", "STATES", "PendingTimer", "TimerExists", "cancel", "cancel_steps", "check_kind_name", "get_timer",
           "get_timer_steps", "in_schedule_order", "list_timers", "on_store", "requeue", "requeue_steps", "reschedule",
           "reschedule_steps", "schedule", "schedule_steps", "timers_in_order", "write"]

T = TypeVar("T")

IF_EXISTS = ("replace", "keep", "error")
STATES = ("scheduled", "retrying", "parked")


class TimerExists(PicklesItsArguments, ValueError):
    """:func:`schedule` with ``if_exists="error"`` found a pending timer of that identity; ``.timer``
    is that :class:`PendingTimer`."""

    def __init__(self, timer: "PendingTimer"):
        super().__init__(f"partition {timer.partition!r} already has a pending timer of kind {int(timer.kind)} "
                         f"reference {timer.reference[:64]!r}, due {timer.due_at_ms} ms ({timer.state})")
        self.timer = timer
        self._arguments = ((timer,), {})


@dataclass(frozen=True)
class PendingTimer:
    """A pending timer as :func:`get_timer` and :func:`list_timers` report it.

    ``due_at_ms``: the time it fires next, Unix epoch ms: its due time, or for a ``"retrying"``
    timer (``attempt`` >= 1 attempts failed or are in flight) the time of its next attempt; for a
    ``"parked"`` timer, which never fires until :func:`requeue`, the time it was due.
    ``state``: ``"scheduled"``, ``"retrying"`` or ``"parked"`` (its ``attempt`` attempts used up).
    ``last_error``: for a parked or a retrying timer, its last failed attempt's error (``"TypeError:
    message"``, passwords masked, at most :data:`~.keys.MAX_ERROR_BYTES` UTF-8 bytes); else None.
    ``parked_at_ms``: for a parked timer, when it was parked (Unix epoch ms); else None.
    ``schedule``: True for a recurring schedule's occurrence, whose ``reference`` is the
    schedule's name (a one-off timer of that name is another timer; the by-name writers reach only
    one-off timers, and the schedule functions its occurrences).
    """

    partition: str
    kind: keys.TimerKind
    reference: bytes
    value: bytes
    due_at_ms: int
    attempt: int
    state: str
    last_error: Optional[str] = None
    parked_at_ms: Optional[int] = None
    schedule: bool = False

    @classmethod
    def of_row(cls, partition: str, key: bytes, value: bytes) -> "PendingTimer":
        """The timer of the stored row (``key``, ``value``), a timer row or a parked row.

        Raises:
            MalformedKey: a malformed key (or a parked row's malformed value).
        """
        if keys.is_parked_key(key):
            tk = keys.parse_parked(key)
            try:
                last_error, value = keys.parked_parts(value)
            except ValueError as exc:
                raise keys.MalformedKey(key, str(exc)) from None
            return cls(partition, keys.TimerKind(tk.kind), tk.reference, value, tk.original_due_at_ms, tk.attempt,
                       "parked", last_error, tk.due_at_ms, tk.occurrence)
        tk = keys.parse(key)
        return cls(partition, keys.TimerKind(tk.kind), tk.reference, value, tk.due_at_ms, tk.attempt,
                   "retrying" if tk.attempt else "scheduled", schedule=tk.occurrence)


def _timer_value(key: bytes, value: bytes) -> bytes:
    """The timer's own value of the stored row (``key``, ``value``): a parked row's without its error."""
    return keys.parked_parts(value)[1] if keys.is_parked_key(key) else value


_LOOKUPS = 64  # reads of a timer's row while concurrent commits keep moving it, before it counts as missing


def _forget_error(batch: Batch, current: bytes, identity: bytes) -> Batch:
    """``batch``, which moves or removes the timer row ``current``, with the delete of the last error
    its failed attempts may have kept (a scheduled row never has one) and of the trace context its
    writer may have kept (any row may have one). Their keys are bytes made from ``identity``'s:
    appended to the batch's writes as they are."""
    writes = batch.writes
    writes.append((keys.trace_context_row(identity), None))
    if keys.may_keep_an_error(current):
        writes.append((keys.last_error_row(identity), None))
    return batch


def _current(identity: bytes, read: Optional[tuple] = None) -> Steps[tuple]:
    """``(named, timer key or None, its value or None)``: the key the identity row names (None when
    there is none), where the timer is, and that row. The two differ only while a plain timer is
    claimed for its first attempt: that claim leaves the identity row naming the scheduled key, and
    the claimed row is found in :func:`~.keys.first_claim`'s range. A by-name write guards on both
    (``Equals(identity, named)``, ``Equals(key, value)``), so a claim that moves the row after it was
    read fails the write's guard instead of leaving it to delete a row that is gone.

    The identity row and the row it names are read in one statement (``get_through``), so a move
    (a runner's claim, a reschedule, a parking: both rows rewritten in one commit) is seen wholly or
    not at all. Only the search of a first claim's range is a statement of its own: a move committed
    before it makes the reads start again, up to :data:`_LOOKUPS` times (an identity row that keeps
    pointing at no row belongs to no pending timer). ``read``: the first reading, ``(named, value)`` of a
    ``get_through`` the caller made already (:func:`_schedule`'s), counted as the first lookup."""
    for _ in range(_LOOKUPS):
        named, value = (yield GET_THROUGH, identity) if read is None else read
        read = None
        if named is None:
            return None, None, None
        if value is not None:
            return named, named, value
        claimed = yield from _first_claim(named)
        if claimed is not None:
            return (named, *claimed)
    return named, named, None


def _guarded(batch: Batch, identity: bytes, named: bytes, current: bytes, value: Optional[bytes]) -> Batch:
    """``batch`` guarded on what :func:`_current` read: the identity row naming ``named``, and the timer's
    row ``current`` holding ``value`` (when there is one; last, so that the store's delete of it judges it)."""
    guards = batch.guards
    guards.append(Equals(identity, named))  # Equals checks its key and value are bytes
    if value is not None:
        guards.append(Equals(current, value))
    return batch


_SEARCH_PAGE = 256  # rows per read of the range where a first claim may have moved a timer


def _first_claim(scheduled: bytes) -> Steps[Optional[tuple]]:
    """``(key, value)`` of the row that the first claim of the scheduled row ``scheduled`` moved it to,
    or None. Reads the rows due from its due time until that claim's retry time: those fired within
    one backoff of it, and the backlog before it."""
    where = keys.first_claim(scheduled)
    if where is None:
        return None
    start, end, tail = where
    at = len(start)
    while True:
        rows = yield SCAN, (start, end, _SEARCH_PAGE)
        for key, value in rows:
            if key[at:] == tail:
                return key, value
        if len(rows) < _SEARCH_PAGE:
            return None
        start = rows[-1][0] + b"\0"


def _checked_identity(store: Store, partition: str, kind, reference: bytes) -> bytes:
    """The identity row's key of (``kind``, ``reference``), once ``store``, the name and ``partition``
    are checked in that order (TypeError / ValueError naming the bad one)."""
    check_store(store)
    identity = keys.identity(kind, reference)
    check_partition(partition)
    return identity


def write(store: Store, partition: str, steps: Steps[T], conn=None) -> T:
    """Run a writer's ``steps`` (:mod:`.steps`) on ``partition``: on the store's own connection
    (:meth:`~timerwheel_c.durable.storage.store.Store.own_write`: one transaction on SQLite, each
    apply its own on PostgreSQL), or with ``conn`` through the caller's connection inside its open
    transaction (:mod:`~timerwheel_c.durable.storage.joined`), committed only when the caller commits.

    Raises:
        TypeError / ValueError: ``conn`` cannot carry this store's writes (naming why).
        Exception: whatever the steps or the store raise.
    """
    if conn is None:
        keys.declare_signals(store)
        with store.own_write(partition) as tx:
            return run_steps(steps, tx)
    # No declare_signals here: until some process declares them every write signals (more wake-ups,
    # none missed), runners declare them when they start, and declaring them may rebuild the
    # trigger on the store's own connection, which waits for every lock on the table: one the
    # caller's transaction may already hold.
    with joined(store, conn, partition) as tx:
        return run_steps(steps, tx)


def on_store(store: Store, partition: str, steps: Steps[T]) -> T:
    """Run ``steps`` on ``partition`` through the store's own ``get`` and ``apply``: each apply its own
    transaction, each read outside any (the guards judge what was read)."""
    return run_steps(steps, PartitionCalls(store, partition))


def schedule(store: Store, partition: Optional[str], due_at_ms, kind, reference: bytes, value: object = b"", *,
             if_exists: str = "replace", conn=None, delay=None) -> bytes:
    """Arm the timer named (``partition``, ``kind``, ``reference``) for ``due_at_ms`` with ``value``;
    return the key of the pending timer row (bytes).

    ``if_exists`` says what becomes of a pending timer of that name (scheduled or retrying):
    ``"replace"`` moves it to the new due time and value (attempts start again), ``"keep"`` leaves
    it as it is (insert-if-absent, for deduplication; its key is returned), ``"error"`` raises
    :class:`TimerExists`. A parked timer of that name is replaced whatever ``if_exists`` says (as
    a failed job does not hold procrastinate's queueing lock, nor a failed workflow its id in
    Temporal): the new timer is a new start. A timer whose handler is running is pending: replacing it arms the new one
    and the running attempt's outcome no longer commits.

    With ``conn``, the timer exists if and only if the caller commits that connection's transaction
    (River's ``InsertTx``, procrastinate's ``connection=``), and runners are woken on that commit.

    Args:
        store: the backend.
        partition: a non-empty str, or None for the partition derived from ``reference``
            (:func:`~.partitions.partition_of`: ``"ref:"`` and a hash of it).
        due_at_ms: Unix epoch ms (int), a timezone-aware datetime, or a ``datetime.timedelta`` from
            now; an int below 10**11 (before 1973, plausibly seconds) is accepted and logged at
            WARNING. None with ``delay``.
        kind: 1..255, an int or a :class:`TimerKind`.
        reference: opaque bytes naming the timer among those of its kind.
        value: bytes handed to the handler; any value its codec encodes for a kind with a codec
            (``TimerKind(1, "name", codec="json")``), handed to the handler decoded.
        conn: None (the store's own connection, the write committed at once), or the caller's open
            connection to the store's database, the write then part of its transaction: a
            ``sqlite3.Connection`` for a :class:`SQLiteStore`, a ``psycopg.Connection`` for a
            ``PostgresStore`` (what it must be: :mod:`timerwheel_c.durable.storage.joined`).
        delay: instead of ``due_at_ms``, seconds from now (an int or float >= 0, rounded up to the ms).
            A relative due time counts from this host's wall clock when the call is made.

    Raises:
        TimerExists: ``if_exists="error"`` and a timer of that name is pending (with ``conn``, the
            caller's transaction stays usable).
        TypeError / ValueError: a bad argument, naming it (a naive datetime, a kind out of
            1..255, a non-bytes reference or value, an empty partition, an unknown ``if_exists``,
            a ``conn`` that cannot carry the write).
        KindNameMismatch: a named kind the store records under another name (checked without ``conn``).
        Exception: whatever the store raises.
    """
    partition = partition_of(partition, reference)
    steps = schedule_steps(store, partition, due_or_delay(due_at_ms, delay), kind, reference, value, if_exists)
    check_kind_name(store, kind, conn)
    return write(store, partition, steps, conn)


def check_kind_name(store: Store, kind, conn=None) -> None:
    """Refuse a writer whose name for ``kind`` (a :class:`TimerKind`; an int has none) differs from
    the one ``store`` records, recording it where none is (:func:`~.kind_names.check_kind_names`),
    before a write on the store's own connection; with ``conn`` nothing is checked, since inside the
    caller's transaction (on SQLite, holding the file's write lock) the record would wait for it.

    Raises:
        KindNameMismatch: the store records another name for ``kind``.
        StoreError: the store failed.
    """
    if conn is None and getattr(kind, "name", None) is not None:  # a kind without a name has nothing to check
        check_kind_names(store, [kind])


def schedule_steps(store: Store, partition: str, due_at_ms, kind, reference: bytes, value: object,
                   if_exists: str) -> Steps[bytes]:
    """:func:`schedule`'s arguments checked (raising as it does), and its steps to :func:`write`."""
    check_store(store)
    key = keys.timer(due_at_ms_of(due_at_ms), kind, reference)
    identity = keys.identity(kind, reference)
    value = encoded(kind, value)
    keys.check_value("value", value)
    check_partition(partition)
    if if_exists not in IF_EXISTS:
        raise ValueError(f"if_exists must be one of {IF_EXISTS}, got {if_exists!r}")
    traced = tracing.traceparent()
    context = None if traced is None else keys.trace_context_value(keys.parse(key).due_at_ms, traced)
    return _schedule(partition, key, identity, value, if_exists, context)


def _schedule(partition: str, key: bytes, identity: bytes, value: bytes, if_exists: str,
              context: Optional[bytes] = None) -> Steps[bytes]:
    """The steps of a schedule; ``context``: the value of the timer's trace context row to write
    (:func:`~.keys.trace_context_value`), None for none."""
    while True:
        # _current's first reading made here: a timer found where its identity row says (or none, its
        # identity row absent) needs no generator of _current's (a re-arm by name makes one per call).
        named, current_value = yield GET_THROUGH, identity
        if named is None or current_value is not None:
            current = named
        else:
            named, current, current_value = yield from _current(identity, (named, current_value))
        if current_value is not None and if_exists != "replace" and not keys.is_parked_key(current):
            if if_exists == "keep":
                return current
            raise TimerExists((yield from _pending(partition, identity, current, current_value)))
        # The keys are made by keys.timer and keys.identity, the value checked by schedule_steps (or
        # bulk's own checks): the writes are appended as they are, without Batch.put's checks again.
        if named is None:
            batch = Batch([Absent(identity)], [])
        else:
            batch = _forget_error(_guarded(Batch([], [(current, None)]), identity, named, current, current_value),
                                  current, identity)
        writes = batch.writes
        if context is not None:  # after the delete of the replaced timer's: a later write wins
            writes.append((keys.trace_context_row(identity), context))
        writes.append((key, value))
        writes.append((identity, key))
        if isinstance((yield APPLY, batch), Committed):
            return key


def cancel(store: Store, partition: Optional[str], kind, reference: bytes, *, conn=None) -> bool:
    """Remove the pending timer named (``partition``, ``kind``, ``reference``), scheduled, retrying or
    parked; True if this call removed one. A timer cancelled once a runner has claimed it (its handler running,
    or queued for a free slot of the runner's) does not fire again, but that call may still be made, or
    finish: its outcome's writes commit only if they commit before the cancel, and its other effects are the
    handler's (at-least-once, as a claimed job in procrastinate or a started activity in Temporal).

    Args:
        conn: None, or the caller's connection, as in :func:`schedule`.

    Raises:
        TypeError / ValueError: a bad argument, naming it.
        KindNameMismatch: a named kind the store records under another name (checked without ``conn``).
        Exception: whatever the store raises.
    """
    partition = partition_of(partition, reference)
    steps = cancel_steps(store, partition, kind, reference)
    check_kind_name(store, kind, conn)
    return write(store, partition, steps, conn)


def cancel_steps(store: Store, partition: str, kind, reference: bytes) -> Steps[bool]:
    """:func:`cancel`'s arguments checked (raising as it does), and its steps to :func:`write`."""
    return _cancel(_checked_identity(store, partition, kind, reference))


def _cancel(identity: bytes) -> Steps[bool]:
    while True:
        named, current, current_value = yield from _current(identity)
        if named is None:
            return False
        batch = _forget_error(_guarded(Batch(), identity, named, current, current_value).delete(current).delete(identity),
                              current, identity)
        if isinstance((yield APPLY, batch), Committed):
            return current_value is not None


def in_schedule_order(due_at_ms, kind, reference, *, function: str = "reschedule", due: str = "due_at_ms") -> tuple:
    """``(due_at_ms, kind, reference)`` of a call of ``function`` (:func:`reschedule`, :func:`requeue`),
    whose due time parameter is named ``due``, in :func:`schedule`'s order.

    Before that order, both took ``(kind, reference, due)``. A call in the old order is told apart
    without doubt: its reference (bytes) lands where the kind goes, which no kind is. Such a call
    is put in order with a DeprecationWarning; the old order will be refused in a later release.

    Raises:
        TypeError: ``kind`` or ``reference`` is missing.
    """
    if isinstance(kind, (bytes, bytearray, memoryview)):
        warnings.warn(f"{function}(store, partition, kind, reference, {due}) is deprecated: pass the arguments in "
                      f"schedule()'s order, {function}(store, partition, {due}, kind, reference), or by keyword",
                      DeprecationWarning, stacklevel=3)
        due_at_ms, kind, reference = reference, due_at_ms, kind
    if kind is None or reference is None:
        raise TypeError(f"{function} needs a kind and a reference, got kind={kind!r}, reference={reference!r}")
    return due_at_ms, kind, reference


def reschedule(store: Store, partition: Optional[str], due_at_ms=None, kind=None, reference: Optional[bytes] = None, *,
               conn=None, delay=None) -> bool:
    """Move the pending timer named (``partition``, ``kind``, ``reference``) to ``due_at_ms`` (Unix
    epoch ms, an aware datetime or a timedelta from now) or ``delay`` seconds from now, its value
    kept and its attempts started again (a parked timer is put back, as by :func:`requeue`); True
    if a timer was pending (and so moved), False if none was.

    The arguments come in :func:`schedule`'s order (``due_at_ms`` None with ``delay``:
    ``reschedule(store, partition, None, kind, reference, delay=60)``, or by keyword). The former
    order, ``(kind, reference, due_at_ms)`` positionally, still works with a DeprecationWarning
    (:func:`in_schedule_order`); a call giving ``kind`` and ``reference`` positionally in that order
    and ``due_at_ms`` by keyword now raises TypeError (two values for ``due_at_ms``): pass all three
    by keyword.

    Args:
        conn: None, or the caller's connection, as in :func:`schedule`.

    Raises:
        TypeError / ValueError: a bad argument, naming it.
        KindNameMismatch: a named kind the store records under another name (checked without ``conn``).
        Exception: whatever the store raises.
    """
    due_at_ms, kind, reference = in_schedule_order(due_at_ms, kind, reference)
    partition = partition_of(partition, reference)
    steps = reschedule_steps(store, partition, kind, reference, due_or_delay(due_at_ms, delay))
    check_kind_name(store, kind, conn)
    return write(store, partition, steps, conn)


def requeue(store: Store, partition: str, due_at=None, kind=None, reference: Optional[bytes] = None) -> bool:
    """Put the timer named (``partition``, ``kind``, ``reference``) back to scheduled, due at
    ``due_at`` (Unix epoch ms or an aware datetime, as :func:`schedule` takes; None: now), with its
    attempt count reset and its value kept: a parked timer after its handler is fixed, or a retrying
    one to run now instead of after its backoff. True if the timer existed (parked, retrying or
    scheduled), False if none of that name does. The write is guarded on the timer's identity
    row and its row, as every write here, and wakes the runners serving the partition.

    The arguments come in :func:`schedule`'s order (due now: ``requeue(store, partition, None,
    kind, reference)``, or by keyword). The former order, ``(kind, reference, due_at)``
    positionally, still works with a DeprecationWarning (:func:`in_schedule_order`); a call giving
    ``kind`` and ``reference`` positionally in that order and ``due_at`` by keyword now raises
    TypeError (two values for ``due_at``): pass all three by keyword.

    A schedule's parked occurrence is not a timer of its own: ``resume_schedule`` puts its schedule
    back to work.

    Raises:
        TypeError / ValueError: a bad argument, naming it.
        KindNameMismatch: a named kind the store records under another name.
        Exception: whatever the store raises.
    """
    due_at, kind, reference = in_schedule_order(due_at, kind, reference, function="requeue", due="due_at")
    steps = requeue_steps(store, partition, kind, reference, due_at)
    check_kind_name(store, kind)
    return write(store, partition, steps)


def requeue_steps(store: Store, partition: str, kind, reference: bytes, due_at=None) -> Steps[bool]:
    """:func:`requeue`'s arguments checked (raising as it does), and its steps to :func:`write`."""
    return reschedule_steps(store, partition, kind, reference, parking.wall_ms() if due_at is None else due_at)


def reschedule_steps(store: Store, partition: str, kind, reference: bytes, due_at_ms) -> Steps[bool]:
    """:func:`reschedule`'s (and :func:`requeue`'s) arguments checked (raising as they do), and the
    steps to :func:`write` that move the timer of that name, wherever it is (a parked one too), to its
    scheduled row at ``due_at_ms``."""
    check_store(store)
    key = keys.timer(due_at_ms_of(due_at_ms), kind, reference)
    identity = keys.identity(kind, reference)
    check_partition(partition)
    return _reschedule(key, identity)


def _reschedule(key: bytes, identity: bytes) -> Steps[bool]:
    while True:
        named, current, current_value = yield from _current(identity)
        if current_value is None:
            return False
        if current == key:
            return True
        batch = _guarded(Batch(), identity, named, current, current_value).delete(current)
        _forget_error(batch, current, identity)
        if isinstance((yield APPLY, batch.put(key, _timer_value(current, current_value)).put(identity, key)),
                      Committed):
            return True


def get_timer(store: Store, partition: Optional[str], kind, reference: bytes) -> Optional[PendingTimer]:
    """The pending timer named (``partition``, ``kind``, ``reference``), or None.

    Raises:
        TypeError / ValueError: a bad argument, naming it.
        Exception: whatever the store raises.
    """
    partition = partition_of(partition, reference)
    return on_store(store, partition, get_timer_steps(store, partition, kind, reference))


def get_timer_steps(store: Store, partition: str, kind, reference: bytes) -> Steps[Optional[PendingTimer]]:
    """:func:`get_timer`'s arguments checked (raising as it does), and its steps (reads only)."""
    return _timer(partition, _checked_identity(store, partition, kind, reference))


def _timer(partition: str, identity: bytes) -> Steps[Optional[PendingTimer]]:
    _, current, current_value = yield from _current(identity)
    if current_value is None:
        return None
    return (yield from _pending(partition, identity, current, current_value))


def _pending(partition: str, identity: bytes, current: bytes, value: bytes) -> Steps[PendingTimer]:
    """The pending timer of the row (``current``, ``value``) that ``identity`` names, with its last
    error: a retrying timer keeps it in a row of its own (a parked row carries its own)."""
    timer = PendingTimer.of_row(partition, current, value)
    if timer.state == "retrying":
        timer = _with_error(timer, current, (yield GET, keys.last_error_row(identity)))
    return timer


def _with_error(timer: PendingTimer, key: bytes, kept: Optional[bytes]) -> PendingTimer:
    """The retrying ``timer`` (its row ``key``) with the last error ``kept`` in its error row, if that is its own."""
    error = keys.last_error_text(kept, keys.parse(key))
    return timer if error is None else dataclasses.replace(timer, last_error=error)


_LIST_PAGE = 512  # rows per read of a listing, or its limit's (up to _LIST_PAGE_MAX), so one read serves most
_LIST_PAGE_MAX = 10_000
_STORE_PAGE_MAX = 1_000  # rows per shard per read of a listing of the whole store: shard_count pages are held at once


def list_timers(store: Store, partition: Optional[str], *, kind=None, state: Optional[str] = None,
                limit: int = 1000) -> list:
    """Up to ``limit`` (>= 1) pending timers of ``partition`` (None: of every partition of the store),
    of ``kind`` only and in ``state`` only (``"scheduled"``, ``"retrying"`` or ``"parked"``) when
    given: first those that will fire, in the order they fire next (their ``due_at_ms``), then the
    parked ones, in the order they were parked. Malformed rows are not timers and are left out. The
    rows are read in pages, each at its own instant (:func:`timers_in_order`): a timer that moves
    meanwhile is listed once, where it was read last, and one moved into a part already read may be
    missed. The whole store is read by shard, as a runner's pass reads it: its cost grows with the
    rows read before ``limit`` timers match, never with the number of partitions.

    Raises:
        TypeError / ValueError: a bad argument, naming it.
        Exception: whatever the store raises.
    """
    want_kind = None if kind is None else keys.TimerKind(kind)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an int >= 1, got {limit!r}")
    found: dict = {}
    for timer in timers_in_order(store, partition, state=state, page=limit + 1):
        name = (timer.partition, timer.kind, timer.reference, timer.schedule)
        if name in found:
            del found[name]
        elif len(found) == limit:
            break
        if (want_kind is None or timer.kind == want_kind) and (state is None or timer.state == state):
            found[name] = timer
    return list(found.values())


def timers_in_order(store: Store, partition: Optional[str], *, state: Optional[str] = None,
                    page: int = _LIST_PAGE) -> Iterator[PendingTimer]:
    """Every pending timer of ``partition`` (None: of the whole store), lazily, in :func:`list_timers`'
    order: the rows that will fire by due time (unless ``state`` is ``"parked"``), then the parked
    ones by the time they were parked (when ``state`` is None or ``"parked"``); other states are
    the caller's to filter. Malformed rows are left out. Read about ``page`` rows at a time (at
    least 512 and at most 10,000 from a partition; at most 1,000 from each shard of the whole store,
    the first page of every shard in one :meth:`~Store.scan_shards`), each read a snapshot of its
    own, so a timer moved between two reads may come twice, where it was and where it is. A retrying
    timer's ``last_error`` is read with it (one more read each).

    Raises:
        TypeError / ValueError: a bad argument, naming it.
        Exception: whatever the store raises.
    """
    check_store(store)
    if partition is not None:
        check_partition(partition)
    if state is not None and state not in STATES:
        raise ValueError(f"state must be None or one of {STATES}, got {state!r}")
    ranges = [r for r, wanted in ((keys.timer_range(), state != "parked"), (keys.PARKED_RANGE, state in (None, "parked")))
              if wanted]
    for start, end in ranges:
        if partition is None:
            rows = _store_rows(store, start, end, max(1, min(page, _STORE_PAGE_MAX)))
        else:
            rows = _partition_rows(store, partition, start, end, max(_LIST_PAGE, min(page, _LIST_PAGE_MAX)))
        for where, key, value in rows:
            try:
                timer = PendingTimer.of_row(where, key, value)
            except keys.MalformedKey:
                continue
            if timer.state == "retrying":
                timer = _with_error(timer, key, store.get(where, keys.last_error_row(keys.identity_of(keys.parse(key)))))
            yield timer


def _partition_rows(store: Store, partition: str, start: bytes, end: bytes, page: int) -> Iterator[tuple]:
    """``(partition, key, value)`` of the rows ``start <= key < end`` of ``partition``, in key order, a page at a time."""
    after = None
    while True:
        read = store.scan(partition, start, end, after, page)
        yield from ((partition, key, value) for key, value in read.entries)
        if read.next is None:
            return
        after = read.next


def _store_rows(store: Store, start: bytes, end: bytes, page: int) -> Iterator[tuple]:
    """``(partition, key, value)`` of the rows ``start <= key < end`` of the whole store, in key order
    (rows of one key in the order the store gives them): each shard's rows in key order
    (:meth:`~Store.scan_shards`), merged; the first page of every shard in one read, each shard's
    next when the merge reaches its end. Every shard by the count recorded now
    (:meth:`~Store.scan_every_shard`): another process may have resharded."""
    firsts = store.scan_every_shard(start, end, page)
    return heapq.merge(*(_shard_rows(store, shard, rows, end, page) for shard, rows in enumerate(firsts)),
                       key=_row_key)


def _row_key(row: tuple) -> bytes:
    return row[1]


def _shard_rows(store: Store, shard: int, rows: list, end: bytes, page: int) -> Iterator[tuple]:
    """One shard's rows from its first page ``rows`` on. Each next read starts at the last key read
    again, since rows of other partitions may share it (the same due time, kind and reference), and
    leaves out the partitions already read at that key: the store orders a key's partitions its own
    way (a PostgreSQL database's collation), the same in every read. A read of nothing new that came
    back full is made again twice as large."""
    full = len(rows) >= page
    last_key: bytes = b""  # the last key read, and the partitions read at it
    at_last_key: set = set()
    while True:
        yield from rows
        if not full:
            return
        for partition, key, _ in rows:
            if key != last_key:
                last_key, at_last_key = key, set()
            at_last_key.add(partition)
        while True:
            read = store.scan_shards([shard], last_key, end, page)[0]
            full = len(read) >= page
            rows = [row for row in read if row[1] != last_key or row[0] not in at_last_key]
            if rows or not full:
                break
            page *= 2
        if not rows:
            return

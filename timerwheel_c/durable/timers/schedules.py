"""Recurring schedules in the store: the API (:func:`add_schedule` ... :func:`list_schedules`) and the
two steps the runner takes on an occurrence (:func:`claim_occurrence`, :func:`settle_occurrence`).

A schedule named ``name`` in a partition is two rows (and its pending occurrence's identity row):

- its state, ``keys.schedule_row(name)`` -> :class:`~.schedule_state.ScheduleState` bytes;
- its pending occurrence, a timer row of the schedule's kind with the occurrence variant
  (``keys.timer(next_fire_ms, kind, name, occurrence=True)``) holding the schedule's value. The
  runner scans and claims it with every other timer, so a schedule costs no pass of its own and
  ``run_due`` with a fake clock drives it like any timer.

Exactly once, across a fleet and through SIGKILLs: the claim of a pending occurrence reads the state,
resolves the misfire policy (:func:`~.schedule_state.when_due`) and records the occurrence's nominal
time in the claimed key, guarded on the state it read; the handler's ``Done`` commits its batch,
the delete of the claimed row, the next state (:func:`~.schedule_state.done`) and the next pending
row in one batch guarded on the claimed row and that state. A runner killed before that commit
leaves the claimed row, which comes due again and fires the same occurrence; a commit that raced
another fails its guard. A failure or ``Retry`` leaves the claimed row backed off: the same
occurrence again, and the next one is not computed until this one is done, so occurrences never
overlap. An occurrence that fails its handler's last attempt (``max_attempts``) is parked and its
schedule paused, in one batch guarded on the state the claim read (:func:`park_occurrence`): the
parked occurrence keeps the schedule's occurrence identity, so it is listed (``list_timers``) and
shown by ``get_schedule(...).paused``, and :func:`resume_schedule` drops it and continues the
schedule from its last occurrence done, the parked one then due again under the misfire policy.
Pausing, not moving on, because the next occurrence is never computed before this one is done
(a schedule already waits on a failing occurrence), and because a schedule that would otherwise
park an occurrence at every fire would pile parked rows up unseen; it is Temporal's
``pause_on_failure`` of a schedule. This is the schedule-as-data of APScheduler 4 (a trigger computes the next fire time, the
store keeps it) on the guarded batch of the timer rows.

Adding a name that exists replaces the schedule atomically: the old pending row (scheduled or
backed off, found by its identity row) is deleted in the batch that writes the new state, and an
in-flight attempt of the old schedule fails its guard, so old occurrences never fire again. Added
again with a trigger on the same grid (its jitter, end and ``max_runs`` may differ), or one given no
start (an application that adds its schedules at every start; for a cron, also one whose start is
later but not in the future), the schedule keeps its place on the grid
(:func:`~.schedule_state.replaced`): an occurrence already done is not fired again, one still owed
still fires, and one that was in flight fires again, since its attempt's commit now fails.
"""
from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass
from typing import Optional, Tuple

from . import keys
from .names import iso_utc
from .schedule_state import ScheduleState, done, new_state, paused, replaced, resumed, when_due
from .steps import APPLY, GET, Steps
from .tick import lease_ms
from .triggers import Trigger
from .writer import check_kind_name, on_store, write
from ..storage.store import Absent, Batch, Committed, Equals, Store, check_partition, check_store

__all__ = ["OccurrenceClaim", "ScheduleInfo", "add_schedule", "add_schedule_steps", "claim_occurrence", "get_schedule", "list_schedules",
           "park_occurrence", "pause_schedule", "remove_schedule", "resume_schedule", "schedules_by_shard",
           "settle_occurrence"]

_RNG = random.Random()


@dataclass(frozen=True)
class ScheduleInfo:
    """A schedule as :func:`get_schedule` and :func:`list_schedules` report it (times Unix epoch ms).

    ``next_fire_ms``: when its pending occurrence fires (nominal time + jitter), None when paused or
    when the trigger has no more. ``last_fired_ms``: the nominal time of the last occurrence done, or
    None. ``misfire``, ``misfire_grace_s`` (s), ``catchup_window_s`` (s or None): its misfire policy.
    ``runs``: the occurrences done (counted for a trigger with ``max_runs``, else 0). ``ended``: True
    once it fires no more, past its trigger's ``end`` or ``max_runs`` (or a trigger with no more
    occurrences).
    """

    partition: str
    name: str
    trigger: Trigger
    kind: keys.TimerKind
    value: bytes
    next_fire_ms: Optional[int]
    paused: bool
    last_fired_ms: Optional[int]
    misfire: str
    misfire_grace_s: float
    catchup_window_s: Optional[float]
    runs: int = 0
    ended: bool = False

    @classmethod
    def of_state(cls, partition: str, name: str, state: ScheduleState) -> "ScheduleInfo":
        return cls(partition, name, state.trigger, keys.TimerKind(state.kind), state.value, state.next_fire_ms,
                   state.paused, state.last_fired_ms, state.misfire, state.misfire_grace_s, state.catchup_window_s,
                   state.runs, not state.paused and state.next_nominal_ms is None)


def _name_bytes(name: object) -> bytes:
    if not isinstance(name, str):
        raise TypeError(f"a schedule name must be a str, got {type(name).__name__} {name!r}")
    if not name:
        raise ValueError("a schedule name must be a non-empty str, got ''")
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"a schedule name must be encodable as UTF-8, got {name!r}") from None
    if len(raw) > keys.MAX_REFERENCE_BYTES:  # the occurrences' key holds it as a timer's reference
        raise ValueError(f"a schedule name must be at most {keys.MAX_REFERENCE_BYTES} UTF-8 bytes, got {len(raw)} "
                         f"bytes starting {name[:16]!r}")
    return raw


def _arm(batch: Batch, raw: bytes, state: ScheduleState) -> Batch:
    """Add to ``batch`` the writes of ``state`` and of its pending occurrence row (if any)."""
    batch.put(keys.schedule_row(raw), state.to_bytes())
    identity = keys.occurrence_identity(state.kind, raw)
    if state.next_fire_ms is None:
        return batch.delete(identity)
    key = keys.timer(state.next_fire_ms, state.kind, raw, occurrence=True)
    return batch.put(key, state.value).put(identity, key)


def _disarm(batch: Batch, raw: bytes, state: ScheduleState) -> Steps[Batch]:
    """Add to ``batch`` the guarded delete of ``state``'s pending occurrence row, wherever it is."""
    identity = keys.occurrence_identity(state.kind, raw)
    current = yield GET, identity
    if current is None:
        return batch.require(Absent(identity))
    return batch.require(Equals(identity, current)).delete(current).delete(identity)


def _read(raw: bytes) -> Steps[tuple]:
    """``(state bytes, ScheduleState)`` of the schedule ``raw``, or ``(None, None)``."""
    data = yield GET, keys.schedule_row(raw)
    return (None, None) if data is None else (data, ScheduleState.from_bytes(data))


def add_schedule(store: Store, partition: str, name: str, trigger: Trigger, kind, value: object = b"", *,
                 misfire: str = "once", misfire_grace_s: float = 60.0,
                 catchup_window_s: Optional[float] = None, paused: Optional[bool] = None) -> ScheduleInfo:
    """Add the recurring schedule ``name`` to ``partition``, or replace the one of that name atomically
    (its trigger, kind, value and policy; its old occurrences never fire again; with a trigger on the
    same grid, whatever its jitter, end and ``max_runs``, one on it but for a start it was not given, or
    a cron on it but for a later start not in the future, it keeps its place on the grid, so an occurrence already done never fires again and one
    still owed still fires; added again as it is, it writes nothing, so an occurrence running
    meanwhile commits once). Each occurrence
    reaches the handler of ``kind`` as a DueTimer whose ``due_at_ms`` is its nominal time (Unix epoch
    ms), whose ``reference`` is ``name.encode()`` and whose ``value`` is ``value``.

    Args:
        trigger: an :class:`~.triggers.Every` or a :class:`~.triggers.Cron`.
        kind: 1..255, an int or a TimerKind.
        value: bytes; for a kind with a codec (``TimerKind(..., codec="json")``), any value it
            encodes, as :func:`~.writer.schedule` takes (left out: None at the handler).
        misfire: ``"once"`` (one occurrence for all those missed, the latest), ``"skip"`` (drop those
            more than ``misfire_grace_s`` seconds late) or ``"all"`` (each missed occurrence no older
            than ``catchup_window_s`` seconds, oldest first; required with ``"all"``).
        paused: None (the default) keeps the pause of the schedule it replaces, so an application
            that adds its schedules at every start leaves paused what an operator paused (a new
            schedule starts unpaused); True adds it paused (no occurrence until
            :func:`resume_schedule`); False adds it unpaused, resuming a paused one as
            :func:`resume_schedule` does.

    Raises:
        TypeError / ValueError: a bad argument, naming it.
        KindNameMismatch: a named kind the store records under another name; nothing written.
        Exception: whatever the store raises.
    """
    steps = add_schedule_steps(store, partition, name, trigger, kind, value, misfire=misfire,
                               misfire_grace_s=misfire_grace_s, catchup_window_s=catchup_window_s, paused=paused)
    check_kind_name(store, kind)
    return write(store, partition, steps)


def add_schedule_steps(store: Store, partition: str, name: str, trigger: Trigger, kind, value: object = b"", *,
                       misfire: str = "once", misfire_grace_s: float = 60.0,
                       catchup_window_s: Optional[float] = None,
                       paused: Optional[bool] = None) -> Steps[ScheduleInfo]:
    """:func:`add_schedule`'s arguments checked (raising as it does), and its steps
    (:mod:`.steps`) to :func:`~.writer.write`."""
    check_store(store)
    check_partition(partition)
    raw = _name_bytes(name)
    state = new_state(trigger, kind, value, rng=_RNG, misfire=misfire, misfire_grace_s=misfire_grace_s,
                      catchup_window_s=catchup_window_s)
    if paused is not None and type(paused) is not bool:
        raise TypeError(f"paused must be None, True or False, got {paused!r}")
    return _add(partition, name, raw, state, paused)


def _check_fires(state: ScheduleState) -> None:
    """Raise ValueError, naming the trigger and its end, when ``state``, a schedule started afresh from
    its trigger's start (:func:`~.schedule_state.new_state`), has no pending occurrence: its first comes
    after the trigger's end, so it would be stored, ended at once, and never fire. Judged on the grid
    the schedule is written with, not in the trigger's constructor: a trigger given no start starts
    now, but a schedule added again with it keeps the grid it has (:func:`~.schedule_state.replaced`),
    where an occurrence may still come before the end."""
    if state.next_nominal_ms is not None:
        return
    trigger = state.trigger
    first_ms = trigger.next_after(trigger.start_ms)
    first = "none" if first_ms is None else iso_utc(first_ms)
    end = "none" if trigger.end_ms is None else iso_utc(trigger.end_ms)
    raise ValueError(f"end {end} leaves {trigger!r} no occurrence to fire: its first, at {first}, comes after it")


def _add(partition: str, name: str, raw: bytes, state: ScheduleState, pause: Optional[bool]) -> Steps[ScheduleInfo]:
    while True:
        data, old = yield from _read(raw)
        batch = Batch()
        if old is None:
            _check_fires(state)
            batch.require(Absent(keys.schedule_row(raw)))
            new = paused(state) if pause else state
        else:
            new = replaced(old, state, time.time_ns() // 1_000_000, _RNG)
            if new is state:  # started afresh, not kept on the stored grid
                _check_fires(state)
            if pause or (pause is None and old.paused):
                # An operator's pause outlives the application's next start, which adds it again.
                new = paused(new)
            if dataclasses.replace(new, next_fire_ms=old.next_fire_ms) == old:
                # Added again as it is (an application's every start): nothing is written, so an
                # occurrence in flight still commits, and only once, and a jittered one keeps its draw.
                return ScheduleInfo.of_state(partition, name, old)
            yield from _disarm(batch.require(Equals(keys.schedule_row(raw), data)), raw, old)
        if isinstance((yield APPLY, _arm(batch, raw, new)), Committed):
            return ScheduleInfo.of_state(partition, name, new)


def _change(store: Store, partition: str, name: str, step, *, remove: bool = False) -> bool:
    check_store(store)
    check_partition(partition)
    return write(store, partition, _changed(_name_bytes(name), step, remove))


def _changed(raw: bytes, step, remove: bool) -> Steps[bool]:
    while True:
        data, state = yield from _read(raw)
        if state is None:
            return False
        if not remove and step(state) == state:  # already so: a parked occurrence stays parked
            return True
        batch = yield from _disarm(Batch().require(Equals(keys.schedule_row(raw), data)), raw, state)
        if remove:
            batch.delete(keys.schedule_row(raw))
        else:
            _arm(batch, raw, step(state))
        if isinstance((yield APPLY, batch), Committed):
            return True


def remove_schedule(store: Store, partition: str, name: str) -> bool:
    """Remove the schedule ``name`` and its pending occurrence; True if it existed. An occurrence
    whose handler is running then fails its guard: it never commits.

    Raises:
        TypeError / ValueError: a bad argument. Exception: whatever the store raises.
    """
    return _change(store, partition, name, None, remove=True)


def pause_schedule(store: Store, partition: str, name: str) -> bool:
    """Pause the schedule ``name``: its pending occurrence is removed, and nothing fires until
    :func:`resume_schedule`; True if the schedule exists (paused already or not: a paused
    schedule, its parked occurrence included, is left as it is).

    Raises:
        TypeError / ValueError: a bad argument. Exception: whatever the store raises.
    """
    return _change(store, partition, name, lambda state: state if state.paused else paused(state))


def resume_schedule(store: Store, partition: str, name: str) -> bool:
    """Resume the schedule ``name``: the occurrences missed while paused (a parked occurrence among
    them: its parked row is removed) are resolved by its misfire policy, then it continues on its
    grid; True if the schedule exists.

    Raises:
        TypeError / ValueError: a bad argument. Exception: whatever the store raises.
    """
    return _change(store, partition, name, lambda state: resumed(state, _RNG) if state.paused else state)


def get_schedule(store: Store, partition: str, name: str) -> Optional[ScheduleInfo]:
    """The schedule ``name`` of ``partition``, or None.

    Raises:
        TypeError / ValueError: a bad argument. Exception: whatever the store raises.
    """
    check_store(store)
    check_partition(partition)
    state = on_store(store, partition, _read(_name_bytes(name)))[1]
    return None if state is None else ScheduleInfo.of_state(partition, name, state)


def schedules_by_shard(store: Store, per_shard: int) -> Tuple[list, bool]:
    """``(schedules, more)``: up to ``per_shard`` (an int >= 1) schedules of each of the store's shards,
    by partition then name, and whether a shard holds more. One :meth:`Store.scan_shards`: the read
    costs the same with a million partitions as with one, where :func:`list_schedules` of the whole
    store scans every partition (the status page's read, on every refresh).

    Raises:
        TypeError / ValueError: a bad store or ``per_shard``. Exception: whatever the store raises.
    """
    check_store(store)
    if isinstance(per_shard, bool) or not isinstance(per_shard, int) or per_shard < 1:
        raise ValueError(f"per_shard must be an int >= 1, got {per_shard!r}")
    out, more = [], False
    for rows in store.scan_every_shard(*keys.SCHEDULE_RANGE, per_shard + 1):
        more = more or len(rows) > per_shard
        for partition, key, data in rows[:per_shard]:
            name = bytes(key)[len(keys.SCHEDULE_TAG):].decode("utf-8")
            out.append(ScheduleInfo.of_state(partition, name, ScheduleState.from_bytes(bytes(data))))
    return sorted(out, key=lambda s: (s.partition, s.name)), more


def list_schedules(store: Store, partition: Optional[str] = None) -> list:
    """Every schedule of ``partition`` (None: of every partition), by partition then name.

    Raises:
        TypeError / ValueError: a bad partition. Exception: whatever the store raises.
    """
    check_store(store)
    partitions = store.partitions() if partition is None else [check_partition(partition)]
    out = []
    start, end = keys.SCHEDULE_RANGE
    for p in partitions:
        after = None
        while True:
            page = store.scan(p, start, end, after, 256)
            for key, data in page.entries:
                name = key[len(keys.SCHEDULE_TAG):].decode("utf-8")
                out.append(ScheduleInfo.of_state(p, name, ScheduleState.from_bytes(data)))
            if page.next is None:
                break
            after = page.next
    return out


@dataclass(frozen=True)
class OccurrenceClaim:
    """How the runner claims a due occurrence row: apply ``batch``; when ``nominal_ms`` (Unix epoch ms)
    is not None, fire the occurrence of that nominal time from ``claimed_key``, settling it with the
    schedule's state ``state`` (the bytes read); when it is None, the batch moved the schedule on
    without firing (every due occurrence was dropped by its misfire policy, or the schedule is gone)."""

    batch: Batch
    claimed_key: Optional[bytes]
    nominal_ms: Optional[int]
    state: Optional[bytes]


def claim_occurrence(store: Store, partition: str, key: bytes, value: bytes, tk: keys.TimerKey,
                     now_ms: int, backoff=None, timeout_s: Optional[float] = None) -> Optional[OccurrenceClaim]:
    """The claim of the due occurrence row ``key`` (parsed ``tk``), or None to leave it (woken before
    its occurrence), held for its handler's lease (:func:`~.tick.lease_ms` of ``backoff``, its
    handler's :class:`~.tick.Backoff`, None: the default, and its ``timeout_s``). Reads the
    schedule's state (one get).

    Raises:
        ValueError: the schedule's row is malformed (the caller quarantines the occurrence row).
        Exception: whatever the store raises.
    """
    row_key = keys.schedule_row(tk.reference)
    data = store.get(partition, row_key)
    identity = keys.identity_of(tk)
    guard = Batch()
    if data is None:  # the schedule is gone: its row goes too
        return OccurrenceClaim(guard.require(Absent(row_key)).require(Equals(key, value)).delete(key)
                               .delete(identity), None, None, None)
    state = ScheduleState.from_bytes(data)
    guard.require(Equals(row_key, data)).require(Equals(key, value)).delete(key)
    if tk.attempt:
        nominal_ms = tk.original_due_at_ms
    else:
        step = when_due(state, now_ms, _RNG)
        if step.fire_ms is None:
            if step.state == state:
                return None
            return OccurrenceClaim(_arm(guard, tk.reference, step.state), None, None, None)
        nominal_ms = step.fire_ms
    attempt = min(tk.attempt + 1, keys.MAX_ATTEMPT)
    claimed_key = keys.backoff(min(now_ms + lease_ms(attempt, backoff, timeout_s), keys.MAX_DUE_MS), tk.kind, attempt, nominal_ms,
                               tk.reference, occurrence=True)
    return OccurrenceClaim(guard.put(claimed_key, value).put(identity, claimed_key), claimed_key, nominal_ms, data)


def settle_occurrence(batch: Batch, name: bytes, nominal_ms: int, state: bytes) -> Batch:
    """Add to ``batch`` (the Done of the occurrence at ``nominal_ms`` of schedule ``name``, read in
    state ``state``) the move to the next occurrence, guarded on that state."""
    current = ScheduleState.from_bytes(state)
    return _arm(batch.require(Equals(keys.schedule_row(name), state)), name, done(current, nominal_ms, _RNG))


def park_occurrence(batch: Batch, name: bytes, state: bytes) -> Batch:
    """Add to ``batch`` (:func:`~.parking.park_timer` of an occurrence of the schedule ``name``, whose
    claim read the state ``state``) the pause of the schedule, guarded on that state."""
    current = ScheduleState.from_bytes(state)
    return batch.require(Equals(keys.schedule_row(name), state)).put(keys.schedule_row(name), paused(current).to_bytes())

"""Many timers in few transactions: :func:`schedule_many`, the bulk form of :func:`~.writer.schedule`.

A loop of ``schedule()`` pays a read and a commit per timer. Here the timers of a partition are
written a chunk at a time, one transaction per chunk, set-based where the backend can (PostgreSQL's
``apply_sets``: one statement for a chunk). A chunk is first written as one batch
that assumes every name in it is new (``Absent(identity)`` each); when one is pending (or a name is
taken twice), the chunk is written again as a batch per timer, so that such a name fails only its
own batch, and is then written as ``schedule()`` writes it, which applies ``if_exists`` to it.
So every name rule of ``schedule()`` holds, and the common case, new names, costs no read at all.
"""
from __future__ import annotations

import collections.abc
from typing import Iterable, Optional

from . import keys
from .codecs import encoded
from .due import due_at_ms_of
from .kind_names import KindNameMismatch, check_kind_names
from .partitions import partition_of
from .writer import IF_EXISTS, TimerExists, _schedule, on_store
from ..storage.store import Absent, Batch, PreconditionFailed, Refused, check_partition, check_store

__all__ = ["CHUNK", "check_timers", "schedule_many"]

CHUNK = 2000  # timers per transaction: large enough that a commit's cost is spread thin, small enough
# that one transaction never holds a partition's lock for long (a few tens of ms)


def _checked(index: int, timer: object) -> tuple:
    """``(partition, timer key, identity key, value)`` of ``timers[index]``, checked as schedule() checks
    its arguments (TypeError / ValueError naming the index and the bad value)."""
    if not isinstance(timer, tuple) or len(timer) not in (4, 5):
        raise TypeError(f"timers[{index}] must be a tuple (partition, due_at, kind, reference[, value]), "
                        f"got {type(timer).__name__} {timer!r}")
    partition, due_at, kind, reference = timer[:4]
    value = timer[4] if len(timer) == 5 else b""
    try:
        partition = partition_of(partition, reference)
        key = keys.timer(due_at_ms_of(due_at), kind, reference)
        identity = keys.identity(kind, reference)
        value = keys.check_value("value", encoded(kind, value))
        check_partition(partition)
    except (TypeError, ValueError) as exc:
        if type(exc) in (TypeError, ValueError):
            raise type(exc)(f"timers[{index}]: {exc}") from exc
        # A subclass (a codec's own error) may take other arguments than one message: its base class
        # names the index, the subclass and its message, with the error itself as the cause.
        raise (TypeError if isinstance(exc, TypeError) else ValueError)(
            f"timers[{index}]: {type(exc).__name__}: {exc}") from exc
    return partition, key, identity, value


def _write_chunk(store, partition: str, chunk: list, if_exists: str) -> Optional[TimerExists]:
    """Write ``chunk`` (``(key, identity, value)`` of timers of ``partition``): first as one batch, each
    name assumed new (one set-based statement on PostgreSQL); when some name is pending or given twice,
    as one batch per timer, the names found pending written as schedule() writes them. Returns the
    first TimerExists raised for ``"error"``, or None."""
    identities = {identity for _, identity, _ in chunk}
    if len(identities) == len(chunk):
        # The timer rows, then the identity rows, each in key order: the b-tree is written a page at a
        # time instead of jumping between the two key ranges. Built without Batch.put, whose checks
        # _checked has made already: they were a sixth of the whole call's time.
        writes = [(key, value) for key, _, value in sorted(chunk)]
        writes += [(identity, key) for key, identity, _ in sorted(chunk, key=lambda row: row[1])]
        batch = Batch([Absent(identity) for _, identity, _ in chunk], writes)
        if not isinstance(store.apply(partition, batch), PreconditionFailed):
            return None
    exists = None
    batches = [Batch().require(Absent(identity)).put(key, value).put(identity, key) for key, identity, value in chunk]
    for (key, identity, value), result in zip(chunk, store.apply_many(partition, batches)):
        if isinstance(result, Refused):
            raise result.error
        if isinstance(result, PreconditionFailed):
            try:
                on_store(store, partition, _schedule(partition, key, identity, value, if_exists))
            except TimerExists as exc:
                exists = exists or exc
    return exists


def check_timers(timers: object) -> None:
    """Raise TypeError naming ``timers`` unless it is an iterable of timers (a str or bytes is not)."""
    if isinstance(timers, (str, bytes)) or not isinstance(timers, collections.abc.Iterable):
        raise TypeError(f"timers must be an iterable of timer tuples, got {type(timers).__name__} {timers!r:.80}")


def schedule_many(store, timers: Iterable[tuple], *, if_exists: str = "replace") -> None:
    """Arm every timer of ``timers`` as :func:`~.writer.schedule` would, in a transaction per chunk of
    :data:`CHUNK` timers of one partition.

    Every timer is checked before any is written, so a bad one writes nothing. A name given twice
    ends as a loop of ``schedule()`` calls would leave it (with ``"replace"``, the last one).

    Args:
        store: the backend.
        timers: ``(partition, due_at, kind, reference, value)`` tuples, in ``schedule()``'s argument
            order (``value`` may be left out: ``b""``; ``partition`` may be None, derived from the
            reference as ``schedule()`` derives it); ``due_at`` as ``schedule()`` takes it (Unix
            epoch ms, an aware datetime, a timedelta from now).
        if_exists: as ``schedule()``'s, for each name already pending.

    Raises:
        TypeError / ValueError: ``timers`` is no iterable, a bad timer (``timers[i]: ...`` naming it) or
            ``if_exists``; nothing written.
        KindNameMismatch: a named kind the store records under another name, or two timers naming one
            kind otherwise; nothing written.
        TimerExists: ``if_exists="error"`` and some names were pending: the first of them, once
            every other timer is written.
        StoreError: the store failed or refused a timer; the chunks before it are written.
    """
    check_store(store)
    if if_exists not in IF_EXISTS:
        raise ValueError(f"if_exists must be one of {IF_EXISTS}, got {if_exists!r}")
    check_timers(timers)
    by_partition: dict = {}
    named: dict = {}  # kind number -> the first named TimerKind given for it
    renamed: dict = {}  # kind number -> another name a later timer gives it
    for index, timer in enumerate(timers):
        partition, key, identity, value = _checked(index, timer)
        by_partition.setdefault(partition, []).append((key, identity, value))
        name = getattr(timer[2], "name", None)
        if name is not None and named.setdefault(int(timer[2]), timer[2]).name != name:
            renamed.setdefault(int(timer[2]), name)
    if renamed:  # before any name is recorded: a refused call writes nothing, a kind's name included
        number = min(renamed)
        raise KindNameMismatch(number, renamed[number], named[number].name, where="in an earlier timer of this call")
    check_kind_names(store, named.values())
    keys.declare_signals(store)
    exists: Optional[TimerExists] = None
    for partition, rows in by_partition.items():
        for start in range(0, len(rows), CHUNK):
            found = _write_chunk(store, partition, rows[start:start + CHUNK], if_exists)
            exists = exists or found
    if exists is not None:
        raise exists

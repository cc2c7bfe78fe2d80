"""Scheduling from any process: :func:`schedule` and :func:`cancel` write timer rows directly.

A web or API process that only *writes* timers needs neither a registry nor a running
service: it writes the row, and the store's change signal (:meth:`Store.watch`) wakes
every runner serving the partition, in this process or another. This is the shape of
procrastinate's ``defer`` and APScheduler 4's ``add_schedule`` beside separate workers.
:class:`timerwheel_c.durable.service.DurableTimerService` wraps both, adding a check of
the kind against its registry and an in-process wake-up.
"""
from __future__ import annotations

from . import keys
from .due import due_at_ms_of
from ..storage.store import Batch, Committed, Equals, Store, check_bytes, check_partition, check_store

__all__ = ["cancel", "schedule"]


def schedule(store: Store, partition: str, due_at_ms, kind, reference: bytes, value: bytes = b"") -> bytes:
    """Write the timer row of (``due_at_ms``, ``kind``, ``reference``) with ``value`` into ``partition``,
    overwriting a row with the same key; return the row's key (bytes).

    Args:
        store: the backend.
        partition: a non-empty str.
        due_at_ms: Unix epoch ms (int) or a timezone-aware datetime; an int below 10**11
            (before 1973, plausibly seconds) is accepted and logged at WARNING.
        kind: 1..255, an int or a :class:`TimerKind`.
        reference: opaque bytes identifying the timer among those of its kind and due time.
        value: bytes handed to the handler.

    Raises:
        TypeError / ValueError: a bad argument, naming it (a naive datetime, a kind out of
            1..255, a non-bytes reference or value, an empty partition).
        Exception: whatever the store raises.
    """
    check_store(store)
    key = keys.timer(due_at_ms_of(due_at_ms), kind, reference)
    check_bytes("value", value)
    check_partition(partition)
    keys.declare_signals(store)
    store.apply(partition, Batch().put(key, value))
    return key


def cancel(store: Store, partition: str, due_at_ms, kind, reference: bytes) -> bool:
    """Delete the timer row scheduled at ``due_at_ms`` (as for :func:`schedule`); True if this call removed it.

    A row that a runner has claimed (it is firing or backed off) has left that key, so it is
    not cancelled (False); nor is a row another writer replaced between the read and the
    guarded delete.

    Raises:
        TypeError / ValueError: a bad argument, as for :func:`schedule`.
        Exception: whatever the store raises.
    """
    check_store(store)
    key = keys.timer(due_at_ms_of(due_at_ms), kind, reference)
    check_partition(partition)
    value = store.get(partition, key)
    if value is None:
        return False
    return isinstance(store.apply(partition, Batch().require(Equals(key, value)).delete(key)), Committed)

"""Kind names, recorded in the store: the first writer or runner to use a named kind
(``TimerKind(1, "send-reminder")``) records its name there, and every later one whose name for that
kind differs is refused with one line (:class:`KindNameMismatch`), so that handlers written for
another application's kinds are never pointed at this one's timers.

A name is checked once per store object and kind in a process (a read-and-record round trip the
first time, nothing after), by every writer (:func:`~.writer.schedule`, :func:`~.bulk.schedule_many`,
``cancel``, ``reschedule``, ``requeue``, :func:`~.schedules.add_schedule`; through
:func:`~.writer.check_kind_name`), their awaitable forms in :mod:`timerwheel_c.durable.aio` and a
service when it starts. A kind without a
name is never checked. The names are the store's labels ``kind:N`` (:meth:`Store.record_labels`).
"""
from __future__ import annotations

import threading
import weakref
from typing import Iterable

from ..storage.errors import PicklesItsArguments
from ..storage.store import Store

__all__ = ["KindNameMismatch", "check_kind_names", "kind_names", "unconfirmed"]

_PREFIX = "kind:"
_confirmed: "weakref.WeakKeyDictionary[Store, dict]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class KindNameMismatch(PicklesItsArguments, ValueError):
    """A kind's name differs from the one the store recorded (or, ``where`` says, the one an earlier
    timer of the same bulk write gave); ``.kind``, ``.name``, ``.recorded``."""

    def __init__(self, kind: int, name: str, recorded: str, *, where: str = "in the store"):
        super().__init__(f"kind {kind} is named {name!r} here but {recorded!r} {where}: these handlers or "
                         f"writers belong to another application's kinds, or the kind was renamed")
        self.kind, self.name, self.recorded = kind, name, recorded
        self._arguments = ((kind, name, recorded), {"where": where})


def check_kind_names(store: Store, kinds: Iterable) -> None:
    """Record the names of ``kinds`` (TimerKinds or ints; those without a name are skipped) in
    ``store`` where none is recorded, and check the others against the recorded ones.

    Raises:
        KindNameMismatch: a kind recorded under another name.
        StoreError: the store failed.
    """
    todo = unconfirmed(store, kinds)
    if not todo:
        return
    recorded = store.record_labels({f"{_PREFIX}{n}": name for n, name in todo.items()})
    for n, name in sorted(todo.items()):
        found = recorded[f"{_PREFIX}{n}"]
        if found != name:
            raise KindNameMismatch(n, name, found)
    with _lock:
        _confirmed.setdefault(store, {}).update(todo)


def unconfirmed(store: Store, kinds: Iterable) -> dict:
    """``{kind number: name}`` of the named ``kinds`` not yet checked against ``store`` in this process:
    empty when :func:`check_kind_names` would read nothing (no I/O here)."""
    wanted = {int(k): k.name for k in kinds if getattr(k, "name", None) is not None}
    if not wanted:
        return {}
    with _lock:
        confirmed = _confirmed.setdefault(store, {})
        return {n: name for n, name in wanted.items() if confirmed.get(n) != name}


def kind_names(store: Store) -> dict:
    """``{kind number: name}`` of every kind whose name ``store`` records."""
    out = {}
    for label, name in store.labels(_PREFIX).items():
        number = label[len(_PREFIX):]
        if number.isdigit():
            out[int(number)] = name
    return out

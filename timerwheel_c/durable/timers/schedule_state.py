"""A recurring schedule's state as its store row keeps it, and the pure steps a runner takes on it.

A schedule is data (APScheduler 4): one row holds the stored trigger, the timer kind and
value its occurrences fire with, the misfire policy, and where the schedule stands on its
grid. Each step here takes a state (and the time, and a random source for jitter) and
returns the state to write; the runner writes it in the same guarded batch as the
occurrence's timer row, guarded on the state it read, so each occurrence commits once:

- :func:`new_state`: a schedule just added (or replaced: the old pending row is deleted in
  the same batch, so the old occurrences never fire again); :func:`replaced`: what a schedule
  added again keeps of the one it replaces.
- :func:`when_due`: the pending occurrence's row came due. Either it names the nominal time
  to fire (which the claim records, so that a retry fires the same occurrence), or every
  due occurrence was dropped under the misfire policy and the schedule moves on unfired.
- :func:`done`: the handler's ``Done`` for that occurrence: the next one follows its
  nominal time, never the fire time or the jitter.
- :func:`paused` and :func:`resumed`: a resumed schedule continues from its last nominal
  time, so what it missed is a misfire like any other.

All times are Unix epoch ms. ``docs/DESIGN.md`` ("Recurring schedules") gives the design.
"""
from __future__ import annotations

import dataclasses
import json
import struct
from dataclasses import dataclass
from typing import Optional

from .codecs import encoded
from .keys import TimerKind, check_value
from .triggers import Cron, RandomSource, Trigger, check_misfire, due_occurrences, trigger_from_dict

__all__ = ["FORMAT_VERSION", "ScheduleState", "Step", "done", "new_state", "paused", "replaced", "resumed", "when_due"]

FORMAT_VERSION = 1
# The row's value: version u8 | length of the JSON part u32 BE | JSON | the schedule's value
# (raw bytes, so that a large value costs no base64).
_HEAD = struct.Struct(">BI")
#: The most decoded rows :meth:`ScheduleState.from_bytes` keeps. An occurrence's claim and its
#: outcome each read the schedule's row as it was when claimed: decoding it (the JSON, the trigger's
#: constructor and every check) was an eighth of an occurrence's instructions, and it is done once.
#: States are frozen and triggers never change after construction, so sharing one is safe; a row
#: that fails to decode is never kept. Emptied when full: a runner's rows come and go with its
#: schedules' occurrences, and a few hundred schedules fit.
DECODED_STATES = 1024
_DECODED: dict = {}  # row bytes -> its ScheduleState
_FIELDS = ("trigger", "kind", "misfire", "misfire_grace_s", "catchup_window_s", "paused", "last_nominal_ms",
           "last_fired_ms", "next_nominal_ms", "next_fire_ms")


@dataclass(frozen=True)
class ScheduleState:
    """A schedule's row (every time Unix epoch ms).

    Attributes:
        trigger: when occurrences fall.
        kind: the timer kind (1..255) whose handler fires each occurrence.
        value: the value each occurrence fires with.
        misfire, misfire_grace_s, catchup_window_s: the misfire policy
            (see :func:`~.triggers.due_occurrences`).
        paused: a paused schedule has no pending occurrence.
        last_nominal_ms: the nominal time of the last occurrence done or dropped
            (the trigger's start before the first).
        last_fired_ms: the nominal time of the last occurrence done, or None.
        next_nominal_ms: the pending occurrence's nominal time, or None (paused, or the
            trigger has no more).
        next_fire_ms: when the pending occurrence's row is due: nominal + jitter, or None.
        runs: the occurrences done; stored only for a trigger with ``max_runs``.
    """

    trigger: Trigger
    kind: int
    value: bytes
    misfire: str
    misfire_grace_s: float
    catchup_window_s: Optional[float]
    paused: bool
    last_nominal_ms: int
    last_fired_ms: Optional[int]
    next_nominal_ms: Optional[int]
    next_fire_ms: Optional[int]
    runs: int = 0

    def to_bytes(self) -> bytes:
        """The row's value; :meth:`from_bytes` reads it back into an equal state. Equal states
        give equal bytes, so a guard comparing values compares states."""
        meta = {name: getattr(self, name) for name in _FIELDS}
        meta["trigger"] = self.trigger.to_dict()
        if self.trigger.max_runs is not None:
            meta["runs"] = self.runs
        text = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
        return _HEAD.pack(FORMAT_VERSION, len(text)) + text + self.value

    @classmethod
    def from_bytes(cls, data: bytes) -> "ScheduleState":
        """Read a row's value written by :meth:`to_bytes`. Equal bytes read again give the same
        (frozen) state object, kept from the first read (:data:`DECODED_STATES`).

        Raises:
            ValueError: a newer format version, a truncated or malformed row, or a field the
                constructors refuse; the message names what is wrong.
        """
        data = bytes(data)
        state = _DECODED.get(data)
        if state is None:
            state = cls._decoded(data)
            if len(_DECODED) >= DECODED_STATES:
                _DECODED.clear()
            _DECODED[data] = state
        return state

    @classmethod
    def _decoded(cls, data: bytes) -> "ScheduleState":
        if len(data) < _HEAD.size:
            raise ValueError(f"a schedule row is at least {_HEAD.size} bytes, got {data!r}")
        version, length = _HEAD.unpack_from(data)
        if version != FORMAT_VERSION:
            raise ValueError(f"schedule row format version {version} is not one this timerwheel_c reads "
                             f"({FORMAT_VERSION})")
        end = _HEAD.size + length
        try:
            meta = json.loads(data[_HEAD.size:end].decode()) if end <= len(data) else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            meta = None
        if not isinstance(meta, dict) or set(meta) - {"runs"} != set(_FIELDS):
            raise ValueError(f"a schedule row's fields are malformed: {data[:120]!r}")
        meta["trigger"] = trigger_from_dict(meta["trigger"])
        return _checked(cls(value=data[end:], **meta))


def _checked(state: ScheduleState) -> ScheduleState:
    check_misfire(state.misfire, state.misfire_grace_s, state.catchup_window_s)
    TimerKind(state.kind)
    if not isinstance(state.paused, bool):
        raise ValueError(f"paused must be a bool, got {state.paused!r}")
    if isinstance(state.runs, bool) or not isinstance(state.runs, int) or state.runs < 0:
        raise ValueError(f"runs must be an int >= 0, got {state.runs!r}")
    for name in ("last_nominal_ms", "last_fired_ms", "next_nominal_ms", "next_fire_ms"):
        ms = getattr(state, name)
        if ms is not None and (isinstance(ms, bool) or not isinstance(ms, int) or not 0 <= ms < 2**64):
            raise ValueError(f"{name} must be None or an int in 0..2**64-1 (Unix epoch ms), got {ms!r}")
    return state


def _armed(state: ScheduleState, rng: RandomSource) -> ScheduleState:
    """``state`` with its pending occurrence the one after its last nominal time, none past its
    trigger's end or runs."""
    nominal_ms = state.trigger.next_after(state.last_nominal_ms)
    if nominal_ms is not None and state.trigger.ended(nominal_ms, state.runs):
        nominal_ms = None
    fire_ms = None if nominal_ms is None else state.trigger.jittered(nominal_ms, rng)
    return dataclasses.replace(state, next_nominal_ms=nominal_ms, next_fire_ms=fire_ms)


def new_state(trigger: Trigger, kind: "int | TimerKind", value: object = b"", *, rng: RandomSource,
              misfire: str = "once", misfire_grace_s: float = 60.0,
              catchup_window_s: Optional[float] = None) -> ScheduleState:
    """A new schedule's state: nothing fired yet, the first occurrence after the trigger's
    start pending (already due if the start is far enough in the past; it then fires under
    the misfire policy).

    Raises:
        TypeError, ValueError: a bad kind (not 1..255), a value that is not bytes (for a kind
            without a codec; with one, one its codec refuses) or longer than
            :data:`~.keys.MAX_TIMER_VALUE_BYTES` once encoded, or a misfire policy
            :func:`~.triggers.check_misfire` refuses.
    """
    if not isinstance(trigger, Trigger):
        raise TypeError(f"trigger must be an Every or a Cron, got {type(trigger).__name__} {trigger!r}")
    value = check_value("value", encoded(kind, value))
    check_misfire(misfire, misfire_grace_s, catchup_window_s)
    # Floats, so that equal states give equal bytes (60 and 60.0 are written differently).
    state = ScheduleState(trigger=trigger, kind=TimerKind(kind).get(), value=value,
                          misfire=misfire, misfire_grace_s=float(misfire_grace_s),
                          catchup_window_s=None if catchup_window_s is None else float(catchup_window_s), paused=False,
                          last_nominal_ms=trigger.start_ms, last_fired_ms=None, next_nominal_ms=None,
                          next_fire_ms=None)
    return _armed(_checked(state), rng)


# A trigger's fields that choose which occurrences its grid owes, not where the grid lies: a
# schedule added again with other values of these keeps its place on the grid.
_NOT_GRID = ("jitter_ms", "end_ms", "max_runs")


def _grid(fields: dict) -> dict:
    """The fields that place a trigger's grid, start included, of its ``fields``
    (:meth:`~.triggers.Trigger.to_dict`'s, or :meth:`~.triggers.Trigger.canonical`'s to compare two)."""
    return {name: value for name, value in fields.items() if name not in _NOT_GRID}


def replaced(old: ScheduleState, new: ScheduleState, now_ms: int, rng: RandomSource) -> ScheduleState:
    """The state written when a schedule in state ``old`` is added again as ``new`` (a
    :func:`new_state`) at ``now_ms`` (Unix epoch ms): an application that adds its schedules at
    every start, or changes a schedule's jitter, end or ``max_runs``, must neither fire again an
    occurrence already done nor drop one still owed.

    - A trigger with an equal grid (its start included; its jitter, end and ``max_runs`` may
      differ) keeps its place on the grid: the last occurrence done or dropped, the last fired and
      the runs counted carry over (started afresh from a start in the past, it would fire the last
      occurrence again under the misfire policy). A ``max_runs`` the old trigger had not counts the
      runs from here.
    - A trigger with a grid equal but for a start it was not given (``default_start``: the time it
      was built) keeps the stored grid and its place: the caller named no start, and an
      :class:`~.triggers.Every` re-based on each restart's now would push its first occurrence an
      interval away every time, so one added again more often than its interval never fired.
    - A :class:`~.triggers.Cron` with a grid equal but for a later start that is not in the future
      is the same schedule: a cron start only bounds its occurrences from below, so the two agree on
      every occurrence after ``now_ms``, and the stored grid and its place are kept, with the
      occurrences it still owed (missed while no runner served it, or in flight).
    - Any other trigger starts afresh from its start; an :class:`~.triggers.Every` given another
      start is another grid.

    Kind, value, policy, jitter, end and ``max_runs`` are always ``new``'s, and the schedule is not paused.
    """
    trigger, grid, new_grid = old.trigger, _grid(old.trigger.canonical()), _grid(new.trigger.canonical())
    same_but_start = type(new.trigger) is type(trigger) and {**new_grid, "start_ms": 0} == {**grid, "start_ms": 0}
    if new_grid != grid and not (same_but_start and (
            new.trigger.default_start
            or (isinstance(trigger, Cron) and trigger.start_ms <= new.trigger.start_ms <= now_ms))):
        return new
    limits = {name: value for name, value in new.trigger.to_dict().items() if name in _NOT_GRID}
    # The stored grid as it was written: an equal one may be spelled another way (a cron's "@daily").
    kept = {**_grid(trigger.to_dict()), **limits}
    return _armed(dataclasses.replace(new, trigger=trigger_from_dict(kept), last_nominal_ms=old.last_nominal_ms,
                                      last_fired_ms=old.last_fired_ms, runs=old.runs), rng)


@dataclass(frozen=True)
class Step:
    """What to do when a schedule's pending row comes due.

    Attributes:
        fire_ms: the nominal time of the occurrence to fire now (the handler's ``due_at_ms``),
            or None: nothing fires.
        state: the state to write now. When ``fire_ms`` is set it is the state read (the
            claim writes nothing to it; :func:`done` moves it on). When ``fire_ms`` is None
            and ``state`` differs from the state read, every due occurrence was dropped:
            write it, and the new pending row, in one guarded batch.
    """

    fire_ms: Optional[int]
    state: ScheduleState


def when_due(state: ScheduleState, now_ms: int, rng: RandomSource) -> Step:
    """The pending row came due at ``now_ms``: which occurrence fires, under the misfire policy,
    oldest first when several are owed (the next comes due as soon as this one is done).

    Raises:
        TypeError, ValueError: ``now_ms`` is not an int in 0..2**64-1.
    """
    due = due_occurrences(state.trigger, state.last_nominal_ms, now_ms, state.misfire, state.misfire_grace_s,
                          state.catchup_window_s, limit=1)
    if due.fire_ms and state.trigger.ended(due.fire_ms[0], state.runs):
        # An occurrence past max_runs (due_occurrences never owes one past end_ms) never fires: it ends here.
        return Step(None, dataclasses.replace(state, next_nominal_ms=None, next_fire_ms=None))
    if due.fire_ms:
        return Step(due.fire_ms[0], state)
    if due.last_missed_ms is None:  # woken before the occurrence: leave the row as it is
        return Step(None, state)
    return Step(None, _armed(dataclasses.replace(state, last_nominal_ms=due.last_missed_ms), rng))


def done(state: ScheduleState, nominal_ms: int, rng: RandomSource) -> ScheduleState:
    """The state after the occurrence at ``nominal_ms`` is done: the next occurrence follows
    ``nominal_ms`` on the grid (already due if more are owed)."""
    return _armed(dataclasses.replace(state, last_nominal_ms=nominal_ms, last_fired_ms=nominal_ms, runs=state.runs + 1),
                  rng)


def paused(state: ScheduleState) -> ScheduleState:
    """The paused state: no pending occurrence (the runner deletes its row in the same batch)."""
    return dataclasses.replace(state, paused=True, next_nominal_ms=None, next_fire_ms=None)


def resumed(state: ScheduleState, rng: RandomSource) -> ScheduleState:
    """The resumed state: pending again from the last nominal time, so the occurrences missed
    while paused are resolved by the misfire policy when the row comes due."""
    return _armed(dataclasses.replace(state, paused=False), rng)

"""What both twins of the wheel share: constants, argument checks and conversions.

The compiled core (``src/_wheel.pyx``) and its pure twin (``timerwheel_c/pure/wheel.py``) both
import from here, and neither imports the other, so a traceback from the compiled core never
passes through the pure twin. The layout follows the neutral helper modules of aio-libs
(multidict ``_abc.py``, propcache ``_helpers.py``), one per core: the release timer's are in
``timerwheel_c/_release_common.py``, the scheduler's in ``timerwheel_c/_aio_common.py``.
``_refuse_copy`` serves the scheduler's pure twin too. A compiled core keeps its hot checks as typed C twins of the functions here,
with the same names and semantics; the values of the constants it compiles in are checked
against these by the test suite.
"""
from __future__ import annotations

import operator
from typing import Any

import numpy as np


# --- TimerWheel -----------------------------------------------------------------------------
# Geometry, named as Linux names it in kernel/time/timer.c (LVL_BITS, LVL_SIZE, LVL_OFFS,
# LVL_SHIFT): level 0 is L0_SLOTS slots of 1 ms; level l >= 1 is LEVEL_SLOTS slots of
# 2**level_shift(l) ms. Slots are numbered flat: level 0 is 0..L0_SLOTS-1, the digit d of level
# l >= 1 is LEVEL_BASE + LEVEL_SLOTS * l + d, so every slot's occupancy bit is bit f & 63 of the
# 64-bit word f >> 6, and each level l >= 1 is exactly the word LEVEL_BASE // 64 + l.
L0_BITS = 9
L0_SLOTS = 1 << L0_BITS
LEVEL_BITS = 6
LEVEL_SLOTS = 1 << LEVEL_BITS
NUM_LEVELS = 10
LEVEL_BASE = L0_SLOTS - LEVEL_SLOTS
NUM_SLOTS = L0_SLOTS + (NUM_LEVELS - 1) * LEVEL_SLOTS
NUM_WORDS = NUM_SLOTS // 64
# Due times are capped here, so level 9 (slots of 2**57 ms) never wraps.
MAX_DUE_MS = 1 << 62
# next_fire_ms() with nothing pending: now_ms() + 2**32.
IDLE_HINT_MS = 1 << 32
# Entry indexes are int32 (an id is generation << 32 | index): at most 2**31 - 1 entries.
MAX_ENTRIES = 0x7FFFFFFF
# Bytes of one pool entry (the C struct entry_t), so both twins report the same nbytes().
ENTRY_BYTES = 32
# Bytes of the slot tables: per slot a head and a tail (int32) and a bound (int64), plus the
# occupancy words.
SLOT_TABLE_BYTES = NUM_SLOTS * 16 + NUM_WORDS * 8
# A wheel made without now_ms starts at 0; a first advance further than this (one day) is
# almost surely a clock reading, which would fire every timer at once.
FIRST_JUMP_WARN_MS = 86_400_000
# The longest timeout poll_timeout() returns: one day, asyncio's MAXIMUM_SELECT_TIMEOUT
# (base_events.py). epoll, poll and devpoll take a C int of ms (about 24.8 days at most) and raise
# OverflowError beyond it; one day stays far inside, whatever rounding a selector applies.
MAX_POLL_TIMEOUT_MS = 86_400_000
U64_LIMIT = 1 << 64


# The default of every required argument of a TimerWheel method, so that a call missing one
# raises the same TypeError in both twins (the compiled and the Python interpreter word theirs
# differently).
_MISSING: Any = object()


def _refuse_copy(obj: Any) -> None:
    """Raise the TypeError that ``copy.copy``, ``copy.deepcopy`` and ``pickle`` get from a wheel, a
    scheduler, keyed timers, a loop's timer store or its handles, or a release timer, compiled or pure
    alike: a shallow copy would share the original's slot lists (or release thread), so each would fire
    the other's timers."""
    raise TypeError(f"{type(obj).__name__} objects cannot be copied or pickled: a copy would share "
                    f"the original's timers")


def _missing_error(method: str, name: str) -> str:
    """The message for a call of ``TimerWheel.<method>`` without its argument ``name``."""
    return f"TimerWheel.{method}() missing required argument {name!r}"


def level_shift(level: int) -> int:
    """log2 of the slot width in ms of level ``level`` >= 1 (9 at level 1, then 6 more per level)."""
    return L0_BITS + LEVEL_BITS * (level - 1)


def pool_capacity(used: int) -> int:
    """The entries the C pool holds after ``used`` entries were taken: 64, doubled as needed,
    capped at MAX_ENTRIES (0 while none was taken)."""
    cap = 0
    while cap < used:
        cap = 64 if cap == 0 else min(2 * cap, MAX_ENTRIES)
    return cap


def _as_int(value: Any, name: str) -> int:
    """``value`` as an int by ``operator.index`` (numpy integer scalars pass); bool is no number here.

    Raises:
        TypeError: ``value`` is a bool, float, str, None or any other non-integer.
    """
    if type(value) is int:
        return value
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, not bool ({value!r})")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, not {type(value).__name__} ({value!r})") from None


def _as_token(value: Any) -> int:
    """``value`` checked as a token: an int in [0, 2**64).

    Raises:
        TypeError: not an int (see ``_as_int``).
        ValueError: negative or >= 2**64.
    """
    token = _as_int(value, "token")
    if token < 0 or token >= U64_LIMIT:
        raise ValueError(f"token {token} is out of range [0, 2**64)")
    return token


def _as_delay(after_ms: Any) -> int:
    """``after_ms`` as a delay in ms clamped to [1, 2**62 + 1]: 0 or less counts as 1, and anything
    over 2**62 is beyond every due time alike. TypeError if not an int."""
    if type(after_ms) is not int:
        after_ms = _as_int(after_ms, "after_ms")
    if after_ms < 1:
        return 1
    if after_ms > MAX_DUE_MS:
        return MAX_DUE_MS + 1
    return after_ms


def _due_error(elapsed: int, after_ms: Any) -> str:
    """The message for a timer armed ``after_ms`` ms after ``elapsed`` ms whose due time is beyond
    2**62 ms; it names the real due time, after the clamp of a delay of 0 or less to 1."""
    after = _as_int(after_ms, "after_ms")
    clamp = ", clamped to 1" if after < 1 else ""
    return (f"due time {elapsed + max(after, 1)} ms (now_ms {elapsed} + after_ms {after}{clamp}) "
            f"is beyond 2**62 ms")


def _first_jump_warning(now_ms: int) -> str:
    """The warning for the first advance of a wheel made without ``now_ms`` by more than a day."""
    return (f"TimerWheel() was made without now_ms, so it started at 0 ms, and its first advance "
            f"jumps to {now_ms} ms ({now_ms / 86_400_000:.1f} days): every timer fires at once. "
            f"Pass TimerWheel(now_ms=<your clock now>) to start it on your clock")


def _poll_cap(cap_ms: Any) -> int:
    """``cap_ms`` of ``poll_timeout`` checked: None gives MAX_POLL_TIMEOUT_MS, an int >= 0 itself,
    at most MAX_POLL_TIMEOUT_MS.

    Raises:
        TypeError: not an int (see ``_as_int``).
        ValueError: negative.
    """
    if cap_ms is None:
        return MAX_POLL_TIMEOUT_MS
    cap = _as_int(cap_ms, "cap_ms")
    if cap < 0:
        raise ValueError(f"cap_ms must be >= 0 ms, got {cap}")
    return min(cap, MAX_POLL_TIMEOUT_MS)


_BOOLS = frozenset((bool, np.bool_))


def _as_int_array(values: Any, name: str) -> np.ndarray:
    """``values`` as a 1-d ndarray of an integer dtype (bool excluded).

    Raises:
        TypeError: not integer, or not 1-d; a list or tuple holding a bool (np.asarray reads
            ``[5, True]`` as int64, a 1 ms delay or token 1); a masked array (np.asarray drops
            its mask, so a masked entry would be taken).
        ValueError: a value of a list does not fit in 64 bits, or no 64-bit type holds them all.
    """
    if isinstance(values, np.ma.MaskedArray):
        raise TypeError(f"{name} must not be a masked array: its masked entries would be taken; pass "
                        f"{name}.compressed() or {name}.filled(value)")
    if isinstance(values, (list, tuple)) and not _BOOLS.isdisjoint(map(type, values)):
        _as_int(next(v for v in values if type(v) in _BOOLS), name)  # raises, naming the bool
    arr = np.asarray(values)
    if arr.size == 0 and arr.ndim == 1:
        # np.asarray([]) is float64; an empty sequence holds no wrong value.
        return arr.astype(np.int64)
    if arr.ndim == 1 and arr.dtype.kind in "fO" and not isinstance(values, np.ndarray):
        # numpy reads a list of ints beyond int64 (alone, or beside negative ones) as float64 or
        # object: take the ints one by one, so none is rounded and a bad one is named.
        ints = [_as_int(v, name) for v in values]
        lo, hi = min(ints), max(ints)
        if lo >= 0 and hi < 1 << 64:
            return np.array(ints, dtype=np.uint64)
        if lo >= -(1 << 63) and hi < 1 << 63:
            return np.array(ints, dtype=np.int64)
        if lo < -(1 << 63) or hi >= 1 << 64:
            raise ValueError(f"{name} value {lo if lo < -(1 << 63) else hi} does not fit in 64 bits")
        raise ValueError(f"{name} holds {lo} and {hi}: no 64-bit integer type holds both")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array, not dtype {arr.dtype}")
    if arr.ndim != 1:
        raise TypeError(f"{name} must be 1-d, not {arr.ndim}-d")
    return arr


def _check_batch(elapsed: int, after_ms: Any, tokens: Any) -> tuple[np.ndarray, np.ndarray]:
    """The (int64 delays, uint64 tokens) arrays of a ``schedule_many`` call, fully validated.

    Raises:
        TypeError, ValueError: as ``TimerWheel.schedule_many``.
    """
    toks = _as_int_array(tokens, "tokens")
    given = None  # one delay for every token, as given: what a message names, not its clamp
    if np.ndim(after_ms) == 0:
        # Clamped here so that any int (even beyond int64) is checked.
        given = _as_int(after_ms, "after_ms")
        delays = np.full(len(toks), _as_delay(given), dtype=np.int64)
    else:
        delays = _as_int_array(after_ms, "after_ms")
    if len(delays) != len(toks):
        raise ValueError(f"after_ms has {len(delays)} values but tokens has {len(toks)}")
    # The clamp of 0 or less to 1 comes before the range check, as in the scalar schedule.
    delays = np.clip(delays, 1, None)
    if len(toks):
        if toks.dtype.kind == "i" and toks.min() < 0:
            raise ValueError(f"token {int(toks.min())} is out of range [0, 2**64)")
        top = int(delays.max())
        if elapsed + top > MAX_DUE_MS:
            raise ValueError(_due_error(elapsed, top if given is None else given))
    return delays.astype(np.int64), toks.astype(np.uint64)

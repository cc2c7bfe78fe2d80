"""The pure-Python twin of ``src/_wheel.pyx``: the same hierarchical timing wheel in plain lists and ints.

Every function here mirrors the one of the same name in ``src/_wheel.pyx``, in the same order, so
the two diff by eye; the design comment at the top of ``src/_wheel.pyx`` (levels, granularity, what
is exact and what approximate) holds for both. The twin issues the same ids, fires the same tokens in
the same order and raises the same exceptions as the compiled core; only speed differs.
"""
from __future__ import annotations

import warnings

import numpy as np

from .._common import (
    _MISSING,
    ENTRY_BYTES,
    FIRST_JUMP_WARN_MS,
    IDLE_HINT_MS,
    L0_BITS,
    L0_SLOTS,
    LEVEL_BASE,
    LEVEL_BITS,
    LEVEL_SLOTS,
    MAX_DUE_MS,
    MAX_ENTRIES,
    NUM_LEVELS,
    NUM_SLOTS,
    NUM_WORDS,
    U64_LIMIT,
    _as_delay,
    _refuse_copy,
    _as_int,
    _as_int_array,
    _as_token,
    _check_batch,
    _due_error,
    _first_jump_warning,
    _missing_error,
    _poll_cap,
    level_shift,
    pool_capacity,
    SLOT_TABLE_BYTES,
)

__all__ = ["TimerWheel"]

NIL = -1
# loc of an entry on the free list; every other loc is a flat slot index.
FREE = 0xFFFFFFFF
NO_BOUND = (1 << 63) - 1
U32 = 0xFFFFFFFF
U64 = 0xFFFFFFFFFFFFFFFF


def _slot_for(elapsed, due):
    """The flat slot for a timer due at ``due`` ms while the wheel stands at ``elapsed`` ms.

    The level is the highest level-digit in which ``due`` and ``elapsed`` differ (tokio's
    ``level_for``), so a timer sits at the lowest level whose current span contains its due time.
    """
    x = elapsed ^ due
    if x < L0_SLOTS:
        return due & (L0_SLOTS - 1)
    level = (x.bit_length() - 1 - L0_BITS) // LEVEL_BITS + 1
    return LEVEL_BASE + LEVEL_SLOTS * level + ((due >> level_shift(level)) & (LEVEL_SLOTS - 1))


def _ctz(word):
    """Index of the lowest set bit of a non-zero word."""
    return (word & -word).bit_length() - 1


class TimerWheel:
    """A hierarchical hashed timing wheel: 512 slots of 1 ms, then 9 levels of 64 slots.

    Times are integer ms on the caller's monotonic clock. ``schedule``, ``cancel`` and
    ``reschedule`` are O(1); ``advance`` costs O(timers fired + cascades), never O(gap).
    Design: tokio's time driver wheel (runtime/time/wheel), Varghese & Lauck's hashed and
    hierarchical wheels; see the design comment of ``src/_wheel.pyx``.

    Args:
        now_ms: the current time in ms on your clock, an int in [0, 2**62]. Omitted (or None), the
            wheel starts at 0 ms; its first ``advance`` then warns (RuntimeWarning) if it jumps by
            more than a day, which a clock reading such as ``time.monotonic_ns() // 10**6`` does,
            firing every timer at once.

    Raises:
        TypeError: ``now_ms`` is not an int.
        ValueError: ``now_ms`` is outside [0, 2**62].
    """

    __slots__ = (
        "_elapsed", "_count", "_free_head", "_due", "_token", "_next", "_prev", "_gen", "_loc",
        "_head", "_tail", "_bound", "_occ", "_warn_jump",
    )

    def __init__(self, now_ms=None):
        warn_jump = now_ms is None
        now_ms = _as_int(0 if warn_jump else now_ms, "now_ms")
        if now_ms < 0 or now_ms > MAX_DUE_MS:
            raise ValueError(f"now_ms {now_ms} is out of range [0, 2**62]")
        # Moving the clock of a wheel that already issued ids would break its slot invariant (and
        # resetting the pool would drop every pending timer).
        if getattr(self, "_due", None):
            raise RuntimeError("TimerWheel.__init__ called on a wheel already in use")
        self._elapsed = now_ms
        self._warn_jump = warn_jump
        self._count = 0
        self._free_head = NIL
        # The entry pool, one list per field of the C struct entry_t.
        self._due = []
        self._token = []
        self._next = []
        self._prev = []
        self._gen = []
        self._loc = []
        # Per flat slot: list head and tail, and a lower bound on the due times it holds.
        self._head = [NIL] * NUM_SLOTS
        self._tail = [NIL] * NUM_SLOTS
        self._bound = [NO_BOUND] * NUM_SLOTS
        self._occ = [0] * NUM_WORDS

    def _alloc(self):
        """A free entry index: the most recently freed one (LIFO), else a fresh one at generation 1."""
        e = self._free_head
        if e != NIL:
            self._free_head = self._next[e]
            return e
        e = len(self._due)  # C: the pool's used count
        if e >= MAX_ENTRIES:
            raise MemoryError(f"TimerWheel holds {MAX_ENTRIES} entries, its limit")
        self._due.append(0)
        self._token.append(0)
        self._next.append(NIL)
        self._prev.append(NIL)
        self._gen.append(1)
        self._loc.append(FREE)
        return e

    def _free(self, e):
        """Return entry ``e`` to the free list at once; its generation moves on, so its old id is stale."""
        gen = (self._gen[e] + 1) & U32
        self._gen[e] = gen if gen else 1
        self._loc[e] = FREE
        self._next[e] = self._free_head
        self._free_head = e
        self._count -= 1

    def _link(self, e):
        """Append entry ``e`` to the tail of its slot, chosen from its due time and ``_elapsed``."""
        due = self._due[e]
        f = _slot_for(self._elapsed, due)
        tail = self._tail[f]
        self._prev[e] = tail
        self._next[e] = NIL
        if tail == NIL:
            self._head[f] = e
            self._occ[f >> 6] |= 1 << (f & 63)
        else:
            self._next[tail] = e
        self._tail[f] = e
        if due < self._bound[f]:
            self._bound[f] = due
        self._loc[e] = f

    def _unlink(self, e):
        """Take entry ``e`` out of its slot list; an emptied slot clears its bit and bound."""
        f = self._loc[e]
        p = self._prev[e]
        n = self._next[e]
        if p == NIL:
            self._head[f] = n
        else:
            self._next[p] = n
        if n == NIL:
            self._tail[f] = p
        else:
            self._prev[n] = p
        head = self._head[f]
        if head == NIL:
            self._occ[f >> 6] &= ~(1 << (f & 63))
            self._bound[f] = NO_BOUND
        elif head == self._tail[f]:
            # One timer left: its bound is exact again (next_fire_ms is exact for one pending timer).
            self._bound[f] = self._lone_bound(f, self._due[head])

    def _pop_head(self, f, nxt):
        """``_unlink`` of the head of level-0 slot ``f``, whose successor is ``nxt``: the firing
        loop's case. Every timer of a level-0 slot has one due time, so a non-empty slot's bound
        stays exact and only an emptied slot clears its bit and bound."""
        self._head[f] = nxt
        if nxt == NIL:
            self._tail[f] = NIL
            self._occ[f >> 6] &= ~(1 << (f & 63))
            self._bound[f] = NO_BOUND
        else:
            self._prev[nxt] = NIL

    def _next_slot(self):
        """The occupied flat slot with the earliest start at or after ``_elapsed``, or NIL.

        Every timer at level l shares the digits above l with ``_elapsed`` and has its level-l digit
        at or after ``_elapsed``'s, so no level wraps, and any timer of a lower level is due before
        every timer of a higher one: the first level with a bit at or after its current digit wins.
        """
        elapsed = self._elapsed
        occ = self._occ
        d = elapsed & (L0_SLOTS - 1)
        w = d >> 6
        word = occ[w] & ~((1 << (d & 63)) - 1) & U64
        while True:
            if word:
                return (w << 6) | _ctz(word)
            w += 1
            if w == L0_SLOTS >> 6:
                break
            word = occ[w]
        for level in range(1, NUM_LEVELS):
            word = occ[(LEVEL_BASE >> 6) + level]
            if word:
                d = (elapsed >> level_shift(level)) & (LEVEL_SLOTS - 1)
                word &= ~((1 << d) - 1) & U64
                if word:
                    return LEVEL_BASE + LEVEL_SLOTS * level + _ctz(word)
        return NIL

    def _slot_start(self, f):
        """The first ms covered by flat slot ``f`` in the current rotation of its level."""
        if f < L0_SLOTS:
            return (self._elapsed & ~(L0_SLOTS - 1)) | f
        level = (f - LEVEL_BASE) >> LEVEL_BITS
        shift = level_shift(level)
        return (self._elapsed & ~((1 << (shift + LEVEL_BITS)) - 1)) | ((f & (LEVEL_SLOTS - 1)) << shift)

    def _lone_bound(self, f, due):
        """The bound of slot ``f`` holding one timer, due at ``due`` ms: ``due``, capped at the
        slot's last ms. A deferred timer may be due after later slots start; the cap keeps the
        earliest slot's bound before every other slot's timers, and waking at it cascades the slot."""
        if f < L0_SLOTS:
            return due
        last = self._slot_start(f) + (1 << level_shift((f - LEVEL_BASE) >> LEVEL_BITS)) - 1
        return min(due, last)

    def _find(self, timer_id):
        """The entry index ``timer_id`` (an int in [0, 2**64)) names if that timer is pending, else NIL."""
        e = timer_id & U32
        if e >= len(self._due):
            return NIL
        if self._gen[e] != timer_id >> 32 or self._loc[e] == FREE:
            return NIL
        return e

    def _lookup(self, timer_id):
        """``_find`` for any Python int; TypeError for a non-int, NIL for ints outside [0, 2**64)."""
        if type(timer_id) is not int:
            timer_id = _as_int(timer_id, "timer_id")
        if timer_id < 0 or timer_id >= U64_LIMIT:
            return NIL
        return self._find(timer_id)

    def _due_for(self, delay, after_ms):
        """The due time in ms of a timer armed ``delay`` (from ``_as_delay(after_ms)``) ms from now.

        Raises:
            ValueError: the due time is beyond 2**62 ms.
        """
        if delay > MAX_DUE_MS - self._elapsed:
            raise ValueError(_due_error(self._elapsed, after_ms))
        return self._elapsed + delay

    def _arm(self, due, token):
        """Take an entry for a timer due at ``due`` ms firing ``token`` and link it; returns its id."""
        e = self._alloc()
        self._due[e] = due
        self._token[e] = token
        self._link(e)
        self._count += 1
        return (self._gen[e] << 32) | e

    def _move(self, e, due):
        """Re-arm pending entry ``e`` to ``due`` ms: deferred if it waits at a level >= 1 and
        ``due`` is not earlier than its due time, else re-filed at once.

        Deferred, only its due time changes (the entry is the one cache line touched): it stays in
        its slot, whose start is at or before the old due time and so before ``due``, and is re-filed
        by its new due time when the wheel cascades that slot (Linux's "most timers never fire";
        Netty's IdleStateHandler and Kafka's purgatory defer the same way). The slot's bound stays
        a lower bound, made exact again if the entry is alone in its slot. At level 0 the entry is
        re-filed at once, so a level-0 slot only ever holds timers due at its own ms and the wheel
        never wakes at a level-0 slot with nothing to fire.
        """
        f = self._loc[e]
        if f >= L0_SLOTS and due >= self._due[e]:
            self._due[e] = due
            if self._head[f] == e and self._tail[f] == e:
                self._bound[f] = self._lone_bound(f, due)
            return
        self._unlink(e)
        self._due[e] = due
        self._link(e)

    def schedule(self, after_ms=_MISSING, token=_MISSING):
        """Arm a timer due at ``now_ms() + max(after_ms, 1)`` ms that fires ``token``.

        Args:
            after_ms: delay in ms, an int; 0 or less is clamped to 1 (fires on the next tick).
            token: an int in [0, 2**64) handed back by ``advance`` when the timer fires.

        Returns:
            A positive int id (< 2**64) for ``cancel``/``reschedule``. It names no later timer
            until its entry has been reused 2**32 times (its 32-bit generation wraps); the last
            entry freed is the next taken, so 2**32 arm-and-cancel pairs can do it: drop an id
            once its timer fired or was cancelled.

        Raises:
            TypeError: ``after_ms`` or ``token`` is not an int (bool, float, str, None...).
            ValueError: ``token`` outside [0, 2**64), or the due time beyond 2**62 ms.
        """
        if after_ms is _MISSING:
            raise TypeError(_missing_error("schedule", "after_ms"))
        if token is _MISSING:
            raise TypeError(_missing_error("schedule", "token"))
        # Every conversion (which may run a foreign __index__) before the wheel is read or changed.
        delay = _as_delay(after_ms)
        token = _as_token(token)
        return self._arm(self._due_for(delay, after_ms), token)

    def schedule_at(self, due_ms=_MISSING, token=_MISSING):
        """Arm a timer due at ``due_ms`` ms on the wheel's clock that fires ``token``.

        A due time at or before ``now_ms()`` is due now: the next ``advance``, ``advance(now_ms())``
        included, fires it (``schedule`` instead counts a delay of 0 or less as the next tick).
        A caller whose clock is finer than 1 ms arms a deadline it knows is past this way, so it
        runs at once instead of at the end of the current ms.

        Args:
            due_ms: the due time in ms, an int (any int at or before ``now_ms()`` means now).
            token: an int in [0, 2**64) handed back by ``advance`` when the timer fires.

        Returns:
            A positive int id (< 2**64), as ``schedule`` returns.

        Raises:
            TypeError: ``due_ms`` or ``token`` is not an int (bool, float, str, None...).
            ValueError: ``token`` outside [0, 2**64), or ``due_ms`` beyond 2**62.
        """
        if due_ms is _MISSING:
            raise TypeError(_missing_error("schedule_at", "due_ms"))
        if token is _MISSING:
            raise TypeError(_missing_error("schedule_at", "token"))
        # Every conversion (which may run a foreign __index__) before the wheel is read or changed.
        if type(due_ms) is not int:
            due_ms = _as_int(due_ms, "due_ms")
        token = _as_token(token)
        if due_ms > MAX_DUE_MS:
            raise ValueError(f"due_ms {due_ms} is beyond 2**62 ms")
        return self._arm(max(due_ms, self._elapsed), token)

    def cancel(self, timer_id=_MISSING):
        """Cancel a pending timer and free its entry at once.

        Returns:
            True exactly once for a pending timer; False for a fired or cancelled timer, an id never
            issued, or any other int.

        Raises:
            TypeError: ``timer_id`` is not an int.
        """
        if timer_id is _MISSING:
            raise TypeError(_missing_error("cancel", "timer_id"))
        e = self._lookup(timer_id)
        if e == NIL:
            return False
        self._unlink(e)
        self._free(e)
        return True

    def reschedule(self, timer_id=_MISSING, after_ms=_MISSING):
        """Move a pending timer to ``now_ms() + max(after_ms, 1)`` ms, keeping its id and token.

        A move to an earlier due time re-files the timer at once: among timers due at the same ms
        it then fires after those armed before. A move to the same or a later due time while the
        timer waits in an overflow slot (a level >= 1) is deferred, as Linux, Netty's
        IdleStateHandler and Kafka's purgatory defer: only its due time changes, one cache line
        touched, and the wheel re-files it when it reaches the old slot. It never fires early nor
        late; among timers due at its new ms it fires in the order it was re-filed.

        Returns:
            True if the timer was pending (and is moved), False otherwise.

        Raises:
            TypeError: ``timer_id`` or ``after_ms`` is not an int.
            ValueError: the due time is beyond 2**62 ms.
        """
        if timer_id is _MISSING:
            raise TypeError(_missing_error("reschedule", "timer_id"))
        if after_ms is _MISSING:
            raise TypeError(_missing_error("reschedule", "after_ms"))
        # Every conversion (which may run a foreign __index__) before the wheel is read or changed.
        delay = _as_delay(after_ms)
        e = self._lookup(timer_id)
        due = self._due_for(delay, after_ms)
        if e == NIL:
            return False
        self._move(e, due)
        return True

    def _run(self, now, fired):
        """Advance ``_elapsed`` to ``now``, appending each fired token to ``fired`` in fire order;
        returns the count.

        Jumps from occupied slot to occupied slot: a level-0 slot fires whole (all its timers share
        one due time, in arming order); a higher slot cascades whole, in list order, to lower levels.
        A timer leaves its list only after its token is handed over, so a failed append leaves a
        consistent wheel.
        """
        n = 0
        while True:
            f = self._next_slot()
            if f == NIL:
                break
            start = self._slot_start(f)
            if start > now:
                break
            self._elapsed = start
            if f < L0_SLOTS:
                e = self._head[f]
                while e != NIL:
                    nxt = self._next[e]
                    fired.append(self._token[e])
                    n += 1
                    self._pop_head(f, nxt)
                    self._free(e)
                    e = nxt
            else:
                e = self._head[f]
                self._head[f] = NIL
                self._tail[f] = NIL
                self._occ[f >> 6] &= ~(1 << (f & 63))
                self._bound[f] = NO_BOUND
                while e != NIL:
                    nxt = self._next[e]
                    self._link(e)
                    e = nxt
        self._elapsed = now
        return n

    def _check_now(self, now_ms):
        """``now_ms`` as an int checked against the wheel's time.

        Warns:
            RuntimeWarning: the first advance of a wheel made without ``now_ms`` jumps by more
                than FIRST_JUMP_WARN_MS (a day): almost surely a clock reading.

        Raises:
            TypeError: ``now_ms`` is not an int.
            ValueError: ``now_ms`` is before ``now_ms()`` (time never goes backwards) or beyond 2**62.
        """
        if type(now_ms) is not int:
            now_ms = _as_int(now_ms, "now_ms")
        if self._warn_jump:
            # Before the checks below read the wheel: the warning runs Python code (filters, hooks).
            self._warn_jump = False
            if now_ms - self._elapsed > FIRST_JUMP_WARN_MS:
                warnings.warn(_first_jump_warning(now_ms), RuntimeWarning, stacklevel=3)
        if now_ms < self._elapsed:
            raise ValueError(f"now_ms {now_ms} is before the wheel's time {self._elapsed}: time never goes backwards")
        if now_ms > MAX_DUE_MS:
            raise ValueError(f"now_ms {now_ms} is beyond 2**62 ms")
        return now_ms

    def advance(self, now_ms=_MISSING, fired=None):
        """Fire every timer due at or before ``now_ms`` ms, exactly once, in fire order.

        Fire order is non-decreasing due time; timers due at the same ms fire in arming order
        (the order of their ``schedule``/``reschedule`` calls). ``advance(now_ms())`` fires only the
        timers due now (``schedule_at`` a due time at or before ``now_ms()``).

        Args:
            now_ms: the new time in ms, an int >= ``now_ms()`` and <= 2**62.
            fired: a list to append the tokens to; a new list if None.

        Returns:
            ``fired``: the list of fired tokens (ints).

        Raises:
            TypeError: ``now_ms`` is not an int, or ``fired`` is not a list.
            ValueError: ``now_ms`` is before ``now_ms()`` or beyond 2**62; the wheel is unchanged.
        """
        if now_ms is _MISSING:
            raise TypeError(_missing_error("advance", "now_ms"))
        if fired is not None and type(fired) is not list:
            # The compiled core's words: Cython's check of its typed argument.
            raise TypeError(f"Argument 'fired' has incorrect type (expected list, got {type(fired).__name__})")
        if fired is None:
            # Before the wheel is read: allocating may run the GC, whose Python code may advance it.
            fired = []
        now = self._check_now(now_ms)
        self._run(now, fired)
        return fired

    def advance_array(self, now_ms=_MISSING):
        """``advance(now_ms)`` returning the fired tokens as a 1-d ndarray of uint64, in fire order.

        Raises:
            TypeError / ValueError: as ``advance``.
        """
        if now_ms is _MISSING:
            raise TypeError(_missing_error("advance_array", "now_ms"))
        return np.array(self.advance(now_ms), dtype=np.uint64)

    def schedule_many(self, after_ms=_MISSING, tokens=_MISSING):
        """``schedule(after_ms[i], tokens[i])`` for each i, in order; all validated before any is armed.

        Args:
            after_ms: delays in ms: a 1-d integer array-like, or one int for every token.
            tokens: a 1-d integer array-like of values in [0, 2**64).

        Returns:
            A 1-d ndarray of uint64 ids, one per token.

        Raises:
            TypeError: an argument is not integer (float, bool or object dtype) or not 1-d.
            ValueError: lengths differ, a token is out of range or a due time is beyond 2**62 ms;
                nothing is scheduled.
        """
        if after_ms is _MISSING:
            raise TypeError(_missing_error("schedule_many", "after_ms"))
        if tokens is _MISSING:
            raise TypeError(_missing_error("schedule_many", "tokens"))
        delays, toks = _check_batch(self._elapsed, after_ms, tokens)
        delays, toks = delays.tolist(), toks.tolist()
        # The GC's Python code may have advanced this wheel since _check_batch: check again.
        top = max(delays, default=1)
        self._due_for(top, top)
        ids = [self._arm(self._elapsed + d, t) for d, t in zip(delays, toks)]
        return np.array(ids, dtype=np.uint64)

    def cancel_many(self, ids=_MISSING):
        """``cancel(id)`` for each id, in order.

        Args:
            ids: a 1-d integer array-like of ids (any values; non-pending ones are skipped).

        Returns:
            How many ids were pending and are now cancelled (an int).

        Raises:
            TypeError: ``ids`` is not a 1-d integer array-like.
        """
        if ids is _MISSING:
            raise TypeError(_missing_error("cancel_many", "ids"))
        arr = _as_int_array(ids, "ids")
        if arr.dtype.kind == "i":
            # 0 is never an id; a negative id must not alias a huge unsigned one.
            arr = np.where(arr < 0, 0, arr)
        cancelled = 0
        for timer_id in arr.astype(np.uint64).tolist():
            e = self._find(timer_id)
            if e != NIL:
                self._unlink(e)
                self._free(e)
                cancelled += 1
        return cancelled

    def due_ms(self, timer_id=_MISSING):
        """The due time in ms of the pending timer ``timer_id``, or None if it is not pending (fired,
        cancelled, never issued, or any other int). Of a deferred re-arm, the new due time.

        Raises:
            TypeError: ``timer_id`` is not an int.
        """
        if timer_id is _MISSING:
            raise TypeError(_missing_error("due_ms", "timer_id"))
        e = self._lookup(timer_id)
        return None if e == NIL else self._due[e]

    def now_ms(self):
        """The wheel's current time in ms (the last ``advance`` target, or the constructor's)."""
        return self._elapsed

    def active_count(self):
        """How many timers are scheduled and have neither fired nor been cancelled."""
        return self._count

    def __len__(self):
        return self._count

    def next_fire_ms(self):
        """A time in ms to sleep until: never later than the earliest pending due time.

        Exact for a timer within the 512 ms of level 0, and for the earliest slot of any level
        while no timer of that slot has been cancelled, moved away or re-armed later (deferred)
        since it last held one timer; otherwise an earlier bound: by less than that slot's width
        (512 * 64**(level - 1) ms), or for a deferred timer at most its old slot's last ms. Waking
        at the bound cascades that slot, so a reactor that sleeps until it wakes with nothing to
        fire at most once per overflow slot it passes: 2 per second from level 1, whatever the
        number of timers and re-arms. With nothing pending: ``now_ms() + 2**32``. O(levels).
        """
        if self._count == 0:
            return self._elapsed + IDLE_HINT_MS
        return self._bound[self._next_slot()]

    def poll_timeout(self, cap_ms=None):
        """The reactor's poll timeout in ms: until the earliest pending due time, at most ``cap_ms``.

        ``next_fire_ms() - now_ms()`` (never below 0), capped at ``cap_ms`` (an int >= 0) and at
        one day (asyncio's MAXIMUM_SELECT_TIMEOUT), so every selector accepts it: pass
        ``timeout_ms / 1000`` to ``selectors``, ``select.epoll.poll`` and ``select.select``, or the
        ms to ``select.poll.poll``. With nothing pending: ``cap_ms``, or None when no cap is given
        (poll until I/O arrives). O(levels), as ``next_fire_ms``.

        Raises:
            TypeError: ``cap_ms`` is not an int (or is a bool).
            ValueError: ``cap_ms`` is negative.
        """
        cap = _poll_cap(cap_ms)
        if self._count == 0:
            return None if cap_ms is None else cap
        return min(max(self._bound[self._next_slot()] - self._elapsed, 0), cap)

    def nbytes(self):
        """Bytes of the timer store as the C core counts them: 32 per entry of the pool's capacity
        (grown as the C pool grows) plus the slot tables.

        Pool entries are reused, never returned, so this stays flat under schedule/cancel churn.
        """
        return ENTRY_BYTES * pool_capacity(len(self._due)) + SLOT_TABLE_BYTES

    def __repr__(self):
        return f"<TimerWheel now_ms={self._elapsed} pending={self._count} implementation=pure>"

    def __reduce_ex__(self, protocol):
        _refuse_copy(self)


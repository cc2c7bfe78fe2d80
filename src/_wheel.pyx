# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, binding=False
"""The TimerWheel core: a hierarchical hashed timing wheel over a typed entry pool.

See the design comment below; ``timerwheel_c/pure/wheel.py`` is the pure-Python twin, function by
function in the same order. Both import their Python-level checks and constants from the neutral
``timerwheel_c/_common.py``; the geometry compiled in here is checked against it by the tests.
"""
# TimerWheel: a hierarchical hashed timing wheel (Varghese & Lauck 1987, scheme 7), laid out like
# tokio's time driver (tokio/src/runtime/time/wheel/{mod,level}.rs). Times are integer ms on the
# caller's monotonic clock; the wheel stands at E = now_ms().
#
# Levels and granularity (levels l >= 1 are the overflow: timers longer than one 512 ms
# rotation wait there and cascade down when the wheel reaches their slot):
#
#   level  slots  slot width            one rotation
#     0     512   1 ms                  512 ms
#     1      64   512 ms                32.8 s
#     2      64   32.8 s                35 min
#     3      64   35 min                37.3 h
#     4      64   37.3 h                99 days
#     l      64   2**(6l+3) ms          2**(6l+9) ms
#     9      64   2**57 ms              2**63 ms   (due times are capped at 2**62 ms)
#
# Why this geometry. The workload is network timeouts, most of which never fire: a request
# deadline or a retransmit (10 ms to 0.5 s) is cancelled when the answer arrives, an idle timeout
# (5 s to minutes) is re-armed on every message and cancelled when the connection closes.
#   - 512 level-0 slots of 1 ms put every timer under 512 ms in level 0 from the start: it fires
#     exactly, with no cascade, and its cancel is one unlink. With 64 slots (Linux's LVL_SIZE,
#     tokio's) the 64-511 ms range, the request and retransmit timeouts, would each be filed
#     twice. The cost is 8 occupancy words for level 0 instead of 1 (one 64-byte cache line),
#     scanned only up to the first set bit.
#   - The slot tables are 1088 slots * 16 B + 17 words * 8 B = 17,544 B, resident in L1/L2; the
#     timers themselves cost 32 B each (below), so 100,000 timers take 3.2 MB.
#   - Cascades are exact: a timer fires on the first advance at or after its due ms at every
#     level, so the worst-case lateness is the 1 ms tick at every level (Linux's wheel, which
#     never cascades, fires a timer up to 1/8 of its timeout late: a 30 s timeout sits in its
#     level 3, 512 ms granularity at HZ=1000). What exactness costs is one relink per level a
#     timer descends, paid only by timers still pending when the wheel reaches their slot: a
#     30 s idle timeout is relinked at most twice in its life (level 2 to 1, 1 to 0), a cancelled
#     one never. A re-arm to a later time in an overflow slot is deferred (below), so however
#     often a connection re-arms, its timer is relinked at most once per slot it waits in.
#
# Named as Linux names them (LVL_BITS, LVL_SIZE, LVL_OFFS): level 0 has L0_SLOTS = 2**L0_BITS
# slots, level l >= 1 has LEVEL_SLOTS = 2**LEVEL_BITS slots of 2**level_shift(l) ms, where
# level_shift(l) = L0_BITS + LEVEL_BITS * (l - 1) = 6l + 3.
#
# The flat slot index f numbers every slot of every level in one table (heads, tails, bounds):
#
#   level 0:        f = T & (L0_SLOTS - 1)                                   0 .. 511
#   level l >= 1:   f = LEVEL_BASE + LEVEL_SLOTS * l + ((T >> level_shift(l)) & (LEVEL_SLOTS - 1))
#                     (LEVEL_BASE = L0_SLOTS - LEVEL_SLOTS = 448)            512 .. 1087
#
# so slot f's occupancy bit is bit f & 63 of the 64-bit word f >> 6 at every level: level 0 owns
# words 0..7, and level l >= 1 is exactly word LEVEL_BASE / 64 + l = 7 + l.
#
# Placement: a timer due at T sits at the level of the highest digit in which T and E differ
# (level 0 = bits 0..8, level l = bits 6l+3..6l+8), in the slot of T's digit at that level. So it
# shares every higher digit with E, and its digit at its level is after E's: no level ever wraps,
# and every timer of a lower level is due before every timer of a higher one. advance() keeps this
# invariant: it moves E only to the start of the earliest occupied slot (firing a level-0 slot,
# whose timers all share one due time, or cascading a higher slot whole to lower levels), and at
# the end to now_ms, which lies before every remaining slot's start.
#
# Deferred re-arm (Linux's "most timers never fire"; Netty's IdleStateHandler and Kafka's purgatory
# re-file lazily too): a reschedule to the same or a later due time of a timer waiting in an
# overflow slot only writes the new due time into its entry. The timer stays in its slot, whose
# start is at or before the old due time, hence before the new one; when the wheel reaches that
# slot, the cascade files it by its new due time. So a re-arm touches one cache line (the entry)
# instead of four (the entry, its two list neighbours and the new slot's tail), which is what a
# re-arm in random connection order pays in cache misses. A reschedule to an earlier time, or of
# a timer in level 0, re-files at once: a level-0 slot only ever holds timers due at its own ms.
#
# Exact and approximate:
#   - Firing is exact to the 1 ms tick: a timer fires on the first advance(t) with t >= its due
#     time, never earlier, at any distance (wraps, multiples of 512, many rotations, coarse steps),
#     deferred or not.
#   - next_fire_ms() is the lower bound kept per slot (lowered on insert, reset when the slot empties
#     or is left with one timer, then capped at the slot's last ms) of the earliest occupied slot.
#     It is exact for level 0, and for a higher slot unless its earliest timer was cancelled,
#     moved away or deferred while others stay; then it is early by less than that slot's width
#     (512 ms at level 1, 32.8 s at level 2, 2**(6l+3) ms at level l), or, for a deferred timer,
#     it is at most the old slot's last ms. Waking at it advances to the slot's start, cascading
#     the slot, so a reactor that sleeps until next_fire_ms() wakes with nothing to fire at most
#     once per overflow slot start it passes: 2 per second from level 1, 1 per 32.8 s from level 2.
#
# Fire order: non-decreasing due time; equal due times in arming order (the order of the schedule
# and reschedule calls), but for a deferred re-arm, which fires among the timers of its due ms in
# the order it was re-filed. Why: placement depends only on (E, T), so timers with equal T always
# share one slot list unless deferred. Arming appends at the tail, cancel/reschedule unlink without
# reordering the rest, and a cascade walks a list from the head appending each timer to the tail of
# its new list, which holds no other undeferred timer with the same T (they were all in the
# cascaded list). So every list is in arming order per due time, and a level-0 list, holding one
# due time, fires in arming order. (asyncio's heap keeps no order at all among equal deadlines.)
#
# Costs: schedule, cancel, reschedule O(1) (a few bit operations, no scan of timers). advance
# visits occupied slots only, found by masking the occupancy bitmaps (level 0: 8 words, level l: 1
# word) and counting trailing zeros: O(timers fired + cascades), each timer cascading at most 9
# times, however long the gap. next_fire_ms O(levels), whatever the number of timers.
#
# Memory: one 32-byte pool entry per timer (due, token, list links, generation, slot), no Python
# object per timer. cancel and fire return the entry to a LIFO free list at once (no lazy
# cancellation), so churn never grows the pool. (A wheel told c_take_in_order instead takes the
# first free entry after the one it took last, keeping at most 3/4 of the entries in use: the
# event loop's, whose timers' entries then lie in arming order.) Ids are (generation << 32) | index
# with the generation bumped on every free (32 bits, skipping 0): a stale id names a later timer
# only after 2**32 reuses of the same entry. The pool starts on a 64-byte boundary, so no entry straddles two
# cache lines (a re-arm at 100k timers is bound by the misses on the entry and its list neighbours).
# advance and advance_array gather fired tokens in a C scratch buffer, then hand them out (one
# ndarray, or ints appended to a list); a buffer over BUF_KEEP tokens (32 KB) is freed after the
# call, so it never pins a one-off jump's size.
#
# Reentrancy: any call into Python (a numpy or list allocation, an int, a foreign __index__) can
# run the garbage collector, whose Python code (a finalizer, weakref callback, gc.callbacks) may
# call this very wheel. So no method runs Python code between reading the wheel's state and
# writing C memory sized or indexed from it: conversions come first, the C work follows in one
# stretch, and the scratch buffer is detached from the wheel while its tokens are handed out, so a
# nested advance fills a buffer of its own.
cimport cython
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy, memmove

import numpy as np
cimport numpy as cnp

cnp.import_array()

import warnings

# The Python-level checks exist once, in the neutral module both twins import.
from timerwheel_c._common import (
    _MISSING as _MISSING_OBJ,
    FIRST_JUMP_WARN_MS,
    IDLE_HINT_MS as _IDLE_HINT_MS,
    MAX_DUE_MS as _MAX_DUE_MS,
    U64_LIMIT,
    _as_int,
    _as_int_array,
    _check_batch,
    _due_error,
    _first_jump_warning,
    _missing_error,
    _refuse_copy,
    _poll_cap,
)

__all__ = ["TimerWheel"]

cdef extern from "wheel_bits.h":
    int tw_ctz64(uint64_t x) noexcept nogil
    int tw_msb64(uint64_t x) noexcept nogil
    void tw_prefetch(const void* p) noexcept nogil

cdef extern from "Python.h":
    # Never raises for an int (callers pass ints only): it reports overflow in its flag, which the
    # callers turn into "not pending" or a ValueError, never an OverflowError or a wrapped value.
    long long _long_as_i64_overflow "PyLong_AsLongLongAndOverflow"(object o, int* overflow) noexcept

# The geometry (L0_BITS, NUM_SLOTS...), the entry layout and the class's fields: src/_wheel.pxd.

cdef enum:
    NIL = -1
    BUF_KEEP = 4096
    CACHE_LINE = 64

# The values shared with the pure twin, from the neutral module (see there).
cdef int64_t MAX_DUE_MS = _MAX_DUE_MS
cdef int64_t IDLE_HINT_MS = _IDLE_HINT_MS
cdef int64_t NO_BOUND = 0x7FFFFFFFFFFFFFFF
cdef uint32_t FREE = 0xFFFFFFFF
# A typed reference to the placeholder default of required arguments: `is` on it costs no lookup.
cdef object _MISSING = _MISSING_OBJ

cdef inline int _read_u64(object value, uint64_t* out) except -1:
    """Store the Python int ``value`` to ``out`` and return 1, or return 0 if it lies outside [0, 2**64).

    The int64 read needs no exception machinery; only [2**63, 2**64) takes the slow road.
    """
    cdef int overflow = 0
    cdef long long v = _long_as_i64_overflow(value, &overflow)
    if overflow == 0 and v >= 0:
        out[0] = <uint64_t>v
        return 1
    if overflow > 0 and value < U64_LIMIT:
        out[0] = value
        return 1
    return 0


cdef inline int _as_token(object value, uint64_t* out) except -1:
    """Store ``value`` checked as a token in [0, 2**64) to ``out``; TypeError/ValueError otherwise."""
    if type(value) is not int:
        value = _as_int(value, "token")
    if _read_u64(value, out):
        return 0
    raise ValueError(f"token {value} is out of range [0, 2**64)")


cdef inline int64_t _as_delay(object after_ms) except -1:
    """``after_ms`` as a delay in ms clamped to [1, 2**62 + 1]: 0 or less counts as 1, and anything
    over 2**62 is beyond every due time alike. TypeError if not an int."""
    cdef int overflow = 0
    cdef long long after
    if type(after_ms) is not int:
        after_ms = _as_int(after_ms, "after_ms")
    after = _long_as_i64_overflow(after_ms, &overflow)
    # On overflow ``after`` is -1: test the flag first.
    if overflow < 0 or (overflow == 0 and after < 1):
        return 1
    if overflow > 0 or after > MAX_DUE_MS:
        return MAX_DUE_MS + 1
    return after


cdef inline int level_shift(int level) noexcept nogil:
    """log2 of the slot width in ms of level ``level`` >= 1 (9 at level 1, then 6 more per level)."""
    return L0_BITS + LEVEL_BITS * (level - 1)


cdef inline uint32_t _slot_for(int64_t elapsed, int64_t due) noexcept nogil:
    """The flat slot for a timer due at ``due`` ms while the wheel stands at ``elapsed`` ms.

    The level is the highest level-digit in which ``due`` and ``elapsed`` differ (tokio's
    ``level_for``), so a timer sits at the lowest level whose current span contains its due time.
    """
    cdef uint64_t x = <uint64_t>(elapsed ^ due)
    cdef int level
    if x < L0_SLOTS:
        return <uint32_t>(due & (L0_SLOTS - 1))
    level = (tw_msb64(x) - L0_BITS) // LEVEL_BITS + 1
    return <uint32_t>(LEVEL_BASE + LEVEL_SLOTS * level + ((due >> level_shift(level)) & (LEVEL_SLOTS - 1)))


@cython.final
cdef class TimerWheel:
    """A hierarchical hashed timing wheel: 512 slots of 1 ms, then 9 levels of 64 slots.

    Times are integer ms on the caller's monotonic clock. ``schedule``, ``cancel`` and
    ``reschedule`` are O(1); ``advance`` costs O(timers fired + cascades), never O(gap).
    Design: tokio's time driver wheel (runtime/time/wheel), Varghese & Lauck's hashed and
    hierarchical wheels; see the design comment at the top of ``src/_wheel.pyx``.

    Args:
        now_ms: the current time in ms on your clock, an int in [0, 2**62]. Omitted (or None), the
            wheel starts at 0 ms; its first ``advance`` then warns (RuntimeWarning) if it jumps by
            more than a day, which a clock reading such as ``time.monotonic_ns() // 10**6`` does,
            firing every timer at once.

    Raises:
        TypeError: ``now_ms`` is not an int.
        ValueError: ``now_ms`` is outside [0, 2**62].
    """
    # The fields and C methods are declared in src/_wheel.pxd.

    def __cinit__(self, *args, **kwargs):
        # The tables are valid from allocation on, even if __init__ never runs.
        cdef int f
        self._free_head = NIL
        for f in range(NUM_SLOTS):
            self._head[f] = NIL
            self._tail[f] = NIL
            self._bound[f] = NO_BOUND
        for f in range(NUM_WORDS):
            self._occ[f] = 0

    def __init__(self, now_ms=None):
        cdef bint warn_jump = now_ms is None
        now_ms = _as_int(0 if warn_jump else now_ms, "now_ms")
        if now_ms < 0 or now_ms > MAX_DUE_MS:
            raise ValueError(f"now_ms {now_ms} is out of range [0, 2**62]")
        # Moving the clock of a wheel that already issued ids would break its slot invariant.
        if self._used:
            raise RuntimeError("TimerWheel.__init__ called on a wheel already in use")
        self._elapsed = now_ms
        self._warn_jump = warn_jump

    def __dealloc__(self):
        free(self._pool_raw)
        free(self._buf)

    cdef int _grow_buf(self) except -1:
        """Double ``_buf`` (advance_array's scratch; C only, the twin builds its array from a list)."""
        cdef Py_ssize_t cap = 1024 if self._buf_cap == 0 else 2 * self._buf_cap
        cdef uint64_t* buf = <uint64_t*>realloc(self._buf, cap * sizeof(uint64_t))
        if buf == NULL:
            raise MemoryError(f"TimerWheel cannot grow its advance_array buffer to {cap} tokens")
        self._buf = buf
        self._buf_cap = cap
        return 0

    cdef int _grow_pool(self, int32_t cap) except -1:
        """Reallocate the pool for ``cap`` entries, aligned to 64 bytes (C only: the twin's pool is
        Python lists). An entry split over two cache lines costs a re-arm a second miss."""
        cdef size_t old_off = <char*>self._pool - self._pool_raw
        cdef char* raw = <char*>realloc(self._pool_raw, <size_t>cap * sizeof(entry_t) + CACHE_LINE)
        cdef size_t new_off
        if raw == NULL:
            raise MemoryError(f"TimerWheel cannot grow its pool to {cap} entries")
        new_off = (CACHE_LINE - (<size_t>raw & (CACHE_LINE - 1))) & (CACHE_LINE - 1)
        if new_off != old_off:
            memmove(raw + new_off, raw + old_off, <size_t>self._used * sizeof(entry_t))
        self._pool_raw = raw
        self._pool = <entry_t*>(raw + new_off)
        self._cap = cap
        return 0

    cdef inline int32_t _alloc(self) except -1:
        """A free entry index: the most recently freed one (LIFO), else a fresh one at generation 1;
        in order (``c_take_in_order``), the first free one at or after the cursor (``_take_in_order``)."""
        cdef int32_t e = self._free_head
        if e != NIL:
            self._free_head = self._pool[e].next
            return e
        if self._ordered:
            return self._take_in_order()
        if self._used == self._cap:
            self._grow_pool(self._next_cap())
        e = self._used
        self._used += 1
        self._pool[e].gen = 1
        self._pool[e].loc = FREE
        return e

    cdef int32_t _next_cap(self) except -1:
        """The pool's next capacity: twice the present one (64 at first), up to MAX_ENTRIES.

        Raises:
            MemoryError: the pool holds MAX_ENTRIES already.
        """
        if self._cap == MAX_ENTRIES:
            raise MemoryError(f"TimerWheel holds {MAX_ENTRIES} entries, its limit")
        return 64 if self._cap == 0 else (MAX_ENTRIES if self._cap > MAX_ENTRIES // 2 else 2 * self._cap)

    cdef int32_t _take_in_order(self) except -1:
        """The first free entry at or after the cursor (wrapping), the cursor moved past it. Once 3/4
        of the entries in use are taken, the entries in use grow to 1.5 times the timers (fresh
        ones, at generation 1, the cursor at the first), so a sweep of the cursor finds a free entry
        every few entries and the pool holds at most about 1.5 entries per timer."""
        cdef int32_t e, k, used
        cdef int64_t want
        if self._count * 4 >= <int64_t>self._used * 3 and self._used < MAX_ENTRIES:
            want = min(max(<int64_t>self._count * 3 // 2, <int64_t>self._used + 64), <int64_t>MAX_ENTRIES)
            if self._cap < want:
                # To the entries wanted (a multiple of 64), not twice the pool: it grows by an eighth or more.
                self._grow_pool(<int32_t>min((want + 63) & ~(<int64_t>63), <int64_t>MAX_ENTRIES))
            for e in range(self._used, <int32_t>want):
                self._pool[e].gen = 1
                self._pool[e].loc = FREE
                self._pool[e].next = NIL
            self._cursor = self._used
            self._used = <int32_t>want
        if self._count >= self._used:
            raise MemoryError(f"TimerWheel holds {MAX_ENTRIES} entries, its limit")
        e = self._cursor
        used = self._used
        for k in range(used):
            if e >= used:
                e = 0
            if self._pool[e].loc == FREE:
                self._cursor = e + 1
                # The entries the next takes most likely get, a cache line ahead: written then.
                if e + 2 < used:
                    tw_prefetch(&self._pool[e + 2])
                return e
            e += 1
        raise AssertionError("TimerWheel: no free entry under the cursor")  # not reached: one is free

    cdef inline void _free(self, int32_t e) noexcept:
        """Return entry ``e`` to the free list at once; its generation moves on, so its old id is stale."""
        cdef entry_t* p = &self._pool[e]
        p.gen += 1
        if p.gen == 0:
            p.gen = 1
        p.loc = FREE
        self._count -= 1
        if self._ordered:
            # Found by the cursor's sweep, not kept on a list; taken again first if it was the last taken.
            p.next = NIL
            if e == self._cursor - 1:
                self._cursor = e
            return
        p.next = self._free_head
        self._free_head = e

    cdef inline void _link(self, int32_t e) noexcept:
        """Append entry ``e`` to the tail of its slot, chosen from its due time and ``_elapsed``."""
        cdef entry_t* p = &self._pool[e]
        cdef uint32_t f = _slot_for(self._elapsed, p.due)
        cdef int32_t tail = self._tail[f]
        p.prev = tail
        p.next = NIL
        if tail == NIL:
            self._head[f] = e
            self._occ[f >> 6] |= (<uint64_t>1) << (f & 63)
        else:
            self._pool[tail].next = e
        self._tail[f] = e
        if p.due < self._bound[f]:
            self._bound[f] = p.due
        p.loc = f

    cdef inline void _unlink(self, int32_t e) noexcept:
        """Take entry ``e`` out of its slot list; an emptied slot clears its bit and bound."""
        cdef entry_t* p = &self._pool[e]
        cdef uint32_t f = p.loc
        cdef int32_t head
        if p.prev == NIL:
            self._head[f] = p.next
        else:
            self._pool[p.prev].next = p.next
        if p.next == NIL:
            self._tail[f] = p.prev
        else:
            self._pool[p.next].prev = p.prev
        head = self._head[f]
        if head == NIL:
            self._occ[f >> 6] &= ~((<uint64_t>1) << (f & 63))
            self._bound[f] = NO_BOUND
        elif head == self._tail[f]:
            # One timer left: its bound is exact again (next_fire_ms is exact for one pending timer).
            self._bound[f] = self._lone_bound(f, self._pool[head].due)

    cdef inline void _pop_head(self, int32_t f, int32_t nxt) noexcept:
        """``_unlink`` of the head of level-0 slot ``f``, whose successor is ``nxt``: the firing
        loop's case. Every timer of a level-0 slot has one due time, so a non-empty slot's bound
        stays exact and only an emptied slot clears its bit and bound."""
        self._head[f] = nxt
        if nxt == NIL:
            self._tail[f] = NIL
            self._occ[f >> 6] &= ~((<uint64_t>1) << (f & 63))
            self._bound[f] = NO_BOUND
        else:
            self._pool[nxt].prev = NIL

    cdef inline int32_t _next_slot(self) noexcept:
        """The occupied flat slot with the earliest start at or after ``_elapsed``, or NIL.

        Every timer at level l shares the digits above l with ``_elapsed`` and has its level-l digit
        at or after ``_elapsed``'s, so no level wraps, and any timer of a lower level is due before
        every timer of a higher one: the first level with a bit at or after its current digit wins.
        """
        cdef int64_t elapsed = self._elapsed
        cdef int d = elapsed & (L0_SLOTS - 1)
        cdef int w = d >> 6
        cdef int level
        cdef uint64_t word = self._occ[w] & ~(((<uint64_t>1) << (d & 63)) - 1)
        while True:
            if word:
                return (w << 6) | tw_ctz64(word)
            w += 1
            if w == L0_SLOTS >> 6:
                break
            word = self._occ[w]
        for level in range(1, NUM_LEVELS):
            word = self._occ[(LEVEL_BASE >> 6) + level]
            if word:
                d = (elapsed >> level_shift(level)) & (LEVEL_SLOTS - 1)
                word &= ~(((<uint64_t>1) << d) - 1)
                if word:
                    return LEVEL_BASE + LEVEL_SLOTS * level + tw_ctz64(word)
        return NIL

    cdef inline int64_t _slot_start(self, int32_t f) noexcept:
        """The first ms covered by flat slot ``f`` in the current rotation of its level."""
        cdef int level, shift
        if f < L0_SLOTS:
            return (self._elapsed & ~(<int64_t>(L0_SLOTS - 1))) | f
        level = (f - LEVEL_BASE) >> LEVEL_BITS
        shift = level_shift(level)
        return <int64_t>((<uint64_t>self._elapsed & ~(((<uint64_t>1) << (shift + LEVEL_BITS)) - 1))
                         | ((<uint64_t>(f & (LEVEL_SLOTS - 1))) << shift))

    cdef inline int64_t _lone_bound(self, int32_t f, int64_t due) noexcept:
        """The bound of slot ``f`` holding one timer, due at ``due`` ms: ``due``, capped at the
        slot's last ms. A deferred timer may be due after later slots start; the cap keeps the
        earliest slot's bound before every other slot's timers, and waking at it cascades the slot."""
        cdef int64_t last
        if f < L0_SLOTS:
            return due
        last = self._slot_start(f) + ((<int64_t>1) << level_shift((f - LEVEL_BASE) >> LEVEL_BITS)) - 1
        return due if due < last else last

    cdef inline int32_t _find(self, uint64_t timer_id) noexcept:
        """The entry index ``timer_id`` names if that timer is pending, else NIL."""
        cdef uint64_t e = <uint32_t>timer_id
        if e >= <uint64_t>self._used:
            return NIL
        if self._pool[e].gen != <uint32_t>(timer_id >> 32) or self._pool[e].loc == FREE:
            return NIL
        return <int32_t>e

    cdef inline int32_t _lookup(self, object timer_id) except -2:
        """``_find`` for any Python int; TypeError for a non-int, NIL for ints outside [0, 2**64)."""
        cdef uint64_t u
        if type(timer_id) is not int:
            timer_id = _as_int(timer_id, "timer_id")
        if _read_u64(timer_id, &u):
            return self._find(u)
        return NIL

    cdef inline int64_t _due_for(self, int64_t delay, object after_ms) except -1:
        """The due time in ms of a timer armed ``delay`` (from ``_as_delay(after_ms)``) ms from now.

        Raises:
            ValueError: the due time is beyond 2**62 ms.
        """
        if delay > MAX_DUE_MS - self._elapsed:
            raise ValueError(_due_error(self._elapsed, after_ms))
        return self._elapsed + delay

    cdef inline uint64_t _arm(self, int64_t due, uint64_t token) except? 0:
        """Take an entry for a timer due at ``due`` ms firing ``token`` and link it; returns its id."""
        cdef int32_t e = self._alloc()
        self._pool[e].due = due
        self._pool[e].token = token
        self._link(e)
        self._count += 1
        return ((<uint64_t>self._pool[e].gen) << 32) | <uint64_t>e

    cdef inline void _move(self, int32_t e, int64_t due) noexcept:
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
        cdef entry_t* p = &self._pool[e]
        cdef uint32_t f = p.loc
        if f >= L0_SLOTS and due >= p.due:
            p.due = due
            if self._head[f] == e and self._tail[f] == e:
                self._bound[f] = self._lone_bound(f, due)
            return
        self._unlink(e)
        p.due = due
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
        cdef int64_t delay = _as_delay(after_ms)
        cdef uint64_t tok
        _as_token(token, &tok)
        return self._arm(self._due_for(delay, after_ms), tok)

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
        cdef int overflow = 0
        cdef long long due
        cdef uint64_t tok
        if type(due_ms) is not int:
            due_ms = _as_int(due_ms, "due_ms")
        due = _long_as_i64_overflow(due_ms, &overflow)
        _as_token(token, &tok)
        if overflow > 0 or (overflow == 0 and due > MAX_DUE_MS):
            raise ValueError(f"due_ms {due_ms} is beyond 2**62 ms")
        if overflow < 0 or due < self._elapsed:
            due = self._elapsed
        return self._arm(due, tok)

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
        cdef int32_t e = self._lookup(timer_id)
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
        cdef int64_t delay = _as_delay(after_ms)
        cdef int32_t e = self._lookup(timer_id)
        cdef int64_t due = self._due_for(delay, after_ms)
        if e == NIL:
            return False
        self._move(e, due)
        return True

    cdef Py_ssize_t _run(self, int64_t now) except -1:
        """Advance ``_elapsed`` to ``now``, putting each fired token in fire order in the scratch
        buffer ``_buf`` (grown as needed); returns the count. Runs no Python code, so nothing can
        change the wheel or the buffer under it (the twin appends to a list instead).

        Jumps from occupied slot to occupied slot: a level-0 slot fires whole (all its timers share
        one due time, in arming order); a higher slot cascades whole, in list order, to lower levels.
        A timer leaves its list only after its token is stored, so a failed grow leaves a consistent
        wheel.
        """
        cdef Py_ssize_t n = 0
        cdef int32_t f, e, nxt
        cdef int64_t start
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
                    nxt = self._pool[e].next
                    if n == self._buf_cap:
                        self._grow_buf()
                    self._buf[n] = self._pool[e].token
                    n += 1
                    self._pop_head(f, nxt)
                    self._free(e)
                    e = nxt
            else:
                e = self._head[f]
                self._head[f] = NIL
                self._tail[f] = NIL
                self._occ[f >> 6] &= ~((<uint64_t>1) << (f & 63))
                self._bound[f] = NO_BOUND
                while e != NIL:
                    nxt = self._pool[e].next
                    self._link(e)
                    e = nxt
        self._elapsed = now
        return n

    cdef uint64_t* _detach_buf(self, Py_ssize_t* cap) noexcept:
        """Take the scratch buffer (and its capacity, into ``cap``) out of the wheel (C only).

        While its tokens are handed out, Python code may run (the GC) and advance this wheel: that
        nested call then gathers into a buffer of its own, never over these tokens.
        """
        cdef uint64_t* buf = self._buf
        cap[0] = self._buf_cap
        self._buf = NULL
        self._buf_cap = 0
        return buf

    cdef void _restore_buf(self, uint64_t* buf, Py_ssize_t cap) noexcept:
        """Give back a buffer from ``_detach_buf``: kept as scratch unless over BUF_KEEP tokens (a
        one-off jump must not pin its size) or a nested call left one already (C only)."""
        if self._buf == NULL and cap <= BUF_KEEP:
            self._buf = buf
            self._buf_cap = cap
        else:
            free(buf)

    cdef int64_t _check_now(self, object now_ms) except -1:
        """``now_ms`` as an int checked against the wheel's time.

        Warns:
            RuntimeWarning: the first advance of a wheel made without ``now_ms`` jumps by more
                than FIRST_JUMP_WARN_MS (a day): almost surely a clock reading.

        Raises:
            TypeError: ``now_ms`` is not an int.
            ValueError: ``now_ms`` is before ``now_ms()`` (time never goes backwards) or beyond 2**62.
        """
        cdef int overflow = 0
        cdef long long now
        if type(now_ms) is not int:
            now_ms = _as_int(now_ms, "now_ms")
        if self._warn_jump:
            # Before the checks below read the wheel: the warning runs Python code (filters, hooks).
            self._warn_jump = False
            if now_ms - self._elapsed > FIRST_JUMP_WARN_MS:
                warnings.warn(_first_jump_warning(now_ms), RuntimeWarning, stacklevel=1)
        now = _long_as_i64_overflow(now_ms, &overflow)
        if overflow < 0 or (overflow == 0 and now < self._elapsed):
            raise ValueError(
                f"now_ms {now_ms} is before the wheel's time {self._elapsed}: time never goes backwards"
            )
        if overflow > 0 or now > MAX_DUE_MS:
            raise ValueError(f"now_ms {now_ms} is beyond 2**62 ms")
        return now

    def advance(self, now_ms=_MISSING, list fired=None):
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
        cdef int64_t now
        cdef Py_ssize_t i, n, cap
        cdef uint64_t* buf
        if now_ms is _MISSING:
            raise TypeError(_missing_error("advance", "now_ms"))
        if fired is None:
            # Before the wheel is read: allocating may run the GC, whose Python code may advance it.
            fired = []
        now = self._check_now(now_ms)
        n = self._run(now)
        buf = self._detach_buf(&cap)
        try:
            for i in range(n):
                fired.append(buf[i])
        finally:
            self._restore_buf(buf, cap)
        return fired

    def advance_array(self, now_ms=_MISSING):
        """``advance(now_ms)`` returning the fired tokens as a 1-d ndarray of uint64, in fire order.

        Raises:
            as ``advance``.
        """
        if now_ms is _MISSING:
            raise TypeError(_missing_error("advance_array", "now_ms"))
        cdef int64_t now = self._check_now(now_ms)
        cdef cnp.npy_intp n = 0
        cdef cnp.ndarray tokens
        cdef Py_ssize_t cap
        cdef uint64_t* buf
        n = self._run(now)
        buf = self._detach_buf(&cap)
        try:
            # The C API, not np.empty and a memoryview: their fixed cost outweighs a tick's few tokens.
            tokens = cnp.PyArray_EMPTY(1, &n, cnp.NPY_UINT64, 0)
            if n:
                memcpy(cnp.PyArray_DATA(tokens), buf, n * sizeof(uint64_t))
        finally:
            self._restore_buf(buf, cap)
        return tokens

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
        delays_arr, toks_arr = _check_batch(self._elapsed, after_ms, tokens)
        cdef const int64_t[::1] delays = np.ascontiguousarray(delays_arr)
        cdef const uint64_t[::1] toks = np.ascontiguousarray(toks_arr)
        cdef Py_ssize_t i, n = toks.shape[0]
        cdef int64_t top = 1
        ids = np.empty(n, dtype=np.uint64)
        cdef uint64_t[::1] out = ids
        # From here on no Python code runs. The allocations above may have run the GC, whose Python
        # code may have advanced this wheel since _check_batch: check the due times again.
        for i in range(n):
            if delays[i] > top:
                top = delays[i]
        self._due_for(top, top)
        for i in range(n):
            out[i] = self._arm(self._elapsed + delays[i], toks[i])
        return ids

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
        cdef const uint64_t[::1] tids = np.ascontiguousarray(arr, dtype=np.uint64)
        cdef Py_ssize_t i, cancelled = 0
        cdef int32_t e
        for i in range(tids.shape[0]):
            e = self._find(tids[i])
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
        cdef int32_t e = self._lookup(timer_id)
        return None if e == NIL else self._pool[e].due

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
        cdef int64_t cap = _poll_cap(cap_ms)
        if self._count == 0:
            return None if cap_ms is None else cap
        return min(max(self._bound[self._next_slot()] - self._elapsed, 0), cap)

    def nbytes(self):
        """Bytes of the timer store: 32 per pool entry plus the slot tables (not the 64-byte
        alignment slack nor advance_array's scratch, at most BUF_KEEP * 8 bytes between calls).

        Pool entries are reused, never returned, so this stays flat under schedule/cancel churn.
        """
        return <Py_ssize_t>sizeof(entry_t) * self._cap + sizeof(self._head) + sizeof(self._tail) \
            + sizeof(self._bound) + sizeof(self._occ)

    def __repr__(self):
        return f"<TimerWheel now_ms={self._elapsed} pending={self._count} implementation=c>"

    def __reduce_ex__(self, protocol):
        _refuse_copy(self)  # the pure twin's TypeError, word for word

    # -- the C-level API (declared in src/_wheel.pxd, for cimport by other extensions) -------------
    # Each is its Python method without the argument conversion; ids and tokens as there.

    cdef uint64_t c_schedule(self, int64_t after_ms, uint64_t token) except 0:
        """``schedule(after_ms, token)``: the new timer's id (never 0).

        Raises:
            ValueError: the due time is beyond 2**62 ms. MemoryError: the pool cannot grow.
        """
        cdef int64_t delay = 1 if after_ms < 1 else after_ms
        return self._arm(self._due_for(delay, after_ms), token)

    cdef uint64_t c_schedule_at(self, int64_t due_ms, uint64_t token) except 0:
        """``schedule_at(due_ms, token)``: the new timer's id (never 0); due now if ``due_ms`` is at
        or before ``c_now_ms()``.

        Raises:
            ValueError: ``due_ms`` is beyond 2**62. MemoryError: the pool cannot grow.
        """
        if due_ms > MAX_DUE_MS:
            raise ValueError(f"due_ms {due_ms} is beyond 2**62 ms")
        return self._arm(due_ms if due_ms > self._elapsed else self._elapsed, token)

    cdef bint c_cancel(self, uint64_t timer_id) noexcept:
        """``cancel(timer_id)``: True exactly once for a pending timer."""
        cdef int32_t e = self._find(timer_id)
        if e == NIL:
            return False
        self._unlink(e)
        self._free(e)
        return True

    cdef int c_reschedule(self, uint64_t timer_id, int64_t after_ms) except -1:
        """``reschedule(timer_id, after_ms)``: 1 if the timer was pending and is moved, else 0.

        Raises:
            ValueError: the due time is beyond 2**62 ms (the timer is unchanged).
        """
        cdef int64_t delay = 1 if after_ms < 1 else after_ms
        cdef int64_t due = self._due_for(delay, after_ms)
        cdef int32_t e = self._find(timer_id)
        if e == NIL:
            return 0
        self._move(e, due)
        return 1

    cdef void c_prefetch(self, uint64_t timer_id) noexcept:
        """A hint that ``timer_id`` is about to be re-armed or cancelled: starts loading its entry,
        so the cache miss overlaps the caller's work (a clock read, the delay's arithmetic) instead
        of stalling the re-arm. Any id is accepted; it changes nothing observable."""
        cdef uint64_t e = <uint32_t>timer_id
        if e < <uint64_t>self._used:
            tw_prefetch(&self._pool[e])

    cdef int c_advance(self, int64_t now_ms, tw_fired_t* fired) except -1:
        """``advance(now_ms)``: the fired tokens go to ``fired`` (in fire order), which the caller
        owns until it passes it to ``c_release``, whatever it calls meanwhile.

        Raises:
            ValueError: ``now_ms`` is before ``c_now_ms()`` or beyond 2**62; nothing fires.
        """
        cdef Py_ssize_t n = 0
        if now_ms < self._elapsed or now_ms > MAX_DUE_MS:
            self._check_now(now_ms)
        if self._count:
            n = self._run(now_ms)
        else:
            self._elapsed = now_ms
        fired.tokens = self._detach_buf(&fired.cap)
        fired.count = n
        return 0

    cdef void c_release(self, tw_fired_t* fired) noexcept:
        """Give back the buffer of a ``c_advance`` (kept as scratch, or freed)."""
        self._restore_buf(fired.tokens, fired.cap)
        fired.tokens = NULL
        fired.count = 0
        fired.cap = 0

    cdef int64_t c_next_fire_ms(self) noexcept:
        """``next_fire_ms()``: never later than the earliest pending due time (ms)."""
        if self._count == 0:
            return self._elapsed + IDLE_HINT_MS
        return self._bound[self._next_slot()]

    cdef int64_t c_now_ms(self) noexcept:
        """``now_ms()``: the wheel's time in ms."""
        return self._elapsed

    cdef int64_t c_due_ms(self, uint64_t timer_id) noexcept:
        """``due_ms(timer_id)``: the due time in ms of a pending timer, or -1 if it is not pending."""
        cdef int32_t e = self._find(timer_id)
        return -1 if e == NIL else self._pool[e].due

    cdef Py_ssize_t c_count(self) noexcept:
        """``active_count()``: how many timers are pending."""
        return self._count

    cdef int c_take_in_order(self) except -1:
        """From now on take entries in address order: the first free entry after the one taken last
        (an entry freed right after it was taken is taken again), keeping at most 3/4 of the pool's
        entries in use (the pool grows sooner: up to about 1.5 entries per timer). Timers armed one
        after another then lie one after another, so a cancel or a fire of timers in the order they
        were armed reads the pool sequentially, where the hardware prefetcher hides its misses;
        last-freed-first reuse pins each entry where its first timer was. The event loop's wheel
        (src/_loop.pyx) takes this. Ids stay valid and unique as ever; only which entry an id names
        changes. Only on a wheel that never armed a timer.

        Raises:
            RuntimeError: the wheel armed a timer already.
        """
        if self._used:
            raise RuntimeError("TimerWheel.c_take_in_order called on a wheel already in use")
        self._ordered = True
        self._cursor = 0
        return 0

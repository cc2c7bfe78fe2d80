# cython: language_level=3
"""A deadline release thread that never takes the GIL (compiled core of ReleaseTimer).

One release thread, one min-heap of deadlines, level-triggered deadlines (released
once, and a deadline already released stays so), with wake-ups for blocking and
asyncio waiters, sweeps of abandoned deadlines, a ``close()`` that wakes its waiters,
and fork safety. ``docs/DESIGN.md`` ("The release thread") gives the design.

The release thread is a native thread started here; it runs ``_release_main`` with no
GIL for its whole life and never runs Python. The heap is one array of ``heap_entry_t``
(deadline ns, sequence, slot); Deadlines are Python objects holding a slot index and
generation into a native array of ``slot_t``, which carries the released flag and the
release instant. Blocking waiters sleep on a C condition variable with the GIL released;
asyncio loops are reached through the bridge in ``_release_asyncio.pxi``.

The pure twin, ``timerwheel_c/pure/release.py``, mirrors this module function by function.
Units: deadlines are int nanoseconds on ``time.monotonic_ns()`` (``*_ns``) or float
seconds on ``time.monotonic()`` (``arm``); timeouts are float seconds.
"""
# Locking and fork rules, stated once (as tokio's runtime/time/entry.rs states its own):
#
# 1. Core.lock guards every field of Core and of each Chan, and the slot and heap arrays, except
#    the fields marked otherwise. It is a plain, non-reentrant mutex.
# 2. The release thread never takes the GIL and runs no Python. It holds Core.lock except while it
#    waits on a condition (which releases it) or sleeps its last step before a deadline.
# 3. The GIL side may take Core.lock while holding the GIL (nothing that holds the lock ever waits
#    for the GIL, by rule 2), but never calls Python while holding it: Python code can run the
#    garbage collector, whose finalizers (Deadline.__dealloc__ -> _abandon) take the lock again.
#    Blocking waits release the GIL first (`with nogil`), then take the lock.
# 4. Fork: each timer records the fork epoch it was made in; a forked child bumps the epoch. A
#    timer of an older epoch belongs to the parent: its thread does not exist in the child, and
#    its lock may be held forever by a thread that no longer runs. The child never locks, signals,
#    joins or destroys it: reads are taken unlocked (no thread here changes it), arm refuses, and
#    waits raise ReleaseTimerClosed. `_ours(c)` is the one guard every entry point asks first.
cimport cython
from cpython.exc cimport PyErr_CheckSignals
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, realloc

from tw_sync cimport *

ctypedef struct slot_t:
    int64_t released_at     # ns on time.monotonic_ns(), once RELEASED
    uint32_t gen            # bumped when the slot is freed, so stale keys never match
    int32_t chan            # the Chan index to notify on release, or -1
    int32_t next_free       # the free list, while FREE
    uint8_t state           # FREE, ARMED, RELEASED or ABANDONED


ctypedef struct heap_entry_t:
    int64_t at              # the deadline, ns on time.monotonic_ns()
    uint64_t seq            # arm order: equal deadlines release in arm order
    int32_t slot


cdef struct Chan  # one asyncio loop's inbox: see _release_asyncio.pxi


# A timer's state shared with its thread; guarded by `lock` unless noted (see the rules above).
cdef struct Core:
    tw_mutex_t lock
    tw_cond_t wake_cond     # wakes the release thread
    tw_cond_t released_cond # wakes blocking waiters
    tw_thread_t thread
    int thread_started      # owned by the GIL side: a thread to join exists
    int detached            # closed from its own thread: it still runs, so never free this
    int backend
    int closing
    int closed
    int epoch               # the fork epoch this timer was made in (set once)
    uint64_t wakes
    uint64_t seq
    heap_entry_t *heap      # the min-heap, ordered by (at, seq)
    Py_ssize_t h_len
    Py_ssize_t h_cap
    slot_t *slots           # the slot table a Deadline points into
    int32_t free_head
    Py_ssize_t s_len
    Py_ssize_t blocking_waiters
    int64_t last_sweep_ns
    Chan **chans
    Py_ssize_t n_chans

import asyncio
import os
import threading
import weakref

from timerwheel_c._common import _refuse_copy
from timerwheel_c._release_common import (
    BACKEND_NAMES,
    FAR_AHEAD_NS,
    _await_release,
    _check_at_ns,
    _choose_backend,
    _fallback_future,
    _far_ahead_error,
    _seconds_to_ns,
    _timeout_ns,
)
from timerwheel_c.errors import ReleaseTimerClosed

__all__ = ["Deadline", "ReleaseTimer", "ReleaseTimerClosed", "past_deadline"]

# Exported: the tests check them against timerwheel_c._release_common, where each is explained.
cpdef enum:
    SLICE_NS = 500000
    SWEEP_MIN_HEAP = 64
    SWEEP_EVERY_NS = 250000000
    WAIT_CHUNK_NS = 100000000

cdef enum:  # slot states
    FREE = 0
    ARMED = 1
    RELEASED = 2
    ABANDONED = 3

cdef enum:  # backends
    SLICE = 0
    CONDVAR = 1

# Bumped in a forked child: a timer created under another epoch belongs to the parent,
# whose release thread does not exist here, so the child must never touch its locks.
cdef int _fork_epoch = 0


def _after_fork_in_child():
    global _fork_epoch
    _fork_epoch += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


cdef inline bint _ours(Core *c) noexcept nogil:
    """True if ``c`` was made in this process since its last fork, so its lock and thread are live
    here (rule 4 of the header)."""
    return c.epoch == _fork_epoch


cdef class ReleaseTimer


# The asyncio bridge: channels, wake fds and helper threads.
include "_release_asyncio.pxi"


def past_deadline(at):
    """A Deadline already released, if ``at`` (float s on time.monotonic()) has passed, else None.

    Lets the process-wide timer answer past deadlines without starting. Raises as ``arm``.
    """
    cdef int64_t at_ns = _seconds_to_ns(at)
    cdef int64_t now_ns = tw_monotonic_ns()
    if at_ns <= now_ns:
        return _new_deadline(None, -1, 0, at_ns, now_ns)
    return None


# The construction token: Deadline.__new__ and _Channel.__new__ refuse to make an object
# without it, so none exists whose fields are not set (an unset one would dereference a
# None timer or a NULL Chan).
cdef object _MAKE = object()


cdef Deadline _new_deadline(ReleaseTimer rt, int32_t slot, uint32_t gen, int64_t at_ns, int64_t released_at_ns):
    cdef Deadline d = Deadline.__new__(Deadline, _MAKE)
    d._rt = rt  # None for a deadline released at arm time (slot -1)
    d._slot = slot
    d._gen = gen
    d._at_ns = at_ns
    d._released_at_ns = released_at_ns
    return d


@cython.no_gc_clear  # __dealloc__ needs _rt to abandon its slot
@cython.final
cdef class Deadline:
    """One armed deadline: level-triggered, released once the clock reaches ``at_ns``.

    ``done()`` is True from its release on; ``wait(timeout)`` blocks with the GIL
    released; ``await d`` works in any asyncio loop. Dropping every reference to a
    pending Deadline abandons it. Made by ``ReleaseTimer.arm``/``arm_ns`` only: direct
    construction (``Deadline()``, ``Deadline.__new__(Deadline)``) raises TypeError. A
    Deadline owns its slot, so it cannot be copied or pickled (TypeError): dropping a
    copy would abandon the original's deadline.
    """

    cdef ReleaseTimer _rt
    cdef int32_t _slot
    cdef uint32_t _gen
    cdef int64_t _at_ns
    cdef int64_t _released_at_ns

    def __cinit__(self, token=None, *args, **kwargs):
        self._slot = -1  # what __dealloc__ sees if the check below fails
        if token is not _MAKE:
            raise TypeError("Deadline objects are made by ReleaseTimer.arm() or arm_ns(), not constructed directly")

    @property
    def at_ns(self):
        """The deadline, int ns on time.monotonic_ns()."""
        return self._at_ns

    @property
    def released_at_ns(self):
        """When the release thread released it (int ns on time.monotonic_ns()), None before."""
        cdef Core *c
        cdef int64_t at = 0
        cdef bint released
        if self._slot < 0:
            return self._released_at_ns
        c = self._rt._core
        if _ours(c):
            tw_mutex_lock(&c.lock)
        released = c.slots[self._slot].state == RELEASED
        if released:
            at = c.slots[self._slot].released_at
        if _ours(c):
            tw_mutex_unlock(&c.lock)
        return at if released else None

    def done(self):
        """True once released, and from then on (level-triggered)."""
        cdef Core *c
        cdef bint released
        if self._slot < 0:
            return True
        c = self._rt._core
        if not _ours(c):  # the parent's timer: no other thread touches it here
            return c.slots[self._slot].state == RELEASED
        tw_mutex_lock(&c.lock)
        released = c.slots[self._slot].state == RELEASED
        tw_mutex_unlock(&c.lock)
        return released

    def wait(self, timeout=None):
        """Block until released (True) or ``timeout`` seconds pass (False); None waits forever.

        The GIL is released while blocked; every WAIT_CHUNK_NS it is taken back to run
        signal handlers (so Ctrl-C interrupts a wait).

        Raises:
            ReleaseTimerClosed: the timer was closed (or belongs to a forked parent) first.
        """
        cdef int64_t timeout_ns, until_ns, chunk_end, now_ns
        cdef int32_t slot = self._slot
        cdef Core *c
        cdef uint8_t state
        cdef bint closed
        if slot < 0:
            return True
        timeout_ns = _timeout_ns(timeout)
        c = self._rt._core
        if not _ours(c):
            if c.slots[slot].state == RELEASED:
                return True
            raise ReleaseTimerClosed("the ReleaseTimer belongs to the parent of this forked process")
        until_ns = -1 if timeout_ns < 0 else tw_monotonic_ns() + timeout_ns
        while True:
            with nogil:
                tw_mutex_lock(&c.lock)
                c.blocking_waiters += 1
                now_ns = tw_monotonic_ns()
                chunk_end = now_ns + WAIT_CHUNK_NS
                if until_ns >= 0 and until_ns < chunk_end:
                    chunk_end = until_ns
                while c.slots[slot].state == ARMED and not c.closed and now_ns < chunk_end:
                    tw_cond_timedwait_until(&c.released_cond, &c.lock, chunk_end)
                    now_ns = tw_monotonic_ns()
                c.blocking_waiters -= 1
                state = c.slots[slot].state
                closed = c.closed
                tw_mutex_unlock(&c.lock)
            if state != ARMED or closed or (until_ns >= 0 and now_ns >= until_ns):
                break
            PyErr_CheckSignals()
        if state == RELEASED:
            return True
        if closed:
            raise ReleaseTimerClosed(f"the ReleaseTimer was closed before the deadline at_ns={self._at_ns}")
        return False

    def __await__(self):
        if self._slot < 0:
            return _await_release(self, None, 0, None).__await__()
        return _await_release(self, *self._rt._subscribe(self, asyncio.get_running_loop())).__await__()

    def __reduce_ex__(self, protocol):
        # copy.copy, copy.deepcopy and pickle all come here
        raise TypeError("Deadline objects cannot be copied or pickled: each owns its slot on the "
                        "ReleaseTimer, and dropping a copy would abandon the original's deadline")

    def __dealloc__(self):
        if self._slot >= 0 and self._rt is not None:
            _abandon(self._rt._core, self._slot, self._gen)

    def __repr__(self):
        released_at_ns = self.released_at_ns
        state = "pending" if released_at_ns is None else f"released_at_ns={released_at_ns}"
        return f"<Deadline at_ns={self._at_ns} {state} implementation=c>"


cdef inline bint _heap_less(Core *c, Py_ssize_t i, Py_ssize_t j) noexcept nogil:
    return c.heap[i].at < c.heap[j].at or (c.heap[i].at == c.heap[j].at and c.heap[i].seq < c.heap[j].seq)


cdef inline void _heap_swap(Core *c, Py_ssize_t i, Py_ssize_t j) noexcept nogil:
    cdef heap_entry_t entry = c.heap[i]
    c.heap[i] = c.heap[j]
    c.heap[j] = entry


cdef void _sift_down(Core *c, Py_ssize_t i) noexcept nogil:
    cdef Py_ssize_t child
    while True:
        child = 2 * i + 1
        if child >= c.h_len:
            return
        if child + 1 < c.h_len and _heap_less(c, child + 1, child):
            child += 1
        if not _heap_less(c, child, i):
            return
        _heap_swap(c, i, child)
        i = child


cdef Py_ssize_t _heap_push(Core *c, int64_t at_ns, int32_t slot) noexcept nogil:
    """Push (at_ns, next seq, slot); returns its final index, or -1 without memory."""
    cdef Py_ssize_t i, parent, cap
    cdef heap_entry_t *heap
    if c.h_len == c.h_cap:
        cap = 64 if c.h_cap == 0 else c.h_cap * 2
        heap = <heap_entry_t *>realloc(c.heap, cap * sizeof(heap_entry_t))
        if heap == NULL:
            return -1
        c.heap = heap
        c.h_cap = cap
    c.seq += 1
    i = c.h_len
    c.h_len += 1
    c.heap[i].at = at_ns
    c.heap[i].seq = c.seq
    c.heap[i].slot = slot
    while i > 0:
        parent = (i - 1) // 2
        if not _heap_less(c, i, parent):
            break
        _heap_swap(c, i, parent)
        i = parent
    return i


cdef void _heap_pop(Core *c) noexcept nogil:
    c.h_len -= 1
    if c.h_len > 0:
        c.heap[0] = c.heap[c.h_len]
        _sift_down(c, 0)


cdef int32_t _alloc_slot(Core *c) noexcept nogil:
    """A free slot index, armed, or -1 without memory (Core.lock held)."""
    cdef int32_t slot
    cdef Py_ssize_t cap, i
    cdef slot_t *slots
    if c.free_head < 0:
        if c.s_len >= 0x7FFFFFFF:
            return -1
        cap = 64 if c.s_len == 0 else c.s_len * 2
        if cap > 0x7FFFFFFF:
            cap = 0x7FFFFFFF
        slots = <slot_t *>realloc(c.slots, cap * sizeof(slot_t))
        if slots == NULL:
            return -1
        c.slots = slots
        for i in range(cap - 1, c.s_len - 1, -1):
            c.slots[i].state = FREE
            c.slots[i].gen = 0
            c.slots[i].next_free = c.free_head
            c.free_head = <int32_t>i
        c.s_len = cap
    slot = c.free_head
    c.free_head = c.slots[slot].next_free
    c.slots[slot].state = ARMED
    c.slots[slot].chan = -1
    return slot


cdef void _free_slot(Core *c, int32_t slot) noexcept nogil:
    c.slots[slot].state = FREE
    c.slots[slot].gen += 1
    c.slots[slot].next_free = c.free_head
    c.free_head = slot


cdef Py_ssize_t _release_due(Core *c, int64_t now_ns) noexcept nogil:
    """Release every heap entry due at ``now_ns`` (Core.lock held); returns how many."""
    cdef Py_ssize_t released = 0
    cdef int32_t slot, ci
    while c.h_len > 0 and c.heap[0].at <= now_ns:
        slot = c.heap[0].slot
        _heap_pop(c)
        if c.slots[slot].state == ARMED:
            c.slots[slot].state = RELEASED
            c.slots[slot].released_at = now_ns
            released += 1
            ci = c.slots[slot].chan
            if ci >= 0 and ci < c.n_chans and c.chans[ci] != NULL:
                _chan_push(c.chans[ci], (<uint64_t>slot << 32) | c.slots[slot].gen)
        elif c.slots[slot].state == ABANDONED:
            _free_slot(c, slot)
    if released and c.blocking_waiters:
        tw_cond_broadcast(&c.released_cond)
    return released


cdef void _maybe_sweep(Core *c, int64_t now_ns) noexcept nogil:
    """Drop abandoned entries once the heap passes SWEEP_MIN_HEAP, at most every SWEEP_EVERY_NS."""
    cdef Py_ssize_t i, kept = 0
    cdef int32_t slot
    if c.h_len <= SWEEP_MIN_HEAP or now_ns - c.last_sweep_ns < SWEEP_EVERY_NS:
        return
    c.last_sweep_ns = now_ns
    for i in range(c.h_len):
        slot = c.heap[i].slot
        if c.slots[slot].state == ABANDONED:
            _free_slot(c, slot)
        else:
            c.heap[kept] = c.heap[i]
            kept += 1
    if kept != c.h_len:
        c.h_len = kept
        for i in range(kept // 2 - 1, -1, -1):
            _sift_down(c, i)


cdef void _release_main(void *arg) noexcept nogil:
    """The release thread: release what is due, then sleep until the heap's top.

    Idle, it parks on an untimed wait. With a deadline more than SLICE_NS away it waits
    on the condition in SLICE_NS steps (a nearer arm or close wakes it at once); the last
    step, under SLICE_NS, sleeps exactly the time remaining with clock_nanosleep to the
    deadline (a deadline armed during it is seen when it ends, so it can be late by at
    most that step). The condvar backend waits on the condition until the top instead.
    While the heap is large enough to sweep, no wait is longer than SWEEP_EVERY_NS.
    Never takes the GIL.
    """
    cdef Core *c = <Core *>arg
    cdef int64_t now_ns, top_ns, remaining_ns, step_ns
    tw_thread_precise_timers()
    tw_mutex_lock(&c.lock)
    while not c.closing:
        c.wakes += 1
        now_ns = tw_monotonic_ns()
        _release_due(c, now_ns)
        _maybe_sweep(c, now_ns)
        if c.closing:
            break
        if c.h_len == 0:
            tw_cond_wait(&c.wake_cond, &c.lock)
            continue
        top_ns = c.heap[0].at
        now_ns = tw_monotonic_ns()
        remaining_ns = top_ns - now_ns
        if remaining_ns <= 0:
            continue
        if c.backend == CONDVAR or remaining_ns > SLICE_NS:
            step_ns = remaining_ns if c.backend == CONDVAR else SLICE_NS
            if c.h_len > SWEEP_MIN_HEAP and step_ns > SWEEP_EVERY_NS:
                step_ns = SWEEP_EVERY_NS
            tw_cond_timedwait_until(&c.wake_cond, &c.lock, now_ns + step_ns)
        else:
            tw_mutex_unlock(&c.lock)
            tw_sleep_until_ns(top_ns)
            tw_mutex_lock(&c.lock)
    tw_mutex_unlock(&c.lock)


cdef void _abandon(Core *c, int32_t slot, uint32_t gen) noexcept:
    """A Deadline's last reference is gone: free its slot, or leave a mark for the sweep."""
    if not _ours(c):
        return  # the parent's timer: its lock may be held by a thread absent here
    tw_mutex_lock(&c.lock)
    if c.slots[slot].gen == gen:
        if c.slots[slot].state == ARMED:
            c.slots[slot].state = ABANDONED
        elif c.slots[slot].state == RELEASED:
            _free_slot(c, slot)
    tw_mutex_unlock(&c.lock)


cdef Core *_core_new(int backend) noexcept:
    cdef Core *c = <Core *>calloc(1, sizeof(Core))
    if c == NULL:
        return NULL
    if tw_mutex_init(&c.lock) != 0:
        free(c)
        return NULL
    if tw_cond_init(&c.wake_cond) != 0:
        tw_mutex_destroy(&c.lock)
        free(c)
        return NULL
    if tw_cond_init(&c.released_cond) != 0:
        tw_cond_destroy(&c.wake_cond)
        tw_mutex_destroy(&c.lock)
        free(c)
        return NULL
    c.backend = backend
    c.epoch = _fork_epoch
    c.free_head = -1
    return c


cdef void _core_free(Core *c) noexcept:
    """Free a timer whose thread is joined (or never ran here: a forked parent's)."""
    cdef Py_ssize_t i
    cdef bint ours = _ours(c)  # a forked parent's sync objects may be mid-use
    for i in range(c.n_chans):
        if c.chans[i] != NULL:
            if ours and c.chans[i].rfd >= 0:
                tw_wakefd_close(c.chans[i].rfd, c.chans[i].wfd)
            if ours:
                tw_cond_destroy(&c.chans[i].cond)
            free(c.chans[i].q)
            free(c.chans[i])
    free(c.chans)
    free(c.heap)
    free(c.slots)
    if ours:
        tw_cond_destroy(&c.released_cond)
        tw_cond_destroy(&c.wake_cond)
        tw_mutex_destroy(&c.lock)
    free(c)


cdef class ReleaseTimer:
    """A deadline release thread that never takes the GIL: ``arm`` deadlines, then wait or await them.

    ``ReleaseTimer(backend=None)`` starts its native thread. ``backend`` is ``"slice"``
    or ``"condvar"``, in any case; None reads ``$TIMERWHEEL_C_RELEASE_TIMER`` (slice, with a
    RuntimeWarning, when it names neither), else slice; another name is a ValueError naming it.
    Use it as a context manager or call ``close()``; a timer dropped unclosed closes itself.
    A subclass may take arguments of its own and pass ``backend`` to ``super().__init__``; one
    whose ``__init__`` does not call the base's runs on slice.

    Raises:
        MemoryError: no memory for the timer.
        OSError: the thread could not start.
    """

    cdef Core *_core
    cdef object _chans  # WeakKeyDictionary: loop -> _Channel (see _release_asyncio.pxi)

    def __cinit__(self, *args, **kwargs):
        # Any arguments, unread: __cinit__ gets a subclass constructor's own, and the backend is
        # set by __init__, which a subclass calls as super().__init__(backend=...).
        self._chans = weakref.WeakKeyDictionary()
        self._core = _core_new(SLICE)
        if self._core == NULL:
            raise MemoryError("no memory for a ReleaseTimer")
        if tw_thread_start(&self._core.thread, _release_main, self._core) != 0:
            _core_free(self._core)
            self._core = NULL
            raise OSError("could not start the release thread")
        self._core.thread_started = 1

    def __init__(self, backend=None):
        cdef int chosen = _choose_backend(backend, 2)  # called from C: the caller's frame is next
        cdef Core *c = self._core
        if not _ours(c):
            c.backend = chosen  # the parent's timer in a forked child: no thread here reads it
            return
        tw_mutex_lock(&c.lock)
        c.backend = chosen
        tw_cond_signal(&c.wake_cond)  # a wait begun on the other backend ends, and the next reads this one
        tw_mutex_unlock(&c.lock)

    @property
    def backend(self):
        """The backend chosen at construction: ``"slice"`` or ``"condvar"``."""
        return BACKEND_NAMES[self._core.backend]

    @property
    def wakes(self):
        """Loop iterations of the release thread so far."""
        cdef Core *c = self._core
        cdef uint64_t wakes
        if not _ours(c):
            return c.wakes
        tw_mutex_lock(&c.lock)
        wakes = c.wakes
        tw_mutex_unlock(&c.lock)
        return wakes

    @property
    def closed(self):
        """True once ``close()`` ran."""
        return bool(self._core.closed)

    def pending(self):
        """The heap's length, abandoned slots not yet swept included."""
        cdef Core *c = self._core
        cdef Py_ssize_t n
        if not _ours(c):
            return c.h_len
        tw_mutex_lock(&c.lock)
        n = c.h_len
        tw_mutex_unlock(&c.lock)
        return n

    def arm(self, at):
        """Arm a deadline at ``at``, float seconds on time.monotonic().

        Raises:
            TypeError: ``at`` is not a real number (or is a bool).
            ValueError: ``at`` is NaN, infinite or out of the int64 ns range, or more than 10
                years ahead (wall-clock seconds from ``time.time()`` by mistake).
            ReleaseTimerClosed: the timer is closed.
        """
        return self.arm_ns(_seconds_to_ns(at))

    def arm_ns(self, at_ns):
        """Arm a deadline at ``at_ns``, int nanoseconds on time.monotonic_ns().

        A deadline already due comes back released, without touching the heap.

        Raises:
            TypeError: ``at_ns`` is not an int (or is a bool).
            ValueError: ``at_ns`` is out of the int64 range, or more than 10 years ahead
                (wall-clock ns from ``time.time_ns()`` by mistake).
            ReleaseTimerClosed: the timer is closed.
            MemoryError: no memory for the heap or the slot table.
        """
        cdef int64_t at = _check_at_ns(at_ns)
        cdef Core *c = self._core
        cdef int64_t now_ns
        cdef int32_t slot
        cdef uint32_t gen = 0
        cdef bint closed
        if c.closed or not _ours(c):
            raise ReleaseTimerClosed("arm on a closed ReleaseTimer")
        now_ns = tw_monotonic_ns()
        if at <= now_ns:
            return _new_deadline(None, -1, 0, at, now_ns)
        if at - now_ns > FAR_AHEAD_NS:
            raise ValueError(_far_ahead_error(at, now_ns))
        tw_mutex_lock(&c.lock)
        closed = c.closed
        slot = -1
        if not closed:
            slot = _alloc_slot(c)
            if slot >= 0:
                if _heap_push(c, at, slot) < 0:
                    _free_slot(c, slot)
                    slot = -1
                elif c.heap[0].slot == slot or c.h_len == SWEEP_MIN_HEAP + 1:
                    # a new top preempts the thread's wait; a heap now big enough to
                    # sweep makes it cap its wait at SWEEP_EVERY_NS
                    tw_cond_signal(&c.wake_cond)
            gen = c.slots[slot].gen if slot >= 0 else 0
        tw_mutex_unlock(&c.lock)
        if closed:
            raise ReleaseTimerClosed("arm on a closed ReleaseTimer")
        if slot < 0:
            raise MemoryError("no memory to arm a deadline")
        return _new_deadline(self, slot, gen, at, 0)

    def close(self):
        """Stop the thread and wake every pending waiter with ReleaseTimerClosed.

        Returns promptly (the thread's waits are interruptible; its last-step sleeps are
        shorter than SLICE_NS). Called on the release thread itself, it would detach
        instead of joining; the native thread never runs Python, so only the pure twin
        meets that case. Idempotent.
        """
        self._stop()

    cdef _stop(self):
        """close()'s work, which __dealloc__ calls directly: a subclass's close() that forgets the
        base's (or raises) must not leave the thread running on the Core that __dealloc__ frees."""
        cdef Core *c = self._core
        cdef Py_ssize_t i
        if not _ours(c):
            c.closed = 1  # the parent's timer in a forked child: nothing to stop here
            return
        tw_mutex_lock(&c.lock)
        if c.closed:
            tw_mutex_unlock(&c.lock)
            return
        c.closing = 1
        c.closed = 1
        tw_cond_broadcast(&c.wake_cond)
        tw_cond_broadcast(&c.released_cond)
        for i in range(c.n_chans):
            if c.chans[i] != NULL:
                _chan_notify(c.chans[i])
        tw_mutex_unlock(&c.lock)
        if c.thread_started:
            c.thread_started = 0
            if tw_thread_is_current(&c.thread):
                c.detached = 1
                tw_thread_detach(&c.thread)
            else:
                with nogil:
                    tw_thread_join(&c.thread)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce_ex__(self, protocol):
        _refuse_copy(self)  # the pure twin's TypeError, word for word

    def __repr__(self):
        state = "closed" if self.closed else f"pending={self.pending()}"
        return f"<ReleaseTimer backend={self.backend} {state} implementation=c>"

    def __dealloc__(self):
        cdef Core *c = self._core
        if c == NULL:
            return
        if _ours(c):
            self._stop()
        if not c.detached:
            _core_free(c)
        self._core = NULL

    cdef tuple _subscribe(self, Deadline d, loop):
        """Register an asyncio future for ``d`` on ``loop``: (channel, key, future or None).
        C-level only: ``Deadline.__await__`` is its one caller."""
        cdef Core *c = self._core
        cdef _Channel chan
        cdef uint8_t state
        cdef bint closed, other = False
        cdef int32_t bound
        if not _ours(c):
            raise ReleaseTimerClosed("the ReleaseTimer belongs to the parent of this forked process")
        chan = _channel_for(self, loop)
        key = (<uint64_t>d._slot << 32) | d._gen
        tw_mutex_lock(&c.lock)
        state = c.slots[d._slot].state
        closed = c.closed
        if state != RELEASED and not closed:
            bound = c.slots[d._slot].chan
            if bound >= 0 and bound != chan.index and c.chans[bound] != NULL and not c.chans[bound].dead:
                other = True
            else:
                c.slots[d._slot].chan = chan.index
        tw_mutex_unlock(&c.lock)
        if state == RELEASED:
            return chan, key, None
        if closed:
            raise ReleaseTimerClosed(f"the ReleaseTimer was closed before the deadline at_ns={d._at_ns}")
        if other:
            return chan, key, _fallback_future(d, loop)
        fut = loop.create_future()
        chan.waiters.setdefault(key, []).append(fut)
        return chan, key, fut

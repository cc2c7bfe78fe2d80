# cython: language_level=3
"""A deadline release thread that never takes the GIL (compiled core of ReleaseTimer).

Design source: the seed "moqtap_proxy release_timer.rs" (one thread, one min-heap of
deadlines, level-triggered deadlines), extended with wakeups for blocking and asyncio
waiters, abandonment sweeps, ``close()`` that wakes waiters, and fork safety.

The release thread is a native thread started here; it runs ``_release_main`` with no
GIL for its whole life and never runs Python. The heap is typed arrays (deadline ns,
sequence, slot); Deadlines are Python objects holding a slot index and generation into
a native slot table, which carries the released flag and the release instant. Blocking
waiters sleep on a C condition variable with the GIL released; asyncio loops watch an
eventfd or self-pipe (``add_reader``) and drain a C queue of released keys on their own
thread; loops without ``add_reader`` get a helper thread posting ``call_soon_threadsafe``.

The pure twin, ``timerwheel_c/pure/release.py``, mirrors this module function by function.
Units: deadlines are int nanoseconds on ``time.monotonic_ns()`` (``*_ns``) or float
seconds on ``time.monotonic()`` (``arm``); timeouts are float seconds.
"""
cimport cython
from cpython.exc cimport PyErr_CheckSignals
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc

from tw_sync cimport *

# One asyncio loop's inbox: released keys queued by the release thread (under Core.lock).
cdef struct Chan:
    int rfd                 # the wake fd the loop watches (-1 in helper mode or once closed)
    int wfd
    int helper              # 1: a helper thread waits on `cond` and posts drains instead
    int held                # a _Channel or its helper thread still points here: not reusable
    int signaled            # the queue was signalled since the last drain took it
    int posted              # helper mode: a drain is posted and has not run yet
    int dead                # not (or no longer) watched: never signal it
    int overflow            # a push failed for memory: the next drain rescans its waiters
    tw_cond_t cond
    uint64_t *q             # keys: slot << 32 | generation
    Py_ssize_t q_len
    Py_ssize_t q_cap


# A timer's state shared with its thread; guarded by `lock` unless noted.
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
    int epoch               # the fork epoch this timer was made in
    uint64_t wakes
    uint64_t seq
    # the min-heap, ordered by (at, seq): seq makes equal deadlines release in arm order
    int64_t *h_at
    uint64_t *h_seq
    int32_t *h_slot
    Py_ssize_t h_len
    Py_ssize_t h_cap
    # the slot table
    uint8_t *state
    uint32_t *gen           # bumped when a slot is freed, so stale keys never match
    int64_t *released_at
    int32_t *chan           # the Chan index to notify on release, or -1
    int32_t *next_free
    int32_t free_head
    Py_ssize_t s_len
    Py_ssize_t blocking_waiters
    int64_t last_sweep_ns
    Chan **chans
    Py_ssize_t n_chans


import asyncio
import os
import threading

from timerwheel_c._common import (
    BACKEND_NAMES,
    FAR_AHEAD_NS,
    _await_deadline,
    _check_at_ns,
    _choose_backend,
    _fallback_future,
    _far_ahead_error,
    _seconds_to_ns,
    _timeout_ns,
)
from timerwheel_c.errors import ReleaseTimerClosed

__all__ = ["Deadline", "ReleaseTimer", "ReleaseTimerClosed", "past_deadline"]

# Exported: the tests check them against timerwheel_c._common, where each is explained.
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


def past_deadline(at):
    """A Deadline already released, if ``at`` (float s on time.monotonic()) has passed, else None.

    Lets the process-wide timer answer past deadlines without starting. Raises as ``arm``.
    """
    cdef int64_t at_ns = _seconds_to_ns(at)
    cdef int64_t now_ns = tw_monotonic_ns()
    if at_ns <= now_ns:
        return _new_deadline(None, -1, 0, at_ns, now_ns)
    return None


cdef class ReleaseTimer


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

    cdef readonly ReleaseTimer _rt
    cdef readonly int32_t _slot
    cdef readonly uint32_t _gen
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
        if c.epoch == _fork_epoch:
            tw_mutex_lock(&c.lock)
        released = c.state[self._slot] == RELEASED
        if released:
            at = c.released_at[self._slot]
        if c.epoch == _fork_epoch:
            tw_mutex_unlock(&c.lock)
        return at if released else None

    def done(self):
        """True once released, and from then on (level-triggered)."""
        cdef Core *c
        cdef bint released
        if self._slot < 0:
            return True
        c = self._rt._core
        if c.epoch != _fork_epoch:  # the parent's timer: no other thread touches it here
            return c.state[self._slot] == RELEASED
        tw_mutex_lock(&c.lock)
        released = c.state[self._slot] == RELEASED
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
        if c.epoch != _fork_epoch:
            if c.state[slot] == RELEASED:
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
                while c.state[slot] == ARMED and not c.closed and now_ns < chunk_end:
                    tw_cond_timedwait_until(&c.released_cond, &c.lock, chunk_end)
                    now_ns = tw_monotonic_ns()
                c.blocking_waiters -= 1
                state = c.state[slot]
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
        return _await_deadline(self).__await__()

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


@cython.no_gc_clear  # a loop may still call drain(), which needs rt
@cython.final
cdef class _Channel:
    """Carries releases from the release thread to one asyncio loop.

    The release thread queues released keys (slot << 32 | generation) on the native
    ``Chan`` and, once per batch, writes the wake fd the loop watches with add_reader;
    ``drain`` runs on the loop's thread and resolves the futures. For a loop without
    add_reader a helper thread waits on the Chan's condition and posts ``drain`` with
    call_soon_threadsafe.
    """

    cdef ReleaseTimer rt
    cdef object loop
    cdef readonly int32_t index
    cdef Chan *ch  # NULL once torn down; the struct itself lives until the timer is freed
    cdef dict waiters

    def __cinit__(self, token=None, *args, **kwargs):
        if token is not _MAKE:
            raise TypeError("_Channel objects are made by ReleaseTimer._channel_for(), not constructed directly")

    def forget(self, key, fut):
        """Drop a cancelled waiter's future."""
        futs = self.waiters.get(key)
        if futs is not None and fut in futs:
            futs.remove(fut)
            if not futs:
                del self.waiters[key]

    def drain(self):
        """On the loop's thread: resolve the futures of released deadlines."""
        cdef Core *c = self.rt._core
        cdef Chan *ch = self.ch
        cdef uint64_t *keys
        cdef Py_ssize_t n, i
        cdef bint closed, overflow
        if ch == NULL:
            return
        if not ch.helper:
            tw_wakefd_drain(ch.rfd)
        tw_mutex_lock(&c.lock)
        keys = ch.q
        n = ch.q_len
        ch.q = NULL
        ch.q_len = ch.q_cap = 0
        ch.signaled = ch.posted = 0
        overflow = ch.overflow
        ch.overflow = 0
        closed = c.closed
        tw_mutex_unlock(&c.lock)
        try:
            for i in range(n):
                for fut in self.waiters.pop(keys[i], ()):
                    if not fut.done():
                        fut.set_result(None)
        finally:
            free(keys)
        if overflow:
            for key in list(self.waiters):
                if _key_released(c, key):
                    for fut in self.waiters.pop(key):
                        if not fut.done():
                            fut.set_result(None)
        if closed:
            self.fail_all()
            self.teardown()

    def fail_all(self):
        """Wake every remaining future with ReleaseTimerClosed (the timer was closed)."""
        waiters, self.waiters = self.waiters, {}
        for futs in waiters.values():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(ReleaseTimerClosed("the ReleaseTimer was closed before the deadline"))

    def teardown(self):
        """Stop watching the loop: remove the reader, close the fds, release the helper."""
        cdef Core *c = self.rt._core
        cdef Chan *ch = self.ch
        if ch == NULL:
            return
        self.ch = NULL
        if not ch.helper and not self.loop.is_closed():
            try:
                self.loop.remove_reader(ch.rfd)
            except Exception:  # a loop shutting down: nothing left to unregister
                pass
        tw_mutex_lock(&c.lock)
        ch.dead = 1
        if ch.helper:
            tw_cond_broadcast(&ch.cond)
        else:
            tw_wakefd_close(ch.rfd, ch.wfd)
            ch.rfd = ch.wfd = -1
            ch.held = 0
        tw_mutex_unlock(&c.lock)
        if self.rt._chans.get(self.loop) is self:
            del self.rt._chans[self.loop]

    def _helper_main(self):
        """Helper mode: wait (GIL released) for a signalled batch, post a drain, repeat."""
        cdef Core *c = self.rt._core
        cdef Chan *ch = self.ch
        cdef bint dead
        while True:
            with nogil:
                tw_mutex_lock(&c.lock)
                while not (ch.signaled and not ch.posted) and not ch.dead:
                    tw_cond_wait(&ch.cond, &c.lock)
                dead = ch.dead
                if not dead:
                    ch.posted = 1
                tw_mutex_unlock(&c.lock)
            if dead:
                break
            try:
                self.loop.call_soon_threadsafe(self.drain)
            except RuntimeError:  # the loop is closed: nobody is left to wake
                break
        tw_mutex_lock(&c.lock)
        ch.dead = 1
        ch.held = 0
        tw_mutex_unlock(&c.lock)


cdef bint _key_released(Core *c, uint64_t key) noexcept:
    cdef int32_t slot = <int32_t>(key >> 32)
    cdef bint released
    tw_mutex_lock(&c.lock)
    released = c.gen[slot] == <uint32_t>key and c.state[slot] == RELEASED
    tw_mutex_unlock(&c.lock)
    return released


cdef void _chan_push(Chan *ch, uint64_t key) noexcept nogil:
    """Queue ``key`` and signal the loop once per batch (Core.lock held)."""
    cdef uint64_t *q
    cdef Py_ssize_t cap
    if ch.dead:
        return
    if ch.q_len == ch.q_cap:
        cap = 16 if ch.q_cap == 0 else ch.q_cap * 2
        q = <uint64_t *>realloc(ch.q, cap * sizeof(uint64_t))
        if q == NULL:
            ch.overflow = 1
        else:
            ch.q = q
            ch.q_cap = cap
    if ch.q_len < ch.q_cap:
        ch.q[ch.q_len] = key
        ch.q_len += 1
    _chan_notify(ch)


cdef void _chan_notify(Chan *ch) noexcept nogil:
    """Wake the loop's side: a byte on the wake fd, or the helper's condition (Core.lock held)."""
    if ch.signaled or ch.dead:
        return
    ch.signaled = 1
    if ch.helper:
        tw_cond_signal(&ch.cond)
    else:
        tw_wakefd_signal(ch.wfd)


cdef bint _heap_less(Core *c, Py_ssize_t i, Py_ssize_t j) noexcept nogil:
    return c.h_at[i] < c.h_at[j] or (c.h_at[i] == c.h_at[j] and c.h_seq[i] < c.h_seq[j])


cdef void _heap_swap(Core *c, Py_ssize_t i, Py_ssize_t j) noexcept nogil:
    c.h_at[i], c.h_at[j] = c.h_at[j], c.h_at[i]
    c.h_seq[i], c.h_seq[j] = c.h_seq[j], c.h_seq[i]
    c.h_slot[i], c.h_slot[j] = c.h_slot[j], c.h_slot[i]


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
    cdef void *p
    if c.h_len == c.h_cap:
        cap = 64 if c.h_cap == 0 else c.h_cap * 2
        p = realloc(c.h_at, cap * sizeof(int64_t))
        if p == NULL:
            return -1
        c.h_at = <int64_t *>p
        p = realloc(c.h_seq, cap * sizeof(uint64_t))
        if p == NULL:
            return -1
        c.h_seq = <uint64_t *>p
        p = realloc(c.h_slot, cap * sizeof(int32_t))
        if p == NULL:
            return -1
        c.h_slot = <int32_t *>p
        c.h_cap = cap
    c.seq += 1
    i = c.h_len
    c.h_len += 1
    c.h_at[i] = at_ns
    c.h_seq[i] = c.seq
    c.h_slot[i] = slot
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
        c.h_at[0] = c.h_at[c.h_len]
        c.h_seq[0] = c.h_seq[c.h_len]
        c.h_slot[0] = c.h_slot[c.h_len]
        _sift_down(c, 0)


cdef int32_t _alloc_slot(Core *c) noexcept nogil:
    """A free slot index, armed, or -1 without memory (Core.lock held)."""
    cdef int32_t slot
    cdef Py_ssize_t cap, i
    cdef void *p
    if c.free_head < 0:
        if c.s_len >= 0x7FFFFFFF:
            return -1
        cap = 64 if c.s_len == 0 else c.s_len * 2
        if cap > 0x7FFFFFFF:
            cap = 0x7FFFFFFF
        # each array grows on its own; a failure part-way leaves larger arrays, which is harmless
        p = realloc(c.state, cap * sizeof(uint8_t))
        if p == NULL:
            return -1
        c.state = <uint8_t *>p
        p = realloc(c.gen, cap * sizeof(uint32_t))
        if p == NULL:
            return -1
        c.gen = <uint32_t *>p
        p = realloc(c.released_at, cap * sizeof(int64_t))
        if p == NULL:
            return -1
        c.released_at = <int64_t *>p
        p = realloc(c.chan, cap * sizeof(int32_t))
        if p == NULL:
            return -1
        c.chan = <int32_t *>p
        p = realloc(c.next_free, cap * sizeof(int32_t))
        if p == NULL:
            return -1
        c.next_free = <int32_t *>p
        for i in range(cap - 1, c.s_len - 1, -1):
            c.state[i] = FREE
            c.gen[i] = 0
            c.next_free[i] = c.free_head
            c.free_head = <int32_t>i
        c.s_len = cap
    slot = c.free_head
    c.free_head = c.next_free[slot]
    c.state[slot] = ARMED
    c.chan[slot] = -1
    return slot


cdef void _free_slot(Core *c, int32_t slot) noexcept nogil:
    c.state[slot] = FREE
    c.gen[slot] += 1
    c.next_free[slot] = c.free_head
    c.free_head = slot


cdef Py_ssize_t _release_due(Core *c, int64_t now_ns, int64_t *out_at, uint64_t *out_seq) noexcept nogil:
    """Release every heap entry due at ``now_ns`` (Core.lock held).

    Writes the released (at_ns, seq) pairs to ``out_at``/``out_seq`` when given (the
    test hook; each must hold h_len entries) and returns how many were released.
    """
    cdef Py_ssize_t released = 0
    cdef int32_t slot, ci
    cdef int64_t at_ns
    cdef uint64_t seq
    while c.h_len > 0 and c.h_at[0] <= now_ns:
        at_ns = c.h_at[0]
        seq = c.h_seq[0]
        slot = c.h_slot[0]
        _heap_pop(c)
        if c.state[slot] == ARMED:
            c.state[slot] = RELEASED
            c.released_at[slot] = now_ns
            if out_at != NULL:
                out_at[released] = at_ns
                out_seq[released] = seq
            released += 1
            ci = c.chan[slot]
            if ci >= 0 and ci < c.n_chans and c.chans[ci] != NULL:
                _chan_push(c.chans[ci], (<uint64_t>slot << 32) | c.gen[slot])
        elif c.state[slot] == ABANDONED:
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
        slot = c.h_slot[i]
        if c.state[slot] == ABANDONED:
            _free_slot(c, slot)
        else:
            c.h_at[kept] = c.h_at[i]
            c.h_seq[kept] = c.h_seq[i]
            c.h_slot[kept] = slot
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
        _release_due(c, now_ns, NULL, NULL)
        _maybe_sweep(c, now_ns)
        if c.closing:
            break
        if c.h_len == 0:
            tw_cond_wait(&c.wake_cond, &c.lock)
            continue
        top_ns = c.h_at[0]
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
    if c.epoch != _fork_epoch:
        return  # the parent's timer: its lock may be held by a thread absent here
    tw_mutex_lock(&c.lock)
    if c.gen[slot] == gen:
        if c.state[slot] == ARMED:
            c.state[slot] = ABANDONED
        elif c.state[slot] == RELEASED:
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
    cdef bint ours = c.epoch == _fork_epoch  # a forked parent's sync objects may be mid-use
    for i in range(c.n_chans):
        if c.chans[i] != NULL:
            if ours and c.chans[i].rfd >= 0:
                tw_wakefd_close(c.chans[i].rfd, c.chans[i].wfd)
            if ours:
                tw_cond_destroy(&c.chans[i].cond)
            free(c.chans[i].q)
            free(c.chans[i])
    free(c.chans)
    free(c.h_at)
    free(c.h_seq)
    free(c.h_slot)
    free(c.state)
    free(c.gen)
    free(c.released_at)
    free(c.chan)
    free(c.next_free)
    if ours:
        tw_cond_destroy(&c.released_cond)
        tw_cond_destroy(&c.wake_cond)
        tw_mutex_destroy(&c.lock)
    free(c)


cdef class ReleaseTimer:
    """A deadline release thread that never takes the GIL: ``arm`` deadlines, then wait or await them.

    ``ReleaseTimer(backend=None)`` starts its native thread. ``backend`` is ``"slice"``
    or ``"condvar"``; None reads ``$TIMERWHEEL_C_RELEASE_TIMER``; anything else is
    slice. Use it as a context manager or call ``close()``; a timer dropped unclosed
    closes itself.

    Raises:
        MemoryError: no memory for the timer.
        OSError: the thread could not start.
    """

    cdef Core *_core
    cdef dict _chans  # loop -> _Channel

    def __cinit__(self, backend=None):
        cdef int chosen = _choose_backend(backend)
        self._chans = {}
        self._core = _core_new(chosen)
        if self._core == NULL:
            raise MemoryError("no memory for a ReleaseTimer")
        if tw_thread_start(&self._core.thread, _release_main, self._core) != 0:
            _core_free(self._core)
            self._core = NULL
            raise OSError("could not start the release thread")
        self._core.thread_started = 1

    @property
    def backend(self):
        """The backend chosen at construction: ``"slice"`` or ``"condvar"``."""
        return BACKEND_NAMES[self._core.backend]

    @property
    def wakes(self):
        """Loop iterations of the release thread so far."""
        cdef Core *c = self._core
        cdef uint64_t wakes
        if c.epoch != _fork_epoch:
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
        if c.epoch != _fork_epoch:
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
        if c.closed or c.epoch != _fork_epoch:
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
                elif c.h_slot[0] == slot or c.h_len == SWEEP_MIN_HEAP + 1:
                    # a new top preempts the thread's wait; a heap now big enough to
                    # sweep makes it cap its wait at SWEEP_EVERY_NS
                    tw_cond_signal(&c.wake_cond)
            gen = c.gen[slot] if slot >= 0 else 0
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
        cdef Core *c = self._core
        cdef Py_ssize_t i
        if c.epoch != _fork_epoch:
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

    def __repr__(self):
        state = "closed" if self.closed else f"pending={self.pending()}"
        return f"<ReleaseTimer backend={self.backend} {state} implementation=c>"

    def __dealloc__(self):
        cdef Core *c = self._core
        if c == NULL:
            return
        if c.epoch == _fork_epoch:
            self.close()
        if not c.detached:
            _core_free(c)
        self._core = NULL

    def _subscribe(self, Deadline d, loop):
        """Register an asyncio future for ``d`` on ``loop``: (channel, key, future or None)."""
        cdef Core *c = self._core
        cdef _Channel chan
        cdef uint8_t state
        cdef bint closed, other = False
        cdef int32_t bound
        if c.epoch != _fork_epoch:
            raise ReleaseTimerClosed("the ReleaseTimer belongs to the parent of this forked process")
        chan = self._channel_for(loop)
        key = (<uint64_t>d._slot << 32) | d._gen
        tw_mutex_lock(&c.lock)
        state = c.state[d._slot]
        closed = c.closed
        if state != RELEASED and not closed:
            bound = c.chan[d._slot]
            if bound >= 0 and bound != chan.index and c.chans[bound] != NULL and not c.chans[bound].dead:
                other = True
            else:
                c.chan[d._slot] = chan.index
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

    def _channel_for(self, loop):
        """The channel to ``loop``, made on first use; channels of closed loops are reaped."""
        cdef _Channel chan = self._chans.get(loop)
        cdef Core *c = self._core
        cdef Chan *ch = NULL
        cdef Py_ssize_t i, index = -1
        cdef void *p
        if chan is not None:
            return chan
        for old_loop, old in list(self._chans.items()):
            if old_loop.is_closed():
                old.teardown()
        tw_mutex_lock(&c.lock)
        for i in range(c.n_chans):  # reuse a dead Chan no helper holds
            if c.chans[i] != NULL and not c.chans[i].held:
                index = i
                break
        if index < 0:
            p = realloc(c.chans, (c.n_chans + 1) * sizeof(Chan *))
            if p != NULL:
                c.chans = <Chan **>p
                ch = <Chan *>calloc(1, sizeof(Chan))
                if ch != NULL and tw_cond_init(&ch.cond) != 0:
                    free(ch)
                    ch = NULL
                if ch != NULL:
                    index = c.n_chans
                    c.chans[index] = ch
                    c.n_chans += 1
        else:
            ch = c.chans[index]
            free(ch.q)
            ch.q = NULL
            ch.q_len = ch.q_cap = 0
            ch.signaled = ch.posted = ch.overflow = ch.helper = 0
        if ch != NULL:
            ch.rfd = ch.wfd = -1
            ch.dead = 1  # not signalled until the loop side is set up below
            ch.held = 1
        tw_mutex_unlock(&c.lock)
        if ch == NULL:
            raise MemoryError("no memory for an asyncio channel")
        chan = _Channel.__new__(_Channel, _MAKE)
        chan.rt = self
        chan.loop = loop
        chan.index = <int32_t>index
        chan.ch = ch
        chan.waiters = {}
        try:
            helper = not _watch_fd(chan, ch, loop)
        except BaseException:
            chan.ch = NULL
            tw_mutex_lock(&c.lock)
            ch.held = 0
            tw_mutex_unlock(&c.lock)
            raise
        tw_mutex_lock(&c.lock)
        ch.helper = helper
        ch.dead = 0
        if c.closed:
            _chan_notify(ch)
        tw_mutex_unlock(&c.lock)
        self._chans[loop] = chan
        if helper:
            threading.Thread(target=chan._helper_main, name="timerwheel_c-release-helper", daemon=True).start()
        return chan

    def _release_due_ns(self, now_ns):
        """Test hook: release what is due at ``now_ns`` (int ns, may be in the future).

        Returns the released (at_ns, seq) pairs in release order; seq counts arms from 1
        per timer, so ordering can be checked without timing anything.
        """
        cdef int64_t now = _check_at_ns(now_ns)
        cdef Core *c = self._core
        cdef int64_t *at_buf
        cdef uint64_t *seq_buf
        cdef Py_ssize_t n, i
        tw_mutex_lock(&c.lock)
        at_buf = <int64_t *>malloc((c.h_len + 1) * sizeof(int64_t))
        seq_buf = <uint64_t *>malloc((c.h_len + 1) * sizeof(uint64_t))
        n = -1
        if at_buf != NULL and seq_buf != NULL:
            n = _release_due(c, now, at_buf, seq_buf)
        tw_mutex_unlock(&c.lock)
        try:
            if n < 0:
                raise MemoryError("no memory for the release hook")
            return [(at_buf[i], seq_buf[i]) for i in range(n)]
        finally:
            free(at_buf)
            free(seq_buf)


cdef bint _watch_fd(_Channel chan, Chan *ch, loop) except -1:
    """Open the wake fd and have ``loop`` watch it; False if the loop has no add_reader."""
    cdef int rfd, wfd
    if tw_wakefd_open(&rfd, &wfd) != 0:
        return False
    try:
        loop.add_reader(rfd, chan.drain)
    except NotImplementedError:  # the Windows proactor, or any loop without readers
        tw_wakefd_close(rfd, wfd)
        return False
    except BaseException:
        tw_wakefd_close(rfd, wfd)
        raise
    ch.rfd = rfd
    ch.wfd = wfd
    return True

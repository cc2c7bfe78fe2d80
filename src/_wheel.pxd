# cython: language_level=3
"""C-level declaration of the TimerWheel core, for ``cimport`` from another Cython extension.

Ships in the installed package beside the compiled module, so another extension (a protocol
parser, a transport, a retransmit timer) can drive a wheel without a Python call per operation::

    from timerwheel_c._wheel cimport TimerWheel, tw_fired_t

Only the ``c_*`` methods below are the C-level API; every other member is private layout. All
times are integer ms on the caller's monotonic clock, as in the Python API.
"""
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

# The geometry (see the design comment of src/_wheel.pyx), exported: the tests check it equals
# timerwheel_c._common's.
cpdef enum:
    L0_BITS = 9
    L0_SLOTS = 1 << L0_BITS
    LEVEL_BITS = 6
    LEVEL_SLOTS = 1 << LEVEL_BITS
    NUM_LEVELS = 10
    LEVEL_BASE = L0_SLOTS - LEVEL_SLOTS
    NUM_SLOTS = L0_SLOTS + (NUM_LEVELS - 1) * LEVEL_SLOTS
    NUM_WORDS = NUM_SLOTS >> 6   # (not //: a client module compiles without cdivision)
    MAX_ENTRIES = 0x7FFFFFFF  # entry indexes are int32

ctypedef struct entry_t:
    int64_t due        # ms
    uint64_t token
    int32_t next       # slot list, or free list while FREE
    int32_t prev
    uint32_t gen       # the id's high 32 bits; bumped on free
    uint32_t loc       # flat slot index, or FREE

ctypedef struct tw_fired_t:
    # The tokens fired by one c_advance, in fire order: tokens[0:count], owned by the caller until
    # c_release (Python code run meanwhile may advance the same wheel into a buffer of its own).
    uint64_t* tokens
    Py_ssize_t count
    Py_ssize_t cap


cdef class TimerWheel:
    cdef int64_t _elapsed
    cdef bint _warn_jump     # made without now_ms: the first advance checks for a clock reading
    cdef Py_ssize_t _count
    cdef int32_t _free_head
    cdef int32_t _used
    cdef int32_t _cap
    cdef bint _ordered       # entries taken in address order (c_take_in_order), not last-freed first
    cdef int32_t _cursor     # while _ordered: the entry after the one taken last
    cdef entry_t* _pool      # _pool_raw rounded up to a cache line: no entry straddles two lines
    cdef char* _pool_raw
    # advance_array's scratch: fired tokens land here, then are copied out in one ndarray.
    cdef uint64_t* _buf
    cdef Py_ssize_t _buf_cap
    cdef int32_t _head[NUM_SLOTS]
    cdef int32_t _tail[NUM_SLOTS]
    cdef int64_t _bound[NUM_SLOTS]
    cdef uint64_t _occ[NUM_WORDS]

    cdef int _grow_buf(self) except -1
    cdef int _grow_pool(self, int32_t cap) except -1
    cdef inline int32_t _alloc(self) except -1
    cdef int32_t _next_cap(self) except -1
    cdef int32_t _take_in_order(self) except -1
    cdef inline void _free(self, int32_t e) noexcept
    cdef inline void _link(self, int32_t e) noexcept
    cdef inline void _unlink(self, int32_t e) noexcept
    cdef inline void _pop_head(self, int32_t f, int32_t nxt) noexcept
    cdef inline int32_t _next_slot(self) noexcept
    cdef inline int64_t _slot_start(self, int32_t f) noexcept
    cdef inline int64_t _lone_bound(self, int32_t f, int64_t due) noexcept
    cdef inline int32_t _find(self, uint64_t timer_id) noexcept
    cdef inline int32_t _lookup(self, object timer_id) except -2
    cdef inline int64_t _due_for(self, int64_t delay, object after_ms) except -1
    cdef inline uint64_t _arm(self, int64_t due, uint64_t token) except? 0
    cdef inline void _move(self, int32_t e, int64_t due) noexcept
    cdef Py_ssize_t _run(self, int64_t now) except -1
    cdef uint64_t* _detach_buf(self, Py_ssize_t* cap) noexcept
    cdef void _restore_buf(self, uint64_t* buf, Py_ssize_t cap) noexcept
    cdef int64_t _check_now(self, object now_ms) except -1

    # The C-level API: the Python methods of the same name without their argument conversion.
    cdef uint64_t c_schedule(self, int64_t after_ms, uint64_t token) except 0
    cdef uint64_t c_schedule_at(self, int64_t due_ms, uint64_t token) except 0
    cdef bint c_cancel(self, uint64_t timer_id) noexcept
    cdef int c_reschedule(self, uint64_t timer_id, int64_t after_ms) except -1
    cdef void c_prefetch(self, uint64_t timer_id) noexcept
    cdef int c_advance(self, int64_t now_ms, tw_fired_t* fired) except -1
    cdef void c_release(self, tw_fired_t* fired) noexcept
    cdef int64_t c_next_fire_ms(self) noexcept
    cdef int64_t c_now_ms(self) noexcept
    cdef int64_t c_due_ms(self, uint64_t timer_id) noexcept
    cdef Py_ssize_t c_count(self) noexcept
    cdef int c_take_in_order(self) except -1

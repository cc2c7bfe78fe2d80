# cython: language_level=3
"""C-level declaration of the compiled asyncio scheduler, for ``cimport`` from another Cython
extension (a protocol, a transport) that arms timers per message without a Python call::

    from timerwheel_c._aio cimport WheelScheduler, WheelHandle, KeyedTimers

Only the ``c_*`` methods are the C-level API; every other member is private layout. Times are
float seconds on the loop's clock (``loop.time()``), as in the Python API, which these mirror.
"""
from libc.stdint cimport int64_t, uint64_t

from timerwheel_c._wheel cimport TimerWheel, tw_fired_t

ctypedef struct key_slot_t:
    int64_t key
    uint64_t timer_id   # the key's wheel id; 0 marks an empty slot (no timer id is 0)
    double when_s       # the deadline, loop seconds

ctypedef struct token_stack_t:
    # The free indexes of a core's list of armed handles (src/_aio_tokens.pxi), reused last first.
    Py_ssize_t* free
    Py_ssize_t count
    Py_ssize_t cap


cdef class WheelHandle:
    # 88 B with the collector's header, and no C methods (they would add a vtable pointer): the
    # wheel entry (32 B) holds the rest of the timer.
    cdef WheelScheduler _scheduler
    cdef object _callback     # None once cancelled
    cdef tuple _args
    cdef object _context      # None for a WheelTimeout's expiry handle
    cdef double _when
    cdef uint64_t _timer_id   # the wheel's id while armed or due in the running batch, else 0
    cdef Py_ssize_t _token    # its index in the scheduler's _handles (its wheel token), or 0


cdef class WheelScheduler:
    cdef object _loop
    cdef object _time          # loop.time, called unless _fast_clock reads the same clock in C
    cdef bint _fast_clock
    cdef bint _closed
    cdef double _slack_s
    cdef int64_t _wake_ms      # the armed wake-up's ms, or NO_WAKE / IN_BATCH
    cdef object _wake          # the loop's handle of the one wake-up (a TimerHandle, or a Handle at the next turn)
    cdef TimerWheel _wheel     # the handles' wheel: tokens index _handles
    cdef list _handles         # token -> the handle it arms, None when free: the collector sees them
    cdef token_stack_t _free_tokens  # the free indexes of _handles
    cdef list _keyed           # weak references to its KeyedTimers sets (each on its own wheel), in creation order
    cdef Py_ssize_t _keyed_sweep_at  # the length of _keyed at which its dead references are swept
    cdef set _armed_keyed      # the sets holding armed keys: its only strong references to them
    cdef int64_t _origin_ms    # the loop's ms that is every wheel's 0 ms: 0, unless the loop's clock went below 0
    cdef bint _behind          # a timer was armed due before its wheel's ms (the loop's clock went back)

    # The C-level API.
    cdef double c_time(self) except? -1.0
    cdef WheelHandle c_call_later(self, double delay_s, object callback, tuple args)
    cdef bint c_reschedule(self, WheelHandle handle, double delay_s) except -1
    cdef int c_cancel(self, WheelHandle handle) except -1

    cdef int _check_call(self, object callback) except -1
    cdef WheelHandle _call_at(self, double when_s, object callback, tuple args, object context)
    cdef inline int64_t _due_ms(self, double when_s) except -1
    cdef int64_t _follow_clock(self, int64_t loop_ms) except? -1
    cdef int _refile_handles(self, int64_t now_ms) except -1
    cdef int64_t _after_ms(self, TimerWheel wheel, int64_t due_ms) except? -1
    cdef int _arm_handle(self, WheelHandle handle, double when_s) except -1
    cdef int _disarm(self, WheelHandle handle) except -1
    cdef int _arm_wake(self, int64_t due_ms) except -1
    cdef int _run_handles(self, int64_t now_ms) except -1
    cdef int _fire(self, uint64_t token, int64_t now_ms) except -1
    cdef int _requeue(self, tw_fired_t* fired, Py_ssize_t start) except -1
    cdef int _end_batch(self) except -1
    cdef int _drain(self) except -1


cdef class WheelTimeout:
    cdef WheelScheduler _scheduler
    cdef object _when          # the deadline, loop seconds (a float), or None: disarmed
    cdef WheelHandle _handle
    cdef object _task
    cdef int _cancelling
    cdef int _state

    cdef int _reschedule(self, object when) except -1
    cdef int _arm(self, double when_s) except -1
    cdef int _expire(self) except -1
    cdef int _disarm(self) except -1


cdef class KeyedTimers:
    cdef WheelScheduler _scheduler
    cdef TimerWheel _wheel     # tokens are the keys
    cdef object _callback
    cdef object _context
    cdef key_slot_t* _slots
    cdef Py_ssize_t _cap       # a power of 2, or 0 before the first arm
    cdef Py_ssize_t _count
    cdef object __weakref__    # the scheduler's reference to the set, while no key is armed

    # The C-level API.
    cdef int c_arm(self, int64_t key, double delay_s) except -1
    cdef bint c_cancel(self, int64_t key) noexcept

    cdef int _run(self, int64_t now_ms) except -1
    cdef int _refile(self, int64_t now_ms) except -1
    cdef int _fire(self, int64_t key) except -1
    cdef void _clear(self) noexcept
    cdef void _emptied(self) noexcept
    cdef Py_ssize_t _home(self, int64_t key) noexcept
    cdef Py_ssize_t _find(self, int64_t key) noexcept
    cdef Py_ssize_t _insert(self, int64_t key, uint64_t timer_id) noexcept
    cdef void _remove(self, Py_ssize_t i) noexcept
    cdef int _grow(self) except -1

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, binding=False
"""The event loop's timers on the wheel, compiled: ``LoopTimers`` and its ``TimerHandle``.

``timerwheel_c/pure/loop.py`` is the pure-Python twin, in the same order, and holds the design
(the ms clock, the never-early rule, due order); ``timerwheel_c.loop.EventLoop`` drives either.
"""
# A handle's wheel token is its index in the store's ``_handles`` list (src/_aio_tokens.pxi), as
# in the asyncio scheduler: the collector sees the armed handles through it, so a loop dropped
# unclosed with timers pending is collected, as asyncio's is, with no hand-written traverse.
#
# Reentrancy: ready.append() may run the collector, whose Python code may cancel a handle or arm
# a timer on this very loop (and so reuse a freed index). So move_due() takes the batch out of the
# wheel first (c_advance hands the token buffer over) and, in C only, swaps each token for a
# reference to its handle and frees its index; only then does it run Python code.
cimport cython
from cpython.contextvars cimport PyContext_CopyCurrent, PyContext_Enter, PyContext_Exit
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF
from libc.math cimport INFINITY, floor, nextafter
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free, qsort, realloc

from timerwheel_c._aio cimport token_stack_t
from timerwheel_c._wheel cimport TimerWheel, tw_fired_t

import asyncio
import contextvars

from timerwheel_c._loop_common import MAX_SELECT_S, check_when, handle_repr, report_exception

__all__ = ["LoopTimers", "TimerHandle"]

cdef extern from "tw_prefetch.h":
    void tw_prefetch(void* p) noexcept nogil

ctypedef struct due_t:
    double when
    Py_ssize_t seq
    uint64_t token

cdef double MAX_SELECT = MAX_SELECT_S

include "_aio_clock.pxi"
include "_aio_tokens.pxi"


cdef inline int64_t _loop_ms(double t_s) noexcept:
    """``loop_ms``: the ms a loop time ``t_s`` lies in, clamped to [-1, 2**62], past which every
    time alike is "never" (a real clock is far inside it)."""
    if not t_s * 1000.0 < MAX_DUE_MS_F:
        return MAX_DUE_MS
    if not t_s * 1000.0 >= 0.0:
        return -1
    return _floor_ms(t_s)


cdef int _by_when(const void* a, const void* b) noexcept nogil:
    """qsort order of a fire batch: deadline, then the wheel's order (arming order per ms)."""
    cdef const due_t* x = <const due_t*>a
    cdef const due_t* y = <const due_t*>b
    if x.when != y.when:
        return -1 if x.when < y.when else 1
    return -1 if x.seq < y.seq else (1 if x.seq > y.seq else 0)


@cython.final
@cython.no_gc_clear
@cython.auto_pickle(False)
@cython.freelist(256)
cdef class TimerHandle:
    """A callback armed on the loop's wheel by ``call_at``/``call_later``; answers as
    ``asyncio.TimerHandle`` does: ``when()``, ``cancel()``, ``cancelled()``, ``get_context()``.

    Not a subclass of ``asyncio.TimerHandle`` (``isinstance`` is False, as for uvloop's handles,
    uvloop#482): that class keeps the heap's bookkeeping, which a wheel timer has none of.
    """
    cdef LoopTimers _timers
    cdef readonly object _callback     # None once cancelled
    cdef readonly object _args
    cdef object _context
    cdef double _when
    cdef uint64_t _timer_id            # the wheel's id while armed, else 0
    cdef Py_ssize_t _token             # its index in the store's _handles while armed, else 0
    cdef readonly bint _cancelled
    cdef public object _source_traceback   # debug mode: where it was made, as asyncio's
    cdef public object _repr               # debug mode: the repr frozen at cancel(), as asyncio's
    cdef object __weakref__

    def __init__(self, *args, **kwargs):
        raise TypeError("TimerHandle objects are made by the event loop's call_at() and call_later()")

    def when(self):
        """The deadline in loop-clock seconds (``loop.time()`` units), as asyncio's."""
        return self._when

    def get_context(self):
        """The context the callback runs in (``asyncio.Handle.get_context``)."""
        return self._context

    def cancelled(self):
        """True once :meth:`cancel` was called."""
        return self._cancelled

    def cancel(self):
        """Cancel the callback; a no-op if already cancelled or run. O(1): the wheel entry is
        freed at once, so no cancelled handle is kept anywhere."""
        if self._cancelled:
            return
        # What this releases, fetched while the wheel unlinks the entry (see tw_prefetch.h).
        tw_prefetch(<PyObject*>self._callback)
        tw_prefetch(<PyObject*>self._context)
        self._cancelled = True
        if self._timers.debug:
            self._repr = handle_repr(self, True)
        self._timers._disarm(self)
        self._callback = None
        self._args = None

    def _run(self):
        """Run the callback in its context; its exception goes to the loop's handler, as asyncio."""
        try:
            if type(self._context) is contextvars.Context:
                PyContext_Enter(self._context)
                try:
                    self._callback(*self._args)
                finally:
                    PyContext_Exit(self._context)
            else:
                self._context.run(self._callback, *self._args)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            report_exception(self, self._timers._loop, exc)

    @property
    def _loop(self):
        return self._timers._loop

    def __repr__(self):
        return handle_repr(self, self._timers.debug)


@cython.final
@cython.no_gc_clear
@cython.auto_pickle(False)
cdef class LoopTimers:
    """An event loop's timers on one :class:`timerwheel_c.TimerWheel` (see the pure twin).

    Args:
        loop: the event loop; its ``time()`` is the clock (read in C when it is asyncio's).
    """
    cdef object _loop
    cdef bint _fast_clock
    cdef bint _closed
    cdef public bint debug     # mirrors loop.get_debug(): cancel() then freezes the repr
    cdef TimerWheel _wheel     # tokens index _handles
    cdef list _handles         # token -> the handle it arms, None when free: the collector sees them
    cdef token_stack_t _free_tokens
    cdef due_t* _sort          # move_due's scratch for a batch out of deadline order
    cdef Py_ssize_t _sort_cap

    def __cinit__(self, *args, **kwargs):
        self._wheel = TimerWheel(0)
        self._handles = [None]

    def __init__(self, loop):
        if self._loop is not None:
            raise RuntimeError("LoopTimers.__init__ called on a store already in use")
        self._loop = loop
        self._fast_clock = FAST_CLOCK and getattr(type(loop), "time", None) is _BASE_TIME
        self._wheel = TimerWheel(max(_loop_ms(self.c_time()) - 1, 0))

    def __dealloc__(self):
        free(self._sort)
        free(self._free_tokens.free)

    def active_count(self):
        """How many timers are armed (neither run, moved to the ready queue, nor cancelled)."""
        return self._wheel.c_count()

    def call_at(self, when, callback, *args, context=None):
        """``loop.call_at``: a new :class:`TimerHandle` for ``callback(*args)`` at loop time
        ``when`` (s), armed, in ``context`` (default: a copy of the current context).

        Raises:
            RuntimeError: the loop is closed. TypeError / ValueError: from ``check_when``.
        """
        cdef double when_s
        if type(when) is float and when == when:
            when_s = <double>when
        else:
            when_s = check_when(when, "when")
        return self._call_at(when_s, callback, args, context)

    def call_later(self, delay, callback, *args, context=None):
        """``loop.call_later``: ``call_at(loop.time() + delay, ...)``.

        Raises:
            as :meth:`call_at`, naming ``delay``.
        """
        cdef double delay_s
        if type(delay) is float and delay == delay:
            delay_s = <double>delay
        else:
            delay_s = check_when(delay, "delay")
        return self._call_at(self.c_time() + delay_s, callback, args, context)

    def select_timeout(self, bint busy):
        """The selector's timeout in seconds for this iteration, as asyncio computes it:
        0 if ``busy`` (callbacks ready, or the loop stopping), None with no timer armed, else
        the time until the earliest timer fires, capped at one day."""
        cdef TimerWheel wheel = self._wheel
        cdef int64_t due_ms
        cdef double wake_s, timeout_s
        if busy:
            return 0
        if wheel.c_count() == 0:
            return None
        # A lower bound of the earliest due ms; a timer due in ms d fires once floor_ms(time) > d.
        due_ms = wheel.c_next_fire_ms()
        if due_ms <= wheel.c_now_ms():
            due_ms = wheel.c_now_ms() + 1
        wake_s = (due_ms + 1) / 1000.0
        if _loop_ms(wake_s) <= due_ms:  # float rounding put it a hair early
            wake_s = nextafter(wake_s, INFINITY)
        timeout_s = wake_s - self.c_time()
        if timeout_s > MAX_SELECT:
            return MAX_SELECT
        return timeout_s if timeout_s > 0.0 else 0.0

    def move_due(self, ready):
        """Append every due handle to ``ready`` (the loop's deque), in deadline order, equal
        deadlines in scheduling order. Due: its whole ms is past on the loop clock, so its
        deadline is strictly before ``loop.time()``. Returns how many were moved."""
        cdef TimerWheel wheel = self._wheel
        cdef int64_t target_ms = _loop_ms(self.c_time()) - 1
        cdef tw_fired_t fired
        cdef Py_ssize_t i = 0
        cdef Py_ssize_t n
        if target_ms <= wheel.c_now_ms() or self._closed:
            return 0
        append = ready.append
        wheel.c_advance(target_ms, &fired)
        try:
            n = self._settle(&fired)
            while i < n:
                append(<object><PyObject*><size_t>fired.tokens[i])
                i += 1
                Py_DECREF(<object><PyObject*><size_t>fired.tokens[i - 1])  # the batch's, now the deque's
        finally:
            self._requeue(&fired, i)
            wheel.c_release(&fired)
        return n

    def close(self):
        """Drop every armed timer, as asyncio's close() clears its heap; later arming raises
        RuntimeError. Handles keep their state (not cancelled). Idempotent."""
        self._closed = True
        self._drain()

    # -- internals ----------------------------------------------------------------------------

    cdef double c_time(self) except? -1.0:
        """The loop's time in seconds: asyncio's clock read in C, else ``loop.time()``."""
        cdef double now_s
        if self._fast_clock and tw_monotonic_s(&now_s) == 0:
            return now_s
        return self._loop.time()

    cdef TimerHandle _call_at(self, double when_s, object callback, tuple args, object context):
        cdef TimerHandle handle
        cdef int64_t after_ms
        if self._closed:
            raise RuntimeError("Event loop is closed")
        handle = TimerHandle.__new__(TimerHandle)
        handle._timers = self
        handle._callback = callback
        handle._args = args
        handle._context = PyContext_CopyCurrent() if context is None else context
        handle._when = when_s
        # The ms the deadline lies in; past the wheel's range it never fires, as on asyncio's heap.
        after_ms = _loop_ms(when_s)
        if after_ms < MAX_DUE_MS:
            self._arm(handle, after_ms - self._wheel.c_now_ms())
        return handle

    cdef int _arm(self, TimerHandle handle, int64_t after_ms) except -1:
        """Arm ``handle`` ``after_ms`` ms from the wheel's now, at a new index of ``_handles``."""
        handle._token = _take_token(self._handles, &self._free_tokens, handle)
        handle._timer_id = self._wheel.c_schedule(after_ms, <uint64_t>handle._token)
        return 0

    cdef int _disarm(self, TimerHandle handle) except -1:
        """Take ``handle`` out of the wheel and out of ``_handles`` if armed."""
        if handle._timer_id:
            self._wheel.c_cancel(handle._timer_id)
            _give_token(self._handles, &self._free_tokens, handle._token, handle)
            handle._timer_id = 0
            handle._token = 0
        return 0

    cdef Py_ssize_t _settle(self, tw_fired_t* fired) except -1:
        """Swap a fired batch's tokens for references to their handles, freeing their indexes and
        marking them unarmed, and sort it by deadline (stable), with no Python code run. Returns
        the batch's new length."""
        cdef Py_ssize_t i, n = 0
        cdef bint in_order = True
        cdef double prev = -INFINITY
        cdef TimerHandle handle
        for i in range(fired.count):
            obj = _token_handle(self._handles, fired.tokens[i])
            # cancel() takes a timer out of the wheel at once, so a fired token names an armed
            # handle whose timer is no longer pending, unless the collector cleared _handles (the
            # store is garbage) and a finalizer armed a new handle at a reused index: skipped.
            if obj is None:
                continue
            handle = <TimerHandle>obj
            if handle._timer_id == 0 or self._wheel.c_due_ms(handle._timer_id) >= 0:
                continue
            Py_INCREF(handle)  # the batch's, until the ready queue or _requeue takes it
            _give_token(self._handles, &self._free_tokens, handle._token, handle)
            fired.tokens[n] = <uint64_t><size_t><PyObject*>handle
            n += 1
            handle._timer_id = 0
            handle._token = 0
            if handle._when < prev:
                in_order = False
            prev = handle._when
        fired.count = n
        if in_order:
            return n
        if n > self._sort_cap:
            self._grow_sort(n)
        for i in range(n):
            self._sort[i].when = (<TimerHandle><PyObject*><size_t>fired.tokens[i])._when
            self._sort[i].seq = i
            self._sort[i].token = fired.tokens[i]
        qsort(self._sort, n, sizeof(due_t), _by_when)
        for i in range(n):
            fired.tokens[i] = self._sort[i].token
        return n

    cdef int _grow_sort(self, Py_ssize_t n) except -1:
        cdef due_t* p = <due_t*>realloc(self._sort, n * sizeof(due_t))
        if p == NULL:
            raise MemoryError(f"cannot sort a fire batch of {n} timers")
        self._sort = p
        self._sort_cap = n
        return 0

    cdef int _requeue(self, tw_fired_t* fired, Py_ssize_t start) except -1:
        """Put back the handles an exception kept off the ready queue (tokens from ``start``):
        already due, they go back on the next ms, in order, so none is lost. Each drops the
        batch's reference."""
        cdef Py_ssize_t i
        cdef TimerHandle handle
        for i in range(start, fired.count):
            handle = <TimerHandle><PyObject*><size_t>fired.tokens[i]
            Py_DECREF(handle)  # the local keeps it alive
            if not (self._closed or handle._cancelled):
                self._arm(handle, 1)
        return 0

    cdef int _drain(self) except -1:
        """Drop every armed handle (close): they keep their state, unarmed."""
        cdef TimerHandle handle
        for handle in _drop_tokens(self._wheel, self._handles, &self._free_tokens):
            handle._timer_id = handle._token = 0
        return 0

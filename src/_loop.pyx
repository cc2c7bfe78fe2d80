# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, binding=False
"""The event loop's timers on the wheel, compiled: ``LoopTimers`` and its ``TimerHandle``, and
the methods ``EventLoop`` takes from here: ``time``, ``call_at``, ``call_later``, ``call_soon``.

``timerwheel_c/pure/loop.py`` is the pure-Python twin, in the same order, and holds the design
(the ms clock, the never-early rule, due order); ``timerwheel_c.loop.EventLoop`` drives either.
"""
# A handle's wheel token is its index in the store's ``_handles`` list, as in the asyncio scheduler
# (src/_aio_tokens.pxi): the collector sees the armed handles through it, so a loop dropped
# unclosed with timers pending is collected, as asyncio's is, with no hand-written traverse.
# Handles, their indexes and their wheel entries are placed in arming order (tw_slab.h,
# LoopTimers._take_token, TimerWheel.c_take_in_order; docs/DESIGN.md, "Placement").
#
# The handle call_at armed last waits at _handles[0], an index no token takes, for its wheel entry
# and its index until the store next reads the wheel or call_at arms another (LoopTimers._wait,
# _flush): one cancelled before then, as an ``asyncio.timeout`` block that ends in time cancels its
# handle, never touches the wheel or the index list.
#
# Reentrancy: ready.append() may run the collector, whose Python code may cancel a handle or arm
# a timer on this very loop (and so reuse a freed index). So move_due() takes the batch out of the
# wheel first (c_advance hands the token buffer over) and, in C only, swaps each token for a
# reference to its handle and frees its index; only then does it run Python code.
cimport cython
from cpython.contextvars cimport PyContext_Copy, PyContext_CopyCurrent, PyContext_Enter, PyContext_Exit
from cpython.object cimport Py_TYPE, PyObject, PyTypeObject, newfunc
from cpython.ref cimport Py_DECREF, Py_INCREF
from libc.math cimport INFINITY, ceil, floor, isfinite, nextafter
from libc.stdint cimport UINT64_MAX, int64_t, uint64_t
from libc.stdlib cimport free, qsort, realloc

from timerwheel_c._wheel cimport TimerWheel, tw_fired_t

import asyncio
import contextvars
import select as _select_module
import selectors
import weakref
from asyncio import selector_events
from types import MemberDescriptorType

from timerwheel_c._common import _refuse_copy
from timerwheel_c._loop_common import (
    MAX_SELECT_S,
    check_when,
    handle_repr,
    handle_run_hook,
    later_through_call_at as _later_through_call_at,
    patched_asyncio_time as _patched_asyncio_time,
    report_exception,
)

__all__ = ["LoopTimers", "TimerHandle", "call_at", "call_later", "call_soon", "install_methods", "time"]

cdef extern from "tw_prefetch.h":
    void tw_prefetch(void* p) noexcept nogil
    void tw_prefetch_freed(PyObject* op) noexcept
    void tw_prefetch_gc_next(PyObject* op) noexcept

cdef extern from "tw_methods.h":
    ctypedef struct tw_type_memo:
        pass
    PyObject* tw_type_get(PyTypeObject* tp, PyObject* name, tw_type_memo* memo) noexcept
    object tw_tuple_of(PyObject** items, Py_ssize_t n)
    bint tw_only_keyword(PyObject* kwnames, PyObject* name) noexcept
    object tw_call_with_self(PyObject* func, PyObject* self, PyObject** args, Py_ssize_t nargs, PyObject* kwnames)

cdef extern from "Python.h":
    ctypedef PyObject* (*PyCFunction)(PyObject*, PyObject*)
    ctypedef struct PyMethodDef:
        const char* ml_name
        PyCFunction ml_meth
        int ml_flags
        const char* ml_doc
    int METH_NOARGS
    int METH_FASTCALL
    int METH_KEYWORDS
    object PyDescr_NewMethod(PyTypeObject* type, PyMethodDef* meth)
    PyTypeObject PyMethodDescr_Type
    ctypedef struct PyMethodDescrObject:
        PyMethodDef* d_method

cdef extern from "Python.h":
    bint PyMethod_Check(object op)
    PyObject* PyMethod_GET_FUNCTION(object meth)
    PyObject* PyMethod_GET_SELF(object meth)

cdef extern from "structmember.h":
    ctypedef struct PyMemberDef:
        pass
    int PyMember_SetOne(char* addr, PyMemberDef* member, PyObject* value) except -1

cdef extern from "Python.h":
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member

cdef extern from "tw_slab.h":
    int tw_slab_install(PyTypeObject* tp) except -1
    object tw_slab_stats()

cdef extern from "tw_context.h":
    PyObject* tw_current_context() noexcept
    PyObject* tw_context_vars(PyObject* ctx) noexcept

cdef extern from "Python.h":
    # The type's attribute as the method cache finds it (borrowed, NULL if none): what
    # ``type(loop).time`` is, without the descriptor call.
    PyObject* _PyType_Lookup(PyTypeObject* tp, PyObject* name)
    ctypedef struct PyListObject:
        PyObject** ob_item

ctypedef struct due_t:
    double when
    int64_t seq
    uint64_t token

cdef double MAX_SELECT = MAX_SELECT_S
# A waiting handle's _timer_id: armed, and no id the wheel gives (its entry index, the low 32 bits,
# is past any pool).
cdef uint64_t WAITING_ID = UINT64_MAX

include "_aio_clock.pxi"


cdef inline object _token_handle(list handles, uint64_t token):
    """The handle at index ``token``, or None (a freed or dropped index)."""
    if token < <uint64_t>len(handles):
        return handles[<Py_ssize_t>token]
    return None

cdef str _TIME_NAME = "time"
cdef str _TIMERS_NAME = "_timers"
cdef str _CALL_AT_NAME = "call_at"
# The loop methods asyncio's call_soon calls, which call_soon's compiled path stands for.
cdef str _CALL_SOON_INNER_NAME = "_call_soon"
cdef str _CHECK_CLOSED_NAME = "_check_closed"
cdef str _GET_DEBUG_NAME = "get_debug"


def _context_reads_hold():
    """True if tw_context.h reads this interpreter's contexts right: the current context is the
    one entered, a copy shares its original's variables, and setting one gives new ones."""
    cdef object var = contextvars.ContextVar("timerwheel_c_probe")
    cdef object ctx = contextvars.Context()
    cdef object copy = PyContext_Copy(ctx)

    def entered():
        return tw_current_context() == <PyObject*>ctx

    if not ctx.run(entered) or tw_context_vars(<PyObject*>copy) != tw_context_vars(<PyObject*>ctx):
        return False
    ctx.run(var.set, 1)
    return tw_context_vars(<PyObject*>copy) != tw_context_vars(<PyObject*>ctx) and copy.get(var) is None


# Handles armed without a context share a snapshot of the current one while its variables stay
# the same (LoopTimers._snapshot): a context copy per handle is most of what freeing a re-armed
# timer costs, and most timers are cancelled before they run.
cdef bint SHARED_CONTEXT = _context_reads_hold()


cdef inline double _due_limit(double now_s, double resolution_s) noexcept nogil:
    """The latest deadline due at loop time ``now_s``: the last float before ``now_s +
    resolution_s`` (``loop._clock_resolution``), or ``now_s`` where that sum does not exceed it
    (see ``_loop_common.due_limit``)."""
    cdef double limit = now_s + resolution_s
    if limit > now_s:
        return nextafter(limit, -INFINITY)
    return now_s


cdef inline double _order_key(double when_s, double now_s) noexcept nogil:
    """``order_key``: a deadline's place in due order, never NaN: ``when_s``, or for a NaN deadline
    the loop time ``now_s`` it was armed at (as ``call_later(0)`` then)."""
    if when_s == when_s:
        return when_s
    return now_s if now_s == now_s else -INFINITY


cdef TimerWheel _new_wheel(int64_t now_ms):
    """A wheel at ``now_ms`` whose entries are taken in address order (``c_take_in_order``)."""
    cdef TimerWheel wheel = TimerWheel(now_ms)
    wheel.c_take_in_order()
    return wheel


cdef inline int64_t _loop_ms(double t_s) noexcept:
    """``loop_ms``: the ms a loop time ``t_s`` lies in, clamped to [-1, 2**62] (a real clock is far
    inside it; the wheel's last ms holds every later deadline, held by its own value)."""
    if not t_s * 1000.0 < MAX_DUE_MS_F:
        return MAX_DUE_MS
    if not t_s * 1000.0 >= 0.0:
        return -1
    return _floor_ms(t_s)


cdef int _by_when(const void* a, const void* b) noexcept nogil:
    """qsort order of a fire batch: deadline, then arming order."""
    cdef const due_t* x = <const due_t*>a
    cdef const due_t* y = <const due_t*>b
    if x.when != y.when:  # keys from _order_key: never NaN
        return -1 if x.when < y.when else 1
    return -1 if x.seq < y.seq else (1 if x.seq > y.seq else 0)


@cython.final
@cython.no_gc_clear
@cython.auto_pickle(False)
cdef class TimerHandle:
    """A callback armed on the loop's wheel by ``call_at``/``call_later``; answers as
    ``asyncio.TimerHandle`` does: ``when()``, ``cancel()``, ``cancelled()``, ``get_context()``.

    Not a subclass of ``asyncio.TimerHandle`` (``isinstance`` is False, as for uvloop's handles,
    uvloop#482): that class keeps the heap's bookkeeping, which a wheel timer has none of.
    """
    # What cancel() reads comes first, beside the header the method call has just loaded.
    cdef LoopTimers _timers
    cdef uint64_t _timer_id            # the wheel's id while armed (WAITING_ID while it waits), else 0
    cdef Py_ssize_t _token             # its index in the store's _handles while in the wheel, else 0
    cdef readonly object _callback     # None once cancelled
    cdef object _ctx                   # the store's snapshot while _context_shared
    cdef readonly bint _cancelled
    cdef bint _context_shared          # its own copy of _ctx is made when first needed
    cdef readonly object _args
    cdef readonly double _when         # read as asyncio's handle attribute by heap readers
    cdef double _order_s               # its place in due order: _order_key(when, loop time armed at)
    cdef int64_t _seq                  # arming order: ties of deadline run in it
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
        return self._own_context()

    def cancelled(self):
        """True once :meth:`cancel` was called."""
        return self._cancelled

    @cython.nonecheck(True)  # a handle made with __new__ has no store: AttributeError, never a crash
    def cancel(self):
        """Cancel the callback; a no-op if already cancelled or run. O(1): the wheel entry is
        freed at once, so no cancelled handle is kept anywhere."""
        # What this touches at random (the wheel entry, the handle's index) and then releases
        # (the callback; the handle itself, which a re-arm drops right after its call_later),
        # all fetched at once, so the misses overlap instead of stalling in turn (see tw_prefetch.h).
        tw_prefetch_freed(<PyObject*>self)
        if self._cancelled:
            return
        if self._token:
            self._timers._wheel.c_prefetch(self._timer_id)
            tw_prefetch(&(<PyListObject*>self._timers._handles).ob_item[self._token])
        tw_prefetch_freed(<PyObject*>self._callback)
        tw_prefetch(<PyObject*>self._ctx)
        self._cancelled = True
        if self._timers.debug:
            self._repr = handle_repr(self, True)
        self._timers._disarm(self)
        self._callback = None
        self._args = None
        tw_prefetch_gc_next(<PyObject*>self)

    cdef object _own_context(self):
        """The handle's context: a copy of the store's snapshot made now, if it shares one. The
        copy holds the variables the snapshot holds, those current at ``call_at``, as the copy
        asyncio makes there would; it is made at the first need since most timers never run."""
        if self._context_shared:
            self._ctx = PyContext_Copy(self._ctx)
            self._context_shared = False
        return self._ctx

    @cython.nonecheck(True)
    def _run(self):
        """Run the callback in its context; its exception goes to the loop's handler, as asyncio."""
        try:
            self._own_context()
            if type(self._ctx) is contextvars.Context:
                PyContext_Enter(self._ctx)
                try:
                    self._callback(*self._args)
                finally:
                    PyContext_Exit(self._ctx)
            else:
                self._ctx.run(self._callback, *self._args)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            report_exception(self, self._timers._owner(), exc)

    @property
    def _context(self):
        """asyncio's ``Handle._context``: the context the callback runs in, for code that runs a
        handle through asyncio's own ``Handle._run`` (a slow-callback hook that replaced it)."""
        return self._own_context()

    @property
    @cython.nonecheck(True)
    def _loop(self):
        return self._timers._owner()

    @property
    def _scheduled(self):
        """True while armed, so listed in ``loop._scheduled``, as asyncio's flag of a handle on its heap."""
        return self._timer_id != 0

    @cython.nonecheck(True)
    def __repr__(self):
        return handle_repr(self, self._timers.debug)

    def __reduce_ex__(self, protocol):
        _refuse_copy(self)  # the pure twin's TypeError, word for word

    # Compared and hashed as asyncio's TimerHandle (CPython Lib/asyncio/events.py): ordered by
    # when(), equal when deadline, callback, arguments and cancellation are.
    def __hash__(self):
        return hash(self._when)

    def __eq__(self, other):
        if not isinstance(other, TimerHandle):
            return NotImplemented
        cdef TimerHandle o = <TimerHandle>other
        return (self._when == o._when and self._callback == o._callback and self._args == o._args
                and self._cancelled == o._cancelled)

    def __lt__(self, other):
        if not isinstance(other, TimerHandle):
            return NotImplemented
        return self._when < (<TimerHandle>other)._when

    def __le__(self, other):
        if not isinstance(other, TimerHandle):
            return NotImplemented
        return self._when < (<TimerHandle>other)._when or self.__eq__(other)

    def __gt__(self, other):
        if not isinstance(other, TimerHandle):
            return NotImplemented
        return self._when > (<TimerHandle>other)._when

    def __ge__(self, other):
        if not isinstance(other, TimerHandle):
            return NotImplemented
        return self._when > (<TimerHandle>other)._when or self.__eq__(other)


# Handles are placed in arming order, not in the block freed last (see tw_slab.h): with the store's
# indexes and the wheel's entries, taken in the same order, a re-arm or a fire of handles in the
# order they were armed reads all three sequentially.
tw_slab_install(<PyTypeObject*>TimerHandle)


def _handle_blocks():
    """The handles' allocator (tw_slab.h), for tests: ``{"live", "capacity", "chunks",
    "block_bytes"}`` (handles allocated, blocks its chunks hold, chunks, a block's bytes), or None
    where the handles keep the default allocator (a free-threaded build)."""
    return tw_slab_stats()


# The iteration's I/O step and its run of the ready callbacks, compiled: asyncio's
# selectors.EpollSelector.select, _process_events and the loop over the ready queue are Python
# code that each iteration runs, about 350 ns of it on CPython 3.11 (two iterations per wait_for).
cdef object _EPOLL_SELECT = getattr(getattr(selectors, "EpollSelector", None), "select", None)
cdef object _EPOLLIN = getattr(_select_module, "EPOLLIN", None)
cdef object _EPOLLOUT = getattr(_select_module, "EPOLLOUT", None)
cdef object _EVENT_READ = selectors.EVENT_READ
cdef object _EVENT_WRITE = selectors.EVENT_WRITE
cdef object _PROCESS_EVENTS = selector_events.BaseSelectorEventLoop._process_events
cdef object _ASYNCIO_HANDLE = asyncio.Handle
cdef object _ASYNCIO_TIMER_HANDLE = asyncio.TimerHandle
cdef str _RUN_NAME = "_run"
cdef tw_type_memo _TIMER_RUN_MEMO
cdef object _hook_run = None     # asyncio.TimerHandle._run as last looked at
cdef object _hooked = None       # handle_run_hook()'s answer for it


cdef inline bint _is_bound(object method, object function, object owner) noexcept:
    """True if ``method`` is ``function`` bound to ``owner`` (what ``owner.name`` gives when the
    name is neither patched on ``owner`` nor overridden by its class)."""
    return PyMethod_Check(method) and PyMethod_GET_FUNCTION(method) == <PyObject*>function \
        and PyMethod_GET_SELF(method) == <PyObject*>owner


cdef list _epoll_select(object selector, object timeout):
    """``selectors.EpollSelector.select(selector, timeout)`` as CPython 3.9-3.14 run it: the same
    ``poll`` of the epoll object, the same events for the same keys."""
    if timeout is None:
        timeout = -1
    elif timeout <= 0:
        timeout = 0
    else:
        # epoll_wait() counts whole ms: round away from zero, to wait at least timeout seconds.
        timeout = ceil(<double>timeout * 1e3) * 1e-3
    max_ev = max(len(selector._fd_to_key), 1)
    ready = []
    try:
        fd_event_list = selector._selector.poll(timeout, max_ev)
    except InterruptedError:
        return ready
    # The key by its fd from the selector's dict, as 3.13's select reads it: 3.9-3.12's went through
    # _key_from_fd (the same lookup, None when absent), which 3.13 removed.
    fd_to_key = selector._fd_to_key
    for fd, event in fd_event_list:
        events = 0
        if event & ~_EPOLLIN:
            events |= _EVENT_WRITE
        if event & ~_EPOLLOUT:
            events |= _EVENT_READ
        key = fd_to_key.get(fd)
        if key:
            ready.append((key, events & key.events))
    return ready


cdef object _run_hook():
    """``handle_run_hook()``, asked again only once ``asyncio.TimerHandle._run`` changed (a type
    lookup through the method cache, where the Python function costs a call every iteration)."""
    global _hook_run, _hooked
    cdef PyObject* run = tw_type_get(<PyTypeObject*>_ASYNCIO_TIMER_HANDLE, <PyObject*>_RUN_NAME, &_TIMER_RUN_MEMO)
    if run == NULL or run != <PyObject*>_hook_run:
        _hooked = handle_run_hook()
        _hook_run = None if run == NULL else <object>run
    return _hooked


@cython.final
@cython.no_gc_clear
@cython.auto_pickle(False)
cdef class LoopTimers:
    """An event loop's timers on one :class:`timerwheel_c.TimerWheel` (see the pure twin).

    Args:
        loop: the event loop; its ``time()`` is the clock (read in C while it is asyncio's clock,
            unpatched).
    """
    cdef object _loop          # the loop; None once closed, when _loop_ref holds it instead
    cdef object _loop_ref      # a weak reference to the loop once closed (see close()), else None
    cdef dict _loop_dict      # the loop's __dict__: a ``time`` set there (a test's patch) is seen
    cdef tw_dict_memo _time_memo  # _loop_dict's ``time`` as last read
    cdef tw_type_memo _time_type_memo  # type(loop).time as last read
    cdef bint _fast_clock
    cdef bint _closed
    cdef bint _due_now        # a timer was armed due now since the last move_due
    cdef double _held_when    # earliest deadline waiting in the wheel's current ms (inf: none)
    cdef int64_t _next_seq
    cdef public bint debug     # mirrors loop.get_debug(): cancel() then freezes the repr
    cdef TimerWheel _wheel     # tokens index _handles
    cdef list _handles         # token -> the handle it arms, None when free: the collector sees them
    cdef Py_ssize_t _tokens_taken  # indexes of _handles holding a handle
    cdef Py_ssize_t _token_cursor  # the index after the one taken last (see _take_token)
    cdef due_t* _sort          # move_due's scratch for a batch out of deadline order
    cdef Py_ssize_t _sort_cap
    cdef object _snapshot      # a copy of a current context that no callback enters, or None

    def __cinit__(self, *args, **kwargs):
        self._wheel = _new_wheel(0)
        self._handles = [None]
        self._token_cursor = 1
        self._loop_dict = {}
        self._held_when = INFINITY

    def __init__(self, loop):
        if self._loop is not None or self._loop_ref is not None:
            raise RuntimeError("LoopTimers.__init__ called on a store already in use")
        self._loop = loop
        loop_dict = getattr(loop, "__dict__", None)
        self._fast_clock = FAST_CLOCK and type(loop_dict) is dict
        if self._fast_clock:
            self._loop_dict = loop_dict
        self._wheel = _new_wheel(max(_loop_ms(self.c_time()), 0))

    def __dealloc__(self):
        _forget_loop(<PyObject*>self)
        free(self._sort)

    def __reduce_ex__(self, protocol):
        _refuse_copy(self)  # the pure twin's TypeError, word for word

    def active_count(self):
        """How many timers are armed (neither run, moved to the ready queue, nor cancelled)."""
        self._flush()
        return self._wheel.c_count()

    def scheduled(self):
        """The armed handles, a new list in due order: by ``when()``, equal deadlines in arming
        order, a NaN deadline placed as the loop time it was armed at."""
        cdef Py_ssize_t i, n = 0
        cdef TimerHandle handle
        cdef list handles, result
        self._flush()
        while True:
            # The result is made first: making it may run the collector, and a finalizer may arm,
            # cancel or close the loop, changing _handles. From the loop's end on no Python code runs.
            result = [None] * len(self._handles)
            handles = self._handles
            if len(handles) <= len(result):
                break
        if len(handles) > self._sort_cap:
            self._grow_sort(len(handles))
        for i in range(1, len(handles)):
            if handles[i] is not None:
                handle = <TimerHandle>handles[i]
                self._sort[n].when = handle._order_s
                self._sort[n].seq = handle._seq
                self._sort[n].token = <uint64_t>i
                n += 1
        qsort(self._sort, n, sizeof(due_t), _by_when)
        for i in range(n):
            result[i] = handles[self._sort[i].token]
        del result[n:]  # drops references to None only: no finalizer runs
        return result

    def call_at(self, when, callback, *args, context=None):
        """``loop.call_at``: a new :class:`TimerHandle` for ``callback(*args)`` at loop time
        ``when`` (s), armed, in ``context`` (default: a copy of the current context).

        Raises:
            RuntimeError: the loop is closed. TypeError: from ``check_when``.
        """
        cdef double when_s
        if type(when) is float:
            when_s = <double>when
        else:
            when_s = check_when(when, "when")
        return self._call_at_when(when_s, callback, args, context)

    def call_later(self, delay, callback, *args, context=None):
        """``loop.call_later``: ``call_at(loop.time() + delay, ...)``.

        Raises:
            as :meth:`call_at`, naming ``delay``.
        """
        cdef double delay_s, now_s
        if type(delay) is float:
            delay_s = <double>delay
        else:
            delay_s = check_when(delay, "delay")
        now_s = self.c_time()
        return self._call_at(now_s + delay_s, now_s, callback, args, context)

    def select_timeout(self, bint busy):
        """The selector's timeout in seconds for this iteration, as asyncio computes it:
        0 if ``busy`` (callbacks ready, or the loop stopping) or a timer is due now, None with
        no timer armed, else the time until the earliest timer fires, capped at one day."""
        cdef TimerWheel wheel = self._wheel
        cdef int64_t due_ms
        cdef double now_s, wake_s, timeout_s
        if busy or self._due_now:
            return 0
        self._flush()
        if wheel.c_count() == 0:
            return None
        now_s = self.c_time()
        self._follow_clock(now_s)
        if self._due_now:
            return 0
        wheel = self._wheel
        if self._held_when < INFINITY:  # in the current ms: before every later ms's timer
            timeout_s = self._held_when - now_s
            if timeout_s > MAX_SELECT:  # the wheel's last ms, past its range
                return MAX_SELECT
            return timeout_s if timeout_s > 0.0 else 0.0
        # A lower bound of the earliest due ms; a timer due in ms d is looked at once floor_ms(time) >= d.
        due_ms = wheel.c_next_fire_ms()
        if due_ms <= wheel.c_now_ms():
            if wheel.c_now_ms() == MAX_DUE_MS:  # the last ms holds only inf deadlines now
                return MAX_SELECT
            due_ms = wheel.c_now_ms() + 1
        wake_s = due_ms / 1000.0
        if _loop_ms(wake_s) < due_ms:  # float rounding put it a hair early
            wake_s = nextafter(wake_s, INFINITY)
        timeout_s = wake_s - now_s
        if timeout_s > MAX_SELECT:
            return MAX_SELECT
        return timeout_s if timeout_s > 0.0 else 0.0

    def move_due(self, ready):
        """Append every due handle to ``ready`` (the loop's deque), in deadline order, equal
        deadlines in scheduling order. Due: its deadline is at or before ``loop.time()`` (or NaN),
        or lies in the wheel's ms before ``loop.time() + loop._clock_resolution`` (``_due_limit``),
        as asyncio's ``_run_once`` moves its heap's. Returns how many were moved."""
        cdef double now_s, due_s
        cdef int64_t target_ms
        cdef TimerWheel wheel
        cdef tw_fired_t fired
        cdef Py_ssize_t i = 0
        cdef Py_ssize_t n
        if self._closed:
            return 0
        self._flush()
        # A snapshot lives one iteration past its arming: it holds no variable's value longer.
        self._snapshot = None
        now_s = self.c_time()
        self._follow_clock(now_s)
        wheel = self._wheel
        target_ms = _loop_ms(now_s)
        if target_ms <= wheel.c_now_ms() and not self._due_now and self._held_when == INFINITY:
            return 0
        due_s = _due_limit(now_s, getattr(self._owner(), "_clock_resolution", 0.0))
        if target_ms <= wheel.c_now_ms():
            if not (self._due_now or self._held_when <= due_s):
                return 0
            target_ms = wheel.c_now_ms()
        append = ready.append
        self._due_now = False
        self._held_when = INFINITY
        wheel.c_advance(target_ms, &fired)
        try:
            n = self._settle(&fired, due_s)
            while i < n:
                append(<object><PyObject*><size_t>fired.tokens[i])
                i += 1
                Py_DECREF(<object><PyObject*><size_t>fired.tokens[i - 1])  # the batch's, now the deque's
        finally:
            self._requeue(&fired, i)
            wheel.c_release(&fired)
        return n

    def poll(self, selector, timeout):
        """``loop._process_events(selector.select(timeout))``: an iteration's I/O step, as asyncio's
        ``_run_once`` takes it. Where ``selector.select`` is asyncio's epoll selector's own (not
        patched on the selector, its class or a subclass), its code runs here in C, and asyncio's own
        ``_process_events``, which does nothing with no event, is not called with none; any other
        selector or ``_process_events`` is called as asyncio calls it."""
        loop = self._owner()
        select = selector.select
        if _EPOLL_SELECT is not None and _is_bound(select, _EPOLL_SELECT, selector):
            event_list = _epoll_select(selector, timeout)
        else:
            event_list = select(timeout)
        process = loop._process_events
        if type(event_list) is list and not event_list and _is_bound(process, _PROCESS_EVENTS, loop):
            return
        process(event_list)

    def run_ready(self, ready, Py_ssize_t ntodo):
        """Run the next ``ntodo`` callbacks of ``ready`` (the loop's deque), and only those, as
        asyncio's ``_run_once`` does out of debug mode: each not cancelled through its ``_run()``,
        which reports its exception to the loop's handler and lets SystemExit and KeyboardInterrupt
        out, or a wheel handle through a replacement of asyncio's ``Handle._run`` (``handle_run_hook``).

        Returns:
            0; or, found in debug mode before a callback, how many are left, the first of them put
            back at the head of ``ready``, for the loop's checked path to run.
        """
        cdef Py_ssize_t i
        loop = self._owner()
        hooked = _run_hook()
        for i in range(ntodo):
            handle = ready.popleft()
            if handle._cancelled:
                continue
            if loop._debug:
                ready.appendleft(handle)
                return ntodo - i
            if hooked is None or isinstance(handle, _ASYNCIO_HANDLE):
                handle._run()
            else:  # a timer handle of the wheel, through asyncio's replaced Handle._run
                hooked(handle)
        return 0

    def close(self):
        """Drop every armed timer, as asyncio's close() clears its heap; later arming raises
        RuntimeError. Handles keep their state (not cancelled). Idempotent."""
        self._closed = True
        # No iteration follows to drop the snapshot: its variables would live as long as the loop.
        self._snapshot = None
        self._drain()
        if self._loop is not None:
            # The loop holds this store: held back strongly, the pair would be freed only by the
            # cyclic collector, where asyncio's closed loop goes as its last reference does.
            _forget_loop(<PyObject*>self)
            self._loop_ref = weakref.ref(self._loop)
            self._loop = None
            self._loop_dict = {}
            self._fast_clock = False

    cdef object _owner(self):
        """The loop (None once a closed one is freed)."""
        return self._loop if self._loop_ref is None else self._loop_ref()

    # -- internals ----------------------------------------------------------------------------

    cdef double c_time(self) except? -1.0:
        """The loop's time in seconds: asyncio's clock read in C while ``loop.time`` is asyncio's
        (or this module's ``time``) and nothing patched it, else ``loop.time()`` itself."""
        cdef double now_s
        cdef PyObject* loop_time
        if self._fast_clock and _monotonic_is_real() \
                and tw_dict_get(<PyObject*>self._loop_dict, <PyObject*>_TIME_NAME, &self._time_memo) == NULL:
            loop_time = tw_type_get(Py_TYPE(self._loop), <PyObject*>_TIME_NAME, &self._time_type_memo)
            if (loop_time == <PyObject*>_BASE_TIME or (_is_own_time(loop_time) and _asyncio_time_is_own())) \
                    and tw_monotonic_s(&now_s) == 0:
                return now_s
        return self._owner().time()

    cdef TimerHandle _call_at_when(self, double when_s, object callback, tuple args, object context):
        """``call_at``: :meth:`_call_at`, reading the loop's time only where it decides anything. A
        deadline in a ms after the wheel's now is armed in that ms whatever the time: if it is
        already due, the next iteration advances the wheel to its ms and moves it, as it moves a
        due-now one, in the same order; if not, it is held until due, as ever."""
        cdef TimerHandle handle
        cdef int64_t due_ms = _loop_ms(when_s)
        if when_s == when_s and due_ms > self._wheel.c_now_ms():
            handle = self._new_handle(when_s, when_s, callback, args, context)
            self._wait(handle, due_ms)
            return handle
        return self._call_at(when_s, self.c_time(), callback, args, context)

    cdef TimerHandle _new_handle(self, double when_s, double order_s, object callback, tuple args, object context):
        """A new, unarmed handle for ``callback(*args)`` at ``when_s``, in due order at ``order_s``.

        Raises:
            RuntimeError: the store is closed.
        """
        cdef TimerHandle handle
        if self._closed:
            raise RuntimeError("Event loop is closed")
        handle = TimerHandle.__new__(TimerHandle)
        handle._timers = self
        handle._callback = callback
        handle._args = args
        if context is not None:
            handle._ctx = context
        elif SHARED_CONTEXT and self._share_context():
            handle._ctx = self._snapshot
            handle._context_shared = True
        else:
            handle._ctx = PyContext_CopyCurrent()
        handle._when = when_s
        handle._order_s = order_s
        handle._seq = self._next_seq
        self._next_seq += 1
        return handle

    cdef bint _share_context(self) except -1:
        """Make ``_snapshot`` hold the current context's variables; False if the thread has no
        current context yet (a copy makes one)."""
        cdef PyObject* current = tw_current_context()
        if current == NULL:
            return False
        if self._snapshot is None or tw_context_vars(<PyObject*>self._snapshot) != tw_context_vars(current):
            self._snapshot = PyContext_CopyCurrent()
        return True

    cdef TimerHandle _call_at(self, double when_s, double now_s, object callback, tuple args, object context):
        """A new handle for ``callback`` at ``when_s``, armed: due now if ``when_s`` is at or before
        ``now_s`` (the loop's time) or NaN, as on asyncio's heap; else in the ms it lies in (held
        in the wheel's current ms if it lies there, or before: a negative loop time)."""
        cdef TimerHandle handle = self._new_handle(when_s, _order_key(when_s, now_s), callback, args, context)
        cdef int64_t due_ms
        if not when_s > now_s:
            self._due_now = True
            self._arm(handle, self._wheel.c_now_ms())
            return handle
        # Past the wheel's range (inf too), in its last ms: held there until the clock passes it.
        due_ms = _loop_ms(when_s)
        if due_ms < self._wheel.c_now_ms():
            # After now but before the wheel: the loop's clock went back (a patched clock).
            self._follow_clock(now_s)
        if due_ms <= self._wheel.c_now_ms():
            due_ms = self._wheel.c_now_ms()
            if when_s < self._held_when:
                self._held_when = when_s
        self._arm(handle, due_ms)
        return handle

    cdef int _arm(self, TimerHandle handle, int64_t due_ms) except -1:
        """Arm ``handle`` due at ``due_ms`` on the wheel (due now if not after its now), at a new
        index of ``_handles``."""
        handle._token = self._take_token(handle)
        handle._timer_id = self._wheel.c_schedule_at(due_ms, <uint64_t>handle._token)
        return 0

    cdef int _wait(self, TimerHandle handle, int64_t due_ms) except -1:
        """Arm ``handle``, due at ``due_ms`` (after the wheel's now), to wait at ``_handles[0]`` (see
        :meth:`_flush`), after the handle waiting there goes in."""
        cdef list handles = self._handles
        cdef PyObject** items
        self._flush()
        if len(handles) == 0:  # the collector cleared it: this store is garbage
            return self._arm(handle, due_ms)
        items = (<PyListObject*>handles).ob_item
        Py_INCREF(handle)
        items[0] = <PyObject*>handle
        Py_DECREF(None)  # the list's reference to the None it held
        handle._timer_id = WAITING_ID
        return 0

    cdef inline int _flush(self) except -1:
        """Put the handle waiting at ``_handles[0]`` in the wheel, due in the ms its deadline lies in
        (after the wheel's now: every move of the wheel's now comes after a flush). Called before the
        wheel or ``_handles`` is read, so the wheel answers as if it had gone in when armed (a
        batch's order is sorted by deadline, then arming order, whatever order the wheel holds)."""
        cdef list handles = self._handles
        cdef PyObject** items
        cdef TimerHandle handle
        if len(handles) == 0:
            return 0
        items = (<PyListObject*>handles).ob_item
        if items[0] == <PyObject*>None:
            return 0
        handle = <TimerHandle>items[0]
        Py_INCREF(None)
        items[0] = <PyObject*>None
        Py_DECREF(handle)  # the list's reference; the local keeps it alive
        self._arm(handle, _loop_ms(handle._when))
        return 0

    cdef int _disarm(self, TimerHandle handle) except -1:
        """Take ``handle`` out of the wheel and out of ``_handles`` if armed, or out of
        ``_handles[0]`` if it waits there. The caller holds ``handle``: no finalizer runs here."""
        cdef list handles = self._handles
        cdef PyObject** items
        if handle._token:
            self._wheel.c_cancel(handle._timer_id)
            self._give_token(handle)
        elif handle._timer_id and len(handles):
            items = (<PyListObject*>handles).ob_item
            if items[0] == <PyObject*>handle:
                Py_INCREF(None)
                items[0] = <PyObject*>None
                Py_DECREF(handle)
        handle._timer_id = 0
        handle._token = 0
        return 0

    cdef int _follow_clock(self, double now_s) except -1:
        """If the loop's clock went back before the wheel's time (a patched or virtual clock:
        ``mock.patch``, looptime), move the wheel back with it: every armed handle is filed again
        by its deadline, in the old wheel's fire order, so equal deadlines keep scheduling order."""
        cdef int64_t now_ms = max(_loop_ms(now_s), 0)
        cdef TimerWheel old = self._wheel
        cdef TimerWheel wheel
        cdef tw_fired_t fired
        cdef TimerHandle handle
        cdef Py_ssize_t i
        cdef int64_t due_ms
        if now_ms >= old.c_now_ms():
            return 0
        self._flush()
        wheel = _new_wheel(now_ms)
        self._held_when = INFINITY
        old.c_advance(MAX_DUE_MS, &fired)
        try:
            for i in range(fired.count):
                obj = _token_handle(self._handles, fired.tokens[i])
                if obj is None:  # the collector cleared _handles: this core is garbage
                    continue
                handle = <TimerHandle>obj
                if handle._when > now_s:
                    due_ms = max(_loop_ms(handle._when), now_ms)
                    if due_ms == now_ms and handle._when < self._held_when:
                        self._held_when = handle._when
                else:  # due now, NaN included
                    due_ms = now_ms
                    self._due_now = True
                handle._timer_id = wheel.c_schedule_at(due_ms, fired.tokens[i])
        finally:
            old.c_release(&fired)
            self._wheel = wheel
        return 0

    cdef Py_ssize_t _settle(self, tw_fired_t* fired, double now_s) except -1:
        """Swap a fired batch's tokens for references to their handles, freeing their indexes and
        marking them unarmed, and sort it by deadline then arming order, with no Python code run.
        A handle whose deadline is after ``now_s`` is armed again under the same index: held at
        the wheel's now if its deadline lies in that ms, else in its own ms (armed due now by a
        clock that then went back: held in the current ms, it would hide every later ms's timer
        from the select timeout). Returns the batch's new length."""
        cdef Py_ssize_t i, n = 0
        cdef bint in_order = True
        cdef double prev = -INFINITY
        cdef double key
        cdef int64_t prev_seq = -1
        cdef int64_t due_ms
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
            if handle._when > now_s:
                due_ms = _loop_ms(handle._when)
                if due_ms > self._wheel.c_now_ms():
                    handle._timer_id = self._wheel.c_schedule_at(due_ms, fired.tokens[i])
                    continue
                handle._timer_id = self._wheel.c_schedule_at(self._wheel.c_now_ms(), fired.tokens[i])
                if handle._when < self._held_when:
                    self._held_when = handle._when
                continue
            Py_INCREF(handle)  # the batch's, until the ready queue or _requeue takes it
            self._give_token(handle)
            fired.tokens[n] = <uint64_t><size_t><PyObject*>handle
            n += 1
            handle._timer_id = 0
            handle._token = 0
            key = handle._order_s
            if key < prev or (key == prev and handle._seq < prev_seq):
                in_order = False
            prev = key
            prev_seq = handle._seq
        fired.count = n
        if in_order:
            return n
        if n > self._sort_cap:
            self._grow_sort(n)
        for i in range(n):
            handle = <TimerHandle><PyObject*><size_t>fired.tokens[i]
            self._sort[i].when = handle._order_s
            self._sort[i].seq = handle._seq
            self._sort[i].token = fired.tokens[i]
        qsort(self._sort, n, sizeof(due_t), _by_when)
        for i in range(n):
            fired.tokens[i] = self._sort[i].token
        return n

    cdef int _grow_sort(self, Py_ssize_t n) except -1:
        cdef due_t* p = <due_t*>realloc(self._sort, n * sizeof(due_t))
        if p == NULL:
            raise MemoryError(f"cannot sort {n} timers")
        self._sort = p
        self._sort_cap = n
        return 0

    cdef int _requeue(self, tw_fired_t* fired, Py_ssize_t start) except -1:
        """Put back the handles an exception kept off the ready queue (tokens from ``start``):
        already due, they are armed due now again, in order, so none is lost. Each drops the
        batch's reference."""
        cdef Py_ssize_t i
        cdef TimerHandle handle
        for i in range(start, fired.count):
            handle = <TimerHandle><PyObject*><size_t>fired.tokens[i]
            Py_DECREF(handle)  # the local keeps it alive
            if not (self._closed or handle._cancelled):
                self._due_now = True
                self._arm(handle, self._wheel.c_now_ms())
        return 0

    cdef int _drain(self) except -1:
        """Drop every armed handle (close): they keep their state, unarmed."""
        cdef TimerHandle handle
        cdef tw_fired_t fired
        cdef list detached
        self._flush()
        if self._wheel.c_count():
            self._wheel.c_advance(MAX_DUE_MS, &fired)
            self._wheel.c_release(&fired)
        detached = [handle for handle in self._handles if handle is not None]
        del self._handles[1:]
        self._tokens_taken = 0
        self._token_cursor = 1
        # Reset once no C state names them: dropping a reference may run Python code.
        for handle in detached:
            handle._timer_id = handle._token = 0
        return 0

    cdef Py_ssize_t _take_token(self, TimerHandle handle) except -1:
        """Put ``handle`` in ``_handles`` at a free index and return it: the first free one at or
        after the cursor (the index after the one taken last), as the wheel takes its entries
        (``c_take_in_order``): handles armed one after another get indexes one after another. Once
        3/4 of the indexes are taken, the list grows to 1.5 times the armed handles (Nones appended:
        no object is made, so no collection runs here), the cursor at the first new one. An index
        freed right after it was taken is taken again first (a timer armed and cancelled)."""
        cdef list handles = self._handles
        cdef Py_ssize_t n = len(handles)
        cdef Py_ssize_t t, k, want
        cdef PyObject** items
        if n == 0:
            # The collector cleared the list: this store is garbage and a finalizer arms.
            handles.append(None)
            n = 1
            self._tokens_taken = 0
            self._token_cursor = 1
        if self._tokens_taken * 4 >= (n - 1) * 3:
            want = max(3 * self._tokens_taken // 2, n - 1 + 64) + 1
            self._token_cursor = n
            while n < want:
                handles.append(None)
                n += 1
        items = (<PyListObject*>handles).ob_item
        t = self._token_cursor
        for k in range(n - 1):
            if t >= n:
                t = 1
            if items[t] == <PyObject*>None:
                Py_INCREF(handle)
                items[t] = <PyObject*>handle
                Py_DECREF(None)  # the list's reference to the None it held
                self._tokens_taken += 1
                self._token_cursor = t + 1
                if t + 8 < n:  # the slots the next takes most likely get, a cache line ahead
                    tw_prefetch(&items[t + 8])
                return t
            t += 1
        # Not reached while the count is right (1/4 of the indexes are free); a new index then.
        handles.append(handle)
        self._tokens_taken += 1
        self._token_cursor = n + 1
        return n

    cdef int _give_token(self, TimerHandle handle) except -1:
        """Free ``handle``'s index if it still holds it (not after a drain or the collector's clear).
        The caller holds ``handle``: no finalizer runs here."""
        cdef list handles = self._handles
        cdef Py_ssize_t t = handle._token
        cdef PyObject** items
        if 0 < t < len(handles):
            items = (<PyListObject*>handles).ob_item
            if items[t] == <PyObject*>handle:
                Py_INCREF(None)
                items[t] = <PyObject*>None
                Py_DECREF(handle)
                self._tokens_taken -= 1
                if t == self._token_cursor - 1:
                    self._token_cursor = t
        return 0


# The store of the loop last armed on, remembered with its __dict__'s version tag, so that
# call_at/call_later on an unchanged loop find ``loop._timers`` with one comparison instead of an
# attribute lookup (a type lookup and a dict lookup, a tenth of a re-arm's instructions), and
# call_soon learns with the same comparison that the loop's own __dict__ holds none of the methods
# it stands for. Borrowed: the store holds its loop and __dict__, and forgets the memo when it is
# freed; any change of the loop's __dict__ (a ``_timers`` set, a ``time`` patched) gives it a new
# tag, and so a lookup.
cdef PyObject* _memo_loop = NULL
cdef PyObject* _memo_timers = NULL
cdef uint64_t _memo_version = 0


cdef inline bint _memo_holds(object loop) noexcept:
    """True if the memo names ``loop`` and its __dict__ is unchanged since."""
    return <PyObject*>loop == _memo_loop and \
        tw_dict_version(<PyObject*>(<LoopTimers>_memo_timers)._loop_dict) == _memo_version


cdef inline object _loop_timers(object loop):
    """``loop._timers``, through the memo while the loop's __dict__ is unchanged."""
    global _memo_loop, _memo_timers, _memo_version
    cdef LoopTimers timers
    cdef uint64_t version
    cdef tw_dict_memo probe
    if _memo_holds(loop):
        return <LoopTimers>_memo_timers
    found = loop._timers
    if type(found) is LoopTimers and (<LoopTimers>found)._loop is loop and (<LoopTimers>found)._fast_clock:
        timers = <LoopTimers>found
        # Read after the lookup: a __dict__ changed by it (a property on a subclass) is looked up again.
        version = tw_dict_version(<PyObject*>timers._loop_dict)
        probe.version = 0
        # Kept only while the loop's own __dict__ holds no call_at, _call_soon, _check_closed or
        # get_debug: see _own_call_at and _own_call_soon_parts.
        if version != 0 \
                and tw_dict_get(<PyObject*>timers._loop_dict, <PyObject*>_TIMERS_NAME, &probe) == <PyObject*>found \
                and _CALL_AT_NAME not in timers._loop_dict and not _holds_call_soon_parts(timers._loop_dict):
            _memo_loop = <PyObject*>loop
            _memo_timers = <PyObject*>found
            _memo_version = version
    return found


cdef bint _own_call_at(object loop, object timers) except -1:
    """True if ``call_at`` is set on the loop object itself (``mock.patch.object(loop,
    "call_at")``), which asyncio's ``call_later`` calls as it would a class's; a loop in the
    memo of :func:`_loop_timers` has none, which one comparison tells."""
    if _memo_holds(loop):  # so timers is the memo's: _loop_timers returned it
        return False
    own = _own_dict(loop, timers)
    return type(own) is dict and _CALL_AT_NAME in <dict>own


cdef bint _own_call_soon_parts(object loop) except -1:
    """True if ``_call_soon``, ``_check_closed`` or ``get_debug`` is set on the loop object itself
    (``mock.patch.object(loop, "_call_soon")``), which asyncio's ``call_soon`` calls as it would a
    class's; a loop in the memo of :func:`_loop_timers` has none, which one comparison tells."""
    if _memo_holds(loop):
        return False
    own = _own_dict(loop, _loop_timers(loop))
    return type(own) is dict and _holds_call_soon_parts(<dict>own)


cdef inline object _own_dict(object loop, object timers):
    """The loop's own __dict__ (None if it has none), read without an attribute lookup where
    ``timers`` is its store."""
    if type(timers) is LoopTimers and (<LoopTimers>timers)._fast_clock and (<LoopTimers>timers)._loop is loop:
        return (<LoopTimers>timers)._loop_dict
    return getattr(loop, "__dict__", None)


cdef inline bint _holds_call_soon_parts(dict own) except -1:
    """True if ``own`` (a loop's __dict__) holds any of the methods asyncio's call_soon calls."""
    return _CALL_SOON_INNER_NAME in own or _CHECK_CLOSED_NAME in own or _GET_DEBUG_NAME in own


cdef inline void _forget_loop(PyObject* timers) noexcept:
    """Drop the memo if it names ``timers``, which is being freed."""
    global _memo_loop, _memo_timers, _memo_version
    if _memo_timers == timers:
        _memo_loop = _memo_timers = NULL
        _memo_version = 0


# EventLoop's own methods, on its class (so a patch of type(loop) sees every call, as on asyncio's
# loop) and compiled (no Python frame: a forwarding method's frame is a third of a timer's cost).
# The functions below are this module's ``time``, ``call_at`` and ``call_later``; EventLoop's class
# holds them as C methods (``install_methods``), which the interpreter calls straight from a
# ``loop.call_at(...)`` with no function object in between.

cdef object _SELECTOR_LOOP = asyncio.SelectorEventLoop
cdef tw_type_memo _SELECTOR_TIME_MEMO    # asyncio.SelectorEventLoop.time
cdef tw_type_memo _CALL_AT_MEMO          # type(loop).call_at, as call_later last read it


cdef inline bint _asyncio_time_is_own() noexcept:
    """True while asyncio's selector loop class, EventLoop's base, has asyncio's own ``time``
    (no test patched it there or on a class above it): a type lookup through the method cache."""
    return tw_type_get(<PyTypeObject*>_SELECTOR_LOOP, <PyObject*>_TIME_NAME, &_SELECTOR_TIME_MEMO) \
        == <PyObject*>_BASE_TIME


cdef inline bint _is_method(PyObject* found, PyMethodDef* definition) noexcept:
    """True if ``found`` is a C method made by ``install_methods`` from ``definition``."""
    return Py_TYPE(<object>found) == &PyMethodDescr_Type and (<PyMethodDescrObject*>found).d_method == definition


cdef inline bint _is_own_time(PyObject* found) noexcept:
    """True if ``found`` (a class's ``time``) is this module's: the function or the C method."""
    return found == <PyObject*>_LOOP_TIME or (found != NULL and _is_method(found, &_TIME_DEF))


cdef object _time(object loop):
    cdef double now_s
    if not _asyncio_time_is_own():
        patched = _patched_asyncio_time(loop, _LOOP_TIME)
        if patched is not None:
            return patched()
    if _monotonic_is_real() and tw_monotonic_s(&now_s) == 0:
        return now_s
    return _asyncio_monotonic()


@cython.binding(True)
def time(loop):
    """``loop.time()``: asyncio's clock, ``time.monotonic()``, in seconds; read in C unless
    ``time.monotonic`` is patched, or ``time`` on asyncio's loop classes (see
    ``_loop_common.patched_asyncio_time``), whose patch it then follows as asyncio's loop does."""
    return _time(loop)


cdef object _LOOP_TIME = time


cdef object _call_at(object loop, object when, object callback, tuple args, object context):
    cdef double when_s
    timers = _loop_timers(loop)
    if type(timers) is not LoopTimers or (<LoopTimers>timers).debug:
        return loop._call_at_checked(when, callback, args, context, 1)
    if type(when) is float:
        when_s = <double>when
    else:
        when_s = check_when(when, "when")
    return (<LoopTimers>timers)._call_at_when(when_s, callback, args, context)


@cython.binding(True)
def call_at(loop, when, callback, *args, context=None):
    """``loop.call_at``: run ``callback(*args)`` at loop time ``when`` (seconds), never before;
    at the next iteration if ``when`` is at or before ``loop.time()`` (or NaN), as asyncio.

    Returns:
        a :class:`TimerHandle`.
    Raises:
        TypeError: ``when`` is None or not a real number. RuntimeError: the loop is closed.
    """
    return _call_at(loop, when, callback, args, context)


cdef object _CALL_AT = call_at


cdef inline bint _is_own_call_at(PyObject* found) noexcept:
    """True if ``found`` (a class's ``call_at``) is this module's: the function or the C method."""
    return found == <PyObject*>_CALL_AT or (found != NULL and _is_method(found, &_CALL_AT_DEF))


cdef object _call_later(object loop, object delay, object callback, tuple args, object context):
    cdef double delay_s, now_s
    if not _is_own_call_at(tw_type_get(Py_TYPE(loop), <PyObject*>_CALL_AT_NAME, &_CALL_AT_MEMO)):
        return _later_through_call_at(loop, delay, callback, args, context)
    timers = _loop_timers(loop)
    if _own_call_at(loop, timers):
        return _later_through_call_at(loop, delay, callback, args, context)
    if type(timers) is not LoopTimers or (<LoopTimers>timers).debug:
        return loop._call_later_checked(delay, callback, args, context, 1)
    if type(delay) is float:
        delay_s = <double>delay
    else:
        delay_s = check_when(delay, "delay")
    now_s = (<LoopTimers>timers).c_time()
    return (<LoopTimers>timers)._call_at(now_s + delay_s, now_s, callback, args, context)


@cython.binding(True)
def call_later(loop, delay, callback, *args, context=None):
    """``loop.call_later``: run ``callback(*args)`` ``delay`` seconds from now (never before
    ``loop.time() + delay``; at the next iteration for a delay of 0 or less, or NaN).

    Returns:
        a :class:`TimerHandle`.
    Raises:
        TypeError: ``delay`` is None or not a real number. RuntimeError: the loop is closed.
    """
    return _call_later(loop, delay, callback, args, context)


cdef object _CALL_LATER = call_later


# call_soon, compiled: asyncio's BaseEventLoop.call_soon makes its asyncio.Handle through four
# Python frames (call_soon, _check_closed, _call_soon, Handle.__init__ and its get_debug), about
# 600 ns a call on CPython 3.11, and every future's callback and every task's wake-up goes through
# it (two per ``wait_for``). Here the same Handle is made and filled in C, as Handle.__init__ fills
# it, while everything it stands for is asyncio's own: the loop's _call_soon, _check_closed and
# get_debug (its class's, none set on the loop itself), asyncio.events.Handle, its __new__ and its
# __init__; debug mode, a closed loop, or any of those replaced, and the call is asyncio's own
# call_soon, which checks and raises as ever.
cdef object _BASE_CALL_SOON = asyncio.BaseEventLoop.call_soon
cdef object _HANDLE = asyncio.events.Handle
cdef dict _EVENTS_DICT = asyncio.events.__dict__
cdef str _HANDLE_NAME = "Handle"
cdef tw_dict_memo _HANDLE_MEMO
cdef str _INIT_NAME = "__init__"
cdef tw_type_memo _HANDLE_INIT_MEMO
cdef object _HANDLE_INIT = _HANDLE.__dict__.get("__init__")
# Handle's tp_new as imported (object's): the slots are filled in place, so what it makes must be a
# Handle. A __new__ set on the class replaces it, may make anything, and takes the arguments asyncio
# passes Handle(): only asyncio's own path calls it as asyncio does.
cdef newfunc _HANDLE_NEW = (<PyTypeObject*>_HANDLE).tp_new
# (name, asyncio's function, memo) of each loop method call_soon's compiled path stands for.
cdef object _BASE_CALL_SOON_INNER = asyncio.BaseEventLoop.__dict__.get("_call_soon")
cdef object _BASE_CHECK_CLOSED = asyncio.BaseEventLoop.__dict__.get("_check_closed")
cdef object _BASE_GET_DEBUG = asyncio.BaseEventLoop.__dict__.get("get_debug")
cdef tw_type_memo _CALL_SOON_INNER_MEMO
cdef tw_type_memo _CHECK_CLOSED_MEMO
cdef tw_type_memo _GET_DEBUG_MEMO
# The slots of asyncio.Handle that its __init__ fills, in its order, each a member descriptor.
cdef PyMemberDef* _SLOT_CONTEXT = NULL
cdef PyMemberDef* _SLOT_LOOP = NULL
cdef PyMemberDef* _SLOT_CALLBACK = NULL
cdef PyMemberDef* _SLOT_ARGS = NULL
cdef PyMemberDef* _SLOT_CANCELLED = NULL
cdef PyMemberDef* _SLOT_REPR = NULL
cdef PyMemberDef* _SLOT_SOURCE_TRACEBACK = NULL


cdef PyMemberDef* _handle_slot(str name):
    """asyncio.Handle's slot ``name`` (its member descriptor's definition), or NULL if it is not one."""
    descr = _HANDLE.__dict__.get(name)
    if type(descr) is not MemberDescriptorType or descr.__objclass__ is not _HANDLE:
        return NULL
    return (<PyMemberDescrObject*>descr).d_member


_SLOT_CONTEXT = _handle_slot("_context")
_SLOT_LOOP = _handle_slot("_loop")
_SLOT_CALLBACK = _handle_slot("_callback")
_SLOT_ARGS = _handle_slot("_args")
_SLOT_CANCELLED = _handle_slot("_cancelled")
_SLOT_REPR = _handle_slot("_repr")
_SLOT_SOURCE_TRACEBACK = _handle_slot("_source_traceback")
# The compiled path needs every slot as a plain member and asyncio's functions it stands for found:
# otherwise it is never taken.
cdef object _FALSE = False
cdef bint _HANDLE_SLOTS = (None not in (_HANDLE_INIT, _BASE_CALL_SOON_INNER, _BASE_CHECK_CLOSED, _BASE_GET_DEBUG)
                           and _SLOT_CONTEXT != NULL and _SLOT_LOOP != NULL and _SLOT_CALLBACK != NULL
                           and _SLOT_ARGS != NULL and _SLOT_CANCELLED != NULL and _SLOT_REPR != NULL
                           and _SLOT_SOURCE_TRACEBACK != NULL)


cdef inline bint _call_soon_is_asyncios(PyTypeObject* tp) noexcept:
    """True if what asyncio's call_soon calls is asyncio's own on loop class ``tp`` (see above)."""
    return _HANDLE_SLOTS \
        and tw_type_get(tp, <PyObject*>_CALL_SOON_INNER_NAME, &_CALL_SOON_INNER_MEMO) == <PyObject*>_BASE_CALL_SOON_INNER \
        and tw_type_get(tp, <PyObject*>_CHECK_CLOSED_NAME, &_CHECK_CLOSED_MEMO) == <PyObject*>_BASE_CHECK_CLOSED \
        and tw_type_get(tp, <PyObject*>_GET_DEBUG_NAME, &_GET_DEBUG_MEMO) == <PyObject*>_BASE_GET_DEBUG \
        and tw_dict_get(<PyObject*>_EVENTS_DICT, <PyObject*>_HANDLE_NAME, &_HANDLE_MEMO) == <PyObject*>_HANDLE \
        and (<PyTypeObject*>_HANDLE).tp_new == _HANDLE_NEW \
        and tw_type_get(<PyTypeObject*>_HANDLE, <PyObject*>_INIT_NAME, &_HANDLE_INIT_MEMO) == <PyObject*>_HANDLE_INIT


cdef object _call_soon(object loop, object callback, tuple args, object context):
    if not _call_soon_is_asyncios(Py_TYPE(loop)) or _own_call_soon_parts(loop) or loop._closed or loop._debug:
        return _BASE_CALL_SOON(loop, callback, *args, context=context)
    if context is None:
        context = PyContext_CopyCurrent()
    handle = (<PyTypeObject*>_HANDLE).tp_new(<type>_HANDLE, <PyObject*>(), NULL)
    cdef char* at = <char*><PyObject*>handle
    PyMember_SetOne(at, _SLOT_CONTEXT, <PyObject*>context)
    PyMember_SetOne(at, _SLOT_LOOP, <PyObject*>loop)
    PyMember_SetOne(at, _SLOT_CALLBACK, <PyObject*>callback)
    PyMember_SetOne(at, _SLOT_ARGS, <PyObject*>args)
    PyMember_SetOne(at, _SLOT_CANCELLED, <PyObject*>_FALSE)
    PyMember_SetOne(at, _SLOT_REPR, <PyObject*>None)
    PyMember_SetOne(at, _SLOT_SOURCE_TRACEBACK, <PyObject*>None)
    loop._ready.append(handle)
    return handle


@cython.binding(True)
def call_soon(loop, callback, *args, context=None):
    """``loop.call_soon``: asyncio's ``BaseEventLoop.call_soon``, which it stands for, its
    ``asyncio.Handle`` made in C while the loop's methods it calls (on its class, none set on the
    loop itself) and asyncio's Handle are asyncio's own and the loop is open and not in debug mode
    (otherwise asyncio's own is called).

    Returns:
        an ``asyncio.Handle``, appended to the ready queue.
    Raises:
        RuntimeError: the loop is closed. TypeError (debug mode): ``callback`` is not callable.
    """
    return _call_soon(loop, callback, args, context)


# The C methods: METH_NOARGS and METH_FASTCALL | METH_KEYWORDS functions over the ones above. A
# call with the leading arguments (two; call_soon's one) given by position and no keyword but ``context`` (every
# call asyncio and its libraries make) is taken here; any other (keywords, too few arguments) is
# handed to the module's function, or call_soon's to asyncio's own, which parses it and raises as it ever did.

cdef str _CONTEXT_NAME = "context"


cdef object _time_method(object loop, PyObject* unused):
    return _time(loop)


cdef inline bint _fast_call(Py_ssize_t nargs, Py_ssize_t leading, PyObject* kwnames) noexcept:
    """True if a C method's call gives its ``leading`` arguments by position and no keyword but ``context``."""
    return nargs >= leading and (kwnames == NULL or tw_only_keyword(kwnames, <PyObject*>_CONTEXT_NAME))


cdef inline tuple _extra_args(PyObject** args, Py_ssize_t nargs, Py_ssize_t leading):
    """The positional arguments of a fast call after its ``leading`` ones."""
    return () if nargs == leading else tw_tuple_of(args + leading, nargs - leading)


cdef inline object _context_of(PyObject** args, Py_ssize_t nargs, PyObject* kwnames):
    """The ``context=`` of a fast call (given after its positional arguments), or None."""
    return None if kwnames == NULL else <object>args[nargs]


cdef object _call_at_method(object loop, PyObject** args, Py_ssize_t nargs, PyObject* kwnames):
    if not _fast_call(nargs, 2, kwnames):
        return tw_call_with_self(<PyObject*>_CALL_AT, <PyObject*>loop, args, nargs, kwnames)
    return _call_at(loop, <object>args[0], <object>args[1], _extra_args(args, nargs, 2), _context_of(args, nargs, kwnames))


cdef object _call_soon_method(object loop, PyObject** args, Py_ssize_t nargs, PyObject* kwnames):
    if not _fast_call(nargs, 1, kwnames):
        return tw_call_with_self(<PyObject*>_BASE_CALL_SOON, <PyObject*>loop, args, nargs, kwnames)
    return _call_soon(loop, <object>args[0], _extra_args(args, nargs, 1), _context_of(args, nargs, kwnames))


cdef object _call_later_method(object loop, PyObject** args, Py_ssize_t nargs, PyObject* kwnames):
    if not _fast_call(nargs, 2, kwnames):
        return tw_call_with_self(<PyObject*>_CALL_LATER, <PyObject*>loop, args, nargs, kwnames)
    return _call_later(loop, <object>args[0], <object>args[1], _extra_args(args, nargs, 2),
                       _context_of(args, nargs, kwnames))


cdef PyMethodDef _TIME_DEF
cdef PyMethodDef _CALL_AT_DEF
cdef PyMethodDef _CALL_LATER_DEF
cdef PyMethodDef _CALL_SOON_DEF


cdef void _define(PyMethodDef* definition, const char* name, PyCFunction method, int flags, const char* doc) noexcept:
    """Fill a C method's definition; its doc opens with the signature line, as a built-in's."""
    definition.ml_name = name
    definition.ml_meth = method
    definition.ml_flags = flags
    definition.ml_doc = doc


_define(&_TIME_DEF, "time", <PyCFunction>_time_method, METH_NOARGS,
        "time($self, /)\n--\n\n"
        "The loop's clock: asyncio's, time.monotonic(), in seconds (see timerwheel_c._loop.time).")
_define(&_CALL_AT_DEF, "call_at", <PyCFunction>_call_at_method, METH_FASTCALL | METH_KEYWORDS,
        "call_at($self, when, callback, *args, context=None)\n--\n\n"
        "Run callback(*args) at loop time when, never before (see timerwheel_c._loop.call_at).")
_define(&_CALL_LATER_DEF, "call_later", <PyCFunction>_call_later_method, METH_FASTCALL | METH_KEYWORDS,
        "call_later($self, delay, callback, *args, context=None)\n--\n\n"
        "Run callback(*args) delay seconds from now, never before (see timerwheel_c._loop.call_later).")
_define(&_CALL_SOON_DEF, "call_soon", <PyCFunction>_call_soon_method, METH_FASTCALL | METH_KEYWORDS,
        "call_soon($self, callback, *args, context=None)\n--\n\n"
        "Run callback(*args) at the next iteration, as asyncio's (see timerwheel_c._loop.call_soon).")


def install_methods(cls):
    """Give ``cls`` (EventLoop) ``time``, ``call_at``, ``call_later`` and ``call_soon`` as C methods of its own:
    this module's functions, called by the interpreter with no function object between (a method
    descriptor, as a built-in class's methods). They accept what the functions accept, raise what
    they raise, and a patch of the class still replaces them. The pure twin's ``install_methods``
    leaves the class's functions as they are (its ``call_soon`` is asyncio's own).

    Raises:
        TypeError: ``cls`` is not a subclass of ``asyncio.BaseEventLoop``.
    """
    if not (isinstance(cls, type) and issubclass(cls, asyncio.BaseEventLoop)):
        raise TypeError(f"install_methods() takes a subclass of asyncio.BaseEventLoop, not {cls!r}")
    cls.time = PyDescr_NewMethod(<PyTypeObject*>cls, &_TIME_DEF)
    cls.call_at = PyDescr_NewMethod(<PyTypeObject*>cls, &_CALL_AT_DEF)
    cls.call_later = PyDescr_NewMethod(<PyTypeObject*>cls, &_CALL_LATER_DEF)
    cls.call_soon = PyDescr_NewMethod(<PyTypeObject*>cls, &_CALL_SOON_DEF)

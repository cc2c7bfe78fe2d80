# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, binding=False
"""asyncio timers on the timing wheel, compiled: ``WheelScheduler``, ``WheelHandle``, ``WheelTimeout``
and ``KeyedTimers``.

``timerwheel_c/pure/aio.py`` is the pure-Python twin, class by class in the same order, and holds
the design of the clock (ms rounding, never early on the loop clock nor in real time) and of the
one loop wake-up. Same API and semantics; what the compiled core does differently is below.
"""
# The wheel is driven through its C methods (src/_wheel.pxd), with no Python call per operation.
#
# A handle's wheel token is its index in the scheduler's ``_handles`` list (src/_aio_tokens.pxi):
# the collector sees the armed handles through it, so a scheduler dropped with handles pending (its
# loop closed) is collected, as the twin is. A re-arm of a pending handle keeps its index: the per-message path
# never touches the list. A batch tells a token's own firing from a stale one by the handle at the
# index and its timer id: no handle (cancelled, or the scheduler closed), or a handle whose id is
# still pending in the wheel (re-armed by an earlier callback of the batch, or a new handle at a
# reused index), is skipped; else the handle is due. Neither class lets the collector clear its
# fields (no_gc_clear), so no method can meet a None wheel or list.
#
# Lazy re-arm: a re-arm to the same or a later deadline (WheelHandle.reschedule, KeyedTimers.arm)
# writes the deadline alone and leaves the wheel entry, due earlier, in place: over many timers
# re-armed at random, the entry is a cache miss the re-arm no longer pays (the handle or key slot
# it must touch anyway is the other). When the entry fires, the batch re-files the timer by its
# deadline if that is still ahead (never early), else runs it; an earlier deadline re-files at
# once (never late). As the batch's order then comes from the old due times, a batch that a late
# loop entered is checked to be in due order and sorted if not (_order_batch).
#
# Keyed timers: each KeyedTimers has its own wheel whose tokens are the keys, and an open
# addressing table key -> (timer id, deadline) of 24 B per slot, linear probing with backward-shift
# deletion (no tombstones), at most 13/16 full: about 60 B per armed key with the wheel entry, no
# Python object per key. The same stale-token rule applies, by the key's timer id. The scheduler
# holds its sets weakly, in creation order, and strongly (in ``_armed_keyed``) only while a set has
# a key armed, as it holds a handle only while armed: a set dropped with no key armed is freed at
# once, and one dropped with keys armed fires them, then is freed.
#
# Reentrancy: any Python code (a callback, a loop method, an allocation that runs the collector)
# may call back into the scheduler. So a fire batch owns its buffer of tokens (the wheel's
# c_advance hands it over; a nested advance fills one of its own), re-reads the key table after
# every callback, and holds no pointer into it across Python code.
cimport cython
from cpython.contextvars cimport PyContext_CopyCurrent, PyContext_Enter, PyContext_Exit
from cpython.exc cimport PyErr_SetObject
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.method cimport PyMethod_Check, PyMethod_GET_FUNCTION
from cpython.object cimport PyObject
from libc.math cimport INFINITY, floor, isfinite, nextafter
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport calloc, free, realloc

from timerwheel_c._wheel cimport TimerWheel, tw_fired_t

import asyncio
import contextvars
from weakref import ref as _weakref

from timerwheel_c._aio_common import (
    HAS_UNCANCEL,
    IN_BATCH as _IN_BATCH,
    KEYED_SWEEP_MIN as _KEYED_SWEEP_MIN,
    NO_WAKE as _NO_WAKE,
    check_callback,
    check_key,
    check_seconds,
    check_slack,
    deadline_error,
    default_clock_slack_s,
)
from timerwheel_c._common import _refuse_copy

__all__ = ["KeyedTimers", "WheelHandle", "WheelScheduler", "WheelTimeout"]

cdef extern from "tw_prefetch.h":
    void tw_prefetch(void* p) noexcept nogil

cdef extern from "Python.h":
    ctypedef struct PyFunctionObject:
        PyObject* func_code
        PyObject* func_dict
    bint PyFunction_Check(object o)
    bint PyCFunction_Check(object o)
    void PyType_Modified(PyTypeObject* t)
    # The one type slot this module fills in itself (_Ready's, in src/_aio_timeout.pxi).
    ctypedef PyObject* (*iternextfunc)(PyObject*) noexcept
    ctypedef struct PyTypeObject:
        iternextfunc tp_iternext
    # Never raises for an int: overflow goes to the flag (as in src/_wheel.pyx).
    long long _long_as_i64_overflow "PyLong_AsLongLongAndOverflow"(object o, int* overflow) noexcept

cdef enum:
    KEYS_MIN_CAP = 16

# The values shared with the pure twin, from the neutral module (see there).
cdef int64_t NO_WAKE = _NO_WAKE
cdef int64_t IN_BATCH = _IN_BATCH
cdef Py_ssize_t KEYED_SWEEP_MIN = _KEYED_SWEEP_MIN

# Task states of WheelTimeout, in the order of asyncio.Timeout's.
cdef enum:
    T_CREATED, T_ENTERED, T_EXPIRING, T_EXPIRED, T_EXITED
_STATE_NAMES = ("created", "entered", "expiring", "expired", "exited")

_CancelledError = asyncio.CancelledError
_current_task = asyncio.current_task


def _current_tasks_dict():
    """asyncio's dict of loop -> running task where ``asyncio.current_task(loop)`` is the Python
    function that just reads it (CPython 3.9-3.11: the call costs a fifth of a ``timeout()``
    block), else None (a C ``current_task``, or another layout: it is called)."""
    tasks = getattr(_current_task, "__globals__", {}).get("_current_tasks")
    code = getattr(_current_task, "__code__", None)
    if type(tasks) is dict and code is not None and "_current_tasks" in code.co_names:
        return tasks
    return None


cdef dict _CURRENT_TASKS = _current_tasks_dict()


include "_aio_clock.pxi"
include "_aio_tokens.pxi"


cdef inline double _as_seconds(object value, str name) except? -1.0:
    """``check_seconds`` with the finite float inlined: the per-message path of every re-arm."""
    cdef double d
    if type(value) is float:
        d = PyFloat_AS_DOUBLE(value)
        if isfinite(d):
            return d
    return _checked_seconds(value, name)


cdef double _checked_seconds(object value, str name) except? -1.0:
    """``check_seconds(value, name)``, out of line: inlined, its Python call made every caller of
    ``_as_seconds`` save and restore registers on the float path too (30 instructions of a
    ``KeyedTimers.arm``'s 560)."""
    return check_seconds(value, name)


cdef int64_t _beyond_range(double when_s) except -1:
    """Raise ``deadline_error(when_s)``, out of line for the same reason, so ``_due_ms`` inlines."""
    raise deadline_error(when_s)


# The code object of the last plain function check_callback accepted: an idle timeout re-arms with
# one bound method over and over, and inspect's check costs more than the rest of call_later.
cdef object _accepted_code = None


cdef inline int _check_callback(object callback, str method) except -1:
    """``check_callback`` (callable, not a coroutine function), skipped for builtins and for a
    function (or method of one) with the code last accepted and no attributes of its own."""
    global _accepted_code
    cdef object func = callback
    if PyCFunction_Check(callback):
        return 0
    if PyMethod_Check(callback):
        func = <object>PyMethod_GET_FUNCTION(callback)
    if PyFunction_Check(func) and (<PyFunctionObject*>func).func_dict == NULL:
        if <object>(<PyFunctionObject*>func).func_code is _accepted_code:
            return 0
        check_callback(callback, method)
        _accepted_code = <object>(<PyFunctionObject*>func).func_code
        return 0
    check_callback(callback, method)
    return 0


cdef inline int _run_in(object context, object callback, tuple args) except -1:
    """``context.run(callback, *args)``; the context is entered in C when it is a Context."""
    if type(context) is not contextvars.Context:
        context.run(callback, *args)
        return 0
    PyContext_Enter(context)
    try:
        callback(*args)
    finally:
        PyContext_Exit(context)
    return 0


@cython.final
@cython.no_gc_clear
@cython.freelist(256)
cdef class WheelHandle:
    """A callback armed on a :class:`WheelScheduler`; mirrors ``asyncio.TimerHandle``.

    Shares ``cancel()``, ``cancelled()`` and ``when()`` with ``asyncio.TimerHandle`` and
    adds ``reschedule(delay)``, the in-place re-arm an idle timeout does on each message.
    Create handles with :meth:`WheelScheduler.call_later` / :meth:`WheelScheduler.call_at`.
    """
    # Fields and C methods: src/_aio.pxd.

    def __init__(self, *args, **kwargs):
        raise TypeError("WheelHandle objects are made by WheelScheduler.call_later() and call_at()")

    def when(self):
        """The deadline in loop-clock seconds (``loop.time()`` units), as asyncio's ``when()``.

        The callback runs at the first wake-up whose loop time is at or after it plus the
        scheduler's ``clock_slack_s``.
        """
        return self._when

    def get_context(self):
        """The context the callback runs in (as ``asyncio.Handle.get_context``, 3.12+)."""
        return self._context

    def cancelled(self):
        """True once :meth:`cancel` was called (or the scheduler closed) before a run."""
        return self._callback is None

    def cancel(self):
        """Cancel the callback; a no-op if it is already cancelled.

        Safe from any callback, including one in the same fire batch: a handle cancelled
        by an earlier callback of the batch does not run. Frees the wheel entry at once.
        """
        if self._callback is not None:
            self._scheduler.c_cancel(self)

    def reschedule(self, delay):
        """Re-arm in place to run ``delay`` seconds from now (``loop.time() + delay``).

        Works whether the handle is pending, is due in the running fire batch (it then
        runs at the new time, not now), or has already run (it runs once more: a
        callback may re-arm itself). Keeps the handle and its callback. A move to the same or
        a later time writes the deadline alone (the wheel entry stays, and is re-filed when it
        comes due), so among callbacks due at its new ms it runs in the order it was re-filed.

        Returns:
            True if armed; False if the handle was cancelled (nothing is armed).
        Raises:
            TypeError: ``delay`` is not a real number. ValueError: it is NaN or infinite.
            RuntimeError: the scheduler is closed.
        """
        if self._callback is None:
            return False
        return self._scheduler.c_reschedule(self, _as_seconds(delay, "delay"))

    def __repr__(self):
        state = "cancelled" if self._callback is None else f"when={self._when:.3f}"
        return f"<WheelHandle {state} {self._callback!r}>"


cdef int _run_handle(WheelHandle handle) except -1:
    """Run a handle's callback in its context; exceptions go to the loop's handler, as asyncio.

    (A function, not a method: a cdef method would cost every handle a vtable pointer.)
    """
    try:
        if handle._context is None:  # a WheelTimeout's expiry: its callback is the timeout
            (<WheelTimeout>handle._callback)._expire()
        else:
            _run_in(handle._context, handle._callback, handle._args)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        handle._scheduler._loop.call_exception_handler({
            "message": f"Exception in callback {handle._callback!r}{handle._args!r}",
            "exception": exc,
            "handle": handle,
        })
    return 0


@cython.final
@cython.no_gc_clear
cdef class WheelScheduler:
    """``call_later``/``call_at``/``timeout``/``keyed`` for an asyncio loop, on a TimerWheel.

    Args:
        loop: the event loop (default: the running loop). Works with the default loop
            and with uvloop.
        wheel_class: the wheel to drive: None or the compiled :class:`timerwheel_c.TimerWheel`,
            whose C methods this scheduler calls (the pure twin
            ``timerwheel_c.pure.aio.WheelScheduler`` drives any wheel).
        clock_slack_s: seconds added to every due time to cover how far ``loop.time()``
            may trail the real time (default: 0.001 or 0.002 on uvloop, whose clock is
            libuv's whole-ms loop time; else 0); at most 1 s (a lag, not a delay).

    Arming: one loop timer (``loop.call_at``) sits at the wheels' earliest
    ``next_fire_ms()``. It is moved only when a new due time is earlier than it, never
    once per timer; when it fires it advances the wheels to the loop time, runs the due
    callbacks in fire order (callbacks due in the same ms in arming order; asyncio's heap
    keeps no order among equal deadlines) and re-arms once.

    Like ``loop.call_later``, it is not thread-safe: use it from the loop's thread.

    Raises:
        RuntimeError: ``loop`` is None and no loop is running.
        TypeError: ``wheel_class`` is another wheel. TypeError / ValueError:
            ``clock_slack_s`` is not a number of seconds in [0, 1].
    """
    # Fields and C methods: src/_aio.pxd.

    def __cinit__(self, *args, **kwargs):
        # Valid from allocation on, even if __init__ never runs: no C call meets a None wheel.
        self._wheel = TimerWheel(0)
        self._handles = [None]
        self._keyed = []
        self._armed_keyed = set()
        self._wake_ms = NO_WAKE

    def __dealloc__(self):
        free(self._free_tokens.free)

    def __init__(self, loop=None, *, wheel_class=None, clock_slack_s=None):
        cdef int64_t now_ms
        if self._loop is not None:
            raise RuntimeError("WheelScheduler.__init__ called on a scheduler already in use")
        if wheel_class is not None and wheel_class is not TimerWheel:
            raise TypeError(
                f"the compiled WheelScheduler drives the compiled TimerWheel, got wheel_class={wheel_class!r}; "
                "timerwheel_c.pure.aio.WheelScheduler drives any wheel"
            )
        self._loop = asyncio.get_running_loop() if loop is None else loop
        self._time = self._loop.time
        # asyncio's own loop.time() is time.monotonic(): read it in C. A loop that overrides
        # time() (uvloop, a test's clock set on the class or the instance) is called, as the pure
        # twin calls the loop.time it bound here.
        self._fast_clock = FAST_CLOCK and PyMethod_Check(self._time) \
            and PyMethod_GET_FUNCTION(self._time) == <PyObject*>_BASE_TIME
        self._slack_s = check_slack(
            default_clock_slack_s(self._loop) if clock_slack_s is None else clock_slack_s)
        now_ms = _floor_ms(self.c_time())
        self._origin_ms = now_ms - 1 if now_ms < 0 else 0  # a wheel's ms are >= 0: a clock below 0 moves them
        self._wheel = TimerWheel(now_ms - self._origin_ms)

    @property
    def clock_slack_s(self):
        """Seconds added to every due time for the loop clock's lag behind real time."""
        return self._slack_s

    def active_count(self):
        """How many handles are armed (neither run, nor cancelled); keyed timers not included.

        (Not ``__len__``: an empty scheduler must not be falsy in ``scheduler or loop``.)
        """
        return self._wheel.c_count()

    def __sizeof__(self):
        """Bytes of the scheduler and its wheel (``TimerWheel.nbytes()``); handles are objects of their own."""
        return object.__sizeof__(self) + self._wheel.nbytes()

    def call_later(self, delay, callback, *args, context=None):
        """Run ``callback(*args)`` ``delay`` seconds from now, like ``loop.call_later``.

        The callback runs on the loop in ``context`` (default: a copy of the current
        context, as asyncio), never before ``loop.time() + delay``. A delay of 0 or
        less runs it on the next tick (1 ms).

        Returns:
            a :class:`WheelHandle`.
        Raises:
            TypeError: ``delay`` is not a real number, or ``callback`` is not a plain
                callable. ValueError: ``delay`` is NaN or infinite, or beyond the wheel's
                range (2**62 ms). RuntimeError: the scheduler is closed.
        """
        cdef double d = _as_seconds(delay, "delay")
        self._check_call(callback)
        return self._call_at(self.c_time() + d, callback, args, context)

    def call_at(self, when, callback, *args, context=None):
        """Run ``callback(*args)`` at loop time ``when`` (seconds), like ``loop.call_at``.

        Raises the same exceptions as :meth:`call_later` (``when`` for ``delay``).
        """
        self._check_call(callback)
        return self._call_at(_as_seconds(when, "when"), callback, args, context)

    def timeout(self, delay):
        """An ``async with`` block cancelled ``delay`` seconds from now, as ``asyncio.timeout``.

        The deadline is ``loop.time() + delay``, taken now, as asyncio takes it; ``None``
        never expires. On expiry the task is cancelled and the block raises ``TimeoutError``
        (the builtin). Move the deadline with :meth:`WheelTimeout.reschedule` (loop time, as
        asyncio's) or :meth:`WheelTimeout.reschedule_after` (a delay).

        Raises:
            TypeError / ValueError: ``delay`` is not a finite real number (or None).
        """
        cdef WheelTimeout t = WheelTimeout.__new__(WheelTimeout)
        t._scheduler = self
        t._when = None if delay is None else self.c_time() + _as_seconds(delay, "delay")
        return t

    def timeout_at(self, when):
        """An ``async with`` block cancelled at loop time ``when`` (seconds), as
        ``asyncio.timeout_at``; ``None`` never expires.

        Raises:
            TypeError / ValueError: ``when`` is not a finite real number (or None).
        """
        cdef WheelTimeout t = WheelTimeout.__new__(WheelTimeout)
        t._scheduler = self
        t._when = None if when is None else _as_seconds(when, "when")
        return t

    def keyed(self, callback, *, context=None):
        """A set of timers named by int keys, each firing ``callback(key)``, with no handle per timer.

        The callback runs on the loop in ``context`` (default: a copy of the current context,
        taken now), with the guarantees of :meth:`call_later`: never early, due order, ties
        in arming order. The scheduler holds the set only while a key is armed: dropped with
        none armed, it is freed; dropped with keys armed, they still fire.

        Raises:
            TypeError: ``callback`` is not a plain callable. RuntimeError: the scheduler is closed.
        """
        cdef KeyedTimers keyed
        if self._closed:
            raise RuntimeError("WheelScheduler is closed")
        check_callback(callback, "keyed")
        keyed = KeyedTimers.__new__(KeyedTimers)
        keyed._scheduler = self
        keyed._callback = callback
        keyed._context = PyContext_CopyCurrent() if context is None else context
        keyed._wheel = TimerWheel(max(_floor_ms(self.c_time()) - self._origin_ms, 0))
        if len(self._keyed) >= self._keyed_sweep_at:
            # The references of the sets freed since are swept (a new list: a batch may be walking
            # this one), so the list stays within twice the live sets.
            self._keyed = [ref for ref in self._keyed if ref() is not None]
            self._keyed_sweep_at = 2 * len(self._keyed) + KEYED_SWEEP_MIN
        self._keyed.append(_weakref(keyed))
        return keyed

    def close(self):
        """Cancel every armed handle and keyed timer and the wake-up; later arming raises RuntimeError.

        Idempotent. Safe from inside a callback: the rest of the batch does not run.
        """
        if self._closed:
            return
        self._closed = True
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        self._drain()
        refs, self._keyed = self._keyed, []
        for ref in refs:
            keyed = ref()
            if keyed is not None:
                (<KeyedTimers>keyed)._clear()
        # Last: a set dropped with keys armed is freed here, which may run Python code.
        self._armed_keyed = set()

    # -- the C-level API (declared in src/_aio.pxd): the Python methods without conversions --

    cdef double c_time(self) except? -1.0:
        """The loop's time in seconds: asyncio's clock read in C while nothing patched
        ``time.monotonic``, else ``loop.time()``."""
        cdef double now_s
        if self._fast_clock and _monotonic_is_real() and tw_monotonic_s(&now_s) == 0:
            return now_s
        return self._time()

    cdef WheelHandle c_call_later(self, double delay_s, object callback, tuple args):
        """``call_later(delay_s, callback, *args)``, in a copy of the current context."""
        if not isfinite(delay_s):
            check_seconds(delay_s)
        self._check_call(callback)
        return self._call_at(self.c_time() + delay_s, callback, args, None)

    cdef bint c_reschedule(self, WheelHandle handle, double delay_s) except -1:
        """``handle.reschedule(delay_s)``: False if it is cancelled.

        Raises:
            ValueError: ``handle`` is another scheduler's, or ``delay_s`` is not finite.
        """
        if handle._callback is None:
            return False
        if handle._scheduler is not self:
            raise ValueError(f"{handle!r} belongs to another WheelScheduler")
        cdef double when_s
        if not isfinite(delay_s):
            check_seconds(delay_s)
        when_s = self.c_time() + delay_s
        # A pending handle (or one due in the running batch) moved to the same or a later deadline
        # keeps its wheel entry, due earlier: only its deadline changes, and the handle is the one
        # object touched. When the entry fires, the batch re-files it by this deadline (_fire).
        if handle._timer_id != 0 and when_s >= handle._when:
            self._due_ms(when_s)  # the range check
            handle._when = when_s
            return True
        self._arm_handle(handle, when_s)
        return True

    cdef int c_cancel(self, WheelHandle handle) except -1:
        """``handle.cancel()``.

        Raises:
            ValueError: ``handle`` is another scheduler's.
        """
        if handle._callback is None:
            return 0
        if handle._scheduler is not self:
            raise ValueError(f"{handle!r} belongs to another WheelScheduler")
        self._disarm(handle)
        handle._callback = None
        handle._args = None
        return 0

    # -- internals: arming a timer and the one loop wake-up ---------------------------

    cdef int _check_call(self, object callback) except -1:
        """RuntimeError if closed; TypeError unless ``callback`` is a plain callable."""
        if self._closed:
            raise RuntimeError("WheelScheduler is closed")
        return _check_callback(callback, "call_at")

    cdef WheelHandle _call_at(self, double when_s, object callback, tuple args, object context):
        """A new handle for ``callback(*args)`` at loop time ``when_s``, armed."""
        cdef WheelHandle handle = WheelHandle.__new__(WheelHandle)
        handle._scheduler = self
        handle._callback = callback
        handle._args = args
        handle._context = PyContext_CopyCurrent() if context is None else context
        self._arm_handle(handle, when_s)
        return handle

    cdef int64_t _due_ms(self, double when_s) except -1:
        """The due ms of a deadline ``when_s`` (loop seconds), never early in float.

        The deadline plus the clock slack, rounded up, and bumped if float rounding left it
        early, so due_ms / 1000 >= due_s holds in float; counted from the wheels' origin (the
        loop's 0 ms, unless its clock went below 0). A deadline before the origin counts as due
        at 0, which arms the wake-up at once (:meth:`_arm_wake`).

        Raises:
            ValueError: the due time is beyond 2**62 ms.
        """
        cdef double due_s = when_s + self._slack_s
        cdef double scaled = due_s * 1000.0
        cdef int64_t due_ms
        if not scaled <= MAX_DUE_MS_F:
            return _beyond_range(when_s)
        if scaled < <double>self._origin_ms:
            return 0
        # ceil(scaled) without libm's call: the cast truncates (floors a positive value, ceils a
        # negative one), exactly for a double within 2**62; every double from 2**53 on is an integer.
        due_ms = <int64_t>scaled
        if due_ms < scaled:
            due_ms += 1
        if due_ms / 1000.0 < due_s:
            due_ms += 1
        due_ms -= self._origin_ms
        if due_ms > MAX_DUE_MS:
            return _beyond_range(when_s)
        return due_ms

    cdef int64_t _follow_clock(self, int64_t loop_ms) except? -1:
        """The wheels' ms of the loop's ms ``loop_ms``. A loop clock gone back before a wheel's time
        (a patched or virtual clock: ``mock.patch``, looptime), or below the wheels' origin, takes the
        wheels back with it: each timer is filed again by its deadline, in its old wheel's fire order
        (equal deadlines keep their order), as ``EventLoop`` does, and as asyncio's heap needs no
        telling. Without it a timer armed after the step fired once the clock came back to the
        wheel's time, late by the whole step."""
        cdef int64_t now_ms, stale_ms
        cdef bint rebase = loop_ms < self._origin_ms
        if rebase:
            self._origin_ms = loop_ms - 1  # the ms before: timers due now fire in this batch
        now_ms = loop_ms - self._origin_ms
        # A wheel at or past stale_ms is refiled: one after now_ms; back at its very ms too if a timer was
        # armed meanwhile (clamped to the ms after, it is owed now).
        stale_ms = now_ms if self._behind else now_ms + 1
        self._behind = False
        if rebase or self._wheel.c_now_ms() >= stale_ms:
            self._refile_handles(now_ms)
        for ref in self._keyed:
            keyed = ref()
            if keyed is not None and (rebase or (<KeyedTimers>keyed)._wheel.c_now_ms() >= stale_ms):
                (<KeyedTimers>keyed)._refile(now_ms)
        return now_ms

    cdef int _refile_handles(self, int64_t now_ms) except -1:
        """File every armed handle again on a new wheel whose time is the ms before ``now_ms``."""
        cdef TimerWheel old = self._wheel
        cdef TimerWheel wheel = TimerWheel(max(now_ms - 1, 0))
        cdef tw_fired_t fired
        cdef object handle
        cdef Py_ssize_t i
        old.c_advance(MAX_DUE_MS, &fired)
        try:
            for i in range(fired.count):
                handle = _token_handle(self._handles, fired.tokens[i])
                if handle is not None and (<WheelHandle>handle)._timer_id:
                    (<WheelHandle>handle)._timer_id = wheel.c_schedule(
                        _refiled_ms(self, (<WheelHandle>handle)._when) - wheel.c_now_ms(), fired.tokens[i])
        finally:
            old.c_release(&fired)
            self._wheel = wheel
        return 0

    cdef int64_t _after_ms(self, TimerWheel wheel, int64_t due_ms) except? -1:
        """``due_ms`` as a delay on ``wheel``'s clock. While a wheel holds nothing its clock is
        caught up to the loop first, so a new timer lands in the slots, not in the overflow."""
        cdef tw_fired_t none
        cdef int64_t now_ms
        if wheel.c_count() == 0:
            now_ms = _floor_ms(self.c_time()) - self._origin_ms
            if now_ms > wheel.c_now_ms():
                wheel.c_advance(now_ms, &none)
                wheel.c_release(&none)
        if due_ms < wheel.c_now_ms():  # the clock went back: filed at the ms after the wheel's, for now
            self._behind = True
        return due_ms - wheel.c_now_ms()

    cdef int _arm_handle(self, WheelHandle handle, double when_s) except -1:
        """Arm ``handle`` at loop time ``when_s``: in place if pending, else as a new wheel entry
        holding a new reference to it."""
        cdef TimerWheel wheel = self._wheel
        cdef int64_t due_ms, after_ms
        if self._closed:
            raise RuntimeError("WheelScheduler is closed")
        due_ms = self._due_ms(when_s)
        # The wake-up first: a loop.call_at that raises (asyncio's debug check of the calling
        # thread) then leaves the handle as it was, armed or not.
        if due_ms < self._wake_ms:
            self._arm_wake(due_ms)
        after_ms = self._after_ms(wheel, due_ms)
        handle._when = when_s
        # A pending handle moves in place. One that ran, or is due in the running batch
        # (its wheel timer already fired), gets a new entry: the batch skips the old one.
        if handle._timer_id == 0 or not wheel.c_reschedule(handle._timer_id, after_ms):
            if handle._token == 0:
                handle._token = _take_token(self._handles, &self._free_tokens, handle)
            handle._timer_id = wheel.c_schedule(after_ms, <uint64_t>handle._token)
        return 0

    cdef int _disarm(self, WheelHandle handle) except -1:
        """Take ``handle`` out of the wheel (if pending there) and out of ``_handles``."""
        cdef uint64_t timer_id = handle._timer_id
        cdef Py_ssize_t token = handle._token
        handle._timer_id = 0
        handle._token = 0
        if timer_id:
            self._wheel.c_cancel(timer_id)
        return _give_token(self._handles, &self._free_tokens, token, handle)

    cdef int _arm_wake(self, int64_t due_ms) except -1:
        """Move the one loop wake-up to ``due_ms``; aimed so the wake-up sees ``due_ms``. A due ms of
        0 (at or before the wheels' origin) wakes at the loop's next turn: the loop's clock may lie
        below the origin (it went back), and the wake-up then follows it (:meth:`_follow_clock`)."""
        cdef int64_t loop_ms = due_ms + self._origin_ms
        cdef double at_s = loop_ms / 1000.0
        if _floor_ms(at_s) < loop_ms:  # float rounding put it a hair early
            at_s = nextafter(at_s, INFINITY)
        # The new wake-up before the old one goes: if loop.call_at raises, the old one and its
        # _wake_ms stand, so no timer is left without a wake-up that _wake_ms claims is armed.
        # Due at 0, at the next turn, not at a time: the clock may go back further before then.
        wake = self._loop.call_soon(self._on_wake) if due_ms == 0 else self._loop.call_at(at_s, self._on_wake)
        if self._wake is not None:
            self._wake.cancel()
        self._wake_ms = due_ms
        self._wake = wake
        return 0

    def _on_wake(self):
        """Advance the wheels to the loop time and run every due callback, then re-arm once."""
        cdef int64_t now_ms
        self._wake = None
        self._wake_ms = IN_BATCH
        try:
            now_ms = self._follow_clock(_floor_ms(self.c_time()))
            self._run_handles(now_ms)
            for ref in self._keyed:
                if self._closed:
                    break
                keyed = ref()
                if keyed is not None:
                    (<KeyedTimers>keyed)._run(now_ms)
        finally:
            self._end_batch()

    cdef int _run_handles(self, int64_t now_ms) except -1:
        """Advance the handles' wheel to ``now_ms`` and run the due handles in fire order."""
        cdef TimerWheel wheel = self._wheel
        cdef tw_fired_t fired
        cdef Py_ssize_t i = 0
        if now_ms <= wheel.c_now_ms():
            return 0
        wheel.c_advance(now_ms, &fired)
        try:
            _order_batch(self, _handle_due, &fired)
            while i < fired.count:
                i += 1
                self._fire(fired.tokens[i - 1], now_ms)
        finally:
            self._requeue(&fired, i)
            wheel.c_release(&fired)
        return 0

    cdef int _fire(self, uint64_t token, int64_t now_ms) except -1:
        """Run the handle a fired ``token`` names, if it is due at ``now_ms``; re-file it by its
        deadline if that moved later while its entry waited."""
        cdef WheelHandle handle = <WheelHandle>_token_handle(self._handles, token)
        cdef int64_t due_ms
        # None: cancelled by an earlier callback of this batch, or closed; pending: re-armed by
        # one, or a new handle at a reused index.
        if handle is None or handle._timer_id == 0 or self._wheel.c_due_ms(handle._timer_id) >= 0:
            return 0
        due_ms = self._due_ms(handle._when)
        if due_ms > now_ms:
            handle._timer_id = self._wheel.c_schedule(due_ms - self._wheel.c_now_ms(), token)
            return 0
        handle._timer_id = 0
        _give_token(self._handles, &self._free_tokens, <Py_ssize_t>token, handle)
        handle._token = 0
        return _run_handle(handle)

    cdef int _requeue(self, tw_fired_t* fired, Py_ssize_t start) except -1:
        """Keep the handles a SystemExit/KeyboardInterrupt skipped (tokens from ``start`` on): each
        goes back at its due time, the next tick at the earliest, in order, and none is lost."""
        cdef Py_ssize_t i
        cdef uint64_t token
        cdef WheelHandle handle
        for i in range(start, fired.count):
            token = fired.tokens[i]
            handle = <WheelHandle>_token_handle(self._handles, token)
            if (not self._closed and handle is not None and handle._timer_id
                    and self._wheel.c_due_ms(handle._timer_id) < 0):
                # It keeps its index; a delay under 1 ms counts as 1.
                handle._timer_id = self._wheel.c_schedule(
                    self._due_ms(handle._when) - self._wheel.c_now_ms(), token)
        return 0

    cdef int _end_batch(self) except -1:
        """Re-arm the wake-up once, at the earliest due time of any wheel."""
        cdef int64_t wake_ms
        self._wake_ms = NO_WAKE
        if self._closed:
            return 0
        # next_fire_ms() may be a lower bound; a wake-up that finds nothing re-arms.
        wake_ms = _next_wake(self._wheel, NO_WAKE)
        for ref in self._keyed:
            keyed = ref()
            if keyed is not None:
                wake_ms = _next_wake((<KeyedTimers>keyed)._wheel, wake_ms)
        if wake_ms != NO_WAKE:
            self._arm_wake(wake_ms)
        return 0

    cdef int _drain(self) except -1:
        """Cancel every armed handle (and any due in the running batch): empty the wheel, then
        ``_handles``, detached first, as clearing a callback may run Python code."""
        cdef WheelHandle handle
        for handle in _drop_tokens(self._wheel, self._handles, &self._free_tokens):
            handle._timer_id = 0
            handle._token = 0
            handle._callback = None
            handle._args = None
        return 0

    def __reduce_ex__(self, protocol):
        _refuse_copy(self)  # the pure twin's TypeError, word for word


# The due ms of a fired token's timer, or ``last`` if the token names none any more.
ctypedef int64_t (*token_due_t)(object owner, uint64_t token, int64_t last) except? -2


cdef int _order_batch(object owner, token_due_t due_of, tw_fired_t* fired) except -1:
    """Put a batch of ``owner``'s tokens in due order (stable). A timer re-armed later in place
    fires from its earlier wheel entry, and is re-filed then; but when the loop woke after its new
    due time as well, it is due, and belongs among the timers of that due time."""
    cdef Py_ssize_t i
    cdef int64_t due, last = 0
    cdef list dues, tokens
    for i in range(fired.count):
        due = due_of(owner, fired.tokens[i], last)
        if due < last:
            break
        last = due
    else:
        return 0
    dues = []
    last = 0
    for i in range(fired.count):
        last = due_of(owner, fired.tokens[i], last)
        dues.append((last, i))
    tokens = [fired.tokens[i] for _, i in sorted(dues)]
    for i in range(fired.count):
        fired.tokens[i] = tokens[i]
    return 0


cdef int64_t _handle_due(object scheduler, uint64_t token, int64_t last) except? -2:
    """``token_due_t`` of a WheelScheduler's handles: the deadline's due ms."""
    cdef object handle = _token_handle((<WheelScheduler>scheduler)._handles, token)
    if handle is None:
        return last
    return (<WheelScheduler>scheduler)._due_ms((<WheelHandle>handle)._when)


cdef int64_t _refiled_ms(WheelScheduler scheduler, double when_s) except? -1:
    """The due ms a timer is filed again at when the wheels follow the clock: its deadline's, or the
    wheels' last ms for one the new origin puts past their range (a deadline within the origin's
    distance of 2**62 ms, some 146 million years: no loop's clock reaches either)."""
    try:
        return scheduler._due_ms(when_s)
    except ValueError:
        return MAX_DUE_MS


cdef inline int64_t _next_wake(TimerWheel wheel, int64_t wake_ms) noexcept:
    """The earlier of ``wake_ms`` and the wake-up ``wheel`` needs, if it holds timers."""
    cdef int64_t at_ms
    if wheel.c_count() == 0:
        return wake_ms
    at_ms = wheel.c_next_fire_ms()
    if at_ms <= wheel.c_now_ms():
        at_ms = wheel.c_now_ms() + 1
    return at_ms if at_ms < wake_ms else wake_ms


include "_aio_timeout.pxi"
include "_aio_keyed.pxi"

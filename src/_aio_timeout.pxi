# WheelTimeout, the ``async with`` block of WheelScheduler.timeout(); included by src/_aio.pyx.
#
# Its __aenter__/__aexit__ return an already-completed awaitable (_Ready) instead of a coroutine,
# and its expiry is a handle with no context whose callback is the timeout itself.


@cython.final
@cython.freelist(8)
cdef class _Ready:
    """An awaitable already done with a value: what ``WheelTimeout.__aenter__``/``__aexit__``
    return, so an ``async with`` block makes no coroutine. Its ``__next__`` ends the iteration
    with the value at once (as a StopIteration the interpreter unpacks without raising). It is
    its own iterator, ``__iter__`` included, because ``yield from`` asks for one: asyncio's
    ``ensure_future`` (so ``gather`` and ``wait_for``) wraps an awaitable that way up to 3.11."""
    cdef object _value

    def __await__(self):
        return self

    def __iter__(self):
        return self

    def __next__(self):
        raise StopIteration(self._value)


cdef PyObject* _ready_next(PyObject* o) noexcept:
    """``_Ready.__next__`` in C: StopIteration(value) set unnormalized, or no exception for None."""
    cdef object value = (<_Ready>o)._value
    if value is not None:
        PyErr_SetObject(StopIteration, value)
    return NULL


(<PyTypeObject*>_Ready).tp_iternext = _ready_next
PyType_Modified(<PyTypeObject*>_Ready)
cdef _Ready _READY_NONE = _Ready.__new__(_Ready)


@cython.final
@cython.no_gc_clear
cdef class WheelTimeout:
    """The ``async with`` block of :meth:`WheelScheduler.timeout` and
    :meth:`WheelScheduler.timeout_at`; mirrors ``asyncio.Timeout``.

    On expiry it cancels the current task; on exit it turns that cancellation into the
    builtin ``TimeoutError``. Where ``Task.uncancel`` exists (Python 3.11+) a cancel
    from elsewhere that arrives meanwhile still propagates as ``CancelledError``, as in
    ``asyncio.timeout``; on 3.9/3.10 the two cannot be told apart.

    As asyncio's, :meth:`when` and :meth:`reschedule` speak absolute loop time; the
    per-message re-arm of an idle timeout is :meth:`reschedule_after` (a delay).

    Args:
        scheduler: the :class:`WheelScheduler` whose wheel holds the expiry.
        when: the deadline in loop seconds (``loop.time()`` units), or None: never expires.
    """
    # Fields and C methods: src/_aio.pxd.

    def __init__(self, WheelScheduler scheduler not None, when):
        self._scheduler = scheduler
        self._when = None if when is None else _as_seconds(when, "when")
        self._handle = None
        self._task = None
        self._cancelling = 0
        self._state = T_CREATED

    def when(self):
        """The deadline in loop-clock seconds, or None if it never expires (as asyncio's)."""
        return self._when

    def expired(self):
        """True once the deadline passed and the task was cancelled."""
        return self._state == T_EXPIRING or self._state == T_EXPIRED

    def reschedule(self, when):
        """Move the deadline to loop time ``when`` (seconds), as ``asyncio.Timeout.reschedule``;
        ``None`` disarms it. A deadline already passed expires on the next tick (1 ms).

        Unlike asyncio's (3.12+), it may also be called before the block is entered: it then
        replaces the initial deadline.

        Raises:
            RuntimeError: the timeout already expired or the block exited.
            TypeError / ValueError: ``when`` is not a finite real number (or None).
        """
        self._reschedule(None if when is None else _as_seconds(when, "when"))

    @cython.nonecheck(True)  # a WheelTimeout made with __new__ has no scheduler: AttributeError, never a crash
    def reschedule_after(self, delay):
        """Move the deadline to ``delay`` seconds from now (``loop.time() + delay``); ``None``
        disarms it. The per-message re-arm of an idle timeout; asyncio has no such method.

        Raises:
            as :meth:`reschedule` (``delay`` for ``when``).
        """
        cdef double d
        if delay is None:
            self._reschedule(None)
        else:
            d = _as_seconds(delay, "delay")
            if self._handle is not None and self._handle._timer_id:
                self._scheduler._wheel.c_prefetch(self._handle._timer_id)
            self._reschedule(self._scheduler.c_time() + d)

    cdef int _reschedule(self, object when) except -1:
        """``reschedule(when)`` for a checked ``when`` (a float or None)."""
        if self._state != T_CREATED and self._state != T_ENTERED:
            raise RuntimeError(f"cannot reschedule a {_STATE_NAMES[self._state]} timeout")
        if self._state == T_ENTERED:  # armed first: a deadline refused leaves when() as it was
            if when is None:
                self._disarm()
            elif self._handle is not None:
                self._scheduler._arm_handle(self._handle, <double>when)
            else:
                self._arm(<double>when)
        self._when = when
        return 0

    cdef int _arm(self, double when_s) except -1:
        """Arm the expiry at loop time ``when_s``, as a handle that runs in no context."""
        cdef WheelScheduler scheduler = self._scheduler
        cdef WheelHandle handle
        if scheduler is None:
            raise RuntimeError("this WheelTimeout was not made by WheelScheduler.timeout()")
        if scheduler._closed:
            raise RuntimeError("WheelScheduler is closed")
        handle = WheelHandle.__new__(WheelHandle)
        handle._scheduler = scheduler
        handle._callback = self  # with no context: _run_handle calls _expire()
        handle._args = ()
        scheduler._arm_handle(handle, when_s)
        self._handle = handle
        return 0

    def __aenter__(self):
        cdef _Ready ready
        if self._state != T_CREATED:
            raise RuntimeError("timeout has already been entered")
        # The scheduler's loop, named: current_task() would look the running loop up first.
        if self._scheduler is None:
            task = None
        elif _CURRENT_TASKS is not None:
            task = _CURRENT_TASKS.get(self._scheduler._loop)
        else:
            task = _current_task(self._scheduler._loop)
        if task is None:
            raise RuntimeError("timeout() must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling() if HAS_UNCANCEL else 0
        self._state = T_ENTERED
        if self._when is not None:
            self._arm(<double>self._when)
        ready = _Ready.__new__(_Ready)
        ready._value = self
        return ready

    def __aexit__(self, exc_type, exc, tb):
        self._disarm()
        if self._state == T_EXPIRING:
            self._state = T_EXPIRED
            outside_cancels = self._task.uncancel() > self._cancelling if HAS_UNCANCEL else False
            if exc_type is _CancelledError and not outside_cancels:
                raise TimeoutError from exc
        else:
            self._state = T_EXITED
        return _READY_NONE

    cdef int _expire(self) except -1:
        """The deadline passed: cancel the task (the block's exit turns it into TimeoutError)."""
        self._task.cancel()
        self._state = T_EXPIRING
        self._handle = None
        return 0

    cdef int _disarm(self) except -1:
        """Cancel the expiry handle, if any."""
        cdef WheelHandle handle = self._handle
        if handle is not None:
            self._handle = None
            handle._scheduler.c_cancel(handle)
        return 0

    def __repr__(self):
        return f"<WheelTimeout [{_STATE_NAMES[self._state]}] when={self.when()}>"

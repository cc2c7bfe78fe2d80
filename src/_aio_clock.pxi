# The loop clock as both asyncio cores read it (src/_aio.pyx, src/_loop.pyx include this): asyncio's
# loop.time() read in C when the loop is asyncio's own, the C read is checked to be its clock and
# nothing patched time.monotonic,
# and a loop time's whole ms, float-exact (the twins: timerwheel_c._aio_common.floor_ms).

cdef extern from "aio_clock.h":
    int tw_monotonic_s(double* out) noexcept nogil

cdef extern from "tw_dict.h":
    ctypedef struct tw_dict_memo:
        uint64_t version
        PyObject* value
    # Borrowed arguments: an ``object`` argument would cost a module global's read an incref and a
    # decref around the call (Cython guards it against rebinding), on every clock read.
    uint64_t tw_dict_version(PyObject* d) noexcept
    PyObject* tw_dict_get(PyObject* d, PyObject* key, tw_dict_memo* memo) noexcept

import time as _time_module

from timerwheel_c._aio_common import MAX_DUE_MS as _MAX_DUE_MS

cdef int64_t MAX_DUE_MS = _MAX_DUE_MS
cdef double MAX_DUE_MS_F = <double>MAX_DUE_MS
cdef object _BASE_TIME = asyncio.BaseEventLoop.time


cdef bint _clock_matches():
    """True if tw_monotonic_s reads time.monotonic()'s clock here (checked, not assumed)."""
    import time
    cdef double c
    before = time.monotonic()
    if tw_monotonic_s(&c) != 0:
        return False
    return before <= c <= time.monotonic()


cdef bint FAST_CLOCK = _clock_matches()

# time.monotonic as imported: asyncio's BaseEventLoop.time() calls whatever the time module holds
# at the call, found through asyncio.base_events' global ``time``, so mock.patch("time.monotonic")
# and mock.patch("asyncio.base_events.time") move its timers; the C read stands in only for it.
cdef dict _TIME_DICT = _time_module.__dict__
cdef object _MONOTONIC = _time_module.monotonic
cdef str _MONOTONIC_NAME = "monotonic"
cdef tw_dict_memo _MONOTONIC_MEMO
cdef object _TIME_MODULE = _time_module
cdef dict _BASE_EVENTS_DICT = asyncio.base_events.__dict__
cdef str _TIME_MODULE_NAME = "time"
cdef tw_dict_memo _TIME_MODULE_MEMO


cdef inline bint _monotonic_is_real() noexcept:
    """True unless someone replaced ``time.monotonic`` or asyncio's ``base_events.time`` (a test's patch)."""
    return FAST_CLOCK \
        and tw_dict_get(<PyObject*>_TIME_DICT, <PyObject*>_MONOTONIC_NAME, &_MONOTONIC_MEMO) == <PyObject*>_MONOTONIC \
        and tw_dict_get(<PyObject*>_BASE_EVENTS_DICT, <PyObject*>_TIME_MODULE_NAME, &_TIME_MODULE_MEMO) \
        == <PyObject*>_TIME_MODULE


cdef inline object _asyncio_monotonic():
    """asyncio's clock as its ``BaseEventLoop.time`` reads it, patched or not."""
    return _BASE_EVENTS_DICT[_TIME_MODULE_NAME].monotonic()


cdef inline int64_t _floor_ms(double now_s) noexcept:
    """Largest integer ms ``n`` with ``n / 1000 <= now_s`` (float-exact, not assumed); a clock
    outside +-2**62 ms (no real loop's) is clamped, so the wheel refuses it by name. NaN and -inf
    count as past the top, so that the wake-up that read them fails: at the bottom they moved the
    wheels' origin there, for good (the pure twin's ``math.floor`` raises, and the next reading of a
    sane clock works on both)."""
    cdef int64_t now_ms
    if not -MAX_DUE_MS_F < now_s * 1000.0 < MAX_DUE_MS_F:
        return -MAX_DUE_MS if isfinite(now_s) and now_s < 0 else MAX_DUE_MS + 1
    now_ms = <int64_t>floor(now_s * 1000.0)
    if now_ms / 1000.0 > now_s:
        now_ms -= 1
    elif (now_ms + 1) / 1000.0 <= now_s:
        now_ms += 1
    return now_ms

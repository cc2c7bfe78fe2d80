# The loop clock as both asyncio cores read it (src/_aio.pyx, src/_loop.pyx include this): asyncio's
# loop.time() read in C when the loop is asyncio's own and the C read is checked to be its clock,
# and a loop time's whole ms, float-exact (the twins: timerwheel_c._aio_common.floor_ms).

cdef extern from "aio_clock.h":
    int tw_monotonic_s(double* out) noexcept nogil

from timerwheel_c._aio_common import MAX_DUE_MS as _MAX_DUE_MS

cdef int64_t MAX_DUE_MS = _MAX_DUE_MS
cdef double MAX_DUE_MS_F = <double>MAX_DUE_MS
_BASE_TIME = asyncio.BaseEventLoop.time


cdef bint _clock_matches():
    """True if tw_monotonic_s reads time.monotonic()'s clock here (checked, not assumed)."""
    import time
    cdef double c
    before = time.monotonic()
    if tw_monotonic_s(&c) != 0:
        return False
    return before <= c <= time.monotonic()


cdef bint FAST_CLOCK = _clock_matches()


cdef inline int64_t _floor_ms(double now_s) noexcept:
    """Largest integer ms ``n`` with ``n / 1000 <= now_s`` (float-exact, not assumed); a clock
    outside +-2**62 ms (no real loop's) is clamped, so the wheel refuses it by name."""
    cdef int64_t now_ms
    if not -MAX_DUE_MS_F < now_s * 1000.0 < MAX_DUE_MS_F:
        return MAX_DUE_MS + 1 if now_s > 0 else -MAX_DUE_MS
    now_ms = <int64_t>floor(now_s * 1000.0)
    if now_ms / 1000.0 > now_s:
        now_ms -= 1
    elif (now_ms + 1) / 1000.0 <= now_s:
        now_ms += 1
    return now_ms

# cython: language_level=3
"""The floor for the wheel's per-operation cost: a compiled class whose methods do nothing.

Issue 2 asks the C wheel's churn operation to cost within 1.5x of calling an empty
Cython method with the same arguments. ``EmptyWheel`` is that method: it has the
signatures of ``timerwheel_c._wheel.TimerWheel`` (argument names, types and
conversions), so the bench can time the call overhead alone with the same loop.
"""

cdef extern from *:
    # Defined by every Cython-generated C file: the Cython version that built it.
    int CYTHON_HEX_VERSION


def cython_version():
    """Return the Cython version that compiled this extension, e.g. ``"3.1.2"``."""
    cdef int v = CYTHON_HEX_VERSION
    return f"{(v >> 24) & 0xFF}.{(v >> 16) & 0xFF}.{(v >> 8) & 0xFF}"


cdef class EmptyWheel:
    """Empty twins of TimerWheel's schedule, cancel, reschedule and advance.

    The return values are constants of the real methods' types (id 1, False, the
    list passed in), so loops written for the wheel run unchanged on it.
    """

    def __init__(self, now_ms=0):
        pass

    def schedule(self, after_ms, token):
        return 1

    def cancel(self, timer_id):
        return False

    def reschedule(self, timer_id, after_ms):
        return False

    def advance(self, now_ms, list fired=None):
        return fired

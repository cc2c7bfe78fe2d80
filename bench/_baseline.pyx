# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, binding=False
"""The floor for the wheel's per-operation cost: a compiled class whose methods do nothing.

The target: the C wheel's churn operation costs at most 1.5x a call of an empty
Cython method with the same arguments. ``EmptyWheel`` is that method: it is compiled
with the wheel's directives (``binding=False``, ``@cython.final``) and has the
signatures of ``timerwheel_c._wheel.TimerWheel`` (argument names, untyped arguments,
``list fired``), so the bench can time the call overhead alone with the same loop.
"""
cimport cython
from libc.stdint cimport uint64_t


@cython.final
cdef class EmptyWheel:
    """Empty twins of TimerWheel's schedule, cancel, reschedule and advance.

    ``schedule`` returns a fresh id-sized int, ``(1 << 32) | n`` for a counter n (n < 2**32 in
    any bench run), because the real one must build a new Python int per call: the floor pays for
    that allocation too. The other return values are constants of the real methods' types (False,
    the list passed in), so loops written for the wheel run unchanged on it.
    """
    cdef uint64_t _issued

    # Every argument has a default, as in TimerWheel (whose placeholder default makes a missing
    # argument report the same in both twins), so both parse their arguments the same way.
    def __init__(self, now_ms=None):
        pass

    def schedule(self, after_ms=None, token=None):
        self._issued += 1
        return ((<uint64_t>1) << 32) | self._issued

    def cancel(self, timer_id=None):
        return False

    def reschedule(self, timer_id=None, after_ms=None):
        return False

    def advance(self, now_ms=None, list fired=None):
        return fired

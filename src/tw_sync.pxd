# Cython declarations of tw_sync.h: portable lock, condvar, thread, clock, sleep and wake fd.
from libc.stdint cimport int64_t


cdef extern from "tw_sync.h" nogil:
    ctypedef struct tw_mutex_t:
        pass
    ctypedef struct tw_cond_t:
        pass
    ctypedef struct tw_thread_t:
        pass
    int tw_mutex_init(tw_mutex_t *m)
    void tw_mutex_destroy(tw_mutex_t *m)
    void tw_mutex_lock(tw_mutex_t *m)
    void tw_mutex_unlock(tw_mutex_t *m)
    int tw_cond_init(tw_cond_t *c)
    void tw_cond_destroy(tw_cond_t *c)
    void tw_cond_signal(tw_cond_t *c)
    void tw_cond_broadcast(tw_cond_t *c)
    void tw_cond_wait(tw_cond_t *c, tw_mutex_t *m)
    void tw_cond_timedwait_until(tw_cond_t *c, tw_mutex_t *m, int64_t deadline_ns)
    int64_t tw_monotonic_ns()
    void tw_sleep_until_ns(int64_t deadline_ns)
    int tw_thread_start(tw_thread_t *t, void (*fn)(void *) noexcept nogil, void *arg)
    void tw_thread_precise_timers()
    void tw_thread_join(tw_thread_t *t)
    void tw_thread_detach(tw_thread_t *t)
    int tw_thread_is_current(tw_thread_t *t)
    int tw_wakefd_open(int *rfd, int *wfd)
    void tw_wakefd_signal(int wfd)
    void tw_wakefd_drain(int rfd)
    void tw_wakefd_close(int rfd, int wfd)

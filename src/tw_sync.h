/* Portable lock, condition variable, thread, clock, sleep and wake-fd primitives
 * for the release timer (src/_release.pyx).
 *
 * POSIX: pthreads; condition variables wait on CLOCK_MONOTONIC (pthread_condattr_setclock)
 * except on macOS, which waits relative instead. Windows: SRWLOCK, CONDITION_VARIABLE,
 * _beginthreadex, QueryPerformanceCounter and a high-resolution waitable timer.
 *
 * All times are int64 nanoseconds on the clock Python's time.monotonic_ns() reads.
 * None of these functions touch Python: they are safe without the GIL.
 */
#ifndef TW_SYNC_H
#define TW_SYNC_H

#include <stdint.h>

#ifdef _WIN32
/* ------------------------------------------------------------------ Windows */
#include <windows.h>
#include <process.h>

typedef SRWLOCK tw_mutex_t;
typedef CONDITION_VARIABLE tw_cond_t;
/* The thread record lives as long as the thread: it carries the entry point (no malloc). */
typedef struct { HANDLE handle; DWORD id; void (*fn)(void *); void *arg; } tw_thread_t;

static int tw_mutex_init(tw_mutex_t *m) { InitializeSRWLock(m); return 0; }
static void tw_mutex_destroy(tw_mutex_t *m) { (void)m; }
static void tw_mutex_lock(tw_mutex_t *m) { AcquireSRWLockExclusive(m); }
static void tw_mutex_unlock(tw_mutex_t *m) { ReleaseSRWLockExclusive(m); }

static int tw_cond_init(tw_cond_t *c) { InitializeConditionVariable(c); return 0; }
static void tw_cond_destroy(tw_cond_t *c) { (void)c; }
static void tw_cond_signal(tw_cond_t *c) { WakeConditionVariable(c); }
static void tw_cond_broadcast(tw_cond_t *c) { WakeAllConditionVariable(c); }
static void tw_cond_wait(tw_cond_t *c, tw_mutex_t *m) { SleepConditionVariableSRW(c, m, INFINITE, 0); }

static int64_t tw_monotonic_ns(void)
{
    static LARGE_INTEGER freq;
    LARGE_INTEGER now;
    if (freq.QuadPart == 0) QueryPerformanceFrequency(&freq);
    QueryPerformanceCounter(&now);
    /* split to avoid overflowing ticks * 1e9 */
    return (int64_t)(now.QuadPart / freq.QuadPart) * 1000000000LL
         + (int64_t)(now.QuadPart % freq.QuadPart) * 1000000000LL / freq.QuadPart;
}

/* Waits until deadline_ns at the latest (spurious and early returns are the caller's to loop on). */
static void tw_cond_timedwait_until(tw_cond_t *c, tw_mutex_t *m, int64_t deadline_ns)
{
    int64_t remaining = deadline_ns - tw_monotonic_ns();
    DWORD ms;
    if (remaining <= 0) return;
    ms = (DWORD)((remaining + 999999) / 1000000);
    SleepConditionVariableSRW(c, m, ms, 0);
}

#ifndef CREATE_WAITABLE_TIMER_HIGH_RESOLUTION
#define CREATE_WAITABLE_TIMER_HIGH_RESOLUTION 0x00000002
#endif

static void tw_sleep_until_ns(int64_t deadline_ns)
{
    int64_t remaining = deadline_ns - tw_monotonic_ns();
    HANDLE timer;
    LARGE_INTEGER due;
    if (remaining <= 0) return;
    timer = CreateWaitableTimerExW(NULL, NULL, CREATE_WAITABLE_TIMER_HIGH_RESOLUTION, TIMER_ALL_ACCESS);
    if (timer == NULL) { Sleep((DWORD)((remaining + 999999) / 1000000)); return; }
    due.QuadPart = -(remaining + 99) / 100; /* relative, in 100 ns units */
    if (SetWaitableTimer(timer, &due, 0, NULL, NULL, FALSE)) WaitForSingleObject(timer, INFINITE);
    CloseHandle(timer);
}

static unsigned __stdcall tw__trampoline(void *p)
{
    tw_thread_t *t = (tw_thread_t *)p;
    t->fn(t->arg);
    return 0;
}

static int tw_thread_start(tw_thread_t *t, void (*fn)(void *), void *arg)
{
    unsigned id;
    t->fn = fn; t->arg = arg;
    t->handle = (HANDLE)_beginthreadex(NULL, 0, tw__trampoline, t, 0, &id);
    if (t->handle == 0) return -1;
    t->id = id;
    return 0;
}
/* The high-resolution waitable timer above already ends sleeps on time. */
static void tw_thread_precise_timers(void) { }
static void tw_thread_join(tw_thread_t *t) { WaitForSingleObject(t->handle, INFINITE); CloseHandle(t->handle); }
static void tw_thread_detach(tw_thread_t *t) { CloseHandle(t->handle); }
static int tw_thread_is_current(tw_thread_t *t) { return GetCurrentThreadId() == t->id; }

/* No wake fd on Windows: loops there are woken from a helper thread (see the .pyx). */
static int tw_wakefd_open(int *rfd, int *wfd) { *rfd = *wfd = -1; return -1; }
static void tw_wakefd_signal(int wfd) { (void)wfd; }
static void tw_wakefd_drain(int rfd) { (void)rfd; }
static void tw_wakefd_close(int rfd, int wfd) { (void)rfd; (void)wfd; }

#else
/* -------------------------------------------------------------------- POSIX */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#endif

typedef pthread_mutex_t tw_mutex_t;
typedef pthread_cond_t tw_cond_t;
/* The thread record lives as long as the thread: it carries the entry point (no malloc). */
typedef struct { pthread_t id; void (*fn)(void *); void *arg; } tw_thread_t;

static int tw_mutex_init(tw_mutex_t *m) { return pthread_mutex_init(m, NULL); }
static void tw_mutex_destroy(tw_mutex_t *m) { pthread_mutex_destroy(m); }
static void tw_mutex_lock(tw_mutex_t *m) { pthread_mutex_lock(m); }
static void tw_mutex_unlock(tw_mutex_t *m) { pthread_mutex_unlock(m); }

#if defined(__APPLE__)
/* time.monotonic_ns() on macOS reads mach_absolute_time, i.e. CLOCK_UPTIME_RAW. */
#define TW_CLOCK CLOCK_UPTIME_RAW
#else
#define TW_CLOCK CLOCK_MONOTONIC
#endif

static int64_t tw_monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(TW_CLOCK, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int tw_cond_init(tw_cond_t *c)
{
#if defined(__APPLE__)
    return pthread_cond_init(c, NULL);
#else
    pthread_condattr_t attr;
    int rc = pthread_condattr_init(&attr);
    if (rc) return rc;
    rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0) rc = pthread_cond_init(c, &attr);
    pthread_condattr_destroy(&attr);
    return rc;
#endif
}
static void tw_cond_destroy(tw_cond_t *c) { pthread_cond_destroy(c); }
static void tw_cond_signal(tw_cond_t *c) { pthread_cond_signal(c); }
static void tw_cond_broadcast(tw_cond_t *c) { pthread_cond_broadcast(c); }
static void tw_cond_wait(tw_cond_t *c, tw_mutex_t *m) { pthread_cond_wait(c, m); }

/* Waits until deadline_ns at the latest (spurious and early returns are the caller's to loop on). */
static void tw_cond_timedwait_until(tw_cond_t *c, tw_mutex_t *m, int64_t deadline_ns)
{
    struct timespec ts;
#if defined(__APPLE__)
    int64_t remaining = deadline_ns - tw_monotonic_ns();
    if (remaining <= 0) return;
    ts.tv_sec = (time_t)(remaining / 1000000000LL);
    ts.tv_nsec = (long)(remaining % 1000000000LL);
    pthread_cond_timedwait_relative_np(c, m, &ts);
#else
    ts.tv_sec = (time_t)(deadline_ns / 1000000000LL);
    ts.tv_nsec = (long)(deadline_ns % 1000000000LL);
    pthread_cond_timedwait(c, m, &ts);
#endif
}

/* Sleeps until deadline_ns: the last, exact sleep of a release (absolute, so no drift on EINTR). */
static void tw_sleep_until_ns(int64_t deadline_ns)
{
#if defined(__APPLE__)
    int64_t remaining;
    struct timespec ts;
    while ((remaining = deadline_ns - tw_monotonic_ns()) > 0) {
        ts.tv_sec = (time_t)(remaining / 1000000000LL);
        ts.tv_nsec = (long)(remaining % 1000000000LL);
        nanosleep(&ts, NULL);
    }
#else
    struct timespec ts;
    ts.tv_sec = (time_t)(deadline_ns / 1000000000LL);
    ts.tv_nsec = (long)(deadline_ns % 1000000000LL);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
#endif
}

static void *tw__trampoline(void *p)
{
    tw_thread_t *t = (tw_thread_t *)p;
    t->fn(t->arg);
    return NULL;
}

/* The thread starts with every signal blocked, so signals meant for Python land on its
 * main thread and never interrupt the release thread's sleeps. */
static int tw_thread_start(tw_thread_t *t, void (*fn)(void *), void *arg)
{
    sigset_t all, old;
    int rc;
    t->fn = fn; t->arg = arg;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&t->id, NULL, tw__trampoline, t);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc == 0 ? 0 : -1;
}
#ifdef __linux__
/* struct sched_attr up to sched_period (SCHED_ATTR_SIZE_VER0); glibc does not declare it. */
struct tw__sched_attr {
    uint32_t size, sched_policy;
    uint64_t sched_flags;
    int32_t sched_nice;
    uint32_t sched_priority;
    uint64_t sched_runtime, sched_deadline, sched_period;
};
#endif

/* Called on the release thread, for wakeups on time:
 * - a 1 ns timer slack, so its sleeps end at the deadline, not up to the default 50 us
 *   later (Linux coalesces timers within a thread's slack);
 * - on Linux >= 6.12 (EEVDF), a 100 us custom slice (sched_attr.sched_runtime for
 *   SCHED_OTHER), so on waking it preempts a CPU-bound thread instead of waiting out
 *   that thread's default slice (~3 ms), which is what made a spinning Python thread
 *   show up in the release lateness. Older kernels ignore or refuse it: harmless. */
static void tw_thread_precise_timers(void)
{
#ifdef __linux__
    struct tw__sched_attr attr;
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
#if defined(SYS_sched_getattr) && defined(SYS_sched_setattr)
    memset(&attr, 0, sizeof attr);
    if (syscall(SYS_sched_getattr, 0, &attr, (unsigned)sizeof attr, 0U) == 0 && attr.sched_policy == 0) {
        attr.size = sizeof attr;
        attr.sched_runtime = 100000;
        syscall(SYS_sched_setattr, 0, &attr, 0U);
    }
#endif
#endif
}
static void tw_thread_join(tw_thread_t *t) { pthread_join(t->id, NULL); }
static void tw_thread_detach(tw_thread_t *t) { pthread_detach(t->id); }
static int tw_thread_is_current(tw_thread_t *t) { return pthread_equal(t->id, pthread_self()); }

/* A wake fd an asyncio loop watches with add_reader: eventfd on Linux, else a self-pipe.
 * Both ends non-blocking and close-on-exec; rfd == wfd for an eventfd. */
static int tw_wakefd_open(int *rfd, int *wfd)
{
#ifdef __linux__
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) return -1;
    *rfd = *wfd = fd;
    return 0;
#else
    int fds[2], i;
    if (pipe(fds) != 0) return -1;
    for (i = 0; i < 2; i++) {
        fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK);
        fcntl(fds[i], F_SETFD, FD_CLOEXEC);
    }
    *rfd = fds[0]; *wfd = fds[1];
    return 0;
#endif
}

/* A full pipe (EAGAIN) already means "readable", so a failed write loses nothing. */
static void tw_wakefd_signal(int wfd)
{
    uint64_t one = 1;
    ssize_t rc;
#ifdef __linux__
    rc = write(wfd, &one, sizeof one);
#else
    rc = write(wfd, &one, 1);
#endif
    (void)rc;
}

static void tw_wakefd_drain(int rfd)
{
#ifdef __linux__
    uint64_t count; /* one read resets an eventfd's counter */
    ssize_t rc = read(rfd, &count, sizeof count);
    (void)rc;
#else
    char buf[64];
    while (read(rfd, buf, sizeof buf) > 0) {
    }
#endif
}

static void tw_wakefd_close(int rfd, int wfd)
{
    close(rfd);
    if (wfd != rfd) close(wfd);
}
#endif

#endif /* TW_SYNC_H */

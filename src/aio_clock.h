/* time.monotonic() read in C, for the asyncio scheduler's per-call loop-clock reads.
 *
 * asyncio's loop.time() is time.monotonic(), which on Linux is clock_gettime(CLOCK_MONOTONIC)
 * converted to float seconds by CPython's _PyTime_AsSecondsDouble: whole seconds exactly, else
 * ns / 1e9. This reproduces it bit for bit, so the compiled scheduler reads the loop's own clock
 * without a Python call. Elsewhere it reports that it cannot (tw_monotonic_s returns -1) and the
 * scheduler calls loop.time().
 */
#ifndef TW_AIO_CLOCK_H
#define TW_AIO_CLOCK_H

#include <stdint.h>

#if defined(__linux__)
#include <time.h>

static inline int tw_monotonic_s(double* out) {
    struct timespec ts;
    int64_t ns;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) {
        return -1;
    }
    ns = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    if (ns % 1000000000LL == 0) {
        *out = (double)(ns / 1000000000LL);
    } else {
        volatile double d = (double)ns;  /* as CPython: no fused or reordered rounding */
        *out = d / 1e9;
    }
    return 0;
}
#else
static inline int tw_monotonic_s(double* out) {
    (void)out;
    return -1;
}
#endif

#endif

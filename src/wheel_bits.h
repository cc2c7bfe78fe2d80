/* Portable bit scans for src/_wheel.pyx: index of the lowest and of the highest set bit of a
 * non-zero 64-bit word (x == 0 is never passed). GCC/Clang builtins, MSVC intrinsics. And a
 * prefetch hint, so a re-arm's one cache miss (its entry) overlaps the caller's own work. */
#ifndef TIMERWHEEL_C_WHEEL_BITS_H
#define TIMERWHEEL_C_WHEEL_BITS_H
#include <stdint.h>
#if defined(_MSC_VER)
#include <intrin.h>
#pragma intrinsic(_BitScanForward64, _BitScanReverse64)
static __inline int tw_ctz64(uint64_t x) { unsigned long i; _BitScanForward64(&i, x); return (int)i; }
static __inline int tw_msb64(uint64_t x) { unsigned long i; _BitScanReverse64(&i, x); return (int)i; }
#if defined(_M_X64) || defined(_M_IX86)
#include <xmmintrin.h>
static __inline void tw_prefetch(const void* p) { _mm_prefetch((const char*)p, _MM_HINT_T0); }
#else
static __inline void tw_prefetch(const void* p) { (void)p; }
#endif
#else
static inline int tw_ctz64(uint64_t x) { return __builtin_ctzll(x); }
static inline int tw_msb64(uint64_t x) { return 63 - __builtin_clzll(x); }
static inline void tw_prefetch(const void* p) { __builtin_prefetch(p, 1, 3); }
#endif
#endif

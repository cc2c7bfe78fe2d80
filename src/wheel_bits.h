/* Portable bit scans for src/_wheel.pyx: index of the lowest and of the highest set bit of a
 * non-zero 64-bit word (x == 0 is never passed). GCC/Clang builtins, MSVC intrinsics. */
#ifndef TIMERWHEEL_C_WHEEL_BITS_H
#define TIMERWHEEL_C_WHEEL_BITS_H
#include <stdint.h>
#if defined(_MSC_VER)
#include <intrin.h>
#pragma intrinsic(_BitScanForward64, _BitScanReverse64)
static __inline int tw_ctz64(uint64_t x) { unsigned long i; _BitScanForward64(&i, x); return (int)i; }
static __inline int tw_msb64(uint64_t x) { unsigned long i; _BitScanReverse64(&i, x); return (int)i; }
#else
static inline int tw_ctz64(uint64_t x) { return __builtin_ctzll(x); }
static inline int tw_msb64(uint64_t x) { return 63 - __builtin_clzll(x); }
#endif
#endif

/* A cache prefetch hint, or nothing where the compiler has none (MSVC: a no-op).
 *
 * The event loop's cancel() issues it for the objects it is about to release (the callback, the
 * context copy) before it unlinks the wheel entry, so their cache misses overlap the entry's
 * instead of following it: a re-arm in random order over 100k timers is bound by such misses.
 */
#ifndef TW_PREFETCH_H
#define TW_PREFETCH_H

#if defined(__GNUC__) || defined(__clang__)
#define tw_prefetch(p) __builtin_prefetch((const void*)(p), 1, 3)
#else
#define tw_prefetch(p) ((void)(p))
#endif

#endif

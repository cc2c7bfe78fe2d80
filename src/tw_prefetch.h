/* A cache prefetch hint, or nothing where the compiler has none (MSVC: a no-op).
 *
 * The event loop's cancel() issues it for the objects it is about to release (the callback, the
 * handle itself, which a re-arm drops next) before it unlinks the wheel entry, so their cache
 * misses overlap the entry's instead of following it: a re-arm in random order over 100k timers
 * is bound by such misses.
 */
#ifndef TW_PREFETCH_H
#define TW_PREFETCH_H

#if defined(__GNUC__) || defined(__clang__)
#define tw_prefetch(p) __builtin_prefetch((const void*)(p), 1, 3)
#else
#define tw_prefetch(p) ((void)(p))
#endif

/* The collector's links of a tracked object sit in the two pointers before it (CPython's
 * PyGC_Head, 3.8 on; a free-threaded build keeps none). Freeing the object unlinks it, writing to
 * both its neighbours in the collector's list: the previous one was made just before it (in a
 * re-arm, its own callback, hot), the next one just after it, which a random order makes cold. */
#if !defined(Py_GIL_DISABLED)
/* An object about to be freed: its links, then its header. */
#define tw_prefetch_freed(op) (tw_prefetch((const char *)(op) - 2 * sizeof(void *)), tw_prefetch(op))
/* The links of the next neighbour of ``op``, read from ``op``'s own: best a while after those
 * were fetched, and a while before ``op`` is freed. */
#define tw_prefetch_gc_next(op) \
    ((((void *const *)(op))[-2] != NULL) ? tw_prefetch(((void *const *)(op))[-2]) : (void)0)
#else
#define tw_prefetch_freed(op) tw_prefetch(op)
#define tw_prefetch_gc_next(op) ((void)(op))
#endif

#endif

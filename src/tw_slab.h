/* An address-ordered allocator for the objects of one extension type (the event loop's timer
 * handles): its blocks are handed out at a cursor that sweeps forward through chunks of memory,
 * each taking the first free block at or after the previous one, never the block freed last.
 *
 * Why: a re-arm frees a handle and makes its successor at once. Under a last-freed-first allocator
 * (pymalloc, a freelist) the successor takes the predecessor's block, so a handle's address stays
 * where its connection's first handle was and any order of re-arms keeps its scatter for good.
 * Here the handles armed one after another lie one after another, as on asyncio's heap (whose
 * cancelled handles stay allocated until a sweep): the handles a wheel slot fires, armed in one
 * stretch of time, are read in address order, and a server that re-arms its connections in a
 * recurring order reads its handles sequentially, where the hardware prefetcher hides the misses.
 *
 * Blocks hold the collector's pre-header (PyGC_Head) then the object, as PyType_GenericAlloc lays
 * them out; tp_alloc/tp_free are replaced on the type at module init, before any instance exists.
 * Allocations are not counted toward the collector's generation-0 threshold (CPython exports no
 * call for it). Chunks are aligned to their size, so a block finds its chunk by masking. Only on
 * CPython with the GIL: a free-threaded build finds its objects through its own allocator, so there
 * the type keeps its default slots (tw_slab_install does nothing).
 */
#ifndef TW_SLAB_H
#define TW_SLAB_H

#include <Python.h>
#include <stdint.h>
#include <string.h>
#if defined(_WIN32)
#include <malloc.h>
#else
#include <stdlib.h>
#endif

#if !defined(Py_GIL_DISABLED) && !defined(PYPY_VERSION)
#define TW_SLAB_ON 1
#else
#define TW_SLAB_ON 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define TW_SLAB_PREFETCH_W(p) __builtin_prefetch((const void *)(p), 1, 3)
#else
#define TW_SLAB_PREFETCH_W(p) ((void)(p))
#endif

#define TW_SLAB_CHUNK_BYTES ((size_t)1 << 18)  /* 256 KiB: ~2,000 handles a chunk */
#define TW_SLAB_PRE (2 * sizeof(void *))      /* PyGC_Head: _gc_next, _gc_prev */

typedef struct {
    Py_ssize_t nblocks;
    Py_ssize_t live;
    char *blocks;          /* first block, after this header and the bitmap */
    uint64_t used[1];      /* nwords in all: a bit per block, set while allocated (and past the end) */
} tw_chunk_t;

static struct {
    PyTypeObject *type;
    size_t block;          /* bytes a block: pre-header + tp_basicsize, rounded up to 16 */
    Py_ssize_t nwords;     /* bitmap words a chunk */
    tw_chunk_t **chunks;
    Py_ssize_t nchunks, cap_chunks;
    Py_ssize_t cur_chunk;  /* the cursor: chunk index and bit index in it */
    Py_ssize_t cur_bit;
    Py_ssize_t live, capacity;
} tw_slab;

/* tracemalloc's domain for the chunks (an allocator of its own, as numpy's arrays have): what
 * tracemalloc.get_traced_memory() counts includes them while it traces. */
#define TW_SLAB_TRACE_DOMAIN 0x74776c70u  /* "twlp" */

static void *tw_slab_chunk_mem(void) {
    void *p = NULL;
#if defined(_WIN32)
    p = _aligned_malloc(TW_SLAB_CHUNK_BYTES, TW_SLAB_CHUNK_BYTES);
#else
    if (posix_memalign(&p, TW_SLAB_CHUNK_BYTES, TW_SLAB_CHUNK_BYTES) != 0) {
        p = NULL;
    }
#endif
    if (p != NULL) {
        (void)PyTraceMalloc_Track(TW_SLAB_TRACE_DOMAIN, (uintptr_t)p, TW_SLAB_CHUNK_BYTES);
    }
    return p;
}

static void tw_slab_chunk_free(void *p) {
    (void)PyTraceMalloc_Untrack(TW_SLAB_TRACE_DOMAIN, (uintptr_t)p);
#if defined(_WIN32)
    _aligned_free(p);
#else
    free(p);
#endif
}

/* Add a chunk after the others and put the cursor at its start; -1 (no exception set) on failure. */
static int tw_slab_grow(void) {
    tw_chunk_t *c;
    size_t header;
    Py_ssize_t n, i;
    if (tw_slab.nchunks == tw_slab.cap_chunks) {
        Py_ssize_t cap = tw_slab.cap_chunks ? 2 * tw_slab.cap_chunks : 8;
        tw_chunk_t **grown = (tw_chunk_t **)PyMem_RawRealloc(tw_slab.chunks, (size_t)cap * sizeof(tw_chunk_t *));
        if (grown == NULL) {
            return -1;
        }
        tw_slab.chunks = grown;
        tw_slab.cap_chunks = cap;
    }
    c = (tw_chunk_t *)tw_slab_chunk_mem();
    if (c == NULL) {
        return -1;
    }
    header = offsetof(tw_chunk_t, used) + (size_t)tw_slab.nwords * sizeof(uint64_t);
    header = (header + 63) & ~(size_t)63;
    n = (Py_ssize_t)((TW_SLAB_CHUNK_BYTES - header) / tw_slab.block);
    c->nblocks = n;
    c->live = 0;
    c->blocks = (char *)c + header;
    memset(c->used, 0, (size_t)tw_slab.nwords * sizeof(uint64_t));
    for (i = n; i < tw_slab.nwords * 64; i++) {  /* the bits past the last block read as used */
        c->used[i >> 6] |= (uint64_t)1 << (i & 63);
    }
    tw_slab.chunks[tw_slab.nchunks] = c;
    tw_slab.cur_chunk = tw_slab.nchunks;
    tw_slab.cur_bit = 0;
    tw_slab.nchunks++;
    tw_slab.capacity += n;
    return 0;
}

static inline int tw_slab_ctz(uint64_t w) {
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_ctzll(w);
#else
    int n = 0;
    while (!(w & 1)) { w >>= 1; n++; }
    return n;
#endif
}

/* The first free block at or after the cursor, wrapping through the chunks once; a new chunk first
 * when 3/4 of the blocks are in use. Below that the two generations a recurring order of re-arms
 * keeps (the handles armed since the cursor last passed, and those before) lie apart instead of
 * interleaved, each read in address order; at 7/8 they interleave, and a random re-arm at 100,000
 * timers cost 600 ns instead of 400 (5/8 cost as much as 3/4). */
static char *tw_slab_take(void) {
    Py_ssize_t k, ci, word, bit;
    uint64_t w;
    tw_chunk_t *c;
    if (tw_slab.live * 4 >= tw_slab.capacity * 3) {
        /* Without a new chunk, a block the others still have. */
        if (tw_slab_grow() < 0 && tw_slab.live >= tw_slab.capacity) {
            return NULL;
        }
    }
    ci = tw_slab.cur_chunk;
    bit = tw_slab.cur_bit;
    for (k = 0; k <= tw_slab.nchunks; k++) {
        c = tw_slab.chunks[ci];
        if (c->live < c->nblocks) {
            word = bit >> 6;
            w = ~c->used[word] & (~(uint64_t)0 << (bit & 63));
            while (w == 0 && ++word < tw_slab.nwords) {
                w = ~c->used[word];
            }
            if (w) {
                bit = (word << 6) + tw_slab_ctz(w);
                c->used[word] |= (uint64_t)1 << (bit & 63);
                c->live++;
                tw_slab.live++;
                tw_slab.cur_chunk = ci;
                tw_slab.cur_bit = bit + 1 < tw_slab.nwords * 64 ? bit + 1 : bit;
                if (bit + 1 < c->nblocks) {
                    /* The next block, which the next allocation most likely takes: its lines are
                     * written then, and would be read for ownership then, in turn. */
                    char *next = c->blocks + (size_t)(bit + 1) * tw_slab.block;
                    TW_SLAB_PREFETCH_W(next);
                    TW_SLAB_PREFETCH_W(next + 64);
                    TW_SLAB_PREFETCH_W(next + tw_slab.block - 1);
                }
                return c->blocks + (size_t)bit * tw_slab.block;
            }
        }
        ci = ci + 1 < tw_slab.nchunks ? ci + 1 : 0;
        bit = 0;
    }
    return NULL;  /* not reached: capacity exceeds live */
}

static PyObject *tw_slab_alloc(PyTypeObject *type, Py_ssize_t nitems) {
    char *mem;
    PyObject *op;
    (void)nitems;
    mem = tw_slab_take();
    if (mem == NULL) {
        return PyErr_NoMemory();
    }
    memset(mem, 0, tw_slab.block);
    op = (PyObject *)(mem + TW_SLAB_PRE);
    PyObject_Init(op, type);
    PyObject_GC_Track(op);
    return op;
}

static void tw_slab_free(void *p) {
    char *mem = (char *)p - TW_SLAB_PRE;
    tw_chunk_t *c = (tw_chunk_t *)((uintptr_t)mem & ~(uintptr_t)(TW_SLAB_CHUNK_BYTES - 1));
    Py_ssize_t bit = (Py_ssize_t)((size_t)(mem - c->blocks) / tw_slab.block);
    Py_ssize_t ci;
    /* The type's tp_dealloc (Cython's) untracked the object first, as PyObject_GC_Del expects. */
    c->used[bit >> 6] &= ~((uint64_t)1 << (bit & 63));
    c->live--;
    tw_slab.live--;
    if (bit + 1 == tw_slab.cur_bit && c == tw_slab.chunks[tw_slab.cur_chunk]) {
        /* The block taken last, freed before any other was taken (a timer armed and cancelled,
         * an asyncio.timeout block): taken again first, still in the cache. */
        tw_slab.cur_bit = bit;
    }
    /* An emptied chunk goes back to the system while the others hold twice the live blocks (well
     * above the 4/3 at which a chunk is added, so no chunk comes and goes at every handle). */
    if (c->live == 0 && tw_slab.nchunks > 1
            && 2 * tw_slab.live <= tw_slab.capacity - c->nblocks - ((tw_slab.capacity - c->nblocks) >> 3)) {
        for (ci = 0; tw_slab.chunks[ci] != c; ci++) {
        }
        tw_slab.capacity -= c->nblocks;
        tw_slab.nchunks--;
        memmove(&tw_slab.chunks[ci], &tw_slab.chunks[ci + 1], (size_t)(tw_slab.nchunks - ci) * sizeof(tw_chunk_t *));
        if (tw_slab.cur_chunk > ci) {
            tw_slab.cur_chunk--;
        } else if (tw_slab.cur_chunk == ci) {
            tw_slab.cur_bit = 0;
            if (tw_slab.cur_chunk == tw_slab.nchunks) {
                tw_slab.cur_chunk = 0;
            }
        }
        tw_slab_chunk_free(c);
    }
}

/* {"live", "capacity", "chunks", "block_bytes"}: the blocks in use, the blocks the chunks hold, the
 * chunks, and a block's size; or None where the type keeps its default allocator. */
static PyObject *tw_slab_stats(void) {
    if (tw_slab.type == NULL) {
        Py_RETURN_NONE;
    }
    return Py_BuildValue("{snsnsnsn}", "live", tw_slab.live, "capacity", tw_slab.capacity,
                         "chunks", tw_slab.nchunks, "block_bytes", (Py_ssize_t)tw_slab.block);
}

/* Give ``type`` (a GC type, no instance made yet) this allocator; 0, or -1 with an exception. */
static int tw_slab_install(PyTypeObject *type) {
#if TW_SLAB_ON
    size_t block = (TW_SLAB_PRE + (size_t)type->tp_basicsize + 15) & ~(size_t)15;
    if (!PyType_HasFeature(type, Py_TPFLAGS_HAVE_GC) || type->tp_itemsize != 0 || tw_slab.type != NULL) {
        PyErr_SetString(PyExc_SystemError, "tw_slab_install: not a fixed-size GC type, or installed twice");
        return -1;
    }
    tw_slab.type = type;
    tw_slab.block = block;
    tw_slab.nwords = (Py_ssize_t)((TW_SLAB_CHUNK_BYTES / block + 63) / 64);
    type->tp_alloc = tw_slab_alloc;
    type->tp_free = tw_slab_free;
#else
    (void)type;
#endif
    return 0;
}

#endif

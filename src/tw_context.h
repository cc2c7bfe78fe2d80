/* Reads of a contextvars.Context that CPython's public C API has no call for: the current
 * context of the thread (a field of PyThreadState, which CPython's contextvars reads), and a
 * context's variables, the immutable mapping (a HAMT) that every copy of it shares until a
 * variable is set in one of them (PEP 567).
 *
 * The layout of a context is CPython's (Include/internal/pycore_context.h; the same on 3.9 to
 * 3.13, checked here): the object header, the previous context, then the variables.
 * src/_loop.pyx checks it when it loads, on contexts it makes and changes, and arms every handle
 * with a copy of its own instead (as asyncio does) unless the check holds.
 */
#ifndef TW_CONTEXT_H
#define TW_CONTEXT_H

#include <Python.h>

typedef struct {
    PyObject_HEAD
    PyObject *ctx_prev;
    PyObject *ctx_vars;
} tw_context_head;

/* The thread's current context, or NULL if the thread has made none yet (borrowed). */
static inline PyObject *tw_current_context(void) {
    return PyThreadState_Get()->context;
}

/* The variables of context ``ctx`` (borrowed): equal for two contexts exactly when they hold the
 * same variables since one was copied from the other, as a copy shares them. */
static inline PyObject *tw_context_vars(PyObject *ctx) {
    return ((tw_context_head *)ctx)->ctx_vars;
}

#endif

/* Helpers for the event loop's methods written as C methods of its class (src/_loop.pyx).
 *
 * tw_type_get: a type's attribute as the method cache finds it (_PyType_Lookup: borrowed, NULL if
 * none), remembered with the type's version tag, so that a read of an unchanged class is two
 * comparisons instead of a lookup (about thirty instructions, and a re-arm makes three). Every
 * change of the class or of a class above it (a patch of EventLoop.call_at, of asyncio's
 * BaseEventLoop.time) invalidates the tag, and the next read looks up again. Not on a free-threaded
 * build, where the tag may change under a reader: there, a lookup every read.
 *
 * tw_call_with_self: a fast call's arguments handed on, with ``self`` before them, to a function
 * that takes the loop as its first argument (the C methods' fallback for rare calls).
 */
#ifndef TW_METHODS_H
#define TW_METHODS_H

#include <Python.h>
#include <string.h>

typedef struct {
    PyTypeObject *type;
    unsigned int tag;
    PyObject *value;
} tw_type_memo;

static inline int tw_type_tag_valid(PyTypeObject *tp) {
#if PY_VERSION_HEX < 0x030C0000
    /* 3.9 and 3.10 clear the flag on a change and leave the tag as it was. */
    return PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG);
#else
    (void)tp;
    return 1;  /* 3.12 on: a change sets the tag to 0, never a valid one */
#endif
}

static inline PyObject *tw_type_get(PyTypeObject *tp, PyObject *name, tw_type_memo *memo) {
    PyObject *value;
#if !defined(Py_GIL_DISABLED)
    if (tp == memo->type && memo->tag != 0 && tp->tp_version_tag == memo->tag && tw_type_tag_valid(tp)) {
        return memo->value;
    }
#endif
    value = _PyType_Lookup(tp, name);  /* assigns the tag where it can */
    memo->type = tp;
    memo->tag = tw_type_tag_valid(tp) ? tp->tp_version_tag : 0;
    memo->value = value;
    return value;
}

/* The tuple of n objects (the shared empty tuple for none): a new reference, or NULL. */
static inline PyObject *tw_tuple_of(PyObject *const *items, Py_ssize_t n) {
    PyObject *t;
    Py_ssize_t i;
    t = PyTuple_New(n);
    if (t == NULL || n == 0) {
        return t;
    }
    for (i = 0; i < n; i++) {
        Py_INCREF(items[i]);
        PyTuple_SET_ITEM(t, i, items[i]);
    }
    return t;
}

/* True if a fast call's keyword names are exactly ``(name,)``. */
static inline int tw_only_keyword(PyObject *kwnames, PyObject *name) {
    PyObject *given;
    if (PyTuple_GET_SIZE(kwnames) != 1) {
        return 0;
    }
    given = PyTuple_GET_ITEM(kwnames, 0);
    return given == name || (PyUnicode_CheckExact(given) && PyUnicode_Compare(given, name) == 0);
}

static PyObject *tw_call_with_self(PyObject *func, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames) {
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    PyObject *small[8];
    PyObject **stack = small;
    PyObject *result;
    if (nargs + nkw + 1 > 8) {
        stack = (PyObject **)PyMem_Malloc((size_t)(nargs + nkw + 1) * sizeof(PyObject *));
        if (stack == NULL) {
            return PyErr_NoMemory();
        }
    }
    stack[0] = self;
    if (nargs + nkw) {
        memcpy(stack + 1, args, (size_t)(nargs + nkw) * sizeof(PyObject *));
    }
    result = PyObject_Vectorcall(func, stack, (size_t)(nargs + 1), kwnames);
    if (stack != small) {
        PyMem_Free(stack);
    }
    return result;
}

#endif

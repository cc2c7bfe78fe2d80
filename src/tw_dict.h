#ifndef TW_DICT_H
#define TW_DICT_H

#include <Python.h>
#include <stdint.h>

/* A dict's value for one exact-str key (borrowed; NULL if absent), remembered with the dict's
 * version tag where every change of the dict renews it (PEP 509: 3.9 to 3.12, with the GIL), so
 * a read of an unchanged dict is one comparison instead of a lookup (about a hundred
 * instructions, the larger part of a clock read), and a patch set or undone is seen at the next
 * read. Not on 3.13: an attribute set on an object whose __dict__ shares the object's inline
 * values writes the values without renewing the dict's tag, so a loop.time patched that way
 * went unseen. Elsewhere, a lookup at every read. The remembered value is
 * the dict's own reference, valid while the tag holds. A lookup cannot fail for such a key, but
 * a failure reads as absent, as PyDict_GetItem's does. */
#if PY_VERSION_HEX < 0x030D0000 && !defined(Py_GIL_DISABLED)
#define TW_DICT_VERSIONS 1
#else
#define TW_DICT_VERSIONS 0
#endif
typedef struct { uint64_t version; PyObject *value; } tw_dict_memo;

static inline uint64_t tw_dict_version(PyObject *dict) {
#if TW_DICT_VERSIONS
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
    return ((PyDictObject *)dict)->ma_version_tag;  /* deprecated from 3.12, kept until 3.14 */
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
#else
    (void)dict;
    return 0;
#endif
}

static inline PyObject *tw_dict_get(PyObject *dict, PyObject *key, tw_dict_memo *memo) {
    /* Read before the lookup: a change the lookup itself makes leaves a stale tag, never a
     * stale value. */
    uint64_t version = tw_dict_version(dict);
    PyObject *value;
    if (TW_DICT_VERSIONS && version != 0 && version == memo->version) {
        return memo->value;
    }
    value = PyDict_GetItemWithError(dict, key);
    if (value == NULL && PyErr_Occurred()) {
        PyErr_Clear();
    }
    memo->version = version;
    memo->value = value;
    return value;
}


#endif

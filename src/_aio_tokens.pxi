# A core's armed handles as wheel tokens (src/_aio.pyx, src/_loop.pyx include this): a handle's
# token is its index in the core's ``handles`` list, which holds it from its arming until it runs or
# is cancelled (index 0 stays unused: 0 is no token, as 0 is no timer id). The list is an ordinary
# field, the core's one reference to each armed handle: the collector sees the handles through it
# and the list's own clear breaks a cycle, so no core needs a hand-written traverse nor to read the
# wheel's entries. Freed indexes are reused last-freed first (a stack in C), so the list stays as
# long as the peak of armed handles and freeing never allocates.

# (token_stack_t, the stack of free indexes, is declared in src/_aio.pxd.)

cdef enum:
    TOKENS_MIN_CAP = 64


cdef Py_ssize_t _take_token(list handles, token_stack_t* stack, object handle) except -1:
    """Put ``handle`` in ``handles`` at a free index (the last freed, else a new one) and return
    it. The stack grows with the list, so a later free never fails."""
    cdef Py_ssize_t token, cap
    cdef Py_ssize_t* grown
    if len(handles) == 0:
        # The collector cleared the list: its core is garbage and a finalizer arms.
        handles.append(None)
        stack.count = 0
    if stack.count:
        stack.count -= 1
        token = stack.free[stack.count]
        handles[token] = handle
        return token
    token = len(handles)
    if token > stack.cap:
        cap = TOKENS_MIN_CAP if stack.cap == 0 else 2 * stack.cap
        grown = <Py_ssize_t*>realloc(stack.free, cap * sizeof(Py_ssize_t))
        if grown == NULL:
            raise MemoryError(f"cannot hold {token} armed handles")
        stack.free = grown
        stack.cap = cap
    handles.append(handle)
    return token


cdef int _give_token(list handles, token_stack_t* stack, Py_ssize_t token, object handle) except -1:
    """Free index ``token`` if ``handle`` is still there (not after a drain or the collector's
    clear). The caller holds ``handle``: no finalizer runs here."""
    if 0 < token < len(handles) and handles[token] is handle:
        stack.free[stack.count] = token
        stack.count += 1
        handles[token] = None
    return 0


cdef inline object _token_handle(list handles, uint64_t token):
    """The handle at index ``token``, or None (a freed or dropped index)."""
    if token < <uint64_t>len(handles):
        return handles[<Py_ssize_t>token]
    return None


cdef list _drop_tokens(TimerWheel wheel, list handles, token_stack_t* stack):
    """Empty ``wheel`` (every pending timer fires at the end of time, its token dropped) and
    ``handles``, and return the handles it held (no None), to reset once no C state names them: dropping
    a reference may run Python code (a finalizer that arms again)."""
    cdef tw_fired_t fired
    if wheel.c_count():
        wheel.c_advance(MAX_DUE_MS, &fired)
        wheel.c_release(&fired)
    detached = [handle for handle in handles if handle is not None]
    del handles[1:]
    stack.count = 0
    return detached

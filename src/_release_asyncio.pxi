# The asyncio bridge of the compiled ReleaseTimer (included by _release.pyx).
#
# Kept in one file apart from the release thread, and included rather than compiled as a module
# of its own: the release thread pushes released keys into a loop's Chan under Core.lock, with
# no GIL, so the bridge must share the Core struct and call these helpers as plain C functions;
# a separate extension module would need the structs in a .pxd and every push through a
# function-pointer capsule. The locking and fork rules at the top of _release.pyx hold here.
#
# A loop that supports add_reader watches a wake fd (an eventfd, or a self-pipe) that the release
# thread writes once per batch; its `drain` then runs on the loop's thread and resolves the
# futures. A loop without add_reader (the Windows proactor) gets a helper thread that waits on the
# Chan's condition and posts `drain` with call_soon_threadsafe. A deadline awaited on a second
# loop gets a future settled by a helper thread (_fallback_future in timerwheel_c/_release_common.py).
#
# Loops are held weakly (the timer's table is a WeakKeyDictionary, a channel keeps a weak
# reference): a loop left unclosed by a thread that ended must not be kept alive, with its
# selector and self-pipe, by a timer that lives as long as the process. When such a loop is
# collected, its channel tears itself down (the weak reference's callback) and closes its wake fd.
# A loop with a deadline still awaited is kept by the awaiting future itself, as asyncio's own
# timers keep theirs.

# One asyncio loop's inbox: released keys queued by the release thread (under Core.lock).
cdef struct Chan:
    int rfd                 # the wake fd the loop watches (-1 in helper mode or once closed)
    int wfd
    int helper              # 1: a helper thread waits on `cond` and posts drains instead
    int held                # a _Channel or its helper thread still points here: not reusable
    int signaled            # the queue was signalled since the last drain took it
    int posted              # helper mode: a drain is posted and has not run yet
    int dead                # not (or no longer) watched: never signal it
    int overflow            # a push failed for memory: the next drain rescans its waiters
    tw_cond_t cond
    uint64_t *q             # keys: slot << 32 | generation
    Py_ssize_t q_len
    Py_ssize_t q_cap


@cython.no_gc_clear  # a loop may still call drain(), which needs rt
@cython.final
cdef class _Channel:
    """Carries releases from the release thread to one asyncio loop.

    The release thread queues released keys (slot << 32 | generation) on the native
    ``Chan`` and, once per batch, writes the wake fd the loop watches with add_reader;
    ``drain`` runs on the loop's thread and resolves the futures. For a loop without
    add_reader a helper thread waits on the Chan's condition and posts ``drain`` with
    call_soon_threadsafe.
    """

    cdef ReleaseTimer rt
    cdef object loop_ref  # weakref.ref to the loop, whose callback tears this channel down
    cdef readonly int32_t index
    cdef Chan *ch  # NULL once torn down; the struct itself lives until the timer is freed
    cdef dict waiters
    cdef bint helper_taken  # _helper_main has begun: it runs once, on the thread made for it

    def __cinit__(self, token=None, *args, **kwargs):
        if token is not _MAKE:
            raise TypeError("_Channel objects are made by _channel_for(), not constructed directly")

    def forget(self, key, fut):
        """Drop a cancelled waiter's future."""
        futs = self.waiters.get(key)
        if futs is not None and fut in futs:
            futs.remove(fut)
            if not futs:
                del self.waiters[key]

    def drain(self):
        """On the loop's thread: resolve the futures of released deadlines."""
        cdef Core *c = self.rt._core
        cdef Chan *ch = self.ch
        cdef uint64_t *keys
        cdef Py_ssize_t n, i
        cdef bint closed, overflow, ours
        if ch == NULL:
            return
        if not ch.helper:
            tw_wakefd_drain(ch.rfd)
        ours = _ours(c)  # in a forked child the parent's lock may be held for ever (rule 4)
        if ours:
            tw_mutex_lock(&c.lock)
        keys = ch.q
        n = ch.q_len
        ch.q = NULL
        ch.q_len = ch.q_cap = 0
        ch.signaled = ch.posted = 0
        overflow = ch.overflow
        ch.overflow = 0
        closed = c.closed
        if ours:
            tw_mutex_unlock(&c.lock)
        try:
            for i in range(n):
                for fut in self.waiters.pop(keys[i], ()):
                    if not fut.done():
                        fut.set_result(None)
        finally:
            free(keys)
        if overflow:
            for key in list(self.waiters):
                if _key_released(c, key):
                    for fut in self.waiters.pop(key):
                        if not fut.done():
                            fut.set_result(None)
        if closed:
            self.fail_all()
            self.teardown()

    def fail_all(self):
        """Wake every remaining future with ReleaseTimerClosed (the timer was closed)."""
        waiters, self.waiters = self.waiters, {}
        for futs in waiters.values():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(ReleaseTimerClosed("the ReleaseTimer was closed before the deadline"))

    def teardown(self):
        """Stop watching the loop: remove the reader, close the fds, release the helper."""
        cdef Core *c = self.rt._core
        cdef Chan *ch = self.ch
        cdef bint ours
        if ch == NULL:
            return
        self.ch = NULL
        loop = self.loop_ref()
        if not ch.helper and loop is not None and not loop.is_closed():
            try:
                loop.remove_reader(ch.rfd)
            except Exception:  # a loop shutting down: nothing left to unregister
                pass
        # In a forked child, the parent's channel: its lock may be held for ever and no helper
        # thread is here to tell (rule 4); the fds are this process's own copies.
        ours = _ours(c)
        if ours:
            tw_mutex_lock(&c.lock)
        ch.dead = 1
        if not ch.helper:
            tw_wakefd_close(ch.rfd, ch.wfd)
            ch.rfd = ch.wfd = -1
            ch.held = 0
        elif ours:
            tw_cond_broadcast(&ch.cond)
        if ours:
            tw_mutex_unlock(&c.lock)
        if loop is not None and self.rt._chans.get(loop) is self:
            del self.rt._chans[loop]

    def _loop_collected(self, ref):
        """The weak reference's callback: the loop is gone (collected unclosed), so is its reader."""
        self.teardown()

    def _helper_main(self):
        """Helper mode: wait (GIL released) for a signalled batch, post a drain, repeat."""
        cdef Core *c = self.rt._core
        cdef Chan *ch = self.ch
        cdef bint dead
        # A torn-down channel has no Chan, and an fd channel's condition is never signalled: a
        # call from anywhere but its own helper thread would read freed state or wait for ever.
        if ch == NULL or not ch.helper or self.helper_taken:
            raise RuntimeError("_helper_main runs only on the helper thread of a live channel without a wake fd")
        self.helper_taken = True
        while True:
            with nogil:
                tw_mutex_lock(&c.lock)
                while not (ch.signaled and not ch.posted) and not ch.dead:
                    tw_cond_wait(&ch.cond, &c.lock)
                dead = ch.dead
                if not dead:
                    ch.posted = 1
                tw_mutex_unlock(&c.lock)
            loop = self.loop_ref()
            if dead or loop is None:
                break
            try:
                loop.call_soon_threadsafe(self.drain)
            except RuntimeError:  # the loop is closed: nobody is left to wake
                break
            loop = None  # not held while waiting: this thread must not keep the loop alive
        tw_mutex_lock(&c.lock)
        ch.dead = 1
        ch.held = 0
        tw_mutex_unlock(&c.lock)


cdef bint _key_released(Core *c, uint64_t key) noexcept:
    cdef int32_t slot = <int32_t>(key >> 32)
    cdef bint released
    cdef bint ours = _ours(c)  # a forked child reads the parent's slots unlocked (rule 4)
    if ours:
        tw_mutex_lock(&c.lock)
    released = c.slots[slot].gen == <uint32_t>key and c.slots[slot].state == RELEASED
    if ours:
        tw_mutex_unlock(&c.lock)
    return released


cdef void _chan_push(Chan *ch, uint64_t key) noexcept nogil:
    """Queue ``key`` and signal the loop once per batch (Core.lock held)."""
    cdef uint64_t *q
    cdef Py_ssize_t cap
    if ch.dead:
        return
    if ch.q_len == ch.q_cap:
        cap = 16 if ch.q_cap == 0 else ch.q_cap * 2
        q = <uint64_t *>realloc(ch.q, cap * sizeof(uint64_t))
        if q == NULL:
            ch.overflow = 1
        else:
            ch.q = q
            ch.q_cap = cap
    if ch.q_len < ch.q_cap:
        ch.q[ch.q_len] = key
        ch.q_len += 1
    _chan_notify(ch)


cdef void _chan_notify(Chan *ch) noexcept nogil:
    """Wake the loop's side: a byte on the wake fd, or the helper's condition (Core.lock held)."""
    if ch.signaled or ch.dead:
        return
    ch.signaled = 1
    if ch.helper:
        tw_cond_signal(&ch.cond)
    else:
        tw_wakefd_signal(ch.wfd)


cdef _Channel _channel_for(ReleaseTimer rt, loop):
    """The channel to ``loop``, made on first use; channels of closed loops are reaped."""
    cdef _Channel chan = rt._chans.get(loop)
    cdef Core *c = rt._core
    cdef Chan *ch = NULL
    cdef Py_ssize_t i, index = -1
    cdef void *p
    if chan is not None:
        return chan
    for old_loop, old in list(rt._chans.items()):
        if old_loop.is_closed():
            old.teardown()
    tw_mutex_lock(&c.lock)
    for i in range(c.n_chans):  # reuse a dead Chan no helper holds
        if c.chans[i] != NULL and not c.chans[i].held:
            index = i
            break
    if index < 0:
        p = realloc(c.chans, (c.n_chans + 1) * sizeof(Chan *))
        if p != NULL:
            c.chans = <Chan **>p
            ch = <Chan *>calloc(1, sizeof(Chan))
            if ch != NULL and tw_cond_init(&ch.cond) != 0:
                free(ch)
                ch = NULL
            if ch != NULL:
                index = c.n_chans
                c.chans[index] = ch
                c.n_chans += 1
    else:
        ch = c.chans[index]
        free(ch.q)
        ch.q = NULL
        ch.q_len = ch.q_cap = 0
        ch.signaled = ch.posted = ch.overflow = ch.helper = 0
    if ch != NULL:
        ch.rfd = ch.wfd = -1
        ch.dead = 1  # not signalled until the loop side is set up below
        ch.held = 1
    tw_mutex_unlock(&c.lock)
    if ch == NULL:
        raise MemoryError("no memory for an asyncio channel")
    chan = _Channel.__new__(_Channel, _MAKE)
    chan.rt = rt
    chan.loop_ref = weakref.ref(loop, chan._loop_collected)
    chan.index = <int32_t>index
    chan.ch = ch
    chan.waiters = {}
    try:
        helper = not _watch_fd(chan, ch, loop)
    except BaseException:
        chan.ch = NULL
        tw_mutex_lock(&c.lock)
        ch.held = 0
        tw_mutex_unlock(&c.lock)
        raise
    tw_mutex_lock(&c.lock)
    ch.helper = helper
    ch.dead = 0
    if c.closed:
        _chan_notify(ch)
    tw_mutex_unlock(&c.lock)
    rt._chans[loop] = chan
    if helper:
        threading.Thread(target=chan._helper_main, name="timerwheel_c-release-helper", daemon=True).start()
    return chan


cdef bint _watch_fd(_Channel chan, Chan *ch, loop) except -1:
    """Open the wake fd and have ``loop`` watch it; False if the loop has no add_reader."""
    cdef int rfd, wfd
    if tw_wakefd_open(&rfd, &wfd) != 0:
        return False
    try:
        loop.add_reader(rfd, chan.drain)
    except NotImplementedError:  # the Windows proactor, or any loop without readers
        tw_wakefd_close(rfd, wfd)
        return False
    except BaseException:
        tw_wakefd_close(rfd, wfd)
        raise
    ch.rfd = rfd
    ch.wfd = wfd
    return True

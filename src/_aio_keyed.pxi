# KeyedTimers, timers named by int keys (WheelScheduler.keyed()); included by src/_aio.pyx.


@cython.final
@cython.no_gc_clear
cdef class KeyedTimers:
    """Timers named by int keys, all firing one callback: :meth:`WheelScheduler.keyed`.

    One timer per key at most: ``arm(key, delay)`` arms it, or re-arms it in place. Firing
    calls ``callback(key)`` on the loop in the context captured by ``keyed()``; an exception
    goes to the loop's exception handler, as asyncio's callbacks. Keys are ints in
    [-2**63, 2**63) (a connection id, a file descriptor). No object is made per timer: an
    armed key costs its wheel entry (32 B) and a 24 B table slot, at most 13/16 full.
    """
    # Fields and C methods: src/_aio.pxd.

    def __init__(self, *args, **kwargs):
        raise TypeError("KeyedTimers objects are made by WheelScheduler.keyed()")

    def __dealloc__(self):
        free(self._slots)

    def arm(self, key, delay):
        """Arm ``key`` to fire ``delay`` seconds from now (``loop.time() + delay``), never earlier.

        Re-arms in place if ``key`` is armed (also when it is due in the running batch: it then
        fires at the new time, not now). A delay of 0 or less fires on the next tick (1 ms). A
        re-arm to the same or a later time writes the deadline alone (the wheel entry stays, and
        is re-filed when it comes due), so among keys due at its new ms it fires in the order it
        was re-filed.

        Raises:
            TypeError: ``key`` is not an int or ``delay`` not a real number. ValueError:
                ``key`` outside [-2**63, 2**63), ``delay`` NaN or infinite or beyond the
                wheel's range (2**62 ms). RuntimeError: the scheduler is closed.
        """
        self.c_arm(_as_key(key), _as_seconds(delay, "delay"))

    def cancel(self, key):
        """Disarm ``key``. Returns True if it was armed (its callback will not run), else False.

        Raises:
            TypeError / ValueError: ``key`` is not an int in [-2**63, 2**63).
        """
        return self.c_cancel(_as_key(key))

    def when(self, key):
        """The deadline of ``key`` in loop-clock seconds, or None if it is not armed.

        Raises:
            TypeError / ValueError: ``key`` is not an int in [-2**63, 2**63).
        """
        cdef Py_ssize_t i = self._find(_as_key(key))
        return None if i < 0 else self._slots[i].when_s

    def __contains__(self, key):
        """True if ``key`` is armed (pending, or due in the running batch and not yet run)."""
        return self._find(_as_key(key)) >= 0

    def __len__(self):
        """How many keys are armed."""
        return self._count

    def __sizeof__(self):
        """Bytes of the set: the object, its key table and its wheel (``TimerWheel.nbytes()``)."""
        return object.__sizeof__(self) + self._cap * sizeof(key_slot_t) + self._wheel.nbytes()

    # -- the C-level API (declared in src/_aio.pxd) ---------------------------------------------

    cdef int c_arm(self, int64_t key, double delay_s) except -1:
        """``arm(key, delay_s)``.

        Raises:
            ValueError: ``delay_s`` is not finite, or beyond the wheel's range. RuntimeError:
                the scheduler is closed, or this set was not made by ``keyed()``.
        """
        cdef WheelScheduler scheduler = self._scheduler
        cdef TimerWheel wheel = self._wheel
        cdef double when_s
        cdef int64_t due_ms, after_ms
        cdef Py_ssize_t i
        cdef uint64_t timer_id
        if scheduler is None:
            raise RuntimeError("this KeyedTimers was not made by WheelScheduler.keyed()")
        if scheduler._closed:
            raise RuntimeError("WheelScheduler is closed")
        if not isfinite(delay_s):
            check_seconds(delay_s)
        if self._cap:
            # The key's slot starts loading while the clock is read.
            tw_prefetch(&self._slots[self._home(key)])
        when_s = scheduler.c_time() + delay_s
        due_ms = scheduler._due_ms(when_s)
        if due_ms < scheduler._wake_ms:  # first, as for a handle: see WheelScheduler._arm_handle
            scheduler._arm_wake(due_ms)
        # No Python code runs from a _find to the table write but on an error path.
        i = self._find(key)
        if i >= 0 and when_s >= self._slots[i].when_s:
            # The same or a later deadline: the key keeps its wheel entry, due earlier, and only
            # its deadline changes (one table slot touched); when the entry fires, _run re-files
            # the key by this deadline. So does a key due in the running batch.
            self._slots[i].when_s = when_s
            return 0
        after_ms = scheduler._after_ms(wheel, due_ms)  # may call loop.time(): look the key up again
        if self._count == 0:
            # Its first key: the scheduler holds the set while a key is armed (before the table
            # changes, so a failed add leaves the key unarmed, not a key armed in an unheld set).
            scheduler._armed_keyed.add(self)
        i = self._find(key)
        if i >= 0:
            if not wheel.c_reschedule(self._slots[i].timer_id, after_ms):
                # Due in the running batch: a new entry; the batch skips the old token.
                self._slots[i].timer_id = wheel.c_schedule(after_ms, <uint64_t>key)
        else:
            if (self._count + 1) * 16 > self._cap * 13:
                self._grow()
            timer_id = wheel.c_schedule(after_ms, <uint64_t>key)
            i = self._insert(key, timer_id)
        self._slots[i].when_s = when_s
        return 0

    cdef bint c_cancel(self, int64_t key) noexcept:
        """``cancel(key)``: True if it was armed."""
        cdef Py_ssize_t i = self._find(key)
        cdef uint64_t timer_id
        if i < 0:
            return False
        timer_id = self._slots[i].timer_id
        self._remove(i)
        self._wheel.c_cancel(timer_id)
        if self._count == 0:
            self._emptied()
        return True

    cdef int _run(self, int64_t now_ms) except -1:
        """Advance this set's wheel to ``now_ms`` and fire the due keys in fire order."""
        cdef TimerWheel wheel = self._wheel
        cdef tw_fired_t fired
        cdef Py_ssize_t i = 0, j
        cdef int64_t key, due_ms
        if now_ms <= wheel.c_now_ms():
            return 0
        wheel.c_advance(now_ms, &fired)
        try:
            _order_batch(self, _key_due, &fired)
            while i < fired.count:
                key = <int64_t>fired.tokens[i]
                i += 1
                j = self._find(key)
                # Absent: cancelled by an earlier callback of this batch; pending: re-armed by one.
                if j < 0 or wheel.c_due_ms(self._slots[j].timer_id) >= 0:
                    continue
                due_ms = self._scheduler._due_ms(self._slots[j].when_s)
                if due_ms > now_ms:  # re-armed later while its entry waited: re-filed, not run
                    self._slots[j].timer_id = wheel.c_schedule(due_ms - wheel.c_now_ms(), <uint64_t>key)
                    continue
                self._remove(j)
                if self._count == 0:
                    self._emptied()
                self._fire(key)
        finally:
            # A SystemExit/KeyboardInterrupt skipped the rest: back at their due times, the next
            # tick at the earliest (a delay under 1 ms counts as 1), in order.
            while i < fired.count:
                key = <int64_t>fired.tokens[i]
                i += 1
                j = self._find(key)
                if j >= 0 and wheel.c_due_ms(self._slots[j].timer_id) < 0:
                    self._slots[j].timer_id = wheel.c_schedule(
                        self._scheduler._due_ms(self._slots[j].when_s) - wheel.c_now_ms(), <uint64_t>key)
            wheel.c_release(&fired)
        return 0

    cdef int _refile(self, int64_t now_ms) except -1:
        """File every armed key again on a new wheel whose time is the ms before ``now_ms`` (see
        ``WheelScheduler._follow_clock``)."""
        cdef TimerWheel old = self._wheel
        cdef TimerWheel wheel = TimerWheel(max(now_ms - 1, 0))
        cdef tw_fired_t fired
        cdef Py_ssize_t i, j
        cdef int64_t key, due_ms
        old.c_advance(MAX_DUE_MS, &fired)
        try:
            for i in range(fired.count):
                key = <int64_t>fired.tokens[i]
                j = self._find(key)
                if j >= 0:
                    due_ms = _refiled_ms(self._scheduler, self._slots[j].when_s)
                    # Found again: a deadline out of range runs Python code (its error's message), and
                    # a finalizer run there may arm keys (the table moves) or close the set (it is freed).
                    j = self._find(key)
                    if j >= 0:
                        self._slots[j].timer_id = wheel.c_schedule(due_ms - wheel.c_now_ms(), <uint64_t>key)
        finally:
            old.c_release(&fired)
            self._wheel = wheel
        return 0

    cdef int _fire(self, int64_t key) except -1:
        """Run ``callback(key)`` in the set's context; exceptions go to the loop's handler."""
        try:
            _run_in(self._context, self._callback, (key,))
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._scheduler._loop.call_exception_handler({
                "message": f"Exception in callback {self._callback!r}({key!r})",
                "exception": exc,
            })
        return 0

    cdef void _clear(self) noexcept:
        """Drop every key (the scheduler closes); the running batch then finds none."""
        free(self._slots)
        self._slots = NULL
        self._cap = 0
        self._count = 0

    cdef void _emptied(self) noexcept:
        """Its last armed key is gone: the scheduler lets go of the set, which its owner may have
        dropped (the caller holds it, so it is not freed here)."""
        if self._scheduler is not None:
            self._scheduler._armed_keyed.discard(self)

    # -- the key table: open addressing, linear probing, backward-shift deletion ---------------

    cdef inline Py_ssize_t _home(self, int64_t key) noexcept:
        """The key's home slot: the key mixed by SplitMix64's finalizer (Steele, Lea and Flood), whose
        every output bit depends on every key bit, then masked. Keys that follow one another (file
        descriptors, connection ids) land far apart: with linear probing, homes in a row made one
        run as long as the range, which a removal walks to its end, and a key whose home fell inside
        it walked too (a cancel at 200,000 armed ids took 0.1 ms, and 40,000 ids due at once 0.8 s).
        A multiplication alone keeps a key's low zero bits: keys that differ only in their high bits
        (``i << 48``) then shared one home."""
        cdef uint64_t h = <uint64_t>key
        h = (h ^ (h >> 30)) * <uint64_t>0xBF58476D1CE4E5B9
        h = (h ^ (h >> 27)) * <uint64_t>0x94D049BB133111EB
        return <Py_ssize_t>((h ^ (h >> 31)) & <uint64_t>(self._cap - 1))

    cdef Py_ssize_t _find(self, int64_t key) noexcept:
        """The slot holding ``key``, or -1."""
        cdef Py_ssize_t i, mask = self._cap - 1
        if self._count == 0:
            return -1
        i = self._home(key)
        while self._slots[i].timer_id != 0:
            if self._slots[i].key == key:
                return i
            i = (i + 1) & mask
        return -1

    cdef Py_ssize_t _insert(self, int64_t key, uint64_t timer_id) noexcept:
        """Put ``key`` (absent, with room for it) in its first free slot; returns the slot."""
        cdef Py_ssize_t i = self._home(key), mask = self._cap - 1
        while self._slots[i].timer_id != 0:
            i = (i + 1) & mask
        self._slots[i].key = key
        self._slots[i].timer_id = timer_id
        self._count += 1
        return i

    cdef void _remove(self, Py_ssize_t i) noexcept:
        """Empty slot ``i``, shifting back the run after it so every key stays reachable."""
        cdef Py_ssize_t j = i, home, mask = self._cap - 1
        while True:
            j = (j + 1) & mask
            if self._slots[j].timer_id == 0:
                break
            home = self._home(self._slots[j].key)
            # The key at j may fill the hole at i unless its home lies cyclically in (i, j].
            if (i <= j and i < home <= j) or (i > j and (home > i or home <= j)):
                continue
            self._slots[i] = self._slots[j]
            i = j
        self._slots[i].timer_id = 0
        self._count -= 1

    cdef int _grow(self) except -1:
        """Double the table (16 slots at first) and re-insert every key."""
        cdef Py_ssize_t old_cap = self._cap, i
        cdef Py_ssize_t cap = KEYS_MIN_CAP if old_cap == 0 else 2 * old_cap
        cdef key_slot_t* old = self._slots
        cdef key_slot_t* slots = <key_slot_t*>calloc(cap, sizeof(key_slot_t))
        if slots == NULL:
            raise MemoryError(f"KeyedTimers cannot grow its key table to {cap} slots")
        self._slots = slots
        self._cap = cap
        self._count = 0
        for i in range(old_cap):
            if old[i].timer_id != 0:
                self._slots[self._insert(old[i].key, old[i].timer_id)].when_s = old[i].when_s
        free(old)
        return 0

    def __repr__(self):
        return f"<KeyedTimers armed={self._count} {self._callback!r}>"

    def __reduce_ex__(self, protocol):
        _refuse_copy(self)  # the pure twin's TypeError, word for word


cdef int64_t _key_due(object keyed, uint64_t token, int64_t last) except? -2:
    """``token_due_t`` of a KeyedTimers: the key's deadline's due ms."""
    cdef KeyedTimers k = <KeyedTimers>keyed
    cdef Py_ssize_t j = k._find(<int64_t>token)
    if j < 0:
        return last
    return k._scheduler._due_ms(k._slots[j].when_s)


cdef inline int64_t _as_key(object key) except? -1:
    """``key`` as an int64: exact ints inline, anything else through ``check_key``."""
    cdef int overflow = 0
    cdef long long k
    if type(key) is int:
        k = _long_as_i64_overflow(key, &overflow)
        if overflow == 0:
            return k
    return check_key(key)

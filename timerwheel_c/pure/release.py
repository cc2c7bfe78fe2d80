"""The pure-Python twin of ``src/_release.pyx``: a deadline release thread.

One release thread, one min-heap of deadlines, level-triggered deadlines (released
once, and a deadline already released stays so), with wake-ups for blocking and
asyncio waiters, sweeps of abandoned deadlines, a ``close()`` that wakes its waiters,
and fork safety. ``docs/DESIGN.md`` ("The release thread") gives the design.

This twin uses ``threading.Thread``, ``heapq`` and ``threading.Condition``; it has the
same API and semantics as the compiled core, minus the GIL freedom. The functions
below mirror the ``.pyx`` one by one; ``_Channel`` and ``_channel_for`` mirror the
compiled asyncio bridge, ``src/_release_asyncio.pxi``. The locking and fork rules at
the top of ``src/_release.pyx`` hold here too, with ``core.lock`` reentrant.

Units: deadlines are int nanoseconds on ``time.monotonic_ns()`` (``*_ns``) or float
seconds on ``time.monotonic()`` (``arm``); timeouts are float seconds.
"""
from __future__ import annotations

import asyncio
import contextlib
import heapq
import os
import threading
import time
import weakref

from .._common import _refuse_copy
from .._release_common import (
    BACKEND_NAMES,
    CONDVAR,
    FAR_AHEAD_NS,
    SLICE,
    SLICE_NS,
    SWEEP_EVERY_NS,
    SWEEP_MIN_HEAP,
    WAIT_CHUNK_NS,
    _await_release,
    _check_at_ns,
    _choose_backend,
    _fallback_future,
    _far_ahead_error,
    _seconds_to_ns,
    _timeout_ns,
)
from ..errors import ReleaseTimerClosed

__all__ = ["Deadline", "ReleaseTimer", "ReleaseTimerClosed", "past_deadline"]

FREE, ARMED, RELEASED, ABANDONED = 0, 1, 2, 3  # slot states

# Bumped in a forked child: a timer created under another epoch belongs to the parent,
# whose release thread does not exist here, so the child must never touch its locks.
_fork_epoch = 0


def _after_fork_in_child() -> None:
    global _fork_epoch
    _fork_epoch += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _lock_if_ours(core: "_Core"):
    """``core.lock``, or for a parent's timer in a forked child nothing: its lock may be held for
    ever by a thread absent here, and no thread here changes it (rule 4)."""
    return core.lock if core.epoch == _fork_epoch else contextlib.nullcontext()


def past_deadline(at) -> Deadline | None:
    """A Deadline already released, if ``at`` (float s on time.monotonic()) has passed, else None.

    Lets the process-wide timer answer past deadlines without starting. Raises as ``arm``.
    """
    at_ns = _seconds_to_ns(at)
    now_ns = time.monotonic_ns()
    if at_ns <= now_ns:
        return _new_deadline(None, -1, 0, at_ns, now_ns)
    return None


# The construction token: Deadline.__new__ refuses to make a Deadline without it, so no
# Deadline exists whose slot is not set (an unset one would fail in every method).
_MAKE = object()


def _new_deadline(rt, slot: int, gen: int, at_ns: int, released_at_ns: int | None) -> Deadline:
    d = Deadline.__new__(Deadline, _MAKE)
    d._rt = rt  # None for a deadline released at arm time (slot -1)
    d._slot = slot
    d._gen = gen
    d._at_ns = at_ns
    d._released_at_ns = released_at_ns
    return d


class Deadline:
    """One armed deadline: level-triggered, released once the clock reaches ``at_ns``.

    ``done()`` is True from its release on; ``wait(timeout)`` blocks; ``await d`` works
    in any asyncio loop. Dropping every reference to a pending Deadline abandons it.
    Made by ``ReleaseTimer.arm``/``arm_ns`` only: direct construction (``Deadline()``,
    ``Deadline.__new__(Deadline)``) raises TypeError. A Deadline owns its slot, so it
    cannot be copied or pickled (TypeError): dropping a copy would abandon the original's
    deadline.
    """

    __slots__ = ("_rt", "_slot", "_gen", "_at_ns", "_released_at_ns")
    _rt: ReleaseTimer  # None only for a deadline released at arm time (slot -1)
    _slot: int
    _gen: int
    _at_ns: int
    _released_at_ns: int | None

    def __new__(cls, token=None, *args, **kwargs):
        if token is not _MAKE:
            raise TypeError("Deadline objects are made by ReleaseTimer.arm() or arm_ns(), not constructed directly")
        return object.__new__(cls)

    @property
    def at_ns(self) -> int:
        """The deadline, int ns on time.monotonic_ns()."""
        return self._at_ns

    @property
    def released_at_ns(self) -> int | None:
        """When the release thread released it (int ns on time.monotonic_ns()), None before."""
        if self._slot < 0:
            return self._released_at_ns
        core = self._rt._core
        if core.epoch != _fork_epoch:  # the parent's timer: its lock may be held by a thread absent here
            return core.released_at[self._slot] if core.state[self._slot] == RELEASED else None
        with core.lock:
            if core.state[self._slot] == RELEASED:
                return core.released_at[self._slot]
        return None

    def done(self) -> bool:
        """True once released, and from then on (level-triggered)."""
        if self._slot < 0:
            return True
        return self._rt._core.state[self._slot] == RELEASED

    def wait(self, timeout: float | None = None) -> bool:
        """Block until released (True) or ``timeout`` seconds pass (False); None waits forever.

        Raises:
            ReleaseTimerClosed: the timer was closed (or belongs to a forked parent) first.
        """
        if self._slot < 0:
            return True
        timeout_ns = _timeout_ns(timeout)
        core = self._rt._core
        if core.epoch != _fork_epoch:
            if core.state[self._slot] == RELEASED:
                return True
            raise ReleaseTimerClosed("the ReleaseTimer belongs to the parent of this forked process")
        until_ns = -1 if timeout_ns < 0 else time.monotonic_ns() + timeout_ns
        with core.lock:
            core.blocking_waiters += 1
            try:
                while core.state[self._slot] == ARMED and not core.closed:
                    now_ns = time.monotonic_ns()
                    if until_ns >= 0 and now_ns >= until_ns:
                        break
                    chunk_ns = WAIT_CHUNK_NS if until_ns < 0 else min(WAIT_CHUNK_NS, until_ns - now_ns)
                    core.released_cond.wait(chunk_ns / 1e9)
            finally:
                core.blocking_waiters -= 1
            state = core.state[self._slot]
            closed = core.closed
        if state == RELEASED:
            return True
        if closed:
            raise ReleaseTimerClosed(f"the ReleaseTimer was closed before the deadline at_ns={self._at_ns}")
        return False

    def __await__(self):
        if self._slot < 0:
            return _await_release(self, None, 0, None).__await__()
        return _await_release(self, *self._rt._subscribe(self, asyncio.get_running_loop())).__await__()

    def __reduce_ex__(self, protocol):
        # copy.copy, copy.deepcopy and pickle all come here
        raise TypeError("Deadline objects cannot be copied or pickled: each owns its slot on the "
                        "ReleaseTimer, and dropping a copy would abandon the original's deadline")

    def __del__(self):
        if self._slot >= 0:
            _abandon(self._rt._core, self._slot, self._gen)

    def __repr__(self) -> str:
        released_at_ns = self.released_at_ns
        state = "pending" if released_at_ns is None else f"released_at_ns={released_at_ns}"
        return f"<Deadline at_ns={self._at_ns} {state} implementation=pure>"


class _Channel:
    """Carries releases from the release thread to one asyncio loop.

    The release thread queues released keys (slot << 32 | generation) and, once per batch,
    schedules ``drain`` on the loop with ``call_soon_threadsafe``; the loop's own thread
    resolves the futures. (The compiled core signals an eventfd or self-pipe instead.) The loop
    is held weakly, as in the compiled core (see ``src/_release_asyncio.pxi``).
    """

    def __init__(self, core: _Core, loop, index: int):
        self.core = core
        self.loop_ref = weakref.ref(loop, self._loop_collected)
        self.index = index
        self.waiters: dict[int, list] = {}  # key (slot << 32 | generation) -> futures
        self.queue: list[int] = []  # released keys, guarded by core.lock
        self.signaled = False  # a drain is scheduled and has not yet taken the queue
        self.dead = False

    def forget(self, key, fut) -> None:
        """Drop a cancelled waiter's future."""
        futs = self.waiters.get(key)
        if futs is not None and fut in futs:
            futs.remove(fut)
            if not futs:
                del self.waiters[key]

    def drain(self) -> None:
        """On the loop's thread: resolve the futures of released deadlines."""
        core = self.core
        with _lock_if_ours(core):
            keys, self.queue = self.queue, []
            self.signaled = False
            closed = core.closed
        for key in keys:
            for fut in self.waiters.pop(key, ()):
                if not fut.done():
                    fut.set_result(None)
        if closed:
            self.fail_all()

    def fail_all(self) -> None:
        """Wake every remaining future with ReleaseTimerClosed (the timer was closed)."""
        waiters, self.waiters = self.waiters, {}
        for futs in waiters.values():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(ReleaseTimerClosed("the ReleaseTimer was closed before the deadline"))

    def notify(self) -> None:
        """Schedule a drain on the loop (release thread or closer, core.lock held)."""
        if self.signaled or self.dead:
            return
        loop = self.loop_ref()
        if loop is None:
            self.dead = True
            return
        self.signaled = True
        try:
            loop.call_soon_threadsafe(self.drain)
        except RuntimeError:  # the loop is closed: nobody is left to wake
            self.dead = True

    def _loop_collected(self, ref) -> None:
        """The weak reference's callback: the loop is gone (collected unclosed), so is this channel."""
        with _lock_if_ours(self.core):
            self.dead = True
            if self.index < len(self.core.chans) and self.core.chans[self.index] is self:
                self.core.chans[self.index] = None


class _Core:
    """The timer's state shared with its thread (the C struct ``Core`` in the compiled twin).

    Guarded by ``lock``: the heap of ``(at_ns, seq, slot)`` (seq makes equal deadlines
    release in arm order), and the slot table, where slot ``i`` carries a state, a
    generation (bumped when the slot is freed, so stale keys never match) and the
    release instant.
    """

    def __init__(self, backend: int):
        self.lock = threading.RLock()  # reentrant: a GC'd Deadline may abandon inside a locked section
        self.wake_cond = threading.Condition(self.lock)  # wakes the release thread
        self.released_cond = threading.Condition(self.lock)  # wakes blocking waiters
        self.backend = backend
        self.closing = False
        self.closed = False
        self.epoch = _fork_epoch
        self.wakes = 0
        self.seq = 0
        self.heap: list[tuple[int, int, int]] = []
        self.state: list[int] = []
        self.gen: list[int] = []
        self.released_at: list[int] = []
        self.chan: list[int] = []
        self.free: list[int] = []
        self.blocking_waiters = 0
        self.last_sweep_ns = 0
        self.chans: list[_Channel | None] = []
        self.thread: threading.Thread | None = None


def _alloc_slot(core: _Core) -> int:
    """A free slot index, armed (core.lock held)."""
    if core.free:
        slot = core.free.pop()
    else:
        slot = len(core.state)
        core.state.append(FREE)
        core.gen.append(0)
        core.released_at.append(0)
        core.chan.append(-1)
    core.state[slot] = ARMED
    core.chan[slot] = -1
    return slot


def _free_slot(core: _Core, slot: int) -> None:
    core.state[slot] = FREE
    core.gen[slot] += 1
    core.free.append(slot)


def _release_due(core: _Core, now_ns: int) -> int:
    """Release every heap entry due at ``now_ns`` (core.lock held); returns how many."""
    heap = core.heap
    released = 0
    notify = set()
    while heap and heap[0][0] <= now_ns:
        slot = heapq.heappop(heap)[2]
        state = core.state[slot]
        if state == ARMED:
            core.state[slot] = RELEASED
            core.released_at[slot] = now_ns
            released += 1
            chan = core.chans[core.chan[slot]] if core.chan[slot] >= 0 else None
            if chan is not None:
                chan.queue.append((slot << 32) | core.gen[slot])
                notify.add(chan)
        elif state == ABANDONED:
            _free_slot(core, slot)
    if released and core.blocking_waiters:
        core.released_cond.notify_all()
    for chan in notify:
        chan.notify()
    return released


def _maybe_sweep(core: _Core, now_ns: int) -> None:
    """Drop abandoned entries once the heap passes SWEEP_MIN_HEAP, at most every SWEEP_EVERY_NS."""
    if len(core.heap) <= SWEEP_MIN_HEAP or now_ns - core.last_sweep_ns < SWEEP_EVERY_NS:
        return
    core.last_sweep_ns = now_ns
    kept = []
    for entry in core.heap:
        if core.state[entry[2]] == ABANDONED:
            _free_slot(core, entry[2])
        else:
            kept.append(entry)
    if len(kept) != len(core.heap):
        heapq.heapify(kept)
        core.heap = kept


def _release_main(core: _Core) -> None:
    """The release thread: release what is due, then sleep until the heap's top.

    Idle, it parks on an untimed wait. With a deadline more than SLICE_NS away it waits
    on the condition in SLICE_NS steps (a nearer arm or close wakes it at once); the last
    step, under SLICE_NS, sleeps exactly the time remaining (a deadline armed during it
    is seen when it ends, so it can be late by at most that step). The condvar backend
    waits on the condition until the top instead. While the heap is large enough to
    sweep, no wait is longer than SWEEP_EVERY_NS.
    """
    with core.lock:
        while not core.closing:
            core.wakes += 1
            now_ns = time.monotonic_ns()
            _release_due(core, now_ns)
            _maybe_sweep(core, now_ns)
            if core.closing:
                break
            if not core.heap:
                core.wake_cond.wait()
                continue
            top_ns = core.heap[0][0]
            remaining_ns = top_ns - time.monotonic_ns()
            if remaining_ns <= 0:
                continue
            if core.backend == CONDVAR or remaining_ns > SLICE_NS:
                step_ns = remaining_ns if core.backend == CONDVAR else SLICE_NS
                if len(core.heap) > SWEEP_MIN_HEAP:
                    step_ns = min(step_ns, SWEEP_EVERY_NS)
                core.wake_cond.wait(step_ns / 1e9)
            else:
                core.lock.release()
                try:
                    time.sleep(remaining_ns / 1e9)
                finally:
                    core.lock.acquire()


def _abandon(core: _Core, slot: int, gen: int) -> None:
    """A Deadline's last reference is gone: free its slot, or leave a mark for the sweep."""
    if core.epoch != _fork_epoch:
        return  # the parent's timer: its lock may be held by a thread absent here
    with core.lock:
        if core.gen[slot] != gen:
            return
        if core.state[slot] == ARMED:
            core.state[slot] = ABANDONED
        elif core.state[slot] == RELEASED:
            _free_slot(core, slot)


class ReleaseTimer:
    """A deadline release thread (pure twin): ``arm`` deadlines, then wait or await them.

    ``ReleaseTimer(backend=None)`` starts its thread. ``backend`` is ``"slice"`` or
    ``"condvar"``, in any case; None reads ``$TIMERWHEEL_C_RELEASE_TIMER`` (slice, with a
    RuntimeWarning, when it names neither), else slice; another name is a ValueError naming it.
    Use it as a context manager or call ``close()``. A subclass may take arguments of its own and
    pass ``backend`` to ``super().__init__``; one whose ``__init__`` does not call the base's runs
    on slice.
    """

    _core: _Core
    _chans: weakref.WeakKeyDictionary  # loop -> _Channel

    def __new__(cls, *args, **kwargs):
        # Any arguments, unread: __new__ gets a subclass constructor's own, and the backend is set
        # by __init__, which a subclass calls as super().__init__(backend=...).
        self = super().__new__(cls)
        self._core = _Core(SLICE)
        self._chans = weakref.WeakKeyDictionary()
        thread = threading.Thread(
            target=_release_main, args=(self._core,), name="timerwheel_c-release", daemon=True
        )
        self._core.thread = thread
        thread.start()
        return self

    def __init__(self, backend: str | None = None):
        chosen = _choose_backend(backend, 3)  # past this __init__'s frame
        core = self._core
        if core.epoch != _fork_epoch:
            core.backend = chosen  # the parent's timer in a forked child: no thread here reads it
            return
        with core.lock:
            core.backend = chosen
            core.wake_cond.notify()  # a wait begun on the other backend ends, and the next reads this one

    @property
    def backend(self) -> str:
        """The backend chosen at construction: ``"slice"`` or ``"condvar"``."""
        return BACKEND_NAMES[self._core.backend]

    @property
    def wakes(self) -> int:
        """Loop iterations of the release thread so far."""
        return self._core.wakes

    @property
    def closed(self) -> bool:
        """True once ``close()`` ran."""
        return self._core.closed

    def pending(self) -> int:
        """The heap's length, abandoned slots not yet swept included."""
        core = self._core
        if core.epoch != _fork_epoch:  # the parent's timer: its lock may be held by a thread absent here
            return len(core.heap)
        with core.lock:
            return len(core.heap)

    def arm(self, at: float) -> Deadline:
        """Arm a deadline at ``at``, float seconds on time.monotonic().

        Raises:
            TypeError: ``at`` is not a real number (or is a bool).
            ValueError: ``at`` is NaN, infinite or out of the int64 ns range, or more than 10
                years ahead (wall-clock seconds from ``time.time()`` by mistake).
            ReleaseTimerClosed: the timer is closed.
        """
        return self.arm_ns(_seconds_to_ns(at))

    def arm_ns(self, at_ns: int) -> Deadline:
        """Arm a deadline at ``at_ns``, int nanoseconds on time.monotonic_ns().

        A deadline already due comes back released, without touching the heap.

        Raises:
            TypeError: ``at_ns`` is not an int (or is a bool).
            ValueError: ``at_ns`` is out of the int64 range, or more than 10 years ahead
                (wall-clock ns from ``time.time_ns()`` by mistake).
            ReleaseTimerClosed: the timer is closed.
        """
        at_ns = _check_at_ns(at_ns)
        core = self._core
        if core.closed or core.epoch != _fork_epoch:
            raise ReleaseTimerClosed("arm on a closed ReleaseTimer")
        now_ns = time.monotonic_ns()
        if at_ns <= now_ns:
            return _new_deadline(None, -1, 0, at_ns, now_ns)
        if at_ns - now_ns > FAR_AHEAD_NS:
            raise ValueError(_far_ahead_error(at_ns, now_ns))
        with core.lock:
            if core.closed:
                raise ReleaseTimerClosed("arm on a closed ReleaseTimer")
            slot = _alloc_slot(core)
            core.seq += 1
            heapq.heappush(core.heap, (at_ns, core.seq, slot))
            if core.heap[0][2] == slot or len(core.heap) == SWEEP_MIN_HEAP + 1:
                # a new top preempts the thread's wait; a heap now big enough to sweep
                # makes it cap its wait at SWEEP_EVERY_NS
                core.wake_cond.notify()
            return _new_deadline(self, slot, core.gen[slot], at_ns, None)

    def close(self) -> None:
        """Stop the thread and wake every pending waiter with ReleaseTimerClosed.

        Returns promptly (the thread's waits are interruptible; its last-step sleeps are
        shorter than SLICE_NS). Called on the release thread itself, it detaches instead
        of joining. Idempotent.
        """
        core = self._core
        if core.epoch != _fork_epoch:
            core.closed = True  # the parent's timer in a forked child: nothing to stop here
            return
        with core.lock:
            if core.closed:
                return
            core.closing = True
            core.closed = True
            core.wake_cond.notify_all()
            core.released_cond.notify_all()
            for chan in core.chans:
                if chan is not None:
                    chan.notify()
        if core.thread is not None and core.thread is not threading.current_thread():
            core.thread.join()

    def __enter__(self) -> ReleaseTimer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __reduce_ex__(self, protocol):
        _refuse_copy(self)

    def __repr__(self):
        state = "closed" if self.closed else f"pending={self.pending()}"
        return f"<ReleaseTimer backend={self.backend} {state} implementation=pure>"

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: modules may be half torn down
            pass

    def _subscribe(self, d: Deadline, loop):
        """Register an asyncio future for ``d`` on ``loop``: (channel, key, future or None)."""
        core = self._core
        if core.epoch != _fork_epoch:
            raise ReleaseTimerClosed("the ReleaseTimer belongs to the parent of this forked process")
        chan = _channel_for(self, loop)
        key = (d._slot << 32) | d._gen
        with core.lock:
            if core.state[d._slot] == RELEASED:
                return chan, key, None
            if core.closed:
                raise ReleaseTimerClosed(f"the ReleaseTimer was closed before the deadline at_ns={d._at_ns}")
            bound = core.chan[d._slot]
            if bound >= 0 and bound != chan.index and core.chans[bound] is not None:
                return chan, key, _fallback_future(d, loop)
            core.chan[d._slot] = chan.index
        fut = loop.create_future()
        chan.waiters.setdefault(key, []).append(fut)
        return chan, key, fut


def _channel_for(rt: ReleaseTimer, loop) -> _Channel:
    """The channel to ``loop``, made on first use; channels of closed loops are reaped."""
    chan = rt._chans.get(loop)
    if chan is not None:
        return chan
    core = rt._core
    with core.lock:
        for old_loop, old in list(rt._chans.items()):
            if old_loop.is_closed():
                old.dead = True
                core.chans[old.index] = None
                del rt._chans[old_loop]
        index = core.chans.index(None) if None in core.chans else len(core.chans)
        chan = _Channel(core, loop, index)
        if index == len(core.chans):
            core.chans.append(chan)
        else:
            core.chans[index] = chan
    rt._chans[loop] = chan
    return chan

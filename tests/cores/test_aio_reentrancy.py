"""WheelScheduler under reentrancy: Python code (callbacks, finalizers, the garbage collector's
callbacks) calling the scheduler while it runs a fire batch or closes, and the collector freeing
a scheduler dropped with handles pending. On the compiled scheduler and its pure twin.

The compiled scheduler keeps handles alive through C references (each wheel entry holds one), so
these tests check every path that takes or drops one: no handle is lost, run twice, leaked, or
freed while referenced (which would crash the process; valgrind runs this file too).
"""
from __future__ import annotations

import asyncio
import gc
import math
import sys
import weakref

import pytest

class _Owner:
    """A connection-like object that holds its scheduler and its own handle: a reference cycle
    through the handle (owner -> scheduler -> handle -> bound method -> owner)."""

    def __init__(self, sched, delay):
        self.sched = sched
        self.handle = sched.call_later(delay, self.on_timeout)

    def on_timeout(self):
        pass


def test_a_dropped_scheduler_with_pending_handles_is_collected(aio_impl):
    """A scheduler dropped with handles pending, its loop closed, is freed by the collector with
    its handles and their callbacks: the wheel's references to them are visible to it. (Checked
    on a weakref to a callback's owner: it dies only if the whole cycle was collected.)"""
    loop = asyncio.new_event_loop()
    sched = aio_impl.WheelScheduler(loop)
    owners = [_Owner(sched, 10.0 + i) for i in range(50)]
    refs = [weakref.ref(o) for o in owners]
    assert sched.active_count() == 50
    del owners, sched
    loop.close()  # drops the loop's wake-up, the last outside reference
    gc.collect()
    assert all(ref() is None for ref in refs)


def test_references_are_released_on_run_cancel_and_close(aio_run, until):
    """Arming takes one reference to a handle, kept while it is pending; running, cancelling and
    close() each give it back (no leak, and never one too many: that would free it early)."""
    async def main(sched, loop):
        handles = [sched.call_later(0.005, lambda: None) for _ in range(3)]
        armed = [sys.getrefcount(h) for h in handles]
        handles[0].cancel()
        await until(lambda: sched.active_count() == 1 or sched.active_count() == 0)
        handles[1].reschedule(10.0)  # handle 1 may have run: re-armed either way
        sched.close()
        after = [sys.getrefcount(h) for h in handles]
        return armed, after
    armed, after = aio_run(main)
    assert [a - b for a, b in zip(armed, after)] == [1, 1, 1]


def test_finalizers_that_call_the_scheduler_during_a_batch(aio_run, until):
    """A callback drops the last reference to an object whose finalizer cancels a peer due in
    the same batch and arms a new handle: the peer does not run, the new handle runs once."""
    async def main(sched, loop):
        log = []
        peers = {}

        class Finalized:
            def __del__(self):
                peers["b"].cancel()
                peers["new"] = sched.call_later(0.002, log.append, "new")

        holder = [Finalized()]
        when = loop.time() + 0.005
        sched.call_at(when, lambda: (log.append("a"), holder.clear()))
        peers["b"] = sched.call_at(when, log.append, "b")
        await until(lambda: "new" in log)
        await asyncio.sleep(0.01)
        return log
    assert aio_run(main) == ["a", "new"]


def test_garbage_collector_callbacks_during_batches(aio_run, until):
    """With a collection at nearly every allocation, a gc callback re-arms and cancels handles
    (its first 300 calls) while batches run and allocate: every handle not cancelled runs, each
    run at or after the deadline it then has, and the scheduler ends empty."""
    async def main(sched, loop):
        runs, cancelled, handles = [], set(), {}
        calls = [0]

        def on_gc(phase, info):
            if phase != "start" or not handles or calls[0] >= 300:
                return
            calls[0] += 1
            k = calls[0] % 40
            h = handles[k]
            if calls[0] % 7 == 0:
                h.cancel()
                cancelled.add(k)
            elif calls[0] % 3 == 0:
                h.reschedule(0.003)  # runs (again) later, unless cancelled

        def fire(k):
            runs.append((k, loop.time(), handles[k].when()))
            [[] for _ in range(5)]  # allocate: collections land inside the batch

        for k in range(40):
            handles[k] = sched.call_later(0.001 * (k % 5), fire, k)
        gc.callbacks.append(on_gc)
        old = gc.get_threshold()
        gc.set_threshold(1, 1, 1)
        try:
            await until(lambda: calls[0] >= 300)
            await until(lambda: sched.active_count() == 0)
        finally:
            gc.set_threshold(*old)
            gc.callbacks.remove(on_gc)
        return runs, cancelled, sched.active_count()
    runs, cancelled, left = aio_run(main)
    assert left == 0
    assert {k for k, _, _ in runs} | cancelled == set(range(40))
    assert all(at >= when for _, at, when in runs)


def test_close_while_finalizers_call_back(aio_run):
    """close() drops every callback; a finalizer that then calls the closed scheduler gets its
    RuntimeError (reported as unraisable), and nothing crashes or runs."""
    async def main(sched, loop):
        log = []
        errors = []

        class Callback:
            def __call__(self):
                log.append("ran")

            def __del__(self):
                try:
                    sched.call_later(0.001, log.append, "late")
                except RuntimeError as exc:
                    errors.append(str(exc))

        for i in range(20):
            sched.call_later(0.001 * i, Callback())
        sched.close()
        await asyncio.sleep(0.03)
        return log, errors
    log, errors = aio_run(main)
    assert log == [] and len(errors) == 20 and all("closed" in e for e in errors)


def test_cancel_and_close_from_callbacks_with_keys_and_handles(aio_run, until):
    """One wake-up runs handles, then keys: a handle's callback cancels a key due in the same
    batch, then a key's callback closes the scheduler; no later key runs (same due time or one
    ms later: keys of one set fire in due order) and the pending handle is cancelled."""
    async def main(sched, loop):
        log = []
        keys = sched.keyed(lambda key: (log.append(("key", key)), sched.close()))
        when = loop.time() + 0.005
        sched.call_at(when, lambda: (log.append("h1"), keys.cancel(1)))
        delay_s = when - loop.time()  # once: each arm counts from its own now, in arming order
        for key, extra_s in ((1, 0.0), (2, 0.0), (3, 0.0), (4, 0.001)):
            keys.arm(key, delay_s + extra_s)
        pending = sched.call_at(when + 10.0, log.append, "h2")
        await until(lambda: len(log) >= 2)
        await asyncio.sleep(0.02)
        return log, pending.cancelled()
    log, pending_cancelled = aio_run(main)
    assert log == ["h1", ("key", 2)] and pending_cancelled


@pytest.mark.parametrize("make", ["handle", "keyed", "timeout"])
def test_objects_not_made_by_the_scheduler_refuse_cleanly(aio_impl, make):
    """A handle, key set or timeout object made directly (bypassing the scheduler) never reaches
    a missing scheduler: it raises TypeError or RuntimeError instead."""
    cls = {"handle": aio_impl.WheelHandle, "keyed": aio_impl.KeyedTimers, "timeout": aio_impl.WheelTimeout}[make]
    with pytest.raises((TypeError, RuntimeError)):
        cls()
    if aio_impl.__name__.endswith("._aio"):
        obj = cls.__new__(cls)
        if make == "handle":
            assert obj.cancelled() and obj.reschedule(1.0) is False
            obj.cancel()
        elif make == "keyed":
            assert len(obj) == 0 and 1 not in obj and obj.cancel(1) is False
            with pytest.raises(RuntimeError, match="keyed"):
                obj.arm(1, 1.0)
        else:
            obj.reschedule(1.0)  # before entry it only stores the delay
            with pytest.raises(RuntimeError):
                obj.__aenter__()
            with pytest.raises(AttributeError):  # it has no scheduler to read the time of (the pure twin's error)
                obj.reschedule_after(1.0)


class _SetClockLoop:
    """A loop whose clock the test sets; the scheduler's wake-ups are kept, not run."""
    def __init__(self, now_s):
        self.now_s = now_s
    def time(self):
        return self.now_s
    def call_at(self, when, callback, *args):
        return _Inert()
    def call_soon(self, callback, *args):
        return _Inert()
    def call_exception_handler(self, context):
        raise AssertionError(context)


class _Inert:
    def cancel(self):
        pass


def test_a_finalizer_that_closes_the_scheduler_while_its_keys_are_refiled(aio_impl, finalizer_in_collection):
    """When the loop's clock goes back below the wheels' origin every key is filed again, and a
    deadline the new origin puts out of range builds an error (Python code: the collector may run).
    A finalizer run there that closes the scheduler freed the compiled key table, which was then
    written through at an index found before (a segfault). Now the scheduler ends closed and empty."""
    loop = _SetClockLoop(10.0)
    sched = aio_impl.WheelScheduler(loop)
    keys = sched.keyed(print)
    keys.arm(1, 4611686018427370.0)  # 8 s inside the wheel's range (2**62 ms): out of it after the step back
    keys.arm(2, 1.0)
    loop.now_s = -10.0
    with finalizer_in_collection(sched.close):
        sched._on_wake()
    gc.collect()
    assert len(keys) == 0 and 2 not in keys


@pytest.mark.parametrize("reading", [math.nan, -math.inf])
def test_a_nan_loop_clock_fails_that_wake_up_and_leaves_the_scheduler_working(aio_impl, reading):
    """A loop clock that reads NaN or -inf once fails that wake-up (ValueError or OverflowError), on
    both twins. The compiled scheduler read it as the bottom of its range and moved its wheels'
    origin there for good: every later deadline was "beyond the wheel's range". Now, once the clock
    reads a time again, timers arm and run at their deadlines."""
    loop = _SetClockLoop(100.0)
    sched = aio_impl.WheelScheduler(loop)
    fired = []
    sched.call_later(0.5, fired.append, "before")
    loop.now_s = reading
    with pytest.raises((ValueError, OverflowError)):
        sched._on_wake()
    loop.now_s = 101.0
    sched.call_later(1.0, fired.append, "after")
    sched._on_wake()
    assert fired == ["before"]
    loop.now_s = 102.1
    sched._on_wake()
    assert fired == ["before", "after"]

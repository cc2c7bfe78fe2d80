"""KeyedTimers (``WheelScheduler.keyed``): timers named by int keys, on the compiled scheduler and
its pure twin, on the default loop and uvloop.

Timing properties are "not before the deadline" (by the loop clock and in real time) and "within
a generous liveness bound"; no test asserts how late a key fired.
"""
from __future__ import annotations

import asyncio
import contextvars
import gc
import random
import time

import pytest

LIVENESS_S = 5.0  # seconds: the liveness bound of the conftest's `until`

def test_arm_cancel_when_contains_len(aio_run, until):
    """arm() arms or re-arms one timer per key; cancel() says whether it disarmed one; when(),
    ``in`` and len() report the armed keys; a cancelled key never fires."""
    async def main(sched, loop):
        fired = []
        keys = sched.keyed(fired.append)
        before = loop.time()
        keys.arm(7, 0.02)
        keys.arm(-3, 10.0)
        keys.arm(2**63 - 1, 10.0)
        keys.arm(-(2**63), 10.0)
        keys.arm(7, 0.03)  # re-arm in place: still one timer for 7
        assert len(keys) == 4 and 7 in keys and 8 not in keys
        assert before + 0.03 <= keys.when(7) <= loop.time() + 0.03
        assert keys.when(8) is None
        assert keys.cancel(-3) is True and keys.cancel(-3) is False and -3 not in keys
        await until(lambda: fired)
        await asyncio.sleep(0.02)
        assert 7 not in keys and keys.when(7) is None and len(keys) == 2
        return fired
    assert aio_run(main) == [7]


def test_keys_fire_in_due_order_ties_in_arming_order(aio_run, until):
    """Keys due at one ms fire in arming order; earlier due times first. A key re-armed to a later
    time may keep its place among them (the wheel defers that re-arm), and still fires after the
    keys armed before it. Deterministic: 80 ms separates the two groups, and every key of a group
    is armed with the same delay, so each later arm's due time (its own clock read plus the delay)
    is never earlier than the one before it, however long the machine stalls between two arms."""
    async def main(sched, loop):
        fired = []
        keys = sched.keyed(fired.append)
        for k in [5, 1, 4, 2, 3]:
            keys.arm(k, 0.1)
        keys.arm(1, 0.1)  # re-armed last, to a due time no earlier than before
        for k in [10, 11]:
            keys.arm(k, 0.02)
        await until(lambda: len(fired) == 7)
        return fired
    fired = aio_run(main)
    assert fired[:2] == [10, 11]
    # 5, 4, 2, 3 kept their arming order. Their due ms may differ (each arm reads the clock), but
    # only upwards in arming order: due order first, then arming order.
    assert [k for k in fired[2:] if k != 1] == [5, 4, 2, 3]
    assert fired.index(1) > fired.index(5)


def test_never_before_the_delay(aio_run, until):
    """200 keys with random delays, some re-armed, fire no sooner than their delay after a stamp
    taken before arm(), on time.monotonic() (so uvloop's lagging clock is covered by the slack)
    and at or after when() on the loop clock."""
    rng = random.Random(11)
    async def main(sched, loop):
        elapsed, delays, whens, starts = {}, {}, {}, {}
        def fire(key):
            elapsed[key] = (time.monotonic() - starts[key], loop.time())
        keys = sched.keyed(fire)
        for k in range(200):
            delays[k] = rng.uniform(0.0, 0.05)
            starts[k] = time.monotonic()
            keys.arm(k, delays[k])
            whens[k] = keys.when(k)
            if rng.random() < 0.2:
                await asyncio.sleep(rng.uniform(0, 0.003))
        await until(lambda: len(elapsed) == 200)
        return elapsed, delays, whens
    elapsed, delays, whens = aio_run(main)
    for k, delay in delays.items():
        real_s, loop_s = elapsed[k]
        assert delay <= real_s < delay + LIVENESS_S, (k, delay, real_s)
        assert loop_s >= whens[k]


def test_callback_runs_in_the_context_captured_by_keyed(aio_run, until):
    """callback(key) runs in the context copied when keyed() was called, or the one given."""
    var = contextvars.ContextVar("var", default="unset")
    async def main(sched, loop):
        seen = {}
        var.set("at keyed()")
        copied = sched.keyed(lambda key: seen.setdefault(("copied", key), var.get()))
        given = contextvars.Context()
        given.run(var.set, "given")
        explicit = sched.keyed(lambda key: seen.setdefault(("given", key), var.get()), context=given)
        var.set("changed later")
        copied.arm(1, 0.001)
        explicit.arm(2, 0.001)
        await until(lambda: len(seen) == 2)
        return seen
    assert aio_run(main) == {("copied", 1): "at keyed()", ("given", 2): "given"}


def test_reentrancy_from_callbacks(aio_run, until):
    """Keys due together (in one batch, unless a clock tick falls between two arms): the first
    callback cancels a peer (it never fires), re-arms another (it fires once, later) and arms a
    new key; another re-arms itself (it fires twice, the second time 5 ms on). Which batch each
    lands in may vary; these outcomes may not. (The hand-cranked differential test covers the
    same moves with every peer in one batch, deterministically.)"""
    async def main(sched, loop):
        log = []
        def fire(key):
            log.append((key, loop.time()))
            if key == 1:
                assert keys.cancel(2) is True
                keys.arm(3, 0.03)
                keys.arm(9, 0.001)
            if key == 4 and sum(1 for k, _ in log if k == 4) == 1:
                keys.arm(4, 0.005)
        keys = sched.keyed(fire)
        for k in (1, 2, 3, 4, 5):
            keys.arm(k, 0.01)
        await until(lambda: len(log) == 6)
        await asyncio.sleep(0.05)
        return log, keys
    log, keys = aio_run(main)
    order = [k for k, _ in log]
    assert order[0] == 1 and sorted(order) == [1, 3, 4, 4, 5, 9] and len(keys) == 0
    fours = [at for k, at in log if k == 4]
    assert fours[1] >= fours[0] + 0.005


def test_close_from_a_callback_stops_the_batch(aio_run, until):
    """close() from a callback: the rest of the batch does not fire, the set is emptied, and
    arming afterwards raises RuntimeError; no error reaches the loop's handler."""
    async def main(sched, loop):
        errors, log = [], []
        loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        def fire(key):
            log.append(key)
            sched.close()
        keys = sched.keyed(fire)
        for k in range(5):
            keys.arm(k, 0.005)  # one delay: due times never decrease in arming order
        await until(lambda: log)
        await asyncio.sleep(0.02)
        with pytest.raises(RuntimeError, match="closed"):
            keys.arm(1, 0.01)
        with pytest.raises(RuntimeError, match="closed"):
            sched.keyed(print)
        return log, errors, len(keys), keys.cancel(3)
    log, errors, armed, cancelled = aio_run(main)
    assert log == [0] and errors == [] and armed == 0 and cancelled is False


def test_exceptions_go_to_the_loop_handler(aio_run, until):
    """A raising callback reaches loop.call_exception_handler, and the batch goes on."""
    async def main(sched, loop):
        errors, log = [], []
        loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        def fire(key):
            log.append(key)
            if key == 1:
                raise ZeroDivisionError(key)
        keys = sched.keyed(fire)
        for k in (1, 2):
            keys.arm(k, 0.005)
        await until(lambda: len(log) == 2)
        return errors
    errors = aio_run(main)
    assert len(errors) == 1 and isinstance(errors[0]["exception"], ZeroDivisionError)
    assert errors[0]["message"].startswith("Exception in callback")


class _ArmingClockLoop(asyncio.SelectorEventLoop):
    """The default loop whose clock can be held still while timers are armed (``hold``), so they
    share one due ms, and so one fire batch, however slow the machine."""

    held = None

    def time(self):
        return super().time() if self.held is None else self.held


def test_keyboard_interrupt_loses_no_key(aio_impl, until):
    """A KeyboardInterrupt escaping a callback propagates; the keys due in the same batch fire
    afterwards, in order. Default loop only; the four keys are armed on a held clock, so they
    share one due ms and one batch (a batch split by a ms boundary would order them otherwise)."""
    loop = _ArmingClockLoop()
    try:
        sched = aio_impl.WheelScheduler(loop)
        log = []
        def fire(key):
            log.append(key)
            if key == 0:
                raise KeyboardInterrupt
        keys = sched.keyed(fire)
        loop.held = loop.time()
        for k in range(4):
            keys.arm(k, 0.005)
        loop.held = None
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(asyncio.sleep(1.0))
        assert log == [0] and len(keys) == 3
        async def wait():
            await until(lambda: len(log) == 4)
        loop.run_until_complete(wait())
        assert log == [0, 1, 2, 3]
        sched.close()
    finally:
        loop.close()


@pytest.mark.parametrize("key, exc, match", [
    (1.0, TypeError, "key"), ("1", TypeError, "key"), (None, TypeError, "key"), (True, TypeError, "key"),
    (2**63, ValueError, "9223372036854775808"), (-(2**63) - 1, ValueError, "-9223372036854775809"),
])
def test_bad_key_is_refused(aio_run, key, exc, match):
    """A key that is not an int in [-2**63, 2**63) is refused naming it, by every method."""
    async def main(sched, loop):
        keys = sched.keyed(print)
        for call in (lambda: keys.arm(key, 1.0), lambda: keys.cancel(key), lambda: keys.when(key),
                     lambda: key in keys):
            with pytest.raises(exc, match=match):
                call()
        return len(keys)
    assert aio_run(main) == 0


@pytest.mark.parametrize("delay, exc", [
    ("1", TypeError), (None, TypeError), (True, TypeError), (float("nan"), ValueError),
    (float("inf"), ValueError), (1e300, ValueError), (10**400, ValueError),
])
def test_bad_delay_is_refused(aio_run, delay, exc):
    """A delay that is not a finite real number of seconds in the wheel's range is refused
    naming it, and nothing is armed."""
    async def main(sched, loop):
        keys = sched.keyed(print)
        with pytest.raises(exc, match="delay|range"):
            keys.arm(1, delay)
        return len(keys)
    assert aio_run(main) == 0


def test_bad_callback_is_refused(aio_run):
    async def main(sched, loop):
        async def coro(key):
            pass
        with pytest.raises(TypeError, match="callable"):
            sched.keyed(42)
        with pytest.raises(TypeError, match="coroutine"):
            sched.keyed(coro)
        return True
    assert aio_run(main)


def test_many_keys_grow_and_shrink_the_table(aio_run, until):
    """5000 keys (dense, strided and negative) armed, a third cancelled, the rest re-armed:
    every lookup stays right through the table's growth and its deletions, and exactly the
    armed keys fire."""
    async def main(sched, loop):
        fired = []
        keys = sched.keyed(fired.append)
        universe = list(range(2000)) + [k * 65536 for k in range(1, 1500)] + [-k for k in range(1, 1502)]
        for k in universe:
            keys.arm(k, 0.02)
        cancelled = set(universe[::3])
        for k in cancelled:
            assert keys.cancel(k)
        live = [k for k in universe if k not in cancelled]
        assert len(keys) == len(live) and all(k in keys for k in live)
        assert not any(k in keys for k in cancelled)
        for k in live:
            keys.arm(k, 0.03)
        await until(lambda: len(fired) == len(live))
        await asyncio.sleep(0.01)
        return fired, live
    fired, live = aio_run(main)
    assert sorted(fired) == sorted(live)


def test_a_dense_range_of_keys_cancels_and_fires_within_the_liveness_bound(aio_run, aio_impl, until):
    """300,000 consecutive keys (connection ids, file descriptors), half of them cancelled and the
    rest re-armed due at once: every one left fires, once, and no cancelled one does, within the
    liveness bound. The compiled table put consecutive keys in consecutive slots, one run as long as
    the range, which each removal walked to its end: 0.1 ms a cancel, and 20 s to fire 200,000
    keys with the loop blocked (the pure twin's dict: 0.3 s). The pure twin, whose dict has no runs,
    takes 60,000 keys: 300,000 cost it 1.6 s of CPU, the compiled twin 0.2 s."""
    pure = aio_impl.__name__.startswith("timerwheel_c.pure")
    n = 60_000 if pure else 300_000
    bound_s = LIVENESS_S * 2

    async def main(sched, loop):
        fired = []
        keys = sched.keyed(fired.append)
        for k in range(n):
            keys.arm(k, 30.0)
        for k in range(0, n, 2):
            assert keys.cancel(k) is True
        assert len(keys) == n // 2 and (n + 1) not in keys and (3 * n) not in keys
        for k in range(1, n, 2):
            keys.arm(k, 0.0)
        await until(lambda: len(fired) >= n // 2, timeout_s=bound_s)
        await asyncio.sleep(0.01)
        return fired
    fired = aio_run(main, timeout_s=bound_s)
    assert sorted(fired) == list(range(1, n, 2))


@pytest.mark.parametrize("shift", [0, 48])
def test_keys_that_differ_only_in_their_high_bits_arm_and_fire(aio_run, until, shift):
    """60,000 keys ``i << shift`` (negative ones too): each is armed, found and fired once, within
    the liveness bound. A multiplicative hash alone keeps a key's low zero bits, so such keys shared
    one home slot and arming them was quadratic (50,000 keys << 48 took 4 s)."""
    n = 60_000
    wanted = [(i - n // 2) << shift for i in range(n)]

    async def main(sched, loop):
        fired = []
        keys = sched.keyed(fired.append)
        for key in wanted:
            keys.arm(key, 0.0)
        assert len(keys) == n and all(key in keys for key in wanted[::97])
        await until(lambda: len(fired) >= n)
        return fired
    assert sorted(aio_run(main)) == sorted(wanted)


def _live_sets(cls):
    """How many objects of the KeyedTimers class ``cls`` are alive, after a full collection."""
    gc.collect()
    return sum(1 for obj in gc.get_objects() if type(obj) is cls)


def test_a_set_dropped_with_no_key_armed_is_freed(aio_run, until):
    """A set whose owner drops it with no key armed is freed, not kept by its scheduler until the
    scheduler closes: a server that makes a set per client or per request (armed, cancelled or
    fired, then dropped) would otherwise keep every set it ever made, each with its wheel's slot
    tables (17.5 kB), and walk them all at every wake-up (100,000 such sets took 2 GB). Bounded
    with a generous margin: 2,000 sets made, at most 20 left. They are made 100 at a time, and
    dropped once every timer of the 100 has fired, so that the run waits for 20 wake-ups, not
    1,000."""
    async def main(sched, loop):
        fired = []
        cls = type(sched.keyed(fired.append))
        before = _live_sets(cls)
        for first in range(0, 2_000, 100):
            sets = []
            for i in range(first, first + 100):
                keys = sched.keyed(fired.append)
                keys.arm(i, 3600.0)              # far: its wheel slot is never reached
                if i % 2:
                    assert keys.cancel(i)
                else:
                    keys.arm(i, 0.0)             # fires at the next ms
                sets.append(keys)
            await until(lambda n=first // 2 + 50: len(fired) == n)
            del sets, keys
        after = _live_sets(cls)
        return before, after, len(fired)
    before, after, n_fired = aio_run(main)
    assert n_fired == 1_000
    assert after - before <= 20, (before, after)


def test_a_set_dropped_with_keys_armed_still_fires_them_then_is_freed(aio_run, until):
    """Dropping a set does not disarm it (as dropping asyncio's TimerHandle does not cancel it): its
    armed keys fire, in order; once the last has fired it is freed."""
    async def main(sched, loop):
        fired = []
        keys = sched.keyed(fired.append)
        cls = type(keys)
        keys.arm(1, 0.01)
        keys.arm(2, 0.02)
        del keys
        gc.collect()
        assert _live_sets(cls) >= 1
        await until(lambda: len(fired) == 2)
        await asyncio.sleep(0)
        return fired, _live_sets(cls)
    fired, live = aio_run(main)
    assert fired == [1, 2] and live == 0

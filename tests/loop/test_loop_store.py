"""The event loop's timer store, driven directly on a fake clock: the compiled core and its pure
twin agree with each other and with a model of asyncio's rule, under hypothesis-generated arm /
cancel / clock-step sequences; and a batch survives Python code run while it is handed over.

The clock is a fake loop's ``time()`` (no real time passes), so the properties are exact: each
iteration moves exactly the timers whose deadline is at or before ``loop.time()`` (never one
whose deadline is after it), in deadline order with ties in scheduling order, and both twins return the same
batches, the same selector timeouts and the same counts.
"""
from __future__ import annotations

import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import timerwheel_c._loop as c_loop
import timerwheel_c.pure.loop as pure_loop
from timerwheel_c._loop_common import loop_ms
from fake_loop import FakeLoop


ops = st.lists(st.one_of(
    st.tuples(st.just("arm"), st.integers(-3_000, 40_000)),      # delay in us
    st.tuples(st.just("cancel"), st.integers(0, 10_000)),         # index among armed handles
    st.tuples(st.just("step"), st.integers(0, 12_000)),           # clock step in us, then an iteration
), max_size=150)


@pytest.mark.c_extension
@settings(max_examples=300, deadline=None)
@given(start_us=st.integers(1_000_000, 10**12), script=ops)
def test_twins_agree_with_each_other_and_with_the_model(start_us, script):
    stores = []
    for core in (c_loop, pure_loop):
        loop = FakeLoop(start_us / 1e6)
        stores.append((loop, core.LoopTimers(loop)))
    handles = [[], []]
    # The model: armed timers as seq -> deadline. An iteration moves every one whose deadline is at
    # or before loop.time(), as asyncio's _run_once does, in deadline order, ties in arming order.
    model = {}
    seq = 0
    for op, arg in script:
        now_s = stores[0][0].now_s
        if op == "arm":
            when = now_s + arg / 1e6
            for k, (_, timers) in enumerate(stores):
                handles[k].append(timers.call_at(when, print, seq))
            model[seq] = when
            seq += 1
        elif op == "cancel" and handles[0]:
            i = arg % len(handles[0])
            for k in range(2):
                handles[k][i].cancel()
            model.pop(i, None)  # handle i has seq i; a moved one is no longer in the model
        elif op == "step":
            timeouts = [timers.select_timeout(False) for _, timers in stores]
            assert timeouts[0] == timeouts[1]
            if model:
                # The selector's wait ends by the end of the earliest deadline's ms, never beyond it.
                earliest = min(model.values())
                assert now_s + timeouts[0] <= (loop_ms(earliest) + 1) / 1000.0 + 1e-9 or timeouts[0] == 0
            for loop, _ in stores:
                loop.now_s = now_s + arg / 1e6
            now_s = stores[0][0].now_s
            batches = []
            for _, timers in stores:
                ready = collections.deque()
                timers.move_due(ready)
                batches.append([h._args[0] for h in ready])
            assert batches[0] == batches[1]
            due = sorted((w, s) for s, w in model.items() if w <= now_s)
            assert batches[0] == [s for _, s in due]
            for _, s in due:
                del model[s]
        assert stores[0][1].active_count() == stores[1][1].active_count() == len(model)


def test_a_batch_survives_code_that_cancels_arms_and_fails_while_it_is_handed_over(loop_impl):
    """While due handles are appended to the ready queue, the append (here a list subclass; in a
    real loop, a finalizer the collector runs) cancels a handle of the same batch, arms a new
    timer already due, then fails. The handles appended stay appended, the cancelled one is
    dropped, the others are put back and, with the new timer, come due next, in deadline order."""
    loop = FakeLoop(1000.0)
    timers = loop_impl.LoopTimers(loop)
    handles = [timers.call_at(1000.001 + i * 1e-4, print, i) for i in range(6)]

    class Ready(list):
        def append(self, handle):
            if len(self) == 1:
                handles[3].cancel()
                timers.call_at(999.0, print, "new")
            if len(self) == 2:
                raise MemoryError("append failed")
            super().append(handle)

    loop.now_s = 1000.01
    ready = Ready()
    with pytest.raises(MemoryError, match="append failed"):
        timers.move_due(ready)
    assert [h._args[0] for h in ready] == [0, 1]
    assert timers.active_count() == 4  # 2, 4, 5 put back, and the new one
    loop.now_s = 1000.02
    again = collections.deque()
    assert timers.move_due(again) == 4
    assert [h._args[0] for h in again] == ["new", 2, 4, 5]
    assert handles[3].cancelled() and timers.active_count() == 0


def test_the_store_and_its_handles_refuse_copy_and_pickle(loop_impl):
    """copy.copy, copy.deepcopy and pickle of the store or of an armed handle raise TypeError in
    both twins (a copy would share the original's timers), and the original still works."""
    import copy
    import pickle

    loop = FakeLoop(1000.0)
    timers = loop_impl.LoopTimers(loop)
    handle = timers.call_at(1000.5, print, 1)
    for obj in (timers, handle):
        for clone in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError):
                clone(obj)
    loop.now_s = 1001.0
    ready = collections.deque()
    assert timers.move_due(ready) == 1 and ready[0] is handle


def _held_by(root, depth: int) -> set:
    """The ids of what the collector reaches from ``root`` in ``depth`` steps of tp_traverse."""
    import gc

    seen, frontier = set(), [root]
    for _ in range(depth):
        frontier = [r for obj in frontier for r in gc.get_referents(obj) if id(r) not in seen]
        seen.update(id(r) for r in frontier)
    return seen


def test_the_collector_sees_each_armed_handle_and_no_other(loop_impl):
    """What the collector traverses from the store reaches every armed handle (so a loop dropped
    unclosed with timers pending is collected) and none that was cancelled, moved to the ready
    queue or dropped by close(): the store holds no other handle. The clock is fake and the loop
    is a plain object, so nothing else can hold or reach a handle."""
    loop = FakeLoop(1000.0)
    timers = loop_impl.LoopTimers(loop)
    handles = [timers.call_at(1000.001 + i, print, i) for i in range(4)]
    assert {id(h) for h in handles} <= _held_by(timers, 3)
    handles[1].cancel()
    loop.now_s = 1000.5
    ready = collections.deque()
    assert timers.move_due(ready) == 1 and ready[0] is handles[0]
    held = _held_by(timers, 3)
    assert id(handles[2]) in held and id(handles[3]) in held
    assert id(handles[0]) not in held and id(handles[1]) not in held
    timers.close()
    assert not {id(h) for h in handles} & _held_by(timers, 3)


@pytest.mark.parametrize("finalizer", ["close", "arm", "cancel"])
def test_the_scheduled_list_survives_a_finalizer_that_runs_while_it_is_made(loop_impl, finalizer,
                                                                             finalizer_in_collection):
    """``scheduled()`` (what ``loop._scheduled`` reads) makes a list, and making it may run the cyclic
    collector, whose finalizers may close the store, arm or cancel. The compiled store read its
    handles at indexes found before that list was made, past the end of a list the close had
    emptied (a segfault). Now the list holds the handles armed before the finalizer ran or those
    armed after it (when the collector runs differs between the twins), each once, in due order."""
    loop = FakeLoop(1000.0)
    timers = loop_impl.LoopTimers(loop)
    handles = [timers.call_at(1010.0 + i, print, i) for i in range(2000)]
    added = []

    def call():
        if finalizer == "close":
            timers.close()
        elif finalizer == "arm":
            added.append(timers.call_at(1005.0, print, "new"))
        else:
            handles[0].cancel()

    with finalizer_in_collection(call):
        scheduled = timers.scheduled()
    after = {"close": [], "arm": added + handles, "cancel": handles[1:]}[finalizer]
    assert [id(h) for h in scheduled] in ([id(h) for h in handles], [id(h) for h in after])
    assert [id(h) for h in timers.scheduled()] == [id(h) for h in after]

"""The bench's loop and http workloads run and report every figure; no speed is asserted.

The loop workload runs tiny (1,000 timers); the aiohttp one needs aiohttp and wrk and is slow,
so it skips without them and runs only in the full run.
"""
from __future__ import annotations

import gc
import importlib.util
import shutil
import sys

import pytest

from bench import http, loop


@pytest.mark.c_extension
def test_loop_workload_measures_every_operation_on_every_loop():
    """Each loop the bench finds reports a positive cost for every operation it has, and the goals
    are judged on EventLoop against the default loop."""
    done = []
    results = loop.run(1000, 1, progress=done.append)
    assert set(results) == set(loop.loop_factories()) and "EventLoop" in results
    for name, fig in results.items():
        assert fig["call_later+cancel"]["median_ns_per_op"] > 0 and fig["wait_for"]["median_ns_per_op"] > 0, name
    assert sum(done) == 2 * len(results)
    verdicts = [goal.judge(value) for goal, value in loop.goals({"results": results})]
    assert {v["name"] for v in verdicts} >= {"asyncio / EventLoop, random re-arm", "asyncio / EventLoop, wait_for"}
    assert all(v["measured"] is not None for v in verdicts if "asyncio /" in v["name"] and "timeout" not in v["name"])


@pytest.mark.c_extension
def test_loop_workload_measures_the_floors_on_eventloop_and_restores_its_call_at():
    """The floors (the same code with no timer work) are measured on EventLoop only, each gives
    the default loop's cost over it, and the timeout floor's stand-in call_at is gone afterwards:
    the loop's own method arms timers again."""
    import asyncio

    bench = loop._Loop(loop.loop_factories()["EventLoop"](), 100, 1, floors=True)
    try:
        bench.round(keep=True)
        assert "call_at" not in bench.loop.__dict__
        handle = bench.loop.call_at(bench.loop.time() + 30.0, lambda: None)
        assert type(handle).__name__ == "TimerHandle" and len(bench.loop._scheduled) == 101
        handle.cancel()
    finally:
        stats = bench.close()
    expected = {"re-arm floor"} | ({"timeout floor"} if hasattr(asyncio, "timeout") else set())
    assert expected <= set(stats) and all(stats[f]["median_ns_per_op"] > 0 for f in expected)
    results = loop.run(200, 1)
    assert not {"re-arm floor", "timeout floor"} & set(results["asyncio"])
    assert set(loop.ceilings(results)) == {op for op, f in loop.FLOORS.items() if f in expected}


@pytest.mark.c_extension
@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout, the floor's code, is 3.11+")
def test_timeout_floor_sets_nothing_on_the_loop_object():
    """The timeout floor stands its call_at in on the loop's class, never on the loop object: a name
    set there joins the keys its class's instances share (CPython 3.11+ keeps them), and asyncio's
    own ``loop.call_at`` lookups on that class went unspecialized in every later round. A subclass
    records every attribute set on the object, so the test fails if the floor sets one; it checks
    first that the floor phase ran, and that the class is as before afterwards."""
    from timerwheel_c.aio import EventLoop

    set_names = []

    class Recording(EventLoop):
        def __setattr__(self, name, value):
            set_names.append(name)
            super().__setattr__(name, value)

    bench = loop._Loop(Recording(), 100, 1, floors=True)
    try:
        set_names.clear()
        bench.round(keep=True)
        assert "call_at" not in set_names and "call_at" not in bench.loop.__dict__
        assert "call_at" not in Recording.__dict__ and bench.loop.call_at.__name__ == "call_at"
        assert bench.samples["timeout floor"]  # the floor phase ran
    finally:
        bench.close()


def test_each_async_phase_pays_for_the_default_loops_removal_of_its_own_cancelled_handles():
    """asyncio's default loop removes its cancelled handles in one pass over its heap once they
    outnumber the live ones. Each async phase must hold one such pass of its own handles, and the
    synchronous phases' pass must fall outside every timed window: before, the ``timeout`` phase never
    let the loop run (its pass fell later), and ``wait_for``'s first iteration paid for every earlier
    phase's. A subclass of the default loop notes, for each iteration that shrank its heap by more
    than half the timers armed, the phase that had yielded to it."""
    import asyncio

    n, passes, phase = 100, [], [None]

    class Noting(type(asyncio.new_event_loop())):  # type: ignore[misc]
        def _run_once(self):
            before, running = len(self._scheduled), phase[0]  # the pass comes first, then the callbacks
            super()._run_once()
            if before - len(self._scheduled) > n // 2:
                passes.append(running)

    bench = loop._Loop(Noting(), n, 1)
    timed = bench.async_timed

    async def noted(kind):
        phase[0] = kind
        try:
            return await timed(kind)
        finally:
            phase[0] = None

    bench.async_timed = noted  # type: ignore[method-assign]
    try:
        bench.round(keep=True)
    finally:
        bench.close()
    phases = ["timeout", "wait_for"] if hasattr(asyncio, "timeout") else ["wait_for"]
    assert passes == ([None] + phases) * 2, passes


def _holds_dict_object(loop_object) -> bool:
    """True if ``loop_object``'s attributes live in a dict object (the collector sees it), not inline."""
    return any(type(r) is dict and "_ready" in r for r in gc.get_referents(loop_object))


@pytest.mark.skipif(sys.version_info < (3, 11), reason="attributes are kept inline from CPython 3.11 on")
def test_a_round_leaves_the_default_loops_attributes_inline():
    """A round reads no loop object's ``__dict__``: on CPython 3.11+ that read moves the default loop's
    attributes from inline values into a dict, and asyncio's own code on that loop then costs 13%
    more, so every goal's ratio flattered EventLoop. The loop starts with its attributes inline
    (checked, so the test cannot pass vacuously) and must end so."""
    import asyncio

    bench = loop._Loop(asyncio.new_event_loop(), 100, 1)
    try:
        assert not _holds_dict_object(bench.loop)
        bench.round(keep=True)
        assert bench.samples["wait_for"]  # the async phases ran
        assert not _holds_dict_object(bench.loop)
    finally:
        bench.close()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("wrk") is None or importlib.util.find_spec("aiohttp") is None,
                    reason="the http workload needs aiohttp and the wrk binary")
def test_http_workload_serves_requests_on_every_loop():
    """aiohttp on each loop answers wrk's keep-alive requests: positive requests/s and CPU per request."""
    results = http.run(connections=16, seconds=1.0, repeats=1)
    assert set(results) == set(http.loops())
    for name, fig in results.items():
        assert fig["requests_per_s"] > 0 and fig["cpu_ns_per_request"] > 0, name
    assert http.goals({"results": results})

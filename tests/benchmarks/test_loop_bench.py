"""The bench's loop and http workloads run and report every figure; no speed is asserted.

The loop workload runs tiny (1,000 timers); the aiohttp one needs aiohttp and wrk and is slow,
so it skips without them and runs only in the full run.
"""
from __future__ import annotations

import importlib.util
import shutil

import pytest

from bench import http, loop


@pytest.mark.c_extension
def test_loop_workload_measures_every_operation_on_every_loop():
    """Each loop the bench finds reports a positive cost for every operation it has, and the goals
    are judged on EventLoop against the default loop."""
    done = []
    results = loop.run(1000, 200, 1, progress=done.append)
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

    bench = loop._Loop(loop.loop_factories()["EventLoop"](), 100, 50, 1, floors=True)
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
    results = loop.run(200, 50, 1)
    assert not {"re-arm floor", "timeout floor"} & set(results["asyncio"])
    assert set(loop.ceilings(results)) == {op for op, f in loop.FLOORS.items() if f in expected}


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

"""The loopback load benchmark (bench/network.py) runs end to end, small.

It asserts the shape of the figures and the properties that hold on any machine: no
idle close before its deadline (server loop clock), every silent connection closed
within the drain bound, progress adding up. It asserts no speed or lateness number.
"""
from __future__ import annotations

import pytest

from bench import network

KEYS = {"requests_per_s", "latency_us", "cpu_ns_per_request", "idle_closes_expected",
        "idle_closes_fired", "idle_close_lateness_ms", "early_closes"}


@pytest.mark.slow
def test_small_run_reports_every_scheduler_and_no_early_close():
    """40 connections for 1 s at a 100 ms idle timeout, per scheduler: some connections fall
    silent (the situation arose), each is closed by the server, none before its deadline;
    progress sums to 100 units per scheduler."""
    done = []
    results = network.run(connections=40, seconds=1.0, idle_timeout_ms=100, progress=done.append)
    assert list(results) == network.scheduler_names()
    assert sum(done) == network.UNITS_PER_SCHEDULER * len(results)
    for name, r in results.items():
        assert KEYS <= set(r), name
        assert r["idle_closes_expected"] > 0, name
        assert r["idle_closes_fired"] >= r["idle_closes_expected"], (name, r)
        assert r["early_closes"] == 0 and min(r["idle_close_lateness_ms"]) >= 0, name
        assert r["requests_per_s"] > 0 and r["latency_us"] and r["cpu_ns_per_request"] > 0, name


@pytest.mark.parametrize("kwargs, exc", [
    ({"connections": 0}, ValueError), ({"connections": 1.5}, TypeError),
    ({"seconds": 0}, ValueError), ({"seconds": float("nan")}, ValueError),
    ({"seconds": "1"}, TypeError), ({"idle_timeout_ms": 0}, ValueError),
    ({"idle_timeout_ms": True}, TypeError), ({"connections": 10**6}, ValueError),
])
def test_bad_arguments_are_refused(kwargs, exc):
    """Bad arguments are refused with an exception naming them, before any process starts."""
    with pytest.raises(exc, match="connections|seconds|idle_timeout_ms"):
        network.run(**kwargs)

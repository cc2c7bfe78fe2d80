"""The asyncio layer's benchmarks (bench/aio_micro.py and bench/echo.py) run end to end, small.

They assert the shape of the figures and the properties that hold on any machine (every idle
close fired and none before its deadline on the server's loop clock); never a speed.
"""
from __future__ import annotations

import asyncio

import pytest

from bench import aio_micro, echo
from bench.network import overloaded

pytestmark = pytest.mark.c_extension


def test_aio_micro_reports_every_operation_and_memory():
    """A tiny run: every row that imports reports each of its operations (positive ns) and its
    bytes per armed handle; the schedulers also per key; the targets are computed."""
    done = []
    results = aio_micro.run(handles=200, timeout_ops=50, repeats=1, progress=done.append)
    assert {"WheelScheduler (C)", "WheelScheduler (pure)", "asyncio"} <= set(results)
    for name, fig in results.items():
        ops = {"re-arm", "call_later+cancel"}
        if "Wheel" in name:
            ops |= {"keyed re-arm", "timeout"}
        elif hasattr(asyncio, "timeout"):  # Python 3.11+
            ops.add("timeout")
        assert ops <= set(fig), name
        assert all(fig[op]["median_ns_per_op"] > 0 for op in ops), name
        assert fig["bytes_per_handle"] > 0 and ("Wheel" not in name or fig["bytes_per_key"] > 0), name
    assert sum(done) == 2 * len(results)
    verdicts = [goal.judge(value) for goal, value in aio_micro.goals({"results": results})]
    assert {"WheelHandle.reschedule", "bytes per armed key"} <= {v["name"] for v in verdicts}


@pytest.mark.slow
def test_echo_runs_every_timer_kind_and_no_idle_close_is_early():
    """40 connections for 1 s, one run per (loop, timer kind): some connections fall silent (the
    situation arose), the server closes each, none before its idle timeout on its loop clock. A
    busy client that the load stalls past the 0.2 s idle timeout is rightly closed too, so the
    closes may outnumber the silent connections (on a loaded 2-vCPU machine all 40 were), and a
    run whose busy clients were all closed so (overloaded) may count no request in its window."""
    done = []
    rows = echo.run((40,), seconds=1.0, repeats=1, progress=done.append)
    assert [(r["loop"], r["timers"]) for r in rows] == echo.pairs()
    assert sum(done) == len(rows)
    for r in rows:
        assert r["idle_closes_expected"] > 0, r
        assert r["idle_closes_fired"] >= r["idle_closes_expected"] and r["early_closes"] == 0, r
        assert r["cpu_ns_per_request"] > 0 and (r["requests_per_s"] > 0 or overloaded(r)), r
    assert echo.format_table(rows) and echo.goals({"results": rows})


def _echo_row(loop: str, timers: str, cpu: float, overload: int = 0) -> dict:
    return {"connections": 10_000, "loop": loop, "timers": timers, "cpu_ns_per_request": cpu, "cpu_ns_min": cpu,
            "cpu_ns_max": cpu, "requests_per_s": 1000.0, "idle_closes_expected": 5, "idle_closes_fired": 5,
            "early_closes": 0, "client_early_closes": 0, "unexpected_closes": overload}


def test_a_row_whose_server_closed_active_connections_shows_no_ratio(capsys):
    """The server closed 824 active connections in one row: it served less than was asked, so that
    row's ratio (and every ratio against it) is flagged ``overload`` in the tables and judged n/a
    in the goals, while a clean row still gets its ratio."""
    from bench import tables
    from bench.report import Reporter

    rows = [_echo_row("asyncio", "asyncio", 1000.0), _echo_row("asyncio", "WheelScheduler", 600.0, overload=824),
            _echo_row("asyncio", "KeyedTimers", 500.0)]
    judged = dict((goal.name, value) for goal, value in echo.goals({"results": rows}))
    assert [v for name, v in judged.items() if "WheelScheduler" in name] == [None]
    assert [v for name, v in judged.items() if "KeyedTimers" in name] == [0.5]
    plain = echo.format_table(rows).splitlines()
    assert "overload" in plain[3] and "0.60x" not in plain[3] and "0.50x" in plain[4]
    tables.echo_table(Reporter(use_rich=False, show_progress=False), {"results": rows, "repeats": 1})
    network = {"call_later": {"requests_per_s": 1.0, "cpu_ns_per_request": 1000.0, "latency_summary_us": {},
                              "idle_close_lateness_summary_ms": {}},
               "WheelScheduler": {"requests_per_s": 1.0, "cpu_ns_per_request": 600.0, "unexpected_closes": 824,
                                  "latency_summary_us": {}, "idle_close_lateness_summary_ms": {}}}
    tables.network_table(Reporter(use_rich=False, show_progress=False), {"results": network})
    out = capsys.readouterr().out
    echo_line = next(line for line in out.splitlines() if "WheelScheduler" in line and "10,000" in line)
    network_line = next(line for line in out.splitlines() if line.startswith("WheelScheduler"))
    assert "overload" in echo_line and "0.60x" not in echo_line
    assert "overload" in network_line and "0.6x" not in network_line

"""A real third-party server on each event loop: aiohttp under ``wrk`` load.

For each loop (asyncio's default, timerwheel_c's EventLoop, uvloop when it imports) a server
subprocess (:mod:`bench.http_server`: an aiohttp application with a per-request
timeout and aiohttp's keep-alive timer) is loaded by ``wrk`` from a separate process, over
``connections`` keep-alive connections for ``seconds``. Runs are interleaved over the loops,
``repeats`` times.

Figures per loop: requests/s (wrk's), and server CPU time per request (process CPU in the
measured window over the requests it answered), each the median of the runs. Needs aiohttp and
the ``wrk`` binary; without either the workload says so and does not run.
"""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import statistics
import subprocess
from typing import Callable, Optional

from .goals import Goal
from .harness import NotAvailable
from .network_server import raise_fd_limit
from . import procs
from .run import command

__all__ = ["goals", "loops", "run", "table"]

START_TIMEOUT_S = 60.0
_REQUESTS = re.compile(r"(\d+) requests in")
_RATE = re.compile(r"Requests/sec:\s*([\d.]+)")


def loops() -> list[str]:
    """The server loops measured: asyncio, EventLoop, and uvloop when it imports."""
    return ["asyncio", "EventLoop"] + (["uvloop"] if importlib.util.find_spec("uvloop") else [])


def _check_available() -> str:
    wrk = shutil.which("wrk")
    if importlib.util.find_spec("aiohttp") is None:
        raise NotAvailable("aiohttp is not installed (pip install 'timerwheel_c[bench]')")
    if wrk is None:
        raise NotAvailable("the wrk load generator is not on PATH (Debian: apt-get install wrk)")
    return wrk


def _run_one(wrk: str, loop_name: str, connections: int, seconds: float) -> dict:
    cmd = command("bench.http_server", "--loop", loop_name)
    with procs.server(cmd, "aiohttp server") as (server, port):
        url = f"http://127.0.0.1:{port}/"
        # A short warm-up load, then the measured one inside MARK ... STOP.
        subprocess.run([wrk, "-t1", f"-c{connections}", "-d1s", url], capture_output=True, check=True,
                       timeout=START_TIMEOUT_S)
        server.stdin.write("MARK\n")
        server.stdin.flush()
        load = subprocess.run([wrk, "-t1", f"-c{connections}", f"-d{seconds:g}s", url], capture_output=True,
                              text=True, check=True, timeout=START_TIMEOUT_S + seconds)
        out, _ = server.communicate("STOP\n", timeout=START_TIMEOUT_S)
    stats = json.loads(out.strip().splitlines()[-1])
    rate = _RATE.search(load.stdout)
    total = _REQUESTS.search(load.stdout)
    if rate is None or total is None:
        raise RuntimeError(f"cannot read wrk's output: {load.stdout[-1000:]!r}")
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: (.*)", load.stdout)
    return {"requests_per_s": float(rate.group(1)), "requests": stats["requests"],
            "cpu_ns_per_request": stats["cpu_s"] * 1e9 / max(1, stats["requests"]),
            "errors": errors.group(0) if errors else None}


def run(connections: int = 256, seconds: float = 5.0, repeats: int = 3,
        progress: Optional[Callable[[int], None]] = None) -> dict:
    """Run each loop ``repeats`` times, interleaved; returns ``{loop: figures}`` with
    ``requests_per_s`` and ``cpu_ns_per_request`` (medians), their min and max, and wrk's error
    line if any.

    Raises:
        NotAvailable: aiohttp or wrk is missing.
        RuntimeError: a server subprocess failed (its stderr tail in the message).
    """
    wrk = _check_available()
    raise_fd_limit(connections + 64)
    runs: dict[str, list[dict]] = {name: [] for name in loops()}
    for _ in range(repeats):  # interleaved: a burst of load from elsewhere hits every loop alike
        for name in runs:
            runs[name].append(_run_one(wrk, name, connections, seconds))
            if progress is not None:
                progress(1)
    out = {}
    for name, results in runs.items():
        rates = [r["requests_per_s"] for r in results]
        cpu = [r["cpu_ns_per_request"] for r in results]
        out[name] = {"requests_per_s": statistics.median(rates), "requests_per_s_min": min(rates),
                     "requests_per_s_max": max(rates), "cpu_ns_per_request": statistics.median(cpu),
                     "cpu_ns_min": min(cpu), "cpu_ns_max": max(cpu),
                     "errors": [r["errors"] for r in results if r["errors"]]}
    return out


def goals(figures: dict) -> list[tuple[Goal, Optional[float]]]:
    """EventLoop is not slower than the default loop: requests/s at least, CPU per request at most,
    the default loop's (ratios EventLoop / asyncio)."""
    results = figures["results"]
    ours, base = results.get("EventLoop"), results.get("asyncio")
    if not ours or not base:
        return []
    return [
        (Goal("http", "EventLoop / asyncio, requests/s", 1.0, at_most=False),
         ours["requests_per_s"] / base["requests_per_s"]),
        (Goal("http", "EventLoop / asyncio, server CPU per request", 1.0, at_most=True),
         ours["cpu_ns_per_request"] / base["cpu_ns_per_request"]),
    ]


def table(rep, figures: dict) -> None:
    from .report import fmt

    results = figures["results"]
    base = results.get("asyncio", {})
    rows = []
    for name, fig in results.items():
        rows.append([
            name, fmt(fig["requests_per_s"]), f"{fmt(fig['requests_per_s_min'])}-{fmt(fig['requests_per_s_max'])}",
            fmt(fig["cpu_ns_per_request"]), f"{fmt(fig['cpu_ns_min'])}-{fmt(fig['cpu_ns_max'])}",
            f"{fig['cpu_ns_per_request'] / base['cpu_ns_per_request']:.2f}x" if base else "-",
            "; ".join(fig["errors"]) or "-",
        ])
    rep.table(f"http: aiohttp, a per-request timeout and keep-alive, {figures['connections']} connections under "
              f"wrk, {figures['repeats']} run(s) each (see bench/http.py)",
              ["loop", "req/s", "min-max", "CPU ns/req", "min-max", "vs asyncio", "wrk errors"], rows,
              ["req/s: wrk's, from a separate process; CPU: the server process's CPU time per request it "
               "answered in the measured window; medians of the runs, interleaved over the loops"])

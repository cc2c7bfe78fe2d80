"""The bench's tables, each printed from one workload's figures (the same dict ``--json`` writes).

Every figure is the median over the repeats; the spread beside it (±) is half the
min-max range in % of the median (the JSON has min, max, quartiles and samples).
"vs C" divides a row's median by the C wheel's in the same column, so 20.0x means
20 times the C wheel's cost (for throughput columns, the C wheel's figure is
divided by the row's instead, so bigger still means worse).
"""
from __future__ import annotations

from .echo import reference_loop
from .impls import C_WHEEL
from .network import overloaded
from .report import NOT_APPLICABLE, Reporter, fmt, ratio

SPREAD_NOTE = ("ns are CPU time of the bench thread; figures are medians over the repeats; "
               "± is half the min-max range, in % of the median")

__all__ = ["aio_table", "durable_table", "echo_table", "fleet_table", "lateness_table", "machine_table",
           "memory_table", "network_table", "pgqueuer_table", "timer_table"]


def _median(cell):
    return cell["median_ns_per_op"] if isinstance(cell, dict) else None


def _cell(cell) -> str:
    if isinstance(cell, dict):
        median = cell["median_ns_per_op"]
        half_range = (cell["max_ns_per_op"] - cell["min_ns_per_op"]) / 2 / median if median else 0.0
        return f"{fmt(median)} ±{half_range:.0%}"
    return NOT_APPLICABLE if cell is None else str(cell)


def machine_table(rep: Reporter, facts: dict, config: dict) -> None:
    rows = [[k, "-" if v is None else str(v)] for k, v in {**facts, **config}.items()]
    rep.table("machine and run", ["fact", "value"], rows)


def timer_table(rep: Reporter, figures: dict) -> None:
    """A timer workload's figures (:meth:`.workloads.Result.to_json`): ns/op per implementation and variant."""
    headers = ["implementation"]
    for header in figures["columns"].values():
        headers += [header, "vs C"]
    ref = figures["results"].get(C_WHEEL, {})
    rows = []
    for impl, cells in figures["results"].items():
        row = [impl]
        for variant in figures["columns"]:
            cell = cells.get(variant)
            row += [_cell(cell), ratio(_median(cell), _median(ref.get(variant)))]
        rows.append(row)
    rep.table(figures["title"], headers, rows, figures["notes"] + [SPREAD_NOTE])


def memory_table(rep: Reporter, figures: dict) -> None:
    results, n = figures["results"], figures["timers"]
    ref = results.get(C_WHEEL, {}).get("bytes_per_timer")
    rows = [
        [impl, fmt(f["bytes_per_timer"]), f["method"], fmt(f["tracemalloc"]), fmt(f["own"]), fmt(f["rss"]),
         ratio(f["bytes_per_timer"], ref)]
        for impl, f in results.items()
    ]
    rep.table(f"memory: bytes per pending timer at {n:,} timers",
              ["implementation", "bytes/timer", "method", "tracemalloc", "own (nbytes)", "RSS delta", "vs C"],
              rows, ["tracemalloc is primary for Python-object structures; the C wheel counts its own "
                     "buffers (nbytes(): entry pool and slot tables), else the RSS delta is used"])


def lateness_table(rep: Reporter, figures: dict) -> None:
    series = figures["results"]
    reference = series.get("time.sleep", {}).get("summary_us", {})
    rows = []
    for name, fig in series.items():
        s = fig["summary_us"]
        rows.append([name, str(s.get("n", 0))] + [fmt(s.get(k)) for k in ("p50", "p95", "p99", "max")]
                    + [ratio(s.get("p50"), reference.get("p50"))])
    rep.table(f"lateness of {figures['delay_ms']:g} ms deadlines (us after the deadline)",
              ["series", "n", "p50 us", "p95 us", "p99 us", "max us", "p50 vs time.sleep"], rows,
              ["p50 vs time.sleep: the series' median lateness over time.sleep's, in the same run"])


def durable_table(rep: Reporter, figures: dict) -> None:
    rows = []
    reference = figures["results"].get("sqlite", {}).get("fired_per_s")
    for store, fig in figures["results"].items():
        s = fig["lateness_summary_ms"]
        rows.append([store, fmt(fig.get("fired_per_s")), ratio(fig.get("fired_per_s"), reference), str(s.get("n", 0))]
                    + [fmt(s.get(k)) for k in ("p50", "p99", "max")])
    rep.table("durable: no-op handler, fired timers per second and due-to-committed lateness",
              ["store", "fired/s", "fired/s vs sqlite", "n", "lateness p50 ms", "p99 ms", "max ms"], rows)
    rows = []
    for store, fig in figures["results"].items():
        wake, io = fig.get("wakeup_lateness_summary_ms", {}), fig.get("fired_per_s_20ms", {})
        c1, c16 = io.get("1", {}), io.get("16", {})
        idle = fig.get("watcher_idle_cpu_pct")
        rows.append([store, str(wake.get("n", 0)), fmt(wake.get("p50")), fmt(wake.get("p99")),
                     fmt(c1.get("fired_per_s")), fmt(c16.get("fired_per_s")),
                     str(c1.get("duplicates", 0) + c16.get("duplicates", 0)), NOT_APPLICABLE if idle is None else f"{idle:.2f}"])
        wake16 = fig.get("wakeup_lateness_16p_summary_ms")
        if wake16 is not None:
            rows.append([f"{store}, 16 partitions", str(wake16.get("n", 0)), fmt(wake16.get("p50")), fmt(wake16.get("p99"))]
                        + [NOT_APPLICABLE] * 4)
    rep.table("durable service: a timer written by another process, and 20 ms handlers",
              ["store", "n", "wake-up p50 ms", "p99 ms", "fired/s c=1", "fired/s c=16", "duplicates", "idle CPU %"], rows,
              ["wake-up: due time to fire in an idle runner process, the timer written by this one; "
               "c: concurrency; idle CPU: the SQLite change watcher, % of one core"])
    rows = [[store, fmt(fig.get("by_name_fired_per_s")), ratio(fig.get("by_name_fired_per_s"), fig.get("fired_per_s")),
             fmt(fig.get("rearm_per_s")), fmt(fig.get("schedule_us_per_occurrence")),
             fmt(fig.get("reschedule_chain_us_per_fire"))]
            for store, fig in figures["results"].items() if "by_name_fired_per_s" in fig]
    if rows:
        rep.table("durable timers by name (as many as the drained rows, each re-armed 3 times) and a 1 s schedule",
                  ["store", "fired/s", "vs unnamed", "re-arms/s", "us per occurrence", "us per Reschedule chain fire"],
                  rows, ["us per occurrence: one run_due firing one occurrence of Every(1) and committing the next; "
                         "the chain: a handler returning Reschedule(due + 1 s), the hand-made alternative"])
    if "fleet" in figures:
        fleet_table(rep, figures["fleet"])
    if "pgqueuer" in figures:
        pgqueuer_table(rep, figures.get("fleet", {}), figures["pgqueuer"])


def fleet_table(rep: Reporter, fleet: dict) -> None:
    """The fleet rows (goals: see the durable goals in :mod:`.suite`)."""
    rows = []
    fleet = dict(fleet)
    wakeup = fleet.pop("new_partition_wakeup", None)
    reference = next((fig["fired_per_s"] for fig in fleet.values()), None)
    for fig in fleet.values():
        label = f"{fig['runners']} runner process(es)" + (", large budget" if fig.get("budget") == "large" else "")
        rows.append([label, f"{fig['partitions']}", fmt(fig["fired_per_s"]), ratio(fig["fired_per_s"], reference),
                     *_cpu(fig)])
        if "takeover_s" in fig:
            rows.append([f"takeover after SIGKILL ({fig['runners']} runners)", f"{fig['partitions']}",
                         f"{fig['takeover_s']:.2f} s"] + [NOT_APPLICABLE] * 3)
    if wakeup is not None:
        rows.append([f"wake-up into a new partition ({wakeup['runners']} runners), p50 / p99", "new",
                     f"{wakeup['lateness_p50_ms']:.0f} / {wakeup['lateness_p99_ms']:.0f} ms"] + [NOT_APPLICABLE] * 3)
    rep.table("durable fleet on PostgreSQL: runner processes dividing the partitions (see bench/fleet.py)",
              ["fleet", "partitions", "measured", "fired/s vs 1 runner", "runner CPU us/fired", "server CPU us/fired"],
              rows,
              ["the server's own synchronous_commit (on by default: one WAL flush per commit); no-op handler "
               "committing one effect row; the default TickBudget, as timerwheel-c run has (at most 1,024 timers, "
               "256 of a kind, per partition per tick); large budget: TickBudget(max_fired=1024, max_per_kind=1024, "
               "max_scanned=4096), no cap per kind"])


def _cpu(fig: dict) -> list:
    return [fmt(fig.get("runner_cpu_us_per_fired")), fmt(fig.get("server_cpu_us_per_fired"))]


def pgqueuer_table(rep: Reporter, fleet: dict, peer: dict) -> None:
    """The fleet beside pgqueuer on the same server (see bench/peers.py), or one line saying how to
    get the comparison."""
    if "missing" in peer:
        rep.line(f"durable fleet vs pgqueuer: not compared: {peer['missing']}", "yellow")
        return
    rows = []
    for name, fig in fleet.items():
        if not name.startswith("runners_") or fig.get("budget") != "default":
            continue
        rows.append([f"timerwheel_c fleet, {fig['runners']} runner(s)", fmt(fig["fired_per_s"]), NOT_APPLICABLE,
                     *_cpu(fig)])
        for result in peer["results"].values():
            if result["workers"] == fig["runners"]:
                rows.append([f"pgqueuer {peer['version']}, {result['workers']} worker(s), batch {result['batch_size']}",
                             fmt(result["fired_per_s"]), f"{result['ours_over_pgqueuer']:.2f}x", *_cpu(result)])
    notes = [f"median of {peer['rounds']} interleaved round(s) of {next(iter(peer['results'].values()))['timers']:,} "
             "no-op items all due at once, each checked to run exactly once, after a warm-up of at least 200 "
             "(checked too, not counted: each process's first claims and commits); pgqueuer over asyncpg on uvloop, "
             "as pgq run starts it",
             "CPU: us of CPU time per fired item, the runner (worker) processes' and the PostgreSQL server's "
             "(every server process, from /proc, including any other client's work meanwhile, but the backend "
             "the bench polls on; n/a: the server is not on this machine)"]
    notes += sorted({f["cpu_note"] for f in [*fleet.values(), *peer["results"].values()]
                     if isinstance(f, dict) and f.get("cpu_note")})
    rep.table("durable fleet vs pgqueuer on the same PostgreSQL server (see bench/peers.py)",
              ["system", "fired/s", "ours / pgqueuer", "runner CPU us/fired", "server CPU us/fired"], rows, notes)


# The ratio cell of a row whose server, or whose reference row's, closed active connections.
OVERLOAD = "overload"
OVERLOAD_NOTE = (f"{OVERLOAD} in a ratio column: the server closed active connections in this row or in the row "
                 "it is compared with, so it served less than was asked and no ratio is shown")


def network_table(rep: Reporter, figures: dict) -> None:
    runs = figures["results"]
    rows = []
    for name, fig in runs.items():
        lat, close = fig["latency_summary_us"], fig["idle_close_lateness_summary_ms"]
        base = runs.get("uvloop call_later" if name.startswith("uvloop") else "call_later", {})
        rows.append([
            name, fmt(fig.get("requests_per_s")), fmt(lat.get("p50")), fmt(lat.get("p99")),
            fmt(fig.get("cpu_ns_per_request")),
            OVERLOAD if overloaded(fig, base) else ratio(fig.get("cpu_ns_per_request"), base.get("cpu_ns_per_request")),
            f"{fig.get('idle_closes_fired', '-')}/{fig.get('idle_closes_expected', '-')}",
            fmt(close.get("p50")), fmt(close.get("p99")), str(fig.get("early_closes", "-")),
            str(fig.get("unexpected_closes", "-")),
        ])
    rep.table("network: idle-timeout server on loopback (see bench/network.py)",
              ["scheduler", "req/s", "lat p50 us", "p99 us", "CPU ns/req", "CPU ratio",
               "idle fired/exp", "late p50 ms", "p99 ms", "early", "overload"], rows,
              ["lat: per-request round trip; CPU: server process CPU per request; CPU ratio: against the same "
               "loop's call_later row; idle fired/exp and late: idle closes and their lateness; early: closes "
               "before the timeout (must be 0); overload: active connections the server closed", OVERLOAD_NOTE])


def aio_table(rep: Reporter, figures: dict) -> None:
    runs = figures["results"]
    ops = ["re-arm", "call_later+cancel", "timeout", "keyed re-arm"]
    base = runs.get("asyncio", {})
    rows = []
    for name, fig in runs.items():
        ref = runs.get("uvloop", {}) if name.startswith("uvloop") else base
        cells = [name]
        for op in ops:
            ref_op = "re-arm" if op == "keyed re-arm" else op
            cells += [_cell(fig.get(op)), ratio(_median(ref.get(ref_op)), _median(fig.get(op)))]
        cells += [fmt(fig.get("bytes_per_handle")), fmt(fig.get("bytes_per_key"))]
        rows.append(cells)
    head = ["scheduler"]
    for op in ops:
        head += [f"{op} ns", "asyncio/it"]
    rep.table(f"aio: the asyncio layer, {figures['handles']:,} handles armed (see bench/aio_micro.py)",
              head + ["B/handle", "B/key"], rows,
              [SPREAD_NOTE, "asyncio/it: the same loop's own timers (cancel + call_later for a re-arm, "
               "asyncio.timeout) over this row; B/handle: per armed handle with a bound-method callback, "
               "its context copy and the scheduler's share; B/key: every allocation of KeyedTimers.arm"])


def echo_table(rep: Reporter, figures: dict) -> None:
    rows = []
    runs = figures["results"]
    base = {(r["connections"], r["loop"]): r for r in runs if r["timers"] == "asyncio"}
    for r in runs:
        ref = base.get((r["connections"], reference_loop(r["loop"])))
        rows.append([
            f"{r['connections']:,}", r["loop"], r["timers"], fmt(r["cpu_ns_per_request"]),
            f"{fmt(r['cpu_ns_min'])}-{fmt(r['cpu_ns_max'])}",
            NOT_APPLICABLE if ref is None or not ref["cpu_ns_per_request"] else OVERLOAD if overloaded(r, ref)
            else f"{r['cpu_ns_per_request'] / ref['cpu_ns_per_request']:.2f}x",
            fmt(r["requests_per_s"]), f"{r['idle_closes_fired']}/{r['idle_closes_expected']}",
            f"{r['early_closes']}/{r['client_early_closes']}", str(r["unexpected_closes"]),
        ])
    rep.table(f"echo: length-prefixed echo, a deadline and an idle re-arm per request, "
              f"{figures['repeats']} run(s) each (see bench/echo.py)",
              ["conns", "loop", "timers", "CPU ns/req", "min-max", "vs asyncio", "req/s", "idle fired/exp",
               "early loop/real", "overload"], rows,
              ["CPU: server process CPU per request in the measured window, median of the runs; vs asyncio: "
               "over asyncio.timeout + call_later on the same loop (EventLoop: on the default loop) and connection count; early: idle closes "
               "before the timeout on the server's loop clock (must be 0) / in real time seen by the client; "
               "overload: active connections the server closed", OVERLOAD_NOTE])

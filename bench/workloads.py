"""The timer workloads: churn, expiry, mixed RTO and long gap, each over every implementation.

Every workload derives its inputs once from the seed, runs the same inputs through
each implementation's native calls (see :mod:`.impls`), and checks each run's
fired timers against the model those inputs define (:func:`.harness.check_fired`).
Times are integer ms on a simulated clock, so runs are deterministic and no
implementation waits on the wall clock; the only exception is uvloop's expiry,
which needs a real run (see :mod:`.impls`).

Each workload returns a :class:`Result`: per implementation, per variant, a
:class:`.harness.Stats` in ns per operation, where the operation is named by the
variant's column header.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from time import thread_time_ns

import numpy as np

from .harness import Fired, FiredMismatch, Stats, check_fired, repeat, set_digest, timed
from .impls import Impl

__all__ = ["FiredMismatch", "Result", "Sizes", "churn", "expiry", "gap", "rto", "steps"]

NOT_APPLICABLE_CLOCK = "n/a: its clock cannot be simulated"


@dataclass
class Sizes:
    """Workload sizes. Defaults are the sizes the goals are stated at (100k connections, 1M
    timers); ``quick()`` and ``scaled()`` shrink them."""

    churn_conns: int = 100_000
    churn_ops: int = 1_000_000
    churn_idle_ms: int = 30_000
    churn_sim_ms: int = 10_000
    expiry_timers: int = 1_000_000
    expiry_span_ms: int = 10_000
    expiry_real_span_ms: int = 2_000
    rto_timers: int = 1_000_000
    rto_per_ms: int = 100
    rto_ms: int = 200
    rto_cancelled: float = 0.9
    gap_timers: int = 100_000
    gap_span_ms: int = 3 * 3600 * 1000
    gap_step_ms: int = 60_000
    memory_timers: int = 1_000_000
    lateness_samples: int = 1000
    durable_timers: int = 10_000
    durable_rounds: int = 3  # interleaved rounds of the fleet and pgqueuer, when compared
    partitions_max: int = 100_000  # idle partitions of the largest store the wake-up is measured on
    partitions_timers: int = 30  # timers measured per partition count
    partitions_effect_rows: int = 1_000_000  # an application's rows in each of those stores
    fleet_partitions: int = 100_000  # partitions of the store a fleet of runners serves, one runner SIGKILLed
    bulk_timers: int = 100_000  # new timers one schedule_many writes
    network_connections: int = 1000
    network_seconds: float = 5.0
    aio_handles: int = 100_000
    aio_timeout_ops: int = 20_000
    echo_connections: tuple = (1000, 10_000)
    echo_seconds: float = 3.0
    echo_repeats: int = 3
    http_connections: int = 256
    http_seconds: float = 5.0
    http_repeats: int = 3

    @classmethod
    def quick(cls) -> "Sizes":
        return cls(
            churn_conns=10_000, churn_ops=100_000, expiry_timers=50_000, expiry_real_span_ms=500,
            rto_timers=50_000, rto_per_ms=10, gap_timers=10_000, memory_timers=100_000,
            lateness_samples=200, durable_timers=1000, durable_rounds=1,
            partitions_max=10_000, partitions_timers=10, partitions_effect_rows=10_000,
            fleet_partitions=2_000, bulk_timers=10_000,
            network_connections=200, network_seconds=2.0,
            aio_handles=20_000, aio_timeout_ops=5000, echo_connections=(1000,), echo_seconds=1.0, echo_repeats=1,
            http_seconds=2.0, http_repeats=1,
        )

    def scaled(self, factor: float) -> "Sizes":
        """Multiply every count by ``factor`` (each kept at least 10); times stay, except that
        a factor below 1 also shortens uvloop's real expiry run (at least 100 ms)."""
        counts = ("churn_conns", "churn_ops", "expiry_timers", "rto_timers", "gap_timers",
                  "memory_timers", "lateness_samples", "durable_timers", "partitions_max", "partitions_timers",
                  "partitions_effect_rows", "fleet_partitions", "bulk_timers",
                  "network_connections", "aio_handles", "aio_timeout_ops")
        kw = dict(self.__dict__)
        for name in counts:
            kw[name] = max(10, int(kw[name] * factor))
        kw["echo_connections"] = tuple(max(10, int(n * factor)) for n in self.echo_connections)
        kw["rto_per_ms"] = max(1, int(self.rto_per_ms * min(factor, 1.0)))
        kw["expiry_real_span_ms"] = max(100, int(self.expiry_real_span_ms * min(factor, 1.0)))
        return Sizes(**kw)


@dataclass
class Result:
    """One workload's figures: ``rows[impl][variant]`` is Stats, or a str saying why not run."""

    name: str
    title: str
    columns: dict[str, str]
    params: dict
    rows: dict = field(default_factory=dict)
    digests: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        rows = {
            impl: {v: (s if isinstance(s, str) else s.to_json()) for v, s in cells.items()}
            for impl, cells in self.rows.items()
        }
        return {"title": self.title, "columns": self.columns, "params": self.params,
                "results": rows, "fired_digests": self.digests, "notes": self.notes}


def _record(result: Result, impl: Impl, run, repeats: int, bar) -> None:
    """Time ``run`` (a run_once for :func:`.harness.repeat`) and store its phases' Stats."""
    for phase, stats in repeat(run, repeats, bar.step).items():
        result.rows.setdefault(impl.name, {})[phase] = stats


def _check(result: Result, impl: Impl, variant: str, fired: Fired, due, expected) -> None:
    digest = check_fired(f"{result.name}/{impl.name}/{variant}", fired, due, expected)
    result.digests.setdefault(impl.name, {})[variant] = digest


# -- churn -------------------------------------------------------------------------------


def churn(impls: list[Impl], sizes: Sizes, repeats: int, seed: int, bar) -> Result:
    """N live connections; each op re-arms one connection's idle timeout (ns per re-arm).

    The clock advances 1 ms every ``ops / churn_sim_ms`` ops (an advance call, timed
    with the ops), so the ops span ``churn_sim_ms`` ms, less than the idle timeout:
    nothing fires while timed. Afterwards one untimed advance past every due time
    must fire each connection once, at its last re-arm + idle, in due order.
    """
    n, m, idle = sizes.churn_conns, sizes.churn_ops, sizes.churn_idle_ms
    per_ms = -(-m // sizes.churn_sim_ms)
    rng = random.Random(seed)
    seq = [rng.randrange(n) for _ in range(m)]
    chunks = [seq[i:i + per_ms] for i in range(0, m, per_ms)]
    last_ms = np.zeros(n, dtype=np.int64)
    for ms, chunk in enumerate(chunks):
        last_ms[chunk] = ms
    due = last_ms + idle
    end = len(chunks) + idle + 1
    expected = np.full(n, end, dtype=np.int64)
    result = Result("churn", f"churn: {n:,} live connections re-arming a {idle // 1000} s idle timeout, "
                    f"{m:,} ops, 1 ms advance every {per_ms} ops",
                    {"reschedule": "reschedule ns/op", "cancel+schedule": "cancel+schedule ns/op"},
                    {"connections": n, "ops": m, "idle_ms": idle, "ops_per_ms": per_ms, "seed": seed})

    for impl in impls:
        variants = ["reschedule", "cancel+schedule"] if impl.reschedule else ["cancel+schedule"]
        for variant in variants:
            state: dict = {}

            def run(impl=impl, variant=variant, state=state):
                timers = impl.make()
                kernel, handles = _churn_kernel(impl, timers, variant, chunks, n, idle)
                elapsed, _ = timed(kernel)
                if impl.family == "wheel":
                    state["fired"] = timers.advance(end)
                else:
                    if impl.sim_clock:
                        timers.tick(end)
                        state["fired"] = list(timers.fired)
                    timers.close(handles)
                return {variant: (elapsed, m)}

            _record(result, impl, run, repeats, bar)
            if impl.floor:
                continue
            if impl.family == "loop" and not impl.sim_clock:
                result.notes.append(f"{impl.name}: fired set not checked (real clock, nothing fires); "
                                    "one real loop iteration at the end frees the cancelled timers, timed")
                continue
            tokens = state["fired"]
            _check(result, impl, variant, Fired(tokens, [len(tokens)], [end]), due, expected)
        if not impl.reschedule and not impl.floor:
            result.rows[impl.name]["reschedule"] = "n/a: no re-arm"
    return result


def _churn_kernel(impl: Impl, timers, variant: str, chunks, n: int, idle_ms: int):
    """Arm n connections at time 0 (untimed) and return the timed re-arm loop."""
    if impl.family == "loop":
        call_later, callback = timers.call_later, timers.callback
        idle_s = idle_ms / 1000
        handles = [call_later(idle_s, callback, k) for k in range(n)]
        tick = timers.tick if timers.sim_clock else None

        def kernel():
            now = 0
            for chunk in chunks:
                for k in chunk:
                    handles[k].cancel()
                    handles[k] = call_later(idle_s, callback, k)
                now += 1
                if tick is not None:
                    tick(now)
            if tick is None:
                timers.flush()
        return kernel, handles

    schedule, cancel, advance = timers.schedule, timers.cancel, timers.advance
    ids = [schedule(idle_ms, k) for k in range(n)]
    if variant == "reschedule":
        reschedule = timers.reschedule
        id_chunks = [[ids[k] for k in chunk] for chunk in chunks]

        def kernel():
            now = 0
            for chunk in id_chunks:
                for tid in chunk:
                    reschedule(tid, idle_ms)
                now += 1
                advance(now)
        return kernel, ()

    def rearm_kernel():
        now = 0
        for chunk in chunks:
            for k in chunk:
                cancel(ids[k])
                ids[k] = schedule(idle_ms, k)
            now += 1
            advance(now)
    return rearm_kernel, ()


# -- expiry ------------------------------------------------------------------------------


def expiry(impls: list[Impl], sizes: Sizes, repeats: int, seed: int, bar) -> Result:
    """M timers due uniformly over the span, advanced 1 ms at a time (ns per timer, per phase).

    Phases are timed apart: scheduling every timer at time 0, then advancing tick by
    tick to the end of the span. The batch rows do the same through
    ``schedule_many`` and ``advance_array``. uvloop runs for real over a shorter span
    (``expiry_real_span_ms``) and is charged its loop thread's CPU time.
    """
    m, span = sizes.expiry_timers, sizes.expiry_span_ms
    due = np.random.default_rng(seed).integers(1, span + 1, size=m, dtype=np.int64)
    afters = due.tolist()
    result = Result("expiry", f"expiry: {m:,} timers due over {span / 1000:g} s, advanced 1 ms at a time",
                    {"schedule": "schedule ns/timer", "advance": "advance ns/timer", "total": "total ns/timer"},
                    {"timers": m, "span_ms": span, "seed": seed, "real_span_ms": sizes.expiry_real_span_ms})
    ticks = list(range(1, span + 1))
    for impl in impls:
        if impl.floor:
            continue
        rows = [(impl.name, False)] + ([(impl.name + " (batch)", True)] if impl.batch else [])
        for name, batch in rows:
            state: dict = {}
            if impl.family == "loop" and not impl.sim_clock:
                run = _expiry_real_run(impl, due, sizes.expiry_real_span_ms, span, state)
            else:
                run = _expiry_run(impl, afters, due, ticks, batch, state)
            for phase, stats in repeat(run, repeats, bar.step).items():
                result.rows.setdefault(name, {})[phase] = stats
            cells = result.rows[name]
            cells["total"] = _sum_stats(cells["schedule"], cells["advance"])
            fired = state["fired"]
            digest = check_fired(f"expiry/{name}", fired, due, due)
            result.digests[name] = {"set": set_digest(fired.tokens)}
            if fired.ticks is not None:
                result.digests[name]["tick"] = digest
    if any(not i.sim_clock for i in impls):
        result.notes.append(f"uvloop: real run over {sizes.expiry_real_span_ms / 1000:g} s, "
                            "advance = CPU time of the loop thread per fired timer; set checked, not ticks")
    return result


def _sum_stats(a: Stats, b: Stats) -> Stats:
    """Per-repeat sums of two phases timed in the same runs."""
    return Stats([x + y for x, y in zip(a.samples, b.samples)], a.ops)


def _expiry_run(impl: Impl, afters, due, ticks, batch: bool, state):
    m = len(afters)

    def run():
        timers = impl.make()
        marks: list[int] = []
        mark = marks.append
        if impl.family == "loop":
            call_later, callback = timers.call_later, timers.callback
            afters_s = [a / 1000 for a in afters]

            def schedule():
                for token, after_s in enumerate(afters_s):
                    call_later(after_s, callback, token)

            advance = _tick_kernel(impl, timers, ticks, mark)
        elif batch:
            after_arr = np.asarray(due, dtype=np.int64)
            token_arr = np.arange(m, dtype=np.uint64)
            advance_array = timers.advance_array

            def schedule():
                timers.schedule_many(after_arr, token_arr)

            def advance():
                parts = [advance_array(now) for now in ticks]
                return parts
        else:
            sched = timers.schedule

            def schedule():
                for token, after in enumerate(afters):
                    sched(after, token)

            advance = _tick_kernel(impl, timers, ticks, mark)
        t_sched, _ = timed(schedule)
        t_adv, tokens = timed(advance)
        if batch:
            lengths = [len(p) for p in tokens]
            marks = np.cumsum(lengths).tolist()
            tokens = np.concatenate(tokens) if tokens else []
        state["fired"] = Fired(tokens, marks, ticks)
        if impl.family == "loop":
            timers.close()
        return {"schedule": (t_sched, m), "advance": (t_adv, m)}
    return run


def _tick_kernel(impl: Impl, timers, ticks, mark):
    """The timed advance loop over ``ticks`` (simulated ms) for ``timers`` of ``impl``: after each
    tick it marks how many tokens have fired so far; it returns the fired tokens in order."""
    if impl.family == "loop":
        tick, fired = timers.tick, timers.fired

        def kernel():
            for now in ticks:
                tick(now)
                mark(len(fired))
            return fired
    else:
        advance = timers.advance

        def kernel():
            out: list[int] = []
            for now in ticks:
                advance(now, out)
                mark(len(out))
            return out
    return kernel


def _expiry_real_run(impl: Impl, due, real_span_ms: int, span_ms: int, state):
    """uvloop: the same due times compressed into ``real_span_ms`` of real time."""
    import asyncio

    m = len(due)
    afters_s = (due * real_span_ms // span_ms / 1000).tolist()

    def run():
        timers = impl.make()
        call_later, callback, loop = timers.call_later, timers.callback, timers.loop

        def schedule():
            for token, after_s in enumerate(afters_s):
                call_later(after_s, callback, token)

        t_sched, _ = timed(schedule)
        t0 = thread_time_ns()
        loop.run_until_complete(asyncio.sleep(real_span_ms / 1000 + 0.05))
        t_adv = thread_time_ns() - t0
        state["fired"] = Fired(list(timers.fired))
        timers.close()
        return {"schedule": (t_sched, m), "advance": (t_adv, m)}
    return run


# -- mixed RTO ---------------------------------------------------------------------------


def rto(impls: list[Impl], sizes: Sizes, repeats: int, seed: int, bar) -> Result:
    """Retransmit timers: K armed per ms at RTO ms; 90% cancelled by their ACK before firing.

    Each tick: advance to it (fires the unacked timers armed RTO ms earlier), cancel
    the timers ACKed at this tick (RTT uniform in [1, RTO-1] ms), arm the new ones.
    Cost is ns per timer lifecycle: one schedule plus one cancel or one fire.
    """
    t, per_ms, rto_ms = sizes.rto_timers, sizes.rto_per_ms, sizes.rto_ms
    rng = np.random.default_rng(seed)
    sched_ms = np.arange(t, dtype=np.int64) // per_ms
    cancelled = rng.random(t) < sizes.rto_cancelled
    ack_ms = sched_ms + rng.integers(1, rto_ms, size=t)
    n_ticks = int(sched_ms[-1]) + rto_ms + 1
    news: list[list[int]] = [[] for _ in range(n_ticks)]
    acks: list[list[int]] = [[] for _ in range(n_ticks)]
    for token, ms in enumerate(sched_ms.tolist()):
        news[ms].append(token)
    for token in np.nonzero(cancelled)[0].tolist():
        acks[int(ack_ms[token])].append(token)
    due = sched_ms + rto_ms
    expected = np.where(cancelled, -1, due)
    result = Result("rto", f"mixed RTO: {t:,} retransmit timers of {rto_ms} ms, {per_ms}/ms, "
                    f"{sizes.rto_cancelled:.0%} cancelled by their ACK",
                    {"lifecycle": "ns/timer (schedule + cancel or fire)"},
                    {"timers": t, "per_ms": per_ms, "rto_ms": rto_ms, "cancelled": sizes.rto_cancelled,
                     "seed": seed})
    ticks = list(range(n_ticks))
    for impl in impls:
        if impl.floor:
            continue
        if not impl.sim_clock:
            result.rows[impl.name] = {"lifecycle": NOT_APPLICABLE_CLOCK}
            continue
        state: dict = {}

        def run(impl=impl, state=state):
            timers = impl.make()
            kernel = _rto_kernel(impl, timers, news, acks, ticks, t, rto_ms)
            elapsed, fired = timed(kernel)
            state["fired"] = fired
            if impl.family == "loop":
                timers.close()
            return {"lifecycle": (elapsed, t)}

        _record(result, impl, run, repeats, bar)
        _check(result, impl, "lifecycle", state["fired"], due, expected)
    return result


def _rto_kernel(impl: Impl, timers, news, acks, ticks, t: int, rto_ms: int):
    handles: list = [None] * t
    marks: list[int] = []
    mark = marks.append
    if impl.family == "loop":
        call_later, callback, tick, fired = timers.call_later, timers.callback, timers.tick, timers.fired
        rto_s = rto_ms / 1000

        def kernel():
            for now in ticks:
                tick(now)
                mark(len(fired))
                for token in acks[now]:
                    handles[token].cancel()
                for token in news[now]:
                    handles[token] = call_later(rto_s, callback, token)
            return Fired(fired, marks, ticks)
        return kernel

    schedule, cancel, advance = timers.schedule, timers.cancel, timers.advance

    def wheel_kernel():
        out: list[int] = []
        for now in ticks:
            advance(now, out)
            mark(len(out))
            for token in acks[now]:
                cancel(handles[token])
            for token in news[now]:
                handles[token] = schedule(rto_ms, token)
        return Fired(out, marks, ticks)
    return wheel_kernel


# -- long gap ----------------------------------------------------------------------------


def gap(impls: list[Impl], sizes: Sizes, repeats: int, seed: int, bar) -> Result:
    """N timers due over hours, then advanced in coarse steps, or in one jump (ns per fired timer).

    Scheduling is untimed. "steps" advances every ``gap_step_ms`` to the end of the
    span; "jump" advances once to the end, so every timer fires in one call, which
    must still come out in due order.
    """
    n, span, step = sizes.gap_timers, sizes.gap_span_ms, sizes.gap_step_ms
    due = np.random.default_rng(seed).integers(1, span + 1, size=n, dtype=np.int64)
    afters = due.tolist()
    end = -(-span // step) * step
    variants = {
        "steps": (list(range(step, end + 1, step)), -(-due // step) * step),
        "jump": ([end], np.full(n, end, dtype=np.int64)),
    }
    result = Result("gap", f"long gap: {n:,} timers due over {span / 3_600_000:g} h",
                    {"steps": f"{step // 1000} s steps ns/timer", "jump": "one jump ns/timer"},
                    {"timers": n, "span_ms": span, "step_ms": step, "seed": seed})
    for impl in impls:
        if impl.floor:
            continue
        if not impl.sim_clock:
            result.rows[impl.name] = {v: NOT_APPLICABLE_CLOCK for v in variants}
            continue
        for variant, (ticks, expected) in variants.items():
            state: dict = {}

            def run(impl=impl, variant=variant, ticks=ticks, state=state):
                timers = impl.make()
                marks: list[int] = []
                mark = marks.append
                if impl.family == "loop":
                    call_later, callback = timers.call_later, timers.callback
                    for token, after in enumerate(afters):
                        call_later(after / 1000, callback, token)
                else:
                    schedule = timers.schedule
                    for token, after in enumerate(afters):
                        schedule(after, token)
                elapsed, tokens = timed(_tick_kernel(impl, timers, ticks, mark))
                state["fired"] = Fired(tokens, marks, ticks)
                if impl.family == "loop":
                    timers.close()
                return {variant: (elapsed, n)}

            _record(result, impl, run, repeats, bar)
            _check(result, impl, variant, state["fired"], due, expected)
    return result


def steps(name: str, impls: list[Impl], repeats: int) -> int:
    """How many progress steps ``name`` takes over ``impls`` (for the progress bar)."""
    timed_impls = [i for i in impls if not i.floor]
    if name == "churn":
        return sum(2 if i.reschedule else 1 for i in impls) * (repeats + 1)
    if name == "expiry":
        return sum(2 if i.batch else 1 for i in timed_impls) * (repeats + 1)
    if name == "rto":
        return len([i for i in timed_impls if i.sim_clock]) * (repeats + 1)
    if name == "gap":
        return 2 * len([i for i in timed_impls if i.sim_clock]) * (repeats + 1)
    raise KeyError(name)


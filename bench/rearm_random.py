"""Re-arm at many live timers in RANDOM connection order, as real traffic does: the compiled
``WheelHandle.reschedule`` and ``KeyedTimers.arm`` against asyncio's ``cancel()`` + ``call_later``,
and the compiled ``TimerWheel.reschedule`` itself.

Sequential order lets the prefetcher and the cache hide a re-arm's misses (the handle, its wheel
entry, the entries around it); here every pass re-arms all ``handles`` timers in a fresh random
permutation, 30 s out, on the default asyncio loop. Figures are CPU time of this thread (ns per
re-arm, the median of ``repeats`` passes after one warm-up pass), printed with their ratio to
asyncio's, all from one run. Two floors show what touching the same objects costs from Python
with no timer work: ``handle.cancelled()`` on the same handles, ``key in keys`` on the same keys,
and ``TimerWheel.due_ms`` (a read of the same wheel entries) for the wheel's own re-arm.

Each re-arm row is also printed over its floor, the goal's measure: ``WheelHandle.reschedule`` and
``KeyedTimers.arm`` at most 2x their floor (touching the same handle or key at all).

Run: ``python bench/run.py -m bench.rearm_random [--handles 100000] [--repeats 7]``.
"""
from __future__ import annotations

import argparse
import asyncio
import random

from .aio_micro import DELAY_S, _Conn, _timed

__all__ = ["FLOORS", "main", "measure"]

# Each re-arm row's floor: the same objects touched in the same order with no timer work.
FLOORS = {
    "WheelHandle.reschedule": "floor: handle.cancelled()",
    "KeyedTimers.arm (re-arm)": "floor: key in keys",
    "TimerWheel.reschedule": "floor: TimerWheel.due_ms",
}
# The goal, for the asyncio scheduler's rows: at most this many times their floor.
FLOOR_TARGET = 2.0


async def measure(handles: int, repeats: int, seed: int = 1) -> dict[str, float]:
    """The median ns per re-arm of each row (see the module docstring), at ``handles`` live timers."""
    from timerwheel_c._aio import WheelScheduler

    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    conns = [_Conn() for _ in range(handles)]
    order = conns[:]
    keys_order = list(range(handles))
    samples: dict[str, list[float]] = {}

    def keep(row: str, ns: float, i: int) -> None:
        if i:  # the first pass warms up
            samples.setdefault(row, []).append(ns)

    for c in conns:
        c.handle = loop.call_later(DELAY_S, c.on_idle)

    def asyncio_rearm() -> None:
        call_later = loop.call_later
        for c in order:
            c.handle.cancel()
            c.handle = call_later(DELAY_S, c.on_idle)

    for i in range(repeats + 1):
        rng.shuffle(order)
        keep("asyncio cancel + call_later", _timed(asyncio_rearm, handles), i)
        await asyncio.sleep(0.01)  # the loop's own iteration drops the cancelled handles
    for c in conns:
        c.handle.cancel()

    sched = WheelScheduler(loop)
    for c in conns:
        c.handle = sched.call_later(DELAY_S, c.on_idle)
    keys = sched.keyed(lambda key: None)
    for k in range(handles):
        keys.arm(k, DELAY_S)

    def rearm() -> None:
        for c in order:
            c.handle.reschedule(DELAY_S)

    def keyed_rearm() -> None:
        arm = keys.arm
        for k in keys_order:
            arm(k, DELAY_S)

    def handle_floor() -> None:
        for c in order:
            c.handle.cancelled()

    def key_floor() -> None:
        for k in keys_order:
            k in keys  # noqa: B015 - the lookup is the point

    for i in range(repeats + 1):
        rng.shuffle(order)
        rng.shuffle(keys_order)
        keep("WheelHandle.reschedule", _timed(rearm, handles), i)
        keep("KeyedTimers.arm (re-arm)", _timed(keyed_rearm, handles), i)
        keep("floor: handle.cancelled()", _timed(handle_floor, handles), i)
        keep("floor: key in keys", _timed(key_floor, handles), i)
        await asyncio.sleep(0.01)
    sched.close()

    from timerwheel_c._wheel import TimerWheel

    wheel = TimerWheel(now_ms=0)
    ids = [wheel.schedule(int(DELAY_S * 1000), k) for k in range(handles)]

    def wheel_rearm() -> None:
        reschedule = wheel.reschedule
        for timer_id in ids:
            reschedule(timer_id, 30_000)

    def wheel_floor() -> None:
        due_ms = wheel.due_ms
        for timer_id in ids:
            due_ms(timer_id)

    for i in range(repeats + 1):
        rng.shuffle(ids)
        wheel.advance(wheel.now_ms() + 10)  # time moves on between passes, as on a server
        keep("TimerWheel.reschedule", _timed(wheel_rearm, handles), i)
        keep("floor: TimerWheel.due_ms", _timed(wheel_floor, handles), i)
    return {row: sorted(values)[len(values) // 2] for row, values in samples.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--handles", type=int, default=100_000, help="live timers (default 100000)")
    parser.add_argument("--repeats", type=int, default=7, help="measured passes (default 7)")
    args = parser.parse_args(argv)
    figures = asyncio.run(measure(args.handles, args.repeats))
    base = figures["asyncio cancel + call_later"]
    print(f"{args.handles} live timers, random order, CPU ns per re-arm (median of {args.repeats}):")
    for row, ns in figures.items():
        line = f"  {row:30s} {ns:8.1f} ns   asyncio / this: {base / ns:5.1f}x"
        floor = FLOORS.get(row)
        if floor in figures:
            ratio = ns / figures[floor]
            line += f"   / floor: {ratio:4.2f}x"
            if row != "TimerWheel.reschedule":
                line += f" (goal <= {FLOOR_TARGET:g}x: {'met' if ratio <= FLOOR_TARGET else 'NOT met'})"
        print(line)


if __name__ == "__main__":
    main()

"""Handlers and process entry points for the durable subprocess tests (restart, poison, sleep, CLI).

Run as ``python durable_handlers.py MODE ...`` or import ``registry`` (``--handlers durable_handlers:registry``).

- ``serve DB OFFSET_MS [HOLD_AFTER]``: a DurableTimerService on every partition of DB, its wall
  clock shifted by OFFSET_MS, until killed. With HOLD_AFTER, the Effect handler hangs from its
  HOLD_AFTER+1-th fire on, so a kill sent once HOLD_AFTER effects are seen lands mid-run however
  fast the process fires.
- ``sleeper DB LOG DELAY0_MS DELAY1_MS``: an execution doing two durable sleeps, each due its delay
  after the call that journals it (so a slow process start-up never eats into it), appending a
  line to LOG after each (``<n> fired|replayed <wall ms> <due ms asked>``), with a service in the
  same process. A replay waits on the due time journaled before, not on the one it asks.
- ``open URL GO``: import everything, print ``ready``, wait for the file GO to exist, then open
  (and close) the store of URL: many of these open one store at the same moment.
"""
from __future__ import annotations

import itertools
import os
import sys
import time

from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerKind, TimerRegistry
from timerwheel_c.durable.timers.tick import Backoff
from timerwheel_c.durable.service.service import DurableTimerService
from timerwheel_c.durable.timers.sleep import SLEEP_PARTITION, DurableContext, SleepHandler
from timerwheel_c.durable.storage.sqlite import SQLiteStore
from timerwheel_c.durable.storage.store import Batch

EFFECT_KIND = 0xF3
POISON_KIND = 0xF4
FIRST_HANGS_KIND = 0xF2
OCCURRENCE_KIND = 0xF5


class Effect(TimerHandler):
    """Done with one effect row per application, keyed by reference and a fresh token, so an effect
    applied twice shows as two rows. Sleeps 2 ms so a kill lands inside ``fire`` more often than not,
    and for an hour once ``hold_after`` fires have started (``None``: never)."""

    kind = TimerKind(EFFECT_KIND)
    hold_after: int | None = None
    # next() on itertools.count is atomic under the GIL, so concurrent fires each get their own number.
    _fires = itertools.count(1)

    def fire(self, ctx, timer):
        if self.hold_after is not None and next(self._fires) > self.hold_after:
            time.sleep(3600)
        time.sleep(0.002)
        token = os.urandom(8).hex().encode()
        return Done(Batch().put(b"effect/" + timer.reference + b"/" + token, b"1"))


class Poison(TimerHandler):
    """Kills the whole process on every try."""

    kind = TimerKind(POISON_KIND)

    def fire(self, ctx, timer):
        os._exit(3)


class FirstHangs(TimerHandler):
    """Hangs for an hour on a row's first attempt; on a later one, Done with one effect row per
    application holding the wall ms of the fire (a runner killed mid-hang leaves its claim behind,
    due again after a 30 s backoff: a fire long before that is the release's, not the backoff's)."""

    kind = TimerKind(FIRST_HANGS_KIND)
    backoff = Backoff(base_s=30)

    def fire(self, ctx, timer):
        if timer.attempt == 1:
            time.sleep(3600)
        token = os.urandom(8).hex().encode()
        return Done(Batch().put(b"effect/" + timer.reference + b"/" + token, b"%d" % (time.time_ns() // 1_000_000)))


# A runner of an older deploy: it lacks the Effect kind.
class Occurrence(TimerHandler):
    """Done with one effect row per application of a schedule's occurrence, keyed by the schedule's
    name, the occurrence's nominal time (20 digits, so the keys sort by it) and a fresh token: an
    occurrence committed twice shows as two rows."""

    kind = TimerKind(OCCURRENCE_KIND)

    def fire(self, ctx, timer):
        time.sleep(0.002)
        token = os.urandom(8).hex().encode()
        return Done(Batch().put(b"occurrence/" + timer.reference + b"/%020d/" % timer.due_at_ms + token, b"1"))


registry_without_effect = TimerRegistry().register(Poison()).register(SleepHandler())
registry = (TimerRegistry().register(Effect()).register(Poison()).register(SleepHandler())
            .register(FirstHangs()).register(Occurrence()))


def serve(db: str, offset_ms: str, hold_after: str | None = None) -> None:
    shift_ns = int(offset_ms) * 1_000_000
    if hold_after is not None:
        Effect.hold_after = int(hold_after)
    store = SQLiteStore(db)
    DurableTimerService(store, registry, None, wall_ns=lambda: time.time_ns() + shift_ns).start()
    while True:
        time.sleep(1)


def sleeper(db: str, log_path: str, delay0_ms: str, delay1_ms: str) -> None:
    store = SQLiteStore(db)
    with DurableTimerService(store, registry, [SLEEP_PARTITION]) as service:
        ctx = DurableContext(store, "execution-1", service=service)
        for n, delay_ms in enumerate((int(delay0_ms), int(delay1_ms))):
            due_ms = time.time_ns() // 1_000_000 + delay_ms
            replayed = ctx.sleep_until(due_ms, timeout_s=60)
            with open(log_path, "a") as f:
                f.write(f"{n} {'replayed' if replayed else 'fired'} {time.time_ns() // 1_000_000} {due_ms}\n")


def open_when(url: str, go: str) -> None:
    from timerwheel_c.durable.storage.open import open_store

    if url.startswith("postgres"):
        import timerwheel_c.durable.storage.postgres  # noqa: F401 -- imported before the rendezvous
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)
    open_store(url).close()


if __name__ == "__main__":
    {"serve": serve, "sleeper": sleeper, "open": open_when}[sys.argv[1]](*sys.argv[2:])

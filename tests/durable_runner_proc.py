"""A runner process for the cross-process durable tests: ``python durable_runner_proc.py MODE STORE READY``.

``STORE`` is a SQLite file path, or ``postgres:TABLE`` for that table in the database of
``TIMERWHEEL_C_TEST_PG_DSN``. It serves every partition of the store with a :class:`DurableTimerService` (default
settings except ``max_sleep_s``, an hour, so only the change signal can wake it), creates the file
``READY`` once started, and runs until killed.

- ``stamp``: kind 0xF5 fires with one effect row per application, ``effect/<reference>/<token>``
  holding the wall ms of the fire, so a double application shows as two rows.
- ``hang``: kind 0xF5 creates ``READY.<reference hex>`` when it starts, then sleeps for an hour
  (a handler the test kills mid-flight).

``registry`` holds the ``stamp`` handler, for ``timerwheel-c run --handlers durable_runner_proc:registry``.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from timerwheel_c.durable import DurableTimerService, SQLiteStore
from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerKind, TimerRegistry
from timerwheel_c.durable.storage.store import Batch

STAMP_KIND = 0xF5


class Stamp(TimerHandler):
    kind = TimerKind(STAMP_KIND)

    def fire(self, ctx, timer):
        token = os.urandom(8).hex().encode()
        now_ms = time.time_ns() // 1_000_000
        return Done(Batch().put(b"effect/" + timer.reference + b"/" + token, b"%d" % now_ms))


class Hang(TimerHandler):
    kind = TimerKind(STAMP_KIND)

    def __init__(self, ready: Path):
        self.ready = ready

    def fire(self, ctx, timer):
        Path(f"{self.ready}.{timer.reference.hex()}").touch()
        time.sleep(3600)
        return Done()


registry = TimerRegistry().register(Stamp())


def open_target(target: str):
    """The store named by a ``STORE`` argument (see the module docstring)."""
    if target.startswith("postgres:"):
        from timerwheel_c.durable.storage.postgres import PostgresStore

        return PostgresStore(os.environ["TIMERWHEEL_C_TEST_PG_DSN"], table=target[len("postgres:"):])
    return SQLiteStore(target)


def main(mode: str, target: str, ready: str) -> None:
    handler = Stamp() if mode == "stamp" else Hang(Path(ready))
    store = open_target(target)
    DurableTimerService(store, TimerRegistry().register(handler), max_sleep_s=3600).start()
    Path(ready).touch()
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main(*sys.argv[1:])

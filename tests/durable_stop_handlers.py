"""Handlers whose work outlives a stop, for tests/e2e/test_durable_stop_bounded.py (``--handlers
durable_stop_handlers:registry``). Each writes the file ``$STOP_TEST_MARKS/<its name>`` once the
situation it makes is in place, so that the test signals the runner only then."""
from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

from timerwheel_c.durable import Batch, Done, TimerHandler, TimerKind, TimerRegistry

ROW_LOCK_KIND = 0xE4
THREAD_KIND = 0xE3
HOUR_S = 3600


def _mark(name: str) -> None:
    Path(os.environ["STOP_TEST_MARKS"], name).touch()


class LocksItsRowThenDone(TimerHandler):
    """Locks every row of its partition (``SELECT ... FOR UPDATE``) in a transaction of its own that
    stays open for an hour, then returns Done: the commit of that Done waits on the lock, holding the
    runner's store connection, as a handler's long transaction on the same rows would."""

    kind = TimerKind(ROW_LOCK_KIND)

    def fire(self, ctx, timer):
        import psycopg

        locked = threading.Event()

        def hold() -> None:
            with psycopg.connect(os.environ["STOP_TEST_DSN"]) as conn:
                conn.execute("SELECT 1 FROM timerwheel_kv WHERE partition = %s FOR UPDATE", (ctx.partition,)).fetchall()
                locked.set()
                time.sleep(HOUR_S)

        threading.Thread(target=hold, daemon=True).start()
        locked.wait(HOUR_S)
        _mark("row-locked")
        return Done(Batch().put(b"effect/" + timer.reference, b"1"))


class AwaitsAThreadThatNeverReturns(TimerHandler):
    """``async def fire`` awaiting a call on the loop's default executor (what ``asyncio.to_thread``
    uses) that sleeps for an hour: cancelling the handler leaves that thread running, and
    ``concurrent.futures`` threads are joined when the interpreter exits."""

    kind = TimerKind(THREAD_KIND)

    async def fire(self, ctx, timer):
        _mark("thread-started")
        await asyncio.get_running_loop().run_in_executor(None, time.sleep, HOUR_S)
        return Done()


registry = TimerRegistry().register(LocksItsRowThenDone()).register(AwaitsAThreadThatNeverReturns())

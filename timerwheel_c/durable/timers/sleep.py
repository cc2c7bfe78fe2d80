"""Durable sleep for replayed executions (as in durable-execution engines such as Temporal's ``workflow.sleep``).

An execution (a workflow, a saga) that is re-run from the start after a restart calls
the same sleeps in the same order. :class:`DurableContext` names the n-th sleep of an
execution with a deterministic :class:`TimerId` (UUIDv5 of the execution id and n), and
journals it in one guarded commit: a *mark* row (:func:`keys.sleep_mark` of the timer id) and a timer row of
kind :data:`SLEEP_KIND` (0xFF) whose reference is the timer id. A
:class:`DurableTimerService` whose registry holds :class:`SleepHandler` fires the timer;
the handler's batch turns the mark into "fired" under ``require(Equals(mark, pending))``,
so two services firing at once mark it once. A replayed call finds its mark fired and
returns at once; a call whose mark is still pending waits for it, without journaling a
second timer.

Mark values: ``b"P" + due_at_ms u64 BE`` (pending) or ``b"F"`` (fired).

Waiting does not poll: a call sleeps on the monotonic clock until the due time (the
release timer in the ``await`` form), then re-reads its mark after each callback of the
store's change signal (:meth:`Store.watch`), which follows the service's commit of the
mark from any process; :data:`_RECHECK_S` is only a safety net.
"""
from __future__ import annotations

import math
import struct
import threading
import uuid
from dataclasses import dataclass
from typing import Optional

from . import keys
from .due import MAX_SPAN_S, due_at_ms_of
from .registry import Done, TimerHandler, TimerKind
from .timing import SYSTEM_CLOCK, Clock
from ..storage.store import Absent, Batch, Equals, Store, check_partition, check_store

__all__ = ["SLEEP_KIND", "SLEEP_PARTITION", "DurableContext", "SleepHandler", "TimerId"]

SLEEP_KIND = TimerKind(0xFF)
SLEEP_PARTITION = "durable-sleep"
_NAMESPACE = uuid.UUID("5b0c3a52-7d4e-4f0e-9a61-2f3c7d1e9b44")
_FIRED = b"F"
_PENDING = struct.Struct(">cQ")
_RECHECK_S = 1.0  # longest wait on the change signal before the mark is read again, seconds
# The longest single wait of the blocking form, seconds: a due time centuries ahead (keys allow
# 2**64-1 ms) is more than time.sleep takes (an OverflowError after the sleep was journaled), so it
# is waited for a day at a time (the clock's own sleep_until takes any deadline).
_WAIT_CHUNK_S = 86_400


@dataclass(frozen=True)
class TimerId:
    """The deterministic id of the ``n``-th sleep (n >= 0) of an execution: ``uuid5(namespace, f"{execution_id}/{n}")``."""

    uuid: uuid.UUID

    @classmethod
    def for_call(cls, execution_id: str, n: int) -> "TimerId":
        """Raises TypeError for a non-str id or non-int n, ValueError for an empty id, one with no UTF-8
        (a lone surrogate) or n < 0."""
        if not isinstance(execution_id, str):
            raise TypeError(f"execution_id must be a str, got {type(execution_id).__name__} {execution_id!r}")
        if not execution_id:
            raise ValueError("execution_id must be a non-empty str")
        try:
            execution_id.encode("utf-8")  # as uuid5 encodes it
        except UnicodeEncodeError:
            raise ValueError(f"execution_id must be encodable as UTF-8 (no lone surrogates), got {execution_id!r}") from None
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"n must be an int, got {type(n).__name__} {n!r}")
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        return cls(uuid.uuid5(_NAMESPACE, f"{execution_id}/{n}"))

    @property
    def bytes(self) -> bytes:
        """The 16 UUID bytes (the timer row's reference)."""
        return self.uuid.bytes


class SleepHandler(TimerHandler):
    """Fires durable sleeps: marks the sleep fired, guarded on its pending mark. Register it in the
    registry of a service that serves the sleeps' partition."""

    kind = SLEEP_KIND
    _writes_reserved_keys = True  # its batch marks the sleep fired, a row of the library's own

    def fire(self, ctx, timer):
        mark = keys.sleep_mark(timer.reference)
        current = ctx.store.get(ctx.partition, mark)
        if current is None or current == _FIRED:
            return Done()  # nothing to mark; the timer row just goes
        return Done(Batch().require(Equals(mark, current)).put(mark, _FIRED))


class DurableContext:
    """The durable-sleep API of one execution.

    Args:
        store: the backend.
        execution_id: a non-empty str naming the execution; equal ids replay the same sleeps.
        partition: where sleeps are journaled (default ``"durable-sleep"``); a service with
            :class:`SleepHandler` must serve it.
        service: the in-process :class:`DurableTimerService` serving ``partition``, if any; it is
            notified of each new sleep so it wakes in time. A service in another process finds
            the sleep on its next pass (at the latest after its ``max_sleep_s``).
        clock: the :class:`~.timing.Clock` the wait until the due time and ``timeout_s`` run on; None
            (default): ``service``'s clock when there is one, else the host's. A test gives the
            service's :class:`~.timing.ManualClock` and advances it.

    Each call of :meth:`sleep_until` / :meth:`sleep_until_async` is the next sleep of the
    execution (n = 0, 1, ...), whichever form is used.
    """

    def __init__(self, store: Store, execution_id: str, partition: str = SLEEP_PARTITION, service=None,
                 clock: Optional[Clock] = None):
        check_store(store)
        TimerId.for_call(execution_id, 0)  # validates the id
        self.store = store
        self.execution_id = execution_id
        self.partition = check_partition(partition)
        self.service = service
        self.clock: Clock = clock if clock is not None else getattr(service, "clock", SYSTEM_CLOCK)
        self.calls = 0

    def _journal(self, due_at_ms):
        """Journal the next sleep; return (mark key, due ms to wait for, or None when it had fired
        before this call: a replay). A relative due time (a timedelta) counts from the clock that
        judges it due: the service's, else this context's. The call counts (the next sleep is n + 1)
        only once the store has answered: one that raised journaled nothing, and its retry is the
        same sleep n, which a replay then finds where it looks."""
        if self.service is not None:
            due_at_ms = self.service.claimer.due_ms(due_at_ms, None)
        else:
            due_at_ms = due_at_ms_of(due_at_ms, base_ms=lambda: self.clock.wall_ns() // 1_000_000)
        tid = TimerId.for_call(self.execution_id, self.calls)
        timer_key = keys.timer(due_at_ms, SLEEP_KIND, tid.bytes)  # validates due_at_ms before any store call
        keys.declare_signals(self.store)
        mark = keys.sleep_mark(tid.bytes)
        current = self.store.get(self.partition, mark)
        journaled = current is None
        if journaled:
            pending = _PENDING.pack(b"P", due_at_ms)
            batch = Batch().require(Absent(mark)).put(mark, pending).put(timer_key, b"")
            batch.put(keys.identity(SLEEP_KIND, tid.bytes), timer_key)
            self.store.apply(self.partition, batch)  # a PreconditionFailed means a racing replay journaled it
            if self.service is not None:
                self.service.notify(self.partition, due_at_ms)
            current = self.store.get(self.partition, mark)
        self.calls += 1
        if current == _FIRED:
            # Journaled by this call, it is no replay even if the service fired it at once: the wait is
            # on its due time.
            return mark, due_at_ms if journaled else None
        assert current is not None  # the mark was found, or journaled just above
        return mark, _PENDING.unpack(current)[1]

    def _fired(self, mark: bytes) -> bool:
        return self.store.get(self.partition, mark) == _FIRED

    def _give_up_ns(self, timeout_s) -> Optional[int]:
        """When (monotonic ns on ``clock``) a wait of ``timeout_s`` seconds from now gives up; None for no
        timeout (None or infinity).

        Raises:
            TypeError / ValueError: ``timeout_s`` not None nor a number of seconds, or NaN, naming it.
        """
        if timeout_s is None:
            return None
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
            raise TypeError(f"timeout_s must be a number of seconds or None, got {type(timeout_s).__name__} {timeout_s!r}")
        if isinstance(timeout_s, float) and math.isnan(timeout_s):
            raise ValueError(f"timeout_s must be a number of seconds or None, got {timeout_s!r}")
        # Past the range of due times (1e308 s, whose ns a float makes inf; an int past a float's) is as good as none.
        return None if timeout_s > MAX_SPAN_S else self.clock.monotonic_ns() + round(max(0.0, timeout_s) * 1e9)

    def _timeout(self, mark: bytes, due: int, timeout_s) -> TimeoutError:
        return TimeoutError(f"durable sleep {mark[len(keys.SLEEP_MARK_TAG):].hex()} due {due} ms not fired within {timeout_s} s")

    def sleep_until(self, due_at_ms, timeout_s: Optional[float] = None) -> bool:
        """Block until the n-th sleep's timer (due ``due_at_ms``: Unix epoch ms or an aware datetime)
        has fired.

        Returns True when it had already fired (a replay) and the call returned at once.

        Raises:
            TypeError / ValueError: a bad ``due_at_ms`` (a naive datetime, a non-int).
            TimeoutError: not fired within ``timeout_s`` seconds (monotonic), if given.
        """
        give_up_ns = self._give_up_ns(timeout_s)
        mark, due = self._journal(due_at_ms)
        if due is None:
            return True
        clock = self.clock
        give_up = None if give_up_ns is None else give_up_ns / 1e9
        end_s = clock.monotonic_ns() / 1e9 + max(0.0, due / 1000 - clock.wall_ns() / 1e9)
        if give_up is not None:
            end_s = min(end_s, give_up)
        changed = threading.Event()
        with self.store.watch(changed.set):
            while True:
                left_s = end_s - clock.monotonic_ns() / 1e9
                if left_s <= 0:
                    break
                clock.sleep(min(left_s, _WAIT_CHUNK_S))
            while True:
                changed.clear()  # before the read: a commit after it sets the event again
                if self._fired(mark):
                    return False
                wait_s = _RECHECK_S
                if give_up is not None:
                    left_s = give_up - clock.monotonic_ns() / 1e9
                    if left_s <= 0:
                        raise self._timeout(mark, due, timeout_s)
                    wait_s = min(wait_s, left_s)
                changed.wait(wait_s)

    async def sleep_until_async(self, due_at_ms, timeout_s: Optional[float] = None) -> bool:
        """The ``await`` form of :meth:`sleep_until` (store calls are short and made on the loop thread);
        it sleeps on the release timer (``timerwheel_c.arm_at``) when this build has it. ``timeout_s``
        runs on ``clock``, as the wait for the due time does."""
        import asyncio  # here: the durable package loads without asyncio, and a coroutine has it loaded

        give_up_ns = self._give_up_ns(timeout_s)
        mark, due = self._journal(due_at_ms)
        if due is None:
            return True
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def on_change():
            loop.call_soon_threadsafe(changed.set)

        clock = self.clock

        async def wait():
            await clock.sleep_until(clock.monotonic_ns() + max(0, due * 1_000_000 - clock.wall_ns()))
            while True:
                changed.clear()
                if self._fired(mark):
                    return
                try:
                    # Real time: a poll in case a change signal is missed, never a deadline.
                    await asyncio.wait_for(changed.wait(), _RECHECK_S)
                except asyncio.TimeoutError:
                    pass

        with self.store.watch(on_change):
            if give_up_ns is None:
                await wait()
                return False
            waiting = asyncio.ensure_future(wait())
            give_up = asyncio.ensure_future(clock.sleep_until(give_up_ns))
            try:
                done, _ = await asyncio.wait({waiting, give_up}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiting.cancel()
                give_up.cancel()
            if waiting not in done:
                give_up.result()  # the wait's own error, if it failed: never taken for the timeout
                raise self._timeout(mark, due, timeout_s)
            waiting.result()  # its store error, if a read failed
        return False

"""DurableTimerService: runs :func:`run_due` on a background thread.

The thread loops: one pass of ``run_due`` over its partitions, then a sleep until the
earliest ``next_wake_ms`` of that pass. Due times are Unix epoch ms, but the sleep is
converted to a *monotonic* deadline at the moment it starts, so a wall-clock jump
cannot stall the service (after a jump the next pass recomputes from the new wall time).

Why an asyncio loop on the service thread: the sleep must end at whichever comes first
of the deadline and a *kick* (a nearer timer scheduled through :meth:`schedule`, or
:meth:`stop`). ``asyncio.wait({deadline, kick}, return_when=FIRST_COMPLETED)`` says that
directly, and ``loop.call_soon_threadsafe`` is the one thread-safe way in. The deadline
is the release timer's ``Deadline`` (``timerwheel_c.arm_at``) awaited in asyncio
when this build has it, else ``asyncio.sleep``; both run on the monotonic clock, and the
release timer releases within microseconds where asyncio's selector rounds to 1 ms.

Store errors (a locked or vanished database, a full disk) end the pass; they are
logged and the pass is retried after a backoff of 50 ms doubling to 5 s. Nothing but
:meth:`stop` ends the thread.
"""
from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from typing import Iterable, Optional

from . import keys
from .registry import TimerRegistry
from .runner import TickBudget, run_due
from .store import Batch, Committed, Equals, Store, check_bytes, check_partition

__all__ = ["DurableTimerService"]

log = logging.getLogger("timerwheel_c.durable")

_ERROR_BACKOFF_S = (0.05, 5.0)
_NS_PER_MS = 1_000_000


def _deadline_factory():
    """Return ``deadline(at_ns)`` -> awaitable completing at ``at_ns`` (int ns on time.monotonic_ns()).

    It awaits the process-wide release timer (``timerwheel_c.arm_at``: one release thread
    per process) when this build has it, else asyncio's own timer.
    """
    try:
        from .. import arm_at
    except ImportError:
        arm_at = None

    async def deadline(at_ns: int):
        if arm_at is None:
            await asyncio.sleep(max(0, at_ns - time.monotonic_ns()) / 1e9)
        else:
            await arm_at(at_ns / 1e9)

    return deadline


class DurableTimerService:
    """A background thread firing the durable timers of ``partitions`` in ``store``.

    Args:
        store: the backend (:class:`timerwheel_c.durable.store.Store`).
        registry: handlers by kind (:class:`TimerRegistry`).
        partitions: names to serve (non-empty str each), or None for every partition in
            the store (re-read on each pass) plus those scheduled through this service.
        fleet: divide ``partitions`` (None: all of the store's) with the other services asking
            for the same ones, each partition served by one live service at a time (see
            :mod:`timerwheel_c.durable.ownership`); the sleep is then capped at the ownership's
            check interval. None (default): True when ``partitions`` is None and the store
            supports it (:meth:`Store.ownership`: PostgreSQL), else False.
        budget: the :class:`TickBudget` of each ``run_due`` call.
        max_sleep_s: longest sleep, in seconds (finite, > 0). Writers in other processes cannot
            kick this thread, so it looks again at least this often.
        wall_ns: the Unix-epoch clock in ns (default :func:`time.time_ns`); tests shift it.

    Use as ``with DurableTimerService(...) as svc:`` or ``start()`` / ``stop()``. The lifecycle
    is one-shot: ``start()`` at most once, and never after ``stop()`` (even a ``stop()`` before
    any ``start()``); both raise RuntimeError. ``stop()`` may be called any number of times. Counters for monitoring: ``passes`` (completed passes),
    ``errors`` (failed passes), ``fired`` (timers committed). A handler that never returns
    holds the thread; ``stop()`` then gives up after its timeout (the thread is a daemon).

    Raises:
        TypeError / ValueError: bad arguments (e.g. ``max_sleep_s`` infinite, NaN or <= 0).
    """

    def __init__(
        self,
        store: Store,
        registry: TimerRegistry,
        partitions: Optional[Iterable[str]] = None,
        *,
        budget: TickBudget = TickBudget(),
        max_sleep_s: float = 30.0,
        wall_ns=time.time_ns,
        fleet: Optional[bool] = None,
    ):
        if not isinstance(store, Store):
            raise TypeError(f"store must be a Store, got {type(store).__name__} {store!r}")
        if not isinstance(registry, TimerRegistry):
            raise TypeError(f"registry must be a TimerRegistry, got {type(registry).__name__} {registry!r}")
        if isinstance(partitions, str):
            raise TypeError(f"partitions must be an iterable of str, not the str {partitions!r}")
        if not isinstance(budget, TickBudget):
            raise TypeError(f"budget must be a TickBudget, got {type(budget).__name__} {budget!r}")
        if isinstance(max_sleep_s, bool) or not isinstance(max_sleep_s, (int, float)):
            raise TypeError(f"max_sleep_s must be a number of seconds, got {type(max_sleep_s).__name__} {max_sleep_s!r}")
        if not (math.isfinite(max_sleep_s) and max_sleep_s > 0):
            raise ValueError(f"max_sleep_s must be finite and > 0 seconds, got {max_sleep_s!r}")
        self.store = store
        self.registry = registry
        self.partitions = None if partitions is None else [check_partition(p) for p in partitions]
        if fleet not in (None, True, False):
            raise TypeError(f"fleet must be None, True or False, got {fleet!r}")
        self.ownership = store.ownership(self.partitions) if fleet or (fleet is None and partitions is None) else None
        if fleet and self.ownership is None:
            raise ValueError(f"fleet=True needs a store that divides partitions among runners (PostgreSQL), got {store!r}")
        self.budget = budget
        self.max_sleep_s = float(max_sleep_s)
        self._wall_ns = wall_ns
        self._extra: set[str] = set()
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._stopping = False
        self._ready = threading.Event()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._kick: Optional[asyncio.Event] = None
        # Wall ms the thread sleeps until; None while a pass runs or when no timer is left, so
        # that any schedule() then kicks (a kick during a pass makes the following sleep return at once).
        self._wake_ms: Optional[int] = None
        self.passes = 0
        self.errors = 0
        self.fired = 0

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> "DurableTimerService":
        """Start the thread; returns self once it is ready.

        Raises:
            RuntimeError: already started, or already stopped (the lifecycle is one-shot).
        """
        if self._thread is not None:
            raise RuntimeError("DurableTimerService already started")
        if self._stopping:
            raise RuntimeError("DurableTimerService was stopped; a stopped service cannot be started (create a new one)")
        self._thread = threading.Thread(target=self._run, name="durable-timers", daemon=True)
        self._thread.start()
        self._ready.wait()
        return self

    def stop(self, timeout: Optional[float] = 10.0) -> None:
        """Stop the thread after its current ``run_due`` call, waiting up to ``timeout`` seconds."""
        self._stopping = True
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        """True while the thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- scheduling ---------------------------------------------------------------------
    def _check_served(self, partition: str) -> str:
        check_partition(partition)
        if self.partitions is not None and partition not in self.partitions:
            raise ValueError(f"partition {partition!r} is not served by this service ({self.partitions})")
        return partition

    def schedule(self, partition: str, due_at_ms: int, kind, reference: bytes, value: bytes = b"") -> bytes:
        """Write a timer row (overwriting one with the same key) and wake the thread if it is nearer
        than the current sleep. ``due_at_ms`` is Unix epoch ms. Returns the row's key.

        Raises:
            TypeError / ValueError: bad arguments (see :func:`keys.timer`), a partition not served.
            Exception: whatever the store raises.
        """
        key = keys.timer(due_at_ms, kind, reference)
        check_bytes("value", value)
        self._check_served(partition)
        self.store.apply(partition, Batch().put(key, value))
        self.notify(partition, due_at_ms)
        return key

    def notify(self, partition: str, due_at_ms: int) -> None:
        """Tell the service that a timer due at ``due_at_ms`` (Unix epoch ms) was written to
        ``partition`` by other code in this process (e.g. a :class:`DurableContext`); wakes the
        thread if that is nearer than its current sleep."""
        self._check_served(partition)
        with self._lock:
            if self.partitions is None:
                self._extra.add(partition)
            wake = self._wake_ms
        if self.ownership is not None:
            self.ownership.recheck()
        if wake is None or due_at_ms < wake:
            self._wake()

    def cancel(self, partition: str, due_at_ms: int, kind, reference: bytes) -> bool:
        """Delete the timer row scheduled at ``due_at_ms`` (Unix epoch ms); True if this call removed it.

        A row that is being fired or is backed off has left that key, so it is not cancelled (False).
        """
        key = keys.timer(due_at_ms, kind, reference)
        self._check_served(partition)
        value = self.store.get(partition, key)
        if value is None:
            return False
        return isinstance(self.store.apply(partition, Batch().require(Equals(key, value)).delete(key)), Committed)

    # -- the thread ---------------------------------------------------------------------
    def _wake(self) -> None:
        loop, kick = self._loop, self._kick
        if loop is not None and kick is not None:
            try:
                loop.call_soon_threadsafe(kick.set)
            except RuntimeError:  # the loop has closed: the thread is exiting anyway
                pass

    def _run(self) -> None:
        try:
            while not self._stopping:
                try:
                    asyncio.run(self._main())
                except Exception:  # a bug outside the guarded pass: log, and keep the service alive
                    log.exception("durable timer service loop failed; restarting it")
                    self._ready.set()
                    time.sleep(_ERROR_BACKOFF_S[0])
        finally:
            if self.ownership is not None:
                self.ownership.close()
            # A stop() racing start() can end the loop before _main ran: start() must not wait forever.
            self._ready.set()

    def _served(self) -> list:
        if self.ownership is not None:
            return self.ownership.owned()
        if self.partitions is not None:
            return self.partitions
        with self._lock:
            extra = set(self._extra)
        return sorted(extra.union(self.store.partitions()))

    def _pass(self) -> Optional[int]:
        """One run_due per partition; returns the earliest next wake (Unix epoch ms) or None."""
        wake = None
        for partition in self._served():
            if self._stopping:
                break
            report = run_due(self.store, partition, self.registry, self._wall_ns() // _NS_PER_MS, self.budget)
            self.fired += report.fired
            if report.malformed:
                log.warning("partition %r: %d malformed timer rows kept in quarantine (keys.QUARANTINE_RANGE)", partition, report.malformed)
            if report.next_wake_ms is not None and (wake is None or report.next_wake_ms < wake):
                wake = report.next_wake_ms
        return wake

    async def _main(self) -> None:
        deadline = _deadline_factory()
        self._kick = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._ready.set()
        failures = 0
        try:
            while not self._stopping:
                self._wake_ms = None
                self._kick.clear()
                try:
                    wake_ms = self._pass()
                    failures = 0
                except Exception:
                    failures += 1
                    self.errors += 1
                    delay_s = min(_ERROR_BACKOFF_S[0] * 2 ** min(failures - 1, 16), _ERROR_BACKOFF_S[1])
                    log.warning("durable timer pass failed (%d in a row); retrying in %.2f s", failures, delay_s, exc_info=True)
                    at_ns = time.monotonic_ns() + int(delay_s * 1e9)
                else:
                    self.passes += 1
                    with self._lock:
                        self._wake_ms = wake_ms
                    # Convert to the monotonic clock once, here: a later wall-clock jump cannot move it.
                    max_s = self.max_sleep_s if self.ownership is None else min(self.max_sleep_s, self.ownership.check_interval_s)
                    max_ns = int(max_s * 1e9)
                    sleep_ns = max_ns if wake_ms is None else min(max(0, wake_ms * _NS_PER_MS - self._wall_ns()), max_ns)
                    at_ns = time.monotonic_ns() + sleep_ns
                if self._stopping:
                    break
                await self._sleep_until(deadline, at_ns)
        finally:
            self._loop = None

    async def _sleep_until(self, deadline, at_ns: int) -> None:
        assert self._kick is not None  # set by the serving loop before it first sleeps
        kick = asyncio.ensure_future(self._kick.wait())
        timer = asyncio.ensure_future(deadline(at_ns))
        try:
            await asyncio.wait({kick, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            kick.cancel()
            timer.cancel()

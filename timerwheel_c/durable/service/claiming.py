"""The claim stage: a task on the service's loop that claims due rows on the store thread and hands
them, as :class:`~.records.Job` records, to the run stage (:class:`~.executor.Executor`).

Its loop, after APScheduler 4's ``_process_jobs`` and pgqueuer's ``qm.py``: run a pass
(:class:`~.passes.Passes`, on the store thread), submit its rows, then sleep until the earliest of:
the next due time of the pass (converted to a *monotonic* deadline once, so a wall-clock jump cannot
stall it), a step of the wall clock either way (read every :data:`CLOCK_CHECK_S`), a ring of its
:class:`~.wakeup.Wakeup`, and ``max_sleep_s`` (a safety net). The wakeup rings on the store's change
signal (:meth:`Store.watch`: PostgreSQL ``NOTIFY``, SQLite ``data_version``), so a timer written by
any process wakes it; on a timer written in this process nearer than the sleep; on a handler slot
freeing up while due rows wait for one; and on a stop. In a fleet a change signal also makes the
next pass re-check ownership (at most every :data:`RECHECK_MIN_S`), so a timer in a partition no
runner owns yet (new, or newly emptied) fires as promptly as any other.

With no free slot it runs no pass; in a fleet it still evaluates its ownership, which is the
runner's heartbeat (its lease): handlers that fill every slot for long must not make it look frozen.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
from typing import Callable, Optional

from ..storage.store import Ownership, Store
from ..storage.watch import Watcher
from ..timers import keys
from ..timers.claim import refund_rows, release_rows
from ..timers.due import DueMs, due_at_ms_of, due_or_delay
from ..timers.registry import TimerRegistry
from ..timers.runner import PAGE, TickBudget
from ..timers.timing import Clock, Timing
from .activity import Activity
from .clock import StoreClock
from .executor import SHARE_S, Executor
from .metrics import BACKLOG_EVERY_S, Recorder, due_backlog, parked_count, shard_backlog
from .passes import PassResult, Passes
from .pool import DaemonPool
from .records import InFlight
from .wakeup import Wakeup

__all__ = ["CLOCK_CHECK_S", "CLOCK_STEP_NS", "RECHECK_MIN_S", "Claimer"]

log = logging.getLogger("timerwheel_c.durable")

RECHECK_MIN_S = 0.02  # the most often a change signal makes a fleet runner re-check ownership
#: Seconds between two reads of the wall clock during a sleep, and the change (ns) of the wall
#: clock against the monotonic one that counts as a step: a step either way ends the sleep, whose
#: deadline was converted from a due time under the old reading (see :meth:`Claimer._wall_clock_stepped`).
CLOCK_CHECK_S = 1.0
CLOCK_STEP_NS = 100_000_000
_NS_PER_MS = 1_000_000


class Claimer:
    """The claim stage of one service: its task on the loop, its store thread, its passes.

    Args:
        store, registry, budget, partitions, ownership, clock, timing, max_sleep_s: the service's
            (``partitions`` checked; None: every partition of the store).
        wall_ns: the Unix-epoch clock in ns that judges due times; None: the store server's clock
            (:class:`~.clock.StoreClock`, read before a pass when it is time to), carried on ``clock``.
        busy: the rows in flight, never claimed again.
        recorder: where passes' claims and store errors are counted; wakeup: what ends its sleeps.

    ``pass_count``: completed passes. ``passes.store``: the connection claims run on (:meth:`start`
    may give one of the service's own). ``stopping``: set by the service; the loop ends at its next look.
    """

    def __init__(self, store: Store, registry: TimerRegistry, budget: TickBudget, partitions: Optional[list],
                 ownership: Optional[Ownership], clock: Clock, timing: Timing, max_sleep_s: float,
                 wall_ns: Optional[Callable[[], int]], busy: InFlight, recorder: Recorder, wakeup: Wakeup):
        self.store = store
        self.partitions = partitions
        self.ownership = ownership
        self.clock = clock
        self.timing = timing
        self.max_sleep_s = max_sleep_s
        self.store_clock: Optional[StoreClock] = None
        if wall_ns is None:
            self.store_clock = StoreClock(clock.wall_ns, clock.monotonic_ns)
            wall_ns = self.store_clock.now_ns
        self.wall_ns: Callable[[], int] = wall_ns
        self.busy = busy
        self.recorder = recorder
        self.activity: Activity = recorder.activity
        self.wakeup = wakeup
        self.pool: Optional[DaemonPool] = None
        self.watcher: Optional[Watcher] = None  # the store's change signal, while the loop runs
        self.pass_count = 0
        self.stopping = False
        self._last_recheck_s = 0.0
        self._backlog_cache: tuple = (-math.inf, ({}, {}, {}, {}))  # (monotonic s, backlog())
        self._backlog_counting: Optional[concurrent.futures.Future] = None  # the last count submitted
        # Serving the whole store (alone, or a fleet's share of its shards), a pass reads by shard: its
        # cost does not grow with the number of partitions.
        shards: Optional[Callable[[], list]] = None
        # Monotonic ns of the next read of the store's shard count, when this service serves every
        # shard alone (a fleet's ownership reads it at each evaluation): None when it does not.
        self._shard_count_read_ns: Optional[int] = None
        if ownership is not None and ownership.by_shard:
            shards = ownership.owned
        elif ownership is None and partitions is None:
            shards = lambda: list(range(store.shard_count))  # noqa: E731
            self._shard_count_read_ns = 0
        self.passes = Passes(store, registry, budget, self._served, ownership, recorder, self.wall_ms, timing,
                              self.monotonic_s, shards=shards)

    def wall_ms(self) -> int:
        return self.wall_ns() // _NS_PER_MS

    def due_ms(self, due_at_ms, delay) -> DueMs:
        """A due time given to the service (see :func:`~..timers.due.due_or_delay`), checked; a relative
        one counted from :meth:`wall_ms`, the clock that judges it due once the service has read the store's
        clock (before its first read, as before start(), the host's clock stands in)."""
        return DueMs(due_at_ms_of(due_or_delay(due_at_ms, delay, base_ms=self.wall_ms), base_ms=self.wall_ms))

    def monotonic_s(self) -> float:
        return self.clock.monotonic_ns() / 1e9

    def start(self) -> DaemonPool:
        """Start the store thread; returns its pool. Claims run on a connection of its own whose lock
        waits are bounded (the timing's ``lock_wait_ms``), where the store opens one: a lock held on one
        partition then holds up that partition alone. The caller's store, and its connection, stay as
        they were (handlers and the caller's own writes use it)."""
        self.pool = DaemonPool(1, "durable-store")
        self.passes.store = self.store.open_sibling(lock_wait_ms=self.timing.lock_wait_ms) or self.store
        return self.pool

    def close(self) -> None:
        """As the service's thread ends: let the store thread go, closing the connection of its own
        there, after any call still running (never waited for)."""
        if self.pool is not None:
            if self.passes.store is not self.store:
                self.pool.submit(self.passes.store.close)
            self.pool.shutdown()

    async def on_store(self, fn, *args):
        """Run the blocking store call ``fn(*args)`` on the store thread."""
        assert self.pool is not None
        return await asyncio.wrap_future(self.pool.submit(fn, *args))

    def _store_failed(self, exc: BaseException, failures: int, what: str, kind: Optional[str] = None) -> float:
        return self.recorder.store_failed(exc, failures, what, self.timing.backoff_s(failures), kind)

    # -- the loop ----------------------------------------------------------------------------
    async def serve(self, executor: Executor, ready: threading.Event) -> None:
        """Claim rows and submit them to the run stage ``executor`` until :attr:`stopping`, the change
        signal open (until :meth:`unlisten`); ``ready`` is set once the change signal is open and the
        wakeup bound (a ring from then on is never lost)."""
        self.wakeup.bind()
        self.watcher = self._open_watcher()
        ready.set()
        failures = 0
        while not self.stopping:
            self.wakeup.sleeping_until(None)
            assert self.wakeup.kick is not None
            self.wakeup.kick.clear()
            if self.watcher is None:
                self.watcher = self._open_watcher()
            self.activity.maybe_summarize()
            max_s = min(self.max_sleep_s, self.activity.summary_due_in_s())
            if self.ownership is not None:  # ownership changes (a runner joins or dies) need a look this often
                max_s = min(max_s, self.ownership.check_interval_s)
            recheck_s = self._recheck_in_s()
            if recheck_s is not None:
                max_s = min(max_s, recheck_s)
            max_ns = int(max_s * 1e9)
            free = executor.free()
            if free <= 0:
                executor.starved = True
                at_ns = self.clock.monotonic_ns() + max_ns
                if self.ownership is not None:
                    await self.on_store(self._heartbeat)
            else:
                try:
                    result = await self.on_store(self._pass, free, self.busy.keys(), lambda: self.stopping,
                                                 executor.rows_within(SHARE_S, PAGE))
                    failures = 0
                except Exception as exc:  # only reading the served partitions fails a whole pass
                    failures += 1
                    at_ns = self.clock.monotonic_ns() + int(self._store_failed(exc, failures, "pass") * 1e9)
                else:
                    self.pass_count += 1
                    executor.submit(result.jobs, result.starved)
                    wake_ms = result.wake_ms
                    self.wakeup.sleeping_until(wake_ms)
                    # Convert to the monotonic clock once, here: a later wall-clock jump cannot move it.
                    sleep_ns = max_ns if wake_ms is None else min(max(0, wake_ms * _NS_PER_MS - self.wall_ns()),
                                                                  max_ns)
                    at_ns = self.clock.monotonic_ns() + sleep_ns
                    read_ns = None if self.store_clock is None else self.store_clock.next_read_ns()
                    if read_ns is not None:  # until that read the clock lags, and so does the deadline just converted
                        at_ns = min(at_ns, read_ns)
            if self.stopping:
                break
            await self._sleep_until(at_ns)

    def unlisten(self) -> None:
        """Close the change signal and unbind the wakeup, once the pipeline has drained (on the loop)."""
        if self.watcher is not None:
            self.watcher.close()
        self.watcher = None
        self.wakeup.unbind()

    def _heartbeat(self) -> None:
        """On the store thread: evaluate the ownership when it is due (see :mod:`.ownership`'s lease)."""
        assert self.ownership is not None
        try:
            self.ownership.owned()
        except Exception as exc:
            self._store_failed(exc, 1, "ownership check")

    def _pass(self, *args) -> PassResult:
        """On the store thread: read the server's clock, and the store's shard count (another
        process's reshard changes it), when it is time to, then a claim pass."""
        if self.store_clock is not None:
            self.store_clock.refresh(self.passes.store)
        if self._shard_count_read_ns is not None and self.clock.monotonic_ns() >= self._shard_count_read_ns:
            self.passes.store.refresh_shard_count()
            self._shard_count_read_ns = self.clock.monotonic_ns() + int(self.timing.ownership_interval_s * 1e9)
        return self.passes.run(*args)

    async def _sleep_until(self, at_ns: int) -> None:
        assert self.wakeup.kick is not None  # bound by serve() before it first sleeps
        kick = asyncio.ensure_future(self.wakeup.kick.wait())
        timer = asyncio.ensure_future(self.clock.sleep_until(at_ns))
        waits = {kick, timer}
        if at_ns - self.clock.monotonic_ns() > CLOCK_CHECK_S * 1e9:  # a shorter sleep ends before its first look
            waits.add(asyncio.ensure_future(self._wall_clock_stepped()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()

    async def _wall_clock_stepped(self) -> None:
        """Return once the wall clock steps (moves against the monotonic clock by more than
        :data:`CLOCK_STEP_NS`), read every :data:`CLOCK_CHECK_S`. A sleep's deadline is monotonic,
        converted from a due time by the wall clock of its pass: a pass run while the clock was set
        back an hour sleeps up to ``max_sleep_s``, and only this ends that sleep once the clock is
        corrected (a step forward makes timers due now), within about a second."""
        offset_ns = self.wall_ns() - self.clock.monotonic_ns()
        while abs(self.wall_ns() - self.clock.monotonic_ns() - offset_ns) <= CLOCK_STEP_NS:
            # On the monotonic clock: a step of the wall clock does not move it.
            await self.clock.sleep_until(self.clock.monotonic_ns() + int(CLOCK_CHECK_S * 1e9))

    def _open_watcher(self) -> Optional[Watcher]:
        try:
            keys.declare_signals(self.store)  # the writes that must wake it: not its own claims
            return self.store.watch(self.wakeup.changed_signal)
        except Exception as exc:
            self._store_failed(exc, 1, "change signal")
            return None

    def _served(self) -> list:
        if self.ownership is not None:
            return self.ownership.owned()
        if self.partitions is not None:
            return self.partitions
        return sorted(self.wakeup.written_partitions().union(self.store.partitions()))

    def _recheck_in_s(self) -> Optional[float]:
        """In a fleet after a change signal: ask the ownership to re-check now, or say in how many
        seconds it may (at most one forced re-check per RECHECK_MIN_S)."""
        if self.ownership is None or not self.wakeup.changed:
            return None
        left_s = self._last_recheck_s + RECHECK_MIN_S - self.monotonic_s()
        if left_s > 0:
            return left_s
        self.wakeup.changed = False
        self._last_recheck_s = self.monotonic_s()
        self.ownership.recheck()
        return None

    def serves_alone(self) -> bool:
        """Whether this runner serves the whole store by itself now, read without a round trip: it owns
        every unit of its fleet (every partition it divides, or every shard), or it is in no fleet and
        serves every partition. A runner pinned to a list of partitions may have others beside it."""
        if self.ownership is None:
            return self.partitions is None
        units = self.store.shard_count if self.ownership.by_shard else len(self.partitions or ())
        return len(self.ownership.last_owned()) >= units > 0

    # -- on stop -----------------------------------------------------------------------------
    async def release_unsettled(self, release_started: bool) -> None:
        """Give their attempt back to the claimed rows no handler was called for, due now; with
        ``release_started``, also make due now (attempt kept) the rows given up in their handler."""
        by_partition: dict = {}
        for job in self.busy.jobs.values():
            if release_started or not job.started:
                by_partition.setdefault((job.partition, job.started), []).append(job)
        for (partition, started), claimed in by_partition.items():
            move, what = (release_rows, "released") if started else (refund_rows, "gave the attempt back to")
            try:
                moved = await self.on_store(move, self.passes.store, partition, claimed, self.wall_ms())
            except Exception as exc:
                self._store_failed(exc, 1, f"release of this runner's claims on partition {partition!r}", kind="release")
                continue
            log.info("partition %r: %s %d unsettled claim(s) on stop; another runner fires them now",
                     partition, what, moved)

    # -- for the metrics ---------------------------------------------------------------------
    def backlog(self) -> tuple:
        """On the store thread: ``(due rows, parked timers)`` per served partition, then the same per
        shard, each counted up to BACKLOG_CAP: a service reading the store by shard counts by shard
        (and its two by partition are empty), any other by partition."""
        now_ms = self.wall_ms()
        if self.passes.shards is not None:
            return ({}, {}, *shard_backlog(self.store, self.passes.shards(), now_ms))
        served = self._served()
        return ({partition: due_backlog(self.store, partition, now_ms)[0] for partition in served},
                {partition: parked_count(self.store, partition) for partition in served}, {}, {})

    def backlog_cached(self, timeout_s: float) -> tuple:
        """:meth:`backlog` counted on the store thread at most once per BACKLOG_EVERY_S (a call within
        that reuses the last count), waiting at most ``timeout_s`` (0: none, both empty); both empty
        when the store does not answer in time. A count still queued or running from an earlier call
        is waited for, not queued again. Never raises on a store error."""
        pool = self.pool
        if pool is None or timeout_s <= 0:
            return {}, {}, {}, {}
        cached_at_s, cached = self._backlog_cache
        if self.monotonic_s() - cached_at_s < BACKLOG_EVERY_S:
            return cached
        counting = self._backlog_counting
        if counting is None or counting.done():
            # A count that timed out is still queued or running on the store thread: a scrape waits
            # for it instead of queuing another, or a store that stalled for minutes met, once back, a
            # scan of every served partition per scrape of the outage ahead of the service's next pass.
            counting = self._backlog_counting = pool.submit(self.backlog)
        try:
            counted = counting.result(timeout=timeout_s)
        except Exception:  # a store down or slow: the other figures still tell the story
            counted = {}, {}, {}, {}
        self._backlog_cache = (self.monotonic_s(), counted)
        return counted

    def owned(self, backlog: dict) -> int:
        """The partitions (or shards) this runner serves now, for the metrics: never a round trip."""
        if self.passes.shards is not None:  # serving the whole store: the shards it reads
            return self.store.shard_count if self.ownership is None else len(self.ownership.last_owned())
        if backlog:
            return len(backlog)
        if self.ownership is None:
            return len(self.partitions or ())
        return len(self.ownership.last_owned())  # see last_owned()

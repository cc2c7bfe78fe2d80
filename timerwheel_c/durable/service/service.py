"""DurableTimerService: fires durable timers from a background thread, up to ``concurrency`` at once.

The thread runs an asyncio loop. Each *pass* claims the due rows of the served
partitions (:func:`timerwheel_c.durable.runner.claim_due`: one guarded move per row to
its next backoff key, so every attempt is counted before ``fire``), at most as many as
there is room for (see below), and starts one task per claimed row as handler slots
free up. A task runs the handler (``async def fire`` awaited on the loop, a plain
``fire`` on a worker of a bounded pool of daemon threads), turns the outcome into a guarded batch
(:func:`~timerwheel_c.durable.runner.settle`) and queues it; a commit task writes the
queued outcomes with :func:`~timerwheel_c.durable.runner.commit_outcomes` (one
``apply_many`` per partition). Each outcome is guarded on its own claimed row, exactly
as in a sequential :func:`~timerwheel_c.durable.runner.run_due`. Store calls run on one
dedicated worker thread, so neither a slow handler nor a slow store blocks the loop,
and a slow handler holds only its own slot: claims and wake-ups of the others go on.

Claims are made ahead of free slots, into a local queue, but only as many as the slots
would start within :data:`QUEUE_HORIZON_S` at the measured mean duration of a handler call
(none before the first measurement): no-op handlers then get passes of up to
``budget.max_fired`` rows, like a sequential ``run_due`` chunk, while a queued row never
waits anywhere near its first backoff (5 s), after which another runner could claim it.
For the same reason a worker takes queued sync fires in runs of :data:`CHUNK_S` (5 ms)
of measured work: a cheap handler does not pay a thread hand-off per call, and a slow
one still gets a slot of its own.

Between passes the thread sleeps until the earliest of: the next due time of the pass
(converted to a *monotonic* deadline once, so a wall-clock jump cannot stall it; the
deadline is the release timer's ``arm_at`` when this build has it, else
``asyncio.sleep``), a *kick* and ``max_sleep_s``. A kick comes from the store's change
signal (:meth:`Store.watch`: PostgreSQL ``NOTIFY``, SQLite ``data_version``), so a timer
written by any process wakes the thread; from :meth:`schedule` / :meth:`notify` in this
process; from a handler slot freeing up while due rows wait for one; and from
:meth:`stop`. ``max_sleep_s`` is only a safety net.

Store errors end the pass (or delay the commit, which is retried: its guards make a retry
safe) and are retried after a backoff of 50 ms doubling to 5 s. Transient ones (see
:mod:`timerwheel_c.durable.store_errors`) are logged at WARNING and counted in
``transient_errors``; anything else at ERROR with its traceback, in ``other_errors``.
Nothing but :meth:`stop` ends the thread.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import inspect
import logging
import math
import threading
import time
from typing import Iterable, Optional

from ..timers import writer
from .activity import Activity
from ..timers.deadline import deadline_factory
from ..timers.due import due_at_ms_of
from .pool import DaemonPool
from ..timers.registry import TimerContext, TimerKind, TimerRegistry
from ..timers.runner import PAGE, ClaimedTimer, RunReport, TickBudget, claim_due, commit_outcomes, next_wake, settle
from ..storage.store import Store, check_partition
from ..storage.errors import is_transient
from ..storage.watch import Watcher

__all__ = ["DEFAULT_CONCURRENCY", "DurableTimerService"]

log = logging.getLogger("timerwheel_c.durable")

DEFAULT_CONCURRENCY = 16
_DEFAULT_BUDGET = TickBudget()
_ERROR_BACKOFF_S = (0.05, 5.0)
_TEARDOWN_S = 1.0  # seconds stop() allows, past its timeout, for the thread to close its watcher and exit
_NS_PER_MS = 1_000_000
QUEUE_HORIZON_S = 0.5
CHUNK_S = 0.005  # longest run of queued sync fires one worker takes at once, at the measured mean
COMMIT_GATHER_S = 0.002  # how long a commit of fewer than PAGE outcomes waits for more while handlers run
_MEAN_WEIGHT = 0.1  # of the newest handler duration in the running mean


def _check_positive(name: str, value: object, unit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of {unit}, got {type(value).__name__} {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0 {unit}, got {value!r}")
    return float(value)


def _backoff_s(failures: int) -> float:
    return min(_ERROR_BACKOFF_S[0] * 2 ** min(failures - 1, 16), _ERROR_BACKOFF_S[1])


class DurableTimerService:
    """A background thread firing the durable timers of ``partitions`` in ``store``.

    Args:
        store: the backend (:class:`timerwheel_c.durable.store.Store`).
        registry: handlers by kind (:class:`TimerRegistry`).
        partitions: names to serve (non-empty str each), or None for every partition in
            the store (re-read on each pass) plus those scheduled through this service.
        concurrency: handlers running at once (int >= 1; default :data:`DEFAULT_CONCURRENCY`,
            16: handlers waiting 20 ms on I/O then reach several hundred fires per second,
            and each pass claims up to 16 rows in one round trip, which keeps the cost of a
            pass small against the fires it starts; idle worker threads cost nothing). Sync
            handlers get that many daemon worker threads; async ones run on the service's loop. Commits of outcomes are batched on one store thread, so the
            limit never multiplies connections or writers.
        budget: the :class:`TickBudget` of each pass, per partition (``max_fired`` is
            further lowered to the free handler slots). Its caps, and a handler's
            ``max_per_tick``, bound the rows one pass claims, not the handlers in flight:
            ``concurrency`` bounds those.
        max_sleep_s: longest sleep between passes, in seconds (finite, > 0); a safety net
            only, since the store's change signal wakes the thread on every timer write.
        fleet: divide ``partitions`` (None: all of the store's) with the other services asking
            for the same ones, each partition served by one live service at a time (see
            :mod:`timerwheel_c.durable.ownership`); the sleep is then capped at the ownership's
            check interval. None (default): True when ``partitions`` is None and the store
            supports it (:meth:`Store.ownership`: PostgreSQL), else False.
        summary_interval_s: seconds (finite, > 0) between INFO summaries of the work done
            (see :mod:`timerwheel_c.durable.activity`).
        wall_ns: the Unix-epoch clock in ns (default :func:`time.time_ns`); tests shift it.

    Use as ``with DurableTimerService(...) as svc:`` or ``start()`` / ``stop()``. The lifecycle
    is one-shot: ``start()`` at most once, and never after ``stop()`` (even a ``stop()`` before
    any ``start()``); both raise RuntimeError. ``stop()`` may be called any number of times.

    Counters for monitoring: ``passes`` (completed passes), ``fired`` (outcomes committed),
    ``failed`` (fires that raised, returned Retry or an invalid outcome, or lost their
    guard), ``errors`` (failed store calls) split into ``transient_errors`` and
    ``other_errors``; ``in_flight`` (handlers running now) and ``queued`` (rows claimed
    and waiting for a slot).

    A handler that runs past its row's backoff (5 s on the first attempt) may be claimed
    and fired again beside itself, as by a second runner: only one outcome commits, and
    effects outside the outcome's batch must be idempotent.

    Raises:
        TypeError / ValueError: bad arguments (e.g. ``max_sleep_s`` infinite, NaN or <= 0,
            ``concurrency`` < 1), naming the value.
    """

    def __init__(
        self,
        store: Store,
        registry: TimerRegistry,
        partitions: Optional[Iterable[str]] = None,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        budget: TickBudget = _DEFAULT_BUDGET,
        max_sleep_s: float = 30.0,
        summary_interval_s: float = 60.0,
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
        if isinstance(concurrency, bool) or not isinstance(concurrency, int):
            raise TypeError(f"concurrency must be an int, got {type(concurrency).__name__} {concurrency!r}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        # Every argument is checked before the ownership, which may hold a connection, is opened.
        self.max_sleep_s = _check_positive("max_sleep_s", max_sleep_s, "seconds")
        self.activity = Activity(_check_positive("summary_interval_s", summary_interval_s, "seconds"))
        self.store = store
        self.registry = registry
        self.partitions = None if partitions is None else [check_partition(p) for p in partitions]
        self.concurrency = concurrency
        if fleet not in (None, True, False):
            raise TypeError(f"fleet must be None, True or False, got {fleet!r}")
        self.ownership = store.ownership(self.partitions) if fleet or (fleet is None and partitions is None) else None
        if fleet and self.ownership is None:
            raise ValueError(f"fleet=True needs a store that divides partitions among runners (PostgreSQL), got {store!r}")
        self.budget = budget
        self._wall_ns = wall_ns
        self._extra: set[str] = set()
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._stopping = False
        self._stop_at: Optional[float] = None  # monotonic s by which stop() wants the thread gone
        self._ready = threading.Event()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._kick: Optional[asyncio.Event] = None
        # Wall ms the thread sleeps until; None while a pass runs or when no timer is left, so
        # that any schedule() then kicks (a kick during a pass makes the following sleep return at once).
        self._wake_ms: Optional[int] = None
        self._tasks: set = set()
        self._queue: collections.deque = collections.deque()  # (partition, now_ms, ClaimedTimer) claimed, not started
        self._fire_mean_s: Optional[float] = None  # running mean duration of a handler call
        self._async_handlers: dict = {}  # id(handler) -> whether its fire is ``async def``
        self._slot_starved = False  # a pass left due rows for want of room
        self._to_commit: list = []
        self._commit_task: Optional[asyncio.Task] = None
        self._watcher: Optional[Watcher] = None  # the store's change signal, while the loop runs
        self._fire_pool: Optional[DaemonPool] = None
        self._store_pool: Optional[DaemonPool] = None
        self.passes = 0
        self.fired = 0
        self.failed = 0
        self.errors = 0
        self.transient_errors = 0
        self.other_errors = 0

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
        self._fire_pool = DaemonPool(self.concurrency, "durable-fire")
        self._store_pool = DaemonPool(1, "durable-store")
        self._thread = threading.Thread(target=self._run, name="durable-timers", daemon=True)
        self._thread.start()
        self._ready.wait()
        return self

    def stop(self, timeout: Optional[float] = 10.0) -> None:
        """Stop claiming, wait up to ``timeout`` seconds (None: no limit) for the handlers in flight
        and the commit of their outcomes, then end the thread (closing the change signal may take
        up to :data:`_TEARDOWN_S` more).

        Rows claimed but not started (``queued``) are not started: they stay claimed and fire
        again after their backoff. A handler still running at the timeout is abandoned: its row stays claimed at its backoff
        key and is fired again after that backoff (by this process if restarted, or another
        runner). An abandoned ``async`` handler is cancelled; a sync one finishes on its daemon
        thread, and its outcome is discarded.
        """
        if not self._stopping:
            self._stop_at = None if timeout is None else time.monotonic() + timeout
        self._stopping = True
        self._wake()
        if self._thread is not None:
            self._thread.join(None if timeout is None else timeout + _TEARDOWN_S)

    @property
    def running(self) -> bool:
        """True while the thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def in_flight(self) -> int:
        """Handlers running now."""
        return len(self._tasks)

    @property
    def queued(self) -> int:
        """Rows claimed and waiting for a free handler slot."""
        return len(self._queue)

    def _queue_room(self) -> int:
        """How many claimed rows may wait for a slot: the slots' work within QUEUE_HORIZON_S."""
        mean_s = self._fire_mean_s
        if mean_s is None:
            return 0
        return min(self.budget.max_fired, int(self.concurrency * QUEUE_HORIZON_S / max(mean_s, 1e-6)))

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

    def schedule(self, partition: str, due_at_ms, kind, reference: bytes, value: bytes = b"") -> bytes:
        """:func:`timerwheel_c.durable.schedule` on this service's store, for a served partition and a
        kind this service's registry has a handler for, then wake the thread if the timer is
        nearer than its current sleep. ``due_at_ms``: Unix epoch ms or an aware datetime.
        Returns the row's key.

        Raises:
            TypeError / ValueError: bad arguments (see :func:`timerwheel_c.durable.schedule`), a
                partition not served, a kind with no handler in the registry.
            Exception: whatever the store raises.
        """
        due_ms = due_at_ms_of(due_at_ms)
        self._check_served(partition)
        number = TimerKind(kind).get()
        if self.registry.get(number) is None:
            raise ValueError(f"kind {number} has no handler in this service's registry "
                             f"(registered kinds: {self.registry.kinds()}); register one before scheduling it")
        key = writer.schedule(self.store, partition, due_ms, kind, reference, value)
        self._nudge(partition, due_ms)
        return key

    def notify(self, partition: str, due_at_ms) -> None:
        """Tell the service that a timer due at ``due_at_ms`` (Unix epoch ms or an aware datetime) was
        written to ``partition`` by code in this process (e.g. a :class:`DurableContext`); wakes the
        thread if that is nearer than its current sleep, without waiting for the change signal."""
        self._nudge(self._check_served(partition), due_at_ms_of(due_at_ms))

    def _nudge(self, partition: str, due_ms: int) -> None:
        with self._lock:
            if self.partitions is None:
                self._extra.add(partition)
            wake = self._wake_ms
        if self.ownership is not None:
            self.ownership.recheck()
        if wake is None or due_ms < wake:
            self._wake()

    def cancel(self, partition: str, due_at_ms, kind, reference: bytes) -> bool:
        """:func:`timerwheel_c.durable.cancel` for a served partition: delete the timer row scheduled at
        ``due_at_ms``; True if this call removed it (False for a row being fired or backed off).

        Raises:
            TypeError / ValueError: bad arguments, a partition not served.
            Exception: whatever the store raises.
        """
        self._check_served(partition)
        return writer.cancel(self.store, partition, due_at_ms, kind, reference)

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
            for pool in (self._fire_pool, self._store_pool):
                if pool is not None:
                    pool.shutdown()

    async def _on_store(self, fn, *args):
        """Run the blocking store call ``fn(*args)`` on the store worker thread."""
        assert self._store_pool is not None
        return await asyncio.wrap_future(self._store_pool.submit(fn, *args))

    def _store_failed(self, exc: BaseException, failures: int, what: str) -> float:
        """Count and log a failed store call; return the backoff in seconds."""
        delay_s = _backoff_s(failures)
        self.errors += 1
        if is_transient(exc):
            self.transient_errors += 1
            first = (str(exc).strip().splitlines() or [""])[0]
            log.warning("durable timer %s failed (%d in a row) on a transient store error, %s: %s; retrying in %.2f s",
                        what, failures, type(exc).__name__, first, delay_s)
        else:
            self.other_errors += 1
            log.error("durable timer %s failed (%d in a row) on an unexpected store error; retrying in %.2f s",
                      what, failures, delay_s, exc_info=(type(exc), exc, exc.__traceback__))
        return delay_s

    def _open_watcher(self) -> Optional[Watcher]:
        try:
            return self.store.watch(self._wake)
        except Exception as exc:
            self._store_failed(exc, 1, "change signal")
            return None

    def _served(self) -> list:
        if self.ownership is not None:
            return self.ownership.owned()
        if self.partitions is not None:
            return self.partitions
        with self._lock:
            extra = set(self._extra)
        return sorted(extra.union(self.store.partitions()))

    def _claim_pass(self, free: int):
        """On the store thread: claim up to ``free`` rows (room in slots and queue) over the served partitions. Returns
        (earliest next wake in Unix epoch ms or None, [(partition, now_ms, ClaimedTimer)])."""
        wake = None
        claimed: list = []
        for partition in self._served():
            if self._stopping:
                break
            now_ms = self._wall_ns() // _NS_PER_MS
            if free <= 0:  # rows may wait here: look again as soon as there is room
                self._slot_starved = True
                wake = now_ms
                break
            budget = self.budget
            if free < budget.max_fired:
                budget = dataclasses.replace(budget, max_fired=free)
            claims = claim_due(self.store, partition, self.registry, now_ms, budget)
            report = claims.report
            free -= len(claims.timers)
            if free <= 0 and report.stopped_on_budget:
                self._slot_starved = True
            if report.malformed:
                log.warning("partition %r: %d malformed timer rows kept in quarantine (keys.QUARANTINE_RANGE)", partition, report.malformed)
            partition_wake = next_wake(self.store, partition, now_ms, report)
            if partition_wake is not None and (wake is None or partition_wake < wake):
                wake = partition_wake
            self.activity.count(report)
            firsts = [now_ms - c.timer.due_at_ms for c in claims.timers if c.timer.attempt == 1]
            self.activity.pass_ended(partition, report.stopped_on_budget and free > 0, max(firsts, default=None))
            claimed.extend((partition, now_ms, c) for c in claims.timers)
        return wake, claimed

    async def _main(self) -> None:
        # After a crash of a previous loop its tasks are gone with it: their rows stay claimed and
        # come back after their backoff, and their slots must not stay counted.
        self._tasks = set()
        self._queue.clear()
        self._to_commit = []
        self._commit_task = None
        deadline = deadline_factory()
        self._kick = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        watcher = self._watcher = self._open_watcher()
        self._ready.set()
        failures = 0
        try:
            while not self._stopping:
                self._wake_ms = None
                self._kick.clear()
                if watcher is None:
                    watcher = self._watcher = self._open_watcher()
                self.activity.maybe_summarize()
                max_s = min(self.max_sleep_s, self.activity.summary_due_in_s())
                if self.ownership is not None:  # ownership changes (a runner joins or dies) need a look this often
                    max_s = min(max_s, self.ownership.check_interval_s)
                max_ns = int(max_s * 1e9)
                free = self.concurrency - len(self._tasks) + self._queue_room() - len(self._queue)
                if free <= 0:
                    self._slot_starved = True
                    at_ns = time.monotonic_ns() + max_ns
                else:
                    try:
                        wake_ms, claimed = await self._on_store(self._claim_pass, free)
                        failures = 0
                    except Exception as exc:
                        failures += 1
                        at_ns = time.monotonic_ns() + int(self._store_failed(exc, failures, "pass") * 1e9)
                    else:
                        self.passes += 1
                        self._queue.extend(claimed)
                        self._dispatch()
                        with self._lock:
                            self._wake_ms = wake_ms
                        # Convert to the monotonic clock once, here: a later wall-clock jump cannot move it.
                        sleep_ns = max_ns if wake_ms is None else min(max(0, wake_ms * _NS_PER_MS - self._wall_ns()), max_ns)
                        at_ns = time.monotonic_ns() + sleep_ns
                if self._stopping:
                    break
                await self._sleep_until(deadline, at_ns)
            await self._drain()
        finally:
            if watcher is not None:
                watcher.close()
            self._watcher = None
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

    # -- firing and committing ------------------------------------------------------------
    def _chunk(self) -> int:
        """Queued sync fires one worker runs back to back: as many as take CHUNK_S at the measured
        mean (1 for slow handlers), so that cheap handlers do not pay a thread hand-off each."""
        mean_s = self._fire_mean_s
        free = max(1, self.concurrency - len(self._tasks))
        if mean_s is None:
            return 1
        return max(1, min(-(-len(self._queue) // free), int(CHUNK_S / max(mean_s, 1e-6))))

    def _is_async(self, handler) -> bool:
        # By id: a handler may be unhashable (a dataclass), and the registry keeps it alive.
        found = self._async_handlers.get(id(handler))
        if found is None:
            found = self._async_handlers[id(handler)] = inspect.iscoroutinefunction(handler.fire)
        return found

    def _dispatch(self) -> None:
        """Start queued rows while handler slots are free (never after stop(): they stay claimed)."""
        while self._queue and len(self._tasks) < self.concurrency and not self._stopping:
            first = self._queue.popleft()
            if self._is_async(first[2].handler):
                task = asyncio.ensure_future(self._fire_async(*first))
            else:
                items = [first]
                for _ in range(self._chunk() - 1):
                    if not self._queue or self._is_async(self._queue[0][2].handler):
                        break
                    items.append(self._queue.popleft())
                task = asyncio.ensure_future(self._fire_sync(items))
            self._tasks.add(task)
            task.add_done_callback(self._fire_done)

    def _fire_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self._dispatch()
        # Claim more while half the queue is still there to fire, so slots do not wait on a pass.
        if self._slot_starved and len(self._queue) <= self._queue_room() // 2 and self._kick is not None:
            self._slot_starved = False
            self._kick.set()

    async def _fire_async(self, partition: str, now_ms: int, claimed: ClaimedTimer) -> None:
        timer = claimed.timer
        started_ms = self._wall_ns() // _NS_PER_MS
        started = time.monotonic()
        try:
            outcome, error = await claimed.handler.fire(TimerContext(self.store, partition, now_ms), timer), None
        except Exception as exc:
            outcome, error = None, exc
        self._settle(partition, claimed, started_ms, time.monotonic() - started, outcome, error)

    async def _fire_sync(self, items: list) -> None:
        assert self._fire_pool is not None
        results = await asyncio.wrap_future(self._fire_pool.submit(self._call_all, items))
        for (partition, _, claimed), (started_ms, took_s, outcome, error) in zip(items, results):
            self._settle(partition, claimed, started_ms, took_s, outcome, error)

    def _call_all(self, items: list) -> list:
        """On a worker: call each item's sync handler in turn; (start wall ms, seconds, outcome, error) each."""
        results = []
        for partition, now_ms, claimed in items:
            started_ms = self._wall_ns() // _NS_PER_MS
            started = time.monotonic()
            try:
                outcome, error = claimed.handler.fire(TimerContext(self.store, partition, now_ms), claimed.timer), None
            except Exception as exc:
                outcome, error = None, exc
            results.append((started_ms, time.monotonic() - started, outcome, error))
        return results

    def _settle(self, partition: str, claimed: ClaimedTimer, started_ms: int, took_s: float, outcome, error) -> None:
        """On the loop: log the fire, turn its outcome into the guarded batch and queue its commit."""
        timer = claimed.timer
        self._note_duration(took_s)
        what = f"raised {type(error).__name__}" if error is not None else type(outcome).__name__
        self.activity.fire(partition, timer, started_ms - timer.due_at_ms, what)
        report = RunReport()
        batch = settle(partition, claimed, report, error=error) if error is not None else settle(partition, claimed, report, outcome)
        if batch is None:
            self._count(report)
            return
        self._to_commit.append((partition, claimed, batch))
        if self._commit_task is None:
            self._commit_task = asyncio.ensure_future(self._commit_queued())

    def _note_duration(self, seconds: float) -> None:
        mean = self._fire_mean_s
        self._fire_mean_s = seconds if mean is None else mean + _MEAN_WEIGHT * (seconds - mean)

    def _count(self, report: RunReport) -> None:
        with self._lock:  # the loop thread and the store thread both count
            self.fired += report.fired
            self.failed += report.failed
        self.activity.count(report)

    async def _commit_queued(self) -> None:
        failures = 0
        try:
            while self._to_commit:
                if len(self._to_commit) < PAGE and self._tasks and not self._stopping:
                    # More outcomes are on their way: a moment's wait lets them share the commit
                    # (one transaction, one WAL flush, per partition) instead of one each.
                    await asyncio.sleep(COMMIT_GATHER_S)
                items, self._to_commit = self._to_commit, []
                try:
                    await self._on_store(self._commit, items)
                    failures = 0
                except Exception as exc:
                    failures += 1
                    self._to_commit[:0] = items  # guarded on their claimed rows: a retry is safe
                    await asyncio.sleep(self._store_failed(exc, failures, "commit"))
        finally:
            self._commit_task = None

    def _commit(self, items: list) -> None:
        """On the store thread: commit queued outcomes, one ``apply_many`` per partition."""
        by_partition: dict = {}
        for partition, claimed, batch in items:
            by_partition.setdefault(partition, []).append((claimed, batch))
        for partition, settled in by_partition.items():
            report = RunReport()
            commit_outcomes(self.store, partition, settled, report)
            self._count(report)
            if report.earliest_put_ms is not None:
                self._nudge(partition, report.earliest_put_ms)

    async def _drain(self) -> None:
        """After stop(): wait for handlers in flight and their commits, up to stop()'s timeout."""
        def left_s() -> Optional[float]:
            return None if self._stop_at is None else max(0.0, self._stop_at - time.monotonic())

        if self._queue:
            log.info("stopping with %d claimed row(s) not started; they fire again after their backoff", len(self._queue))
            self._queue.clear()
        if self._tasks:
            _, abandoned = await asyncio.wait(set(self._tasks), timeout=left_s())
            if abandoned:
                log.warning("stopping with %d handler(s) still running; their rows stay claimed and fire again "
                            "after their backoff", len(abandoned))
                for task in abandoned:
                    task.cancel()
        if self._commit_task is not None:
            await asyncio.wait({self._commit_task}, timeout=left_s())

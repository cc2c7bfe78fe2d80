"""DurableTimerService: fires durable timers from a background thread, up to ``concurrency`` at once.

The service composes three parts, each in its own module, around one loop:

- :class:`~.passes.Passes` (the *claim passes*): on a dedicated store thread, claims the due
  rows of the served partitions, fairly across partitions, each store error kept to its
  partition (one guarded move per row to its next backoff key, so every attempt is counted
  before ``fire``);
- :class:`~.executor.Executor`: runs the claimed rows' handlers in ``concurrency`` slots (an
  ``async def fire`` on the loop, a plain one on a daemon worker thread), never claiming again
  a row in flight, enforcing a handler's ``timeout_s``;
- :class:`~.committer.Committer`: writes the outcomes, many per round trip, each guarded on
  its own claimed row (:func:`~timerwheel_c.durable.timers.runner.settle`), on the store thread
  or, with ``separate_commits=True`` on PostgreSQL, on a thread and connection of its own
  (:meth:`Store.open_sibling`), so that claims and commits overlap.

Where the store can bound a lock wait (PostgreSQL), claims and commits run on a connection of the
service's own whose waits for a lock another transaction holds last at most :data:`LOCK_WAIT_MS`:
a caller's open transaction on a partition, or a row lock on one partition's effect row, then
fails that partition's claim or commit alone (a transient error, the partition backing off and
retrying), while the other partitions, which shared the round trip, are claimed and committed
in round trips of their own.

The loop (this module) runs a pass, hands its rows to the executor, then sleeps until the
earliest of: the next due time of the pass (converted to a *monotonic* deadline once, so a
wall-clock jump cannot stall it), a step of the wall clock either way (read every second), a
*kick*, and ``max_sleep_s`` (a safety net). A kick comes
from the store's change signal (:meth:`Store.watch`: PostgreSQL ``NOTIFY``, SQLite
``data_version``), so a timer written by any process wakes the thread; from :meth:`schedule` /
:meth:`notify` in this process; from a handler slot freeing up while due rows wait for one; and
from :meth:`stop`. In a fleet a change signal also makes the next pass re-check ownership (at
most every :data:`RECHECK_MIN_S`), so a timer in a partition no runner owns yet (new, or newly
emptied) fires as promptly as any other.

Store errors are counted and logged (:meth:`DurableTimerService._store_failed`): transient ones
(:class:`~timerwheel_c.durable.storage.errors.TransientStoreError`) in ``transient_errors``, at
WARNING for the first of a run of failures (later ones at DEBUG, until a call succeeds), anything else at ERROR with its traceback, in ``other_errors``. Anything a
handler raises, ``SystemExit`` and ``KeyboardInterrupt`` included, is that handler's failure.
Nothing but :meth:`stop` ends the thread; should it end otherwise, :attr:`died` holds why.
"""
from __future__ import annotations

import asyncio
import logging
import math
import threading
from enum import Enum
from typing import Callable, Iterable, Optional, Union

from ..storage.errors import is_transient
from ..storage.redact import redact
from ..storage.store import Store, check_partition, check_store
from ..storage.watch import Watcher
from ..timers import keys, writer
from ..timers.claim import refund_rows, release_rows
from ..timers.due import due_at_ms_of, due_or_delay
from ..timers.kind_names import check_kind_names
from ..timers.parking import RetryLater
from ..timers.registry import TimerKind, TimerRegistry, check_registry
from ..timers.runner import PAGE, Attempt, RunReport, TickBudget, settle
from ..timers.timing import DEFAULT_TIMING, SYSTEM_CLOCK, Clock, Timing
from .activity import Activity
from .clock import StoreClock
from .committer import Committer
from .executor import SHARE_S, Executor
from .metrics import BACKLOG_EVERY_S, MetricsSnapshot, Recorder, due_backlog, parked_count, shard_backlog
from .passes import PassResult, Passes
from .pool import DEFAULT_CONCURRENCY, DaemonExecutor, DaemonPool
from .records import Job, Outcome

__all__ = ["DEFAULT_CONCURRENCY", "LOCK_WAIT_MS", "DurableTimerService"]

log = logging.getLogger("timerwheel_c.durable")

RECHECK_MIN_S = 0.02  # the most often a change signal makes a fleet runner re-check ownership
_DEFAULT_BUDGET = TickBudget()
_TEARDOWN_S = 1.0  # seconds stop() allows, past its timeout, for the thread to close its watcher and exit
_NS_PER_MS = 1_000_000
# The longest one sleep of the thread, ns: a max_sleep_s or backoff of millennia is finite but past the
# clock's range (int64 ns), where its wait would fail at once and the thread spin; past a day it
# sleeps again.
_LONGEST_SLEEP_NS = 86_400 * 1_000_000_000
#: Seconds between two reads of the wall clock during a sleep, and the change (ns) of the wall
#: clock against the monotonic one that counts as a step: a step either way ends the sleep, whose
#: deadline was converted from a due time under the old reading (see :meth:`_wall_clock_stepped`).
CLOCK_CHECK_S = 1.0
CLOCK_STEP_NS = 100_000_000
# The longest a claim or a commit waits for a lock another transaction holds (a caller's open
# transaction on a partition, a row lock on an effect row), where the store bounds it (PostgreSQL's
# lock_timeout): past it that partition's call fails alone and backs off while the others go on.
# Far above a writer's ordinary transaction (milliseconds), far below the first backoff (5 s).
LOCK_WAIT_MS = 250


class _Default(Enum):
    TIMING = "the service's Timing"  # stop()'s timeout when none is given


def _check_positive(name: str, value: object, unit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of {unit}, got {type(value).__name__} {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0 {unit}, got {value!r}")
    return float(value)


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
            handlers get that many daemon worker threads; async ones run on the service's loop. Commits of outcomes are batched on one
            thread, so the limit never multiplies connections or writers.
        budget: the :class:`TickBudget` of each pass, per partition (``max_fired`` is
            further lowered to the free handler slots). Its caps, and a handler's
            ``max_per_tick``, bound the rows one pass claims, not the handlers in flight:
            ``concurrency`` bounds those.
        max_sleep_s: longest sleep between passes, in seconds (finite, > 0); a safety net
            only, since the store's change signal wakes the thread on every timer write.
        fleet: divide ``partitions`` (None: the whole store, divided by shard) with the other services
            asking for the same ones, each partition (or shard) served by one live service at a time (see
            :mod:`timerwheel_c.durable.storage.postgres.ownership`); the sleep is then capped at the ownership's
            check interval. None (default): True when ``partitions`` is None and the store
            supports it (:meth:`Store.ownership`: PostgreSQL), else False.
        summary_interval_s: seconds (finite, > 0) between INFO summaries of the work done
            (see :mod:`timerwheel_c.durable.activity`).
        wall_ns: the Unix-epoch clock in ns that judges due times; None (default): the store server's
            clock where it has one (PostgreSQL: :class:`~.clock.StoreClock`, so that a host clock
            running ahead never fires a timer early), else ``clock``'s wall clock. Tests shift it.
        clock: where the service reads time and sleeps (a
            :class:`~timerwheel_c.durable.timers.timing.Clock`); None (default): the host's clocks.
            A test gives a :class:`~timerwheel_c.durable.timers.timing.ManualClock` and drives the
            service's sleeps, backoffs and grace by hand. The store server's clock, where it is used,
            is carried on this clock's monotonic one.
        timing: the backoff after failed store calls, the unknown-kind grace, stop()'s default wait and
            a fleet's ownership interval and lease, read on ``clock``
            (a :class:`~timerwheel_c.durable.timers.timing.Timing`); None (default): the defaults.
        separate_commits: True: with a store that can write on a second connection at once
            (:meth:`Store.open_sibling`: PostgreSQL), commit outcomes on a thread and connection
            of their own, so that claims never wait behind a commit, not even behind one that waits
            on a row lock another transaction holds (a handler's effect row, say); only the commits
            wait. False (default): claims and commits take turns on the store thread's one
            connection. Measured with the server on the same 2 vCPUs (``bench.peers``): one runner
            fired about 9 % more timers per second with it, four runners about 14 % fewer, their
            claims and commits then contending for the server's CPU and the partitions' locks.

    Use as ``with DurableTimerService(...) as svc:`` or ``start()`` / ``stop()``. The lifecycle
    is one-shot: ``start()`` at most once, and never after ``stop()`` (even a ``stop()`` before
    any ``start()``); both raise RuntimeError. ``stop()`` may be called any number of times.

    Counters for monitoring: ``passes`` (completed passes), ``fired`` (outcomes committed),
    ``failed`` (fires that raised, returned Retry or an invalid outcome, or lost their
    guard), ``errors`` (failed store calls) split into ``transient_errors`` and
    ``other_errors``; ``in_flight`` (handlers running now) and ``queued`` (rows claimed
    and waiting for a slot).

    A row in flight in this process is never claimed again by it, however long its handler
    runs; set the handler's ``timeout_s`` to count a hung call as failed. Another runner may
    still claim a row whose handler runs past its backoff (5 s on the first attempt): only one
    outcome commits, and effects outside the outcome's batch must be idempotent.

    In a fleet the runners with the same kinds (the registry's at construction) form one group (see
    :mod:`timerwheel_c.durable.storage.postgres.ownership`), so every partition's rows of a kind are
    served by a live runner that has that kind.

    Raises:
        TypeError / ValueError: bad arguments (e.g. ``max_sleep_s`` infinite, NaN or <= 0,
            ``concurrency`` < 1, in a fleet a ``timing.ownership_lease_s`` not above the budget's
            ``max_elapsed_ms``), naming the value.
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
        wall_ns: Optional[Callable[[], int]] = None,
        fleet: Optional[bool] = None,
        separate_commits: bool = False,
        clock: Optional[Clock] = None,
        timing: Optional[Timing] = None,
    ):
        check_store(store)
        check_registry(registry)
        if timing is not None and not isinstance(timing, Timing):
            raise TypeError(f"timing must be a Timing, got {type(timing).__name__} {timing!r}")
        self.clock: Clock = SYSTEM_CLOCK if clock is None else clock
        self.timing = DEFAULT_TIMING if timing is None else timing
        if isinstance(partitions, str):
            raise TypeError(f"partitions must be an iterable of str, not the str {redact(partitions)!r}")
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
        in_fleet = fleet or (fleet is None and partitions is None)
        # A pass runs no ownership evaluation, this runner's heartbeat: a lease a pass can outlast
        # would have a live runner ended and its share taken over mid-pass.
        if in_fleet and store.ownership_type is not None and self.timing.ownership_lease_s * 1000 <= budget.max_elapsed_ms:
            raise ValueError(f"Timing.ownership_lease_s ({self.timing.ownership_lease_s!r} s) must be above the "
                             f"longest pass, budget.max_elapsed_ms ({budget.max_elapsed_ms!r} ms)")
        self.ownership = store.ownership(self.partitions, kinds=registry.kinds(), monotonic_ns=self.clock.monotonic_ns,
                                         check_interval_s=self.timing.ownership_interval_s,
                                         lease_s=self.timing.ownership_lease_s) if in_fleet else None
        if fleet and self.ownership is None:
            raise ValueError(f"fleet=True needs a store that divides partitions among runners (PostgreSQL), got {store!r}")
        self.budget = budget
        self._clock: Optional[StoreClock] = None
        if wall_ns is None:
            self._clock = StoreClock(self.clock.wall_ns, self.clock.monotonic_ns)
            wall_ns = self._clock.now_ns
        self._wall_ns: Callable[[], int] = wall_ns
        self._extra: set = set()
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
        self._slot_starved = False  # a pass left due rows for want of room
        self._changed = False  # the change signal fired: in a fleet, re-check ownership
        self._last_recheck_s = 0.0
        self._store_pool: Optional[DaemonPool] = None
        if not isinstance(separate_commits, bool):
            raise TypeError(f"separate_commits must be a bool, got {type(separate_commits).__name__} {separate_commits!r}")
        self._separate_commits = separate_commits
        self._commit_pool: Optional[DaemonPool] = None  # with a store that writes on two connections at once
        self._watcher: Optional[Watcher] = None  # the store's change signal, while the loop runs
        self._settle_report = RunReport()
        self.executor = Executor(concurrency, store, self._wall_ms, self._settle, self._slot_freed, budget.max_fired)
        self.committer = Committer(store, self._on_commit_store, self._count, self._nudge, self._store_failed,
                                   self._outcome_done, lambda: bool(self.executor.tasks), self.clock)
        # Serving the whole store (alone, or a fleet's share of its shards), a pass reads by shard: its
        # cost does not grow with the number of partitions.
        shards: Optional[Callable[[], list]] = None
        if self.ownership is not None and self.ownership.by_shard:
            shards = self.ownership.owned
        elif self.ownership is None and self.partitions is None:
            shards = lambda: list(range(store.shard_count))  # noqa: E731
        self._passes = Passes(store, registry, budget, self._served, self.ownership, self.activity, self._count,
                              self._wall_ms, self._store_failed, self._monotonic_s, shards=shards,
                              grace_ms=self.timing.unknown_kind_grace_ms)
        self.died: Optional[BaseException] = None
        self.recorder = Recorder()
        self._release_on_stop = False
        self._jobs: dict = {}  # claimed key -> Job, for the rows in flight (release on stop)
        self._backlog_cache: tuple = (-math.inf, ({}, {}))  # (monotonic s, (due rows, parked timers) by partition)
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
            ValueError: the registry has no handler.
        """
        if self._thread is not None:
            raise RuntimeError("DurableTimerService already started")
        if self._stopping:
            raise RuntimeError("DurableTimerService was stopped; a stopped service cannot be started (create a new one)")
        check_kind_names(self.store, self.registry.named_kinds())
        if not self.registry.kinds():
            raise ValueError("the registry has no handler: a service without one would claim rows it cannot fire "
                             "(in a fleet, whole partitions); register at least one TimerHandler")
        self.executor.start()
        self._store_pool = DaemonPool(1, "durable-store")
        # Claims and commits on a connection of the service's own whose lock waits are bounded:
        # a lock held on one partition then holds up that partition alone. The caller's store, and
        # its connection, stay as they were (handlers and the caller's own writes use it).
        bounded = self.store.open_sibling(lock_wait_ms=LOCK_WAIT_MS)
        if bounded is not None:
            self._passes.store = self.committer.store = bounded
        sibling = self.store.open_sibling(lock_wait_ms=LOCK_WAIT_MS) if self._separate_commits else None
        if sibling is not None:
            # Outcomes commit on a thread and connection of their own: a pass's claims never wait
            # behind a commit's round trip, nor a commit behind a claim's, and the server runs both at
            # once. The two never write the same row unguarded: each outcome is guarded on its claim.
            self.committer.store = sibling
            self._commit_pool = DaemonPool(1, "durable-commit")
        self._thread = threading.Thread(target=self._run, name="durable-timers", daemon=True)
        self._thread.start()
        self._ready.wait()
        return self

    def stop(self, timeout: Union[float, None, _Default] = _Default.TIMING, release_claims: bool = False) -> None:
        """Stop claiming, wait up to ``timeout`` seconds (None: no limit; default: ``timing.stop_timeout_s``,
        10 s unless the service was given another :class:`~timerwheel_c.durable.timers.timing.Timing`) for the handlers in flight
        and the commit of their outcomes, then end the thread (closing the change signal may take
        up to :data:`_TEARDOWN_S` more).

        ``release_claims=True``: after that wait, make this runner's unsettled claims (rows
        queued, and handlers abandoned at the timeout) due now, each guarded on its row, so
        another runner fires them at once instead of after their backoff (up to 10 minutes on
        later attempts). The trade-off: a sync handler abandoned at the timeout may still be
        running on its thread while another runner fires the same timer's retry, so the two
        overlap; only one outcome commits, and effects outside the batch must be idempotent
        (as always). False (default) leaves them to their backoff.

        Rows claimed but not started (``queued``) are not started: each gets back the attempt its
        claim counted and is due now (an attempt counts a handler call, so a timer with
        ``max_attempts=1`` still fires on the next runner). A handler still running at the timeout is abandoned: its row stays claimed at its backoff
        key and is fired again after that backoff (by this process if restarted, or another
        runner). An abandoned ``async`` handler is cancelled; a sync one finishes on its daemon
        thread, and its outcome is discarded.
        """
        if timeout is _Default.TIMING:
            timeout = self.timing.stop_timeout_s
        assert not isinstance(timeout, _Default)  # for mypy: replaced just above
        if not self._stopping:
            self._stop_at = None if timeout is None else self._monotonic_s() + timeout
            self._release_on_stop = bool(release_claims)
        self._stopping = True
        self._wake()
        if self._thread is not None:
            # A wait past the threading module's longest is no wait at all to it (OverflowError).
            self._thread.join(None if timeout is None else min(timeout + _TEARDOWN_S, threading.TIMEOUT_MAX))

    @property
    def running(self) -> bool:
        """True while the thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def in_flight(self) -> int:
        """Handlers running now."""
        return self.executor.in_flight

    @property
    def queued(self) -> int:
        """Rows claimed and waiting for a free handler slot."""
        return len(self.executor.queue)

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

    def schedule(self, partition: str, due_at_ms, kind, reference: bytes, value: bytes = b"", *,
                 if_exists: str = "replace", delay=None) -> bytes:
        """:func:`timerwheel_c.durable.schedule` on this service's store, for a served partition and a
        kind this service's registry has a handler for, then wake the thread if the timer is
        nearer than its current sleep. ``due_at_ms``: Unix epoch ms, an aware datetime or a timedelta
        from now; or None and ``delay`` seconds from now. Returns the row's key.

        Raises:
            TypeError / ValueError: bad arguments (see :func:`timerwheel_c.durable.schedule`), a
                partition not served, a kind with no handler in the registry.
            Exception: whatever the store raises.
        """
        due_ms = due_at_ms_of(due_or_delay(due_at_ms, delay))
        self._check_served(partition)
        number = TimerKind(kind).get()
        if self.registry.get(number) is None:
            raise ValueError(f"kind {number} has no handler in this service's registry "
                             f"(registered kinds: {self.registry.kinds()}); register one before scheduling it")
        key = writer.schedule(self.store, partition, due_ms, kind, reference, value, if_exists=if_exists)
        self._nudge(partition, due_ms)
        return key

    def reschedule(self, partition: str, due_at_ms=None, kind=None, reference: Optional[bytes] = None, *,
                   delay=None) -> bool:
        """:func:`timerwheel_c.durable.reschedule` for a served partition (``due_at_ms`` or ``delay``
        seconds from now; the arguments in :meth:`schedule`'s order, the former order accepted with
        a DeprecationWarning), then wake the thread if the timer is now nearer than its current sleep.

        Raises:
            TypeError / ValueError: bad arguments, a partition not served.
            Exception: whatever the store raises.
        """
        due_at_ms, kind, reference = writer.in_schedule_order(due_at_ms, kind, reference)
        due_ms = due_at_ms_of(due_or_delay(due_at_ms, delay))
        moved = writer.reschedule(self.store, self._check_served(partition), due_ms, kind, reference)
        if moved:
            self._nudge(partition, due_ms)
        return moved

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

    def cancel(self, partition: str, kind, reference: bytes) -> bool:
        """:func:`timerwheel_c.durable.cancel` for a served partition: remove the pending timer named
        (``partition``, ``kind``, ``reference``), scheduled or retrying; True if this call removed it.

        Raises:
            TypeError / ValueError: bad arguments, a partition not served.
            Exception: whatever the store raises.
        """
        self._check_served(partition)
        return writer.cancel(self.store, partition, kind, reference)

    # -- the thread ---------------------------------------------------------------------
    def _wall_ms(self) -> int:
        return self._wall_ns() // _NS_PER_MS

    def _monotonic_s(self) -> float:
        return self.clock.monotonic_ns() / 1e9

    def _wake(self) -> None:
        loop, kick = self._loop, self._kick
        if loop is not None and kick is not None:
            try:
                loop.call_soon_threadsafe(kick.set)
            except RuntimeError:  # the loop has closed: the thread is exiting anyway
                pass

    def _on_change(self) -> None:
        """The store's change signal (on the watcher's thread)."""
        self._changed = True
        self._wake()

    def _run(self) -> None:
        try:
            while not self._stopping:
                try:
                    asyncio.run(self._main())
                except Exception:  # a bug outside the guarded pass: log, and keep the service alive
                    log.exception("durable timer service loop failed; restarting it")
                    self._ready.set()
                    self.clock.sleep(self.timing.backoff_base_s)
        except BaseException as exc:  # handlers' exceptions never get here: this is the service's own
            self.died = exc
            log.critical("durable timer service thread ended without stop(): %s: %s", type(exc).__name__, exc,
                         exc_info=(type(exc), exc, exc.__traceback__))
        finally:
            if self.ownership is not None:
                self.ownership.close()
            # A stop() racing start() can end the loop before _main ran: start() must not wait forever.
            self._ready.set()
            self.executor.shutdown()
            if self._store_pool is not None:
                if self._passes.store is not self.store:
                    self._store_pool.submit(self._passes.store.close)
                self._store_pool.shutdown()
            if self._commit_pool is not None:
                # Closed on its own thread, after any commit still running there: stop() never waits on it.
                self._commit_pool.submit(self.committer.store.close)
                self._commit_pool.shutdown()

    async def _on_store(self, fn, *args):
        """Run the blocking store call ``fn(*args)`` on the store worker thread."""
        assert self._store_pool is not None
        return await asyncio.wrap_future(self._store_pool.submit(fn, *args))

    async def _on_commit_store(self, fn, *args):
        """Run the committer's blocking store call ``fn(*args)`` on the commit thread, or on the store
        thread when there is none (``separate_commits`` off, or a store without a second connection:
        :meth:`Store.open_sibling`)."""
        if self._commit_pool is None:
            return await self._on_store(fn, *args)
        return await asyncio.wrap_future(self._commit_pool.submit(fn, *args))

    def _store_failed(self, exc: BaseException, failures: int, what: str) -> float:
        """Count and log a failed store call; return the backoff in seconds."""
        delay_s = self.timing.backoff_s(failures)
        with self._lock:
            self.errors += 1
            if is_transient(exc):
                self.transient_errors += 1
            else:
                self.other_errors += 1
        if is_transient(exc):
            first = (str(exc).strip().splitlines() or [""])[0]
            # Once per episode: a failover or a read-only period fails every retry until it ends.
            log.log(logging.WARNING if failures == 1 else logging.DEBUG,
                    "durable timer %s failed (%d in a row) on a transient store error, %s: %s; retrying in %.2f s",
                    what, failures, type(exc).__name__, first, delay_s)
        else:
            log.error("durable timer %s failed (%d in a row) on an unexpected store error; retrying in %.2f s",
                      what, failures, delay_s, exc_info=(type(exc), exc, exc.__traceback__))
        return delay_s

    def _open_watcher(self) -> Optional[Watcher]:
        try:
            keys.declare_signals(self.store)  # the writes that must wake it: not its own claims
            return self.store.watch(self._on_change)
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

    def _recheck_in_s(self) -> Optional[float]:
        """In a fleet after a change signal: ask the ownership to re-check now, or say in how many
        seconds it may (at most one forced re-check per RECHECK_MIN_S)."""
        if self.ownership is None or not self._changed:
            return None
        left_s = self._last_recheck_s + RECHECK_MIN_S - self._monotonic_s()
        if left_s > 0:
            return left_s
        self._changed = False
        self._last_recheck_s = self._monotonic_s()
        self.ownership.recheck()
        return None

    async def _main(self) -> None:
        # After a crash of a previous loop its tasks are gone with it: their rows stay claimed and
        # come back after their backoff, and their slots must not stay counted.
        self.executor.reset()
        self.committer.reset()
        self._kick = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        # asyncio.to_thread in a handler: a call past the stop must not keep the process alive (see .pool).
        self._loop.set_default_executor(DaemonExecutor("durable-async-thread"))
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
                recheck_s = self._recheck_in_s()
                if recheck_s is not None:
                    max_s = min(max_s, recheck_s)
                max_ns = int(max_s * 1e9)
                free = self.executor.free()
                if free <= 0:
                    self._slot_starved = True
                    at_ns = self.clock.monotonic_ns() + max_ns
                    if self.ownership is not None:
                        # No pass, but the ownership's evaluation is this runner's heartbeat (its lease):
                        # handlers that fill every slot for long must not make it look frozen.
                        await self._on_store(self._heartbeat)
                else:
                    busy = frozenset(self.executor.busy)
                    try:
                        result = await self._on_store(self._pass, free, busy, lambda: self._stopping,
                                                      self.executor.rows_within(SHARE_S, PAGE))
                        failures = 0
                    except Exception as exc:  # only reading the served partitions fails a whole pass
                        failures += 1
                        at_ns = self.clock.monotonic_ns() + int(self._store_failed(exc, failures, "pass") * 1e9)
                    else:
                        self.passes += 1
                        self._slot_starved = self._slot_starved or result.starved
                        self._jobs = {k: j for k, j in self._jobs.items() if k in busy}
                        self._jobs.update((j.key, j) for j in result.jobs)
                        self.executor.submit(result.jobs)
                        wake_ms = result.wake_ms
                        with self._lock:
                            self._wake_ms = wake_ms
                        # Convert to the monotonic clock once, here: a later wall-clock jump cannot move it.
                        sleep_ns = max_ns if wake_ms is None else min(max(0, wake_ms * _NS_PER_MS - self._wall_ns()), max_ns)
                        at_ns = self.clock.monotonic_ns() + sleep_ns
                if self._stopping:
                    break
                await self._sleep_until(at_ns)
            await self._drain()
        finally:
            if watcher is not None:
                watcher.close()
            self._watcher = None
            self._loop = None

    def _heartbeat(self) -> None:
        """On the store thread: evaluate the ownership when it is due (see :mod:`.ownership`'s lease)."""
        assert self.ownership is not None
        try:
            self.ownership.owned()
        except Exception as exc:
            self._store_failed(exc, 1, "ownership check")

    def _pass(self, *args) -> PassResult:
        """On the store thread: read the server's clock when it is time to, then a claim pass."""
        if self._clock is not None:
            self._clock.refresh(self._passes.store)
        return self._passes.run(*args)

    async def _sleep_until(self, at_ns: int) -> None:
        assert self._kick is not None  # set by the serving loop before it first sleeps
        at_ns = min(at_ns, self.clock.monotonic_ns() + _LONGEST_SLEEP_NS)
        kick = asyncio.ensure_future(self._kick.wait())
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
        offset_ns = self._wall_ns() - self.clock.monotonic_ns()
        while abs(self._wall_ns() - self.clock.monotonic_ns() - offset_ns) <= CLOCK_STEP_NS:
            # On the monotonic clock: a step of the wall clock does not move it.
            await self.clock.sleep_until(self.clock.monotonic_ns() + int(CLOCK_CHECK_S * 1e9))

    # -- between the parts ------------------------------------------------------------------
    def _slot_freed(self) -> None:
        # Claim more while half the queue is still there to fire, so slots do not wait on a pass.
        ex = self.executor
        if self._slot_starved and len(ex.queue) <= ex.queue_room() // 2 and self._kick is not None:
            self._slot_starved = False
            self._kick.set()

    def _settle(self, job: Job, attempt: Attempt, keep_busy: bool) -> None:
        """On the loop: log a handler call, turn its outcome into the guarded batch and queue its commit."""
        timer = job.claimed.timer
        error = attempt.error
        what = f"raised {type(error).__name__}" if error is not None else type(attempt.outcome).__name__
        self.activity.fire(job.partition, timer, job.claimed.handler, attempt.started_ms - timer.due_at_ms, what)
        if timer.attempt == 1:
            self.recorder.lateness((attempt.started_ms - timer.due_at_ms) / 1000)
        self.recorder.handler_duration(attempt.took_s)
        report = self._settle_report  # one report until a failure is counted: most fires allocate none
        batch = settle(job.partition, job.claimed, report, attempt.outcome, error, now_ms=self._wall_ms())
        if report.failed:  # a failed attempt: its row stays backed off, its error recorded (RetryLater), or parks
            self._settle_report = RunReport()
            report.failed_kinds[timer.kind.get()] = report.failed
            self._count(report)
        if keep_busy and isinstance(batch, RetryLater):
            # The call runs on in its thread: its row stays in flight, never claimed again here until it
            # returns, so nothing commits for it now (its error is not kept). A commit wakes the thread
            # for the row's retry (its earliest put), which a slow attempt may have left due already.
            return
        self.committer.add(Outcome(job.partition, job.claimed, batch))

    def _outcome_done(self, outcome: Outcome) -> None:
        self.executor.release(outcome.claimed.timer.key)

    def _count(self, report: RunReport) -> None:
        with self._lock:  # the loop thread and the store thread both count
            self.fired += report.fired
            self.failed += report.failed
        for kind, n in report.fired_kinds.items():
            self.recorder.fired(kind, n)
        for kind, n in report.failed_kinds.items():
            self.recorder.failed(kind, n)
        for kind, n in report.parked_kinds.items():
            self.recorder.parked(kind, n)
        self.activity.count(report)

    async def _drain(self) -> None:
        """After stop(): wait for handlers in flight and their commits, up to stop()'s timeout."""
        def left_s() -> Optional[float]:
            return None if self._stop_at is None else max(0.0, self._stop_at - self._monotonic_s())

        # Where the rows this stop gives up in their handler go: released below, or left to their backoff.
        fate = ("are released for another runner to fire now" if self._release_on_stop
                else "stay claimed and fire again after their backoff")
        if self.executor.queue:
            log.info("stopping with %d claimed row(s) not started; they get their attempt back and are due now",
                     len(self.executor.queue))
        abandoned = await self.executor.drain(left_s)
        if abandoned:
            log.warning("stopping with %d handler(s) still running; their rows %s", abandoned, fate)
        uncommitted = await self.committer.drain(left_s)
        if uncommitted:
            log.warning("stopping with %d outcome(s) not committed (a commit the store has not answered may still "
                        "land); unless it does, their rows %s", uncommitted, fate)
        await self._release_unsettled()

    async def _release_unsettled(self) -> None:
        """Give their attempt back to the claimed rows no handler was called for, due now; with
        ``release_claims``, also make due now (attempt kept) the rows given up in their handler."""
        by_partition: dict = {}
        for key in self.executor.busy:
            job = self._jobs.get(key)
            if job is not None and (self._release_on_stop or not job.started):
                by_partition.setdefault((job.partition, job.started), []).append(job.claimed)
        for (partition, started), claimed in by_partition.items():
            move, what = (release_rows, "released") if started else (refund_rows, "gave the attempt back to")
            try:
                moved = await self._on_store(move, self._passes.store, partition, claimed, self._wall_ms())
            except Exception as exc:
                self._store_failed(exc, 1, f"release of this runner's claims on partition {partition!r}")
                continue
            log.info("partition %r: %s %d unsettled claim(s) on stop; another runner fires them now",
                     partition, what, moved)

    # -- metrics ---------------------------------------------------------------------------
    def metrics(self, backlog_timeout_s: float = 2.0) -> MetricsSnapshot:
        """The service's figures now, as plain data (see :mod:`~timerwheel_c.durable.service.metrics`).

        The due backlog is counted on the store thread (a scan per served partition, up to
        :data:`~.metrics.BACKLOG_CAP` rows each) at most once per :data:`~.metrics.BACKLOG_EVERY_S`
        (a scrape within that reuses the last count), waiting at most ``backlog_timeout_s`` seconds;
        when the store does not answer in time, or the thread is not running, or
        ``backlog_timeout_s`` is 0 (a health check's cheap read), it is empty.
        Never raises on a store error.
        """
        fired, failed, parked, lateness, durations = self.recorder.counts()
        backlog: dict = {}
        parked_now: dict = {}
        pool = self._store_pool
        cached_at_s, cached = self._backlog_cache
        if self.running and pool is not None and backlog_timeout_s > 0:
            if self._monotonic_s() - cached_at_s < BACKLOG_EVERY_S:
                backlog, parked_now = cached
            else:
                try:
                    backlog, parked_now = pool.submit(self._backlog).result(timeout=backlog_timeout_s)
                except Exception:  # a store down or slow: the other figures still tell the story
                    backlog, parked_now = {}, {}
                self._backlog_cache = (self._monotonic_s(), (backlog, parked_now))
        with self._lock:
            errors = {"transient": self.transient_errors, "permanent": self.other_errors}
        progress = self._passes.answered_s
        if self._passes.shards is not None:  # serving the whole store: the shards it reads
            owned = self.store.shard_count if self.ownership is None else len(self.ownership.last_owned())
        elif backlog:
            owned = len(backlog)
        elif self.ownership is None:
            owned = len(self.partitions or ())
        else:
            owned = len(self.ownership.last_owned())  # never a round trip here: see last_owned()
        return MetricsSnapshot(
            fired=fired, failed=failed, parked={**{kind: 0 for kind in self.registry.kinds()}, **parked},
            lateness=lateness, handler_duration=durations,
            due_backlog=backlog, parked_timers=parked_now, owned_partitions=owned, store_errors=errors,
            handlers_in_flight=self.in_flight, running=self.running,
            last_progress_age_s=None if progress is None else self._monotonic_s() - progress,
            kind_names={int(k): k.name for k in self.registry.named_kinds() if getattr(k, "name", None) is not None})

    def _backlog(self) -> tuple:
        """On the store thread: ``(due rows, parked timers)`` per served partition, each counted up to BACKLOG_CAP
        (by shard: the partitions holding such rows, read a shard at a time, up to BACKLOG_CAP per shard)."""
        now_ms = self._wall_ms()
        if self._passes.shards is not None:
            return shard_backlog(self.store, self._passes.shards(), now_ms)
        served = self._served()
        return ({partition: due_backlog(self.store, partition, now_ms)[0] for partition in served},
                {partition: parked_count(self.store, partition) for partition in served})

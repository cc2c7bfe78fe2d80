"""DurableTimerService: fires durable timers from a background thread, up to ``concurrency`` at once.

A pipeline of three stages, each a class of its own module that owns its thread or task, its state
and its counters, joined by queues of typed records (:mod:`.records`); read in order, they follow a
timer from its claim to its commit:

1. :class:`~.claiming.Claimer` claims due rows on its store thread (:class:`~.passes.Passes`) and
   submits them as :class:`~.records.Job` records, then sleeps until the next due time or a ring of
   its :class:`~.wakeup.Wakeup`;
2. :class:`~.executor.Executor` runs each job's handler in one of ``concurrency`` slots and queues
   its answer, settled into a guarded batch, on the same job;
3. :class:`~.committer.Committer` commits the outcomes, many per round trip; each row then leaves the
   rows in flight (:class:`~.records.InFlight`).

Each stage counts into one :class:`~.metrics.Recorder`, which :meth:`DurableTimerService.metrics`
reads; none calls back into this module, which checks the arguments once (:mod:`.arguments`), wires
the stages, runs them on one thread (:class:`~.thread.ServiceThread`) and keeps the public API.
"""
from __future__ import annotations

import threading
from enum import Enum
from typing import Callable, Iterable, Optional, Union

from ..storage.store import Store, check_partition, check_store
from ..timers import writer
from ..timers.kind_names import check_kind_names
from ..timers.registry import TimerKind, TimerRegistry, check_registry
from ..timers.runner import TickBudget
from ..timers.timing import Clock, Timing
from .activity import Activity
from .arguments import check_arguments, check_stop_timeout
from .claiming import Claimer
from .committer import Committer
from .executor import Executor
from .metrics import MetricsSnapshot, Recorder
from .pool import DEFAULT_CONCURRENCY
from .records import InFlight
from .thread import ServiceThread
from .wakeup import Wakeup

__all__ = ["DEFAULT_CONCURRENCY", "DurableTimerService"]

_DEFAULT_BUDGET = TickBudget()
_TEARDOWN_S = 1.0  # seconds stop() allows, past its timeout, for the thread to close its watcher and exit


class _Default(Enum):
    TIMING = "the service's Timing"  # stop()'s timeout when none is given


class DurableTimerService:
    """A background thread firing the durable timers of ``partitions`` in ``store``.

    Args:
        store: the backend (:class:`timerwheel_c.durable.storage.store.Store`).
        registry: handlers by kind (:class:`TimerRegistry`).
        partitions: names to serve (non-empty str each), or None for every partition in the store (re-read on each
            pass) plus those scheduled through this service.
        concurrency: handlers running at once (int 1..1024, :data:`~.pool.MAX_CONCURRENCY`; default :data:`DEFAULT_CONCURRENCY`, 16: handlers waiting
            20 ms on I/O then reach several hundred fires per second, and each pass claims up to 16 rows in one
            round trip, which keeps the cost of a pass small against the fires it starts; idle worker threads cost
            nothing). Sync handlers get that many daemon worker threads; async ones run on the service's loop.
            Commits of outcomes are batched on one thread, so the limit never multiplies connections or writers.
        budget: the :class:`TickBudget` of each pass, per partition (``max_fired`` is further lowered to the free
            handler slots). Its caps, and a handler's ``max_per_tick``, bound the rows one pass claims, not the
            handlers in flight: ``concurrency`` bounds those.
        max_sleep_s: longest sleep between passes, in seconds (finite, > 0); a safety net only, since the store's
            change signal wakes the thread on every timer write.
        fleet: divide ``partitions`` (None: the whole store, divided by shard) with the other services asking for
            the same ones, each partition (or shard) served by one live service at a time (see
            :mod:`timerwheel_c.durable.storage.postgres.ownership`); the sleep is then capped at the ownership's check
            interval. None (default): True when ``partitions`` is None and the store supports it
            (:meth:`Store.ownership`: PostgreSQL), else False.
        summary_interval_s: seconds (finite, > 0) between INFO summaries of the work done (see
            :mod:`~timerwheel_c.durable.service.activity`).
        wall_ns: the Unix-epoch clock in ns that judges due times; None (default): the store server's clock where it
            has one (PostgreSQL: :class:`~.clock.StoreClock`, so that a host clock running ahead never fires a timer
            early), else ``clock``'s wall clock. Tests shift it.
        clock: where the service reads time and sleeps (a :class:`~timerwheel_c.durable.timers.timing.Clock`); None
            (default): the host's clocks. A test gives a :class:`~timerwheel_c.durable.timers.timing.ManualClock`
            and drives the service's sleeps, backoffs and grace by hand. The store server's clock, where it is used,
            is carried on this clock's monotonic one.
        timing: backoff, unknown-kind grace, stop()'s default wait, a fleet's ownership interval and lease, on
            ``clock``, and the bound of a lock wait (a :class:`~timerwheel_c.durable.timers.timing.Timing`); None
            (default): the defaults.
        separate_commits: True: with a store that can write on a second connection at once
            (:meth:`Store.open_sibling`: PostgreSQL), commit outcomes on a thread and connection of their own, so
            that claims never wait behind a commit, not even behind one that waits on a row lock another transaction
            holds (a handler's effect row, say). False (default): the same while this runner serves the whole store
            alone (a fleet of one, or no fleet and no list of partitions), else claims and commits take turns on one
            connection: four runners with commits apart fired about 14 % fewer timers per second (``bench.peers``).

    Use as ``with DurableTimerService(...) as svc:`` or ``start()`` / ``stop()``. The lifecycle is one-shot:
    ``start()`` at most once, and never after ``stop()`` (even a ``stop()`` before any ``start()``); both raise
    RuntimeError. ``stop()`` may be called any number of times.

    Counters for monitoring: ``passes`` (completed passes), ``fired`` (outcomes committed), ``failed`` (fires that
    raised, returned Retry or an invalid outcome, or lost their guard), ``errors`` (failed store calls) split into
    ``transient_errors`` and ``other_errors``; ``in_flight`` (handlers running now) and ``queued`` (rows claimed and
    waiting for a slot).

    A row in flight in this process is never claimed again by it, however long its handler runs; set the handler's
    ``timeout_s`` to count a hung call as failed. Another runner may claim a row whose handler runs past its claim's
    lease (the backoff, 5 s on the first attempt, or the handler's ``timeout_s`` and 2 s when longer): only one
    outcome commits, and effects outside the outcome's batch must be idempotent.

    In a fleet the runners with the same kinds (the registry's at construction) form one group (see
    :mod:`timerwheel_c.durable.storage.postgres.ownership`), so every partition's rows of a kind are served by a live
    runner that has that kind.

    Raises:
        TypeError / ValueError: bad arguments (e.g. ``max_sleep_s`` infinite, NaN or <= 0, ``concurrency`` < 1),
            naming the value.
    """

    def __init__(self, store: Store, registry: TimerRegistry, partitions: Optional[Iterable[str]] = None, *,
                 concurrency: int = DEFAULT_CONCURRENCY, budget: TickBudget = _DEFAULT_BUDGET, max_sleep_s: float = 30.0,
                 summary_interval_s: float = 60.0, wall_ns: Optional[Callable[[], int]] = None,
                 fleet: Optional[bool] = None, separate_commits: bool = False, clock: Optional[Clock] = None,
                 timing: Optional[Timing] = None):
        check_store(store)
        check_registry(registry)
        args = check_arguments(partitions, concurrency, budget, max_sleep_s, summary_interval_s, fleet,
                               separate_commits, clock, timing, divides=store.ownership_type is not None)
        self.clock, self.timing, self.max_sleep_s = args.clock, args.timing, args.max_sleep_s
        self.store, self.registry, self.budget, self.concurrency = store, registry, budget, concurrency
        self.partitions = args.partitions
        self._served = None if self.partitions is None else frozenset(self.partitions)
        self.ownership = store.ownership(self.partitions, kinds=registry.kinds(), monotonic_ns=self.clock.monotonic_ns,
                                         check_interval_s=self.timing.ownership_interval_s,
                                         lease_s=self.timing.ownership_lease_s) if args.in_fleet else None
        if fleet and self.ownership is None:
            raise ValueError(f"fleet=True needs a store that divides partitions among runners (PostgreSQL), got {store!r}")
        self.recorder, self._separate_commits = Recorder(Activity(args.summary_interval_s)), args.separate_commits
        # The stages, the last first: each is handed the next (the claimer's, on the service's thread).
        self.wakeup = Wakeup(self.ownership, collect=self.partitions is None)
        busy = InFlight()
        self.committer = Committer(store, self.recorder, self.timing, self.clock, busy, self.wakeup)
        self.claimer = Claimer(store, registry, budget, self.partitions, self.ownership, self.clock, self.timing,
                               self.max_sleep_s, wall_ns, busy, self.recorder, self.wakeup)
        self.executor = Executor(concurrency, store, self.claimer.wall_ms, budget.max_fired, self.committer,
                                 self.recorder, busy, self.wakeup)
        self._thread = ServiceThread(self.claimer, self.executor, self.committer, self.ownership, self.clock, self.timing)
        self._started, self._stopping, self._starting = False, False, threading.Lock()  # one start() of several threads' calls

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> "DurableTimerService":
        """Start the thread; returns self once it is ready.

        Raises:
            RuntimeError: already started, or already stopped (the lifecycle is one-shot).
            ValueError: the registry has no handler.
        """
        with self._starting:
            if self._started:
                raise RuntimeError("DurableTimerService already started")
            if self._stopping:
                raise RuntimeError("DurableTimerService was stopped; a stopped service cannot be started (create a new one)")
            check_kind_names(self.store, self.registry.named_kinds())
            if not self.registry.kinds():
                raise ValueError("the registry has no handler: a service without one would claim rows it cannot fire "
                                 "(in a fleet, whole partitions); register at least one TimerHandler")
            self.executor.start()
            self.committer.start(self.claimer.start(), self.claimer.passes.store, self._separate_commits, self.claimer.serves_alone)
            self._started = True
            self._thread.start()
        return self

    def stop(self, timeout: Union[float, None, _Default] = _Default.TIMING, release_claims: bool = False) -> None:
        """Stop claiming, wait up to ``timeout`` seconds (None: no limit; default: ``timing.stop_timeout_s``, 10 s
        unless the service was given another :class:`~timerwheel_c.durable.timers.timing.Timing`) for the handlers in
        flight and the commit of their outcomes, then end the thread (closing the change signal may take up to
        :data:`_TEARDOWN_S` more; from a handler, which the thread waits for, it returns at once).

        ``release_claims=True``: after that wait, make this runner's unsettled claims (rows queued, and handlers
        abandoned at the timeout) due now, each guarded on its row, so another runner fires them at once instead of
        after their backoff (up to 10 minutes on later attempts). The trade-off: a sync handler abandoned at the
        timeout may still be running on its thread while another runner fires the same timer's retry, so the two
        overlap; only one outcome commits, and effects outside the batch must be idempotent (as always). False
        (default) leaves them to their backoff.

        Rows claimed but not started (``queued``) are not started: each gets back the attempt its claim counted and
        is due now (an attempt counts a handler call, so a timer with ``max_attempts=1`` still fires on the next
        runner). A handler still running at the timeout is abandoned: its row stays claimed at its backoff key and
        is fired again after that backoff (by this process if restarted, or another runner). An abandoned ``async``
        handler is cancelled (one that ignores the cancel is left behind with the service's loop, the thread ending
        all the same); a sync one finishes on its daemon thread, and its outcome is discarded. A ``timeout``
        that is not a number, is NaN or negative raises TypeError / ValueError naming it, and stops nothing.
        """
        timeout = self.timing.stop_timeout_s if timeout is _Default.TIMING else check_stop_timeout(timeout)
        if not self._stopping:  # no lock: stop() may run in a signal handler, within a start()
            self._thread.stop_at = None if timeout is None else self.clock.monotonic_ns() / 1e9 + timeout
            self._thread.release_on_stop = bool(release_claims)
        self._stopping = self.claimer.stopping = True
        self._thread.stopped.set()
        self.wakeup.ring()
        if self._started:
            self._thread.join(None if timeout is None else timeout + _TEARDOWN_S)

    running = property(lambda self: self._thread.thread.is_alive(), doc="True while the thread is alive.")
    in_flight = property(lambda self: self.executor.in_flight, doc="Handlers running now.")
    queued = property(lambda self: len(self.executor.queue), doc="Rows claimed and waiting for a free handler slot.")
    died = property(lambda self: self._thread.died, doc="Why the thread ended without stop(), or None.")
    passes = property(lambda self: self.claimer.pass_count, doc="Completed claim passes.")
    fired = property(lambda self: self.recorder.fired_total, doc="Outcomes committed.")
    failed = property(lambda self: self.recorder.failed_total, doc="Fires that failed (see the class docstring).")
    transient_errors = property(lambda self: self.recorder.transient_errors, doc="Transient store errors.")
    other_errors = property(lambda self: self.recorder.other_errors, doc="Other store errors.")
    errors = property(lambda self: self.transient_errors + self.other_errors, doc="Failed store calls.")

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- scheduling: the arguments are checked once, here or by the writer, never both ---------
    def _check_served(self, partition: str) -> str:
        if partition is not None and (self._served is None or (isinstance(partition, str) and partition in self._served)):
            return partition  # a served name; the writer checks it is a valid one
        check_partition(partition)  # a bad name says so first
        raise ValueError(f"partition {partition!r} is not served by this service ({self.partitions})")

    def schedule(self, partition: str, due_at_ms, kind, reference: bytes, value: object = b"", *,
                 if_exists: str = "replace", delay=None) -> bytes:
        """:func:`timerwheel_c.durable.schedule` on this service's store, for a served partition and a
        kind this service's registry has a handler for, then wake the thread if the timer is
        nearer than its current sleep. ``due_at_ms``: Unix epoch ms, an aware datetime or a timedelta from
        now; or None and ``delay`` seconds from now (now: the clock that judges due times). Returns the key.

        Raises:
            TypeError / ValueError: bad arguments (see :func:`timerwheel_c.durable.schedule`), a
                partition not served, a kind with no handler in the registry.
            Exception: whatever the store raises.
        """
        due_ms = self.claimer.due_ms(due_at_ms, delay)
        self._check_served(partition)
        number = TimerKind(kind).get()
        if self.registry.get(number) is None:
            raise ValueError(f"kind {number} has no handler in this service's registry "
                             f"(registered kinds: {self.registry.kinds()}); register one before scheduling it")
        key = writer.schedule(self.store, partition, due_ms, kind, reference, value, if_exists=if_exists)
        self.wakeup.written(partition, due_ms)
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
        due_ms = self.claimer.due_ms(due_at_ms, delay)
        moved = writer.reschedule(self.store, self._check_served(partition), due_ms, kind, reference)
        if moved:
            self.wakeup.written(partition, due_ms)
        return moved

    def notify(self, partition: str, due_at_ms) -> None:
        """Tell the service that a timer due at ``due_at_ms`` (Unix epoch ms, an aware datetime or a timedelta
        from now) was written to ``partition`` by code in this process (e.g. a :class:`DurableContext`); wakes
        the thread if that is nearer than its current sleep, without waiting for the change signal. Raises
        TypeError / ValueError for a bad partition or due time, or a partition not served."""
        self.wakeup.written(self._check_served(check_partition(partition)), self.claimer.due_ms(due_at_ms, None))

    def cancel(self, partition: str, kind, reference: bytes) -> bool:
        """:func:`timerwheel_c.durable.cancel` for a served partition: remove the pending timer named
        (``partition``, ``kind``, ``reference``), scheduled or retrying; True if this call removed it.

        Raises:
            TypeError / ValueError: bad arguments, a partition not served.
            Exception: whatever the store raises.
        """
        return writer.cancel(self.store, self._check_served(partition), kind, reference)

    def metrics(self, backlog_timeout_s: float = 2.0) -> MetricsSnapshot:
        """The service's figures now, as plain data (see :mod:`~timerwheel_c.durable.service.metrics`).

        The due backlog is counted on the store thread (a scan per served partition, or per shard read, up to
        :data:`~.metrics.BACKLOG_CAP` rows each) at most once per :data:`~.metrics.BACKLOG_EVERY_S`, waiting at most
        ``backlog_timeout_s`` seconds; it is empty when the store does not answer in time, the thread is not running,
        or ``backlog_timeout_s`` is 0 (a health check's cheap read). Never raises on a store error.
        """
        fired, failed, parked, lateness, durations = self.recorder.counts()
        backlog, parked_now, by_shard, parked_by_shard = self.claimer.backlog_cached(backlog_timeout_s if self.running else 0)
        progress = self.claimer.passes.answered_s
        return MetricsSnapshot(
            fired=fired, failed=failed, parked={**{kind: 0 for kind in self.registry.kinds()}, **parked},
            lateness=lateness, handler_duration=durations, due_backlog=backlog, parked_timers=parked_now,
            owned_partitions=self.claimer.owned(backlog), store_errors=self.recorder.store_errors(),
            handlers_in_flight=self.in_flight, handlers_overdue=self.executor.overdue, running=self.running,
            last_progress_age_s=None if progress is None else self.clock.monotonic_ns() / 1e9 - progress,
            kind_names={int(k): k.name for k in self.registry.named_kinds() if getattr(k, "name", None) is not None},
            due_backlog_by_shard=by_shard, parked_timers_by_shard=parked_by_shard)

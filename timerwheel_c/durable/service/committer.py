"""The commit stage: writes handlers' outcomes to the store, many per round trip, on a thread of its
own (with ``separate_commits``, or while the runner serves the whole store alone: see
:meth:`Committer.start`) or the claimer's store thread, and ends each row's walk: once its outcome
is written or given up, the row leaves the rows in flight (:class:`~.records.InFlight`).

Outcomes queue per partition. A commit task takes every partition's queue that is not backing
off and commits them all with one ``apply_across`` (one transaction, one WAL flush), waiting
:data:`GATHER_S` first while fewer than a page are queued and handlers are still running, so
that their outcomes share it.
Each outcome is guarded on its own claimed row, so a retry is always safe, and failures stay
where they arose:

- one outcome the store refuses (:class:`~timerwheel_c.durable.storage.store.Refused`) fails
  alone, counted; its row stays backed off and fires again;
- a commit of many partitions that fails (on PostgreSQL and SQLite the commit is one
  transaction, so none of it was written) is made again partition by partition, so that a lock
  held on one partition's rows (a caller's open transaction, a row lock on an effect row, each
  waited on no longer than the service's bound) fails that partition's commit alone;
- a transient store error (:class:`~timerwheel_c.durable.storage.errors.TransientStoreError`)
  of a partition's commit puts its outcomes back in its queue, which backs off (50 ms
  doubling to 5 s) while the other partitions commit on;
- any other error drops that commit's outcomes, counted as failed: their rows stay backed
  off and fire again, so nothing is lost, and nothing is retried in a loop.
"""
from __future__ import annotations

import asyncio
from typing import Callable, Optional, Tuple

from ..storage.errors import is_transient
from ..storage.store import Store
from ..timers.runner import PAGE, RunReport, commit_records
from ..timers.timing import Clock, Timing
from .metrics import Recorder
from .pool import DaemonPool
from .records import InFlight, Job, file_by_partition
from .wakeup import Wakeup

__all__ = ["GATHER_S", "Committer"]

GATHER_S = 0.002  # how long a commit of fewer than PAGE outcomes waits for more while handlers run


class Committer:
    """Queues outcomes and commits them (loop thread; the store calls run on :attr:`pool`'s thread).

    Args:
        store: the backend the commits write to (:meth:`start` may give it another connection:
            :meth:`~timerwheel_c.durable.storage.store.Store.open_sibling`).
        recorder: where commits, failures and store errors are counted.
        timing: the backoff of a failed commit; clock: where its retry waits.
        busy: the rows in flight; a row leaves them once its outcome is written or given up.
        wakeup: told of every timer row a commit wrote (a handler's Reschedule, a retry), which may
            be nearer than the claimer's sleep.
    """

    def __init__(self, store: Store, recorder: Recorder, timing: Timing, clock: Clock, busy: InFlight,
                 wakeup: Wakeup):
        self.store = store
        self.recorder = recorder
        self.timing = timing
        self.clock = clock
        self.busy = busy
        self.wakeup = wakeup
        self.pool: Optional[DaemonPool] = None  # the claimer's thread, set by start()
        self._sibling: Optional[Store] = None  # the commits' own connection, where the store opens one
        self._own_pool: Optional[DaemonPool] = None  # the thread the commits' own connection is used on
        self._apart: Callable[[], bool] = lambda: False  # whether the next commit runs on its own thread
        self._queues: dict = {}  # partition -> [Job] whose batch commits its outcome, in arrival order
        self._failures: dict = {}  # partition -> failed commits in a row
        self._retry_at: dict = {}  # partition -> monotonic ns (``clock``) before which it is not retried
        self.task: Optional[asyncio.Task] = None
        self.stopping = False
        self._committing = 0  # outcomes in the commit in progress

    def start(self, claims: DaemonPool, claims_store: Store, separate: bool, alone: Callable[[], bool]) -> None:
        """Commit on the claimer's thread ``claims`` through its connection ``claims_store``, or on a
        thread and connection of the commits' own where the store opens a second one
        (:meth:`~timerwheel_c.durable.storage.store.Store.open_sibling`, its lock waits bounded by the
        timing's ``lock_wait_ms`` as the claims' are), so that a pass's claims never wait behind a commit's
        round trip, nor a commit behind a claim's: always with ``separate``, else while ``alone()``
        (read before each commit) says this runner serves the whole store by itself. One runner's
        claims and commits then keep a second core busy, where they took turns on one thread; in a
        fleet, its runners' claims already do, and overlapped commits would contend with them for the
        server's CPU and the partitions' locks. The thread starts, and the connection opens, at the
        first commit made there. The two never write the same row unguarded: each outcome is guarded
        on its claim, and one commit runs at a time."""
        self._sibling = self.store.open_sibling(lock_wait_ms=self.timing.lock_wait_ms)
        self.pool, self.store = claims, claims_store
        self._apart = (lambda: True) if separate else alone

    def _route(self) -> Tuple[DaemonPool, Store]:
        """The thread and connection the next commit runs on (see :meth:`start`)."""
        assert self.pool is not None  # set by start(), before any outcome
        if self._sibling is None or not self._apart():
            return self.pool, self.store
        if self._own_pool is None:
            self._own_pool = DaemonPool(1, "durable-commit")
        return self._own_pool, self._sibling

    def close(self) -> None:
        """As the service's thread ends: let the commit thread of its own go, closing its connection
        there, after any commit still running (never waited for); a connection never used by one is
        closed here (it opened none)."""
        if self._sibling is None:
            return
        if self._own_pool is None:
            self._sibling.close()
        else:
            self._own_pool.submit(self._sibling.close)
            self._own_pool.shutdown()

    def reset(self) -> None:
        self._queues.clear()
        self._failures.clear()
        self._retry_at.clear()
        self._committing = 0
        self.task = None

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def add(self, job: Job) -> None:
        """Queue ``job``, its ``batch`` set, and make sure the commit task runs."""
        self.add_all([job])

    def add_all(self, jobs: list) -> None:
        """Queue ``jobs``, in order, each with its ``batch`` set, and make sure the commit task runs."""
        file_by_partition(jobs, self._queues, list)
        if self.task is None and jobs:
            self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        try:
            while self._queues:
                if self.queued < PAGE and self._on_their_way() and not self.stopping:
                    # More outcomes are on their way: a moment's wait lets them share the commit
                    # (one transaction, one WAL flush, per partition) instead of one each. Real time,
                    # not ``clock``: it waits for handlers that run in real time, and on a manual clock
                    # that a test does not advance it would hold every commit.
                    await asyncio.sleep(GATHER_S)
                now = self.clock.monotonic_ns()
                ready = {p: q for p, q in self._queues.items() if self._retry_at.get(p, now) <= now}
                if not ready:
                    await self.clock.sleep_until(min(self._retry_at[p] for p in self._queues))
                    continue
                for p in ready:
                    del self._queues[p]
                self._committing = sum(len(q) for q in ready.values())
                pool, store = self._route()
                try:
                    errors, wakes = await asyncio.wrap_future(pool.submit(self._commit, store, ready))
                finally:
                    self._committing = 0
                for partition, outcomes in ready.items():
                    exc = errors.get(partition)
                    if exc is None:
                        self._failures.pop(partition, None)
                        self._retry_at.pop(partition, None)
                        self.busy.discard_jobs(outcomes)
                        if partition in wakes:
                            # Only now that its rows have left the rows in flight: a pass the ring
                            # started before would skip them, and sleep past the retry it was rung for.
                            self.wakeup.written(partition, wakes[partition])
                        continue
                    failures = self._failures[partition] = self._failures.get(partition, 0) + 1
                    delay_s = self.recorder.store_failed(exc, failures, f"commit on partition {partition!r}",
                                                         self.timing.backoff_s(failures), kind="commit")
                    if is_transient(exc):
                        # Back in this partition's own queue: the others do not wait for it.
                        self._queues.setdefault(partition, [])[:0] = outcomes
                        self._retry_at[partition] = self.clock.monotonic_ns() + int(delay_s * 1e9)
                    else:
                        dropped = RunReport(failed=len(outcomes))
                        for o in outcomes:
                            kind = o.kind.get()
                            dropped.failed_kinds[kind] = dropped.failed_kinds.get(kind, 0) + 1
                        self.recorder.count(dropped)
                        self.busy.discard_jobs(outcomes)
                        self.wakeup.ring()  # their rows stay at their backoff keys, which may be due by now
        finally:
            self.task = None

    def _on_their_way(self) -> bool:
        """Whether rows in flight have outcomes still to come (their handlers run, or wait for a slot;
        a row held past its timed-out call's outcome has none)."""
        return len(self.busy) - len(self.busy.held) > self.queued + self._committing

    def _commit(self, store: Store, ready: dict) -> Tuple[dict, dict]:
        """On the store (or commit) thread, through ``store``: every partition's outcomes in one ``apply_across`` (one commit);
        should that fail, each partition's in a commit of its own. Returns ``({partition: error}, {partition:
        wake ms})``: the partitions whose commit raised (an error of one batch is that batch's alone, see
        the module), and for the others that wrote a timer row or left one at its backoff key, the
        earliest such row's due time (Unix epoch ms)."""
        try:
            reports = commit_records(store, ready)
        except Exception as exc:
            if len(ready) < 2:
                return {partition: exc for partition in ready}, {}
            reports, errors = {}, {}
            for partition, jobs in ready.items():
                try:
                    reports.update(commit_records(store, {partition: jobs}))
                except Exception as own:
                    errors[partition] = own
        else:
            errors = {}
        wakes = {}
        for partition, report in reports.items():
            self.recorder.count(report)
            if report.earliest_put_ms is not None:
                wakes[partition] = report.earliest_put_ms
        return errors, wakes

    async def drain(self, left_s: Callable[[], Optional[float]]) -> int:
        """After stop(): wait up to ``left_s()`` seconds for the queued outcomes to commit; returns how
        many did not by then (queued, or in a commit the store has not answered)."""
        self.stopping = True
        if self.task is not None:
            await asyncio.wait({self.task}, timeout=left_s())
        return self.queued + self._committing

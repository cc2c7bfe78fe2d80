"""The run stage: runs claimed rows' handlers in ``concurrency`` slots, on the service's loop, and
hands each outcome to the commit stage.

A *slot* is one handler call in progress: an ``async def fire`` awaited on the loop, or a
plain ``fire`` on a worker of a bounded pool of daemon threads (APScheduler 4 likewise keeps
its async and thread executors apart from the scheduler that composes them). Rows wait in a
queue for a slot, one FIFO per partition taken round-robin (:class:`FairQueue`); every key queued, running or awaiting its commit is in :attr:`busy`,
which the claim passes skip, so this process never claims again a row it is still firing.

Cheap sync handlers do not pay a thread hand-off per call: a worker takes queued rows in runs
(a :class:`Chunk`) of :data:`CHUNK_S` of measured work. A watchdog, running while sync
chunks are in flight, takes back the rows not yet started behind a call that has run
:data:`RESCUE_S` (they go to other slots) and fails a call that has run past its handler's
``timeout_s``. An ``async`` call past its ``timeout_s`` is cancelled. A hung call thus holds
its own slot and nothing more.

Each finished call, an :class:`~timerwheel_c.durable.timers.runner.Attempt`, is settled here
(:func:`~timerwheel_c.durable.timers.runner.settle`: the handler's answer becomes the guarded batch
that commits it) and its :class:`~.records.Job` queued, batch and all, on the commit stage. A slot freeing
up while claimed rows wait for room rings the claimer (:class:`~.wakeup.Wakeup`).
"""
from __future__ import annotations

import asyncio
import collections
import time
from typing import Callable, Optional

from ..timers import tracing
from ..timers.registry import Done, TimerContext, handler_name, is_async
from ..timers.runner import Attempt, RunReport, consumed, past_timeout, settle
from ..storage.store import Store
from .committer import Committer
from .metrics import Recorder
from .pool import DaemonPool
from .records import Chunk, InFlight, Job, file_by_partition, set_field
from .wakeup import Wakeup

__all__ = ["CHUNK_S", "IGNORED_CANCEL_S", "QUEUE_HORIZON_S", "RESCUE_S", "RUN_S", "SHARE_S", "Executor", "FairQueue"]

QUEUE_HORIZON_S = 0.5
CHUNK_S = 0.005  # longest run of queued sync fires one worker takes at once, at the measured mean
SHARE_S = 0.01  # a pass gives each partition at least the rows the slots fire in this long
RUN_S = 0.01  # the longest run of one partition's rows the queue serves, at the measured mean
RESCUE_S = 0.25  # a sync call running this long gives up the rows queued behind it in its chunk
_WATCH_S = 0.05  # the watchdog's period while sync chunks are in flight
# Seconds an ``async`` call cancelled at its timeout_s gets to end before it counts as ignoring the cancel:
# failed then and there, its slot overdue, as a sync call past its timeout_s is.
IGNORED_CANCEL_S = 1.0
_MEAN_WEIGHT = 0.1  # of the newest handler duration in the running mean
_DONE = Done()  # every bare Done is alike: settle reads only its class and its batch, None
_TRACED = tracing.ENABLED  # decided once: without opentelemetry-api a fire pays no tracing check beyond this


class FairQueue:
    """Claimed rows waiting for a slot: one FIFO per partition, taken round-robin across partitions
    in runs of at most ``run`` rows (set by the executor: as many as take :data:`RUN_S` at the
    measured mean, so that cheap handlers keep a partition's outcomes together in few commits), so that
    rows claimed ahead from one partition's backlog never stand long in front of another
    partition's."""

    def __init__(self):
        self._by_partition: dict = {}  # partition -> deque of Job; dict order is the round-robin order
        self._n = 0
        self._taken = 0  # rows taken in a row from the partition at the head
        self.run = 1

    def __len__(self) -> int:
        return self._n

    def extend(self, jobs: list) -> None:
        file_by_partition(jobs, self._by_partition, collections.deque)
        self._n += len(jobs)

    def push_front(self, jobs: list) -> None:
        """Put ``jobs`` back at the head of their partitions' queues, in their order."""
        for job in reversed(jobs):
            self._by_partition.setdefault(job.partition, collections.deque()).appendleft(job)
            self._n += 1

    def pop_run(self, first: Job, limit: int, is_async: Callable[[Job], bool]) -> list:
        """``first`` (popped already), then the next queued jobs while they are not ``is_async``: up to
        ``limit`` jobs in all, for one worker's run, taken in the order :meth:`pop` takes them. One
        call per run, and per partition's run of jobs, not per job."""
        jobs = [first]
        by_partition = self._by_partition
        while self._n and len(jobs) < limit:
            partition = next(iter(by_partition))
            queue = by_partition[partition]
            take = min(limit - len(jobs), len(queue), max(1, self.run - self._taken))
            taken = 0
            sync = None  # the handler of the job before, known not to be async: asked once per run of its jobs
            while taken < take:
                handler = queue[0].handler
                if handler is not sync:
                    if is_async(queue[0]):
                        break
                    sync = handler
                jobs.append(queue.popleft())
                taken += 1
            self._n -= taken
            self._taken += taken
            if not queue or self._taken >= self.run:  # to the back of the round, as pop() does
                del by_partition[partition]
                self._taken = 0
                if queue:
                    by_partition[partition] = queue
            if taken < take:  # an async job at the head: it runs in a slot of its own
                break
        return jobs

    def pop(self) -> Job:
        partition = next(iter(self._by_partition))
        jobs = self._by_partition[partition]
        job = jobs.popleft()
        self._n -= 1
        self._taken += 1
        if not jobs or self._taken >= self.run:  # to the back of the round
            del self._by_partition[partition]
            self._taken = 0
            if jobs:
                self._by_partition[partition] = jobs
        return job

    def clear(self) -> None:
        self._by_partition.clear()
        self._n = 0
        self._taken = 0


class Executor:
    """Handler slots for one service (loop thread only, except the worker threads' calls).

    Args:
        concurrency: slots (int >= 1).
        store: handed to handlers in their :class:`TimerContext`.
        wall_ms: the Unix-epoch clock in ms.
        max_queued: the most rows that may wait for a slot (the pass budget's ``max_fired``).
        committer: the commit stage, whose queue each outcome joins.
        recorder: where fires are counted (lateness, durations, failures).
        busy: the rows in flight, shared with the claim and commit stages.
        wakeup: rung when a slot frees up while claimed rows wait for room.
    """

    def __init__(self, concurrency: int, store: Store, wall_ms: Callable[[], int], max_queued: int,
                 committer: Committer, recorder: Recorder, busy: InFlight, wakeup: Wakeup):
        self.concurrency = concurrency
        self.store = store
        self.wall_ms = wall_ms
        self.max_queued = max_queued
        self.committer = committer
        self.recorder = recorder
        self.wakeup = wakeup
        self.queue = FairQueue()
        self.tasks: set = set()
        self.busy = busy
        self.starved = False  # a pass left due rows for want of room: ring the claimer once there is
        self._report = RunReport()  # one report until a failure is counted: most fires allocate none
        self.fire_mean_s: Optional[float] = None
        self.stopping = False
        self._async: dict = {}  # id(handler) -> whether its fire is ``async def``
        self._chunks: set = set()  # sync chunks in flight, for the watchdog
        self._async_jobs: dict = {}  # async task -> its job
        self._ignoring: set = set()  # async jobs failed for ignoring their timeout's cancel, still running
        self._watchdog: Optional[asyncio.Task] = None
        self._pool: Optional[DaemonPool] = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the worker threads."""
        self._pool = DaemonPool(self.concurrency, "durable-fire", owner=self)

    def shutdown(self) -> None:
        """Let the worker threads exit once idle (a hung call is abandoned with its daemon thread)."""
        if self._pool is not None:
            self._pool.shutdown()

    def reset(self) -> None:
        """Forget every row after the loop that ran them ended: their rows stay claimed and come
        back after their backoff, and their slots must not stay counted."""
        self.queue.clear()
        self.tasks = set()
        self.busy.clear()
        self.starved = False
        self._chunks.clear()
        self._async_jobs.clear()
        self._ignoring.clear()
        self._watchdog = None

    # -- what a pass may claim ------------------------------------------------------------------
    def free(self) -> int:
        """How many rows a pass may claim now: free slots plus the room in the queue."""
        return self.concurrency - len(self.tasks) + self.queue_room() - len(self.queue)

    def queue_room(self) -> int:
        """How many claimed rows may wait for a slot: the slots' work within QUEUE_HORIZON_S at the
        measured mean call (none before the first measurement), so that a queued row never waits
        anywhere near its first backoff (5 s), after which another runner could claim it."""
        mean_s = self.fire_mean_s
        if mean_s is None:
            return 0
        return min(self.max_queued, int(self.concurrency * QUEUE_HORIZON_S / max(mean_s, 1e-6)))

    def rows_within(self, seconds: float, floor: int) -> int:
        """How many rows the slots fire in ``seconds`` at the measured mean (``floor`` before any)."""
        mean_s = self.fire_mean_s
        return floor if mean_s is None else max(floor, int(seconds * self.concurrency / max(mean_s, 1e-6)))

    @property
    def in_flight(self) -> int:
        return len(self.tasks)

    @property
    def overdue(self) -> int:
        """Slots held by a call past its handler's ``timeout_s``: failed, a sync call's thread left to
        finish, an ``async`` call that ignored its cancel left to run, the slot free only when it returns.
        Read from any thread (``list`` of a set copies it under the GIL)."""
        overdue = len(self._ignoring)
        for chunk in list(self._chunks):
            i = chunk.current
            if i is not None and chunk.jobs[i].settled:
                overdue += 1
        return overdue

    # -- running -------------------------------------------------------------------------------
    def submit(self, jobs: list, starved: bool) -> None:
        """Queue claimed rows and start as many as slots allow; ``starved``: the pass that claimed
        them left due rows for want of room."""
        self.busy.add_all(jobs)
        self.starved = self.starved or starved
        self.queue.extend(jobs)
        self.dispatch()

    def dispatch(self) -> None:
        """Start queued rows while slots are free (never after stop(): they stay claimed)."""
        while self.queue and len(self.tasks) < self.concurrency and not self.stopping:
            first = self.queue.pop()
            if self._is_async(first):
                task = asyncio.ensure_future(self._run_async(first))
                self._async_jobs[task] = first
            else:
                jobs = self.queue.pop_run(first, self._chunk(), self._is_async)
                task = asyncio.ensure_future(self._run_sync(Chunk(jobs)))
            self.tasks.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        self._async_jobs.pop(task, None)
        self.dispatch()
        # Claim more while half the queue is still there to fire, so slots do not wait on a pass.
        if self.starved and len(self.queue) <= self.queue_room() // 2:
            self.starved = False
            self.wakeup.ring()

    def _chunk(self) -> int:
        """Queued sync fires one worker runs back to back: as many as take CHUNK_S at the measured
        mean (1 for slow handlers), so that cheap handlers do not pay a thread hand-off each. Not
        spread thinner over the free slots: cheap calls hold the GIL, so workers woken for a few of
        them each would only take turns at it (a thousand no-op fires in 16 chunks of 63 cost each
        thread of the process a fifth more CPU than in one chunk), while calls that wait on I/O take
        a slot each once their mean nears CHUNK_S."""
        mean_s = self.fire_mean_s
        if mean_s is None:
            return 1
        return max(1, int(CHUNK_S / max(mean_s, 1e-6)))

    def _is_async(self, job: Job) -> bool:
        # By id: a handler may be unhashable (a dataclass), and the registry keeps it alive.
        handler = job.handler
        found = self._async.get(id(handler))
        if found is None:
            try:
                found = is_async(handler.fire)
            except Exception:
                # Its fire fails to be read (a property, a proxy's __getattr__, that raises): called as a sync
                # one, the read fails again within its call, that attempt's failure, where it failed the
                # service's loop, every row in flight with it, at each of its attempts.
                return False
            self._async[id(handler)] = found
        return found

    async def _run_async(self, job: Job) -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        timer = None
        attempt = Attempt(time.monotonic, self.wall_ms, lambda: job.cancelled_by is not None)
        if job.timeout_s is not None and task is not None:
            timer = loop.call_later(job.timeout_s, self._time_out, job, task, attempt.started_ms, time.monotonic())
        job.started = True
        context = TimerContext(self.store, job.partition, job.now_ms)
        try:
            with attempt:
                if _TRACED:
                    attempt.outcome = await tracing.fire_async(job.handler, context, job.timer, attempt.started_ms)
                else:
                    attempt.outcome = await job.handler.fire(context, job.timer)
        except (asyncio.CancelledError, GeneratorExit):  # the latter: abandoned at a stop, closed by the collector
            if job.cancelled_by != "timeout":
                raise
            attempt.error = past_timeout(job.timeout_s, "cancelled")
        finally:
            if timer is not None:
                timer.cancel()
        if job in self._ignoring:  # failed already, when it ignored the cancel: its late result is dropped
            self._ignoring.discard(job)
            self.busy.release(job)
            self.wakeup.ring()  # its retry may be due by now, left out of the claimer's looks while in flight
            return
        if job.cancelled_by == "timeout" and attempt.error is None:
            # It swallowed the cancel and returned late: failed, its outcome dropped, as a sync call's.
            attempt.outcome = None
            attempt.error = past_timeout(job.timeout_s, "it ignored the cancel")
        self._settle([job], [attempt.outcome], [attempt.error], [attempt.started_ms], [attempt.took_s])

    @staticmethod
    def _cancel(job: Job, task: asyncio.Task, why: str) -> None:
        job.cancelled_by = why
        task.cancel()

    def _time_out(self, job: Job, task: asyncio.Task, started_ms: int, started_s: float) -> None:
        """An ``async`` call ran past its ``timeout_s``: cancel it, and fail it in :data:`IGNORED_CANCEL_S`
        if it is running still (begun at ``started_ms``, Unix epoch ms, and ``started_s``, monotonic s)."""
        self._cancel(job, task, "timeout")
        asyncio.get_running_loop().call_later(IGNORED_CANCEL_S, self._ignored_cancel, job, task, started_ms, started_s)

    def _ignored_cancel(self, job: Job, task: asyncio.Task, started_ms: int, started_s: float) -> None:
        """The call goes on after its timeout's cancel (it catches CancelledError): its failure commits now,
        as a sync call's past its timeout_s does, where nothing was recorded until it returned, for ever
        if it never did; its row stays in flight, and its slot counts as overdue, until it returns."""
        if task.done() or job.settled or job.cancelled_by != "timeout":
            return
        self._ignoring.add(job)
        error = past_timeout(job.timeout_s, "it ignored the cancel, and its outcome will be dropped")
        self._settle([job], [None], [error], [started_ms], [time.monotonic() - started_s], keep_busy=True)

    async def _run_sync(self, chunk: Chunk) -> None:
        assert self._pool is not None
        self._chunks.add(chunk)
        if self._watchdog is None:
            self._watchdog = asyncio.ensure_future(self._watch())
        try:
            outcomes, errors, started_ms, took_s = await asyncio.wrap_future(self._pool.submit(self._call_chunk, chunk))
        finally:
            self._chunks.discard(chunk)
        jobs = chunk.jobs[:len(outcomes)]  # those the loop took back never started
        if any(job.settled for job in jobs):
            kept = [i for i, job in enumerate(jobs) if not job.settled]
            for job in jobs:
                if job.settled:  # timed out already: the call's late result is dropped
                    # Its retry was left out of the claimer's last look (the row was in flight), and may
                    # be due by now: nothing else would wake the claimer for it before its longest sleep.
                    self.busy.release(job)
                    self.wakeup.ring()
            jobs, outcomes, errors = [jobs[i] for i in kept], [outcomes[i] for i in kept], [errors[i] for i in kept]
            started_ms, took_s = [started_ms[i] for i in kept], [took_s[i] for i in kept]
        if jobs:
            self._settle(jobs, outcomes, errors, started_ms, took_s)

    def _call_chunk(self, chunk: Chunk) -> tuple:
        """On a worker: call each job's sync handler in turn, unless the loop took it back; returns
        four lists in step, one entry per call made, in order: ``(outcomes, errors, started_ms,
        took_s)`` (no tuple per call: each call's entries live until the chunk is settled, long enough
        for the collector's passes to meet them, and a tuple that holds an outcome stays tracked).

        As an :class:`Attempt` times a call and takes its error, inline: everything a handler raises
        is its failure (``SystemExit`` and ``KeyboardInterrupt`` included), and each call is timed
        from the end of the one before (one clock read per call). Calls of one partition's rows of
        one pass share their :class:`TimerContext`, which is immutable."""
        outcomes: list = []
        errors: list = []
        started: list = []
        took: list = []
        # Asked once per chunk (CHUNK_S of calls), not per call: it reads the environment.
        traced = _TRACED and tracing.recording()
        monotonic, wall_ms, lock = time.monotonic, self.wall_ms, chunk.lock
        context: Optional[TimerContext] = None
        started_s = monotonic()
        for i, job in enumerate(chunk.jobs):
            started_ms = wall_ms()
            with lock:
                if i >= chunk.cut:
                    break
                chunk.current, chunk.started_s, chunk.started_ms = i, started_s, started_ms
                set_field(job, "started", True)
            if context is None or context.partition != job.partition or context.now_ms != job.now_ms:
                context = TimerContext(self.store, job.partition, job.now_ms)
            outcome, error = None, None
            try:
                if traced:
                    outcome = tracing.fire(job.handler, context, job.timer, started_ms)
                else:
                    outcome = job.handler.fire(context, job.timer)
            except BaseException as exc:  # the handler's own failure, whatever it is (see Attempt)
                error = exc
            ended_s = monotonic()
            if outcome.__class__ is Done and outcome.batch is None:
                # The shared bare Done in its place: the handler's own then goes now, where it would
                # wait for the chunk's end, a tracked object per call for the collector to promote.
                outcome = _DONE
            outcomes.append(outcome)
            errors.append(error)
            started.append(started_ms)
            took.append(ended_s - started_s)
            started_s = ended_s
        with lock:
            chunk.current = None
        return outcomes, errors, started, took

    async def _watch(self) -> None:
        """While sync chunks are in flight: rescue rows queued behind a long call, fail calls past
        their timeout."""
        try:
            while self._chunks:
                await asyncio.sleep(_WATCH_S)
                now = time.monotonic()
                rescued: list = []
                for chunk in list(self._chunks):
                    with chunk.lock:
                        i = chunk.current
                        if i is None:
                            continue
                        running_s, started_ms = now - chunk.started_s, chunk.started_ms
                        if running_s >= RESCUE_S and chunk.cut > i + 1:
                            rescued += chunk.jobs[i + 1:chunk.cut]
                            chunk.cut = i + 1
                    job = chunk.jobs[i]
                    if job.timeout_s is not None and running_s >= job.timeout_s and not job.settled:
                        error = past_timeout(job.timeout_s, "its thread is left to finish and its outcome dropped")
                        self._settle([job], [None], [error], [started_ms], [running_s], keep_busy=True)  # the call's start
                if rescued:
                    self.queue.push_front(rescued)
                    self.dispatch()
        finally:
            self._watchdog = None

    def _settle(self, jobs: list, outcomes: list, errors: list, started: list, took: list,
                keep_busy: bool = False) -> None:
        """Log and count calls that ended or timed out, turn each outcome into the guarded batch and
        queue its commit. ``jobs`` and, in step with it, each call's ``outcomes``, ``errors``,
        ``started`` (Unix epoch ms) and ``took`` (s) (what an :class:`Attempt` records), a chunk's at
        once, so that the metrics take one lock per chunk and the commit stage one call.
        ``keep_busy``: the calls still run on their threads, so their rows stay in flight until they
        return."""
        recorder, busy, wall_ms = self.recorder, self.busy, self.wall_ms
        activity = recorder.activity
        each = activity.logs_each_fire()  # asked once per chunk: a logger's level is read under a lock
        mean = self.fire_mean_s
        lateness_s: list = []  # of first attempts (retries are late by design)
        first_ms: list = []
        durations: list = []
        for job, outcome, error, started_ms, took_s in zip(jobs, outcomes, errors, started, took):
            set_field(job, "settled", True)
            mean = took_s if mean is None else mean + _MEAN_WEIGHT * (took_s - mean)
            lateness_ms = job.lateness_ms(started_ms)
            if each:
                what = f"raised {type(error).__name__}" if error is not None else type(outcome).__name__
                activity.fire(job.partition, job.timer, job.handler, lateness_ms, what)
            elif job.attempt == 1:
                first_ms.append(lateness_ms)
            if job.attempt == 1:
                lateness_s.append(lateness_ms / 1000)
            durations.append(took_s)
            if error is None:
                # A bare Done of a plain timer, nearly every fire's outcome: the job keeps the keys its
                # batch deletes, atoms the collector stops tracking, and the batch is made as the commit
                # reads it (commit_records), not kept until then as settle's _Consumed would be.
                deletes = consumed(outcome, job.schedule, job)
                if deletes is not None:
                    set_field(job, "batch", deletes)
                    continue
            report = self._report
            batch = settle(job.partition, job, report, outcome, error, wall_ms=wall_ms, still_running=keep_busy)
            if report.failed:  # a failed attempt: its row stays backed off, its error recorded (RetryLater), or parks
                self._report = RunReport()
                report.failed_kinds[job.kind.get()] = report.failed
                recorder.count(report)
            if keep_busy:
                # The call runs on in its thread: its failure commits now (its error is kept, its retry or
                # its parking written), but its row stays in flight, never claimed again here, until the
                # call returns (:meth:`_run_sync`).
                busy.hold(job)
            set_field(job, "batch", batch)
        if mean is not None:
            self.fire_mean_s = mean
            self.queue.run = max(1, int(RUN_S / max(mean, 1e-6)))
        if first_ms:
            activity.first_attempts(first_ms)
        recorder.fires_ended(lateness_s, durations)
        self.committer.add_all(jobs)

    def handler_names(self, tasks) -> list:
        """How logs name the handlers whose calls run in ``tasks`` (``async`` calls' tasks; others are
        left out), in a stable order."""
        return sorted({handler_name(self._async_jobs[task].handler) for task in tasks if task in self._async_jobs})

    async def drain(self, left_s: Callable[[], Optional[float]]) -> int:
        """After stop(): drop the queue and the rows of sync chunks not started yet (none of them
        starts now: those rows stay claimed, with ``Job.started`` False), wait up to ``left_s()``
        seconds for the calls in flight, cancel the ``async`` ones still running; returns how many
        were abandoned."""
        self.stopping = True
        self.queue.clear()
        for chunk in self._chunks:
            with chunk.lock:
                chunk.cut = min(chunk.cut, sum(job.started for job in chunk.jobs))
        if not self.tasks:
            return 0
        _, abandoned = await asyncio.wait(set(self.tasks), timeout=left_s())
        for task in abandoned:
            job = self._async_jobs.get(task)
            if job is not None:
                self._cancel(job, task, "stop")
            else:  # a sync call: its thread is abandoned, its outcome dropped
                task.cancel()
        return len(abandoned)

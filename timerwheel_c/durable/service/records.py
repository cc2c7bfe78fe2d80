"""The records that move between the service's stages: a claimed row on its way to a handler
slot and then, its outcome settled, to the store (:class:`Job`), and the rows in flight from their
claim to their commit (:class:`InFlight`).

One record carries a row the whole way: every object alive per row in flight costs the cyclic
collector, whose passes come more often and promote more to its oldest generation (the whole of an
application's objects, scanned again at each full pass) the more containers are alive at once."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from ..storage.store import Batch
from ..timers.keys import TimerKind
from ..timers.registry import DueTimer, TimerHandler, due_timer, set_timer_fields
from ..timers.runner import ClaimedTimer

__all__ = ["Chunk", "InFlight", "Job", "file_by_partition", "set_field"]

#: ``set_field(job, name, value)``: sets one of a :class:`Job`'s own fields (``settled``, ``started``,
#: ``batch``, ``cancelled_by``) past the frozen dataclass's ``__setattr__``, which ``job.name = value``
#: calls, a Python call per assignment: the executor sets three per fire. Never a claimed field.
set_field = object.__setattr__


def file_by_partition(jobs: list, queues: dict, new_queue: Callable[[], Any]) -> None:
    """Append each of ``jobs``, in order, to ``queues[job.partition]`` (made with ``new_queue()`` when
    absent). A pass's jobs, and a chunk's, come partition by partition: one lookup per run of them,
    not per job."""
    partition: Optional[str] = None
    queue: Any = None  # set in the first turn: no job's partition is None
    for job in jobs:
        if job.partition != partition:
            partition = job.partition
            queue = queues.get(partition)
            if queue is None:
                queue = queues[partition] = new_queue()
        queue.append(job)


class Job(ClaimedTimer):
    """A row claimed by a pass at ``now_ms`` (Unix epoch ms) in ``partition``, to fire with its handler:
    a :class:`ClaimedTimer` itself (its ``handler``, ``timer`` and ``schedule``, which stay frozen),
    made by the claim, so that a row in flight is one object from its claim to its commit.

    The job holds its timer's fields itself (``due_at_ms``, ``kind``, ``reference``, ``value``,
    ``attempt``, ``key``: the claimed row's; :attr:`~ClaimedTimer.holds_fields`), and ``timer`` is a
    :class:`DueTimer` of them made at each read, for the handler's call: a DueTimer kept beside the
    job was one more tracked container per row in flight, promoted with it towards the collector's
    full passes over an embedding application's heap, where the one a call gets goes with the call
    (unless its handler keeps it).

    ``settled`` (loop thread only): its outcome or failure has been taken, so a late result (of a
    call that timed out) is dropped. ``cancelled_by``: why the service cancelled an ``async`` call
    (``"timeout"`` or ``"stop"``), None otherwise. ``started``: its handler was called (set by the
    slot before the call; a sync slot sets it under its chunk's lock), so a stop gives the attempt
    back only to the rows never started. ``batch``: what commits its handler's outcome, set as the job
    joins the commit stage's queue, None before: the guarded batch of
    :func:`~timerwheel_c.durable.timers.runner.settle`, or for a bare ``Done()`` of a plain timer the
    keys that batch deletes beside the claimed row, a tuple of bytes (see
    :func:`~timerwheel_c.durable.timers.runner.consumed`), which the collector stops tracking at
    its first pass, its batch made as the commit reads it.
    """

    # Each job is a row in flight of its own: compared and hashed by identity, never by its timer.
    __eq__ = object.__eq__
    __hash__ = object.__hash__
    holds_fields = True

    # Declared for type checkers: __init__ sets the first eight, the executor the others.
    partition: str
    now_ms: int
    due_at_ms: int
    kind: TimerKind
    reference: bytes
    value: Any
    attempt: int
    key: bytes
    settled: bool
    cancelled_by: Optional[str]
    started: bool
    batch: Union[Batch, tuple, None]

    def __init__(self, partition: str, now_ms: int, handler: TimerHandler, due_at_ms: int, kind: TimerKind,
                 reference: bytes, value: Any, attempt: int, key: bytes, schedule: Optional[bytes] = None):
        # Its signature is a claim's ``claimed_as`` (:data:`~timerwheel_c.durable.timers.claim.ClaimedAs`):
        # the claim makes the Job itself from the row's fields, one record per row, never a ClaimedTimer
        # and then its Job, nor a DueTimer for the Job to copy (the call makes the handler's).
        # The claimed fields are frozen (the dataclass refuses their assignment); the others are the
        # job's, whose first values are the class's own (below) until the executor sets them. All are
        # set past the frozen dataclass's __setattr__, a Python call of its own per field.
        setattr_ = set_field
        setattr_(self, "handler", handler)
        setattr_(self, "schedule", schedule)
        setattr_(self, "partition", partition)
        setattr_(self, "now_ms", now_ms)
        set_timer_fields(self, due_at_ms, kind, reference, value, attempt, key)

    # A job's own fields as it is made: read from the class until set on the job (four calls fewer per row).
    settled = False
    cancelled_by = None
    started = False
    batch = None

    def __repr__(self) -> str:
        return f"Job(partition={self.partition!r}, now_ms={self.now_ms}, timer={self.timer!r})"

    @property
    def timer(self) -> DueTimer:
        """The claimed timer, as its handler gets it: a new :class:`DueTimer` at each read."""
        return due_timer(self.due_at_ms, self.kind, self.reference, self.value, self.attempt, self.key)

    def lateness_ms(self, fired_ms: int) -> int:
        """As :meth:`ClaimedTimer.lateness_ms`; a plain timer's read off the job's own due time."""
        if self.schedule is not None:  # its due time needs the schedule's jitter: ClaimedTimer's
            return super().lateness_ms(fired_ms)
        return max(0, fired_ms - self.due_at_ms)

    @property
    def timeout_s(self) -> Optional[float]:
        """The handler's ``timeout_s`` (seconds) or None."""
        return self.handler.timeout_s


@dataclass(eq=False)
class Chunk:
    """Sync jobs one worker thread runs back to back. ``current`` is the index of the job running
    now, ``started_s`` its start (monotonic s) and ``started_ms`` the same instant (Unix epoch ms, on
    the service's wall clock), or None between jobs; ``cut``: jobs from this
    index on were taken back by the loop (to other slots) and must not start here. Every field
    but ``jobs`` is guarded by ``lock``, shared by the worker and the loop."""

    jobs: list
    lock: threading.Lock = field(default_factory=threading.Lock)
    current: Optional[int] = None
    started_s: float = 0.0
    started_ms: int = 0
    cut: int = 0

    def __post_init__(self):
        self.cut = len(self.jobs)


class InFlight:
    """The rows this process holds from their claim until their outcome commits or is given up: a
    ``{(partition, key): Job}`` the claimer skips (never claiming again a row it is still firing), the
    run stage fills (:meth:`add`) and the commit stage empties (:meth:`discard_jobs`). Keyed by
    partition too: two partitions' timers of one kind, reference and due time, claimed at one clock
    reading, have the same claimed key, and the commit of one must not let the other be claimed
    again. Loop thread only; the claim pass on the store thread reads a frozen copy (:meth:`keys`)."""

    def __init__(self):
        self.jobs: dict = {}
        # Jobs settled while their sync call runs on past its timeout: their failure commits at once,
        # but the row stays in flight until the call returns (:meth:`release`), never fired twice at once.
        self.held: set = set()

    def __len__(self) -> int:
        return len(self.jobs)

    def add(self, job: Job) -> None:
        self.jobs[job.partition, job.key] = job

    def add_all(self, jobs: list) -> None:
        """:meth:`add` each of ``jobs``, in one call."""
        held = self.jobs
        for job in jobs:
            held[job.partition, job.key] = job

    def hold(self, job: Job) -> None:
        """Keep ``job``'s row in flight past the commit of its outcome, until :meth:`release`."""
        self.held.add(job)

    def release(self, job: Job) -> None:
        """``job``'s call has returned: its row leaves the rows in flight (unless a later claim of the
        same key holds it now)."""
        self.held.discard(job)
        at = job.partition, job.key
        if self.jobs.get(at) is job:
            del self.jobs[at]

    def discard_jobs(self, jobs: list) -> None:
        """Discard the rows of ``jobs`` (their outcomes committed or given up), but those held until
        their call returns: one call per commit, not one per row."""
        pop, held = self.jobs.pop, self.held
        for job in jobs:
            if not held or job not in held:
                pop((job.partition, job.key), None)

    def keys(self) -> dict:
        """``{partition: frozenset of its keys in flight}``, the partitions with none left out."""
        by_partition: dict = {}
        for partition, key in self.jobs:
            keys = by_partition.get(partition)
            if keys is None:
                keys = by_partition[partition] = []
            keys.append(key)
        return {partition: frozenset(keys) for partition, keys in by_partition.items()}

    def clear(self) -> None:
        self.jobs.clear()
        self.held.clear()

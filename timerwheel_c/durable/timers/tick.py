"""What one tick of the runner is allowed to do (:class:`TickBudget`) and what it did (:class:`RunReport`),
and the backoff schedule of failed attempts. Shared by the claim phase (:mod:`.claim`) and the rest of
the tick (:mod:`.runner`)."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Optional

from .due import MAX_SPAN_S
from .keys import MAX_DUE_MS

__all__ = ["BACKOFF_BASE_MS", "BACKOFF_CAP_MS", "DEFAULT_BUDGET", "LEASE_MARGIN_MS", "Backoff", "RunReport", "TickBudget",
           "backoff_ms", "lease_ms"]

BACKOFF_BASE_MS = 5_000
BACKOFF_CAP_MS = 600_000
# How long past a handler's timeout_s its claim still holds the row: the failure the timeout makes
# commits within it (a commit's round trip, a loaded runner's watchdog period), before any other
# runner may take the row.
LEASE_MARGIN_MS = 2_000


_RNG = random.Random()


def _seconds(name: str, value: object, low: float, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"Backoff.{name} must be a number, got {type(value).__name__} {value!r}")
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"Backoff.{name} must be finite and in {low}..{high}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Backoff:
    """A handler's retry delays (its ``backoff`` attribute, or ``@registry.handler(kind, backoff=...)``):
    attempt ``a`` (>= 1) is tried ``min(base_s * factor**(a-1), cap_s)`` seconds after the previous
    one began, each delay then shortened by a random fraction of up to ``jitter`` (0..1, as AWS's
    "equal jitter" spreads retries of timers that failed together). The default is 5 s doubling up
    to 10 minutes, without jitter. The delay without its jitter also bounds how long an attempt runs
    before another runner may take the timer again (its claim's lease, :func:`lease_ms`), so that the
    jitter only ever shortens a retry, never a lease: a handler that runs longer than its first delay
    needs a ``timeout_s`` (the lease is then at least that plus :data:`LEASE_MARGIN_MS`) or a larger
    ``base_s``.

    Raises:
        TypeError / ValueError: ``base_s`` not > 0 (at least 0.001), ``factor`` < 1, ``cap_s`` <
            ``base_s``, ``jitter`` outside 0..1, naming the value.
    """

    # A delay past the range of due times (base_s=1e305, say) waits until the last of them.
    base_s: float = BACKOFF_BASE_MS / 1000
    factor: float = 2.0
    cap_s: float = BACKOFF_CAP_MS / 1000
    jitter: float = 0.0

    def __post_init__(self):
        _seconds("base_s", self.base_s, 0.001)
        _seconds("factor", self.factor, 1.0)
        _seconds("cap_s", self.cap_s, self.base_s)
        _seconds("jitter", self.jitter, 0.0, 1.0)

    def delay_ms(self, attempt: int, jittered: bool = True) -> int:
        """The delay before attempt ``attempt`` (>= 1), in ms (at least 1); ``jittered`` False: without its
        jitter, the longest it may be."""
        exponent = min(attempt - 1, 1023)  # beyond it the cap holds whatever the factor
        try:
            delay_s = min(self.base_s * self.factor ** exponent, self.cap_s)
        except OverflowError:
            delay_s = self.cap_s
        if self.jitter and jittered:
            delay_s -= delay_s * self.jitter * _RNG.random()
        return max(1, min(int(min(delay_s, MAX_SPAN_S) * 1000), MAX_DUE_MS))


def backoff_ms(attempt: int, policy: Optional[Backoff] = None, jittered: bool = True) -> int:
    """Delay before attempt ``attempt`` (>= 1) is due, in ms: ``policy``'s (without its jitter when
    ``jittered`` is False), or by default ``min(5 s * 2**(attempt-1), 600 s)``."""
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    if policy is not None:
        return policy.delay_ms(attempt, jittered)
    return BACKOFF_CAP_MS if attempt > 8 else min(BACKOFF_BASE_MS << (attempt - 1), BACKOFF_CAP_MS)


def lease_ms(attempt: int, policy: Optional[Backoff] = None, timeout_s: Optional[float] = None) -> int:
    """How long a claim of attempt ``attempt`` (>= 1) holds its row from every other runner, in ms:
    the backoff without its jitter (:func:`backoff_ms`: a jitter drawn near 1 would end the lease of a
    call just begun, for another runner to start it again), or the handler's ``timeout_s`` (seconds) plus
    :data:`LEASE_MARGIN_MS` when that is longer, so that a call still within its ``timeout_s`` is
    never started again elsewhere meanwhile (the visibility timeout of a queue: SQS's, or a job
    queue's lock). A call that fails before the lease ends is retried a backoff after its failure,
    not at the lease's end (:func:`~.runner.settle`)."""
    delay_ms = backoff_ms(attempt, policy, jittered=False)
    if timeout_s is None:
        return delay_ms
    return max(delay_ms, min(math.ceil(min(timeout_s, MAX_SPAN_S) * 1000) + LEASE_MARGIN_MS, MAX_DUE_MS))


def _clamped(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"TickBudget.{name} must be an int, got {type(value).__name__} {value!r}")
    return max(1, value)


@dataclass(frozen=True)
class TickBudget:
    """Limits of one tick; each is clamped to at least 1.

    ``max_fired``: handler calls per tick. ``max_per_kind``: handler calls per kind per
    tick (lowered by a handler's ``max_per_tick``); rows over it are deferred.
    ``max_scanned``: rows looked at. ``max_elapsed_ms``: monotonic ms since the tick began,
    checked before the first row of each claim round trip and every
    :data:`~.claim.CLOCK_EVERY` rows after (rows already claimed are always fired).

    The defaults let one pass of a partition fire a backlog of 1,024 timers in a handful of
    commits (claims and outcomes are batched per chunk), while no kind takes more than a
    quarter of a pass: on PostgreSQL with synchronous commit, commits, not handler calls,
    bound the fired/s of a runner.
    """

    max_fired: int = 1024
    max_per_kind: int = 256
    max_scanned: int = 4096
    max_elapsed_ms: int = 10_000

    def __post_init__(self):
        for name in ("max_fired", "max_per_kind", "max_scanned", "max_elapsed_ms"):
            object.__setattr__(self, name, _clamped(name, getattr(self, name)))


DEFAULT_BUDGET = TickBudget()


@dataclass
class RunReport:
    """What one tick did.

    ``fired``: outcomes committed (Done or Reschedule). ``raced``: rows another runner
    took first (a claim or commit lost its guard on the row). ``failed``: fires that
    raised, returned Retry or an invalid outcome, or whose batch failed to commit or was
    refused by the store; the row stays backed off, or parks after its last attempt.
    ``parked``: timers parked after their last attempt (:mod:`.parking`), by a failed outcome's
    commit or by a claim that found the attempts used. ``unknown``: rows of unregistered kinds
    backed off (after :data:`~.claim.UNKNOWN_KIND_GRACE_MS`); ``unknown_waiting``: rows of
    unregistered kinds left in place, within that grace, for a runner that has their kind.
    ``deferred``: rows over their kind's cap. ``malformed``: rows whose key does not parse,
    moved to their quarantine key. ``unprocessable``: well-formed rows that the store
    refused to claim, moved to their quarantine key too. ``stuck``: rows that could be
    neither claimed nor quarantined, left in place and listed in ``stuck_keys`` (a caller
    passes them as ``exclude`` to later ticks so they are not retried in a loop).
    ``busy``: due rows skipped because the caller has them in flight (``exclude``).
    ``scanned``: rows looked at. ``moved``: rows this tick moved off the due range (claims
    and quarantines committed: the progress that decides ``next_wake_ms``).
    ``stopped_on_budget``: a budget limit ended the tick with due rows left, or may have: every
    registered kind had reached its cap (``max_per_kind``, a handler's ``max_per_tick``) where the
    rows read ended, so none after could fire and the tick read no further.
    ``earliest_put_ms``: the earliest due time (Unix epoch ms) of a timer row that a
    committed outcome wrote, or that an outcome left at its backoff key (a failure, a refused or
    guard-failed outcome: its retry may have come due while the handler ran), or None. ``earliest_unknown_ms``: when the first row left
    for another runner ends its grace (Unix epoch ms), or None. ``next_wake_ms``: when to
    run again (Unix epoch ms, never before ``now_ms``), or None when no timer is left.
    ``fired_kinds`` / ``failed_kinds`` / ``parked_kinds``: ``fired`` / ``failed`` / ``parked`` by
    kind number.
    """

    fired: int = 0
    raced: int = 0
    failed: int = 0
    parked: int = 0
    unknown: int = 0
    unknown_waiting: int = 0
    deferred: int = 0
    malformed: int = 0
    unprocessable: int = 0
    stuck: int = 0
    busy: int = 0
    scanned: int = 0
    moved: int = 0
    stopped_on_budget: bool = False
    earliest_put_ms: Optional[int] = None
    earliest_unknown_ms: Optional[int] = None
    next_wake_ms: Optional[int] = None
    stuck_keys: list = field(default_factory=list)
    # kind number -> count, of the outcomes committed (``fired``) and failed to commit, for
    # metrics by kind
    fired_kinds: dict = field(default_factory=dict)
    failed_kinds: dict = field(default_factory=dict)
    parked_kinds: dict = field(default_factory=dict)

"""The service's arguments, checked once, at its edge (:class:`DurableTimerService`'s constructor),
before anything that may hold a connection (the fleet ownership) is opened: the stages below take
them as they are, and check nothing again."""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Iterable, Optional

from ..storage.redact import redact
from ..storage.store import check_partition
from ..timers.due import MAX_SPAN_S
from ..timers.runner import TickBudget
from ..timers.timing import DEFAULT_TIMING, SYSTEM_CLOCK, Clock, Timing
from .pool import MAX_CONCURRENCY

__all__ = ["Arguments", "check_arguments", "check_stop_timeout"]


@dataclass(frozen=True)
class Arguments:
    """The service's arguments once checked (see :class:`DurableTimerService` for each). ``partitions``
    is a list of checked names or None; ``in_fleet``: whether to ask the store for an ownership."""

    partitions: Optional[list]
    concurrency: int
    budget: TickBudget
    max_sleep_s: float
    summary_interval_s: float
    in_fleet: bool
    separate_commits: bool
    clock: Clock
    timing: Timing


def _positive(name: str, value: object, unit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of {unit}, got {type(value).__name__} {value!r}")
    # Bounded: a finite 1e300 s is an infinite ns count where the service sleeps by it.
    if not (math.isfinite(value) and 0 < value <= MAX_SPAN_S):
        raise ValueError(f"{name} must be finite and > 0 {unit}, at most {MAX_SPAN_S:g}, got {value!r}")
    return float(value)


def check_arguments(partitions: Optional[Iterable[str]], concurrency: int, budget: TickBudget, max_sleep_s: float,
                    summary_interval_s: float, fleet: Optional[bool], separate_commits: bool,
                    clock: Optional[Clock], timing: Optional[Timing], divides: bool = False) -> Arguments:
    """The service's arguments checked, each in turn, the defaults filled in. ``divides``: the store
    divides its partitions among a fleet (it has an ownership).

    Raises:
        TypeError / ValueError: a bad argument, naming its value (a partition's name redacted when a
            str is given for the iterable of them); in a fleet, a ``timing.ownership_lease_s`` not
            above the budget's ``max_elapsed_ms``, naming both.
    """
    if timing is not None and not isinstance(timing, Timing):
        raise TypeError(f"timing must be a Timing, got {type(timing).__name__} {timing!r}")
    if isinstance(partitions, str):
        raise TypeError(f"partitions must be an iterable of str, not the str {redact(partitions)!r}")
    if not isinstance(budget, TickBudget):
        raise TypeError(f"budget must be a TickBudget, got {type(budget).__name__} {budget!r}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int):
        raise TypeError(f"concurrency must be an int, got {type(concurrency).__name__} {concurrency!r}")
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError(f"concurrency must be 1..{MAX_CONCURRENCY}, got {concurrency}")
    max_sleep_s = _positive("max_sleep_s", max_sleep_s, "seconds")
    summary_interval_s = _positive("summary_interval_s", summary_interval_s, "seconds")
    checked = None if partitions is None else [check_partition(p) for p in partitions]
    if fleet not in (None, True, False):
        raise TypeError(f"fleet must be None, True or False, got {fleet!r}")
    if not isinstance(separate_commits, bool):
        raise TypeError(f"separate_commits must be a bool, got {type(separate_commits).__name__} {separate_commits!r}")
    in_fleet = bool(fleet or (fleet is None and partitions is None))
    timing = DEFAULT_TIMING if timing is None else timing
    # A pass runs no ownership evaluation, this runner's heartbeat: a lease a pass can outlast would
    # have a live runner ended and its share taken over mid-pass.
    if in_fleet and divides and timing.ownership_lease_s * 1000 <= budget.max_elapsed_ms:
        raise ValueError(f"Timing.ownership_lease_s ({timing.ownership_lease_s!r} s) must be above the "
                         f"longest pass, budget.max_elapsed_ms ({budget.max_elapsed_ms!r} ms)")
    return Arguments(checked, concurrency, budget, max_sleep_s, summary_interval_s, in_fleet, separate_commits,
                     SYSTEM_CLOCK if clock is None else clock, timing)


def check_stop_timeout(timeout: object) -> Optional[float]:
    """``stop()``'s ``timeout``: None (no limit), or seconds >= 0; one past what a thread can wait
    (``threading.TIMEOUT_MAX``, infinity included) is no limit either.

    Raises:
        TypeError / ValueError: not a number, NaN or negative, naming the value.
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be seconds (a number) or None, got {type(timeout).__name__} {timeout!r}")
    if not timeout >= 0:  # NaN fails it too
        raise ValueError(f"timeout must be None or seconds >= 0, got {timeout!r}")
    return None if timeout >= threading.TIMEOUT_MAX else float(timeout)

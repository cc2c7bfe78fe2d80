"""Injected time and policy for the durable service: a :class:`Clock` (wall and monotonic, and the
waits on the latter) and a :class:`Timing` (the backoff, the unknown-kind grace, stop()'s wait, and a
fleet's ownership interval and lease).

The service reads time only through its clock, so a test gives it a :class:`ManualClock` and drives
time by hand, as tokio's ``time::pause()``/``advance()`` and the ``time_machine`` package do: nothing
sleeps in real time, and a wait ends exactly when :meth:`ManualClock.advance` carries the clock past
its deadline, never before. The wall clock of a :class:`ManualClock` moves with its monotonic one.

It lives in the timers layer, below the service, so that durable sleeps can take it too.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..storage.store import CHECK_INTERVAL_S, LEASE_S, check_wait_ms
from .claim import UNKNOWN_KIND_GRACE_MS
from .due import MAX_SPAN_S

if TYPE_CHECKING:
    import asyncio

__all__ = ["DEFAULT_TIMING", "LOCK_WAIT_MS", "SYSTEM_CLOCK", "Clock", "ManualClock", "SystemClock", "Timing"]


class Clock(Protocol):
    """Where the durable service reads time and waits on it."""

    def wall_ns(self) -> int:
        """Now, Unix epoch ns."""

    def monotonic_ns(self) -> int:
        """A monotonic reading in ns (only differences mean anything)."""

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for ``seconds`` of this clock's monotonic time."""

    async def sleep_until(self, at_ns: int) -> None:
        """Complete once :meth:`monotonic_ns` reaches ``at_ns`` (ns), however far ahead it is."""


# The longest one wait of SystemClock.sleep_until, ns: a day, far inside the release timer's 10 years.
_SLEEP_CHUNK_NS = 86_400 * 1_000_000_000
# The least wait of SystemClock.sleep_until after a wait that left its clock short of the deadline,
# ns: a clock a test holds still is waited on, never spun on.
_STANDSTILL_STEP_NS = 1_000_000

if hasattr(time, "clock_gettime_ns"):
    def _host_monotonic_ns() -> int:
        """The release timer's own clock, CLOCK_MONOTONIC, where a test tool that patches
        time.monotonic_ns (freezegun) does not reach."""
        return time.clock_gettime_ns(time.CLOCK_MONOTONIC)
else:  # Windows: the release timer's clock is time.monotonic's
    def _host_monotonic_ns() -> int:
        return time.monotonic_ns()


class SystemClock:
    """The host's clocks: :func:`time.time_ns`, :func:`time.monotonic_ns`; waits on the process-wide
    release timer (see :mod:`.deadline`)."""

    # Methods that look the functions up at each read, not the functions themselves: a test tool
    # that patches the time module (freezegun) must move this clock as it moves asyncio's loop.
    def wall_ns(self) -> int:
        return time.time_ns()

    def monotonic_ns(self) -> int:
        return time.monotonic_ns()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    async def sleep_until(self, at_ns: int) -> None:
        """However far ``at_ns`` is, and whatever patches this clock. The release timer waits, on the
        host's own monotonic clock, for what is left by this one: the same clock unless a test tool
        patched ``time.monotonic_ns`` (freezegun, whose reading is no deadline of the host's); at most
        a day at a time (it takes a deadline at most 10 years ahead), this clock read again after
        each wait, and at least a ms once a wait left it short (a clock held still is not spun on)."""
        # Here, not at the top: the release core loads when a service first sleeps (see .deadline).
        from .deadline import deadline_factory

        deadline = deadline_factory()
        least_ns = 0
        while True:
            left_ns = at_ns - self.monotonic_ns()
            if left_ns <= 0:
                return
            # Read after this clock: on the unpatched clock the deadline is never before at_ns.
            await deadline(_host_monotonic_ns() + min(max(left_ns, least_ns), _SLEEP_CHUNK_NS))
            least_ns = _STANDSTILL_STEP_NS


SYSTEM_CLOCK = SystemClock()


class ManualClock:
    """A clock that moves only when :meth:`advance` is called; thread-safe.

    Args:
        wall_ns: its wall clock's starting reading, Unix epoch ns (default: the host's now).
        monotonic_ns: its monotonic clock's starting reading, ns (default 0).
    """

    def __init__(self, wall_ns: int | None = None, monotonic_ns: int = 0):
        self._cond = threading.Condition()
        self._mono_ns = monotonic_ns
        self._wall_offset_ns = (time.time_ns() if wall_ns is None else wall_ns) - monotonic_ns
        self._waiters: list = []  # (at_ns, loop, future) of sleep_until() calls not yet woken

    def wall_ns(self) -> int:
        with self._cond:
            return self._mono_ns + self._wall_offset_ns

    def monotonic_ns(self) -> int:
        with self._cond:
            return self._mono_ns

    def advance(self, seconds: float) -> None:
        """Move both readings ``seconds`` forward and wake every wait whose deadline is then reached.

        Raises:
            ValueError: ``seconds`` negative, infinite or NaN (naming it).
        """
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"a ManualClock advances by a finite number of seconds >= 0, got {seconds!r}")
        with self._cond:
            self._mono_ns += round(seconds * 1e9)
            now = self._mono_ns
            due = [w for w in self._waiters if w[0] <= now]
            self._waiters = [w for w in self._waiters if w[0] > now]
            self._cond.notify_all()
        for _, loop, future in due:
            try:
                loop.call_soon_threadsafe(_resolve, future)
            except RuntimeError:  # that loop has closed: nobody waits any more
                pass

    @property
    def waiting(self) -> int:
        """Async waits not yet woken (to let a test see that the service has gone to sleep)."""
        with self._cond:
            return len(self._waiters)

    def sleep(self, seconds: float) -> None:
        with self._cond:
            until = self._mono_ns + round(seconds * 1e9)
            self._cond.wait_for(lambda: self._mono_ns >= until)

    async def sleep_until(self, at_ns: int) -> None:
        import asyncio  # here: the durable package loads without asyncio, and a coroutine has it loaded

        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._cond:
            if at_ns <= self._mono_ns:
                return
            entry = (at_ns, loop, future)
            self._waiters.append(entry)
        try:
            await future
        finally:
            with self._cond:
                if entry in self._waiters:
                    self._waiters.remove(entry)


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


# The longest a claim or a commit waits for a lock another transaction holds (a caller's open
# transaction on a partition, a row lock on an effect row), where the store bounds it (PostgreSQL's
# lock_timeout): past it that partition's call fails alone and backs off while the others go on.
# Far above a writer's ordinary transaction (milliseconds), far below the first backoff (5 s).
LOCK_WAIT_MS = 250


@dataclass(frozen=True)
class Timing:
    """The durable service's time policy; the defaults are the service's long-standing values.

    Args:
        backoff_base_s: the wait after a first failed store call, s, doubling with each further one.
        backoff_max_s: the longest such wait, s.
        unknown_kind_grace_ms: how long after its due time a row of a kind this runner lacks is left
            for a runner that has it, ms (see :mod:`.claim`).
        stop_timeout_s: stop()'s default wait for the handlers in flight, s.
        ownership_interval_s: in a fleet, the longest a runner goes between two evaluations of its
            ownership (which runners live, what it owns), s: a dead runner's share is taken over
            within about this long once its locks are gone.
        ownership_lease_s: in a fleet, how long a runner whose lock connection ran no query is left
            before a live runner ends its session and takes its share over (a frozen runner), s; above
            ``ownership_interval_s``, and above the longest pass (its budget's ``max_elapsed_ms``).
            Both are read on the service's clock (see
            :mod:`timerwheel_c.durable.storage.postgres.ownership`).
        lock_wait_ms: the longest a claim or a commit waits for a lock another transaction holds, ms
            (:data:`LOCK_WAIT_MS`, 250 ms), where the store bounds it (PostgreSQL's ``lock_timeout``
            on the service's own connections): past it that partition's call fails alone and backs off.

    Raises:
        TypeError / ValueError: a value that is not a finite number > 0 (the grace: an int >= 0; the lock
            wait: an int from 1 ms), a lease not above the interval, naming it.
    """

    backoff_base_s: float = 0.05
    backoff_max_s: float = 5.0
    unknown_kind_grace_ms: int = UNKNOWN_KIND_GRACE_MS
    stop_timeout_s: float = 10.0
    ownership_interval_s: float = CHECK_INTERVAL_S
    ownership_lease_s: float = LEASE_S
    lock_wait_ms: int = LOCK_WAIT_MS

    def __post_init__(self) -> None:
        for name in ("backoff_base_s", "backoff_max_s", "stop_timeout_s", "ownership_interval_s", "ownership_lease_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"Timing.{name} must be a number of seconds, got {type(value).__name__} {value!r}")
            # Bounded: a finite 1e308 s turns into an infinite ms or ns count where the service waits by it.
            if not (math.isfinite(value) and 0 < value <= MAX_SPAN_S):
                raise ValueError(f"Timing.{name} must be finite and in (0, {MAX_SPAN_S:g}] seconds, got {value!r}")
        grace = self.unknown_kind_grace_ms
        if isinstance(grace, bool) or not isinstance(grace, int) or grace < 0:
            raise ValueError(f"Timing.unknown_kind_grace_ms must be an int >= 0 ms, got {grace!r}")
        check_wait_ms("Timing.lock_wait_ms", self.lock_wait_ms, 1)
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError(f"Timing.backoff_max_s ({self.backoff_max_s!r}) is below backoff_base_s "
                             f"({self.backoff_base_s!r})")
        if self.ownership_lease_s <= self.ownership_interval_s:
            raise ValueError(f"Timing.ownership_lease_s ({self.ownership_lease_s!r}) must be above "
                             f"ownership_interval_s ({self.ownership_interval_s!r}): a live runner would lose its share")

    def backoff_s(self, failures: int) -> float:
        """The wait after ``failures`` (>= 1) failed store calls in a row, s: the base doubling to the max."""
        return min(self.backoff_base_s * 2 ** min(failures - 1, 16), self.backoff_max_s)


DEFAULT_TIMING = Timing()

"""The fleet's clock: a service judges due times by its store server's wall clock where the store
has one (PostgreSQL), so runners on hosts whose clocks disagree still agree on what is due, and a
runner whose host clock runs ahead never fires a timer early. PostgreSQL job queues do the same by
asking "is it due?" in SQL with the server's ``now()`` (pgqueuer, procrastinate).

The server's clock is read in one round trip at most every :data:`REFRESH_S` (``clock_timestamp()``,
:meth:`~timerwheel_c.durable.storage.store.Store.clock_ns`) and carried between reads on the host's
*monotonic* clock: ``now = monotonic + offset``. The reading ``S`` was taken somewhere within the round
trip, so the offset kept is ``S - (monotonic after the reply)``, the lowest it can be: the clock so
made runs behind the server's by at most one round trip, never ahead of it. Being carried on the
monotonic clock, it is also immune to a step of the host's wall clock between reads. A monotonic
clock that runs fast (a host whose clock source is wrong, a VM's, or libfaketime's ``x4``) would carry
it ahead of the server's between reads: so the rate of the two clocks is measured between reads, and
where the server's ran more than :data:`RATE_TOLERANCE` slower, the time is carried at its rate
(never faster than the monotonic clock: one that runs slow only makes the clock late). Until a
second read has measured it, the time is not carried at all (it stays at the first reading: a timer
may then wait for that read, never fire early); that read comes :data:`FIRST_REFRESH_S` after the first,
and a sleep converted meanwhile ends by then (:meth:`StoreClock.next_read_ns`). Before the first read
has answered there is no time to carry, so that read's error goes to the caller, whose pass then
claims nothing: the host's clock never judges a due time for a store with a server clock.

A store without a server clock (SQLite, whose runners share one host) keeps the host's wall clock.
When the host's wall clock is more than :data:`SKEW_WARN_NS` off the server's, whatever the round
trip's halves, a WARNING says so once, and again only after it has come back within that bound.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from ..storage.store import Store

__all__ = ["FIRST_REFRESH_S", "RATE_TOLERANCE", "REFRESH_S", "SKEW_WARN_NS", "StoreClock"]

log = logging.getLogger("timerwheel_c.durable")

REFRESH_S = 5.0  # the longest the clock runs on the monotonic clock between two reads of the server's
FIRST_REFRESH_S = 0.2  # the second read's delay, which gives the first measure of the two clocks' rates
# A measured rate this far below 1 is the host's clock running fast, not the round trips' noise
# (1 ms over FIRST_REFRESH_S is 0.5 %); NTP keeps a real clock within 0.05 %.
RATE_TOLERANCE = 0.01
SKEW_WARN_NS = 1_000_000_000  # a host clock this far off the server's is logged at WARNING


class StoreClock:
    """Unix-epoch ns by the store server's clock (see the module docstring); thread-safe reads.

    Args:
        host_ns: the host's wall clock in ns (compared with the server's, for the warning).
        monotonic_ns: the host's monotonic clock in ns.
        refresh_s: seconds between reads of the server's clock.
    """

    def __init__(self, host_ns: Callable[[], int] = time.time_ns, monotonic_ns: Callable[[], int] = time.monotonic_ns,
                 refresh_s: float = REFRESH_S):
        self.host_ns = host_ns
        self.monotonic_ns = monotonic_ns
        self.refresh_s = refresh_s
        self.offset_ns: Optional[int] = None  # server ns minus monotonic ns; None: the host's wall clock
        self.skew_ns: Optional[int] = None  # host wall clock minus the server's at the last read
        self.rate = 0.0  # server ns per monotonic ns the time is carried at, at most 1: none until measured
        self._read_at_ns: Optional[int] = None  # monotonic ns of the last read
        self._tried_at_ns = -1  # monotonic ns of the last read tried, answered or not
        self._reads = 0
        self._skewed = False

    def now_ns(self) -> int:
        """Now, Unix epoch ns: the server's clock as last read, carried on the monotonic clock (at
        :attr:`rate`), or the host's wall clock before a read and for a store without a server clock."""
        offset, read_at = self.offset_ns, self._read_at_ns
        if offset is None or read_at is None:
            return self.host_ns()
        mono = self.monotonic_ns()
        if self.rate == 1.0:
            return mono + offset
        return read_at + offset + int((mono - read_at) * self.rate)

    def next_read_ns(self) -> Optional[int]:
        """The monotonic ns at which the next read of the server's clock is due, while the time is carried
        slower than the monotonic clock (not at all before the second read): a sleep converted to a
        monotonic deadline by it ends late by as much as the time falls behind meanwhile, so it should end
        by that read. None while the time keeps the monotonic clock's pace, for a store without a server
        clock, and once that read was tried and failed (the caller's store errors pace the next try).
        """
        read_at = self._read_at_ns
        if self.offset_ns is None or read_at is None or self.rate >= 1.0:
            return None
        due_ns = read_at + int(self._every_s() * 1e9)
        return None if self._tried_at_ns >= due_ns else due_ns

    def _every_s(self) -> float:
        """Seconds between the last read and the next."""
        return min(FIRST_REFRESH_S, self.refresh_s) if self._reads == 1 else self.refresh_s

    def refresh(self, store: Store) -> None:
        """Read the server's clock through ``store`` if ``refresh_s`` has passed since the last read (on
        the thread that owns ``store``). A failed read keeps the last offset: the caller's next store
        call meets the same error and reports it.

        Raises:
            StoreError: the first read failed. There is no offset to keep, and the host's clock would
                stand in: a host an hour ahead would fire every timer due within the hour, should the
                caller's claims reach the server a moment later (a restart ending between the two).
        """
        mono0 = self.monotonic_ns()
        if self._read_at_ns is not None and mono0 - self._read_at_ns < self._every_s() * 1e9:
            return
        self._tried_at_ns = mono0
        host0 = self.host_ns()
        try:
            server_ns = store.clock_ns()
        except Exception:
            if self._read_at_ns is None:
                raise
            return
        mono1, host1 = self.monotonic_ns(), self.host_ns()
        last_server_ns, last_mono_ns = (None if self.offset_ns is None or self._read_at_ns is None
                                        else self._read_at_ns + self.offset_ns), self._read_at_ns
        self._read_at_ns = mono1
        self._reads += 1
        if server_ns is None:
            self.refresh_s = float("inf")  # no server clock: the host's, for good
            return
        self.offset_ns = server_ns - mono1
        if last_server_ns is not None and last_mono_ns is not None and mono1 > last_mono_ns:
            rate = (server_ns - last_server_ns) / (mono1 - last_mono_ns)
            self.rate = max(rate, 0.0) if rate < 1.0 - RATE_TOLERANCE else 1.0
        self.skew_ns = (host0 + host1) // 2 - server_ns
        # The reading lies anywhere within the round trip, so the skew is known to half of it: only a
        # verdict that holds whatever the trip's halves changes the warning's state, and a slow trip (a
        # stalled network, a busy server) never reads as a host clock gone wrong.
        doubt_ns = (mono1 - mono0) // 2
        skewed = (abs(self.skew_ns) - doubt_ns > SKEW_WARN_NS or
                  (self._skewed and abs(self.skew_ns) + doubt_ns > SKEW_WARN_NS))
        if skewed and not self._skewed:
            log.warning("this host's clock is %+.3f s off the store server's; due times are judged by the "
                        "server's clock (a host clock more than 1 s off is worth fixing: NTP)", self.skew_ns / 1e9)
        elif self._skewed and not skewed:
            log.info("this host's clock is back within 1 s of the store server's (%+.3f s)", self.skew_ns / 1e9)
        self._skewed = skewed

"""The fleet's clock: a service judges due times by its store server's wall clock where the store
has one (PostgreSQL), so runners on hosts whose clocks disagree still agree on what is due, and a
runner whose host clock runs ahead never fires a timer early. PostgreSQL job queues do the same by
asking "is it due?" in SQL with the server's ``now()`` (pgqueuer, procrastinate).

The server's clock is read in one round trip at most every :data:`REFRESH_S` (``clock_timestamp()``,
:meth:`~timerwheel_c.durable.storage.store.Store.clock_ns`) and carried between reads on the host's
*monotonic* clock: ``now = monotonic + offset``. The reading ``S`` was taken somewhere within the round
trip, so the offset kept is ``S - (monotonic after the reply)``, the lowest it can be: the clock so
made runs behind the server's by at most one round trip, never ahead of it. Being carried on the
monotonic clock, it is also immune to a step of the host's wall clock between reads.

A store without a server clock (SQLite, whose runners share one host) keeps the host's wall clock.
When the host's wall clock is more than :data:`SKEW_WARN_NS` off the server's, whatever the round
trip's halves, a WARNING says so once, and again only after it has come back within that bound.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from ..storage.store import Store

__all__ = ["REFRESH_S", "SKEW_WARN_NS", "StoreClock"]

log = logging.getLogger("timerwheel_c.durable")

REFRESH_S = 5.0  # the longest the clock runs on the monotonic clock between two reads of the server's
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
        self._read_at_ns: Optional[int] = None  # monotonic ns of the last read
        self._skewed = False

    def now_ns(self) -> int:
        """Now, Unix epoch ns: the server's clock as last read, carried on the monotonic clock, or
        the host's wall clock before a read and for a store without a server clock."""
        offset = self.offset_ns
        return self.host_ns() if offset is None else self.monotonic_ns() + offset

    def refresh(self, store: Store) -> None:
        """Read the server's clock through ``store`` if ``refresh_s`` has passed since the last read (on
        the thread that owns ``store``). A failed read keeps the last offset: the caller's next store
        call meets the same error and reports it.

        Raises:
            nothing: a store error is swallowed (see above).
        """
        mono0 = self.monotonic_ns()
        if self._read_at_ns is not None and mono0 - self._read_at_ns < self.refresh_s * 1e9:
            return
        host0 = self.host_ns()
        try:
            server_ns = store.clock_ns()
        except Exception:
            return
        mono1, host1 = self.monotonic_ns(), self.host_ns()
        self._read_at_ns = mono1
        if server_ns is None:
            self.refresh_s = float("inf")  # no server clock: the host's, for good
            return
        self.offset_ns = server_ns - mono1
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

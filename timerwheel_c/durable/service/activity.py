"""What a durable service says about its work, through the ``timerwheel_c.durable`` logger.

- DEBUG, one line per fired timer, named by
  :func:`~timerwheel_c.durable.timers.names.timer_name` (partition, kind, reference, attempt,
  due time), its lateness (ms from the due time to the start of ``fire``) and the outcome.
- INFO, a summary every ``summary_interval_s`` when anything happened: fired, failed
  (the row backed off or parked), parked after their last attempt, unknown kinds backed off, raced, and the lateness p50 / p99 of
  the first attempts fired since the previous summary (retries are late by design: their
  backoff would hide the runner's own lateness).
- WARNING when a pass falls behind: it stopped on its budget with due rows left, or it
  fired a first attempt more than :data:`BEHIND_MS` late. At most one such line per
  :data:`BEHIND_EVERY_S`, counting the passes it stands for.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from typing import Optional

from ..timers.names import timer_name

__all__ = ["BEHIND_EVERY_S", "BEHIND_MS", "Activity"]

log = logging.getLogger("timerwheel_c.durable")

BEHIND_MS = 1_000
BEHIND_EVERY_S = 10.0


def _nearest_rank(sorted_values: list, q: float) -> int:
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


class Activity:
    """Counts and logs a service's fires (thread-safe; see the module docstring).

    Args:
        summary_interval_s: seconds between INFO summaries (> 0).
    """

    def __init__(self, summary_interval_s: float):
        self.summary_interval_s = summary_interval_s
        self._lock = threading.Lock()
        self._last_summary = time.monotonic()
        self._last_behind: Optional[float] = None
        self._behind_passes = 0
        self._reset()

    def _reset(self) -> None:
        self.fired = self.failed = self.parked = self.unknown = self.raced = 0
        self._lateness_ms: list = []

    def fire(self, partition: str, timer, handler, lateness_ms: int, outcome: str) -> None:
        """One call of ``handler`` on ``timer`` ended with ``outcome`` (a short word: Done, Retry, raised...)."""
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s fired %d ms late: %s", timer_name(partition, timer.kind, timer.reference, handler=handler,
                                                             attempt=timer.attempt, due_at_ms=timer.due_at_ms),
                      lateness_ms, outcome)
        if timer.attempt == 1:
            # No lock: list.append is atomic, and a sample appended to the list a summary just took
            # is only missing from that summary's percentiles.
            self._lateness_ms.append(lateness_ms)

    def logs_each_fire(self) -> bool:
        """Whether :meth:`fire` logs each call (DEBUG is on): when it does not, a caller may pass the
        first attempts' lateness of many calls to :meth:`first_attempts` at once instead."""
        return log.isEnabledFor(logging.DEBUG)

    def first_attempts(self, lateness_ms: list) -> None:
        """What :meth:`fire` keeps of first attempts when it logs nothing: their lateness (ms) for the
        summary's percentiles (no lock, as :meth:`fire`'s append: ``list.extend`` is one call too)."""
        self._lateness_ms.extend(lateness_ms)

    def count(self, report) -> None:
        """Add a :class:`RunReport`'s fired / failed / parked / unknown / raced counts."""
        with self._lock:
            self.fired += report.fired
            self.failed += report.failed
            self.parked += report.parked
            self.unknown += report.unknown
            self.raced += report.raced

    def pass_ended(self, partition: str, stopped_on_budget: bool, worst_lateness_ms: Optional[int]) -> None:
        """Warn (rate-limited) when this pass fell behind."""
        behind = stopped_on_budget or (worst_lateness_ms is not None and worst_lateness_ms > BEHIND_MS)
        if not behind:
            return
        now = time.monotonic()
        with self._lock:
            self._behind_passes += 1
            if self._last_behind is not None and now - self._last_behind < BEHIND_EVERY_S:
                return
            passes, self._behind_passes, self._last_behind = self._behind_passes, 0, now
        log.warning("durable timers falling behind on partition %r: %s%s (%d pass(es) behind since the last warning)",
                    partition, "the pass stopped on its budget with due rows left" if stopped_on_budget else "",
                    "" if worst_lateness_ms is None or worst_lateness_ms <= BEHIND_MS
                    else f"{'; ' if stopped_on_budget else ''}a first attempt fired {worst_lateness_ms} ms late", passes)

    def summary_due_in_s(self) -> float:
        """Seconds until the next summary is due (0 when it is); the service sleeps no longer."""
        return max(0.0, self._last_summary + self.summary_interval_s - time.monotonic())

    def maybe_summarize(self) -> None:
        """Log the INFO summary when ``summary_interval_s`` has passed since the last one."""
        now = time.monotonic()
        with self._lock:
            if now - self._last_summary < self.summary_interval_s:
                return
            elapsed_s = now - self._last_summary
            self._last_summary = now
            fired, failed, parked, unknown, raced = self.fired, self.failed, self.parked, self.unknown, self.raced
            lateness = sorted(self._lateness_ms)
            self._reset()
        if not (fired or failed or parked or unknown or raced):
            return
        late = (f"lateness p50 {_nearest_rank(lateness, 0.5)} ms, p99 {_nearest_rank(lateness, 0.99)} ms "
                f"over {len(lateness)} first attempts" if lateness else "no first attempts")
        log.info("durable timers in the last %.0f s: %d fired, %d failed, %d parked after their last attempt, "
                 "%d of unknown kinds backed off, %d raced; %s", elapsed_s, fired, failed, parked, unknown, raced, late)

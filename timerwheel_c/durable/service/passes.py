"""The claim stage's passes: which rows of which partitions to claim now, fairly, with each store
error kept to the partition that raised it.

A pass runs on the store thread and may claim ``free`` rows (free slots plus queue room):

- Fair across partitions: a partition may first claim an equal share of ``free`` (rounded up,
  to whole claim round trips of 64 rows when it is larger; at least ``min_share``, the rows the
  slots fire in :data:`~.executor.SHARE_S` at the measured mean, so that cheap handlers still
  commit in large batches while slow ones share finely),
  the partitions taken in an order that rotates by one each pass; what is left then goes to
  those that had more due (a second round). A backlog of thousands in one partition thus takes
  no more than its share while another partition has a timer due.
- Errors stay with their partition: an error claiming in one (or reading its next due time)
  keeps the rows already claimed there and everywhere else, and the pass goes on with the next
  partition. The failing partition backs off on its own (50 ms doubling to 5 s) while the
  others are served.
- Rows in flight in this process (the executor's ``busy``) are never claimed again; rows that
  can be neither claimed nor quarantined (``stuck``) are skipped for :data:`STUCK_RETRY_S`.
- Few round trips: the first page of due rows of every partition is read in one
  :meth:`~timerwheel_c.durable.storage.store.Store.scan_many`, and so is, after the claims, the next
  due time of every partition that needs one; a pass over idle partitions thus costs two round trips,
  not two per partition. Should such a read fail, each partition reads its own, so that an error
  still stays with the partition that raised it.
- By shard, when the service serves the whole store (``shards`` given): the pass reads the due
  rows of every shard, in due order across each shard's partitions, with one
  :meth:`~timerwheel_c.durable.storage.store.Store.scan_shards` (an index range scan per shard), and
  claims in the partitions those rows lie in, their first pages taken from that read; after the
  claims, the next due time of the whole store is one more such read, the first future row of each
  shard. A pass thus costs O(shards), the same with a million partitions holding a timer a day
  away as with one: idle partitions are never looked at one by one. A shard read is the pass's
  read of what it serves, so its failure fails the pass (the service backs off) as reading the
  partitions does. A shard whose due rows fill the read holds more: the pass says so (starved, or
  a wake now, after a pass that claimed), and the next pass reads on.
- In a fleet, a partition just taken over from a runner that died (it has not come back within
  the ownership's grace) first has that runner's claims released
  (:func:`~timerwheel_c.durable.timers.claim.release_claims`, over the registry's longest first
  backoff), so its rows in flight fire again then instead of after their backoff.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional

from ..storage.shards import shard_of, shard_wide
from ..storage.store import Ownership, Page, Store
from ..timers import keys
from ..timers.registry import TimerRegistry
from ..timers.claim import SCAN_PAGE, release_range
from ..timers.runner import (NO_PROGRESS_WAKE_MS, PAGE, TickBudget, claim_due, claim_due_across,
                             due_request, needs_wake_scan, next_wake, release_claims, wake_request)
from ..timers.timing import Timing
from .metrics import Recorder
from .records import Job

__all__ = ["STUCK_RETRY_S", "PassResult", "Passes"]

log = logging.getLogger("timerwheel_c.durable")

STUCK_RETRY_S = 600.0


@dataclass
class PassResult:
    """What a pass claimed (``jobs``, in claim order), when to pass again (``wake_ms``, Unix epoch ms,
    or None when no timer is left) and whether due rows were left for want of room (``starved``)."""

    jobs: list
    wake_ms: Optional[int]
    starved: bool


class Passes:
    """Claim passes over the served partitions (store thread only).

    Args:
        store, registry, budget: as the service's.
        served: the partitions to look at now (ownership, list or the store's).
        ownership: the fleet ownership, or None.
        recorder: counts each claim's report and each failed store call (and logs passes falling behind).
        wall_ms: the Unix-epoch clock in ms.
        timing: the backoff of a partition whose claim failed, and the grace of a row of a kind the
            registry lacks (see :mod:`~timerwheel_c.durable.timers.claim`).
        clock: monotonic seconds (the service's clock): retries, skips and each claim's budget (``max_elapsed_ms``).
        shards: the shards to read now (``shards()``: a list of ints), or None to pass over the
            partitions ``served`` gives one by one; given, ``served`` is not called.

    ``answered_s``: when (``clock``) a claim round trip last succeeded, or the served partitions
    were read and there were none; None before that. The service's health check reads it.
    """

    def __init__(self, store: Store, registry: TimerRegistry, budget: TickBudget, served: Callable[[], list],
                 ownership: Optional[Ownership], recorder: Recorder, wall_ms: Callable[[], int], timing: Timing,
                 clock: Callable[[], float] = time.monotonic, shards: Optional[Callable[[], list]] = None):
        self.store = store
        self.grace_ms = timing.unknown_kind_grace_ms
        self.registry = registry
        self.budget = budget
        self.served = served
        self.ownership = ownership
        self.recorder = recorder
        self.wall_ms = wall_ms
        self.timing = timing
        self.clock = clock
        self.shards = shards
        self._turn = 0
        # partition -> the due rows the first page of its last read found, None when the page was full (as
        # many or more): what a read ahead expects of it, in a pass that reads partitions one by one.
        self._due_rows: dict = {}
        self._shard_partitions: dict = {}  # shard -> the partitions its last due read held rows of (at least 1)
        self._failures: dict = {}  # partition -> failed passes in a row
        self._retry_at: dict = {}  # partition -> monotonic s before which it is not passed
        # shard -> transient failures in a row of its partitions' passes, and the monotonic s before which
        # none of its partitions is passed (see _failed)
        self._shard_failures: dict = {}
        self._shard_retry_at: dict = {}
        self._stuck: dict = {}  # (partition, key) -> monotonic s until which it is skipped
        self.answered_s: Optional[float] = None  # monotonic s the store last answered a pass (health)

    def run(self, free: int, busy: dict, stopping: Callable[[], bool], min_share: int = PAGE) -> PassResult:
        """One pass claiming up to ``free`` rows, never one of ``busy`` (``{partition: its keys in flight}``,
        :meth:`~.records.InFlight.keys`), giving each partition at
        least ``min_share`` rows of room in the first round (fewer, larger commits for cheap handlers).

        Raises:
            Exception: only from reading the served partitions (the ownership or the store's list).
        """
        found: Optional[dict] = None  # by shard: partition -> its due rows the shard read found
        full = False  # a shard read came back full: the shard holds due rows it did not reach
        shards = self.shards() if self.shards is not None else None
        if shards is not None:
            found, full = self._due_in_shards(shards, self.wall_ms(), free)
            # Partitions backing off after an error are looked at again, alone, once their time comes.
            partitions = list(found) + [p for p in self._retry_at if p not in found]
            if not partitions:  # nothing to claim: the shard read was the pass's round trip
                self.answered_s = self.clock()
        else:
            partitions = self.served()
            if not partitions:  # nothing to claim: reading the served partitions was the round trip
                self.answered_s = self.clock()
        self._release_taken_over()
        now_s = self.clock()
        if self._stuck:
            self._stuck = {k: until_s for k, until_s in self._stuck.items() if until_s > now_s}
        exclude = busy  # partition -> a set of its keys: one C lookup per scanned row
        if self._stuck:
            exclude = dict(busy)
            for partition, key in self._stuck:
                exclude[partition] = exclude.get(partition, frozenset()) | {key}
        wake: Optional[int] = None
        ready: list = []
        if self._shard_retry_at:
            self._shard_retry_at = {s: until_s for s, until_s in self._shard_retry_at.items() if until_s > now_s}
        for p in partitions:
            retry_at = self._retry_at.get(p)
            held_s = self._shard_until_s(p)
            if held_s is not None and (retry_at is None or held_s > retry_at):
                retry_at = held_s
            if retry_at is not None and retry_at > now_s:
                wake = _earliest(wake, self.wall_ms() + int((retry_at - now_s) * 1000) + 1)
            else:
                ready.append(p)
        if len(self._due_rows) > len(ready):  # only the partitions served now
            self._due_rows = {p: self._due_rows[p] for p in ready if p in self._due_rows}
        if ready:
            turn = self._turn % len(ready)
            ready = ready[turn:] + ready[:turn]
        self._turn += 1
        jobs: list = []
        starved = False
        hungry: list = []
        share = max(-(-free // max(1, len(ready))), min_share)
        if share > PAGE:  # whole claim round trips: a share of 260 would cost a fifth trip for 4 rows
            share = -(-share // PAGE) * PAGE
        waking: dict = {}  # partition -> (now_ms, report) of its last claim, whose next wake is to read
        rest = ready
        again = False  # a partition was read short of its room: the next round reads it again, even alone
        while rest and free > 0:  # rounds of partitions claimed together, their round trips shared
            # Reading ahead pays only where the store reads many partitions in one round trip; with a
            # store that reads them one by one, a partition the room never reaches would be read for
            # nothing, so there each partition reads its own when its turn comes. By shard, the first
            # round's pages are the shard read's, whatever the store.
            now_ms = self.wall_ms()
            short: set = set()  # partitions read ahead short of the room they may find
            if found is not None:
                ahead = [p for p in rest if p in found]
                firsts = self._shard_pages(found, full, ahead, min(share, free))
                found = None
            else:
                ahead = rest if self.store.reads_many_at_once else []
                firsts = self._due_pages(ahead, now_ms, min(share, free), free, short, again)
            if not firsts:
                break  # one partition ahead, or the read failed: each claims on its own below
            if stopping():
                return PassResult(jobs, wake, starved)
            caps: dict = {}
            left = free
            for p in ahead:
                if left <= 0:  # the rest wait for the room actually left
                    break
                page = firsts[p]
                if p in short and page.next is not None and len(page.entries) < min(share, left):
                    again = True
                    continue  # read short of the room left to it: read again, in the next round's one read
                caps[p] = min(share, left)
                left -= min(caps[p], len(page.entries))  # what it can claim of the rows seen
            requests = [(p, self._budget(cap), firsts[p]) for p, cap in caps.items()]
            try:
                across = claim_due_across(self.store, requests, self.registry, now_ms, exclude=exclude,
                                          clock=self.clock, grace_ms=self.grace_ms, claimed_as=Job)
            except Exception as exc:  # a bad argument: every partition's own failure
                across = [exc] * len(requests)
            for (p, cap), claims in zip(caps.items(), across):
                claimed, p_wake, more = self._claimed(p, cap, now_ms, claims, waking)
                jobs += claimed
                free -= len(claimed)
                wake = _earliest(wake, p_wake)
                if more and len(claimed) >= cap:
                    hungry.append(p)
                    starved = starved or free <= 0
            rest = [p for p in rest if p not in caps and not self._shard_held(p)]
        rounds = (rest, hungry)
        for rnd, order in enumerate(rounds):
            for p in order:
                if stopping():
                    return PassResult(jobs, wake, starved)
                if self._shard_held(p):  # its shard met a transient error in this pass: it waits with it
                    continue
                cap = min(share if rnd == 0 else free, free)
                if cap <= 0:  # rows may wait here: look again as soon as there is room
                    return PassResult(jobs, self.wall_ms(), True)
                claimed, p_wake, more = self._claim(p, cap, exclude.get(p, frozenset()), waking)
                jobs += claimed
                free -= len(claimed)
                wake = _earliest(wake, p_wake)
                if more and len(claimed) >= cap:
                    if rnd == 0:
                        hungry.append(p)
                    starved = starved or free <= 0
        wake = _earliest(wake, self._wakes(waking))
        if shards is not None:
            wake = _earliest(wake, self._next_due_in_shards(shards, self.wall_ms()))
            # Rows the shard read did not reach: read on now, or as soon as there is room. Only after
            # a pass that claimed: rows it could not (a kind in its grace, rows in flight) are not read
            # again in a loop, their claims' reports say when to look again.
            if full and jobs:
                starved = starved or free <= 0
                wake = self.wall_ms()
        return PassResult(jobs, wake, starved)

    def _due_in_shards(self, shards: list, now_ms: int, free: int) -> tuple:
        """The due rows at ``now_ms`` of every shard in ``shards``, up to ``free`` (at most
        :data:`SCAN_PAGE`) per shard, in one :meth:`Store.scan_shards`: ``({partition: [(key, value),
        ...]}, whether some shard's read came back full)``, the partitions in the order their first
        row was read (due order within each shard).

        A shard whose last read held rows of few partitions is read no further than a claim's first
        page of each (the most a partition claims of the read): a backlog in a shard of one partition
        was read ``free`` rows deep, in every pass, to claim a page (256 rows of a kind) of them."""
        limit = max(1, min(SCAN_PAGE, free))
        budget = self.budget
        page = max(1, min(SCAN_PAGE, budget.max_scanned, budget.max_per_kind, free))  # of one partition, at most
        held = self._shard_partitions
        limits = [min(limit, page * held.get(shard, limit)) for shard in shards]
        found: dict = {}
        full = False
        start, end = keys.due_range(now_ms)
        for shard, n, rows in zip(shards, limits, self.store.scan_shards(shards, start, end, limits)):
            full = full or len(rows) >= n
            before = len(found)
            for partition, key, value in rows:
                found.setdefault(partition, []).append((key, value))
            held[shard] = max(1, len(found) - before)  # each partition is in one shard: those first read here
        return found, full

    def _shard_pages(self, found: dict, full: bool, partitions: list, cap: int) -> dict:
        """The first page of a claim of each of ``partitions`` (as :func:`due_request` would read it,
        for a claim of ``cap`` rows) from the rows the shard read ``found``; a page says more follow
        (``next``) when it was cut, or when its shard's read came back ``full``."""
        limit = due_request(partitions[0], 0, self.budget, cap)[4] if partitions else 0
        pages: dict = {}
        for p in partitions:
            rows = found[p]
            entries = rows[:limit]
            pages[p] = Page(entries, entries[-1][0] if full or len(rows) > limit else None)
        return pages

    def _next_due_in_shards(self, shards: list, now_ms: int) -> Optional[int]:
        """The earliest due time after ``now_ms`` of a well-formed timer row in ``shards``: the first
        future row of each shard, in one :meth:`Store.scan_shards`. A shard whose first row does not
        parse (a malformed key, quarantined only once due) is read again a page at a time; if even
        that page holds none, the pass looks again in :data:`NO_PROGRESS_WAKE_MS`."""
        start, end = keys.future_range(now_ms)
        wake: Optional[int] = None
        for shard, rows in zip(shards, self.store.scan_shards(shards, start, end, 1)):
            if not rows:
                continue
            due = _first_due(rows)
            if due is None:
                page = self.store.scan_shards([shard], start, end, PAGE)[0]
                due = _first_due(page)
                if due is None:
                    due = now_ms + NO_PROGRESS_WAKE_MS if len(page) >= PAGE else None
            wake = _earliest(wake, due)
        return wake

    def _due_pages(self, ready: list, now_ms: int, cap: int, free: int, short: set, again: bool = False) -> dict:
        """The first page of due rows (at most ``cap``, what each may claim) of every partition in
        ``ready`` at ``now_ms``, read in one round trip (:meth:`Store.scan_many`): ``{partition: Page}``,
        or {} when there is one partition (unless ``again``: a partition read short before, whose claim
        of a whole page in one round trip its own read would make in round trips of :data:`PAGE` rows)
        or the read failed (each partition then reads its own, and keeps its own error).

        A partition is read only as far as the room of ``free`` rows may reach it: past the rows the
        partitions before it are expected to fill (as many as their last read found, or a full page),
        its page is cut to the room left (at least a row, which says whether it has any); those
        partitions are added to ``short``. A backlog in every partition was otherwise read a full page
        each, in every pass, to claim from the first few."""
        if len(ready) < (1 if again else 2) or cap <= 0:
            return {}
        budget, due_rows = self.budget, self._due_rows
        requests = []
        expected = 0  # rows the partitions before are expected to take of the room
        for p in ready:
            request = due_request(p, now_ms, budget, cap)
            full = request[4]
            limit = min(full, max(1, free - expected))
            if limit < full:
                request = request[:4] + (limit,)
                short.add(p)
            requests.append(request)
            seen = due_rows.get(p)
            expected += min(cap, full if seen is None else seen)
        try:
            pages = self.store.scan_many(requests)
        except Exception:
            return {}
        self._due_rows.update((p, None if page.next is not None else len(page.entries)) for p, page in zip(ready, pages))
        return dict(zip(ready, pages))

    def _claimed_in_shards(self, shards: list) -> list:
        """The partitions of ``shards`` (just taken over) holding rows where a dead runner's first
        claims wait (:func:`release_range`): one :meth:`Store.scan_shards` of up to
        :data:`_TAKEN_OVER_ROWS` rows per shard; a partition past that fires its rows after their
        backoff instead. Nothing (logged) when the read fails: the rows then wait out their backoff."""
        try:
            found = self.store.scan_shards(shards, *release_range(self.wall_ms(), self.registry), _TAKEN_OVER_ROWS)
        except Exception as exc:
            self._store_failed(exc, 1, f"read of the claims in the shards {shards} taken over from a runner that died")
            return []
        return list(dict.fromkeys(partition for rows in found for partition, _, _ in rows))

    def _wakes(self, waking: dict) -> Optional[int]:
        """Read the next wake of every partition in ``waking`` (see :meth:`_claim`) in one round trip;
        a partition whose read fails backs off alone (the read is then its own). Returns the earliest."""
        if not waking:
            return None
        pages: list = [None] * len(waking)
        if self.shards is not None:
            # The shards' own read (_next_due_in_shards) covers every partition's future rows: each
            # claim's report adds only what it knows itself (rows it put, kinds it left).
            pages = [_NOTHING_AHEAD] * len(waking)
        elif len(waking) > 1:
            try:
                pages = self.store.scan_many([wake_request(p, now_ms) for p, (now_ms, _) in waking.items()])
            except Exception:
                pass  # each partition reads its own below, and keeps its own error
        wake: Optional[int] = None
        for (partition, (now_ms, report)), page in zip(waking.items(), pages):
            try:
                p_wake = next_wake(self.store, partition, now_ms, report, page)
            except Exception as exc:
                wake = _earliest(wake, self._failed(partition, exc, now_ms))
                continue
            self._answered(partition)
            wake = _earliest(wake, p_wake)
        return wake

    def _answered(self, partition: str) -> None:
        self._failures.pop(partition, None)
        if self._shard_failures:
            self._shard_failures.pop(shard_of(partition, self.store.shard_count), None)
        self._retry_at.pop(partition, None)
        self.answered_s = self.clock()

    def _budget(self, cap: int) -> TickBudget:
        return self.budget if cap >= self.budget.max_fired else dataclasses.replace(self.budget, max_fired=cap)

    def _claim(self, partition: str, cap: int, exclude: frozenset, waking: dict) -> tuple:
        """Claim up to ``cap`` rows of ``partition`` now: see :meth:`_claimed`."""
        now_ms = self.wall_ms()
        try:
            claims = claim_due(self.store, partition, self.registry, now_ms, self._budget(cap), exclude=exclude,
                               clock=self.clock, grace_ms=self.grace_ms, claimed_as=Job)
        except Exception as exc:
            return self._claimed(partition, cap, now_ms, exc, waking)
        return self._claimed(partition, cap, now_ms, claims, waking)

    def _claimed(self, partition: str, cap: int, now_ms: int, claims, waking: dict) -> tuple:
        """Take in the :class:`Claims` (or the exception) of a claim of up to ``cap`` rows of ``partition``
        at ``now_ms`` (Unix epoch ms): (jobs, wake ms or None, rows left for want of room). A wake that
        needs a read of the store is left to :meth:`_wakes`, in ``waking``."""
        waking.pop(partition, None)  # this claim's wake replaces an earlier round's
        if isinstance(claims, Exception):
            return [], self._failed(partition, claims, now_ms), False
        report = claims.report
        jobs = claims.timers  # made Jobs by the claim (claimed_as)
        for key in report.stuck_keys:
            self._stuck[partition, key] = self.clock() + STUCK_RETRY_S
        self.recorder.count(report)
        self.recorder.activity.pass_ended(partition, report.stopped_on_budget and len(jobs) < cap,
                                          _worst_lateness_ms(jobs, now_ms))
        if claims.error is not None:
            return jobs, self._failed(partition, claims.error, now_ms), False
        if needs_wake_scan(report):
            waking[partition] = (now_ms, report)
            return jobs, None, report.stopped_on_budget
        self._answered(partition)
        return jobs, next_wake(self.store, partition, now_ms, report), report.stopped_on_budget

    def _failed(self, partition: str, exc: BaseException, now_ms: int) -> int:
        """Back ``partition`` off after ``exc``; returns when to look at it again (Unix epoch ms)."""
        failures = self._failures[partition] = self._failures.get(partition, 0) + 1
        delay_s = self._store_failed(exc, failures, f"pass on partition {partition!r}", kind="pass")
        self._retry_at[partition] = self.clock() + delay_s
        if shard_wide(exc):
            # The shard's partitions back off with it, on the shard's count of failures in a row, counted
            # once per attempt of the shard: its partitions that fail with it meanwhile (the same error,
            # handed on by the claim) leave its backoff as it is, which grows as one partition's.
            shard = shard_of(partition, self.store.shard_count)
            now_s = self.clock()
            until_s = self._shard_retry_at.get(shard)
            if until_s is None or until_s <= now_s:
                shard_failures = self._shard_failures[shard] = self._shard_failures.get(shard, 0) + 1
                until_s = self._shard_retry_at[shard] = now_s + self.timing.backoff_s(shard_failures)
            delay_s = max(delay_s, until_s - now_s)
        return now_ms + int(delay_s * 1000) + 1

    def _shard_until_s(self, partition: str) -> Optional[float]:
        """When the backoff of ``partition``'s shard after a transient error ends (s of :attr:`clock`; see
        :meth:`_failed`), or None: no shard backs off, the common case, costs no hash of the name."""
        if not self._shard_retry_at:
            return None
        return self._shard_retry_at.get(shard_of(partition, self.store.shard_count))

    def _shard_held(self, partition: str) -> bool:
        """Whether ``partition``'s shard backs off now after a transient error (see :meth:`_failed`)."""
        until_s = self._shard_until_s(partition)
        return until_s is not None and until_s > self.clock()

    def _store_failed(self, exc: BaseException, failures: int, what: str, kind: Optional[str] = None) -> float:
        return self.recorder.store_failed(exc, failures, what, self.timing.backoff_s(failures), kind)

    def _release_taken_over(self) -> None:
        if self.ownership is None:
            return
        taken = self.ownership.taken_over()
        if self.ownership.by_shard and taken:
            taken = self._claimed_in_shards(taken)
        for partition in taken:
            try:
                moved = release_claims(self.store, partition, self.wall_ms(), self.registry)
            except Exception as exc:
                self._store_failed(exc, 1, f"release of a dead runner's claims on partition {partition!r}", kind="release")
                continue
            if moved:
                log.info("partition %r: taken over from a runner that died; %d row(s) it had claimed fire again now",
                         partition, moved)


_NOTHING_AHEAD = Page([], None)


def _first_due(rows: list) -> Optional[int]:
    """The due time of the first well-formed timer key among ``(partition, key, value)`` rows."""
    for _, key, _ in rows:
        try:
            return keys.parse(key).due_at_ms
        except keys.MalformedKey:
            continue
    return None


_TAKEN_OVER_ROWS = 10_000  # rows per shard taken over read for the partitions to release


def _worst_lateness_ms(claimed: list, now_ms: int) -> Optional[int]:
    """The largest lateness (ms) at ``now_ms`` of the first attempts among ``claimed``, or None: a
    plain timer's is read off its due time, the earliest one's being the largest, without a call per
    row (:meth:`~timerwheel_c.durable.timers.claim.ClaimedTimer.lateness_ms`, which a schedule's
    occurrence needs for its jitter, gives the same)."""
    earliest_ms: Optional[int] = None
    worst: Optional[int] = None
    for c in claimed:  # Jobs, which hold their timer's fields (``c.timer`` makes a DueTimer per read)
        if c.attempt != 1:
            continue
        if c.schedule is None:
            if earliest_ms is None or c.due_at_ms < earliest_ms:
                earliest_ms = c.due_at_ms
        else:
            worst = _most(worst, c.lateness_ms(now_ms))
    return worst if earliest_ms is None else _most(worst, max(0, now_ms - earliest_ms))


def _most(a: Optional[int], b: int) -> int:
    return b if a is None or b > a else a


def _earliest(a: Optional[int], b: Optional[int]) -> Optional[int]:
    return b if a is None else a if b is None else min(a, b)

"""The records the service's stages pass along: one per row in flight, from its claim to its commit."""
from __future__ import annotations

import dataclasses

import pytest

from timerwheel_c.durable.service.records import Job
from timerwheel_c.durable.storage.store import Batch, Equals
from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.registry import Done, DueTimer, TimerHandler
from timerwheel_c.durable.timers.runner import ClaimedTimer, RunReport, settle

_KIND = keys.TimerKind(1)


class _Noop(TimerHandler):
    kind = _KIND

    def fire(self, ctx, timer):
        return Done()


def test_a_job_is_its_claimed_timer_so_a_row_in_flight_is_one_record():
    """A Job is the ClaimedTimer it was made from (handler, timer and schedule shared, still frozen),
    not a second object holding it: each object alive per row in flight costs the cyclic collector.
    Two jobs of one claim stay two rows (compared by identity), and the job settles as its claim
    would; deterministic, no store."""
    key = keys.timer(1_700_000_000_000, _KIND, b"ref")
    claimed = ClaimedTimer(_Noop(), DueTimer(1_700_000_000_000, keys.KINDS[1], b"ref", b"v", 1, key))
    job = Job("p", 1_700_000_000_005, claimed)
    assert isinstance(job, ClaimedTimer)
    assert (job.handler, job.timer, job.schedule) == (claimed.handler, claimed.timer, claimed.schedule)
    assert (job.partition, job.now_ms, job.key, job.batch, job.started, job.settled) == (
        "p", 1_700_000_000_005, key, None, False, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.timer = claimed.timer  # type: ignore[misc]
    twin = Job("p", 1_700_000_000_005, claimed)
    assert job != twin and len({job, twin}) == 2
    batch = settle(job.partition, job, RunReport(), Done())
    assert isinstance(batch, Batch) and batch.guards == [Equals(key, b"v")]
    assert batch.writes == settle("p", claimed, RunReport(), Done()).writes

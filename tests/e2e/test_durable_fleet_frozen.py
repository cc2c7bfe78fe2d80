"""Ownership that survives a frozen owner, on PostgreSQL: of two ``timerwheel-c run`` processes over
sixteen partitions, one is frozen with SIGSTOP (its connections stay open: its kernel still answers
keepalives). Past its lease (``LEASE_S``) the other ends its lock session and takes its partitions
over, so every timer fires, each effect committed exactly once; woken with SIGCONT, the frozen
runner rejoins and takes a share again.

The bounds are liveness bounds (the lease plus a generous margin on a loaded machine), never speeds;
the test first checks that the situation arose (the frozen runner owned partitions with due timers)."""
from __future__ import annotations

import os
import re
import signal
import sys
import time

import pytest

from test_durable_fleet import PARTITIONS, SHARDS, Runner, anchor, balanced, effect_counts, schedule_due
from waiting import wait_until

PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
pytestmark = [
    pytest.mark.skipif(not PG_DSN, reason="set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to test the fleet"),
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals"),
]

N = 5
TAKEOVER_S = 60.0  # the lease (20 s) and a rebalance, with room for a loaded machine


@pytest.mark.slow
def test_a_frozen_runner_loses_its_partitions_and_rejoins_when_it_wakes(schema_url, tmp_path):
    from timerwheel_c.durable.storage.postgres import PostgresStore

    store = PostgresStore(schema_url, shard_count=SHARDS)  # one partition per shard, as test_durable_fleet's
    anchor(store)  # the partitions exist before the runners start
    rs = [Runner(schema_url, tmp_path) for _ in range(2)]  # durable_handlers:registry
    try:
        wait_until(lambda: balanced(rs, len(PARTITIONS) // 2), "half the partitions per runner", TAKEOVER_S)
        frozen, live = rs
        frozen_owned = list(frozen.owned)
        frozen.proc.send_signal(signal.SIGSTOP)
        schedule_due(store, N)
        wanted = {(p, b"t%05d" % i) for p in PARTITIONS for i in range(N)}
        wait_until(lambda: wanted <= set(effect_counts(store)), "every timer to fire, the frozen runner's too",
                   TAKEOVER_S)
        assert set(live.owned) == set(PARTITIONS)  # taken over: the situation the test needs
        assert frozen_owned and set(frozen_owned) <= set(PARTITIONS)
        assert any("made no progress" in line for line in live.lines), "".join(live.lines)
        frozen.proc.send_signal(signal.SIGCONT)
        wait_until(lambda: balanced(rs, len(PARTITIONS) // 2) and frozen.proc.poll() is None,
                   "the woken runner to rejoin and take a share", TAKEOVER_S)
        time.sleep(1.0)  # a doubled effect (a late commit of the woken runner) would show by now
        counts = effect_counts(store)
        assert {k: n for k, n in counts.items() if n != 1} == {}
        assert set(counts) == wanted
    finally:
        for r in rs:
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGCONT)  # a stopped process would not act on stop()'s SIGTERM
            r.stop()
        store.close()


@pytest.mark.parametrize("bad, error", [(0.5, ValueError), (float("inf"), ValueError), (True, TypeError),
                                        ("20", TypeError)])
def test_a_lease_that_is_no_number_of_seconds_above_the_check_interval_is_refused_by_name(schema_url, bad, error):
    from timerwheel_c.durable.storage.postgres.ownership import PartitionOwnership
    from timerwheel_c.durable.storage.postgres import PostgresStore

    with PostgresStore(schema_url) as store, pytest.raises(error, match=f"lease_s .*{re.escape(repr(bad))}"):
        PartitionOwnership(store, check_interval_s=1.0, lease_s=bad)

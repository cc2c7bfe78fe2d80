"""The lateness benchmark's contract with the bench CLI (no lateness number is asserted)."""
from __future__ import annotations

import pytest

from timerwheel_c.bench import lateness


def test_run_contract():
    """run() returns every series, each with `samples` int ns values, and reports progress
    as (done, total) up to the total. Deadlines are released never early, so the
    ReleaseTimer series (read from released_at_ns) are never negative."""
    calls = []
    out = lateness.run(samples=3, delay_ms=0.5, progress=lambda done, total: calls.append((done, total)))
    assert list(out) == list(lateness.SERIES)
    assert all(len(v) == 3 and all(isinstance(x, int) for x in v) for v in out.values())
    assert all(x >= 0 for name, v in out.items() if name.startswith("ReleaseTimer") for x in v)
    assert calls[-1] == (3 * len(lateness.SERIES), 3 * len(lateness.SERIES))
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_percentiles_and_bad_args():
    """percentiles() is nearest-rank on ns; bad sample counts and delays are ValueErrors."""
    assert lateness.percentiles(list(range(1, 101))) == {"p50": 50, "p95": 95, "p99": 99, "max": 100}
    with pytest.raises(ValueError, match="samples"):
        lateness.run(samples=0)
    with pytest.raises(ValueError, match="delay_ms"):
        lateness.run(samples=1, delay_ms=0)

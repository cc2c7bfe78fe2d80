"""The lateness benchmark's contract with the bench CLI (no lateness number is asserted)."""
from __future__ import annotations

import pytest

from bench import lateness


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


def test_bad_args_are_value_errors():
    """Bad sample counts and delays are ValueErrors naming the argument."""
    with pytest.raises(ValueError, match="samples"):
        lateness.run(samples=0)
    with pytest.raises(ValueError, match="delay_ms"):
        lateness.run(samples=1, delay_ms=0)


def test_pure_run_leaves_the_compiled_series_out(tmp_path):
    """With TIMERWHEEL_C_NO_EXTENSIONS=1 the one selection picks the pure cores, and the lateness
    bench follows it: no compiled series, even where the extension is built."""
    import os
    import subprocess

    from bench.run import command

    (tmp_path / "series.py").write_text("from bench import lateness\n"
                                        "print(sorted(lateness.run(samples=1, delay_ms=0.5)))\n")
    env = {**os.environ, "TIMERWHEEL_C_NO_EXTENSIONS": "1", "PYTHONPATH": str(tmp_path)}
    env.pop("TIMERWHEEL_C_REQUIRE_EXTENSIONS", None)
    out = subprocess.run(command("series"), env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert "ReleaseTimer (pure)" in out
    assert "(c)" not in out

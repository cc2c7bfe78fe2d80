"""The README's Python examples run as written against the installed package.

Each ```python block runs in its own interpreter (the one running the tests), from an empty
directory so it imports the installed package. The examples assert their own outcomes; their
waits are liveness bounds of seconds, so a loaded machine only makes them slower.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from locations import CHECKOUT

README = CHECKOUT / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", README.read_text(encoding="utf-8"), flags=re.S | re.M)


def test_readme_has_examples():
    """Guards the parametrized test below against passing vacuously on a README with no examples."""
    assert len(BLOCKS) >= 6


@pytest.mark.parametrize("source", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(source, tmp_path):
    """One README example exits 0 (its own asserts hold) within a generous 120 s."""
    done = subprocess.run([sys.executable, "-c", source], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"README example failed:\n{source}\n--- stderr ---\n{done.stderr}"


def test_first_command_runs_the_bench_from_the_repository_root():
    """The README's first command runs ``python bench/run.py`` from the repository root, where it
    imports the installed, compiled package (with the pure fallback forbidden, an import of the
    uncompiled source tree would fail), so it needs no ``python -I``."""
    main = re.search(r"<!-- ci:main -->\n```bash\n(.*?)\n```", README.read_text(encoding="utf-8"), flags=re.S)
    assert main is not None and "python bench/run.py --quick" in main.group(1)
    env = {**os.environ, "TIMERWHEEL_C_REQUIRE_EXTENSIONS": "1"}
    done = subprocess.run([sys.executable, "bench/run.py", "--help"], cwd=README.parent, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--quick" in done.stdout and "Traceback" not in done.stderr


def test_reactor_example_keeps_polling_after_its_last_timer_fired():
    """The README's TimerWheel example, run here, drives a real selector until its last timer
    fired; the test then keeps its reactor going: turns with nothing pending (woken by I/O, as
    poll_timeout() is None), a new timer fired never before its due time, and turns after it.
    The naive timeout of an idle wheel, next_fire_ms() - now_ms(), is 2**32 ms, which selectors
    refuse with OverflowError; poll_timeout() never is. Timing bounds are liveness bounds only."""
    source = next(b for b in BLOCKS if "poll_timeout" in b and "selectors" in b)
    example: dict = {}
    exec(compile(source, "README.md", "exec"), example)
    wheel, run_once, selector, peer, now_ms = (example[k] for k in ("wheel", "run_once", "selector", "peer", "now_ms"))
    assert len(wheel) == 0 and wheel.next_fire_ms() - wheel.now_ms() == 2**32
    for _ in range(3):
        peer.send(b"ping")
        assert run_once(selector) == []
    armed_ms, due_ms = now_ms(), wheel.now_ms() + 30
    wheel.schedule(30, 9)
    fired = []
    while not fired:
        assert now_ms() - armed_ms < 5_000, "liveness bound exceeded"
        fired += run_once(selector)
    assert fired == [9] and wheel.now_ms() >= due_ms
    peer.send(b"ping")
    assert run_once(selector) == [] and wheel.poll_timeout(cap_ms=5) == 5

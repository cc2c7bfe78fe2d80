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
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
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

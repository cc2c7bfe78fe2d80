"""``timerwheel-c bench`` as a user first meets it: what it says, once and in one line, when it
cannot run as asked. Each case runs the real command in a subprocess; none times anything.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 120.0


def bench(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "timerwheel_c", "bench", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def test_source_checkout_explanation_is_printed_once():
    """Run from the source checkout, whose package holds no compiled cores, the bench exits 2 and
    the explanation (imported from the source checkout, how to run the installed package) appears
    once on stderr: the import's RuntimeWarning says it, the bench's own line only refers to it."""
    package = CHECKOUT / "timerwheel_c"
    if not (CHECKOUT / "src" / "_wheel.pyx").exists() or any(package.glob("_wheel*.so")) \
            or any(package.glob("_wheel*.pyd")):
        pytest.skip("needs a source checkout without in-place builds")
    env = {k: v for k, v in os.environ.items()
           if k not in ("TIMERWHEEL_C_REQUIRE_EXTENSIONS", "TIMERWHEEL_C_NO_EXTENSIONS", "PYTHONWARNINGS")}
    out = bench(CHECKOUT, "--quick", env=env)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("source checkout") == 1, out.stderr
    assert out.stderr.count("python -I -m") == 1, out.stderr
    assert "timerwheel-c bench: error: the compiled cores did not load" in out.stderr
    assert out.stdout == ""

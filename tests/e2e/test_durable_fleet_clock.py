"""One clock for the fleet: a ``timerwheel-c run`` process whose host clock is off (libfaketime,
``FAKETIME=+5s``, ``-5s``, ``+60s``, ``-60s``) judges due times by the PostgreSQL server's clock. It
never fires a timer before its due time by that clock, a runner whose clock lags 60 s fires within a
liveness bound (30 s) below its lag, and it logs a WARNING naming the skew.

Why it cannot flake: the server, the test and the runner share one host, so the runner's fake clock is
the real one plus exactly the skew, and the handler stamps each fire with it: a stamp minus the skew
is the fire time by the server's clock. Due times are set from the server's clock after the runner
has started; the assertions are "not before the due time" and "within a generous bound", never a speed.
Skipped, saying so, where ``faketime`` (Debian's package) is not installed.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading

import pytest

from timerwheel_c.durable import schedule
from waiting import wait_until
from locations import TESTS as HELPERS_DIR

PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
pytestmark = [
    pytest.mark.skipif(not PG_DSN, reason="set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to test the fleet"),
    pytest.mark.skipif(shutil.which("faketime") is None,
                       reason="libfaketime's faketime command is not installed (apt-get install faketime)"),
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals"),
]

STAMP_KIND = 0xF5  # tests/durable_runner_proc.py: Done with an effect row holding the runner's wall ms
P = "clock"
N = 5
LIVENESS_S = 30.0


def effects(store):
    """reference -> the runner's wall ms stamped at each fire of it."""
    out: dict = {}
    for k, v in store.scan(P, b"effect/", b"effect0", limit=1000).entries:
        out.setdefault(k.split(b"/")[1], []).append(int(v))
    return out


@pytest.mark.parametrize("skew_s", [5, -5, 60, -60])
def test_a_runner_with_a_skewed_clock_judges_due_times_by_the_servers(schema_url, tmp_path, skew_s):
    from timerwheel_c.durable.storage.postgres import PostgresStore

    store = PostgresStore(schema_url)
    lines: list = []
    env = dict(os.environ, PYTHONPATH=str(HELPERS_DIR))
    # cwd=tmp_path: never import the checkout's timerwheel_c instead of the installed one. A session of
    # its own: faketime runs the runner as its child, so signals go to the group, or the runner outlives it.
    proc = subprocess.Popen(["faketime", "-f", f"{skew_s:+d}s", sys.executable, "-m", "timerwheel_c", "run",
                             "--store", schema_url, "--partition", P, "--handlers", "durable_runner_proc:registry"],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        wait_until(lambda: any("serving" in line for line in lines) or proc.poll() is not None,
                   "the runner to start", LIVENESS_S)
        assert proc.poll() is None, "".join(lines)
        # Due times by the server's clock, read now that the runner serves: 1 to 2.2 s ahead.
        server_ms = store.clock_ns() // 1_000_000
        due = {b"t%d" % i: server_ms + 1000 + 300 * i for i in range(N)}
        for ref, due_ms in due.items():
            schedule(store, P, due_ms, STAMP_KIND, ref)
        wait_until(lambda: len(effects(store)) == N, "every timer to fire", LIVENESS_S)
        fired = effects(store)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join(5)
        store.close()
    by_server = {ref: [stamp - skew_s * 1000 for stamp in stamps] for ref, stamps in fired.items()}
    early = {ref: (due[ref], ms) for ref, stamps in by_server.items() for ms in stamps if ms < due[ref]}
    assert not early, f"fired before the due time by the server's clock (due, fired): {early}"
    assert all(len(stamps) == 1 for stamps in fired.values()), fired
    warned = [line for line in lines if "off the store server's" in line]
    said = re.search(r"([+-][0-9.]+) s off the store server's", warned[0]) if warned else None
    assert said and "WARNING" in warned[0] and abs(float(said.group(1)) - skew_s) < 0.5, "".join(lines)

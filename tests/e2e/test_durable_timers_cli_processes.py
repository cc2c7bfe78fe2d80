"""The operator commands of tests/durable/service/test_durable_timers_cli.py where a real process must
run: ``fleet status`` listing live runner processes (one killed with SIGKILL), and ``timers list``
whose reader closes the pipe early, as ``| head -1`` does."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from timerwheel_c.durable import open_store, schedule
from cli_run import run_cli
from waiting import wait_until, wall_ms
from locations import TESTS as HELPERS_DIR

TIMEOUT_S = 60.0
KIND = 7
HOUR_MS = 3_600_000
EFFECT_KIND = 0xF3  # tests/durable_handlers.py


def test_fleet_status_lists_live_runners_with_their_kinds_and_partitions(schema_url, tmp_path):
    """Two runners with different registries on one PostgreSQL store: both listed with their kinds,
    each partition owned by one of each group; a runner killed with SIGKILL leaves the list once the
    server sees its connection close (generous bound: 30 s)."""
    with open_store(schema_url) as store:
        for i in range(4):
            schedule(store, f"q{i}", wall_ms() + HOUR_MS, EFFECT_KIND, b"r")
    env = dict(os.environ, PYTHONPATH=str(HELPERS_DIR))
    procs = [subprocess.Popen([sys.executable, "-m", "timerwheel_c", "run", "--store", schema_url, "--handlers",
                               f"durable_handlers:{registry}"], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for registry in ("registry", "registry_without_effect")]
    try:
        from durable_handlers import registry, registry_without_effect

        seen: dict = {}

        def status_is(predicate) -> bool:
            out = run_cli("fleet", "status", "--json", "--store", schema_url, env={"TIMERWHEEL_C_STORE": None})
            assert out.returncode == 0, out.stderr
            seen["state"] = json.loads(out.stdout)
            return predicate(seen["state"])

        wait_until(lambda: status_is(lambda s: len(s["runners"]) == 2 and all(len(p["owners"]) == 2
                                                                             for p in s["partitions"])),
                   "two runners owning every partition", timeout=30)
        state = seen["state"]
        kinds = sorted(r["kinds"] for r in state["runners"])
        assert kinds == sorted([registry.kinds(), registry_without_effect.kinds()])
        # Runners over the whole store own shards, each group all of them: a partition's owners are its shard's.
        assert all(sorted(r["shards"]) == list(range(64)) and r["partitions"] == [] for r in state["runners"])
        assert {p["partition"] for p in state["partitions"]} == {"q0", "q1", "q2", "q3"}
        assert all(f"pid {proc.pid}" in " ".join(r["name"] for r in state["runners"]) for proc in procs)
        table = run_cli("fleet", "status", "--store", schema_url, env={"TIMERWHEEL_C_STORE": None}).stdout
        assert "runners: 2 live" in table and "BACKEND PID" in table
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(TIMEOUT_S)
        wait_until(lambda: status_is(lambda s: len(s["runners"]) == 1), "the killed runner gone from the list",
                   timeout=30)
        state = seen["state"]
        assert state["runners"][0]["kinds"] == registry_without_effect.kinds()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(TIMEOUT_S)


def test_a_listing_cut_short_by_its_reader_ends_quietly(tmp_path):
    """``timerwheel-c timers list | head -1``: the reader closes the pipe after one line while the
    command still writes (its output is larger than a pipe's buffer); the command ends without a
    traceback, as a shell command ends on SIGPIPE."""
    url = "sqlite:///" + str(tmp_path / "many.db")
    now = wall_ms()
    with open_store(url) as store:
        for i in range(2000):
            schedule(store, "p", now + i, KIND, b"timer-%04d" % i)
    env = {k: v for k, v in os.environ.items() if k != "TIMERWHEEL_C_STORE"}
    proc = subprocess.Popen([sys.executable, "-m", "timerwheel_c", "timers", "list", "--store", url,
                             "--limit", "2000"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"PARTITION")
    proc.stdout.close()  # the reader goes away with more than a pipe's buffer still to come
    err = proc.stderr.read().decode()
    assert proc.wait(TIMEOUT_S) != 0 and "Traceback" not in err and "Error" not in err, err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_listing_to_a_full_device_is_one_line_and_exit_1(tmp_path):
    """``timerwheel-c timers list > /dev/full``: every write fails with ENOSPC, here when the buffered
    output is flushed; the command says so in one line on stderr and exits 1, no traceback (it ended
    with ``OSError: [Errno 28]``)."""
    url = "sqlite:///" + str(tmp_path / "t.db")
    with open_store(url) as store:
        schedule(store, "p", wall_ms(), KIND, b"timer")
    env = {k: v for k, v in os.environ.items() if k != "TIMERWHEEL_C_STORE"}
    with open("/dev/full", "w") as full:
        out = subprocess.run([sys.executable, "-m", "timerwheel_c", "timers", "list", "--store", url], cwd=tmp_path,
                             env=env, stdout=full, stderr=subprocess.PIPE, timeout=TIMEOUT_S)
    err = out.stderr.decode()
    assert out.returncode == 1 and err.splitlines() == [
        "timerwheel-c timers list: cannot write the output: [Errno 28] No space left on device"], err

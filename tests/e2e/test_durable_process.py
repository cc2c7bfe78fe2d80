"""Durable timers across process deaths: SIGKILL mid-run and restart, a handler that kills its
process, durable sleep across a restart, and the ``run`` CLI. The services run as subprocesses
(tests/durable_handlers.py) on a SQLite file; the test process reads the same file."""
from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys

import pytest

from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.runner import backoff_ms
from timerwheel_c.durable.timers.sleep import SLEEP_PARTITION
from timerwheel_c.durable.storage.sqlite import SQLiteStore
from timerwheel_c.durable.storage.store import Batch
from waiting import wait_until, wall_ms
from locations import TESTS

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

HELPERS = TESTS / "durable_handlers.py"
EFFECT_KIND, POISON_KIND = 0xF3, 0xF4
P = "jobs"
LIVENESS_S = 30.0



def spawn(tmp_path, *args):
    # cwd=tmp_path: never import the checkout's timerwheel_c instead of the installed one.
    return subprocess.Popen([sys.executable, str(HELPERS), *map(str, args)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)



def effects(store):
    return [k for k, _ in store.scan(P, b"effect/", b"effect0", limit=100_000).entries]


def timer_rows(store, partition=P):
    return [keys.parse(k) for k, _ in store.scan(partition, *keys.timer_range(), limit=100_000).entries]


@pytest.mark.slow
def test_sigkill_mid_run_then_restart_applies_every_effect_exactly_once(tmp_path):
    """400 due timers; the service process is SIGKILLed once some but not all effects are committed
    (asserted; its handler hangs from the 151st fire on, so the kill lands mid-run on any machine), then restarted with its clock 700 s ahead so rows claimed by the dead process (backed
    off <= 5 s) are due. Every timer's batch effect is then present exactly once (each application
    writes a distinct row, so a double application would show) and no timer row is left."""
    db = tmp_path / "restart.db"
    store = SQLiteStore(db)
    refs = [b"%04d" % i for i in range(400)]
    batch = Batch()
    for i, ref in enumerate(refs):
        batch.put(keys.timer(wall_ms() - 10_000 + i, EFFECT_KIND, ref), b"")
    store.apply(P, batch)

    first = spawn(tmp_path, "serve", db, 0, 150)
    wait_until(lambda: len(effects(store)) >= 100, "100 effects")
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    done_before = len(effects(store))
    assert 100 <= done_before < 400, "the kill must land mid-run"

    second = spawn(tmp_path, "serve", db, 700_000)
    try:
        wait_until(lambda: not timer_rows(store), "all timer rows gone")
    finally:
        second.send_signal(signal.SIGKILL)
        second.wait(10)
    per_ref = collections.Counter(k.split(b"/")[1] for k in effects(store))
    assert sorted(per_ref) == refs
    assert set(per_ref.values()) == {1}
    store.close()


@pytest.mark.slow
def test_poison_handler_is_retried_with_growing_backoff(tmp_path):
    """A handler that os._exit()s on every try: each process start claims the row before firing, so
    every death still counts an attempt. Four restarts, each with its clock set to the row's retry
    time, leave attempts 1, 2, 3, 4 in the key, each retry due backoff(attempt) after the dying
    service's now (bounded by the wall time around the run), original due time kept."""
    db = tmp_path / "poison.db"
    store = SQLiteStore(db)
    due0 = wall_ms() - 1
    store.apply(P, Batch().put(keys.timer(due0, POISON_KIND, b"p"), b"payload"))
    offset = 0
    for attempt in range(1, 5):
        before = wall_ms()
        proc = spawn(tmp_path, "serve", db, offset)
        assert proc.wait(LIVENESS_S) == 3  # died inside fire
        after = wall_ms()
        [row] = timer_rows(store)
        assert (row.attempt, row.original_due_at_ms, row.kind) == (attempt, due0, POISON_KIND)
        delay = row.due_at_ms - offset
        assert before + backoff_ms(attempt) <= delay <= after + backoff_ms(attempt)
        offset = row.due_at_ms - wall_ms() + 1
    assert store.get(P, keys.backoff(row.due_at_ms, POISON_KIND, 4, due0, b"p")) == b"payload"
    store.close()


@pytest.mark.slow
def test_durable_sleep_survives_a_restart(tmp_path):
    """An execution sleeps twice; its process is killed during the second sleep. The replay in a new
    process returns from the first sleep at once (already fired, not journaled again) and from the
    second not before its journaled due time; each sleep has exactly one timer journaled and fired.

    The child computes each due time when it makes the call (0.2 s, then 3 s ahead), so however
    slowly a loaded machine starts it, the second sleep is journaled and still pending when the
    test sees it, and the kill lands inside it."""
    db, log = tmp_path / "sleep.db", tmp_path / "log.txt"
    first = spawn(tmp_path, "sleeper", db, log, 200, 3000)
    wait_until(lambda: db.exists(), "the database")
    store = SQLiteStore(db)

    def second_sleep():
        # the log line is written once the first sleep's row is gone, so a row seen after it is the second's
        return timer_rows(store, SLEEP_PARTITION) if log.exists() else []

    wait_until(second_sleep, "the second sleep journaled")
    [row] = second_sleep()
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    [line] = log.read_text().splitlines()
    n, how, fired_ms, due0 = line.split()
    assert (n, how) == ("0", "fired") and int(fired_ms) >= int(due0)
    assert row.due_at_ms >= int(fired_ms) + 3000  # the second sleep's, asked after the first returned

    second = spawn(tmp_path, "sleeper", db, log, 200, 3000)
    assert second.wait(LIVENESS_S) == 0, second.stderr.read().decode()
    rows = [line.split() for line in log.read_text().splitlines()]
    assert [r[:2] for r in rows] == [["0", "fired"], ["0", "replayed"], ["1", "fired"]]
    assert int(rows[2][2]) >= row.due_at_ms
    assert timer_rows(store, SLEEP_PARTITION) == []
    tag = keys.SLEEP_MARK_TAG  # every key that begins with it: up to the tag with its last byte one higher
    marks = store.scan(SLEEP_PARTITION, tag, tag[:-1] + bytes([tag[-1] + 1])).entries
    assert [v for _, v in marks] == [b"F", b"F"]
    store.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_run_serves_and_exits_zero_on_signal(tmp_path, sig):
    """``python -m timerwheel_c run --store sqlite:////abs --handlers durable_handlers:registry``
    fires a due timer, then exits 0 on SIGTERM and on SIGINT."""
    db = tmp_path / "cli.db"
    store = SQLiteStore(db)
    store.apply(P, Batch().put(keys.timer(wall_ms() - 1, EFFECT_KIND, b"c"), b""))
    url = "sqlite:///" + str(db)
    assert url.startswith("sqlite:////")
    env = dict(os.environ, PYTHONPATH=str(HELPERS.parent))
    proc = subprocess.Popen([sys.executable, "-m", "timerwheel_c", "run", "--store", url,
                             "--handlers", "durable_handlers:registry", "--partition", P],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: effects(store) or proc.poll() is not None, "the CLI to fire")
        assert proc.poll() is None, proc.stderr.read().decode()
        proc.send_signal(sig)
        assert proc.wait(LIVENESS_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert b"stopped" in proc.stderr.read()
    store.close()


@pytest.mark.slow
def test_two_run_processes_commit_each_occurrence_of_a_schedule_once_through_a_sigkill(tmp_path):
    """Two ``timerwheel-c run`` processes serve one store holding a 0.5 s schedule (misfire "all", so no
    occurrence may be dropped); one is SIGKILLed mid-run. Every occurrence from the first to the last
    committed is committed exactly once: the nominal times form the unbroken 0.5 s grid, none twice.
    The test first checks that both processes were serving and that occurrences committed after the
    kill, so it cannot pass vacuously. The schedule starts once both processes serve, so a slow
    start-up never turns its first occurrences into a catch-up."""
    from timerwheel_c.durable import Every, add_schedule

    db = tmp_path / "fleet.db"
    store = SQLiteStore(db)
    env = dict(os.environ, PYTHONPATH=str(HELPERS.parent))
    cmd = [sys.executable, "-m", "timerwheel_c", "run", "--store", "sqlite:///" + str(db),
           "--handlers", "durable_handlers:registry", "--partition", P]
    logs = [tmp_path / f"stderr-{i}" for i in range(2)]
    procs = []
    for log in logs:
        with open(log, "wb") as err:
            procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=err))

    def nominal_ms():
        rows = store.scan(P, b"occurrence/", b"occurrence0", limit=100_000).entries
        return [int(k.split(b"/")[2]) for k, _ in rows]

    try:
        wait_until(lambda: all(b"serving" in log.read_bytes() or p.poll() is not None for log, p in zip(logs, procs)),
                   "both processes to serve")
        assert all(p.poll() is None for p in procs), [log.read_text() for log in logs]
        start_ms = wall_ms()
        add_schedule(store, P, "half", Every(0.5, start=start_ms), 0xF5, misfire="all", catchup_window_s=60)
        wait_until(lambda: len(nominal_ms()) >= 6, "6 occurrences to commit")
        assert all(p.poll() is None for p in procs)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(LIVENESS_S)
        at_kill = len(nominal_ms())
        wait_until(lambda: len(nominal_ms()) >= at_kill + 6, "6 more occurrences after the kill")
        procs[1].send_signal(signal.SIGTERM)
        assert procs[1].wait(LIVENESS_S) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    got = nominal_ms()
    counts = collections.Counter(got)
    assert [t for t, n in counts.items() if n > 1] == []
    assert sorted(got) == [start_ms + 500 * k for k in range(1, len(got) + 1)]
    store.close()


def test_prepare_process_freezes_the_startup_heap_and_raises_the_thresholds_yet_cycles_are_still_collected():
    """A runner process's collector: what startup built is frozen out of every collection, the
    thresholds are :data:`GC_THRESHOLDS`, and a reference cycle made afterwards is still freed by a
    collection (later, not never)."""
    import gc
    import weakref

    from timerwheel_c.durable.service.process import GC_THRESHOLDS, prepare_process

    before = gc.get_threshold()
    try:
        previous = prepare_process()
        assert previous == before
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > 1000  # at least the modules and classes imported by now

        class Node:
            pass

        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_cli_run_prepares_its_process_for_the_collector(tmp_path):
    """``run`` owns its process, so it freezes its startup heap and raises the collector's thresholds
    before serving (logged at DEBUG)."""
    db, log_path = tmp_path / "gc.db", tmp_path / "stderr"
    env = dict(os.environ, PYTHONPATH=str(HELPERS.parent))
    with open(log_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "timerwheel_c", "run", "--store", "sqlite:///" + str(db),
                                 "--handlers", "durable_handlers:registry", "--partition", P, "--log-level", "DEBUG"],
                                cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_until(lambda: b"serving" in log_path.read_bytes() or proc.poll() is not None, "the CLI to serve")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(LIVENESS_S) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log_path.read_text()
    assert "garbage collector:" in text and "objects frozen, thresholds (200000, 20, 20)" in text, text

"""The durable bench beside pgqueuer on the same PostgreSQL server: each pgqueuer run executes every
item exactly once, both systems' figures carry the CPU split per fired timer into the JSON, pgqueuer
leaves no schema behind, and without pgqueuer (or without a server) the durable section says in one
line how to get the comparison. Nothing here asserts a speed: only shapes, counts and signs.
"""
from __future__ import annotations

import json
import os
import sys
import time

import pytest

from conftest import bench_without

PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")
CPU_FIELDS = {"runner_cpu_us_per_fired", "server_cpu_us_per_fired", "cpu_note"}
needs_server = pytest.mark.skipif(not PG_DSN, reason="set TIMERWHEEL_C_TEST_PG_DSN=postgresql://... to compare on a server")


def _needs_pgqueuer() -> None:
    from bench import pgqueuer_peer

    reason = pgqueuer_peer.missing()
    if reason is not None:
        pytest.skip(reason)


def _pgqueuer_schemas() -> list:
    import psycopg

    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        return conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s",
                            (f"timerwheel_bench_pgq_{os.getpid()}_%",)).fetchall()


def _check_cpu(fig: dict) -> None:
    """The server is on this machine (the test server is local): both CPU figures are numbers."""
    assert CPU_FIELDS <= set(fig)
    assert fig["cpu_note"] is None, fig["cpu_note"]
    assert fig["runner_cpu_us_per_fired"] >= 0 and fig["server_cpu_us_per_fired"] >= 0


@needs_server
@pytest.mark.slow
def test_pgqueuer_beside_the_fleet_runs_every_item_once_and_records_the_cpu_split():
    """A tiny comparison (32 items, 1 process, pgqueuer at its default batch): the pgqueuer run
    returns only if every job ran exactly once across its workers (it raises otherwise); our fleet's
    and pgqueuer's figures both hold the CPU split, survive a JSON round trip, and give the ratio;
    pgqueuer's schema is gone afterwards."""
    _needs_pgqueuer()
    from bench import peers

    fleet, pgq = peers.run(PG_DSN, 32, 1, runner_counts=(1,), batch_sizes=(10,))
    assert json.loads(json.dumps(pgq)) == pgq
    assert set(pgq["results"]) == {"workers_1_batch_10"} and pgq["rounds"] == 1 and pgq["driver"] == "asyncpg"
    result = pgq["results"]["workers_1_batch_10"]
    assert result["timers"] == 32 and result["workers"] == 1 and result["batch_size"] == 10
    assert result["fired_per_s"] > 0 and result["ours_over_pgqueuer"] > 0
    assert len(result["fired_per_s_rounds"]) == 1
    _check_cpu(result)
    _check_cpu(fleet["runners_1"])
    assert _pgqueuer_schemas() == []


@needs_server
@pytest.mark.slow
def test_pgqueuer_with_several_workers_runs_each_item_once():
    """Two workers at batch 10 share 200 items: the run checks each job id ran once across both
    workers' reports, and says how many; no schema is left behind."""
    _needs_pgqueuer()
    from bench import pgqueuer_peer

    result = pgqueuer_peer.run(PG_DSN, 200, 2, 10)
    assert result["timers"] == 200 and result["workers"] == 2 and result["fired_per_s"] > 0
    _check_cpu(result)
    assert _pgqueuer_schemas() == []


@pytest.mark.parametrize("kwargs, name", [
    ({"n_timers": 0, "workers": 1}, "n_timers"), ({"n_timers": 10, "workers": True}, "workers"),
    ({"n_timers": 10, "workers": 1, "batch_size": 0}, "batch_size"),
])
def test_pgqueuer_run_refuses_bad_sizes_naming_them(kwargs, name):
    """Sizes are checked before anything connects (the DSN points nowhere)."""
    from bench import pgqueuer_peer

    with pytest.raises(ValueError, match=name):
        pgqueuer_peer.run("postgresql://postgres@127.0.0.1:1/x", **kwargs)


@needs_server
def test_cpu_meter_counts_the_runner_and_the_local_server():
    """Over an interval in which this process (the "runner") burns CPU and the server answers
    queries, the runner's figure is above zero, the server's is a number (the test server is local),
    and no note is given."""
    import psycopg

    from bench.cpu_split import CpuMeter

    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        meter = CpuMeter(conn)
        meter.start([os.getpid()])
        end = time.process_time() + 0.1
        while time.process_time() < end:
            conn.execute("SELECT 1")
        figures = meter.stop(1)
    _check_cpu(figures)
    assert figures["runner_cpu_us_per_fired"] > 0


def test_cpu_meter_leaves_out_its_own_connections_backend(tmp_path, monkeypatch):
    """The server's figure counts the postmaster (with its exited children) and its live children, but
    not the backend of the meter's own connection, on which the bench polls for the run's end: over
    the interval, on a fake /proc, that backend burns 700 ticks, another backend 300, the WAL writer
    50 and the postmaster 10; the server's figure is 360 ticks, not 1,060. Deterministic: no real
    process is read."""
    from types import SimpleNamespace

    from bench import cpu_split

    postmaster, own, other, walwriter = 100, 201, 202, 203
    ticks = {postmaster: 1, own: 5, other: 7, walwriter: 3}

    def write_proc() -> None:
        for pid, t in ticks.items():
            (tmp_path / str(pid)).mkdir(exist_ok=True)
            parent = 1 if pid == postmaster else postmaster
            # pid (comm) state ppid, then fields 5..13, utime stime cutime cstime (fields 14..17)
            (tmp_path / str(pid) / "stat").write_text(f"{pid} (postgres) S {parent}" + " 0" * 9 + f" {t} 0 0 0\n")
            (tmp_path / str(pid) / "comm").write_text("postgres\n")

    (tmp_path / "self").mkdir()
    write_proc()
    monkeypatch.setattr(cpu_split, "_PROC", str(tmp_path))
    conn = SimpleNamespace(info=SimpleNamespace(host="127.0.0.1", backend_pid=own))
    meter = cpu_split.CpuMeter(conn)
    assert meter.note is None
    meter.start([])
    ticks[postmaster] += 10
    ticks[own] += 700
    ticks[other] += 300
    ticks[walwriter] += 50
    write_proc()
    figures = meter.stop(1)
    assert figures["server_cpu_us_per_fired"] == pytest.approx(360 * 1e6 / os.sysconf("SC_CLK_TCK"))


def test_cpu_meter_counts_a_backend_reaped_while_it_reads_the_server_once(tmp_path, monkeypatch):
    """A backend that ends as the interval does (a service closing its connections) moves from the
    live children to the postmaster's cutime once reaped. Reaped in the middle of the meter's read of
    /proc, after the postmaster's line and before its own, it was counted in neither: the server's
    figure fell to nearly nothing. It is counted once: 300 ticks over the interval. Deterministic: a
    fake /proc, the reap made by the read of the backend's line."""
    from types import SimpleNamespace

    from bench import cpu_split

    postmaster, own, other = 100, 201, 202
    ticks = {postmaster: 1, own: 5, other: 7}
    reaped = {"cutime": 0}

    def write(pid: int) -> None:
        (tmp_path / str(pid)).mkdir(exist_ok=True)
        parent, cutime = (1, reaped["cutime"]) if pid == postmaster else (postmaster, 0)
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (postgres) S {parent}" + " 0" * 9
                                                  + f" {ticks[pid]} 0 {cutime} 0\n")
        (tmp_path / str(pid) / "comm").write_text("postgres\n")

    (tmp_path / "self").mkdir()
    for pid in ticks:
        write(pid)
    monkeypatch.setattr(cpu_split, "_PROC", str(tmp_path))
    meter = cpu_split.CpuMeter(SimpleNamespace(info=SimpleNamespace(host="127.0.0.1", backend_pid=own)))
    meter.start([])
    ticks[other] += 300
    write(other)
    read = cpu_split._stat

    postmaster_read = []

    def reap_on_read(pid: int):
        postmaster_read.append(pid == postmaster)
        if pid == other and any(postmaster_read) and (tmp_path / str(other)).exists():
            reaped["cutime"] += ticks[other]
            (tmp_path / str(other) / "stat").unlink()
            (tmp_path / str(other) / "comm").unlink()
            (tmp_path / str(other)).rmdir()
            write(postmaster)
        return read(pid)

    monkeypatch.setattr(cpu_split, "_stat", reap_on_read)
    listdir = os.listdir  # /proc lists pids in ascending order: the postmaster before its backends
    monkeypatch.setattr(os, "listdir", lambda path: sorted(listdir(path), key=lambda n: (not n.isdigit(), len(n), n)))
    figures = meter.stop(1)
    assert figures["server_cpu_us_per_fired"] == pytest.approx(300 * 1e6 / os.sysconf("SC_CLK_TCK"))


def test_without_pgqueuer_the_comparison_says_how_to_get_it(tmp_path):
    """With pgqueuer not importable, pgqueuer_peer.missing() names the extra and --pg-dsn, and the
    durable table prints that as one line."""
    out = bench_without(tmp_path, "pgqueuer", "peers_without_pgqueuer",
                        "from bench import pgqueuer_peer, peers, tables\n"
                        "from bench.report import Reporter\n"
                        "tables.pgqueuer_table(Reporter(use_rich=False, show_progress=False), {},"
                        " peers.unavailable(pgqueuer_peer.missing()))\n")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 1 and "not compared" in lines[0]
    assert 'pip install ".[peers]"' in lines[0] and "--pg-dsn" in lines[0]
    # pgqueuer needs Python 3.10: before, the extra installs nothing, and the line says so.
    assert ("needs Python 3.10 or later" in lines[0]) == (sys.version_info < (3, 10))


def test_durable_run_without_a_server_says_how_to_get_the_comparison(monkeypatch, capsys, tmp_path):
    """The bench's durable section without --pg-dsn (the measurement replaced; nothing timed) prints
    one line naming the peers extra and --pg-dsn, and the JSON says the same."""
    from bench import cli, durable

    monkeypatch.setattr(durable, "run", lambda n_timers, dsn=None, progress=None: {
        "sqlite": {"fired_per_s": 6000.0, "lateness_ms": [1.0]}})
    monkeypatch.delenv("TIMERWHEEL_C_STORE", raising=False)
    path = tmp_path / "figures.json"
    assert cli.main(["--only", "durable", "--plain", "--no-progress", "--json", str(path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "pgqueuer" in line]
    assert len(lines) == 1 and 'pip install ".[peers]"' in lines[0] and "--pg-dsn" in lines[0]
    assert "--pg-dsn" in json.loads(path.read_text())["workloads"]["durable"]["pgqueuer"]["missing"]



def _meter_sees(monkeypatch, module, look) -> list:
    """Patch ``module``'s CpuMeter so that making one, and starting one, first calls ``look(conn)`` on
    the bench's own connection (the meter's), whose answer is appended to the list returned here as
    ``("made", answer)`` or ``("started", answer)``. The benches make and start one for the warm-up,
    then make the run's once the measured items are scheduled, and start it before they are due."""
    seen: list = []

    class Seeing(module.CpuMeter):
        def __init__(self, conn) -> None:
            seen.append(("made", look(conn)))
            super().__init__(conn)
            self._look = lambda: look(conn)

        def start(self, runner_pids: list) -> None:
            seen.append(("started", self._look()))
            super().start(runner_pids)

    monkeypatch.setattr(module, "CpuMeter", Seeing)
    return seen


def _check_warmup(result: dict, processes: int) -> None:
    """At least 200 warm-up items, every process's share at least one, none of them in ``timers``."""
    warmup = result["warmup"]
    assert result["timers"] == 32 and warmup["items"] >= 200
    assert len(warmup["per_process"]) == processes and min(warmup["per_process"]) >= 1
    assert sum(warmup["per_process"]) == warmup["items"]
    _check_cpu(result)
    _check_cpu(warmup)


@needs_server
def test_the_fleet_warms_every_runner_up_before_the_meter_starts(monkeypatch):
    """Two runners over 32 timers: first 200 warm-up timers (some in each runner's partitions) fire,
    every effect row written, before the measured timers are scheduled: when the meter is made, the
    warm-up's 200 effects are there and none of the measured run's."""
    from psycopg import sql

    from bench import fleet

    query = sql.SQL("SELECT count(*) FILTER (WHERE key >= 'Ew' AND key < 'Ex'), "
                    "count(*) FILTER (WHERE key >= 'E0' AND key < 'E:') FROM {}").format(
        sql.Identifier(f"timerwheel_fleet_{os.getpid()}_2_default"))
    seen = _meter_sees(monkeypatch, fleet, lambda conn: conn.execute(query).fetchone())
    result = fleet._one(PG_DSN, 2, 32, "default", False, None)
    assert [answer for what, answer in seen if what == "made"] == [(0, 0), (200, 0)]
    # The run's interval begins before its first fire (a start at the due time left out up to all 32).
    assert seen[-1] == ("started", (200, 0))
    assert result["warmup"]["items"] == 200
    _check_warmup(result, 2)


@needs_server
def test_pgqueuer_warms_every_worker_up_before_the_meter_starts(monkeypatch):
    """Two workers at batch 100 over 32 jobs: sets of 200 warm-up jobs run until each worker has run
    one, all acknowledged before the measured jobs are enqueued: when the meter is made, the queue
    holds the 32 measured jobs and no warm-up job (due 2 s before them). Each warm-up job ran once too (the run
    checks it)."""
    _needs_pgqueuer()
    from psycopg import sql

    from bench import pgqueuer_peer

    def look(conn) -> tuple:
        (schema,), = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s",
                                  (f"timerwheel_bench_pgq_{os.getpid()}_%",)).fetchall()
        queue = sql.Identifier(schema, pgqueuer_peer._settings(schema).queue_table)
        return conn.execute(sql.SQL("SELECT count(*) FILTER (WHERE execute_after < now() - interval '1 s'), "
                                    "count(*) FROM {}").format(queue)).fetchone()

    seen = _meter_sees(monkeypatch, pgqueuer_peer, look)
    result = pgqueuer_peer.run(PG_DSN, 32, 2, 100)
    assert [answer for what, answer in seen if what == "made"] == [(0, 0), (0, 32)]
    assert seen[-1] == ("started", (0, 32))  # before its first job is taken
    assert result["warmup"]["items"] % 200 == 0
    _check_warmup(result, 2)
    assert _pgqueuer_schemas() == []

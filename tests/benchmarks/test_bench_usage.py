"""``python bench/run.py`` as a user first meets it: what it says, once and in one line, when it
cannot run as asked, and when several runs start at once. Each case runs the real command in a
subprocess, except the one that must replace a measurement, which runs it in this process, and the
one whose processes build the bench's floor at once; none times anything.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BENCH_RUN, CHECKOUT, bench_without

TIMEOUT_S = 120.0


def bench(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH_RUN), *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def test_run_from_the_repository_root_benches_the_installed_package(tmp_path):
    """The README's command, ``python bench/run.py`` from the repository root, imports the
    installed, compiled package, never the uncompiled source tree beside bench/: the figures
    name the package's directory (outside the checkout's timerwheel_c/) and its compiled cores."""
    import json

    path = tmp_path / "figures.json"
    env = {**os.environ, "TIMERWHEEL_C_REQUIRE_EXTENSIONS": "1"}
    out = bench(CHECKOUT, *TINY, "--no-progress", "--json", str(path), env=env)
    assert out.returncode == 0, out.stderr
    machine = json.loads(path.read_text())["machine"]
    assert Path(machine["timerwheel_c_path"]).resolve() != (CHECKOUT / "timerwheel_c").resolve()
    assert machine["IMPLEMENTATION"] == "c"


def test_source_tree_first_on_the_path_is_explained_once():
    """With the source tree put first on sys.path (PYTHONPATH), whose package holds no compiled
    cores, the bench exits 2 and the explanation appears once on stderr: the import's
    RuntimeWarning says it, the bench's own line only refers to it."""
    package = CHECKOUT / "timerwheel_c"
    if not (CHECKOUT / "src" / "_wheel.pyx").exists() or any(package.glob("_wheel*.so")) \
            or any(package.glob("_wheel*.pyd")):
        pytest.skip("needs a source checkout without in-place builds")
    env = {k: v for k, v in os.environ.items()
           if k not in ("TIMERWHEEL_C_REQUIRE_EXTENSIONS", "TIMERWHEEL_C_NO_EXTENSIONS", "PYTHONWARNINGS")}
    out = bench(CHECKOUT, "--quick", env={**env, "PYTHONPATH": str(CHECKOUT)})
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("source checkout") == 1, out.stderr
    assert out.stderr.count("python -I -m") == 1, out.stderr
    assert "bench: error: the compiled cores did not load" in out.stderr
    assert out.stdout == ""


def _one_error_line(out: subprocess.CompletedProcess) -> str:
    """The run stopped before its first workload: exit 2, no table on stdout, and stderr holds one
    line only (progress is on, so a started workload would have added a 'running' line)."""
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("bench: error: ")
    return lines[0]


TINY = ("--scale", "0.002", "--repeat", "1", "--plain", "--only", "churn")


@pytest.mark.parametrize("option, make_path, needle", [
    ("--json", lambda d: d / "missing" / "figures.json", "does not exist"),
    ("--json", lambda d: d, "is a directory"),
    ("--json", lambda d: Path("/proc/timerwheel-c-figures.json"), "cannot be created"),
    ("--plot", lambda d: d / "taken.txt", "is an existing file, not a directory"),
    ("--plot", lambda d: d / "taken.txt" / "charts", "an existing file, not a directory"),
    ("--plot", lambda d: Path("/proc/timerwheel-c-charts"), "no file can be created in '/proc'"),
], ids=["json-missing-dir", "json-is-dir", "json-in-proc", "plot-is-file", "plot-under-file", "plot-in-proc"])
def test_unusable_output_path_stops_before_the_first_workload(tmp_path, option, make_path, needle):
    """An output path the run could not write is reported at once, in one line naming it, with
    exit 2, instead of after minutes of measuring; and the check leaves nothing behind."""
    if "/proc" in str(make_path(tmp_path)) and not Path("/proc/self").exists():
        pytest.skip("needs Linux /proc")
    if option == "--plot":
        pytest.importorskip("matplotlib")
    (tmp_path / "taken.txt").write_text("not a directory")
    path = make_path(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    line = _one_error_line(bench(tmp_path, *TINY, option, str(path)))
    assert f"{option} {str(path)!r}" in line and needle in line, line
    assert sorted(tmp_path.rglob("*")) == before


def test_usable_output_paths_are_left_as_they_were(tmp_path):
    """The checks of a usable --json file and a missing --plot directory create nothing: a run
    stopped by a later check (an unknown PostgreSQL port) leaves the directory as it was."""
    pytest.importorskip("psycopg")
    out = bench(tmp_path, *TINY[:-2], "--only", "durable", "--json", str(tmp_path / "f.json"),
                "--plot", str(tmp_path / "charts" / "run1"), "--pg-dsn", "postgresql://postgres@127.0.0.1:1/x")
    _one_error_line(out)
    assert list(tmp_path.iterdir()) == []


def test_unreachable_postgres_is_one_line_with_the_redacted_dsn(tmp_path):
    """--pg-dsn naming a server that refuses connections (port 1 on loopback: nothing listens)
    stops the run before any workload: one line with the DSN, its password redacted, the
    connection error, and what the bench does about it."""
    pytest.importorskip("psycopg")
    dsn = "postgresql://postgres:sekrit@127.0.0.1:1/bench"
    line = _one_error_line(bench(tmp_path, *TINY[:-2], "--only", "durable", "--pg-dsn", dsn))
    assert "postgresql://postgres:***@127.0.0.1:1/bench" in line and "sekrit" not in line
    assert "cannot connect" in line and "stops before any workload" in line


def test_pg_dsn_without_psycopg_gives_the_install_command(tmp_path):
    """Without psycopg (made unimportable by a sitecustomize module, as in an install without
    the extra) --pg-dsn stops the run at once with the install command, exit 2."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['psycopg'] = None\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    line = _one_error_line(bench(tmp_path, *TINY[:-2], "--only", "durable", "--pg-dsn",
                                 "postgresql://postgres@127.0.0.1:1/x", env=env))
    assert "pip install 'timerwheel_c[postgres]'" in line and "stops before any workload" in line


def test_pg_dsn_without_the_durable_workload_is_noted(tmp_path):
    """--pg-dsn with an --only that leaves out the durable workload says it is unused, and runs."""
    out = bench(tmp_path, *TINY, "--no-progress", "--pg-dsn", "postgresql://postgres@127.0.0.1:1/x")
    assert out.returncode == 0, out.stderr
    assert "--pg-dsn is unused" in out.stderr


def test_durable_measurement_with_a_dsn_but_without_psycopg_says_so(tmp_path):
    """Called directly, the durable measurement given a DSN without psycopg raises NotAvailable
    with the install command, rather than returning the SQLite figures alone."""
    out = bench_without(tmp_path, "psycopg", "durable_without_psycopg",
                        "from bench import durable\n"
                        "from bench.harness import NotAvailable\n"
                        "try:\n    durable.run(10, dsn='postgresql://postgres@127.0.0.1:1/x')\n"
                        "except NotAvailable as exc:\n    print(exc)\n")
    assert out.returncode == 0, out.stderr
    assert "pip install 'timerwheel_c[postgres]'" in out.stdout


def test_output_lost_after_the_run_is_one_line_and_exit_1(monkeypatch, capsys, tmp_path):
    """If the --json directory disappears during the run (it was checked before), the tables are
    still printed, then one error line says the output could not be written, and the exit
    status is 1, not a traceback. The measurement is replaced by one that removes the directory."""
    import shutil

    from bench import cli
    from bench import durable

    out_dir = tmp_path / "out"
    out_dir.mkdir()

    def removes_the_directory(n_timers, dsn=None, progress=None):
        shutil.rmtree(out_dir)
        return {"sqlite": {"fired_per_s": 6000.0, "lateness_ms": [1.0, 2.0]}}

    monkeypatch.setattr(durable, "run", removes_the_directory)
    status = cli.main(["--only", "durable", "--plain", "--no-progress", "--json", str(out_dir / "f.json")])
    captured = capsys.readouterr()
    assert status == 1
    assert "durable: no-op handler" in captured.out
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench: error: writing the output failed after the run")


def test_help_is_plain_terminal_text(tmp_path):
    """``python bench/run.py --help`` is plain text (no reST roles, double backquotes or literal-block
    ``::``), shows how to start it, and names no numbered work item."""
    import re

    out = bench(tmp_path, "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python bench/run.py")
    assert not re.search(r"``|:(?:class|func|meth|mod|attr|data|exc|ref):`|\w::$", out.stdout, re.MULTILINE)
    assert not re.search(r"\bissue \d", out.stdout)


_BUILD_FLOOR = """if True:
    import importlib.util, sys, time
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("_bench_launcher", sys.argv[1])
    launcher = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launcher)
    launcher.load()
    import bench.floor as floor
    floor.CACHE = Path(sys.argv[2])
    print("ready", flush=True)
    while not Path(sys.argv[3]).exists():
        time.sleep(0.01)
    print(floor.load().__file__)
"""


@pytest.mark.slow
def test_bench_runs_started_at_once_each_load_the_floor_they_share(tmp_path):
    """Four processes that find no build of the floor (bench/floor.py) start building it at once into
    one cache, as the bench runs of the test suite's pytest-xdist workers do on a fresh checkout: each
    loads a whole module, and one build is left in the cache. Built in place, they compiled and
    linked into one directory, and a process loaded a module another was rewriting. The processes
    are all imported before a file starts them, so their builds overlap."""
    pytest.importorskip("Cython")
    cache, go = tmp_path / "cache", tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _BUILD_FLOOR, str(BENCH_RUN), str(cache), str(go)],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    for p in procs:  # each prints "ready" once imported; one that failed ends its stdout instead
        p.stdout.readline()
    go.touch()
    done = [(p.wait(300), p.stdout.read(), p.stderr.read()) for p in procs]
    assert [d[0] for d in done] == [0] * 4, [d[2][-2000:] for d in done]
    loaded = {d[1].strip() for d in done}
    assert len(loaded) == 1 and Path(loaded.pop()).parent.parent == cache, done
    assert len(list(cache.iterdir())) == 1  # every other build was thrown away

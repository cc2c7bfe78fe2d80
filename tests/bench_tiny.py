"""One workload of the bench run as its tests run it: at a tiny scale, on SQLite alone (the
environment's store URL left out), its figures written as JSON."""
from __future__ import annotations

import json

from bench import cli

#: The options of a tiny run: every count scaled to its floor, one repeat, plain output.
TINY = ["--scale", "0.0001", "--repeat", "1", "--no-progress", "--plain"]


def run_tiny(workload: str, monkeypatch, capsys, tmp_path, *options: str) -> tuple[dict, str]:
    """Run ``--only workload`` tiny (``options`` added) and return its JSON figures and its output,
    every run of whitespace one space. Fails unless the run exits 0."""
    monkeypatch.delenv("TIMERWHEEL_C_STORE", raising=False)
    path = tmp_path / "figures.json"
    status = cli.main(TINY + ["--only", workload, "--json", str(path), *options])
    out = " ".join(capsys.readouterr().out.split())
    assert status == 0
    return json.loads(path.read_text()), out

"""The ``timerwheel-c`` command itself: ``--version``, and help written for a terminal.

Each case runs the command in-process (tests/cli_run.py); ``python -m timerwheel_c`` as a real
process is in tests/e2e/test_durable_process.py. Nothing here is timed.
"""
from __future__ import annotations

import re

import pytest

import timerwheel_c
from timerwheel_c._helptext import terminal_text
from cli_run import run_cli

# What reST inline markup looks like when a terminal shows it literally.
MARKUP = re.compile(r"``|:(?:class|func|meth|mod|attr|data|exc|ref):`|\w::$", re.MULTILINE)


def test_version_names_the_package_version_and_the_cores():
    """``--version`` on the top-level command prints the version and which cores run, exit 0."""
    out = run_cli("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(f"timerwheel-c {timerwheel_c.__version__} ")
    assert f"({timerwheel_c.IMPLEMENTATION} cores" in out.stdout


@pytest.mark.parametrize("command", [[], ["run"]])
def test_help_is_plain_terminal_text(command):
    """Every help page is plain text: no reST roles, double backquotes or literal-block ``::``,
    and no numbered work items. The page is checked to be the real one (it has its usage line)."""
    out = run_cli(*command, "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: timerwheel-c {' '.join(command)}".rstrip())
    assert not MARKUP.search(out.stdout), MARKUP.search(out.stdout)
    assert not re.search(r"\bissue \d", out.stdout)


def test_terminal_text_strips_inline_markup():
    """Roles keep their text (a ``~`` target its last name, ``text <target>`` its text),
    literals and interpreted text lose their quotes, ``Run::`` becomes ``Run:``, None stays None."""
    doc = ("``timerwheel-c run``: a :class:`TimerRegistry`, :func:`~pkg.mod.open_store`, "
           ":ref:`the guide <guide>` and `x`.\n\nRun::\n\n    python -m timerwheel_c run\n")
    assert terminal_text(doc) == ("timerwheel-c run: a TimerRegistry, open_store, the guide and x.\n\n"
                                  "Run:\n\n    python -m timerwheel_c run")
    assert terminal_text(None) is None


@pytest.mark.parametrize("command", [(), ("run",), ("timers", "list"), ("timers", "cancel"), ("schedules", "list"),
                                     ("schedules", "remove"), ("fleet", "status")])
def test_help_states_the_exit_status(command):
    """The top-level help states the one exit-status rule of every subcommand (0 done, 1 not there,
    2 bad arguments or store), and each subcommand's help says what each status means for it."""
    out = run_cli(*command, "--help")
    assert out.returncode == 0, out.stderr
    if not command:
        assert "exit status, for every subcommand:" in out.stdout
        assert re.search(r"^  1  what the command names is not there", out.stdout, re.MULTILINE), out.stdout
    else:
        assert "Exit status: 0" in out.stdout, out.stdout

"""The ``timerwheel-c`` command itself: ``--version``, and help written for a terminal.

Each case runs the command in-process (tests/cli_run.py); ``python -m timerwheel_c`` as a real
process is in tests/e2e/test_durable_process.py. Nothing here is timed.
"""
from __future__ import annotations

import contextlib
import errno
import io
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


class _Unwritable(io.StringIO):
    """A stdout whose every write raises ``error``, and its flush once written to (a buffered file's
    flush meets the error too): a full disk (``> /dev/full``) or a reader gone."""

    def __init__(self, error: OSError):
        super().__init__()
        self._error = error
        self._written = False

    def write(self, text: str) -> int:
        self._written = True
        raise self._error

    def flush(self) -> None:
        if self._written:
            raise self._error


OUTPUTS = [["timers", "list"], ["timers", "list", "--json"], ["timers", "show", "--partition", "p", "--kind", "7",
                                                               "--reference", "r"],
           ["schedules", "list"], ["schedules", "list", "--json"], ["fleet", "status"], ["fleet", "status", "--json"],
           ["schedules", "add", "--partition", "p", "beat", "--every", "60", "--kind", "8"], ["--help"], ["--version"],
           ["timers", "--help"]]


@pytest.fixture
def store_with_rows(tmp_path):
    from timerwheel_c.durable import open_store, schedule

    url = "sqlite:///" + str(tmp_path / "t.db")
    with open_store(url) as store:
        schedule(store, "p", 1_900_000_000_000, 7, b"r")
    return url


def _main_writing_to(stdout: io.StringIO, argv: list) -> tuple:
    """``timerwheel-c ARGV`` in this process with ``stdout``; returns its status and its stderr."""
    from timerwheel_c.cli import main

    err = io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exc:
            status = exc.code
    return status, err.getvalue()


@pytest.mark.parametrize("argv", OUTPUTS, ids=" ".join)
def test_an_output_that_cannot_be_written_is_one_line_and_a_nonzero_exit(argv, store_with_rows):
    """stdout that cannot be written (ENOSPC: ``> /dev/full``) ended a command with a traceback
    (OSError: [Errno 28]). Every command, and --help and --version, now says so in one line on
    stderr, naming the command, and exits 1 (it ended otherwise than asked)."""
    store = [] if argv[0].startswith("-") or "--help" in argv else ["--store", store_with_rows]
    status, err = _main_writing_to(_Unwritable(OSError(errno.ENOSPC, "No space left on device")), argv + store)
    assert status == 1, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "cannot write the output: [Errno 28] No space left on device" in err, err
    command = [word for word in argv[:2] if not word.startswith("-")] if "--help" not in argv else []
    assert err.startswith(" ".join(["timerwheel-c", *command]) + ": "), err


@pytest.mark.parametrize("argv", OUTPUTS, ids=" ".join)
def test_a_reader_gone_ends_every_command_quietly_and_alike(argv, store_with_rows):
    """A reader that closed the pipe (``| head -1``) ends every command the same way, as a shell
    command on SIGPIPE: nothing on stderr, status 1."""
    store = [] if argv[0].startswith("-") or "--help" in argv else ["--store", store_with_rows]
    status, err = _main_writing_to(_Unwritable(BrokenPipeError(errno.EPIPE, "Broken pipe")), argv + store)
    assert (status, err) == (1, "")



@pytest.mark.parametrize("token", [" ", "\t\n", "hunter2", " 15 characters "])
def test_actions_off_loopback_refuse_a_token_anyone_could_guess(monkeypatch, capsys, token):
    """Off loopback the page's buttons act on any request that carries the token: one of spaces alone,
    or of fewer than 16 other characters, is refused in one line naming its length (never the token),
    before ``web`` or ``run`` opens its store; a space or "hunter2" opened the buttons to the network.
    A token of 16 characters is taken, and loopback needs none."""
    from timerwheel_c.durable.service.cli import actions_allowed

    monkeypatch.setenv("TIMERWHEEL_C_WEB_TOKEN", token)
    assert actions_allowed("web", "0.0.0.0", True) is False
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "at least 16 characters" in err, err
    assert repr(token) not in err and (not token.strip() or token.strip() not in err)
    assert actions_allowed("web", "127.0.0.1", True) and actions_allowed("web", "0.0.0.0", False)
    monkeypatch.setenv("TIMERWHEEL_C_WEB_TOKEN", "k7Qz-2vLp-9xWm-4R")
    assert actions_allowed("web", "0.0.0.0", True) and capsys.readouterr().err == ""

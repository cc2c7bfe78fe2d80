"""Stopping a serving process with SIGINT or SIGTERM: :class:`StopSignals`, and ``timerwheel-c run``
receiving SIGTERM on every line of its serving loop (tests/signal_at_line.py), including the lines
where the main thread holds a lock that a signal handler might take."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from timerwheel_c.durable.service.process import StopSignals
from waiting import LIVENESS_S
from locations import TESTS

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

DRIVER = TESTS / "signal_at_line.py"
#: Lines the main thread runs after ``run`` says it serves, one signal each: more than one turn of
#: its loop (17 lines with StopSignals, 39 with the threading.Event it replaced).
LINES = 40
AT_ONCE = 4  # drivers running together on the 2-vCPU machine


def test_without_a_signal_wait_returns_none_after_its_timeout():
    with StopSignals() as stop:
        start = time.monotonic()
        assert stop.wait(0.05) is None
        assert time.monotonic() - start >= 0.05
        assert stop.received is None


def test_a_signal_ends_a_long_wait_and_the_first_one_is_kept():
    with StopSignals() as stop:
        # Sent from another thread while the main thread waits: the wake-up socket ends the wait.
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)).start()
        start = time.monotonic()
        assert stop.wait(LIVENESS_S * 10) is signal.SIGTERM
        assert time.monotonic() - start < LIVENESS_S
        os.kill(os.getpid(), signal.SIGINT)  # a later signal is a no-op, not a KeyboardInterrupt
        assert stop.wait(0) is signal.SIGTERM


def test_a_signal_before_the_wait_is_returned_at_once():
    with StopSignals((signal.SIGUSR1,)) as stop:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.wait(LIVENESS_S) is signal.SIGUSR1


def test_the_replaced_handlers_and_wakeup_fd_are_put_back():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    fd_before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd_before)
    with StopSignals():
        assert all(signal.getsignal(s) is not h for s, h in before.items())
        assert signal.set_wakeup_fd(fd_before) != fd_before
        signal.set_wakeup_fd(fd_before)
    assert {s: signal.getsignal(s) for s in before} == before
    assert signal.set_wakeup_fd(fd_before) == fd_before


def test_off_the_main_thread_is_a_value_error_and_leaves_nothing_installed():
    before = signal.getsignal(signal.SIGTERM)
    errors = []

    def enter():
        try:
            with StopSignals():
                pass
        except ValueError as exc:
            errors.append(exc)

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "main thread" in str(errors[0])
    assert signal.getsignal(signal.SIGTERM) is before


def test_wait_outside_the_with_block_is_a_runtime_error():
    with pytest.raises(RuntimeError, match="outside its with block"):
        StopSignals().wait(0)


@pytest.mark.slow
def test_sigterm_on_any_line_of_the_serving_loop_is_a_clean_stop(tmp_path):
    """A handler that took a lock (``threading.Event.set()``) deadlocked when SIGTERM landed while
    the main thread held that lock inside ``Event.wait()``: the runner then ignored every SIGTERM.
    Each driver receives SIGTERM on the N-th line its main thread runs after ``run`` says it serves,
    and must exit 0."""
    env = dict(os.environ, PYTHONPATH=str(DRIVER.parent))
    hung, failed = [], []
    for first in range(1, LINES + 1, AT_ONCE):
        procs = {n: subprocess.Popen([sys.executable, str(DRIVER), str(n), str(tmp_path / f"{n}.db")],
                                     cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for n in range(first, min(first + AT_ONCE, LINES + 1))}
        for n, proc in procs.items():
            try:
                _, err = proc.communicate(timeout=LIVENESS_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                hung.append(n)
                continue
            if proc.returncode != 0 or b"received SIGTERM; stopping" not in err:
                failed.append((n, proc.returncode, err.decode(errors="replace")[-1500:]))
    assert hung == [], f"SIGTERM on these lines after serving never stopped the runner: {hung}"
    assert failed == []


def test_a_value_that_names_no_signal_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="12345"):
        StopSignals((signal.SIGTERM, 12345))

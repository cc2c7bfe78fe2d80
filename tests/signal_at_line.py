"""``python signal_at_line.py N DB``: run ``timerwheel-c run`` on the SQLite file DB and send this
process SIGTERM at the N-th line its main thread runs after logging that it serves.

A Python signal handler runs on the main thread at a bytecode boundary, wherever that thread is:
stepping N through one turn of the serving loop lands the signal on every line of it, including
those that hold a lock the handler might take. ``N 0`` prints the lines instead, for a second."""
from __future__ import annotations

import logging
import os
import signal
import sys
import time

from timerwheel_c.cli import main

N, DB = int(sys.argv[1]), sys.argv[2]
_state = {"serving": False, "armed": False, "lines": 0, "since": 0.0}


def _local(frame, event, arg):
    if event == "return" and _state["serving"] and frame.f_code.co_name == "info" \
            and frame.f_code.co_filename == logging.__file__:
        _state.update(serving=False, armed=True, since=time.monotonic())
    elif event == "line" and _state["armed"]:
        _state["lines"] += 1
        if N == 0:
            print(f"{_state['lines']} {os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}:"
                  f"{frame.f_lineno}", file=sys.stderr)
            if time.monotonic() - _state["since"] > 1.0:
                _state["armed"] = False
                os.kill(os.getpid(), signal.SIGTERM)
        elif _state["lines"] == N:
            _state["armed"] = False
            os.kill(os.getpid(), signal.SIGTERM)
    return _local


class _OnServing(logging.Filter):
    def filter(self, record):
        if record.msg.startswith("serving %s"):
            _state["serving"] = True
            # Trace from here on only, as a debugger attaches: the frames running now, and every call.
            frame = sys._getframe()
            while frame is not None:
                frame.f_trace = _local
                frame = frame.f_back
            sys.settrace(lambda frame, event, arg: _local)
        return True


logging.getLogger("timerwheel_c.durable").addFilter(_OnServing())
sys.exit(main(["run", "--store", f"sqlite:///{DB}", "--handlers", "durable_handlers:registry",
               "--partition", "ops"]))

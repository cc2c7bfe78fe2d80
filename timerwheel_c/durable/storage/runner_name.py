"""The name a fleet runner's lock sessions give themselves in ``application_name``: ``timerwheel_c
runner on HOST pid N #TOKEN``, its host, its OS process id and a token of the runner's own, so that
``pg_stat_activity`` shows who each runner is, and the runner is known by name across reconnects
(:mod:`.postgres.ownership`). Driver-free, so that the status page reads it without importing one.
"""
from __future__ import annotations

import os
import re
import socket
from typing import Optional

__all__ = ["parse_runner_name", "runner_name"]

_HEAD = "timerwheel_c runner on "
_NAME = re.compile(r"^timerwheel_c runner on (?P<host>.*) pid (?P<pid>\d+)(?: #[0-9a-f]+)?$")
_NAME_BYTES = 63  # PostgreSQL keeps this much of an application_name (NAMEDATALEN - 1)


def runner_name(token: str) -> str:
    """This process's runner name with ``token`` (hex), the host cut short where the 63 bytes
    PostgreSQL keeps would cut the pid or the token."""
    rest = f" pid {os.getpid()} #{token}"
    host = socket.gethostname().encode()[:_NAME_BYTES - len(_HEAD) - len(rest)].decode(errors="ignore")
    return _HEAD + host + rest


def parse_runner_name(name: Optional[str]) -> Optional[tuple[str, int]]:
    """``(host, OS pid)`` of a runner name (with or without a token, as runners before tokens named
    themselves), or None for any other name or None."""
    match = _NAME.match(name or "")
    return (match["host"], int(match["pid"])) if match else None

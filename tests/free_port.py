"""A free loopback TCP port for a server of a test's own, or of ``.ci/run``.

``free_port()`` returns a port (int) that nothing listens on now, taken below the kernel's range
for the local ports of outgoing connections. Raises RuntimeError when 100 tries found none.
Run as a script, it prints one.
"""
from __future__ import annotations

import random
import socket
from pathlib import Path

# Where the kernel picks the local ports of outgoing connections (Linux): a server port taken from
# there can be taken by any client's connection before the server binds it, or while a test has
# the server stopped, and the server's start then fails ("Address already in use"), as it did in
# CI. Below that range it cannot.
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port() -> int:
    low = int(_EPHEMERAL.read_text().split()[0]) if _EPHEMERAL.exists() else 0
    for _ in range(100):
        port = random.randrange(10_000, low) if low > 10_000 else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # taken: another
                continue
            return s.getsockname()[1]
    raise RuntimeError(f"no free port for a server below {low}")


if __name__ == "__main__":
    print(free_port())

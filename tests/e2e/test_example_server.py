"""examples/idle_timeout_server.py on real loopback sockets: an idle connection is closed,
not before its timeout; one that keeps sending stays open.

The server runs as a subprocess (the example exactly as a user runs it). The active
connection sends every IDLE_S / 10, so only a stall of nine tenths of the timeout could
close it; the idle close is checked against the client's own send time, which the
server's loop clock can only be at or after (see the test's note on uvloop).
"""
from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time

import pytest

from locations import CHECKOUT

EXAMPLE = CHECKOUT / "examples" / "idle_timeout_server.py"
IDLE_S = 0.5
ACTIVE_FOR_S = 1.5
LIVENESS_S = 10.0


def _start(scheduler: str, use_uvloop: bool):
    cmd = [sys.executable, str(EXAMPLE), "--port", "0", "--idle-timeout", str(IDLE_S),
           "--scheduler", scheduler] + (["--uvloop"] if use_uvloop else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise AssertionError(f"server did not start: {line!r} {proc.stderr.read()!r}")
    host, port = line.split()[-1].rsplit(":", 1)
    return proc, host, int(port)


async def _exchange(reader, writer, payload: bytes) -> float:
    """Send one line, await its echo; returns the monotonic time taken just before sending."""
    sent_at = time.monotonic()
    writer.write(payload)
    assert await asyncio.wait_for(reader.readline(), LIVENESS_S) == payload
    return sent_at


async def _idle_client(host: str, port: int):
    """One message, then a partial line, then silence: returns (last send, EOF seen) times."""
    reader, writer = await asyncio.open_connection(host, port)
    sent_at = await _exchange(reader, writer, b"hello\n")
    writer.write(b"partial")  # not a message: must not hold the connection open
    assert await asyncio.wait_for(reader.read(), LIVENESS_S) == b""
    closed_at = time.monotonic()
    writer.close()
    return sent_at, closed_at


async def _active_client(host: str, port: int):
    """A message every IDLE_S / 10 for ACTIVE_FOR_S, each answered; then silence.
    Returns (messages answered, last send, EOF seen)."""
    reader, writer = await asyncio.open_connection(host, port)
    start = time.monotonic()
    answered = 0
    while time.monotonic() - start < ACTIVE_FOR_S:
        sent_at = await _exchange(reader, writer, b"ping %d\n" % answered)
        answered += 1
        await asyncio.sleep(IDLE_S / 10)
    assert await asyncio.wait_for(reader.read(), LIVENESS_S) == b""
    closed_at = time.monotonic()
    writer.close()
    return answered, sent_at, closed_at


async def _clients(host: str, port: int):
    return await asyncio.gather(_idle_client(host, port), _active_client(host, port))


@pytest.mark.slow
@pytest.mark.parametrize("scheduler, use_uvloop", [
    ("call_later", False), ("wheel", False), ("wheel", True), ("keyed", False), ("keyed", True)])
def test_idle_connection_closed_active_kept(scheduler, use_uvloop):
    """The idle connection (one message, then a partial line) is closed by the server, not
    before IDLE_S after its last message and within a liveness bound, while the connection
    sending every IDLE_S / 10 for 3 * IDLE_S stays open and is answered; once it falls silent
    it is closed too. "Not before" is in real time, on the client's clock: on uvloop that
    rests on WheelScheduler's clock slack (uvloop's clock trails the real time by < 2 ms).
    call_later is checked on the default loop only, whose clock is time.monotonic()."""
    if use_uvloop:
        pytest.importorskip("uvloop")
    proc, host, port = _start(scheduler, use_uvloop)
    try:
        (idle_sent, idle_closed), (answered, active_last, active_closed) = asyncio.run(
            _clients(host, port))
    finally:
        proc.kill()
        proc.wait(LIVENESS_S)
    # The situation arose: the active connection kept talking well past the idle close.
    assert answered >= 10 and active_last > idle_closed
    # Real time, the client's own clock: the server's loop clock never makes it early.
    assert IDLE_S <= idle_closed - idle_sent < IDLE_S + LIVENESS_S
    assert IDLE_S <= active_closed - active_last < IDLE_S + LIVENESS_S


async def _long_line_client(host: str, port: int) -> tuple[bytes, float]:
    """Echo of a 64 KiB line, then the time the server takes to hang up on a 64 KiB + 1 line."""
    reader, writer = await asyncio.open_connection(host, port)
    ok = b"x" * (64 * 1024) + b"\n"
    writer.write(ok)
    echo = await asyncio.wait_for(reader.readexactly(len(ok)), LIVENESS_S)
    start = time.monotonic()
    writer.write(b"y" * (64 * 1024 + 1))
    try:
        while await asyncio.wait_for(reader.read(65536), LIVENESS_S):
            pass
    except ConnectionResetError:
        pass
    took = time.monotonic() - start
    writer.close()
    return echo, took


def test_overlong_line_closes_the_connection():
    """The partial-line buffer is capped: a line of exactly 64 KiB is echoed, one byte more without
    a newline closes the connection at once, not at the idle timeout. The idle timeout is 60 s and
    the liveness bound 10 s, so only the cap can have closed it."""
    cmd = [sys.executable, str(EXAMPLE), "--port", "0", "--idle-timeout", "60", "--scheduler", "wheel"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on "), (line, proc.stderr.read())
        host, port = line.split()[-1].rsplit(":", 1)
        echo, took = asyncio.run(_long_line_client(host, int(port)))
    finally:
        proc.kill()
        proc.wait(LIVENESS_S)
    assert echo == b"x" * (64 * 1024) + b"\n"
    assert took < LIVENESS_S


async def _open_then_wait_for_close(host: str, port: int, proc, sig: int) -> bytes:
    """A connection that is answered, then the signal: returns what the server sent after it
    (b"" when the server closed the connection)."""
    reader, writer = await asyncio.open_connection(host, port)
    await _exchange(reader, writer, b"still here\n")
    proc.send_signal(sig)
    rest = await asyncio.wait_for(reader.read(), LIVENESS_S)
    writer.close()
    return rest


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("use_uvloop", [False, True], ids=["asyncio", "uvloop"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_and_sigint_stop_the_server_cleanly(sig, use_uvloop):
    """SIGTERM is handled like SIGINT: the server closes an open connection (idle timeout 60 s,
    so only the stop can close it within the liveness bound), prints which signal stopped it
    and exits 0, with nothing on stderr. Without a handler SIGTERM would end it with status -15."""
    if use_uvloop:
        pytest.importorskip("uvloop")
    cmd = [sys.executable, str(EXAMPLE), "--port", "0", "--idle-timeout", "60"] + (["--uvloop"] if use_uvloop else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on "), (line, proc.stderr.read())
        host, port = line.split()[-1].rsplit(":", 1)
        assert asyncio.run(_open_then_wait_for_close(host, int(port), proc, sig)) == b""
        out, err = proc.communicate(timeout=LIVENESS_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(LIVENESS_S)
    assert proc.returncode == 0, err
    assert out.strip() == f"stopped on {signal.Signals(sig).name}"
    assert err == ""


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf"])
def test_an_idle_timeout_that_is_not_a_positive_finite_number_is_refused(bad):
    """--idle-timeout nan or inf passed the old check (NaN is not <= 0), and every connection then
    failed in data_received: the server refuses them at start, exit 2, naming the value."""
    out = subprocess.run([sys.executable, str(EXAMPLE), "--port", "0", "--idle-timeout", bad],
                         capture_output=True, text=True, timeout=LIVENESS_S)
    assert out.returncode == 2, out.stderr
    assert "--idle-timeout" in out.stderr and bad in out.stderr.lower()

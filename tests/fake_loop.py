"""``FakeLoop``: a stand-in event loop whose clock a test sets, for tests that drive a loop's timer
store (``LoopTimers``) directly, with no real time passing."""
from __future__ import annotations


class FakeLoop:
    """A loop whose clock the test sets (the compiled store calls ``time()``: it is not asyncio's)."""

    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def time(self) -> float:
        return self.now_s

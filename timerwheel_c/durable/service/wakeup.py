"""What wakes the claim stage's sleep: the one way in to the claimer from any thread.

The claimer sleeps until the earliest due time its last pass saw. Three things may make it stale,
and each rings this object instead of calling into the service:

- a timer written in this process (:meth:`DurableTimerService.schedule`, ``notify``, or the commit
  stage putting a handler's next timer), nearer than that sleep: :meth:`Wakeup.written`;
- the store's change signal (a write by any process): :meth:`Wakeup.changed_signal`;
- a handler slot freeing up while claimed rows wait for room, or a stop: :meth:`Wakeup.ring`.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Optional

from ..storage.store import Ownership

__all__ = ["Wakeup"]


class Wakeup:
    """The claimer's inbox (thread-safe).

    Args:
        ownership: the fleet ownership, re-checked on a write in this process (a partition may be
            new), or None.
        collect: record the partitions written to (a service serving every partition passes over
            them before the store lists them).

    ``wake_ms``: the wall ms (Unix epoch) the claimer sleeps until, None while a pass runs or when
    no timer is left, so that any write then rings (a ring during a pass makes the next sleep end
    at once). ``changed``: the change signal came since the claimer last looked.
    """

    def __init__(self, ownership: Optional[Ownership], collect: bool):
        self.ownership = ownership
        self._lock = threading.Lock()
        self._written: Optional[set] = set() if collect else None
        self.wake_ms: Optional[int] = None
        self.changed = False
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.kick: Optional[asyncio.Event] = None

    def bind(self) -> asyncio.Event:
        """On the claimer's loop, before its first sleep: the event its sleeps wait on."""
        self.loop = asyncio.get_running_loop()
        self.kick = asyncio.Event()
        return self.kick

    def unbind(self) -> None:
        self.loop = self.kick = None

    def ring(self) -> None:
        """End the claimer's sleep now (from any thread)."""
        loop, kick = self.loop, self.kick
        if loop is not None and kick is not None:
            try:
                loop.call_soon_threadsafe(kick.set)
            except RuntimeError:  # the loop has closed: the thread is exiting anyway
                pass

    def written(self, partition: str, due_ms: int) -> None:
        """A timer due at ``due_ms`` (Unix epoch ms) was written to ``partition`` in this process: ring
        if that is nearer than the claimer's sleep."""
        with self._lock:
            if self._written is not None:
                self._written.add(partition)
            wake = self.wake_ms
        if self.ownership is not None:
            self.ownership.recheck()
        if wake is None or due_ms < wake:
            self.ring()

    def changed_signal(self) -> None:
        """The store's change signal (on the watcher's thread)."""
        self.changed = True
        self.ring()

    def sleeping_until(self, wake_ms: Optional[int]) -> None:
        with self._lock:
            self.wake_ms = wake_ms

    def written_partitions(self) -> set:
        """The partitions written to in this process so far (empty unless ``collect``)."""
        with self._lock:
            return set(self._written or ())

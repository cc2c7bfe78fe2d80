"""The store's change signal: a :class:`Watcher` calls back when the store may have changed.

Runners in one process cannot see writes made by another process (a web process that
schedules, a second runner that backs a row off) unless something tells them. Each
backend gives :meth:`timerwheel_c.durable.storage.store.Store.watch` its cheapest cross-process
detector, and the service waits on it beside its deadline, as APScheduler 4 and
procrastinate wake their workers with PostgreSQL ``LISTEN``/``NOTIFY``:

- PostgreSQL: a trigger sends ``NOTIFY`` in the writing transaction, and a dedicated
  ``LISTEN`` connection receives it (:mod:`timerwheel_c.durable.storage.postgres.listen`).
- SQLite: ``PRAGMA data_version`` on a dedicated connection, polled every 20 ms; it
  changes whenever another connection commits (https://sqlite.org/pragma.html#pragma_data_version).
- Any other backend: :class:`PollingWatcher` calling back every second.

Each store runs one detector per process, however many waiters it has (a service, every
durable sleep in progress): a :class:`ChangeHub` starts it for the first waiter, fans each
change out to all of them, and stops it when the last one leaves. On PostgreSQL that is one
``LISTEN`` connection per store, not one per sleep.

A callback may be spurious (a write that moved no timer) but is never missing for a
committed write that schedules a timer row (PostgreSQL leaves out the backed-off rows
that runners write when they claim one), so a runner that does a pass after each
callback, and after ``max_sleep_s`` at the latest, sees every timer row in time.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from typing import Callable, Optional

__all__ = ["GENERIC_POLL_S", "MAX_INTERVAL_S", "ChangeHub", "PollingWatcher", "Watcher", "call_back", "check_interval_s"]

log = logging.getLogger("timerwheel_c.durable")

# The longest interval between two rounds of a store's background thread, s (SQLite's checkpoints, a
# polling change signal): a day. A longer one is no longer a round at all (a WAL left to grow for days,
# a change signal a runner's max_sleep_s poll always beats: what None, or the poll alone, would say
# plainly), and past threading.TIMEOUT_MAX the thread died at its first wait (an OverflowError
# nobody saw): no checkpoint ever ran, no change was ever signalled.
MAX_INTERVAL_S = 86_400.0


def check_interval_s(name: str, value: object) -> float:
    """``value``, the interval named ``name`` between two rounds of a background thread, checked: a
    finite number of seconds > 0 and at most :data:`MAX_INTERVAL_S` (a day), returned as a float.

    Raises:
        ValueError: anything else (a bool, inf, NaN, 1e300), naming ``name`` and the value.
    """
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not 0 < value <= MAX_INTERVAL_S):
        raise ValueError(f"{name} must be a finite number of seconds > 0 and at most {MAX_INTERVAL_S:g} "
                         f"(a day), got {value!r}")
    return float(value)


GENERIC_POLL_S = 1.0


def call_back(callback: Callable[[], None], closing: threading.Event) -> None:
    """Call ``callback()`` unless ``closing`` is set; an exception from it (its event loop has just
    closed) is logged at DEBUG: it must not end the watcher's thread."""
    if closing.is_set():
        return
    try:
        callback()
    except Exception:
        log.debug("a store change callback failed", exc_info=True)


class Watcher:
    """A running change detector; :meth:`close` stops it (idempotent).

    Use as ``with store.watch(callback):``. The callback runs on the watcher's own thread,
    takes no argument and must return quickly (set an event, ``call_soon_threadsafe``).
    """

    def close(self) -> None:
        """Stop calling back, at once; the detector's thread then ends by itself within one of its
        polling intervals and releases its connection. Not waiting for it keeps a caller (a durable
        sleep that has just been woken) from paying that interval."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class PollingWatcher(Watcher):
    """Calls ``changed()`` every ``interval_s`` seconds on a daemon thread, and ``callback()`` when
    it returns True. ``release()`` runs once on that thread when it stops (to close a connection).

    An exception from ``changed`` is logged (DEBUG) and treated as a change: a runner that is
    woken by mistake does one cheap pass, a runner that is not woken may miss a timer.

    Raises:
        ValueError: ``interval_s`` is not a finite number of seconds > 0 and at most :data:`MAX_INTERVAL_S`.
    """

    def __init__(self, changed: Callable[[], bool], callback: Callable[[], None], interval_s: float,
                 name: str = "store-watcher", release: Optional[Callable[[], None]] = None):
        self._interval_s = check_interval_s("interval_s", interval_s)
        self._changed = changed
        self._callback = callback
        self._release = release
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _wait(self) -> bool:
        """Wait one interval; False once closing. A short interval sleeps with ``time.sleep``,
        which costs about half the CPU of ``Event.wait`` (no timed lock loop); the thread then
        notices a close at the end of the current interval."""
        if self._interval_s < 0.1:
            time.sleep(self._interval_s)
            return not self._closing.is_set()
        return not self._closing.wait(self._interval_s)

    def _loop(self) -> None:
        try:
            while self._wait():
                try:
                    changed = self._changed()
                except Exception:
                    log.debug("store change check failed; treating it as a change", exc_info=True)
                    changed = True
                if changed:
                    call_back(self._callback, self._closing)
        finally:
            if self._release is not None:
                self._release()

    @property
    def native_id(self):
        """The OS thread id of the polling thread (to account its CPU time), or None before it starts."""
        return self._thread.native_id

    def close(self) -> None:
        self._closing.set()


class _Subscription(Watcher):
    """One waiter's handle on a :class:`ChangeHub`; other attributes (``connected``, ``reconnects``,
    ``native_id``) are those of the shared detector."""

    def __init__(self, hub: "ChangeHub", callback: Callable[[], None]):
        self._hub = hub
        self.callback = callback
        self.closing = threading.Event()

    def close(self) -> None:
        if not self.closing.is_set():
            self.closing.set()
            self._hub._remove(self)

    def __getattr__(self, name: str):
        return getattr(self._hub.detector, name)


class ChangeHub:
    """One change detector shared by every waiter of a store in this process.

    ``start(fire)`` starts the backend's detector (a :class:`Watcher` calling ``fire()`` on each
    change); :meth:`add` starts it for the first waiter and :meth:`Watcher.close` of the last one
    stops it. A waiter that joins a running detector is called back once at once, on its own
    thread. Thread-safe.
    """

    def __init__(self, start: Callable[[Callable[[], None]], Watcher]):
        self._start = start
        self._lock = threading.Lock()
        self._subscriptions: list = []
        self.detector: Optional[Watcher] = None

    def add(self, callback: Callable[[], None]) -> Watcher:
        """Call ``callback()`` on each change until the returned handle is closed.

        Raises:
            StoreError: the detector could not be started (nothing is registered).
        """
        with self._lock:
            joined = self.detector is not None
            if not joined:
                self.detector = self._start(self._fire)
            subscription = _Subscription(self, callback)
            self._subscriptions.append(subscription)
        if joined:
            # A new detector calls back once it is in place (a write before that sent no signal this
            # waiter saw); joining a running one gets the same single call, so the waiter's first
            # look at the store follows its registration.
            call_back(callback, subscription.closing)
        return subscription

    def _remove(self, subscription: _Subscription) -> None:
        with self._lock:
            self._subscriptions = [s for s in self._subscriptions if s is not subscription]
            if not self._subscriptions and self.detector is not None:
                self.detector.close()
                self.detector = None

    def _fire(self) -> None:
        with self._lock:
            subscriptions = list(self._subscriptions)
        for subscription in subscriptions:
            call_back(subscription.callback, subscription.closing)

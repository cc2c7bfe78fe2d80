"""Process-wide settings for a process that exists to run durable timers: ``timerwheel-c run``, a
fleet's runner, a worker started for nothing else.

CPython's cyclic garbage collector collects generation 0 after every 700 net allocations of
container objects, generation 1 after every 10 of those and, after every 10 of those, the whole
heap (``gc.get_threshold()``: ``(700, 10, 10)``). A runner builds a few dozen short-lived
containers per timer it fires (records, batches, tuples), nearly all freed at once by reference
counting, so at thousands of fires per second the collector ran hundreds of times per second, and
each full collection walked every object the imports had built (about 40,000). In the fleet bench
that was 20 to 35 % of a runner's CPU time per fired timer.

:func:`prepare_process` does what long-running Python servers do: it moves every object built so
far (modules, classes, the handlers' registry) to the collector's permanent generation with
:func:`gc.freeze`, which CPython's documentation recommends for exactly this, and raises the
thresholds to :data:`GC_THRESHOLDS`, so that a collection runs per hundreds of thousands of
allocations rather than per hundreds. In the fleet bench a runner's count of new containers grows
by about 14 per fired timer (its passes hold a thousand rows in flight at a time), and a young
collection walks the new containers still alive, a runner's rows in flight (6 to 20 ms each): at a
threshold of 50,000 that was two collections per 10,000 fires, 1 to 3 µs per fired timer; at
200,000 it is one per 14,000 fires or so, each no longer. Reference cycles are still collected,
later; the memory they hold meanwhile is bounded by the threshold (a few hundred thousand objects,
tens of MB at most).

These settings belong to the process, not to a library inside it: the service never changes them
on its own. ``timerwheel-c run`` calls :func:`prepare_process` once its handlers are loaded; an
application that runs :class:`~.service.DurableTimerService` in a process of its own may do the
same.

Such a process serves until SIGINT or SIGTERM, and :class:`StopSignals` is how it waits for one.
Python runs a signal handler on the main thread "at a later point (for example at the next
bytecode instruction)" (the ``signal`` module's documentation), wherever that thread is. A handler
that takes a lock deadlocks when the signal lands while the main thread holds that same lock:
``threading.Event.set()`` called by a handler while the main thread is inside ``Event.wait()`` on
that event (its condition's lock is held for a few bytecodes around each wait) never returns, and
the process then ignores every later SIGTERM (CPython's issue tracker has the same hazard for
``multiprocessing.Event``, gh-126434). The handler of :class:`StopSignals` only stores the signal,
and :func:`signal.set_wakeup_fd` wakes the waiting thread, as asyncio's own signal handling does.

Once a stop is asked for, :class:`StopDeadline` bounds how long the process takes to end. Closing a
store has no bound of its own: a statement the server does not answer (a frozen or partitioned
server, a row lock another session holds) keeps its connection, which cannot be closed under the
thread waiting on it. Kubernetes sends SIGKILL 30 s after SIGTERM by default
(``terminationGracePeriodSeconds``); a process that ends itself first says why in its last log line.
"""
from __future__ import annotations

import gc
import logging
import os
import select
import signal
import socket
import threading
from typing import Optional

__all__ = ["GC_THRESHOLDS", "StopDeadline", "StopSignals", "prepare_process"]

log = logging.getLogger("timerwheel_c.durable")

#: The collector's thresholds :func:`prepare_process` sets: generation 0 collected after 200,000
#: net container allocations (not 700), generations 1 and 2 after 20 collections of the one below.
GC_THRESHOLDS = (200_000, 20, 20)


def prepare_process() -> tuple:
    """Freeze the objects built so far out of the cyclic collector's reach (:func:`gc.freeze`) and
    set its thresholds to :data:`GC_THRESHOLDS`; returns the thresholds it replaced, a 3-tuple
    (``gc.set_threshold(*previous)`` and :func:`gc.unfreeze` undo it). Call it once, after the
    imports and the handlers' registry, before the service starts. Raises nothing."""
    previous = gc.get_threshold()
    gc.collect()  # what is garbage now is not frozen with the rest
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    log.debug("garbage collector: %d objects frozen, thresholds %s (were %s)", gc.get_freeze_count(),
              GC_THRESHOLDS, previous)
    return previous


class StopSignals:
    """SIGINT and SIGTERM, received as a stop request that the main thread waits on.

    ``with StopSignals() as stop: while stop.wait(0.2) is None: ...``. On entry it installs a
    handler for each signal in ``signums`` (a tuple of :class:`signal.Signals`) and a wake-up
    socket (:func:`signal.set_wakeup_fd`); on exit it puts back the handlers and wake-up fd it
    replaced. The handler stores the signal and takes no lock, so it is safe wherever the signal
    lands (see the module docstring); the first signal received is the one kept.

    Raises:
        ValueError: a value of ``signums`` that names no signal (at construction); entered on a
            thread other than the main thread (a Python rule for signal handlers).
    """

    def __init__(self, signums: tuple = (signal.SIGINT, signal.SIGTERM)) -> None:
        self.signums = tuple(signal.Signals(s) for s in signums)
        #: The first signal received, or None.
        self.received: Optional[signal.Signals] = None
        self._previous: dict = {}
        self._previous_fd: Optional[int] = None  # the wake-up fd replaced, once this one is set
        self._sockets: Optional[tuple] = None

    def _on_signal(self, signum, frame) -> None:
        # A single store: no lock, no I/O (the wake-up fd is written by the interpreter's C handler).
        if self.received is None:
            self.received = signal.Signals(signum)

    def __enter__(self) -> "StopSignals":
        reader, writer = socket.socketpair()
        reader.setblocking(False)
        writer.setblocking(False)  # set_wakeup_fd needs a non-blocking fd: a full buffer drops a byte, never blocks
        self._sockets = (reader, writer)
        try:
            self._previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
            for signum in self.signums:
                self._previous[signum] = signal.signal(signum, self._on_signal)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)  # None: not set from Python
        self._previous.clear()
        if self._previous_fd is not None:
            signal.set_wakeup_fd(self._previous_fd)
            self._previous_fd = None
        if self._sockets is not None:
            for sock in self._sockets:
                sock.close()
            self._sockets = None

    def wait(self, timeout_s: float) -> Optional[signal.Signals]:
        """Wait up to ``timeout_s`` seconds for a signal; return the first one received, or None.
        Returns at once when one arrives, or has already.

        Raises:
            RuntimeError: not entered.
        """
        if self._sockets is None:
            raise RuntimeError("StopSignals.wait() outside its with block")
        if self.received is None:
            reader = self._sockets[0]
            if select.select([reader], [], [], timeout_s)[0]:
                try:
                    while reader.recv(512):
                        pass
                except BlockingIOError:
                    pass
        return self.received


class StopDeadline:
    """Ends the process with ``os._exit(status)`` if it is still running ``after_s`` seconds (a
    positive float) after construction, unless :meth:`cancel` was called first.

    The process then skips what an exit would wait for (closing a store, joining threads, atexit
    callbacks): it is taken only when one of those waits has outrun the whole deadline, at which
    point the alternative is SIGKILL. Before ending it logs one WARNING naming :attr:`step`, the
    part of the stop it was in (set it as the stop goes), and flushes the root logger's handlers.
    A daemon thread waits out the deadline; construct it on any thread. Raises nothing.
    """

    def __init__(self, after_s: float, status: int = 0) -> None:
        self.after_s = after_s
        self.status = status
        #: What the stop is doing now, for the warning (e.g. "closing the store").
        self.step = "stopping"
        self._cancelled = threading.Event()
        threading.Thread(target=self._watch, name="stop-deadline", daemon=True).start()

    def _watch(self) -> None:
        if self._cancelled.wait(self.after_s):
            return
        log.warning("the stop has not finished %.0f s after it began (%s); ending the process without waiting more",
                    self.after_s, self.step)
        for handler in logging.getLogger().handlers:
            try:
                handler.flush()
            except Exception:  # a broken stderr must not keep the process alive
                pass
        os._exit(self.status)

    def cancel(self) -> None:
        """The stop finished: do not end the process."""
        self._cancelled.set()

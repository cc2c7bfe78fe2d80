"""The service's thread: one event loop on which the three stages run, restarted after a bug, and
drained down the pipeline on stop (the handlers in flight, then their commits, then the rows left
unsettled released), within stop()'s timeout."""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import Optional

from ..storage.printable import log_traceback, printable
from ..storage.store import Ownership
from ..timers.timing import Clock, Timing
from .claiming import Claimer
from .committer import Committer
from .executor import Executor
from .pool import DaemonExecutor, working_for

__all__ = ["ServiceThread"]

log = logging.getLogger("timerwheel_c.durable")

_BACKOFF_SLICE_S = 0.05  # real seconds between two looks at the clock in a restart's backoff
# Seconds a task left on the loop after the stages drained (an async handler the drain cancelled) gets
# to end, at least, past what is left of stop()'s timeout: within the teardown stop() allows.
_CANCELLED_GRACE_S = 0.25


class ServiceThread:
    """The thread ``durable-timers`` running ``claimer``, ``executor`` and ``committer`` on its loop.

    ``stop_at``: monotonic s (``clock``) by which stop() wants the stages drained, None: no limit.
    ``release_on_stop``: on stop, release the rows given up in their handler too. ``died``: why the
    thread ended without stop(), or None. As it ends, each stage lets its own threads go.
    """

    def __init__(self, claimer: Claimer, executor: Executor, committer: Committer, ownership: Optional[Ownership],
                 clock: Clock, timing: Timing):
        self.claimer, self.executor, self.committer = claimer, executor, committer
        self.ownership = ownership
        self.clock = clock
        self.timing = timing
        self.ready = threading.Event()
        self.stopped = threading.Event()  # set by stop(): ends a restart's backoff at once
        self.stop_at: Optional[float] = None
        self.release_on_stop = False
        self.died: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, name="durable-timers", daemon=True)

    def start(self) -> None:
        """Start the thread; return once its claimer listens (see :meth:`Claimer.serve`)."""
        self.thread.start()
        self.ready.wait()

    def join(self, timeout_s: Optional[float]) -> None:
        """Wait up to ``timeout_s`` seconds (None: no limit) for the thread to end; from the thread
        itself (``stop()`` in an ``async def`` handler, which runs there) or from a thread that runs
        a handler's call for it (a sync handler's, an ``asyncio.to_thread`` of an async one's), return
        at once: the thread ends once the handler has returned, and it cannot wait for itself."""
        if threading.current_thread() is self.thread or working_for(self.executor):
            return
        # A wait past the threading module's longest is no wait at all to it (OverflowError).
        self.thread.join(None if timeout_s is None else min(timeout_s, threading.TIMEOUT_MAX))

    def _monotonic_s(self) -> float:
        return self.clock.monotonic_ns() / 1e9

    def _back_off(self, seconds: float) -> None:
        """Wait ``seconds`` of the clock's time before a restart, or until stop() sets :attr:`stopped`:
        a stop must not wait out a backoff (up to ``backoff_max_s``) past its timeout. The wait is on
        the stop event in slices of real time, each looking at the clock, which may be a ManualClock."""
        until_ns = self.clock.monotonic_ns() + round(seconds * 1e9)
        while not self.stopped.is_set():
            left_ns = until_ns - self.clock.monotonic_ns()
            if left_ns <= 0:
                return
            self.stopped.wait(min(left_ns / 1e9, _BACKOFF_SLICE_S))

    def _run(self) -> None:
        failures = 0  # loops in a row that failed soon after they started
        try:
            while not self.claimer.stopping:
                started_s = self._monotonic_s()
                try:
                    self._run_loop()
                except Exception as exc:  # a bug outside the guarded pass: log, and keep the service alive
                    # Backed off as a failing store is, and logged in full the first time only, then at
                    # 1, 2, 4, 8... failures in a row: one that recurs at once (no file descriptor left
                    # for a new loop) must not flood the log nor spin.
                    failures = 1 if self._monotonic_s() - started_s > self.timing.backoff_max_s else failures + 1
                    if failures == 1:
                        log_traceback(log, logging.ERROR, exc, "durable timer service loop failed (%d time(s) in a "
                                      "row); restarting it: %s: %s", failures, type(exc).__name__, printable(str(exc)))
                    elif failures & (failures - 1) == 0:
                        log.error("durable timer service loop failed (%d time(s) in a row); restarting it: %s: %s",
                                  failures, type(exc).__name__, printable(str(exc)))
                    self.ready.set()
                    self._back_off(self.timing.backoff_s(failures))
        except BaseException as exc:  # handlers' exceptions never get here: this is the service's own
            self.died = exc
            log_traceback(log, logging.CRITICAL, exc, "durable timer service thread ended without stop(): %s: %s",
                          type(exc).__name__, printable(str(exc)))
        finally:
            if self.ownership is not None:
                self.ownership.close()
            # A stop() racing start() can end the loop before _main ran: start() must not wait forever.
            self.ready.set()
            self.executor.shutdown()
            self.claimer.close()
            self.committer.close()

    def _left_s(self) -> Optional[float]:
        """Seconds left of stop()'s timeout (never below 0), None: no limit."""
        return None if self.stop_at is None else max(0.0, self.stop_at - self._monotonic_s())

    def _run_loop(self) -> None:
        """:meth:`_main` on a new event loop, as ``asyncio.run`` runs it, but for the tasks still on the loop
        when it returns: cancelled as ``asyncio.run`` cancels them, they get what is left of stop()'s timeout
        (at least :data:`_CANCELLED_GRACE_S`) to end, and one that is still running then (an ``async def``
        handler that catches each CancelledError and goes on) is abandoned with the loop, where
        ``asyncio.run`` waited for it, for ever if it never returns, the thread alive past stop() with its
        store connections and a fleet's partitions held."""
        loop = asyncio.new_event_loop()
        try:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self._main())
        finally:
            try:
                self._end_tasks(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    def _end_tasks(self, loop: asyncio.AbstractEventLoop) -> None:
        tasks = asyncio.all_tasks(loop)
        if not tasks:
            return
        for task in tasks:
            task.cancel()
        left_s = self._left_s()
        _, pending = loop.run_until_complete(
            asyncio.wait(tasks, timeout=None if left_s is None else max(left_s, _CANCELLED_GRACE_S)))
        for task in tasks - pending:
            if not task.cancelled() and task.exception() is not None:  # as asyncio.run reports them
                loop.call_exception_handler({"message": "unhandled exception during the service's shutdown",
                                             "exception": task.exception(), "task": task})
        if pending:
            for task in pending:
                task._log_destroy_pending = False  # type: ignore[attr-defined]  # logged here, once
            log.warning("stopping with %d handler(s) that ignored their cancellation still running (%s); "
                        "abandoned with the service's loop, their rows stay claimed and fire again after their "
                        "backoff", len(pending), ", ".join(self.executor.handler_names(pending)))

    async def _main(self) -> None:
        # After a crash of a previous loop its tasks are gone with it: their rows stay claimed and
        # come back after their backoff, and their slots must not stay counted.
        self.executor.reset()
        self.committer.reset()
        # asyncio.to_thread in a handler: a call past the stop must not keep the process alive (see .pool).
        asyncio.get_running_loop().set_default_executor(DaemonExecutor("durable-async-thread", owner=self.executor))
        try:
            await self.claimer.serve(self.executor, self.ready)
            await self._drain()
        finally:
            self.claimer.unlisten()

    async def _drain(self) -> None:
        left_s = self._left_s
        # Where the rows this stop gives up in their handler go: released below, or left to their backoff.
        fate = ("are released for another runner to fire now" if self.release_on_stop
                else "stay claimed and fire again after their backoff")
        if self.executor.queue:
            log.info("stopping with %d claimed row(s) not started; they get their attempt back and are due now",
                     len(self.executor.queue))
        abandoned = await self.executor.drain(left_s)
        if abandoned:
            log.warning("stopping with %d handler(s) still running; their rows %s", abandoned, fate)
        uncommitted = await self.committer.drain(left_s)
        if uncommitted:
            log.warning("stopping with %d outcome(s) not committed (a commit the store has not answered may still "
                        "land); unless it does, their rows %s", uncommitted, fate)
        await self.claimer.release_unsettled(self.release_on_stop)

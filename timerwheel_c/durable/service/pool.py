"""A fixed pool of daemon worker threads for the service's blocking calls.

Not :class:`concurrent.futures.ThreadPoolExecutor`: its threads are joined when the
interpreter exits, so one handler that never returns would keep the process from exiting
after :meth:`DurableTimerService.stop` gave up on it. These threads are daemons; a call
still running when the service stops is abandoned (its row stays claimed and comes back
after its backoff), which is the documented contract. :class:`DaemonExecutor` gives the service's
event loop the same for ``asyncio.to_thread`` and ``loop.run_in_executor(None, ...)`` in an
``async`` handler: asyncio's own default executor is a ThreadPoolExecutor, whose threads the
interpreter joins at exit (daemon or not) and ``asyncio.run`` joins when it ends.
"""
from __future__ import annotations

import concurrent.futures
import functools
import os
import queue
import threading
from typing import Callable, Optional

__all__ = ["DEFAULT_CONCURRENCY", "MAX_CONCURRENCY", "DaemonExecutor", "DaemonPool", "working_for"]

#: Handlers the service runs at once by default: the workers of its pool. Here, not in the service's
#: module, so that ``timerwheel-c run --help`` shows it without loading the service (and asyncio).
DEFAULT_CONCURRENCY = 16
#: The most handler slots a service takes: each is an OS thread started with the service (8 MB of
#: address space for its stack), so a mistyped 10**20 must be refused by name rather than hang the start.
MAX_CONCURRENCY = 1024

_worker = threading.local()  # .owner: the owner of the pool whose worker this thread is


def working_for(owner: object) -> bool:
    """True on a worker thread of a pool made for ``owner``: a call there that waits for the owner to
    end would wait for itself (``stop()`` from a handler)."""
    return getattr(_worker, "owner", None) is owner


class DaemonPool:
    """``workers`` (>= 1) daemon threads named ``name-<i>``, started on construction, working for
    ``owner`` (see :func:`working_for`).

    :meth:`submit` returns a :class:`concurrent.futures.Future` (wrap it with
    :func:`asyncio.wrap_future` on a loop). :meth:`shutdown` lets the threads exit once idle,
    without waiting for a call in progress.
    """

    def __init__(self, workers: int, name: str, owner: object = None):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        self._owner = owner
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        for t in self._threads:
            t.start()

    def _work(self) -> None:
        _worker.owner = self._owner
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, fn, args = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

    def submit(self, fn: Callable, *args) -> concurrent.futures.Future:
        """Run ``fn(*args)`` on a free worker; returns its future."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((future, fn, args))
        return future

    def shutdown(self) -> None:
        """Ask every worker to exit after the calls already queued; does not wait."""
        for _ in self._threads:
            self._jobs.put(None)


class DaemonExecutor(concurrent.futures.ThreadPoolExecutor):
    """An event loop's default executor on a :class:`DaemonPool` of ``workers`` threads (default
    asyncio's own count, ``min(32, cpu count + 4)``) named ``name-<i>``: set it with
    ``loop.set_default_executor``, which takes nothing but a ThreadPoolExecutor, hence the base
    class; none of the base class's threads ever starts. The pool starts with the first call, so
    a loop whose handlers never use it starts no thread. :meth:`shutdown` does not wait for a call
    in progress, so a call that never returns keeps neither ``asyncio.run`` nor the process from
    ending; it is abandoned with its daemon thread.
    """

    def __init__(self, name: str, workers: int = 0, owner: object = None):
        self._workers = workers or min(32, (os.cpu_count() or 1) + 4)
        super().__init__(max_workers=self._workers, thread_name_prefix=name)
        self._name = name
        self._owner = owner
        self._pool: Optional[DaemonPool] = None
        self._pool_lock = threading.Lock()  # to_thread may be called from several threads at once

    def submit(self, fn, /, *args, **kwargs) -> concurrent.futures.Future:
        with self._pool_lock:
            if self._pool is None:
                self._pool = DaemonPool(self._workers, self._name, self._owner)
            pool = self._pool
        if kwargs:
            return pool.submit(functools.partial(fn, *args, **kwargs))
        return pool.submit(fn, *args)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown()

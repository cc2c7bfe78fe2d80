"""The asyncio connection pools of a PostgresStore: one ``psycopg_pool.AsyncConnectionPool`` per event
loop, on which :mod:`timerwheel_c.durable.aio` awaits its writes.

One pool per loop, because an asyncio connection and the pool's worker tasks belong to the loop that
made them: a pool made on a loop that has since closed cannot serve another (pytest-asyncio and
``asyncio.run`` make a loop per test or per run). A loop's pool is made on its first write, with the
store's connection string (so libpq's ``PG*`` environment fallbacks and any ``application_name`` in
it apply as they do to the store's own connection), set up as every connection of the store is
(:mod:`.session`), autocommit, and with the store's ``synchronous_commit``; it holds :data:`MIN_SIZE` .. :data:`MAX_SIZE` connections unless
:meth:`AsyncPools.configure` says otherwise.

A pool closes:

- with its loop: a task of its own waits on the loop until cancelled, and then closes the pool.
  ``asyncio.run``, ``asyncio.Runner`` and pytest-asyncio cancel every task of a loop before closing
  it, so no connection outlives the loop and nothing warns at exit. It must be a task, not a
  ``finally`` run later by ``shutdown_asyncgens()``: psycopg_pool's worker tasks lose that
  cancellation when it lands while they connect (they catch it, log "error connecting", and wait on
  their queue again), and ``asyncio.run`` would then wait for them for ever; the pool's close hands
  each worker the stop message it does end on;
- with the store (:meth:`AsyncPools.close`, from ``PostgresStore.close``): by cancelling that task,
  awaited when its loop runs in another thread or not at all; from a coroutine on that very loop (a
  sync call cannot wait there), the close finishes at the loop's next turns.

A loop closed without cancelling its tasks (a bare ``loop.close()``) leaves its pool's tasks to
asyncio's "Task was destroyed but it is pending", as any task left running; its connections, which
no task of a closed loop can close, are closed (their sessions ended, without the loop) at the next
loop's first write or at the store's close, whichever comes first. They stayed open until the
process ended.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import threading
import time
import weakref
from typing import AsyncIterator, Callable, Dict, Optional, Tuple

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from ..errors import StoreError, wrap_exceptions
from .results import session_is_stale
from .session import CONNECT_KWARGS, SESSION_SETUP

__all__ = ["MAX_SIZE", "MIN_SIZE", "TIMEOUT_S", "AsyncPools"]

log = logging.getLogger("timerwheel_c.durable")

#: Connections each loop's pool keeps open, and opens at most (a web app's writes are short: a few
#: connections per process serve hundreds of writes per second, and each costs the server a process).
MIN_SIZE = 1
MAX_SIZE = 4
#: Seconds a write waits for a pooled connection (all busy, or the server unreachable) before it
#: raises TransientStoreError.
TIMEOUT_S = 10.0
# The least seconds between two renewals of a pool's sessions after a read-only refusal: each opens
# the pool's min_size sessions anew, and during a maintenance every write is refused.
_RENEW_EVERY_S = 1.0
_CLOSE_WAIT_S = 10.0


class AsyncPools:
    """The pools of one PostgresStore, one per event loop, given by the store: its ``dsn``, its
    ``error`` (the :class:`StoreError` it raises for a psycopg error), and ``setup``, the statement
    that sets its session's ``synchronous_commit`` on each new connection (None: the server's).

    :meth:`connection` lends a connection of the running loop's pool, made on first use. Thread-safe:
    loops in several threads each get their own pool.
    """

    def __init__(self, dsn: str, error: Callable[[psycopg.Error], StoreError], setup: Optional[sql.Composed]):
        self._dsn = dsn
        self._setup = setup
        self._wrap = wrap_exceptions(psycopg.Error, error)
        self._lock = threading.Lock()
        # loop -> (its pool, the task that closes the pool when cancelled, the task that opens it)
        self._by_loop: Dict[asyncio.AbstractEventLoop,
                            Tuple[AsyncConnectionPool, "asyncio.Task[None]", "asyncio.Task[None]"]] = {}
        self._sizes = (MIN_SIZE, MAX_SIZE, TIMEOUT_S)
        # pool -> monotonic s of its last renewal (_renew); each pool is used on its own loop's thread
        self._renewed_s: "weakref.WeakKeyDictionary[AsyncConnectionPool, float]" = weakref.WeakKeyDictionary()
        # connection -> monotonic s it was made, for a renewal without psycopg_pool 3.3's drain (_renew)
        self._made_s: "weakref.WeakKeyDictionary[psycopg.AsyncConnection, float]" = weakref.WeakKeyDictionary()
        # loop -> the connections its pool made (closed ones drop out, and a loop no one holds), to end
        # their sessions should the loop close with its pool open (_end_sessions)
        self._made: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.WeakSet[psycopg.AsyncConnection]]" = \
            weakref.WeakKeyDictionary()

    def configure(self, min_size: int = MIN_SIZE, max_size: int = MAX_SIZE, timeout_s: float = TIMEOUT_S) -> None:
        """Size the pools made after this call: ``min_size`` connections kept open (>= 0),
        ``max_size`` at most (>= max(1, min_size)), ``timeout_s`` seconds (> 0) a write waits for
        one. A pool already made keeps its size.

        Raises:
            TypeError / ValueError: a bad size or timeout, naming it.
        """
        for name, value in (("min_size", min_size), ("max_size", max_size)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        if min_size < 0:
            raise ValueError(f"min_size must be >= 0, got {min_size}")
        if max_size < max(1, min_size):
            raise ValueError(f"max_size must be >= max(1, min_size={min_size}), got {max_size}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"timeout_s must be a number of seconds > 0, got {timeout_s!r}")
        self._sizes = (min_size, max_size, float(timeout_s))

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        """A connection of the running loop's pool (autocommit), returned to it on exit.

        Raises:
            TransientStoreError: no connection within the timeout (all busy, or the server is
                unreachable); PermanentStoreError: the server refuses the connection string.
        """
        with self._wrap:
            pool = await self._pool()
            async with pool.connection() as conn:
                try:
                    yield conn
                except (psycopg.Error, StoreError) as exc:
                    if session_is_stale(exc):
                        await self._renew(pool, conn)
                    raise

    async def _renew(self, pool: AsyncConnectionPool, conn: psycopg.AsyncConnection) -> None:
        """After a refusal no retry on the same session ends (see results.session_is_stale): every
        session of ``pool`` began with the same defaults, so all are made anew, ``conn`` as it comes
        back (psycopg_pool 3.3's ``drain``), at most once per :data:`_RENEW_EVERY_S`, since while the
        refusal lasts every write meets it. Before 3.3 (the newest on Python 3.9) there is no drain:
        a renewal is the time it starts, and a session is closed when refused if it was made before
        the latest renewal; one made since is kept until the next (closing each refused one opened a
        session per refused write)."""
        now_s = time.monotonic()
        last_s = self._renewed_s.get(pool, -math.inf)
        renewing = now_s - last_s >= _RENEW_EVERY_S
        if renewing:
            self._renewed_s[pool] = last_s = now_s
        drain = getattr(pool, "drain", None)
        if drain is None:
            with self._lock:
                made_s = self._made_s.get(conn, -math.inf)
            if made_s < last_s:
                await conn.close()
        elif renewing:
            await drain()

    async def _pool(self) -> AsyncConnectionPool:
        loop = asyncio.get_running_loop()
        with self._lock:
            found = self._by_loop.get(loop)
            if found is None:
                for old in [other for other in self._by_loop if other.is_closed()]:
                    del self._by_loop[old]
                    self._end_sessions(old)
                min_size, max_size, timeout_s = self._sizes
                pool: AsyncConnectionPool = AsyncConnectionPool(
                    self._dsn, kwargs=dict(CONNECT_KWARGS), min_size=min_size, max_size=max_size, timeout=timeout_s,
                    configure=self._configure, name="timerwheel-c-aio", open=False)
                closer = loop.create_task(self._close_when_cancelled(loop, pool))
                # wait=True: the first writes find the pool's min_size connections made, instead of
                # asking for one while they connect, which makes the pool grow by another whose connect
                # the loop's shutdown may cancel half-way, leaving a session on the server until collected.
                # A task of its own, which every first write of the loop awaits (see below).
                opener = loop.create_task(pool.open(wait=True, timeout=timeout_s))
                opener.add_done_callback(functools.partial(self._opened, loop, pool, closer))
                found = self._by_loop[loop] = (pool, closer, opener)
        pool, _, opener = found
        if not opener.done():
            # asyncio.wait, not the open itself: the pool's own wait (asyncio.wait_for before 3.12)
            # lost a cancel that landed as the connections came, and the write went on regardless.
            await asyncio.wait([opener])
        opener.result()  # the open's error: a write of a loop whose pool could not open fails with it
        return pool

    def _opened(self, loop: asyncio.AbstractEventLoop, pool: AsyncConnectionPool, closer: "asyncio.Task[None]",
                opener: "asyncio.Task[None]") -> None:
        """An open that timed out (the server down at the loop's first write) leaves the pool closed
        for good ("cannot be reused"): forgotten, so that the loop's next write makes another, and the
        outage ends with the server's instead of with the process."""
        if (opener.cancelled() or opener.exception() is not None) and pool.closed:
            with self._lock:
                if self._by_loop.get(loop, (None,))[0] is pool:
                    del self._by_loop[loop]
            closer.cancel()

    async def _configure(self, conn: psycopg.AsyncConnection) -> None:
        with self._lock:
            self._made.setdefault(asyncio.get_running_loop(), weakref.WeakSet()).add(conn)
            self._made_s[conn] = time.monotonic()
        await conn.execute(SESSION_SETUP)
        if self._setup is not None:
            await conn.execute(self._setup)

    def _end_sessions(self, loop: asyncio.AbstractEventLoop) -> None:
        """End the sessions of the connections that closed ``loop``'s pool made (under the lock): with
        the loop closed, no task can close them, and the libpq connection is closed without it."""
        for conn in list(self._made.pop(loop, ())):
            if not conn.closed:
                conn.pgconn.finish()

    async def _close_when_cancelled(self, loop: asyncio.AbstractEventLoop, pool: AsyncConnectionPool) -> None:
        try:
            await loop.create_future()  # until cancelled: by the loop's shutdown, or by close()
        finally:
            with self._lock:
                if self._by_loop.get(loop, (None,))[0] is pool:
                    del self._by_loop[loop]
                    self._made.pop(loop, None)
            await _close(pool)

    def close(self) -> None:
        """Close every loop's pool (see the module's docstring for when it is done)."""
        with self._lock:
            entries, self._by_loop = list(self._by_loop.items()), {}
        for loop, (_, closer, _) in entries:
            if loop.is_closed():
                with self._lock:
                    self._end_sessions(loop)
                continue
            try:
                on_loop = asyncio.get_running_loop() is loop
            except RuntimeError:
                on_loop = False
            if on_loop:
                closer.cancel()
            elif loop.is_running():
                try:
                    asyncio.run_coroutine_threadsafe(_cancelled(closer), loop).result(_CLOSE_WAIT_S)
                except Exception:  # the loop stopped meanwhile, or is stuck: its shutdown closes the pool
                    log.debug("closing an async pool on its loop's thread failed", exc_info=True)
            else:
                loop.run_until_complete(_cancelled(closer))


async def _cancelled(task: "asyncio.Task[None]") -> None:
    """Cancel ``task`` and wait for it to end."""
    task.cancel()
    await asyncio.wait([task])


async def _close(pool: AsyncConnectionPool) -> None:
    """Close ``pool`` and its idle connections, also once its worker tasks were cancelled:
    ``asyncio.run`` cancels every task of the loop, the pool's workers among them, before it closes
    the async generators, and ``pool.close()`` then fails waiting for its workers before it closes
    its connections. So the idle connections are taken out and closed first, through ``getconn``,
    which needs no worker for a connection ready in the pool."""
    idle = []
    while not pool.closed and pool.get_stats()["pool_available"]:
        idle.append(await pool.getconn())
    for conn in idle:
        await conn.close()
    # The workers' cancellation, not this task's: the pool is closed all the same (its flag is set
    # first), and a connection still lent out is closed when it is given back.
    with contextlib.suppress(asyncio.CancelledError):
        await pool.close()

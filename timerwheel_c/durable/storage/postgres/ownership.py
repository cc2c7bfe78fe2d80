"""Partition ownership: runner processes on one PostgreSQL database divide the partitions.

The PostgreSQL backend's :class:`~.store.Ownership`, its SQL beside its store's:
:class:`~.store.PostgresStore` names :class:`PartitionOwnership` as its ``ownership_type``, so
:meth:`~.store.Store.ownership` builds it for the service, which never imports a driver.

The model
---------
A partition is the unit of ordering, atomicity and ownership: its timers fire in due
order, a batch commits within one partition, and in a fleet each partition is served by
one live runner at a time, as Kafka assigns each partition of a topic to one consumer
of a group and Temporal each history shard to one host. Runners that ask for the same
partitions (all of the store's, ``partitions=None``, or the same list) form a *group*
and divide them:

- Every runner holds, on a connection of its own, a session-level advisory lock that
  says it is a live member of the group, and one advisory lock per partition it owns
  (``pg_try_advisory_lock``, PostgreSQL's "explicit locking" chapter). The server
  releases session locks by itself when the connection ends, so a runner killed with
  SIGKILL loses its partitions the moment its socket closes; for a host that vanishes
  without closing its sockets, the lock connection sets TCP keepalives of about 10 s.
- Every ``check_interval_s`` (1 s by default, on the runner's injected clock: the service's
  ``Timing.ownership_interval_s``) each runner reads ``pg_locks``: the live
  members N and which partitions are held. Its fair share of the P partitions is
  ``P // N``, plus one for the first ``P % N`` members in backend-pid order, so the shares
  add up to P. Over it, it releases the surplus (between passes, so never mid-pass);
  under it, it tries to lock free partitions, starting at an offset given by its rank
  among the members so that runners do not all reach for the same ones. A new runner
  therefore gets a share within about one interval after the others see it, and a dead
  runner's partitions are taken over within about one interval after its locks go.

Kinds: runners group by the partitions they ask for *and* the timer kinds their registries
handle, so a runner only ever owns partitions for kinds it can fire. During a rolling deploy
that adds a kind, the new runners form a group of their own and divide every partition among
themselves too: each partition then has one owner per group, the new group fires the new kind
while both groups fire the kinds they share (each row still claimed once, by a guarded move).
A runner leaves a due row of a kind it lacks in place for
:data:`~timerwheel_c.durable.timers.claim.UNKNOWN_KIND_GRACE_MS` (10 s) for the group that has
it, and only then moves it later (counting no attempt), so rows of a kind no live runner knows
do not clog the partition.

Shards: runners that serve the whole store (``partitions=None``) divide its shards, not its
partitions (:mod:`.shards`): the units of that group are the store's ``shard_count`` shards, so the
locks a runner holds are bounded by the shard count (64 by default), never by the partitions, and
a store of 100,000 partitions costs each runner a few dozen entries of the server's lock table.
:meth:`PartitionOwnership.owned` then gives shard numbers (``by_shard``), which the service reads
with :meth:`~.store.Store.scan_shards`. Runners given a list of partitions still divide those.

Takeover: each check remembers which runner held each partition, by the name its lock session
gives itself (below), which a runner keeps across reconnects. A partition acquired from a runner
that is no longer a member is reported once by :meth:`PartitionOwnership.taken_over` if that
runner has not come back within two check intervals (it died: its locks went with its
connection), and the service then releases the rows that runner had claimed for their first
attempt (:func:`~timerwheel_c.durable.timers.claim.release_claims`), so they fire again then
rather than after their backoff (5 s by default), still guarded on each row. A runner that comes
back lost only its session (a server restart, ``pg_terminate_backend``, a dropped connection): its
handlers still run, and its rows stay claimed, so that each fires once and its outcome commits.
A runner whose own session ended takes its partitions back, never over.

Who is who, for an operator (:func:`runners`, ``timerwheel-c fleet status``): the lock connection
also holds one shared advisory lock per kind of its registry, in a namespace of the schema and
table alone, and names itself in ``application_name`` (``timerwheel_c runner on HOST pid N #TOKEN``,
as ``pg_stat_activity`` shows it: its OS process id and a token of its own). Any session can so list the live runners of a table, their kinds
and the partitions each owns from ``pg_locks``, without joining a group. A registry of k kinds
so takes k more entries of the server's lock table (``max_locks_per_transaction`` x
``max_connections`` entries in all, 6,400 by default).

A lease: a runner frozen with its connections open (SIGSTOP, a paused VM, a long stop-the-world
pause) still answers TCP keepalives, so its session locks would stay for ever. Every evaluation
runs queries on the lock connection, which the server stamps in ``pg_stat_activity.query_start``:
that is the runner's heartbeat, with no table and no write. Each member notes, at every evaluation,
the ``query_start`` of every other member and when (on its own monotonic clock, the one injected
into it) it first saw that value; a member whose ``query_start`` has not moved for :data:`LEASE_S`
of the observer's clock has its lock session ended by the first live member to see it
(``pg_terminate_backend``). Only differences of one runner's clock are compared, so a host clock
that disagrees with the server's moves no lease, and a test drives the lease with a manual clock;
a runner that joins a fleet waits a whole lease before it ends anyone; its locks go with it, and its
partitions are taken over, and its first-attempt claims released, as a dead runner's. When the
frozen runner wakes, its next evaluation finds its lock connection gone: it owns nothing until it
has reconnected and taken a share again, which rejoins it cleanly. The fence is the guarded commit
of every row: an outcome it commits late for a row the new owner released or fired fails its
guard and is counted as raced, never applied. Temporal fences a shard's late writes with a range
ID checked on each write; here each row's own guard already does that, so no range ID is kept.

The trade-off of ``pg_terminate_backend``: it needs the runners to share a role (or the
``pg_signal_backend`` role); where it is refused, the refusal is logged once and the frozen
runner keeps its partitions until its connection ends. And the lease must outlast the longest
time a live runner goes without an evaluation: a pass is bounded by its budget's
``max_elapsed_ms`` (10 s by default) and each claim's lock wait, so :data:`LEASE_S` is 20 s, and a
frozen runner's partitions are taken over within about 20 s plus two ``check_interval_s`` (the
observer sees a new ``query_start`` up to one interval late). A
runner that is alive but stuck in a handler (one that never returns) still runs its loop and
evaluates, so it keeps its partitions: supervise runners (a process manager's watchdog) if
handlers can hang.

Ownership makes the fleet efficient (no two runners scan and claim the same rows) and
keeps each partition in due order under one runner; it is not what makes effects
exactly-once. That stays the guarded commit on each row (see
:mod:`timerwheel_c.durable.timers.runner`): if two runners ever serve one partition for a
moment (a lock connection lost while its process carries on), a row is still claimed
by one of them and its batch effects still commit at most once.

How many partitions: as many as the entities whose timers must stay in order (a user, an
order); a fleet over the whole store divides the store's shards, whatever the number of
partitions. A fleet given a list of partitions divides that list: give it at least as many as the
most runners you will run (a runner with no partition is idle), and a few times more so that
shares stay even when runners come and go.
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, cast

import psycopg

from ..errors import StoreError, wrap_exceptions
from ..printable import printable
from ..runner_name import runner_name
from ..shards import shard_of
from ..store import CHECK_INTERVAL_S, LEASE_S, Ownership, Store, check_partition, refuse_store

if TYPE_CHECKING:  # the store's module imports this one: at run time its class is known by _check_store
    from .store import PostgresStore

__all__ = ["LEASE_S", "PartitionOwnership", "RunnerInfo", "holders", "runners"]

log = logging.getLogger("timerwheel_c.durable")

# Server-side keepalives on the lock connection: a vanished host's locks go after about
# idle + interval * count seconds instead of the OS default of hours.
_KEEPALIVE_SETTINGS = (("tcp_keepalives_idle", 5), ("tcp_keepalives_interval", 2), ("tcp_keepalives_count", 3))

# The other members of the group (%s: the members namespace) and when their lock connection (the
# session holding the membership lock) last started a query (NULL where this role may not see it).
_MEMBER_QUERIES = """
SELECT l.pid, a.query_start FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = %s::int8::oid AND l.pid <> pg_backend_pid()
"""

# The group's members and owners, with the name each session gives itself (NULL where the reading
# role may not see it): a runner's name outlives its session, a backend pid does not.
_HOLDERS = """
SELECT l.classid::int8, l.objid::int8, l.pid, a.application_name
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid IN (%s::int8::oid, %s::int8::oid)
"""


# Every advisory lock of this database held by a session that holds one in the kinds namespace
# (%s: that namespace), with what pg_stat_activity says of the session (NULL columns where the
# reading role may not see them).
_RUNNER_LOCKS = """
SELECT l.pid, l.classid::int8, l.objid::int8, a.application_name, host(a.client_addr),
       (extract(epoch FROM a.backend_start) * 1000)::int8
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2
                AND classid = %s::int8::oid)
"""


_LIVE_RUNNERS = """
SELECT count(DISTINCT pid) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 2
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND classid = %s::int8::oid AND pid <> pg_backend_pid()
"""


def live_runners(conn: psycopg.Connection, table: str) -> int:
    """How many fleet runners of the store ``table`` (as ``conn`` resolves it) hold their locks now,
    ``conn``'s own session aside: every runner holds one in the store's kinds namespace.

    Raises:
        psycopg.Error: the query failed.
    """
    row = conn.execute(_LIVE_RUNNERS, (_kinds_namespace(_where(conn, table)),)).fetchone()
    assert row is not None
    return int(row[0])


def _check_store(store: object) -> "PostgresStore":
    """``store`` if it is a PostgresStore, recognised as a store whose ``ownership_type`` is
    :class:`PartitionOwnership`: its module imports this one, so this one cannot import its class.

    Raises:
        TypeError: naming what was passed instead, its password masked.
    """
    if not (isinstance(store, Store) and getattr(type(store), "ownership_type", None) is PartitionOwnership):
        refuse_store(store, "store", "PostgresStore")
    return cast("PostgresStore", store)


def _int31(*parts: str) -> int:
    digest = hashlib.blake2b("\0".join(parts).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


def _int32(name: str) -> int:
    digest = hashlib.blake2b(name.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)


def _where(conn: psycopg.Connection, table: str) -> str:
    """``schema.table`` of ``table`` as ``conn`` resolves it: what makes the lock namespaces of one store unique."""
    row = conn.execute("SELECT current_schema()").fetchone()
    assert row is not None
    return f"{row[0]}.{table}"


def _namespaces(where: str, group: str) -> tuple:
    """The (members, owners) advisory-lock namespaces of a group: int4 keys unique to the
    schema and table (``where``) and the partitions and kinds asked for (``group``)."""
    return _int31(where, "members", group), _int31(where, "owners", group)


def _kinds_namespace(where: str) -> int:
    """The advisory-lock namespace of the kinds of every runner of the store ``where``, whatever its group."""
    return _int31(where, "kinds")


def _units(partitions: list) -> dict:
    """Partitions by the lock key that owns them (``objid`` as ``pg_locks`` shows it), in the
    order given. Two partitions whose 32-bit keys collide share one lock, so they are owned,
    counted and moved together as one unit, never left unowned."""
    units: dict = {}
    for p in partitions:
        units.setdefault(_int32(p) & 0xFFFFFFFF, []).append(p)
    return units


def _shard_unit(shard: int) -> str:
    """The unit name of a shard: NUL never appears in a partition name (check_partition), so a
    shard's unit never names a partition."""
    return f"\0shard {shard}"


def _unit_shard(unit: str) -> int:
    return int(unit.rsplit(" ", 1)[1])


def _wanted(store: "PostgresStore", partitions: Optional[list]) -> list:
    """The units a group divides: its partitions, or every shard of the store for the whole store."""
    return partitions if partitions is not None else [_shard_unit(n) for n in range(store.shard_count)]


def _group(partitions: Optional[list], kinds: Optional[list]) -> str:
    # The whole store's group divides shards: a namespace of its own, never shared with runners of a
    # version that divided its partitions.
    where = "*shards" if partitions is None else "\0".join(partitions)
    return where if kinds is None else where + "\0kinds=" + ",".join(str(k) for k in sorted(set(kinds)))


def holders(store: PostgresStore, partitions: Optional[list] = None, conn: Optional[psycopg.Connection] = None,
            kinds: Optional[list] = None) -> dict:
    """Which runner owns each partition of the group ``partitions`` (None: the whole store's group,
    which divides shards: each stored partition is then owned by its shard's owner) of runners with the registry ``kinds`` (a list of ints, as ``TimerRegistry.kinds()``) right now, read from ``pg_locks``: ``{partition: backend pid}``, for monitoring.
    Partitions of the group that no runner holds are absent. Does not join the group. ``conn``:
    a connection to reuse (e.g. from :meth:`PostgresStore.new_connection`), else one is opened
    and closed.

    Raises:
        psycopg.Error: the server cannot be reached.
    """
    _check_store(store)
    names = None if partitions is None else sorted({check_partition(p) for p in partitions})
    wanted = _wanted(store, names)
    own = conn is None
    conn = store.new_connection() if conn is None else conn
    try:
        members_ns, owners_ns = _namespaces(_where(conn, store.table), _group(names, kinds))
        rows = conn.execute(_HOLDERS, (members_ns, owners_ns)).fetchall()
    finally:
        if own:
            conn.close()
    units = _units(wanted)
    owners = {p: pid for classid, objid, pid, _ in rows if classid == owners_ns for p in units.get(objid, ())}
    if names is not None:
        return owners
    return {p: owners[_shard_unit(shard_of(p, store.shard_count))] for p in store.partitions()
            if _shard_unit(shard_of(p, store.shard_count)) in owners}


@dataclass(frozen=True)
class RunnerInfo:
    """A live fleet runner of a store, as :func:`runners` reads it from ``pg_locks``.

    ``backend_pid``: the PostgreSQL backend of its lock connection (``pg_stat_activity.pid``, not
    the runner's OS process id). ``kinds``: the sorted timer kinds (ints) of its registry.
    ``partitions``: the sorted partitions it owns now (of a list it was given). ``shards``: the sorted
    shards it owns now (serving the whole store). ``application_name``: what the runner calls
    itself (``timerwheel_c runner on HOST pid N #TOKEN``, its OS process id and a token of its own; None where the
    reading role may not see it).
    ``client_addr``: its address as the server sees it (None over a Unix socket or where hidden).
    ``since_ms``: when its lock connection opened (Unix epoch ms; None where hidden).
    """

    backend_pid: int
    kinds: tuple
    partitions: tuple
    application_name: Optional[str]
    client_addr: Optional[str]
    since_ms: Optional[int]
    shards: tuple = ()


def runners(store: PostgresStore, conn: Optional[psycopg.Connection] = None) -> list:
    """The live fleet runners of ``store`` (its schema and table) right now, as :class:`RunnerInfo`s
    sorted by backend pid: every runner whose lock connection is open, whichever group it is in.
    Runners pinned to partitions without a fleet (``fleet=False``, ``timerwheel-c run --partition``)
    take no locks and are not listed. ``conn``: a connection to reuse, else one is opened and closed.

    Raises:
        StoreError: the server cannot be reached or refused the query.
    """
    _check_store(store)
    own = conn is None
    conn = store.new_connection() if conn is None else conn
    try:
        with wrap_exceptions(psycopg.Error, store._error):
            kinds_ns = _kinds_namespace(_where(conn, store.table))
            rows = conn.execute(_RUNNER_LOCKS, (kinds_ns,)).fetchall()
        shard_units = _units(_wanted(store, None))
        # The partitions are read (every one of them: a scan of the store) only when a runner owns a
        # lock that is no shard's, one of a group given a list of partitions.
        units = _units(store.partitions()) if any(objid not in shard_units and objid != pid and classid != kinds_ns
                                                 for pid, classid, objid, *_ in rows) else {}
    finally:
        if own:
            conn.close()
    info: dict = {}  # pid -> (application_name, client_addr, since_ms)
    kinds: dict = {}  # pid -> kinds
    locks: dict = {}  # pid -> [(classid, objid)] of its other locks
    for pid, classid, objid, name, addr, since_ms in rows:
        info[pid] = (name, addr, since_ms)
        if classid == kinds_ns:
            kinds.setdefault(pid, []).append(objid)
        elif objid != pid:  # (members namespace, backend pid) is the membership lock; the rest own partitions
            locks.setdefault(pid, []).append(objid)
    out = []
    for pid in sorted(kinds):
        name, addr, since_ms = info[pid]
        held = locks.get(pid, ())
        out.append(RunnerInfo(pid, tuple(sorted(kinds[pid])), tuple(sorted(p for k in held for p in units.get(k, ()))),
                              name, addr, since_ms, tuple(sorted(_unit_shard(u) for k in held for u in shard_units.get(k, ())))))
    return out


class PartitionOwnership(Ownership):
    """The partitions this runner owns among the live runners of its group (see the module docstring).

    Args:
        store: the :class:`PostgresStore` whose partitions are divided (its DSN and table name
            the group's; the locks live on a connection of this object's own).
        partitions: the partitions to divide (non-empty strs), or None for every partition
            that holds a row, re-read at each check.
        kinds: the timer kinds this runner handles (ints), part of the group (see the module
            docstring); None for a group of its own without kinds (monitoring, tests).
        check_interval_s: seconds (> 0) between re-evaluations of the group in :meth:`owned`.
        lease_s: seconds (finite, > ``check_interval_s``) after which a member whose lock connection
            ran no query is ended (see the module docstring); None (default): :data:`LEASE_S`, or
            twice ``check_interval_s`` when that is longer.
        monotonic_ns: the clock both are read on, monotonic ns (default :func:`time.monotonic_ns`;
            the service gives its injected clock's, so a test drives the interval and the lease by hand).

    :meth:`owned` returns the sorted list of partitions owned now; :meth:`close` releases
    them all (closing the lock connection). Thread-safe.

    Raises:
        TypeError / ValueError: bad arguments, naming them.
    """

    def __init__(self, store: PostgresStore, partitions: Optional[list] = None, *, kinds: Optional[list] = None,
                 check_interval_s: float = CHECK_INTERVAL_S, lease_s: Optional[float] = None,
                 monotonic_ns: Callable[[], int] = time.monotonic_ns):
        _check_store(store)
        if isinstance(partitions, str):
            raise TypeError(f"partitions must be a list of str or None, not the str {partitions!r}")
        if isinstance(check_interval_s, bool) or not isinstance(check_interval_s, (int, float)):
            raise TypeError(f"check_interval_s must be a number of seconds, got {type(check_interval_s).__name__} {check_interval_s!r}")
        if not (math.isfinite(check_interval_s) and check_interval_s > 0):
            raise ValueError(f"check_interval_s must be finite and > 0 seconds, got {check_interval_s!r}")
        if lease_s is None:
            lease_s = max(LEASE_S, 2.0 * check_interval_s)
        if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)):
            raise TypeError(f"lease_s must be a number of seconds, got {type(lease_s).__name__} {lease_s!r}")
        if not (math.isfinite(lease_s) and lease_s > check_interval_s):
            raise ValueError(f"lease_s must be finite and > check_interval_s ({check_interval_s!r} s), got {lease_s!r}")
        if not callable(monotonic_ns):
            raise TypeError(f"monotonic_ns must be a callable returning monotonic ns, got {monotonic_ns!r}")
        self.store = store
        self.partitions = None if partitions is None else sorted({check_partition(p) for p in partitions})
        self.check_interval_s = float(check_interval_s)
        self.lease_s = float(lease_s)
        self._monotonic_ns = monotonic_ns
        self._heard: dict = {}  # another member's pid -> (its query_start, monotonic ns first seen so)
        self._terminate_refused = False  # pg_terminate_backend was refused (logged once)
        self.by_shard = self.partitions is None
        self._group = _group(self.partitions, kinds)
        self._kinds = [] if kinds is None else sorted({int(k) for k in kinds})
        # Set on connecting: the lock namespaces include the schema the table lives in.
        self._member_ns = self._owner_ns = 0
        self._lock = threading.Lock()
        self._conn: Optional[psycopg.Connection] = None
        self._pid = 0
        self._owned: list = []
        self._next_check_ns: Optional[int] = None  # monotonic ns of the next evaluation; None: at once
        # The name this runner's lock sessions give themselves, the same across reconnects, and unique
        # (two runners of one process, a test's frozen one beside a live one, are two runners).
        self._name = runner_name(os.urandom(4).hex())
        self._last_holder: dict = {}  # lock key -> (pid, name) of the session last seen holding it
        self._suspects: dict = {}  # a vanished holder's name or pid -> [monotonic ns first missed, units]
        self._taken_over: list = []
        self.members = 0

    def __repr__(self):
        which = "all shards" if self.partitions is None else f"{len(self.partitions)} partitions"
        return f"PartitionOwnership({self.store!r}, {which}, owned={len(self._owned)}, members={self.members})"

    def owned(self) -> list:
        """The partitions this runner owns, sorted (the shard numbers, ints, when :attr:`by_shard`); re-evaluated (one or two round trips) when
        ``check_interval_s`` has passed since the last evaluation, else the cached list.

        Raises:
            StoreError: the server cannot be reached (transient) or refused a query; the ownership
            is then empty (the locks may be gone) until a later call reconnects and takes a share again.
        """
        with self._lock:
            now = self._monotonic_ns()
            if self._next_check_ns is None or now >= self._next_check_ns:
                try:
                    # The service classifies store errors by the storage hierarchy alone.
                    with wrap_exceptions(psycopg.Error, self.store._error):
                        self._rebalance()
                except StoreError:
                    self._drop_connection()
                    raise
                self._next_check_ns = now + round(self.check_interval_s * 1e9)
            return list(self._owned)

    def last_owned(self) -> list:
        """The partitions owned at the last evaluation, sorted, without waiting for one: an
        evaluation holds the ownership's lock through its round trips, for as long as a server that
        does not answer keeps them waiting, and a reader such as ``/metrics`` must still answer.
        Raises nothing."""
        return list(self._owned)  # replaced whole, never changed in place: a read needs no lock

    def recheck(self) -> None:
        """Make the next :meth:`owned` re-evaluate the group at once."""
        self._next_check_ns = None

    def taken_over(self) -> list:
        """The partitions acquired since the last call from a runner that has since left the group
        (died), each reported once."""
        with self._lock:
            taken, self._taken_over = self._taken_over, []
            return taken

    def close(self) -> None:
        """Release every partition and the membership (close the lock connection)."""
        with self._lock:
            self._drop_connection()

    def _drop_connection(self) -> None:
        self._owned = []
        self._next_check_ns = None
        self._heard = {}  # a new lock session waits a whole lease before it ends anyone
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._owned = []
            conn = self.store.new_connection()
            try:
                for name, value in _KEEPALIVE_SETTINGS:
                    conn.execute(f"SET {name} = {int(value)}")
                row = conn.execute("SELECT pg_backend_pid()").fetchone()
                assert row is not None
                self._pid = row[0]
                # A new session has seen no holder die: the sessions last seen holding a lock may be
                # this runner's own earlier one (a dropped connection, a server restart) or those of
                # live runners reconnecting as well. Taken for dead runners, their rows in flight would
                # be released to fire again while their handlers run, and the outcomes lost.
                self._last_holder = {}
                where = _where(conn, self.store.table)
                self._member_ns, self._owner_ns = _namespaces(where, self._group)
                conn.execute("SELECT pg_advisory_lock(%s, %s)", (self._member_ns, self._pid))
                # For runners(): shared, so that every runner with a kind holds that kind's lock.
                conn.execute("SELECT pg_advisory_lock_shared(%s, k) FROM unnest(%s::int4[]) AS k",
                             (_kinds_namespace(where), self._kinds))
                conn.execute("SELECT set_config('application_name', %s, false)", (self._name,))
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _end_stale_members(self, conn: psycopg.Connection) -> None:
        """End the lock session of every member past its lease (see the module docstring)."""
        now = self._monotonic_ns()
        heard: dict = {}
        stale = []
        for pid, started in conn.execute(_MEMBER_QUERIES, (self._member_ns,)).fetchall():
            if started is None:  # hidden from this role: never judged
                continue
            last = self._heard.get(pid)
            heard[pid] = last if last is not None and last[0] == started else (started, now)
            if now - heard[pid][1] >= self.lease_s * 1e9:
                stale.append(pid)
        self._heard = heard
        for pid in stale:
            try:
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            except psycopg.errors.InsufficientPrivilege as exc:
                if not self._terminate_refused:
                    self._terminate_refused = True
                    log.warning("fleet: a runner (backend pid %d) made no progress for %.0f s, but this role may "
                                "not end its session (%s); its partitions stay with it until its connection ends",
                                pid, self.lease_s, printable(str(exc).strip()))
                continue
            log.warning("fleet: ended the lock session of a runner (backend pid %d) that made no progress for %.0f s; "
                        "its partitions are taken over", pid, self.lease_s)

    def _settle_suspects(self, members: list, names: dict) -> None:
        """Report as taken over (:meth:`taken_over`) the units of each vanished holder that has not come
        back (as one of ``members``, by pid or by its name in ``names``) within the grace: its runner died. One that comes
        back lost only its session (a server restart, a dropped connection), and its rows in flight are
        its own still: released, they would fire again while its handlers run, their outcomes lost.
        The grace, two check intervals, covers the evaluation in which such a runner finds its
        session gone (within one interval of its end, which this runner saw no sooner) and its
        reconnect right after; a server restart ends every session, and a new session suspects no
        one (:meth:`_connection`)."""
        if not self._suspects:
            return
        live = {names[pid] for pid in members if names.get(pid)} | set(members)
        now = self._monotonic_ns()
        for who, (since_ns, lost) in list(self._suspects.items()):
            if who in live:
                del self._suspects[who]
            elif now - since_ns >= 2 * self.check_interval_s * 1e9:
                del self._suspects[who]
                self._taken_over += lost

    def _rebalance(self) -> None:
        conn = self._connection()
        self._end_stale_members(conn)
        if self.by_shard:  # a reshard since the last look (or under way as the store opened) changes the units
            self.store.adopt_shard_count(conn)
        wanted = _wanted(self.store, self.partitions)
        units = _units(wanted)
        named = _unit_shard if self.by_shard else str
        order = list(units)
        members: list = []
        holder: dict = {}
        names: dict = {}  # a session's pid -> the name it gives itself (None: hidden from this role)
        for classid, objid, pid, name in conn.execute(_HOLDERS, (self._member_ns, self._owner_ns)).fetchall():
            names[pid] = name
            if classid == self._member_ns:
                members.append(objid)
            else:
                holder[objid] = pid
        members.sort()
        self.members = len(members)
        mine = [k for k in order if holder.get(k) == self._pid]
        # Locks on partitions no longer wanted (emptied) are released too.
        stale = [k for k, pid in holder.items() if pid == self._pid and k not in units]
        # U units over N members: everyone gets U // N, and the first U % N members in pid
        # order one more, so the shares add up to U exactly and no member is left with none
        # while another holds two more than it.
        rank = members.index(self._pid) if self._pid in members else len(members)
        base, extra = divmod(len(order), max(1, len(members)))
        fair = base + (rank < extra)
        release = stale + mine[fair:]
        mine = mine[:fair]
        if release:
            conn.execute("SELECT pg_advisory_unlock(%s, k) FROM unnest(%s::int4[]) AS k",
                         (self._owner_ns, [_signed32(k) for k in release]))
        if len(mine) < fair:
            start = rank * len(order) // max(1, len(members))
            free = [k for k in order[start:] + order[:start] if k not in holder][: fair - len(mine)]
            if free:
                rows = conn.execute("SELECT k, pg_try_advisory_lock(%s, k) FROM unnest(%s::int4[]) AS k",
                                    (self._owner_ns, [_signed32(k) for k in free])).fetchall()
                got = {k & 0xFFFFFFFF for k, ok in rows if ok}
                mine += [k for k in free if k in got]
                for k in free:
                    last = self._last_holder.get(k)
                    if k in got and last is not None and last[0] != self._pid:
                        # Its session is gone; whether its runner is, the grace tells (_settle_suspects).
                        suspect = self._suspects.setdefault(last[1] or last[0], [self._monotonic_ns(), []])
                        suspect[1] += [named(u) for u in units[k]]
        self._settle_suspects(members, names)
        for k, pid in holder.items():
            self._last_holder[k] = (pid, names.get(pid))
        for k in mine:
            self._last_holder[k] = (self._pid, self._name)
        before = self._owned
        self._owned = sorted(named(u) for k in mine for u in units[k])
        if self._owned != before:
            log.info("fleet: this runner owns %d of %d %s (%d runners): %s", len(self._owned), len(wanted),
                     "shards" if self.by_shard else "partitions", len(members), self._owned)


def _signed32(k: int) -> int:
    return k - (1 << 32) if k >= 1 << 31 else k

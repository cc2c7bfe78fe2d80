"""The store contract: an ordered key-value store of bytes, split into partitions.

A partition is named by a non-empty str and is the unit of atomicity, ordering and
ownership: a :class:`Batch` applies to one partition, all or nothing, after its guards
(:class:`Equals`, :class:`Absent`) hold; a runner fires one partition's timers in due
order; and in a fleet each partition is served by one runner at a time (see
:mod:`timerwheel_c.durable.storage.postgres.ownership`). The guarded batch is the compare-and-set that
makes durable timers fire their batch effects at most once (the guarded-write shape of
etcd transactions and FoundationDB's read-conflict checks).

Every backend (:class:`timerwheel_c.durable.storage.sqlite.SQLiteStore`,
:class:`timerwheel_c.durable.storage.postgres.PostgresStore`) implements the ``_scan``, ``_get``,
``_apply`` (and optionally ``_apply_many``) hooks of :class:`Store`, whose public methods
validate their arguments once, and passes the one contract suite in
``tests/durable/storage/test_durable_store.py``.
"""
from __future__ import annotations

import abc
import contextlib
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ContextManager, NoReturn, Optional, Union, cast

from .errors import PermanentStoreError, PicklesItsArguments
from .redact import redact
from .shards import check_shard_count, check_shards
from .watch import GENERIC_POLL_S, ChangeHub, PollingWatcher, Watcher

if TYPE_CHECKING:
    from .savepoint import Joined

__all__ = [
    "CHECK_INTERVAL_S",
    "COMMITTED",
    "LEASE_S",
    "MAX_KEY_BYTES",
    "MAX_PARTITION_BYTES",
    "MAX_VALUE_BYTES",
    "SHARD_SPACE",
    "Absent",
    "Batch",
    "Committed",
    "Equals",
    "Guard",
    "KeyPattern",
    "NoStoreError",
    "Ownership",
    "Page",
    "PartitionCalls",
    "PreconditionFailed",
    "Refused",
    "RowConsume",
    "RowMove",
    "SchemaError",
    "SchemaVersionError",
    "Store",
    "check_bytes",
    "check_lock_wait_ms",
    "check_wait_ms",
    "check_partition",
    "check_readable_version",
    "check_store",
    "consumed_index",
    "consumed_write",
    "read_in_turn",
    "refuse_store",
    "through",
]


# The longest key and partition name a store holds, in bytes (UTF-8 for the name), the same on
# every backend and checked once, when a row is written (Batch.put, check_partition): a PostgreSQL
# btree index entry holds at most 2,704 bytes (a third of an 8 kB page), and the primary key
# (partition, key) is such an entry: 8 bytes of tuple header, 4 + 256 and 4 + 2,048 bytes of
# values with their length words and alignment make at most 2,328 bytes, so any row that can be
# written can be indexed, and rewritten under another key of the same length, on every backend.
MAX_KEY_BYTES = 2048
MAX_PARTITION_BYTES = 256
# The largest value a row holds, in bytes, checked when it is written (Batch.put): a runner reads
# rows a page at a time, and a driver holds a value several times over while it decodes it (one
# value of 100 MB took about 950 MB of a runner's memory on PostgreSQL), so a value the store
# accepts must stay small next to a process's memory. 1 MiB, Kafka's default message.max.bytes.
MAX_VALUE_BYTES = 1 << 20
# The key range ``(start, end)`` of the rows that passes read by shard (:meth:`Store.scan_shards`):
# the timer layer's parked rows through its timer rows (timers/keys.py). A backend may index by shard
# only these, so that names and applications' rows write no index entry; a read by shard of a range
# outside it is still answered, by a scan.
SHARD_SPACE = (b"\x00P", b"\x00U")

def check_bytes(name: str, value: object) -> bytes:
    """Return ``value`` if it is bytes, else raise TypeError naming ``name`` and the value."""
    if not isinstance(value, bytes):
        raise TypeError(f"{name} must be bytes, got {type(value).__name__} {value!r}")
    return value


# The largest scan limit passed to a backend (which reads limit + 1 rows as an int64).
MAX_SCAN_LIMIT = 1 << 62
# The longest wait for a lock a backend is told, in ms: a C int on both, SQLite's busy timeout
# (sqlite3_busy_timeout, which wrapped 2**31 ms to 0: no wait at all) and PostgreSQL's lock_timeout
# (INT_MAX ms, about 24.8 days; the server refuses more).
MAX_WAIT_MS = 2**31 - 1


def check_wait_ms(name: str, value: object, least: int) -> int:
    """``value``, the wait for a lock named ``name``, checked: an int from ``least`` to :data:`MAX_WAIT_MS` (ms).

    Raises:
        TypeError: not an int; ValueError: out of that range; each naming ``name`` and the value.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int (ms), got {type(value).__name__} {value!r}")
    if not least <= value <= MAX_WAIT_MS:
        raise ValueError(f"{name} must be {least}..{MAX_WAIT_MS} (ms), got {value}")
    return value


def check_lock_wait_ms(lock_wait_ms: object) -> Optional[int]:
    """``lock_wait_ms`` of :meth:`Store.open_sibling`, checked: None or an int from 1 to :data:`MAX_WAIT_MS` (ms).

    Raises:
        TypeError / ValueError: naming the value.
    """
    return None if lock_wait_ms is None else check_wait_ms("lock_wait_ms", lock_wait_ms, 1)


def check_partition(partition: object) -> str:
    """Return ``partition`` if it is a non-empty str that every backend can store: encodable
    as UTF-8, at most :data:`MAX_PARTITION_BYTES` (256) bytes so encoded, and free of NUL, which
    PostgreSQL's text type refuses (TypeError / ValueError otherwise), so a name is valid on
    SQLite exactly when it is valid on PostgreSQL."""
    if not isinstance(partition, str):
        raise TypeError(f"partition must be a str, got {type(partition).__name__} {partition!r}")
    if not partition:
        raise ValueError("partition must be a non-empty str, got ''")
    if "\x00" in partition:
        raise ValueError(f"partition must not contain NUL, got {partition!r}")
    try:
        size = len(partition.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"partition must be encodable as UTF-8 (no lone surrogates), got {partition!r}") from None
    if size > MAX_PARTITION_BYTES:
        raise ValueError(f"partition must be at most {MAX_PARTITION_BYTES} bytes in UTF-8, got {size} bytes "
                         f"starting {partition[:32]!r}")
    return partition


class SchemaError(PermanentStoreError):
    """The database holds something under this store's names that this version cannot use: tables
    another program made, or a schema version that is not an integer. Nothing was written."""


def schema_version_of(where: str, value: object) -> int:
    """The schema version recorded as ``value`` (the meta table's text) in ``where``, as an int.

    Raises:
        SchemaError: ``value`` is not the decimal text of an integer >= 1, naming it.
    """
    text = str(value)
    if not (text.isascii() and text.isdigit() and int(text) >= 1):
        raise SchemaError(f"{where} records schema_version {value!r}, which is not a version number (an "
                          "integer >= 1): the meta table was edited or not made by timerwheel_c")
    return int(text)


class NoStoreError(SchemaError):
    """A read-only open, or one with ``create=False``, found no timerwheel_c store in the database (a
    typo'd database or path, or one no runner has used yet); nothing was created in it."""


def check_readable_version(where: str, found: Optional[int], supported: int) -> None:
    """Check, for an open that runs no DDL (read-only, or ``create=False``), the schema version ``found`` in ``where`` (None: the store's
    table is missing; 0: a store from before the version row) against ``supported``: a read-only
    open never creates or upgrades a schema, so it reads only the version it knows.

    Raises:
        NoStoreError: ``found`` is None ("no timerwheel_c store here").
        SchemaVersionError: ``found`` is newer than ``supported``.
        SchemaError: ``found`` is older: a runner (``timerwheel-c run``, or any store opened with
            ``create=True``) upgrades it first.
    """
    if found is None:
        raise NoStoreError(f"no timerwheel_c store here: {where} does not exist (this command never creates it)")
    if found > supported:
        raise SchemaVersionError(where, found, supported)
    if found < supported:
        raise SchemaError(f"{where} has store schema version {found}, older than the version {supported} of this "
                          "timerwheel_c: a runner upgrades it (timerwheel-c run, or a store opened with create=True); "
                          "this command never does")


class SchemaVersionError(PicklesItsArguments, SchemaError, RuntimeError):
    """The database holds a store schema newer than this version of timerwheel_c understands.

    ``found`` and ``supported`` are the two schema versions (ints); the message names both.
    """

    def __init__(self, where: str, found: int, supported: int):
        super().__init__(
            f"{where} has store schema version {found}, newer than the version {supported} this "
            f"timerwheel_c supports; upgrade timerwheel_c to open it")
        self.found = found
        self.supported = supported
        self._arguments = ((where, found, supported), {})


@dataclass(frozen=True)
class KeyPattern:
    """Keys that start with ``prefix`` and, when ``at`` is not None, hold the byte ``byte`` at index
    ``at`` (0-based): how a layer above says which writes the change signal must follow
    (:meth:`Store.signal_writes`) without the store knowing its key layout.

    Raises:
        TypeError / ValueError: a non-bytes prefix, ``at`` without ``byte`` or outside 0..MAX_KEY_BYTES-1,
            ``byte`` outside 0..255.
    """

    prefix: bytes
    at: Optional[int] = None
    byte: Optional[int] = None

    def __post_init__(self):
        check_bytes("KeyPattern.prefix", self.prefix)
        if (self.at is None) != (self.byte is None):
            raise ValueError(f"KeyPattern needs both at and byte, or neither; got at={self.at!r}, byte={self.byte!r}")
        if self.at is not None and not (isinstance(self.at, int) and 0 <= self.at < MAX_KEY_BYTES):
            raise ValueError(f"KeyPattern.at must be an index 0..{MAX_KEY_BYTES - 1}, got {self.at!r}")
        if self.byte is not None and not (isinstance(self.byte, int) and 0 <= self.byte <= 255):
            raise ValueError(f"KeyPattern.byte must be 0..255, got {self.byte!r}")

    def matches(self, key: bytes) -> bool:
        """True when ``key`` is one of the keys this pattern describes."""
        return key.startswith(self.prefix) and (self.at is None or (len(key) > self.at and key[self.at] == self.byte))


# Guards are built for every fired timer (its outcome's guard on its claimed row): each checks its
# fields inline in an __init__ of its own (which the dataclass keeps), one Python call where the
# generated __init__, a __post_init__ and a check_bytes per field made four.
_set = object.__setattr__


@dataclass(frozen=True)
class Equals:
    """Guard: ``key`` is present and holds exactly ``value``.

    Raises:
        TypeError: a key or value that is not bytes, naming it.
    """

    key: bytes
    value: bytes

    def __init__(self, key: bytes, value: bytes):
        if not isinstance(key, bytes):
            check_bytes("Equals.key", key)
        if not isinstance(value, bytes):
            check_bytes("Equals.value", value)
        _set(self, "key", key)
        _set(self, "value", value)


_new = object.__new__


def equals_read(key: bytes, value: bytes) -> Equals:
    """``Equals(key, value)`` for a row the caller read or built, both bytes already (a claim's due
    row and the claimed row its outcome consumes, once per fired timer): its fields set as its
    ``__init__`` sets them, without the checks, which cost a Python call of their own per guard."""
    guard = _new(Equals)
    _set(guard, "key", key)
    _set(guard, "value", value)
    return guard


@dataclass(frozen=True)
class Absent:
    """Guard: ``key`` is not present.

    Raises:
        TypeError: a key that is not bytes, naming it.
    """

    key: bytes

    def __init__(self, key: bytes):
        if not isinstance(key, bytes):
            check_bytes("Absent.key", key)
        _set(self, "key", key)


Guard = Union[Equals, Absent]


@dataclass
class Batch:
    """Guards and writes applied together by :meth:`Store.apply`, all or nothing.

    Built by chaining: ``Batch().require(Absent(k)).put(k, v).delete(old)``. Writes apply
    in the order given (a later write to the same key wins). ``guards`` and ``writes``
    (``(key, value)`` pairs, ``value`` None for a delete) are read by the backends.
    """

    guards: list = field(default_factory=list)
    writes: list = field(default_factory=list)

    def require(self, guard: Guard) -> "Batch":
        """Add a guard (TypeError unless :class:`Equals` or :class:`Absent`); returns self."""
        if not isinstance(guard, (Equals, Absent)):
            raise TypeError(f"a guard must be Equals or Absent, got {type(guard).__name__} {guard!r}")
        self.guards.append(guard)
        return self

    def put(self, key: bytes, value: bytes) -> "Batch":
        """Write ``value`` at ``key`` (both bytes, the key at most :data:`MAX_KEY_BYTES`, the value at
        most :data:`MAX_VALUE_BYTES`); returns self.

        Raises:
            TypeError: a non-bytes key or value.
            ValueError: a key longer than :data:`MAX_KEY_BYTES`, or a value longer than :data:`MAX_VALUE_BYTES`.
        """
        # The type checks inline (check_bytes only to raise): a handler's outcome puts once per fire.
        if not isinstance(key, bytes):
            check_bytes("key", key)
        if not isinstance(value, bytes):
            check_bytes("value", value)
        if len(key) > MAX_KEY_BYTES:
            raise ValueError(f"key must be at most {MAX_KEY_BYTES} bytes, got {len(key)} bytes starting {key[:16]!r}")
        if len(value) > MAX_VALUE_BYTES:
            raise ValueError(f"a value must be at most {MAX_VALUE_BYTES:,} bytes, got {len(value):,} bytes "
                             f"for the key starting {key[:16]!r}")
        self.writes.append((key, value))
        return self

    def delete(self, key: bytes) -> "Batch":
        """Remove ``key`` (no error if absent); returns self."""
        if not isinstance(key, bytes):
            check_bytes("key", key)
        self.writes.append((key, None))
        return self

    def extend(self, other: "Batch") -> "Batch":
        """Append ``other``'s guards and writes to this batch; returns self."""
        if not isinstance(other, Batch):
            raise TypeError(f"expected a Batch, got {type(other).__name__} {other!r}")
        self.guards.extend(other.guards)
        self.writes.extend(other.writes)
        return self


class RowConsume(Batch):
    """A batch that consumes one row its maker read: guarded on ``Equals(key, value)`` alone, its
    ``writes`` (a subclass's list or property) delete ``key`` once and write other keys (a runner's
    outcome of a fired timer: the claimed row's delete, the handler's own writes, the timer's identity
    row's delete). ``guards`` is built from the two fields at each read, so that a backend may write
    the batch from them and the writes (PostgreSQL's set-based statement does), and so that a batch
    waiting in flight, one per row by the thousand, holds no guard and no list of guards: tracked
    containers the cyclic collector's passes would count and promote. A list whose batches break the
    shape (``key`` not deleted, or written twice) is still written right, by a backend's general path.

    Raises:
        TypeError: on ``require``, ``put``, ``delete`` or ``extend``: the guard is the fields', and a
            change to lists built for one read would be lost.
    """

    key: bytes
    value: bytes

    @property
    def guards(self) -> list:  # type: ignore[override]  # read-only in place of Batch's field
        return [equals_read(self.key, self.value)]

    def _read_only(self, *args: object) -> Batch:
        raise TypeError(f"a {type(self).__name__} is read-only: its guard is its consumed row's")

    require = put = delete = extend = _read_only  # type: ignore[assignment]


class RowMove(RowConsume):
    """The move of one row its maker read (a runner's claim of a timer's first attempt, once per fired
    timer): guarded on ``Equals(key, value)``, it deletes ``key`` and puts ``value`` at ``to``, another
    key of the same partition; a subclass sets the three fields (bytes), and ``writes`` is built from
    them at each read. A backend may apply it from the fields alone: PostgreSQL's set-based statement
    moves the row with one ``UPDATE`` of its key.

    Raises:
        TypeError: as :class:`RowConsume`'s.
    """

    to: bytes

    @property
    def writes(self) -> list:  # type: ignore[override]  # read-only in place of Batch's field
        return [(self.key, None), (self.to, self.value)]


@dataclass(frozen=True)
class Committed:
    """:meth:`Store.apply` wrote the whole batch."""


#: The :class:`Committed` the backends return, one for every batch: it holds nothing, so one shared
#: instance spares the cyclic collector an object per committed batch.
COMMITTED = Committed()


@dataclass(frozen=True)
class PreconditionFailed:
    """:meth:`Store.apply` wrote nothing because the guard on ``key`` did not hold."""

    key: bytes


@dataclass(frozen=True)
class Refused:
    """One batch of :meth:`Store.apply_many` that the store refused for a reason of its own (a value
    it cannot hold, a full disk): that batch failed alone and wrote nothing; the others in the call
    were judged and applied as if it were absent. ``error`` is a :class:`~.errors.StoreError`."""

    error: Exception


@dataclass(frozen=True)
class Page:
    """One page of :meth:`Store.scan`.

    ``entries``: ``(key, value)`` pairs in key order. ``next``: the key to pass as
    ``after`` for the following page, or None when the range is exhausted.
    """

    entries: list
    next: Optional[bytes]

    @classmethod
    def from_rows(cls, rows: list, limit: int) -> "Page":
        """The page for up to ``limit + 1`` ``(key, value)`` rows of bytes a backend read in key order
        (psycopg and sqlite3 load bytea and BLOB as bytes, so rows are taken as they are): the
        extra row, if present, only says that more follow (so ``next`` is never a dead end)."""
        entries = rows[:limit]
        return cls(entries, entries[-1][0] if len(rows) > limit else None)


CHECK_INTERVAL_S = 1.0  # the default longest time between two evaluations of a runner's ownership, s
LEASE_S = 20.0  # the default lease of a fleet runner that ran no ownership query (postgres/ownership.py), s


class Ownership(abc.ABC):
    """The partitions one runner owns among the live runners sharing a store
    (:class:`timerwheel_c.durable.storage.postgres.ownership.PartitionOwnership` on PostgreSQL)."""

    check_interval_s: float
    #: True when the units owned are the store's shards (:meth:`Store.scan_shards`): :meth:`owned`,
    #: :meth:`last_owned` and :meth:`taken_over` then give shard numbers (ints), not partitions.
    by_shard: bool = False

    @abc.abstractmethod
    def owned(self) -> list:
        """The partitions this runner serves now, sorted; call it before each pass."""

    @abc.abstractmethod
    def last_owned(self) -> list:
        """The partitions :meth:`owned` returned last, sorted, without waiting for the store (for
        readers off the service's thread, such as metrics)."""

    @abc.abstractmethod
    def recheck(self) -> None:
        """Make the next :meth:`owned` re-evaluate at once (e.g. a new partition was written)."""

    def taken_over(self) -> list:
        """The partitions acquired from an owner that died since the last call (each reported once)."""
        return []

    @abc.abstractmethod
    def close(self) -> None:
        """Give up every partition."""


class Store(abc.ABC):
    """An ordered bytes key-value store split into partitions (the durable-timer contract).

    Implementations must be safe to call from several threads, and ``apply`` must be
    atomic and serializable against every other ``apply`` on the same partition,
    including from other processes sharing the backing database.
    Every failure of the backend itself is raised as a :class:`~.errors.StoreError`:
    :class:`~.errors.TransientStoreError` (a locked database, a lost connection: worth retrying)
    or :class:`~.errors.PermanentStoreError` (a full disk, a value the server refuses), with the
    driver's exception as ``__cause__``; no driver exception crosses this interface.

    The public methods validate their arguments, then call the backend's hooks
    (``_scan``, ``_get``, ``_apply``, ``_apply_many``, ``_partitions``) with checked values.
    """

    def scan(self, partition: str, start: bytes, end: bytes, after: Optional[bytes] = None, limit: int = 64) -> Page:
        """Entries with ``start <= key < end`` and ``key > after``, in key order, at most ``limit`` (>= 1).

        Raises:
            TypeError: non-str partition, non-bytes bounds, non-int limit.
            ValueError: empty partition, ``limit < 1``.
        """
        return self._scan(*_checked_scan(partition, start, end, after, limit))

    def get(self, partition: str, key: bytes) -> Optional[bytes]:
        """The value at ``key``, or None.

        Raises:
            TypeError / ValueError: a bad partition, a non-bytes key.
        """
        return self._get(check_partition(partition), check_bytes("key", key))

    def get_through(self, partition: str, key: bytes) -> tuple:
        """``(value, target)``: the value at ``key`` (or None), and the value of the row of ``partition``
        whose key that value is (None when there is no such row, or no value), read at one instant: a
        write that moves both rows (a pointer row and the row it names, as a timer's name and its row)
        commits before the read or after it, never between its two halves.

        Raises:
            TypeError / ValueError: a bad partition, a non-bytes key.
        """
        return self._get_through(check_partition(partition), check_bytes("key", key))

    def apply(self, partition: str, batch: Batch) -> Union[Committed, PreconditionFailed]:
        """Check ``batch``'s guards and, if all hold, apply its writes atomically.

        Guards are judged against the partition as it was before the batch, in order; then the
        writes apply in order. Returns :class:`Committed`, or :class:`PreconditionFailed` naming
        the first guard (in ``batch.guards`` order) that failed, in which case nothing was written.

        Raises:
            TypeError / ValueError: a bad partition, a non-Batch.
            TransientStoreError / PermanentStoreError: the backend failed; nothing was written, but
                for a connection lost while the commit was on its way (PostgreSQL): the server may
                have committed it, and no client can tell (see :mod:`.errors`).
        """
        return self._apply(check_partition(partition), _check_batch(batch))

    def apply_many(self, partition: str, batches: list) -> list:
        """Apply each of ``batches`` as :meth:`apply` would, each guarded on its own; return
        one :class:`Committed`, :class:`PreconditionFailed` or :class:`Refused` per batch, in order.

        One failed guard fails only its own batch, and so does a batch the backend refuses (a
        :class:`~.errors.PermanentStoreError` while applying it: a value over a server limit):
        it is :class:`Refused` and writes nothing, and the other batches are judged and applied
        as if it were absent. The batches apply in order, so a later batch sees the writes of the
        earlier committed ones. The generic ``_apply_many`` calls ``_apply`` once per batch; a
        backend overrides it to do the whole list in one round trip (one transaction) with the
        same per-batch results: this is how the runner claims, and commits the outcomes of, many
        timers per round trip.

        Raises:
            TypeError / ValueError: a bad partition, a non-list ``batches`` or a non-Batch in it.
            TransientStoreError: the call as a whole failed (a lost connection, a locked
                database); batches before the failing one may have committed (the generic
                version) or none did (a one-transaction override).
            PermanentStoreError: the call as a whole failed for a reason not tied to one batch
                (the commit itself hit a full disk), with the same caveat.
        """
        check_partition(partition)
        if not isinstance(batches, list):
            raise TypeError(f"batches must be a list of Batch, got {type(batches).__name__} {batches!r}")
        for batch in batches:
            _check_batch(batch)
        return self._apply_many(partition, batches) if batches else []

    def scan_many(self, requests: list) -> list:
        """One :meth:`scan` per request, a backend may answer them all in one round trip: ``requests``
        is a list of ``(partition, start, end, after, limit)`` tuples (``after`` may be None), and the
        result one :class:`Page` per request, in order. How a runner reads every owned partition's
        due rows (or next due time) at once instead of a round trip per partition.

        Raises:
            TypeError / ValueError: as :meth:`scan`, for the first bad request; a non-list.
        """
        if not isinstance(requests, list):
            raise TypeError(f"requests must be a list of (partition, start, end, after, limit), got {requests!r}")
        checked = []
        for request in requests:
            if not isinstance(request, tuple) or len(request) != 5:
                raise TypeError(f"a scan request must be (partition, start, end, after, limit), got {request!r}")
            checked.append(_checked_scan(*request))
        return self._scan_many(checked) if checked else []

    #: The number of shards of this store (see :mod:`.shards`), fixed when the store was created and
    #: recorded in it; a backend without shards of its own has one, which holds every partition.
    shard_count: int = 1

    def scan_shards(self, shards: list, start: bytes, end: bytes, limit: Union[int, list]) -> list:
        """The rows with ``start <= key < end`` of every partition of each of ``shards``: one list per
        shard, in the order given, of at most ``limit`` ``(partition, key, value)`` triples in key order
        (ties by partition name) across the shard's partitions. How a runner reads the due rows, or the
        next due time, of any number of partitions with one index range scan per shard (one round trip
        for them all on PostgreSQL): a pass then costs O(shards), never O(partitions). A list shorter
        than its limit holds every such row of its shard. ``limit``: one for every shard, or a list of
        one per shard (a pass reads the shards its room reaches further than the others).

        Raises:
            TypeError / ValueError: ``shards`` is not a list of distinct ints in 0..:attr:`shard_count` - 1,
                or ``start``, ``end``, ``limit`` (or a limit of the list, whose length is not the number
                of shards) as :meth:`scan` takes them, naming the value.
        """
        check_shards(shards, self.shard_count)
        # scan's checks of the range, with a placeholder partition, and of each limit.
        _, start, end, _, _ = _checked_scan("-", start, end, None, 1)
        if isinstance(limit, list):
            if len(limit) != len(shards):
                raise ValueError(f"limit must hold one limit per shard ({len(shards)}), got {len(limit)}")
            limit = [_checked_limit(n) for n in limit]
        else:
            limit = _checked_limit(limit)
        return self._scan_shards(shards, start, end, limit) if shards else []

    def scan_every_shard(self, start: bytes, end: bytes, limit: int) -> list:
        """:meth:`scan_shards` of every shard by the count recorded in the store now
        (:meth:`refresh_shard_count`): one list per shard, shard 0 first. How a read of the whole
        store sees every row after another process resharded it, where this object's
        :attr:`shard_count` would name only some shards.

        Raises:
            TypeError / ValueError: ``start``, ``end``, ``limit`` as :meth:`scan` takes them.
            StoreError: the backend failed.
        """
        return self.scan_shards(list(range(self.refresh_shard_count())), start, end, limit)

    def refresh_shard_count(self) -> int:
        """The shard count recorded in the store now, kept as :attr:`shard_count`: another process's
        :meth:`reshard` changes it. A runner serving the store by shard calls it now and then, so that
        it reads the shards of the new count. One read; a backend without shards of its own has one.

        Raises:
            StoreError: the backend failed.
        """
        return self.shard_count

    def reshard(self, shard_count: int) -> None:
        """Change the store's number of shards to ``shard_count`` (1..4096): every row's shard is
        recomputed and the new count recorded, in one transaction under the schema lock. Stop every
        runner of the store first: a runner owns and reads shards by number. PostgreSQL refuses while
        fleet runners hold the store's locks, and computes each row's shard on the server, so a store
        object opened before writes rows to the right shard (and each of its writes runs at the
        recorded count, reading it again when it changed, so it locks shards as a store opened
        after does); SQLite writes each row by the count
        recorded when it writes, and a runner reads the new count from its next pass (on PostgreSQL,
        from its ownership's next evaluation: see :meth:`refresh_shard_count`).

        Raises:
            TypeError / ValueError: a bad ``shard_count``, naming it.
            NotImplementedError: a backend without shards of its own.
            RuntimeError: PostgreSQL: fleet runners of the store are running; nothing changed.
            StoreError: the backend failed; nothing changed.
        """
        check_shard_count(shard_count)
        self._reshard(shard_count)
        self.shard_count = shard_count

    def apply_across(self, items: list) -> list:
        """:meth:`apply_many` over batches of any partitions: ``items`` is a list of ``(partition,
        batch)`` pairs; returns one :class:`Committed`, :class:`PreconditionFailed` or
        :class:`Refused` per item, in order. The batches of one partition apply in their order, as
        :meth:`apply_many` applies them; batches of different partitions never see each other. A
        backend may do the whole list in one round trip and one transaction (one commit for the
        outcomes of every partition), as PostgreSQL does; the generic version calls
        :meth:`apply_many` once per partition, in the order of their first item.

        Raises:
            TypeError / ValueError: a non-list, an item that is not a (partition, Batch) pair.
            TransientStoreError / PermanentStoreError: as :meth:`apply_many`, for the call as a whole:
                the generic version may have committed the partitions before the failing one.
        """
        if not isinstance(items, list):
            raise TypeError(f"items must be a list of (partition, Batch), got {type(items).__name__} {items!r}")
        checked: set = set()  # partitions: a list holds many batches of few
        for item in items:
            if not isinstance(item, tuple) or len(item) != 2:
                raise TypeError(f"an item must be a (partition, Batch) pair, got {item!r}")
            if not (isinstance(item[0], str) and item[0] in checked):
                checked.add(check_partition(item[0]))
            if not isinstance(item[1], Batch):  # inline: a runner passes each claim and each outcome here
                _check_batch(item[1])
        return self._apply_across(items) if items else []

    def watch(self, callback: Callable[[], None]) -> Watcher:
        """Start the store's change signal: ``callback()`` (no argument, on the watcher's thread)
        runs after any committed write of a key the timer layer asked to be signalled (see
        :meth:`signal_writes`), from this process or another, and possibly after other writes too.
        Returns a :class:`Watcher`; close it.

        Every watcher of one store shares one detector (one ``LISTEN`` connection on PostgreSQL),
        started by the first and stopped with the last (:class:`~.watch.ChangeHub`).

        Raises:
            StoreError: the detector could not be started.
        """
        hub = self.__dict__.get("_change_hub")
        if hub is None:
            hub = self.__dict__.setdefault("_change_hub", ChangeHub(self._watch))
        return hub.add(callback)

    def signal_writes(self, patterns: list) -> None:
        """Declare which writes the change signal must follow: a put of a key matching one of
        ``patterns`` (:class:`KeyPattern`). Until some process declares them, every put signals;
        afterwards a backend may leave other writes unsignalled (PostgreSQL does: its trigger is
        rebuilt from them, once per database). Idempotent; the layers above hand their key layout
        down as this data, so the store itself knows nothing of it.

        Raises:
            TypeError: ``patterns`` is not a list of KeyPattern.
            StoreError: the backend failed.
        """
        if not isinstance(patterns, list) or not all([isinstance(p, KeyPattern) for p in patterns]):
            raise TypeError(f"patterns must be a list of KeyPattern, got {patterns!r}")
        self._signal_writes(patterns)

    def partitions(self) -> list:
        """Names of the partitions that hold at least one key, sorted."""
        return self._partitions()

    def record_labels(self, labels: dict) -> dict:
        """Record each of ``labels`` (``{name: text}``, str to str: the layers above name things with
        them, e.g. ``"kind:1" -> "send-reminder"``) that has no text recorded yet, atomically across
        every process sharing the store, and return the text now recorded for each of those names
        (the one given, or the one another writer recorded first).

        Raises:
            TypeError: not a dict of str to str.
            StoreError: the backend failed.
        """
        if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise TypeError(f"labels must be a dict of str to str, got {labels!r}")
        return self._record_labels(labels) if labels else {}

    def labels(self, prefix: str = "") -> dict:
        """``{name: text}`` of every recorded label whose name starts with ``prefix``."""
        return self._labels(prefix)

    #: True for a backend whose :meth:`scan_many` and :meth:`apply_across` take one round trip for
    #: any number of partitions (PostgreSQL): a caller then reads and claims many partitions at once.
    #: False (the generic versions): one call per partition, so reading ahead saves nothing.
    reads_many_at_once: bool = False

    #: The :class:`Ownership` type that divides this backend's partitions among runners, called as
    #: ``ownership_type(store, partitions, **kwargs)``, set by the backend's own class beside its SQL
    #: (PostgresStore's: :mod:`.postgres.ownership`). None: the backend has no way to divide the work.
    ownership_type: Optional[Callable[..., "Ownership"]] = None

    def ownership(self, partitions: Optional[list] = None, **kwargs) -> Optional["Ownership"]:
        """An :class:`Ownership` dividing ``partitions`` (None: every partition of the store) among
        the runners that share this store and ask for the same ones, or None when this backend
        has no way to (SQLite stays correct with several runners, each commit guarded, but does
        not divide the work). ``kwargs`` go to :attr:`ownership_type`.
        """
        return None if self.ownership_type is None else self.ownership_type(self, partitions, **kwargs)

    def own_write(self, partition: str) -> ContextManager[Any]:
        """A writer's reads and batches of ``partition`` on the store's own connection: a context
        manager yielding an object whose ``get(key)`` (bytes or None), ``get_through(key)`` (a pair: see
        :meth:`get_through`), ``scan(start, end, limit)``
        (a list of ``(key, value)`` in key order) and ``apply(batch)`` (:class:`Committed` or
        :class:`PreconditionFailed`) act as the store's own :meth:`get`, :meth:`get_through`,
        :meth:`scan` and :meth:`apply`. The default reads outside any transaction and commits each apply on its own,
        the guards judging what was read; a backend whose transactions cost less than the reads'
        own overrides it to hold them all in one (SQLite), committed when the block ends, rolled
        back when it raises.

        Raises:
            TypeError / ValueError: a bad partition.
        """
        return contextlib.nullcontext(PartitionCalls(self, check_partition(partition)))

    def joined(self, conn: Any, partition: str) -> "Joined":
        """The write to ``partition`` through the caller's own sync connection ``conn``, inside its
        open transaction (:mod:`.joined` gives the contract), its state checked now; a backend that
        takes callers' connections overrides it.

        Raises:
            TypeError: this store takes no caller's connection (the default), or ``conn`` is of the
                wrong type for it (named by its type, never its repr, which may hold a DSN).
            ValueError: ``conn`` cannot join a transaction now (a backend's own reasons).
        """
        raise TypeError(f"conn= needs a SQLiteStore or a PostgresStore, got the store {self!r}")

    def ajoined(self, conn: Any, partition: str) -> Any:
        """:meth:`joined` for asyncio code: an async context manager whose ``get`` and ``apply`` are
        coroutine functions, over the caller's connection ``conn`` as the backend takes it.

        Raises:
            TypeError / ValueError: as :meth:`joined`.
        """
        raise TypeError(f"conn= needs a SQLiteStore or a PostgresStore, got the store {self!r}")

    def clock_ns(self) -> Optional[int]:
        """The store server's wall clock now, Unix epoch ns, for runners on many hosts to agree on
        what is due; None for a store without a server of its own (SQLite: its runners share a host,
        and its clock). One round trip where there is a server.

        Raises:
            StoreError: the server cannot be reached.
        """
        return None

    def open_sibling(self, *, lock_wait_ms: Optional[int] = None) -> Optional["Store"]:
        """A second handle on this store's data over a connection of its own, so that two threads
        write at once (the service commits outcomes on one while it claims on the other), or None
        for a backend whose writes cannot overlap (SQLite takes one writer at a time, so a second
        connection would only wait). The caller closes it; closing it leaves this store open.

        ``lock_wait_ms`` (int from 1 to :data:`MAX_WAIT_MS`, or None: no bound): the longest the sibling's calls wait for a
        lock another transaction holds (a partition's, a row's), in ms; past it a call raises
        :class:`~.errors.TransientStoreError` with nothing written, so that its caller retries that
        partition later while the others go on (the service's claims and commits).

        Raises:
            TypeError / ValueError: ``lock_wait_ms`` is not None or an int from 1 to :data:`MAX_WAIT_MS`.
        """
        check_lock_wait_ms(lock_wait_ms)
        return None

    def close(self) -> None:  # noqa: B027 -- optional: a backend without resources keeps this no-op
        """Release the backend's resources; the store is unusable afterwards."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- backend hooks: arguments arrive checked -----------------------------------------
    @abc.abstractmethod
    def _scan(self, partition: str, start: bytes, end: bytes, after: Optional[bytes], limit: int) -> Page:
        """:meth:`scan` with checked arguments; ``after`` is None or ``>= start``."""

    @abc.abstractmethod
    def _get(self, partition: str, key: bytes) -> Optional[bytes]:
        """:meth:`get` with checked arguments."""

    @abc.abstractmethod
    def _apply(self, partition: str, batch: Batch) -> Union[Committed, PreconditionFailed]:
        """:meth:`apply` with checked arguments."""

    def _get_through(self, partition: str, key: bytes) -> tuple:
        """:meth:`get_through` with checked arguments. This default reads the two rows in turn, which
        holds for a store whose writes and reads never interleave (one in memory behind a lock); a
        backend whose writes can commit between two reads overrides it with one statement."""
        return read_in_turn(functools.partial(self._get, partition), key)

    def _apply_many(self, partition: str, batches: list) -> list:
        """:meth:`apply_many` with checked arguments (a non-empty list): the generic fallback,
        one ``_apply`` per batch, a :class:`PermanentStoreError` from one being its :class:`Refused`."""
        results: list = []
        for batch in batches:
            try:
                results.append(self._apply(partition, batch))
            except PermanentStoreError as exc:
                results.append(Refused(exc))
        return results

    def _scan_many(self, requests: list) -> list:
        """:meth:`scan_many` with checked requests (a non-empty list, each as :meth:`_scan` takes it):
        the generic version, one ``_scan`` per request."""
        return [self._scan(*request) for request in requests]

    def _scan_shards(self, shards: list, start: bytes, end: bytes, limit: Union[int, list]) -> list:
        """:meth:`scan_shards` with checked arguments (a non-empty list of shards; ``limit`` an int, or a
        list of one per shard): the generic version for a store of one shard, one :meth:`scan` per
        partition, merged (a backend with a shard column reads each shard with one index range scan
        instead)."""
        n = limit[0] if isinstance(limit, list) else limit
        rows = sorted((key, partition, value) for partition in self._partitions()
                      for key, value in self._scan(partition, start, end, None, n).entries)[:n]
        return [[(partition, key, value) for key, partition, value in rows]]

    def _reshard(self, shard_count: int) -> None:
        """:meth:`reshard` with a checked count."""
        raise NotImplementedError(f"{type(self).__name__} has no shards of its own to change")

    def _apply_across(self, items: list) -> list:
        """:meth:`apply_across` with checked items (a non-empty list): the generic version, one
        ``_apply_many`` per partition, in the order of their first item."""
        positions: dict = {}  # partition -> indexes of its items
        for i, (partition, _) in enumerate(items):
            positions.setdefault(partition, []).append(i)
        results: list = [None] * len(items)
        for partition, indexes in positions.items():
            for i, result in zip(indexes, self._apply_many(partition, [items[i][1] for i in indexes])):
                results[i] = result
        return results

    @abc.abstractmethod
    def _partitions(self) -> list:
        """:meth:`partitions`."""

    def _watch(self, callback: Callable[[], None]) -> Watcher:
        """Start this store's one change detector, calling ``callback()`` on each change. This generic
        version calls back every second (:class:`PollingWatcher`); a backend overrides it with a real
        detector (see :mod:`~.watch`)."""
        return PollingWatcher(lambda: True, callback, GENERIC_POLL_S)

    def _record_labels(self, labels: dict) -> dict:
        """:meth:`record_labels`; this generic version keeps them in this store object only (a backend
        with a table of its own records them there, for every process)."""
        recorded = self.__dict__.setdefault("_labels_here", {})
        return {name: recorded.setdefault(name, text) for name, text in labels.items()}

    def _labels(self, prefix: str) -> dict:
        """:meth:`labels`; see :meth:`_record_labels`."""
        return {k: v for k, v in self.__dict__.get("_labels_here", {}).items() if k.startswith(prefix)}

    def _signal_writes(self, patterns: list) -> None:  # noqa: B027 -- a detector that sees every write needs none
        """:meth:`signal_writes` with checked patterns; the default keeps signalling every write."""


def read_in_turn(get: Callable[[bytes], Optional[bytes]], key: bytes) -> tuple:
    """:meth:`Store.get_through`'s pair read with ``get`` in two reads, one after the other: for a
    store or a connection that has no one-statement read of its own."""
    value = get(key)
    return value, (None if value is None else get(value))


def through(row: Optional[tuple]) -> tuple:
    """The pair :meth:`Store.get_through` returns, from the row ``(value, target)`` of a backend's one
    statement (None: no row at the key), as bytes or None."""
    if row is None:
        return None, None
    return bytes(row[0]), None if row[1] is None else bytes(row[1])


class PartitionCalls:
    """A writer's calls on one partition (what :meth:`Store.own_write` yields by default), each the
    store's own public one: each read outside any transaction, each apply committed on its own."""

    __slots__ = ("_store", "_partition")

    def __init__(self, store: Store, partition: str):
        self._store = store
        self._partition = partition

    def get(self, key: bytes) -> Optional[bytes]:
        return self._store.get(self._partition, key)

    def get_through(self, key: bytes) -> tuple:
        return self._store.get_through(self._partition, key)

    def scan(self, start: bytes, end: bytes, limit: int) -> list:
        return self._store.scan(self._partition, start, end, limit=limit).entries

    def apply(self, batch: Batch) -> Union[Committed, PreconditionFailed]:
        return self._store.apply(self._partition, batch)


def consumed_write(batch: Batch) -> int:
    """The index in ``batch.writes`` of the write that the batch's last guard performs itself, or -1.

    When the last guard is ``Equals(K, V)`` and the first write to K is its delete, one conditional
    delete (``DELETE ... WHERE key = K AND value = V``) both checks that guard and does that write:
    every claim and every Done of the runner has this shape, so it costs one statement instead of
    two. Only the last guard qualifies: nothing is checked after it, so a failing guard never has
    a done delete to undo. Every backend applies exactly this rule, so the guards mean the same
    everywhere (the shared contract suite holds them to it)."""
    return consumed_index(batch.guards, batch.writes)


def consumed_index(guards: list, writes: list) -> int:
    """:func:`consumed_write` of the batch whose ``guards`` and ``writes`` the caller has read already
    (a batch may build them at each read: a runner's first claims and bare outcomes do)."""
    if not guards or not isinstance(guards[-1], Equals):
        return -1
    key = guards[-1].key
    for i, (k, v) in enumerate(writes):
        if k == key:
            return i if v is None else -1
    return -1


def check_store(store: object, name: str = "store", kind: Optional[type] = None) -> Store:
    """Return ``store`` if it is a :class:`Store` (and an instance of ``kind``, when given).

    Raises:
        TypeError: naming ``name`` and what was passed instead, its password masked (a DSN or URL
            passed where a store goes is the usual mistake: the message says to open it first).
    """
    if kind is None and type(store) in _STORE_TYPES:  # a type seen to pass before (an ABC's check costs more)
        return cast(Store, store)
    want = kind or Store
    if isinstance(store, want):
        if kind is None:
            _STORE_TYPES.add(type(store))
        return cast(Store, store)
    refuse_store(store, name, want.__name__)


# The types whose instances check_store found to be stores: a subclass of Store (or one registered as a
# virtual subclass, which ABCMeta never unregisters) stays one, so its instances pass again without
# ABCMeta.__instancecheck__, a Python-level call on every by-name write.
_STORE_TYPES: set = set()


def refuse_store(store: object, name: str, want: str) -> NoReturn:
    """Raise the TypeError of :func:`check_store` for ``store``, passed as ``name`` where a ``want``
    (a class name) goes."""
    if isinstance(store, str):
        raise TypeError(f"{name} must be a {want}, got the str {redact(store, store)!r}; "
                        "open a store URL with open_store() and pass the store")
    raise TypeError(f"{name} must be a {want}, got {type(store).__name__} {redact(repr(store))}")


def _checked_scan(partition, start, end, after, limit) -> tuple:
    """The arguments of :meth:`Store.scan`, checked, as its backend hook takes them."""
    check_partition(partition)
    check_bytes("start", start)
    check_bytes("end", end)
    if after is not None:
        check_bytes("after", after)
    limit = _checked_limit(limit)
    # An ``after`` below ``start`` never widens the range.
    return partition, start, end, after if after is not None and after >= start else None, limit


def _checked_limit(limit) -> int:
    """A scan's row limit, checked, capped: any limit beyond 2**62 means "every row" alike, and
    capped it fits the backends' int64."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, got {type(limit).__name__} {limit!r}")
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    return min(limit, MAX_SCAN_LIMIT)


def _check_batch(batch: object) -> Batch:
    if not isinstance(batch, Batch):
        raise TypeError(f"batch must be a Batch, got {type(batch).__name__} {batch!r}")
    return batch

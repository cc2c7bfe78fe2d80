"""The statements of a read and of a guarded write inside an open transaction, on the store's own
connection (:mod:`.store`) or on a cursor of a caller's connection (:mod:`.joined`), so that both
judge guards and write rows the same way.
"""
from __future__ import annotations

import sqlite3
from typing import Callable, Optional, Union

from ..shards import MAX_SHARD_COUNT
from ..sqlfiles import queries
from ..errors import wrap_exceptions
from ..store import COMMITTED, Absent, Batch, Committed, PreconditionFailed, consumed_index, through

__all__ = ["COPIED_VALUE_BYTES", "QUERIES", "OnCursor", "apply_batch", "first_in_shards", "has_puts", "occupied_shards", "read_through",
           "read_value", "shard_count_of"]

# The put statement's bound on a recorded shard count is the contract's (storage/shards.py).
QUERIES = {name: sql.replace("{max_shard_count}", str(MAX_SHARD_COUNT)) for name, sql in queries("sqlite").items()}
# sqlite3 binds a bytearray as the same BLOB as bytes, but takes a bytes parameter through its
# adaptation protocol first (a registry lookup, and on CPython 3.11 an AttributeError made and cleared:
# about 0.3 us per parameter), which a bytearray skips. The statements of reads and writes bind their
# keys, and values of at most this many bytes, as bytearray copies (about 0.05 us each at these
# sizes): a tenth less CPU per fired timer; a longer value is bound as it is, its copy costing more.
COPIED_VALUE_BYTES = 4096


def _bound_value(value: bytes) -> Union[bytes, bytearray]:
    """``value`` as a statement binds it: a bytearray copy of at most :data:`COPIED_VALUE_BYTES`
    bytes, else ``value`` itself."""
    return bytearray(value) if len(value) <= COPIED_VALUE_BYTES else value

def read_value(db: Union[sqlite3.Connection, sqlite3.Cursor], partition: str, key: bytes) -> Optional[bytes]:
    """The value at ``key`` read on ``db`` (the store's connection, or a cursor of a caller's
    connection inside its own transaction: :mod:`.joined`), or None."""
    row = db.execute(QUERIES["get"], (partition, bytearray(key))).fetchone()
    return None if row is None else bytes(row[0])


def read_through(db: Union[sqlite3.Connection, sqlite3.Cursor], partition: str, key: bytes) -> tuple:
    """``(value, target)`` of :meth:`~.store.Store.get_through`, read on ``db`` as :func:`read_value` reads."""
    return through(db.execute(QUERIES["get_through"], (partition, bytearray(key))).fetchone())


_IN_LIST = 500  # keys per "key IN (...)" read: under SQLite's oldest bound of 999 parameters


def _present(db: Union[sqlite3.Connection, sqlite3.Cursor], partition: str, wanted: list) -> set:
    """Those of the keys ``wanted`` that hold a row of ``partition``, read :data:`_IN_LIST` at a time."""
    found: set = set()
    for i in range(0, len(wanted), _IN_LIST):
        part = wanted[i:i + _IN_LIST]
        query = QUERIES["present"].replace("{keys}", ",".join("?" * len(part)))
        found.update(bytes(row[0]) for row in db.execute(query, (partition, *map(bytearray, part))))
    return found


def _per_shard(db: Union[sqlite3.Connection, sqlite3.Cursor], name: str, shards: list, start: bytearray,
               end: bytearray) -> list:
    """The rows of the statement ``name`` over ``shards`` and the range ``start <= key < end`` (bound
    as given: see :data:`COPIED_VALUE_BYTES`), :data:`_IN_LIST` shards per statement."""
    found: list = []
    for i in range(0, len(shards), _IN_LIST):
        part = shards[i:i + _IN_LIST]
        found += db.execute(QUERIES[name].replace("{shards}", ",".join(["(?)"] * len(part))),
                            (*part, start, end))
    return found


def occupied_shards(db: Union[sqlite3.Connection, sqlite3.Cursor], shards: list, start: bytearray,
                    end: bytearray) -> set:
    """Those of ``shards`` that hold a row with ``start <= key < end``."""
    return {row[0] for row in _per_shard(db, "occupied_shards", shards, start, end)}


def first_in_shards(db: Union[sqlite3.Connection, sqlite3.Cursor], shards: list, start: bytearray,
                    end: bytearray) -> dict:
    """``{shard: (partition, key, value)}``: the first row with ``start <= key < end`` of each of
    ``shards`` that holds one, in (key, partition) order, as a scan of the shard with limit 1 reads it."""
    return {shard: (partition, key, value) for shard, partition, key, value in
            _per_shard(db, "first_in_shards", shards, start, end)}


def has_puts(batch: Batch) -> bool:
    """Whether ``batch`` writes a row (not only deletes): only then does its write need the shard count."""
    for _, value in batch.writes:
        if value is not None:
            return True
    return False


def shard_count_of(value: object) -> Optional[int]:
    """The shard count the meta table's ``value`` records, as the ``put`` statement reads it (digits
    only, no leading zero, 1..:data:`~..shards.MAX_SHARD_COUNT`), or None for any other value (None
    included): a write then takes the count inside ``put`` itself, which refuses it as before."""
    if (isinstance(value, str) and 0 < len(value) <= 4 and value.isascii() and value.isdigit()
            and value[0] != "0" and int(value) <= MAX_SHARD_COUNT):
        return int(value)
    return None


# shard_count_of of the texts read so far that are shard counts (at most MAX_SHARD_COUNT of them): a
# write on the store's own connection reads the text with every first read (get_through_counted).
_COUNTS: dict = {}


def _count_of(text: object) -> Optional[int]:
    """:func:`shard_count_of`, remembered for the texts that are counts."""
    count = _COUNTS.get(text) if type(text) is str else None
    if count is None:
        count = shard_count_of(text)
        if count is not None:
            _COUNTS[text] = count
    return count


def apply_batch(db: Union[sqlite3.Connection, sqlite3.Cursor], partition: str, batch: Batch, hashed: int,
                read: Optional[dict] = None, shard_count: Optional[int] = None) -> Optional[bytes]:
    """Check ``batch``'s guards and write it inside ``db``'s open transaction; return the key of
    the first failed guard (nothing written: the guards are all judged before the first write), or
    None once written. The last guard may be checked by its own delete
    (:func:`~.store.consumed_write`, the rule every backend follows). The store's own
    :meth:`~.store.SQLiteStore.apply` and a write through a caller's connection (:mod:`.joined`) share it.

    A large batch (many timers written at once) costs a statement per row, not three: its Absent
    guards are read a few hundred keys per statement and each run of puts, and each run of deletes,
    is one ``executemany``.
    ``hashed``: the partition's :func:`~.shards.partition_hash`, from which every put records its shard.
    ``shard_count``: the count recorded now, when the caller knows it inside this transaction (the
    store's own connection: :meth:`~.store.SQLiteStore._shard_count_for_writes`), so that each put
    binds its shard; None: each put takes the count in its own statement (a caller's connection).
    ``read``: ``{key: value or None}`` of rows already read in this transaction while it held the
    file's write lock, so that no other connection can have changed them: a guard on one of them is
    judged on that value, without a statement, the last one too (its row's delete is then a plain
    delete, in one ``executemany`` with the batch's other deletes beside it: a re-arm by name deletes
    its timer's row and its trace context's in one call). Judged before any write, as the consumed
    guard would be at its delete, the batch's first write to that key: the outcome is the same."""
    guards, writes = batch.guards, batch.writes  # each read once: a batch may build them at each read
    if read is not None and guards and guards[-1].key in read:
        consumed, checked = -1, guards
    else:
        consumed = consumed_index(guards, writes)
        checked = guards[:-1] if consumed >= 0 else guards
    present = None
    if len(checked) > 1:
        absent = [guard.key for guard in checked if isinstance(guard, Absent)
                  and (read is None or guard.key not in read)]
        if len(absent) > 1:
            present = _present(db, partition, absent)
    for guard in checked:
        key = guard.key
        if read is not None and key in read:
            value = read[key]
        elif present is not None and isinstance(guard, Absent):
            if key in present:
                return key
            continue
        else:
            value = read_value(db, partition, key)
        if not (value is None if isinstance(guard, Absent) else value == guard.value):
            return key
    if consumed >= 0:
        last = guards[-1]
        if db.execute(QUERIES["delete_if"], (partition, bytearray(last.key), _bound_value(last.value))).rowcount != 1:
            return last.key
    put, shard = (QUERIES["put"], hashed) if shard_count is None else (QUERIES["put_in_shard"], hashed % shard_count)
    run: list = []  # the parameters of a run of puts, or of deletes, written by one call
    puts = False
    for i, (key, value) in enumerate(writes):
        if i == consumed:
            continue
        if (value is not None) is not puts and run:
            _write_run(db, put if puts else _DELETE, run)
            run = []
        if value is None:
            puts = False
            run.append((partition, bytearray(key)))
        else:
            puts = True
            run.append((partition, bytearray(key), _bound_value(value), shard))
    if run:
        _write_run(db, put if puts else _DELETE, run)
    return None


_DELETE = QUERIES["delete"]


def _write_run(db: Union[sqlite3.Connection, sqlite3.Cursor], statement: str, run: list) -> None:
    """``statement`` once per parameters of ``run``: one ``execute`` for one row, else one ``executemany``."""
    if len(run) == 1:
        db.execute(statement, run[0])
    else:
        db.executemany(statement, run)


_GET_THROUGH_COUNTED = QUERIES["get_through_counted"]


class OnCursor:
    """A write's reads and batches of one partition on ``cursor``, inside a transaction its owner
    opened and ends: the caller's (:class:`~.joined.SQLiteJoined`) or the store's own
    (:meth:`~.store.SQLiteStore.own_write`). ``hashed``: the partition's hash; ``wrap`` turns sqlite3 errors
    into the store's. ``locked``: the transaction holds the file's write lock from its first
    statement (``BEGIN IMMEDIATE``), so that a row read stays as read until this cursor writes, and
    a guard on it needs no second read (a re-arm by name reads its identity row once, not twice)."""

    def __init__(self, cursor: sqlite3.Cursor, partition: str, hashed: int, wrap: wrap_exceptions,
                 locked: bool = False, shard_count: Optional[Callable[[], Optional[int]]] = None,
                 schema_version: Optional[Callable[[object], None]] = None):
        self._cursor = cursor
        self._partition = partition
        self._hashed = hashed
        self._wrap = wrap
        self._read: Optional[dict] = {} if locked else None
        # The store's own transaction: the shard count its puts bind, asked at the first batch that puts
        # unless a get_through read it already (_counted; _count None: no count recorded, the puts then
        # take it in their own statement, which refuses them).
        self._shard_count = shard_count
        # With shard_count: checks the recorded schema version's text that get_through_counted reads.
        self._schema_version = schema_version
        self._counted = False
        self._count: Optional[int] = None

    def get(self, key: bytes) -> Optional[bytes]:
        with self._wrap:
            value = read_value(self._cursor, self._partition, key)
        if self._read is not None:
            self._read[key] = value
        return value

    def get_through(self, key: bytes) -> tuple:
        with self._wrap:
            if self._shard_count is not None and not self._counted:  # the count too, in one statement
                row = self._cursor.execute(_GET_THROUGH_COUNTED, (self._partition, bytearray(key))).fetchone()
                if row is not None:
                    if self._schema_version is not None:
                        self._schema_version(row[3])
                    self._counted, self._count = True, _count_of(row[2])
                    row = None if row[0] is None else row[:2]
                else:  # no count recorded: the first put reads the meta table again, and is refused
                    row = self._cursor.execute(QUERIES["get_through"], (self._partition, bytearray(key))).fetchone()
            else:
                row = self._cursor.execute(QUERIES["get_through"], (self._partition, bytearray(key))).fetchone()
            value, target = through(row)
        if self._read is not None:
            self._read[key] = value
            if value is not None:
                self._read[value] = target
        return value, target

    def scan(self, start: bytes, end: bytes, limit: int) -> list:
        with self._wrap:
            rows = self._cursor.execute(QUERIES["scan_from"], (self._partition, bytearray(start), bytearray(end),
                                                                limit)).fetchall()
        return [(bytes(key), bytes(value)) for key, value in rows]

    def apply(self, batch: Batch) -> Union[Committed, PreconditionFailed]:
        with self._wrap:
            if self._shard_count is None:
                count = None
            elif self._counted:
                count = self._count
            else:
                count = self._shard_count() if has_puts(batch) else None
            failed = apply_batch(self._cursor, self._partition, batch, self._hashed, self._read, count)
        if failed is None and self._read:
            self._read.clear()  # the batch wrote: what was read may be stale now
        return COMMITTED if failed is None else PreconditionFailed(failed)

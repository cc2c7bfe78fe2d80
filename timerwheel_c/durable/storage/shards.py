"""Shards: the fixed set of scan and ownership units a store's partitions map onto.

A store has ``shard_count`` shards, chosen when the store is created and recorded in its meta table
(:data:`DEFAULT_SHARD_COUNT` unless the creator chose another). Every partition lies in exactly one
shard, :func:`shard_of`, so a partition's rows are read, claimed and owned together and its order and
batch atomicity are kept; a runner's pass reads each shard's due rows in key (due) order across all of
its partitions with one index range scan, so the pass costs the same with a million partitions as
with one (Temporal maps workflows onto a fixed number of history shards the same way).

The hash is MD5 of the partition name's UTF-8, its first four bytes big-endian, modulo the shard
count: stable across processes, hosts and versions (never Python's salted ``hash()``), and
computable in SQL, which PostgreSQL's generated ``shard`` column does
(``postgres/sql/0008_shards.sql``) with the same result. MD5 here spreads names; it guards nothing.
"""
from __future__ import annotations

import functools
import hashlib

from .errors import is_transient

__all__ = ["DEFAULT_SHARD_COUNT", "MAX_SHARD_COUNT", "check_shard_count", "check_shards", "partition_hash", "shard_of",
           "shard_wide"]

# 64: enough for a fleet of dozens of runners to each own one or more shards, few enough that a
# pass over idle shards (one index probe each) costs well under a millisecond and that the advisory
# locks a runner holds stay far below PostgreSQL's default lock table (64 x max_connections entries).
DEFAULT_SHARD_COUNT = 64
MAX_SHARD_COUNT = 4096


def check_shard_count(shard_count: object) -> int:
    """``shard_count`` if it is an int in 1..:data:`MAX_SHARD_COUNT`.

    Raises:
        TypeError / ValueError: naming the value.
    """
    if isinstance(shard_count, bool) or not isinstance(shard_count, int):
        raise TypeError(f"shard_count must be an int, got {type(shard_count).__name__} {shard_count!r}")
    if not 1 <= shard_count <= MAX_SHARD_COUNT:
        raise ValueError(f"shard_count must be 1..{MAX_SHARD_COUNT}, got {shard_count}")
    return shard_count


def check_shards(shards: object, shard_count: int) -> list:
    """``shards`` as a list of distinct ints in ``0..shard_count - 1``, in the order given.

    Raises:
        TypeError / ValueError: a non-list, a non-int, a shard out of range or given twice, naming it.
    """
    if not isinstance(shards, list):
        raise TypeError(f"shards must be a list of ints, got {type(shards).__name__} {shards!r}")
    seen: set = set()
    for shard in shards:
        if isinstance(shard, bool) or not isinstance(shard, int):
            raise TypeError(f"a shard must be an int, got {type(shard).__name__} {shard!r}")
        if not 0 <= shard < shard_count:
            raise ValueError(f"shard {shard} is out of range: this store has shards 0..{shard_count - 1}")
        if shard in seen:
            raise ValueError(f"shard {shard} is given twice")
        seen.add(shard)
    return shards


# Kept per partition: a writer or a runner meets the same partitions again and again, and an MD5 per
# write costs more than the lookup (4096 entries of a few hundred bytes each at most).
@functools.lru_cache(maxsize=4096)
def partition_hash(partition: str) -> int:
    """The hash (0..2**32 - 1) of the partition named ``partition`` (a checked name) that its shard is
    taken from, under any shard count: the first four bytes of MD5, big-endian."""
    return int.from_bytes(hashlib.md5(partition.encode("utf-8"), usedforsecurity=False).digest()[:4], "big")


def shard_of(partition: str, shard_count: int) -> int:
    """The shard (0..``shard_count`` - 1) of the partition named ``partition`` (a checked name)."""
    return partition_hash(partition) % shard_count


def shard_wide(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a write to one partition, is taken as its whole shard's: a transient
    error (:func:`~.errors.is_transient`), nearly always a lock wait past the store's bound, and the lock
    a write waits on that long is its shard's (a writer's open transaction holds it; every write to the
    shard takes it). So a claim hands it to the shard's other partitions with no round trip each, and a
    runner's pass backs the shard off as one, rather than each partition waiting the bound out in turn."""
    return is_transient(exc)

"""The partition of a timer whose writer leaves it out: derived from the timer's reference.

A partition orders and groups a timer with others (its batch commits within one partition, and a
partition's timers fire in due order); a writer with no such grouping in mind may pass None. The
timer's partition is then ``"ref:"`` followed by the hex of the first 8 bytes of the BLAKE2b hash of
its reference: stable across processes, hosts and versions, the same for every kind, so the timers
of one reference (an entity's id) share a partition and keep their order, and the same rule finds
the timer again (:func:`~.writer.get_timer`, :func:`~.writer.cancel`, :func:`~.writer.reschedule`
with None). Partitions cost nothing, being only scanned by shard (:mod:`..storage.shards`), so one
per reference is as cheap as one in all. Two references sharing a partition by a hash collision
(one chance in 2**64 per pair) only share its order.
"""
from __future__ import annotations

import hashlib
from typing import Optional

__all__ = ["PREFIX", "partition_of"]

PREFIX = "ref:"


def partition_of(partition: Optional[str], reference: object) -> str:
    """``partition`` when it is not None (checked later, where every partition is); for None, the
    partition derived from ``reference`` (see the module docstring).

    Raises:
        TypeError: ``partition`` is None and ``reference`` is not bytes, naming it.
    """
    if partition is not None:
        return partition
    if not isinstance(reference, bytes):
        raise TypeError(f"reference must be bytes, got {type(reference).__name__} {reference!r}")
    return PREFIX + hashlib.blake2b(reference, digest_size=8).hexdigest()

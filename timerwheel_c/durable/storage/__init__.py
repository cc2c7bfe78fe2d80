"""The storage layer: an ordered key-value store of bytes split into partitions, its backends
(SQLite, PostgreSQL), the change signal that wakes runners, and redaction of store URLs.

It knows nothing of timers: the layers above it (:mod:`..timers`, :mod:`..service`) give the
keys their meaning.
"""

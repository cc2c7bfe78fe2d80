"""The storage layer: an ordered key-value store of bytes split into partitions, its backends
(SQLite, PostgreSQL), the change signal that wakes runners, and redaction of store URLs.

It knows nothing of timers: the layers above it (:mod:`..timers`, :mod:`..service`) give the
keys their meaning.

Each backend is a folder of its own, holding all it needs (driver, SQL, pool, writes in a caller's
transaction, ownership, change signal): :mod:`.sqlite` and :mod:`.postgres`; no module outside a
backend's folder imports a driver. The modules beside them are neutral: the contract (:mod:`.store`), errors,
shards, row upgrades, redaction, the SQL file reader, the change hub, savepoints, the contract of
writes in a caller's transaction (:mod:`.joined`), and :mod:`.open`, which opens the backend a URL
names.
"""

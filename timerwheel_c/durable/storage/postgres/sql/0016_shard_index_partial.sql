-- Version 16 (SQLite's version 14 did the same to its own index): the index by shard {shard_index} keeps
-- only the rows passes read by shard, SHARD_SPACE in storage/store.py (the parked rows through the timer
-- rows), so that a name's rows (a timer's identity row, its last error, its trace context) and an
-- application's rows are written without an entry in it: a handler's effect row, and a timer scheduled
-- by name, write one b-tree entry fewer (about 2 us of server CPU each, a quarter of the index entries
-- a fired timer wrote). A statement uses this index only when its WHERE implies the index's terms,
-- which queries.sql's scan_shards spells out; a read by shard of a range outside SHARD_SPACE is
-- answered by one scan of the table (scan_shards_elsewhere). Reshard runs this again after version 8.
DROP INDEX IF EXISTS {shard_index};
CREATE INDEX {shard_index} ON {t} (shard, key, partition) WHERE key >= '\x0050'::bytea AND key < '\x0055'::bytea;

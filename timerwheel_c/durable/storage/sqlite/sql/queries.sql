-- The statements of SQLiteStore, one per "-- name:" section.

-- name: create_meta
CREATE TABLE IF NOT EXISTS timerwheel_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)

-- name: schema_version
SELECT value FROM timerwheel_meta WHERE name = 'schema_version'

-- name: set_schema_version
INSERT OR REPLACE INTO timerwheel_meta (name, value) VALUES ('schema_version', ?)

-- name: scan_from
SELECT key, value FROM timerwheel_kv WHERE partition = ? AND key >= ? AND key < ? ORDER BY key LIMIT ?

-- name: scan_after
SELECT key, value FROM timerwheel_kv WHERE partition = ? AND key > ? AND key < ? ORDER BY key LIMIT ?

-- name: get
SELECT value FROM timerwheel_kv WHERE partition = ? AND key = ?

-- name: get_through
-- A row and the row of its partition whose key is its value, in one statement: one snapshot, so a
-- commit that moves both lands wholly before or wholly after the read (Store.get_through).
SELECT i.value, t.value FROM timerwheel_kv AS i LEFT JOIN timerwheel_kv AS t ON t.partition = i.partition
  AND t.key = i.value
WHERE i.partition = ? AND i.key = ?

-- name: get_through_counted
-- get_through inside the store's own write transaction, with the shard count and the schema version
-- recorded now (the meta table's texts, as write_meta reads them) in the same statement, so that the
-- puts that follow bind their shards by it with no statement of their own (PRAGMA data_version, or the
-- meta table), and a write under a schema a newer timerwheel_c upgraded meanwhile is refused: a re-arm
-- by name costs one statement fewer. One row whenever the meta table records a count, whether the key has
-- a row or not; none without a count.
SELECT i.value, t.value, m.value, v.value FROM timerwheel_meta AS m
  LEFT JOIN timerwheel_meta AS v ON v.name = 'schema_version'
  LEFT JOIN timerwheel_kv AS i ON i.partition = ? AND i.key = ?
  LEFT JOIN timerwheel_kv AS t ON t.partition = i.partition AND t.key = i.value
WHERE m.name = 'shard_count'

-- name: present
-- Which of many keys hold a row: {keys} is filled with one "?" per key.
SELECT key FROM timerwheel_kv WHERE partition = ? AND key IN ({keys})

-- name: put
-- An upsert, not INSERT OR REPLACE: that deletes a stored row and inserts it again, in the shard
-- index too, where setting the value leaves that index alone (a row's shard follows from its
-- partition, part of the primary key, so it never changes here). The fourth value is the partition's
-- hash (storage/shards.py), and its shard is taken under the count recorded now, by this statement:
-- another process's reshard, committed before this write began, is never missed (a row written by
-- the count this connection read before would lie in a shard no pass reads), and no statement of its
-- own reads the count first. A recorded count that is not a shard count (1..{max_shard_count}, digits
-- only: an edited or damaged meta table) makes the shard NULL, which the column refuses
-- (sqlite/errors.py names it), rather than a row in a shard no pass reads.
INSERT INTO timerwheel_kv (partition, key, value, shard)
  VALUES (?, ?, ?, ? % (SELECT CAST(value AS INTEGER) FROM timerwheel_meta WHERE name = 'shard_count'
    AND value GLOB '[1-9]*' AND value NOT GLOB '*[^0-9]*' AND length(value) <= 4
    AND CAST(value AS INTEGER) <= {max_shard_count}))
  ON CONFLICT (partition, key) DO UPDATE SET value = excluded.value

-- name: put_in_shard
-- The put of a write on the store's own connection, which knows the shard count recorded now (read in
-- this transaction, or before it when no other connection has committed since: PRAGMA data_version):
-- its shard is bound as a value, where put reads the meta table again for each row it writes.
INSERT INTO timerwheel_kv (partition, key, value, shard) VALUES (?, ?, ?, ?)
  ON CONFLICT (partition, key) DO UPDATE SET value = excluded.value

-- name: delete
DELETE FROM timerwheel_kv WHERE partition = ? AND key = ?

-- name: delete_if
-- A guard Equals(key, value) and the delete of key in one statement (see store.consumed_write).
DELETE FROM timerwheel_kv WHERE partition = ? AND key = ? AND value = ?

-- name: partitions
-- A loose index scan: one probe of the primary key per partition (a few microseconds each), so a
-- pass costs the same with 1M stored rows as with 1k; SELECT DISTINCT would walk every row.
WITH RECURSIVE p(name) AS (
  SELECT (SELECT partition FROM timerwheel_kv ORDER BY partition LIMIT 1)
  UNION ALL
  SELECT (SELECT partition FROM timerwheel_kv WHERE partition > p.name ORDER BY partition LIMIT 1)
  FROM p WHERE p.name IS NOT NULL)
SELECT name FROM p WHERE name IS NOT NULL

-- name: all_rows
SELECT partition, key, value FROM timerwheel_kv ORDER BY partition, key

-- The reads by shard of a range within SHARD_SPACE (storage/store.py) repeat the terms of the partial
-- index timerwheel_kv_shard (0014_shard_index_partial.sql), which SQLite uses only then.

-- name: scan_shard
-- One index range scan of (shard, key, partition): a shard's rows in key order across its partitions.
SELECT partition, key, value FROM timerwheel_kv WHERE shard = ? AND key >= ? AND key < ?
  AND substr(key, 1, 2) >= x'0050' AND substr(key, 1, 2) < x'0055'
  ORDER BY key, partition LIMIT ?

-- name: scan_shard_elsewhere
-- The same read of a range outside SHARD_SPACE, which no index serves: a scan of the table.
SELECT partition, key, value FROM timerwheel_kv WHERE shard = ? AND key >= ? AND key < ?
  ORDER BY key, partition LIMIT ?

-- name: occupied_shards
-- Which of the shards in {shards} (one "(?)" per shard) hold a row with lo <= key < hi: an index
-- probe of (shard, key, partition) per shard, all inside one statement, so that a pass over many
-- idle shards costs one statement rather than one per shard.
SELECT s.column1 FROM (VALUES {shards}) AS s
WHERE EXISTS (SELECT 1 FROM timerwheel_kv WHERE shard = s.column1 AND key >= ? AND key < ?
  AND substr(key, 1, 2) >= x'0050' AND substr(key, 1, 2) < x'0055')

-- name: first_in_shards
-- The first row (in key order, then partition) with lo <= key < hi of each of the shards in {shards}
-- (one "(?)" per shard) that holds one: a correlated index probe of (shard, key, partition) per
-- shard, and its row by primary key, all inside one statement.
SELECT s.column1, t.partition, t.key, t.value FROM (VALUES {shards}) AS s
JOIN timerwheel_kv AS t ON t.shard = s.column1 AND (t.key, t.partition) = (
  SELECT key, partition FROM timerwheel_kv WHERE shard = s.column1 AND key >= ? AND key < ?
    AND substr(key, 1, 2) >= x'0050' AND substr(key, 1, 2) < x'0055'
  ORDER BY key, partition LIMIT 1)

-- name: shard_count
SELECT value FROM timerwheel_meta WHERE name = 'shard_count'

-- name: write_meta
-- What a write on the store's own connection reads once another connection has committed: the shard
-- count its puts bind and the schema version, which a newer timerwheel_c may have raised meanwhile.
SELECT (SELECT value FROM timerwheel_meta WHERE name = 'shard_count'),
  (SELECT value FROM timerwheel_meta WHERE name = 'schema_version')

-- name: set_shard_count
INSERT OR IGNORE INTO timerwheel_meta (name, value) VALUES ('shard_count', ?)

-- name: change_shard_count
INSERT OR REPLACE INTO timerwheel_meta (name, value) VALUES ('shard_count', ?)

-- name: reshard
-- timerwheel_shard(partition): registered by the store for this statement (see 0008_shards.sql).
UPDATE timerwheel_kv SET shard = timerwheel_shard(partition)

-- name: record_label
-- A label (a name given by the layers above, such as a timer kind's) kept in the meta table under
-- "label:NAME"; the first writer's text stays.
INSERT OR IGNORE INTO timerwheel_meta (name, value) VALUES ('label:' || ?, ?)

-- name: labels
SELECT substr(name, 7), value FROM timerwheel_meta WHERE name >= 'label:' || ? AND name < 'label;'

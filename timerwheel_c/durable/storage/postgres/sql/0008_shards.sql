-- Version 8: each row's shard (storage/shards.py), a generated column the server computes on every write
-- (the first four bytes of the MD5 of the partition's UTF-8, big-endian, modulo the shard count: what
-- shards.shard_of computes), and the index (shard, key, partition) that reads a shard's rows in key
-- order across its partitions with one range scan. Adding the column fills it for the stored rows.
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS shard int GENERATED ALWAYS AS
  (mod(('x' || left(md5(partition), 8))::bit(32)::int8, {shard_count})::int) STORED;
CREATE INDEX IF NOT EXISTS {shard_index} ON {t} (shard, key, partition);

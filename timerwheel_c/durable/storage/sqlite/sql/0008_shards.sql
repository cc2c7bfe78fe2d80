-- Version 8: each row's shard (storage/shards.py) in a column of its own, and the index (shard, key,
-- partition) that reads a shard's rows in key order across its partitions with one range scan. The
-- store fills the column on every write; here timerwheel_shard(partition), a function the store
-- registers on its connection for this upgrade only, fills it for the rows already stored.
ALTER TABLE timerwheel_kv ADD COLUMN shard INTEGER NOT NULL DEFAULT 0;
UPDATE timerwheel_kv SET shard = timerwheel_shard(partition);
CREATE INDEX IF NOT EXISTS timerwheel_kv_shard ON timerwheel_kv (shard, key, partition);

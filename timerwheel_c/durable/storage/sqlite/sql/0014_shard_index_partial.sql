-- Version 14 (PostgreSQL's store has 13 for a step of its own): the index by shard keeps only the rows
-- passes read by shard, SHARD_SPACE in storage/store.py (the parked rows through the timer rows), so
-- that a name's row, a schedule's and an application's are written without an index entry: a timer
-- scheduled by name, and each fire that deletes its name, write one b-tree page fewer. A statement
-- uses this index only when its WHERE repeats the index's own terms, as queries.sql's reads by shard
-- do. The terms read substr(key, 1, 2), not key: to judge whether a statement's "key >= ?" implies a
-- term "key >= x'0050'", SQLite compares the bound value, and then prepares the statement again each
-- time that value changes, which made every range scan of a partition cost about 2.5 times as much.
DROP INDEX IF EXISTS timerwheel_kv_shard;
CREATE INDEX timerwheel_kv_shard ON timerwheel_kv (shard, key, partition)
  WHERE substr(key, 1, 2) >= x'0050' AND substr(key, 1, 2) < x'0055';

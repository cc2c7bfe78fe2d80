-- The key-value table. The clustered primary key of a WITHOUT ROWID table is the ordered index the
-- scans walk; SQLite compares BLOBs with memcmp, then by length, which is Python's bytes order.
CREATE TABLE IF NOT EXISTS timerwheel_kv (
  partition TEXT NOT NULL,
  key BLOB NOT NULL,
  value BLOB NOT NULL,
  PRIMARY KEY (partition, key)
) WITHOUT ROWID;

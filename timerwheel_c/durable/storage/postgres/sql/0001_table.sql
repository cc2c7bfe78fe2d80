-- The key-value table: PostgreSQL orders bytea by memcmp, then length, which is Python's bytes
-- order, so the primary-key index serves the scans in key order. The partition compares bytewise
-- (COLLATE "C", Python's str order and SQLite's BINARY): every read or write by key descends the
-- primary key, comparing partitions at each step, and a database's own collation compared them
-- through the C library's strcoll (3 % of a fired timer's server time on a C.UTF-8 database). A
-- table created before version 17 keeps the collation it was created with (see 0017_write_sets.sql).
CREATE TABLE IF NOT EXISTS {t} (
  partition text COLLATE "C" NOT NULL,
  key bytea NOT NULL,
  value bytea NOT NULL,
  PRIMARY KEY (partition, key)
);

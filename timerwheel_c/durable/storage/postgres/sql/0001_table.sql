-- The key-value table: PostgreSQL orders bytea by memcmp, then length, which is Python's bytes
-- order, so the primary-key index serves the scans in key order.
CREATE TABLE IF NOT EXISTS {t} (
  partition text NOT NULL,
  key bytea NOT NULL,
  value bytea NOT NULL,
  PRIMARY KEY (partition, key)
);

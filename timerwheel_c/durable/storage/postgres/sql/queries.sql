-- The statements of PostgresStore, one per "-- name:" section; {t} is the table, {apply_many} its function.

-- name: scan_from
SELECT key, value FROM {t} WHERE partition = %s AND key >= %s AND key < %s ORDER BY key LIMIT %s

-- name: scan_after
SELECT key, value FROM {t} WHERE partition = %s AND key > %s AND key < %s ORDER BY key LIMIT %s

-- name: scan_many
-- Request i: rows of partition p[i] with lo[i] <= key (lo[i] < key unless incl[i]) and key < hi[i], in key
-- order, at most n[i]: one LATERAL index scan each, one row of three arrays per request, in request order:
-- the keys, the values, and the rows' places (ctid, tidsend's 6 bytes), where a claim of one finds it
-- without a descent of the primary key (0017_write_sets.sql). The arrays take the rows in the order the
-- subquery gives them (its ORDER BY), all three alike: an ORDER BY in each aggregate sorted the rows
-- again, three times (5 % of a fired timer's server time).
SELECT s.keys, s.vals, s.places
FROM unnest(%b::text[], %b::bytea[], %b::bytea[], %b::boolean[], %b::int8[]) WITH ORDINALITY AS r(p, lo, hi, incl, n, i)
CROSS JOIN LATERAL (
  SELECT array_agg(q.key) AS keys, array_agg(q.value) AS vals, array_agg(tidsend(q.ctid)) AS places
  FROM (SELECT key, value, ctid FROM {t} WHERE partition = r.p AND key >= r.lo AND key < r.hi AND (r.incl OR key > r.lo)
        ORDER BY key LIMIT r.n) q) s
ORDER BY r.i

-- name: scan_shards
-- Rows of each shard s[i] with lo <= key < hi, at most n[i], in key order across its partitions:
-- one range scan of the (shard, key, partition) index per shard, in request order. For a range within
-- SHARD_SPACE (storage/store.py) only: the WHERE repeats the terms of the partial index
-- (0016_shard_index_partial.sql), which the planner uses only for a statement that implies them.
SELECT s.i, r.partition, r.key, r.value
FROM unnest(%b::int4[], %b::int8[]) WITH ORDINALITY AS s(shard, n, i)
CROSS JOIN LATERAL (SELECT partition, key, value FROM {t} WHERE shard = s.shard AND key >= %b AND key < %b
                      AND key >= '\x0050'::bytea AND key < '\x0055'::bytea
                    ORDER BY key, partition LIMIT s.n) r
ORDER BY s.i, r.key, r.partition

-- name: scan_shards_elsewhere
-- The same read of a range outside SHARD_SPACE, which no index by shard holds: one scan of the table
-- for every shard asked (not a scan per shard), each shard's rows numbered in key order.
SELECT r.i, r.partition, r.key, r.value
FROM (SELECT s.i, s.n, t.partition, t.key, t.value,
             row_number() OVER (PARTITION BY s.i ORDER BY t.key, t.partition) AS rank
      FROM unnest(%b::int4[], %b::int8[]) WITH ORDINALITY AS s(shard, n, i)
      JOIN {t} t ON t.shard = s.shard
      WHERE t.key >= %b AND t.key < %b) r
WHERE r.rank <= r.n
ORDER BY r.i, r.key, r.partition

-- name: shard_count
SELECT value FROM {meta} WHERE name = 'shard_count'

-- name: set_shard_count
INSERT INTO {meta} (name, value) VALUES ('shard_count', %s) ON CONFLICT (name) DO NOTHING

-- name: change_shard_count
INSERT INTO {meta} (name, value) VALUES ('shard_count', %s) ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value

-- name: view_grants
-- The privileges granted on the timers' view to roles other than its owner (PUBLIC as such), which
-- dropping it for a reshard drops and the reshard grants again: a monitoring role keeps its SELECT.
SELECT CASE WHEN a.grantee = 0 THEN NULL ELSE pg_get_userbyid(a.grantee) END, a.privilege_type, a.is_grantable
FROM pg_class c, aclexplode(c.relacl) a
WHERE c.oid = to_regclass(%s) AND a.grantee <> c.relowner

-- name: drop_timers_view
-- Before the shard column it reads is dropped (reshard); version 10's statements make it again.
DROP VIEW IF EXISTS {timers_view}

-- name: drop_shard_column
-- Before version 8's statements run again with another count; its index goes with the column.
ALTER TABLE {t} DROP COLUMN IF EXISTS shard

-- name: get
SELECT value FROM {t} WHERE partition = %s AND key = %s

-- name: get_through
-- A row and the row of its partition whose key is its value, in one statement: one snapshot, so a
-- commit that moves both lands wholly before or wholly after the read (Store.get_through).
SELECT i.value, t.value FROM {t} AS i LEFT JOIN {t} AS t ON t.partition = i.partition AND t.key = i.value
WHERE i.partition = %s AND i.key = %s

-- name: partitions
-- A loose index scan: one index probe per partition instead of a walk over every row.
WITH RECURSIVE p AS (
  (SELECT partition FROM {t} ORDER BY partition LIMIT 1)
  UNION ALL
  SELECT (SELECT partition FROM {t} WHERE partition > p.partition ORDER BY partition LIMIT 1)
  FROM p WHERE p.partition IS NOT NULL)
SELECT partition FROM p WHERE partition IS NOT NULL

-- name: apply_many
-- %b: binary parameters, so bytea arrays travel without text escaping. The first parameter is the
-- shard count the lock key is of: no row when it is not the recorded one (0015_writes_at_shard_count.sql).
SELECT failed, refused FROM {apply_many_at}(%s, %s, %s, %b::int[], %b::bytea[], %b::bytea[], %b::boolean[], %b::int[],
                                            %b::bytea[], %b::bytea[], %b::int[], %s)

-- name: write_sets
-- The set-based write (version 17, 0017_write_sets.sql): each batch's consumed row's place beside it
-- (NULL for none); the places of the rows it moved come back.
SELECT failed, moved_b, moved_at
FROM {write_sets_at}(%s, %b::bigint[], %b::text[], %b::bytea[], %b::bytea[], %b::bytea[], %b::tid[],
                     %b::int[], %b::text[], %b::bytea[], %b::bytea[], %b::int[], %b::text[], %b::bytea[],
                     %b::int[], %b::text[], %b::bytea[], %b::bytea[])

-- name: lock_shard
-- A shard's advisory lock, and whether the count its key is of is the recorded one (as apply_many's).
SELECT {lock_shards}(ARRAY[%s]::bigint[], %s)

-- name: create_meta
CREATE TABLE IF NOT EXISTS {meta} (name text PRIMARY KEY, value text NOT NULL)

-- name: schema_version
SELECT value FROM {meta} WHERE name = 'schema_version'

-- name: set_schema_version
INSERT INTO {meta} (name, value) VALUES ('schema_version', %s)
  ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value

-- name: signal_patterns
SELECT value FROM {meta} WHERE name = 'signal_patterns'

-- name: set_signal_patterns
INSERT INTO {meta} (name, value) VALUES ('signal_patterns', %s)
  ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value

-- name: forget_signal_patterns
DELETE FROM {meta} WHERE name = 'signal_patterns'

-- name: wake_trigger
-- The change signal: a row trigger notifies the channel {channel} in the writing transaction, so the
-- notification is delivered on commit and never for a rolled-back write; PostgreSQL folds equal
-- notifications of one transaction into one. {when} is built from the patterns the layers above
-- declared (Store.signal_writes), "true" until they have. Deletes never signal.
CREATE OR REPLACE FUNCTION {wake}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify({channel}, '');
  RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS {wake} ON {t};
CREATE TRIGGER {wake} AFTER INSERT OR UPDATE ON {t} FOR EACH ROW WHEN ({when}) EXECUTE FUNCTION {wake}()

-- name: all_rows
SELECT partition, key, value FROM {t} ORDER BY partition, key

-- name: delete_row
DELETE FROM {t} WHERE partition = %s AND key = %s

-- name: put_row
INSERT INTO {t} (partition, key, value) VALUES (%s, %s, %s)
ON CONFLICT (partition, key) DO UPDATE SET value = EXCLUDED.value

-- name: copy_rows
-- New rows in bulk (storage/postgres/copy.py): a key already present aborts it with SQLSTATE 23505.
COPY {t} (partition, key, value) FROM STDIN (FORMAT BINARY)

-- name: record_label
-- A label (a name given by the layers above, such as a timer kind's) kept in the meta table under
-- "label:NAME"; the first writer's text stays.
INSERT INTO {meta} (name, value) VALUES ('label:' || %s, %s) ON CONFLICT (name) DO NOTHING

-- name: labels
SELECT substr(name, 7), value FROM {meta} WHERE name LIKE 'label:%%' AND starts_with(substr(name, 7), %s)

-- Independent guarded batches, applied set-based in one call: {apply_sets} does with one statement
-- what {apply_many} does with a loop of statements per batch, for a list of batches of which no
-- two touch the same key (PostgresStore checks that before choosing it). Each batch's guards are
-- then judged against the partition as it was before the call, which is what the loop would have
-- judged them against, so every batch still commits or fails on its own guards alone.
--
-- Batch b (1-based) lies in partition bp[b]. Its guards but a consuming last one are rows of
-- (g_b, g_k, g_v): g_v NULL for Absent, else the value Equals requires. ck[b], cv[b]: its consuming
-- guard Equals(ck[b], cv[b]), whose delete is its first write to ck[b] (store.consumed_write), or
-- NULL. Its other writes, the last one per key, are rows of (d_b, d_k) (deletes) and (u_b, u_k,
-- u_v) (puts); no put of ck[b]. Returns failed[b]: the key of batch b's first failed guard, nothing
-- of it written, or NULL once written.
--
-- The transaction-level advisory locks of every partition (lock_keys, sorted so that two callers
-- never wait on each other in a cycle) are taken first, in a statement of their own, so that the
-- statement that judges and writes takes its snapshot after every earlier guarded commit on these
-- partitions (a volatile function's statements each take a new snapshot).
CREATE OR REPLACE FUNCTION {apply_sets}(lock_keys bigint[], bp text[], ck bytea[], cv bytea[],
                                        g_b int[], g_k bytea[], g_v bytea[], d_b int[], d_k bytea[],
                                        u_b int[], u_k bytea[], u_v bytea[])
RETURNS bytea[] LANGUAGE plpgsql AS $$
DECLARE
  lk bigint;
  failed bytea[];
BEGIN
  FOREACH lk IN ARRAY lock_keys LOOP
    PERFORM pg_advisory_xact_lock(lk);
  END LOOP;
  WITH bad AS (
    SELECT DISTINCT ON (g.b) g.b, g.k
    FROM unnest(g_b, g_k, g_v) WITH ORDINALITY AS g(b, k, v, i)
    LEFT JOIN {t} t ON t.partition = bp[g.b] AND t.key = g.k
    WHERE CASE WHEN g.v IS NULL THEN t.key IS NOT NULL ELSE t.key IS NULL OR t.value <> g.v END
    ORDER BY g.b, g.i
  ), gone AS (
    DELETE FROM {t} t USING unnest(bp, ck, cv) WITH ORDINALITY AS c(p, k, v, b)
    WHERE c.k IS NOT NULL AND t.partition = c.p AND t.key = c.k AND t.value = c.v
      AND NOT EXISTS (SELECT 1 FROM bad WHERE bad.b = c.b)
    RETURNING c.b
  ), ok AS (
    SELECT c.b FROM unnest(ck) WITH ORDINALITY AS c(k, b)
    WHERE c.k IS NULL AND NOT EXISTS (SELECT 1 FROM bad WHERE bad.b = c.b)
    UNION ALL
    SELECT b FROM gone
  ), deleted AS (
    DELETE FROM {t} t USING unnest(d_b, d_k) AS d(b, k) JOIN ok ON ok.b = d.b
    WHERE t.partition = bp[d.b] AND t.key = d.k
  ), put AS (
    INSERT INTO {t} (partition, key, value)
    SELECT bp[u.b], u.k, u.v FROM unnest(u_b, u_k, u_v) AS u(b, k, v) JOIN ok ON ok.b = u.b
    ON CONFLICT (partition, key) DO UPDATE SET value = EXCLUDED.value
  )
  SELECT array_agg(CASE WHEN ok.b IS NULL THEN coalesce(bad.k, c.k) END ORDER BY c.b) INTO failed
  FROM unnest(ck) WITH ORDINALITY AS c(k, b) LEFT JOIN ok ON ok.b = c.b LEFT JOIN bad ON bad.b = c.b;
  RETURN failed;
END
$$;

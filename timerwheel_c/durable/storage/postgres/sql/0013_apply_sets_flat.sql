-- Version 13: {apply_sets} takes its arrays flat, so that the statement neither joins nor subscripts
-- them per row. Each guard, delete and put carries its partition (g_p, d_p, u_p): bp[d.b], a subscript
-- of a text[], walks the array to its element, so a commit of n batches walked n * n / 2 elements.
-- The key a batch's consumed row moves to comes aligned with the batch (mt: the first put of the
-- consumed value under another key, NULL for none; the caller leaves that put out of u_*): the join
-- of the puts with the batches that found the candidates, its two sorts and a third for DISTINCT ON,
-- go. A candidate whose key holds a row is put as before, with the consumed row deleted. The rows a
-- call leaves are the same as version 11's; only the server's work per row is less.
-- A move's key is taken on trust first: when it holds a row, the UPDATE fails the primary key (a
-- unique_violation, which undoes the whole statement), and the statement runs again probing each
-- move's key, as version 11 always did. A move's key is a new backoff key or an effect's, so the probe,
-- an index descent per move (two per fired timer), almost never finds a row.
-- The function plans with enable_seqscan off: it reaches the table's rows only by key, so an index
-- probe per row is always the plan. Left to its estimates, the planner joined the moves to a hash of
-- a scan of the whole table once a call's batches were a tenth of its rows (a runner's claim of
-- 1,024 rows of a table of 10,000), a cost that grows with the table, not with the call.
DROP FUNCTION IF EXISTS {apply_sets}(bigint[], text[], bytea[], bytea[], int[], bytea[], bytea[], int[], bytea[],
                                     int[], bytea[], bytea[]);
CREATE OR REPLACE FUNCTION {apply_sets}(lock_keys bigint[], bp text[], ck bytea[], cv bytea[], mt bytea[],
                                        g_b int[], g_p text[], g_k bytea[], g_v bytea[],
                                        d_b int[], d_p text[], d_k bytea[],
                                        u_b int[], u_p text[], u_k bytea[], u_v bytea[])
RETURNS bytea[] LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
  lk bigint;
  failed bytea[];
  probe boolean := false;
BEGIN
  FOREACH lk IN ARRAY lock_keys LOOP
    PERFORM pg_advisory_xact_lock(lk);
  END LOOP;
  LOOP
  BEGIN
  WITH bad AS (
    SELECT DISTINCT ON (g.b) g.b, g.k
    FROM unnest(g_b, g_p, g_k, g_v) WITH ORDINALITY AS g(b, p, k, v, i)
    LEFT JOIN {t} t ON t.partition = g.p AND t.key = g.k
    WHERE CASE WHEN g.v IS NULL THEN t.key IS NOT NULL ELSE t.key IS NULL OR t.value <> g.v END
    ORDER BY g.b, g.i
  ), moves AS (
    -- Batch b's consumed row (c.p, c.k, c.v) and the key m it moves to; with probe, only a free key
    -- (a subplan per row behind the OR, run only with probe: never pulled up into an anti join).
    SELECT c.b, c.m, c.p, c.k, c.v
    FROM unnest(bp, ck, cv, mt) WITH ORDINALITY AS c(p, k, v, m, b)
    WHERE c.m IS NOT NULL AND (NOT probe OR NOT EXISTS (SELECT 1 FROM {t} t WHERE t.partition = c.p AND t.key = c.m))
  ), moved AS (
    UPDATE {t} t SET key = mv.m FROM moves mv
    WHERE t.partition = mv.p AND t.key = mv.k AND t.value = mv.v
      AND NOT EXISTS (SELECT 1 FROM bad WHERE bad.b = mv.b)
    RETURNING mv.b
  ), gone AS (
    DELETE FROM {t} t USING unnest(bp, ck, cv) WITH ORDINALITY AS c(p, k, v, b)
    WHERE c.k IS NOT NULL AND t.partition = c.p AND t.key = c.k AND t.value = c.v
      AND NOT EXISTS (SELECT 1 FROM bad WHERE bad.b = c.b) AND c.b NOT IN (SELECT b FROM moves)
    RETURNING c.b
  ), ok AS (
    SELECT c.b FROM unnest(ck) WITH ORDINALITY AS c(k, b)
    WHERE c.k IS NULL AND NOT EXISTS (SELECT 1 FROM bad WHERE bad.b = c.b)
    UNION ALL
    SELECT b FROM gone
    UNION ALL
    SELECT b FROM moved
  ), deleted AS (
    DELETE FROM {t} t USING unnest(d_b, d_p, d_k) AS d(b, p, k) JOIN ok ON ok.b = d.b
    WHERE t.partition = d.p AND t.key = d.k
  ), put AS (
    INSERT INTO {t} (partition, key, value)
    SELECT u.p, u.k, u.v FROM unnest(u_b, u_p, u_k, u_v) AS u(b, p, k, v) JOIN ok ON ok.b = u.b
    UNION ALL
    -- A candidate whose key held a row: its batch deleted the consumed row (gone), and puts it here.
    SELECT c.p, c.m, c.v FROM unnest(bp, cv, mt) WITH ORDINALITY AS c(p, v, m, b) JOIN gone ON gone.b = c.b
    WHERE c.m IS NOT NULL
    ON CONFLICT (partition, key) DO UPDATE SET value = EXCLUDED.value
  )
  SELECT array_agg(CASE WHEN ok.b IS NULL THEN coalesce(bad.k, c.k) END ORDER BY c.b) INTO failed
  FROM unnest(ck) WITH ORDINALITY AS c(k, b) LEFT JOIN ok ON ok.b = c.b LEFT JOIN bad ON bad.b = c.b;
  RETURN failed;
  EXCEPTION WHEN unique_violation THEN
    IF probe THEN
      RAISE;
    END IF;
    probe := true;  -- a move's key held a row: nothing was written; again, probing each
  END;
  END LOOP;
END
$$;

-- Version 11: a guarded batch that consumes a row (its last guard Equals(K, V), its first write to K
-- a delete: store.consumed_write) and puts V under a new key K' moves the row: one UPDATE of its key
-- where a DELETE and an INSERT were two row writes. Every claim of the runner has this shape (K to
-- its backoff key K'), so a fired timer costs one row write fewer. Only when K' is free: a stored
-- row there is overwritten by the put, as before. The rows a batch leaves are the same either way.
CREATE OR REPLACE FUNCTION {apply_one}(p text, g0 int, g1 int, gk bytea[], gv bytea[], absent boolean[],
                                         consume int, w0 int, w1 int, wk bytea[], wv bytea[])
RETURNS bytea LANGUAGE plpgsql AS $$
DECLARE
  i int;
  j int;
  mv int := 0;
  cur bytea;
BEGIN
  FOR i IN g0 + 1 .. CASE WHEN consume > 0 THEN g1 - 1 ELSE g1 END LOOP
    SELECT value INTO cur FROM {t} WHERE partition = p AND key = gk[i];
    IF absent[i] THEN
      IF FOUND THEN RETURN gk[i]; END IF;
    ELSIF NOT FOUND OR cur <> gv[i] THEN
      RETURN gk[i];
    END IF;
  END LOOP;
  IF consume > 0 THEN
    -- The move's target: the first put of the consumed value to another key, that key's first write.
    <<pick>>
    FOR i IN w0 + 1 .. w1 LOOP
      IF wv[i] = gv[g1] AND wk[i] <> gk[g1] THEN
        FOR j IN w0 + 1 .. i - 1 LOOP
          IF wk[j] = wk[i] THEN CONTINUE pick; END IF;
        END LOOP;
        PERFORM 1 FROM {t} WHERE partition = p AND key = wk[i];
        IF NOT FOUND THEN
          mv := i;
          EXIT pick;
        END IF;
      END IF;
    END LOOP;
    IF mv > 0 THEN
      UPDATE {t} SET key = wk[mv] WHERE partition = p AND key = gk[g1] AND value = gv[g1];
    ELSE
      DELETE FROM {t} WHERE partition = p AND key = gk[g1] AND value = gv[g1];
    END IF;
    IF NOT FOUND THEN RETURN gk[g1]; END IF;
  END IF;
  FOR i IN w0 + 1 .. w1 LOOP
    IF i = consume OR i = mv THEN
      CONTINUE;
    ELSIF wv[i] IS NULL THEN
      DELETE FROM {t} WHERE partition = p AND key = wk[i];
    ELSE
      INSERT INTO {t} (partition, key, value) VALUES (p, wk[i], wv[i])
        ON CONFLICT (partition, key) DO UPDATE SET value = EXCLUDED.value;
    END IF;
  END LOOP;
  RETURN NULL;
END
$$;

-- The same in {apply_sets}: a batch whose consuming guard's value is put (its last write) under a key
-- that holds no row moves the row there (moves, moved); the others delete it (gone), as before. The
-- statements that leave out the moves do so with NOT IN, a hashed subplan: a NOT EXISTS on the CTE
-- became a nested loop over it per row (the planner cannot know its size), quadratic in the batches.
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
  ), moves AS (
    -- Batch b's consumed row (c.p, c.k, c.v) and the key m it moves to. Joined, not subscripted: a
    -- subscript of a bytea[] walks the array to its element.
    SELECT DISTINCT ON (u.b) u.b, u.k AS m, c.p, c.k, c.v
    FROM unnest(u_b, u_k, u_v) WITH ORDINALITY AS u(b, k, v, i)
    JOIN unnest(bp, ck, cv) WITH ORDINALITY AS c(p, k, v, b) ON c.b = u.b
    -- One index probe per candidate (an aggregate keeps it a probe: as NOT EXISTS the planner makes
    -- it an anti join, hashing a scan of the whole table for a candidate list it takes to be short).
    CROSS JOIN LATERAL (SELECT count(*) AS n FROM (SELECT 1 FROM {t} t WHERE t.partition = c.p AND t.key = u.k
                                                   LIMIT 1) AS one) AS taken
    WHERE c.k IS NOT NULL AND u.v = c.v AND taken.n = 0
    ORDER BY u.b, u.i
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
    DELETE FROM {t} t USING unnest(d_b, d_k) AS d(b, k) JOIN ok ON ok.b = d.b
    WHERE t.partition = bp[d.b] AND t.key = d.k
  ), put AS (
    INSERT INTO {t} (partition, key, value)
    SELECT bp[u.b], u.k, u.v FROM unnest(u_b, u_k, u_v) AS u(b, k, v) JOIN ok ON ok.b = u.b
    WHERE (u.b, u.k) NOT IN (SELECT b, m FROM moves)
    ON CONFLICT (partition, key) DO UPDATE SET value = EXCLUDED.value
  )
  SELECT array_agg(CASE WHEN ok.b IS NULL THEN coalesce(bad.k, c.k) END ORDER BY c.b) INTO failed
  FROM unnest(ck) WITH ORDINALITY AS c(k, b) LEFT JOIN ok ON ok.b = c.b LEFT JOIN bad ON bad.b = c.b;
  RETURN failed;
END
$$;

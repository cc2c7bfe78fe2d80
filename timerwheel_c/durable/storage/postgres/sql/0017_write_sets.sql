-- Version 17: {write_sets} (called through {write_sets_at}) does what {apply_sets} does, with less of the
-- server's work per row, for a list of independent batches (a runner's claims and outcomes):
-- - A consumed row whose place the caller knows (at[b], the ctid at which the store last read or wrote
--   it, NULL when it knows none) is fetched there, a TID scan, where a read by key descends the primary
--   key (about 15,000 instructions a row, twice per fired timer: its claim and its outcome). The row
--   found there must still be the guarded one (the same partition, key and value), else the batch is
--   tried by key as any other: a place is a hint, never trusted. The ctid of each moved row's new
--   version is returned (moved_b, moved_at: tidsend's 6 bytes), the place its outcome finds it at.
-- - Statements run one after another, each only when some batch needs it, not as one statement of
--   data-modifying CTEs that all ran, each re-reading the arrays into a tuplestore; the arrays are
--   read by set-returning functions in a target list, which stream.
-- - When every batch's guards held (the common case), the deletes and puts run unjoined, the deletes
--   of each partition found by one read of the range they span when it holds few other rows (a key
--   to delete that holds no row then costs no descent); a batch that failed sends the rest down the
--   general path, which writes only the batches that held.
-- The old {apply_sets} and {apply_sets_at} stay for processes of version 16 still running.
-- Plans: generic ones, made once per session; nested loops of index or TID probes only (a merge or hash
-- join read the whole table per call once a call's rows were a tenth of it); a probe of a move's key as
-- a scalar subquery, which stays a probe per row (an EXISTS there became a hash of the whole table);
-- and no JIT (a disabled path's cost would trigger it).
CREATE OR REPLACE FUNCTION {write_sets}(lock_keys bigint[], bp text[], ck bytea[], cv bytea[], mt bytea[], at tid[],
                                        g_b int[], g_p text[], g_k bytea[], g_v bytea[],
                                        d_b int[], d_p text[], d_k bytea[],
                                        u_b int[], u_p text[], u_k bytea[], u_v bytea[],
                                        OUT failed bytea[], OUT moved_b int[], OUT moved_at bytea[])
LANGUAGE plpgsql SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off SET jit = off
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
  lk bigint;
  i int;
  n int := cardinality(bp);
  bad_b int[] := '{{}}';
  bad_k bytea[] := '{{}}';
  judged boolean := cardinality(g_b) > 0;  -- guards besides the consumed rows' were judged (bad_b)
  gone int[];
  ok boolean[];
  unguarded int;  -- batches without a consumed row
  moves int;  -- batches whose consumed row moves
  placed_moves int;  -- of those, the ones with a place
  deletes int;  -- batches whose consumed row is deleted
  placed_deletes int;
  missed boolean;
  probe boolean := false;
  found_at tid[];  -- the rows to delete found by reading their partition's range
  crowded text[];  -- the partitions whose range holds more rows than that read's bound
BEGIN
  FOREACH lk IN ARRAY lock_keys LOOP
    PERFORM pg_advisory_xact_lock(lk);
  END LOOP;
  SELECT count(*) FILTER (WHERE c.k IS NULL), count(*) FILTER (WHERE c.m IS NOT NULL),
         count(*) FILTER (WHERE c.m IS NOT NULL AND c.l IS NOT NULL),
         count(*) FILTER (WHERE c.k IS NOT NULL AND c.m IS NULL),
         count(*) FILTER (WHERE c.k IS NOT NULL AND c.m IS NULL AND c.l IS NOT NULL)
    INTO unguarded, moves, placed_moves, deletes, placed_deletes
    FROM (SELECT unnest(ck) AS k, unnest(mt) AS m, unnest(at) AS l) c;
  IF judged THEN
    -- Each batch's first failed guard but the consuming one, judged before any write.
    SELECT coalesce(array_agg(x.b ORDER BY x.b), '{{}}'), coalesce(array_agg(x.k ORDER BY x.b), '{{}}')
      INTO bad_b, bad_k
      FROM (SELECT DISTINCT ON (g.b) g.b, g.k
            FROM (SELECT unnest(g_b) AS b, unnest(g_p) AS p, unnest(g_k) AS k, unnest(g_v) AS v,
                         generate_subscripts(g_b, 1) AS i) g
            LEFT JOIN {t} t ON t.partition = g.p AND t.key = g.k
            WHERE CASE WHEN g.v IS NULL THEN t.key IS NOT NULL ELSE t.key IS NULL OR t.value <> g.v END
            ORDER BY g.b, g.i) x;
  END IF;
  LOOP
  BEGIN
    moved_b := '{{}}';
    moved_at := '{{}}';
    gone := '{{}}';
    -- The consumed rows that move: first at their places, then by key (no place, or not found there).
    -- A move's key is taken on trust (with probe, only a free one: see version 13).
    IF placed_moves > 0 THEN
      WITH m AS (
        UPDATE {t} t SET key = c.m
        FROM (SELECT unnest(bp) AS p, unnest(ck) AS k, unnest(cv) AS v, unnest(mt) AS m, unnest(at) AS l,
                     generate_subscripts(bp, 1) AS b) c
        WHERE c.m IS NOT NULL AND c.l IS NOT NULL AND t.ctid = c.l AND (NOT judged OR c.b <> ALL (bad_b))
          AND (t.partition, t.key, t.value) IS NOT DISTINCT FROM (c.p, c.k, c.v)
          AND (NOT probe OR (SELECT count(*) FROM (SELECT 1 FROM {t} f WHERE f.partition = c.p AND f.key = c.m
                                                   LIMIT 1) AS one) = 0)
        RETURNING c.b, tidsend(t.ctid) AS at
      )
      SELECT coalesce(array_agg(m.b), '{{}}'), coalesce(array_agg(m.at), '{{}}') INTO moved_b, moved_at FROM m;
    END IF;
    missed := cardinality(moved_b) < placed_moves;
    IF moves > placed_moves OR missed THEN
      WITH m AS (
        UPDATE {t} t SET key = c.m
        FROM (SELECT unnest(bp) AS p, unnest(ck) AS k, unnest(cv) AS v, unnest(mt) AS m, unnest(at) AS l,
                     generate_subscripts(bp, 1) AS b) c
        WHERE c.m IS NOT NULL AND (c.l IS NULL OR missed AND c.b NOT IN (SELECT unnest(moved_b)))
          AND t.partition = c.p AND t.key = c.k AND t.value = c.v AND (NOT judged OR c.b <> ALL (bad_b))
          AND (NOT probe OR (SELECT count(*) FROM (SELECT 1 FROM {t} f WHERE f.partition = c.p AND f.key = c.m
                                                   LIMIT 1) AS one) = 0)
        RETURNING c.b, tidsend(t.ctid) AS at
      )
      SELECT moved_b || coalesce(array_agg(m.b), '{{}}'), moved_at || coalesce(array_agg(m.at), '{{}}')
        INTO moved_b, moved_at FROM m;
    END IF;
    -- The consumed rows deleted: those that do not move, and with probe those whose move's key holds a
    -- row (put there instead); at their places first, then by key.
    IF placed_deletes > 0 OR probe THEN
      WITH g AS (
        DELETE FROM {t} t
        USING (SELECT unnest(bp) AS p, unnest(ck) AS k, unnest(cv) AS v, unnest(mt) AS m, unnest(at) AS l,
                      generate_subscripts(bp, 1) AS b) c
        WHERE c.k IS NOT NULL AND c.l IS NOT NULL AND t.ctid = c.l AND (NOT judged OR c.b <> ALL (bad_b))
          AND (t.partition, t.key, t.value) IS NOT DISTINCT FROM (c.p, c.k, c.v)
          AND (c.m IS NULL OR probe AND (SELECT count(*) FROM (SELECT 1 FROM {t} f WHERE f.partition = c.p
                                                                AND f.key = c.m LIMIT 1) AS one) > 0)
        RETURNING c.b, c.p, c.m, c.v
      ), put AS (
        INSERT INTO {t} (partition, key, value) SELECT g.p, g.m, g.v FROM g WHERE g.m IS NOT NULL
        ON CONFLICT (partition, key) DO UPDATE SET value = EXCLUDED.value
      )
      SELECT coalesce(array_agg(g.b), '{{}}') INTO gone FROM g;
    END IF;
    missed := probe OR cardinality(gone) < placed_deletes;
    IF deletes > placed_deletes OR missed THEN
      WITH g AS (
        DELETE FROM {t} t
        USING (SELECT unnest(bp) AS p, unnest(ck) AS k, unnest(cv) AS v, unnest(mt) AS m, unnest(at) AS l,
                      generate_subscripts(bp, 1) AS b) c
        WHERE c.k IS NOT NULL AND (c.l IS NULL OR missed AND c.b NOT IN (SELECT unnest(gone)))
          AND t.partition = c.p AND t.key = c.k AND t.value = c.v AND (NOT judged OR c.b <> ALL (bad_b))
          AND (c.m IS NULL OR probe AND (SELECT count(*) FROM (SELECT 1 FROM {t} f WHERE f.partition = c.p
                                                                AND f.key = c.m LIMIT 1) AS one) > 0)
        RETURNING c.b, c.p, c.m, c.v
      ), put AS (
        INSERT INTO {t} (partition, key, value) SELECT g.p, g.m, g.v FROM g WHERE g.m IS NOT NULL
        ON CONFLICT (partition, key) DO UPDATE SET value = EXCLUDED.value
      )
      SELECT gone || coalesce(array_agg(g.b), '{{}}') INTO gone FROM g;
    END IF;
    EXIT;
  EXCEPTION WHEN unique_violation THEN
    IF probe THEN
      RAISE;
    END IF;
    probe := true;  -- a move's key held a row: nothing was written; again, probing each
  END;
  END LOOP;
  IF cardinality(bad_b) = 0 AND cardinality(moved_b) + cardinality(gone) + unguarded = n THEN
    -- Every batch holds: its other writes, as they are.
    IF cardinality(d_k) > 0 THEN
      -- The other deletes, per partition: the range from its least to its greatest key to delete is read
      -- once, in key order, up to a bound (as many rows as it deletes, and 16); when it holds no more,
      -- the rows found there at keys to delete are deleted at their places, and a key not found there
      -- holds no row, which costs no descent (a timer's identity row or trace context that was never
      -- written: two descents per fire). A partition whose range holds more rows (other timers' rows
      -- between its keys) is deleted key by key, as before.
      SELECT coalesce(array_agg(x.ctid) FILTER (WHERE NOT x.crowded AND x.hit), '{{}}'),
             coalesce(array_agg(DISTINCT x.p) FILTER (WHERE x.crowded), '{{}}')
        INTO found_at, crowded
        FROM (SELECT r.p, s.ctid, s.found > r.bound AS crowded,
                     -- a hashed subplan (NOT IN is never made a join, which would be a nested loop here)
                     NOT ((r.p, s.key) NOT IN (SELECT unnest(d_p), unnest(d_k))) AS hit
              FROM (SELECT d.p, count(*) + 16 AS bound,  -- bytea has no min(): its hex in C order is the same order
                           decode(min(encode(d.k, 'hex') COLLATE "C"), 'hex') AS lo,
                           decode(max(encode(d.k, 'hex') COLLATE "C"), 'hex') AS hi
                    FROM (SELECT unnest(d_p) AS p, unnest(d_k) AS k) d GROUP BY d.p) r
              CROSS JOIN LATERAL (SELECT w.key, w.ctid, count(*) OVER () AS found
                                  FROM (SELECT t.key, t.ctid FROM {t} t
                                        WHERE t.partition = r.p AND t.key >= r.lo AND t.key <= r.hi
                                        ORDER BY t.key LIMIT r.bound + 1) w) s) x;
      IF cardinality(found_at) > 0 THEN
        DELETE FROM {t} t WHERE t.ctid = ANY (found_at);
      END IF;
      IF cardinality(crowded) > 0 THEN
        DELETE FROM {t} t USING (SELECT unnest(d_p) AS p, unnest(d_k) AS k) d
        WHERE NOT (d.p NOT IN (SELECT unnest(crowded))) AND t.partition = d.p AND t.key = d.k;
      END IF;
    END IF;
    IF cardinality(u_k) > 0 THEN
      INSERT INTO {t} (partition, key, value) SELECT unnest(u_p), unnest(u_k), unnest(u_v)
      ON CONFLICT (partition, key) DO UPDATE SET value = EXCLUDED.value;
    END IF;
    failed := array_fill(NULL::bytea, ARRAY[n]);
    RETURN;
  END IF;
  -- Some batch failed: only those that held write; the others name their first failed guard (a
  -- consumed row's key when that guard failed).
  ok := array_fill(false, ARRAY[n]);
  FOR i IN 1 .. n LOOP
    IF ck[i] IS NULL THEN
      ok[i] := true;
    END IF;
  END LOOP;
  FOREACH i IN ARRAY moved_b || gone LOOP
    ok[i] := true;
  END LOOP;
  failed := array_fill(NULL::bytea, ARRAY[n]);
  FOR i IN 1 .. n LOOP
    IF NOT ok[i] THEN
      failed[i] := ck[i];
    END IF;
  END LOOP;
  FOR i IN 1 .. cardinality(bad_b) LOOP
    ok[bad_b[i]] := false;
    failed[bad_b[i]] := bad_k[i];
  END LOOP;
  DELETE FROM {t} t USING (SELECT unnest(d_b) AS b, unnest(d_p) AS p, unnest(d_k) AS k) d
    WHERE ok[d.b] AND t.partition = d.p AND t.key = d.k;
  INSERT INTO {t} (partition, key, value)
    SELECT u.p, u.k, u.v FROM (SELECT unnest(u_b) AS b, unnest(u_p) AS p, unnest(u_k) AS k, unnest(u_v) AS v) u
    WHERE ok[u.b]
    ON CONFLICT (partition, key) DO UPDATE SET value = EXCLUDED.value;
END
$$;

CREATE OR REPLACE FUNCTION {write_sets_at}(shard_count text, lock_keys bigint[], bp text[], ck bytea[], cv bytea[],
                                           mt bytea[], at tid[], g_b int[], g_p text[], g_k bytea[], g_v bytea[],
                                           d_b int[], d_p text[], d_k bytea[],
                                           u_b int[], u_p text[], u_k bytea[], u_v bytea[])
RETURNS TABLE (failed bytea[], moved_b int[], moved_at bytea[]) LANGUAGE plpgsql AS $$
BEGIN
  IF {lock_shards}(lock_keys, shard_count) THEN
    RETURN QUERY SELECT * FROM {write_sets}(lock_keys, bp, ck, cv, mt, at, g_b, g_p, g_k, g_v, d_b, d_p, d_k,
                                            u_b, u_p, u_k, u_v);
  END IF;
END
$$;

-- Version 15 (SQLite has 14 for a step of its own): a write runs only at the shard count its lock
-- keys are of. {lock_shards} takes those locks (the write's function takes them again, which holds),
-- waits for a reshard under way (its lock of the whole table), and only then reads the recorded
-- count, in a statement of its own: a fresh snapshot, which sees a reshard that committed while
-- the write waited. A check before the locks (in the write statement's own snapshot) let a write
-- that queued behind a reshard run by the old count's lock. The write functions are called through
-- {apply_many_at} and {apply_sets_at}, which return no row when the count is not the recorded one:
-- the caller reads the new count and writes again.
CREATE OR REPLACE FUNCTION {lock_shards}(lock_keys bigint[], shard_count text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
  lk bigint;
BEGIN
  FOREACH lk IN ARRAY lock_keys LOOP
    PERFORM pg_advisory_xact_lock(lk);
  END LOOP;
  LOCK TABLE {t} IN ROW EXCLUSIVE MODE;
  RETURN COALESCE((SELECT value FROM {meta} WHERE name = 'shard_count'), {default_shard_count}) = shard_count;
END
$$;

CREATE OR REPLACE FUNCTION {apply_many_at}(shard_count text, p text, lock_key bigint, g_end int[], gk bytea[],
                                           gv bytea[], absent boolean[], w_end int[], wk bytea[], wv bytea[],
                                           consume int[], protect boolean)
RETURNS TABLE (failed bytea[], refused text[]) LANGUAGE plpgsql AS $$
BEGIN
  IF {lock_shards}(ARRAY[lock_key], shard_count) THEN
    RETURN QUERY SELECT * FROM {apply_many}(p, lock_key, g_end, gk, gv, absent, w_end, wk, wv, consume, protect);
  END IF;
END
$$;

CREATE OR REPLACE FUNCTION {apply_sets_at}(shard_count text, lock_keys bigint[], bp text[], ck bytea[], cv bytea[],
                                           mt bytea[], g_b int[], g_p text[], g_k bytea[], g_v bytea[],
                                           d_b int[], d_p text[], d_k bytea[],
                                           u_b int[], u_p text[], u_k bytea[], u_v bytea[])
RETURNS SETOF bytea[] LANGUAGE plpgsql AS $$
BEGIN
  IF {lock_shards}(lock_keys, shard_count) THEN
    RETURN NEXT {apply_sets}(lock_keys, bp, ck, cv, mt, g_b, g_p, g_k, g_v, d_b, d_p, d_k, u_b, u_p, u_k, u_v);
  END IF;
END
$$;

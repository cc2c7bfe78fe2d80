-- Guarded batches, applied in one round trip: {apply_many} takes a list of batches flattened
-- into arrays and applies each with {apply_one}. Replaces the functions of versions 1 to 4.
DROP FUNCTION IF EXISTS {old_apply};
DROP FUNCTION IF EXISTS {apply_many}(text, bigint, int[], bytea[], bytea[], boolean[], int[], bytea[], bytea[]);
DROP FUNCTION IF EXISTS {apply_many}(text, bigint, int[], bytea[], bytea[], boolean[], int[], bytea[], bytea[], int[]);

-- One batch: guards gk[g0+1 .. g1] (absent[i]: the key must be missing, else hold gv[i]), then writes
-- wk[w0+1 .. w1] (wv[i] NULL: a delete). consume > 0: the last guard is Equals(K, V) and write number
-- consume is K's first write, a delete, so one "DELETE ... AND value = V" both checks that guard and
-- does that write (the rule of every backend: store.consumed_write). Returns the key of the first
-- failed guard, nothing written, or NULL once written.
CREATE OR REPLACE FUNCTION {apply_one}(p text, g0 int, g1 int, gk bytea[], gv bytea[], absent boolean[],
                                         consume int, w0 int, w1 int, wk bytea[], wv bytea[])
RETURNS bytea LANGUAGE plpgsql AS $$
DECLARE
  i int;
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
    DELETE FROM {t} WHERE partition = p AND key = gk[g1] AND value = gv[g1];
    IF NOT FOUND THEN RETURN gk[g1]; END IF;
  END IF;
  FOR i IN w0 + 1 .. w1 LOOP
    IF i = consume THEN
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

-- Batch b owns guards g_end[b-1]+1 .. g_end[b] and writes w_end[b-1]+1 .. w_end[b] (1-based,
-- g_end[0] = 0). First takes the partition's transaction-level advisory lock (lock_key), which
-- serializes guarded commits on a partition across every connection, so an Absent guard cannot be
-- defeated by a concurrent insert. failed[b]: the key of batch b's first failed guard, or NULL.
-- protect: each batch runs in its own subtransaction, and one the server refuses (an error) is
-- undone alone, refused[b] holding "SQLSTATE message"; the caller asks for it only after a call
-- without it failed, so the common path pays for no subtransaction.
CREATE OR REPLACE FUNCTION {apply_many}(p text, lock_key bigint, g_end int[], gk bytea[], gv bytea[],
                                        absent boolean[], w_end int[], wk bytea[], wv bytea[], consume int[],
                                        protect boolean, OUT failed bytea[], OUT refused text[])
LANGUAGE plpgsql AS $$
DECLARE
  b int;
  g0 int := 0;
  w0 int := 0;
  one bytea;
  why text;
BEGIN
  failed := '{{}}';
  refused := '{{}}';
  PERFORM pg_advisory_xact_lock(lock_key);
  FOR b IN 1 .. coalesce(array_length(g_end, 1), 0) LOOP
    why := NULL;
    IF protect THEN
      BEGIN
        one := {apply_one}(p, g0, g_end[b], gk, gv, absent, consume[b], w0, w_end[b], wk, wv);
      EXCEPTION WHEN OTHERS THEN
        one := NULL;
        why := SQLSTATE || ' ' || SQLERRM;
      END;
    ELSE
      one := {apply_one}(p, g0, g_end[b], gk, gv, absent, consume[b], w0, w_end[b], wk, wv);
    END IF;
    failed := failed || one;
    refused := refused || why;
    g0 := g_end[b];
    w0 := w_end[b];
  END LOOP;
END
$$;

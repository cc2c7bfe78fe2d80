-- Version 10: the view {timers_view} (default timerwheel_kv_timers), the pending timers with typed
-- columns an operator queries with psql, decoded in plain SQL from the keys timers/keys.py lays out:
-- "\x00T" rows (scheduled, and backed off: state 'retrying') and "\x00P" rows (parked). Malformed rows
-- are left out, as list_timers() leaves them out. Columns: partition, shard, kind (1..255),
-- reference (bytea) and reference_text (it as text when it is UTF-8 without NUL, else NULL),
-- due_at_ms and due_at (when it fires next; a parked timer's original due time, as list_timers()
-- reports it), attempt (0 when scheduled), state ('scheduled', 'retrying', 'parked'), is_schedule (a
-- recurring schedule's occurrence: reference is its name), original_due_at_ms / original_due_at (the
-- time it was scheduled for), parked_at_ms / parked_at (NULL unless parked). Times *_ms are Unix epoch
-- ms as numeric (a key holds an unsigned 64-bit time); a timestamptz is NULL past PostgreSQL's range.
-- Every byte read is guarded by a CASE on the key's length, since PostgreSQL may evaluate a query's
-- filters in any order and get_byte() raises past the end.
CREATE OR REPLACE VIEW {timers_view} AS
SELECT partition, shard, kind, reference,
  CASE WHEN encode(reference, 'hex') ~ ('^(0[1-9a-f]|[1-7][0-9a-f]|(c[2-9a-f]|d[0-9a-f])[89ab][0-9a-f]'
    '|e0[ab][0-9a-f][89ab][0-9a-f]|(e[1-9a-cef][89ab][0-9a-f]|ed[89][0-9a-f])[89ab][0-9a-f]'
    '|(f0[9ab][0-9a-f]|f[1-3][89ab][0-9a-f]|f48[0-9a-f])[89ab][0-9a-f][89ab][0-9a-f])*$')
    THEN convert_from(reference, 'UTF8') END AS reference_text,
  due_at_ms, CASE WHEN due_at_ms < 9223372036854775 THEN to_timestamp(due_at_ms / 1000.0) END AS due_at,
  attempt, state, is_schedule,
  original_due_at_ms,
  CASE WHEN original_due_at_ms < 9223372036854775 THEN to_timestamp(original_due_at_ms / 1000.0) END
    AS original_due_at,
  parked_at_ms, CASE WHEN parked_at_ms < 9223372036854775 THEN to_timestamp(parked_at_ms / 1000.0) END AS parked_at
FROM (
  SELECT partition, shard, kind, reference, attempt, is_schedule,
    CASE WHEN parked THEN original_ms ELSE head_ms END AS due_at_ms,
    CASE WHEN parked THEN 'parked' WHEN attempt > 0 THEN 'retrying' ELSE 'scheduled' END AS state,
    original_ms AS original_due_at_ms,
    CASE WHEN parked THEN head_ms END AS parked_at_ms
  FROM (
    SELECT partition, shard, parked, kind, variant, variant >= 2 AS is_schedule,
      substring(key FROM CASE WHEN backed_off THEN 25 ELSE 13 END) AS reference,
      CASE WHEN backed_off THEN attempt ELSE 0 END AS attempt,
      head_ms, CASE WHEN backed_off THEN retry_original_ms ELSE head_ms END AS original_ms,
      length(key) - CASE WHEN backed_off THEN 24 ELSE 12 END AS reference_length,
      backed_off, value_ok
    FROM (
      SELECT partition, shard, key, substring(key FROM 2 FOR 1) = '\x50'::bytea AS parked,
        CASE WHEN length(key) >= 12 THEN get_byte(key, 10) END AS kind,
        CASE WHEN length(key) >= 12 THEN get_byte(key, 11) END AS variant,
        CASE WHEN length(key) >= 12 THEN get_byte(key, 11) % 2 = 1 END AS backed_off,
        CASE WHEN length(key) >= 24 THEN ('x' || encode(substring(key FROM 13 FOR 4), 'hex'))::bit(32)::int8 END
          AS attempt,
        CASE WHEN length(key) >= 12 THEN (('x' || encode(substring(key FROM 3 FOR 8), 'hex'))::bit(64)::int8
          ::numeric + 18446744073709551616) % 18446744073709551616 END AS head_ms,
        CASE WHEN length(key) >= 24 THEN (('x' || encode(substring(key FROM 17 FOR 8), 'hex'))::bit(64)::int8
          ::numeric + 18446744073709551616) % 18446744073709551616 END AS retry_original_ms,
        -- a parked row's value: its last error's length u16 BE, the error, the timer's value
        substring(key FROM 2 FOR 1) <> '\x50'::bytea OR CASE WHEN length(value) >= 2
          THEN get_byte(value, 0) * 256 + get_byte(value, 1) + 2 <= length(value) ELSE false END AS value_ok
      FROM {t}
      WHERE (key >= '\x0054'::bytea AND key < '\x0055'::bytea) OR (key >= '\x0050'::bytea AND key < '\x0051'::bytea)
    ) AS fields
  ) AS timer_row
  -- the checks keys.parse() and parse_parked() make (2024: keys.MAX_REFERENCE_BYTES)
  WHERE kind > 0 AND variant <= 3 AND (NOT backed_off OR (attempt IS NOT NULL AND attempt > 0))
    AND (backed_off OR NOT parked) AND reference_length <= 2024 AND value_ok
) AS timer;

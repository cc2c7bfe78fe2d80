-- Version 10: the view timerwheel_timers, the pending timers with typed columns an operator queries
-- with the sqlite3 shell, decoded in plain SQL from the keys timers/keys.py lays out: "\x00T" rows
-- (scheduled, and backed off: state 'retrying') and "\x00P" rows (parked). Malformed rows are left
-- out, as list_timers() leaves them out. Columns: partition, shard, kind (1..255), reference (a BLOB;
-- CAST(reference AS TEXT) shows a UTF-8 one), due_at_ms and due_at (when it fires next; a parked
-- timer's original due time, as list_timers() reports it), attempt (0 when scheduled), state
-- ('scheduled', 'retrying', 'parked'), is_schedule (1: a recurring schedule's occurrence, reference
-- its name), original_due_at_ms / original_due_at (the time it was scheduled for), parked_at_ms /
-- parked_at (NULL unless parked). Times *_ms are Unix epoch ms (a REAL past 2**63-1, which SQLite's
-- integers do not hold), times without the suffix ISO 8601 UTC text.
-- SQLite has no function that reads an integer from bytes: each is summed from the nibbles of
-- hex(key), h below, nibble p being instr('0123456789ABCDEF', substr(h, p, 1)) - 1.
CREATE VIEW IF NOT EXISTS timerwheel_timers AS
SELECT partition, shard, kind, reference, due_at_ms,
  strftime('%Y-%m-%dT%H:%M:%S', due_at_ms / 1000, 'unixepoch') || printf('.%03dZ', due_at_ms % 1000) AS due_at,
  attempt, state, is_schedule, original_due_at_ms,
  strftime('%Y-%m-%dT%H:%M:%S', original_due_at_ms / 1000, 'unixepoch') || printf('.%03dZ', original_due_at_ms % 1000)
    AS original_due_at,
  parked_at_ms,
  strftime('%Y-%m-%dT%H:%M:%S', parked_at_ms / 1000, 'unixepoch') || printf('.%03dZ', parked_at_ms % 1000) AS parked_at
FROM (
  SELECT partition, shard, kind, reference, attempt, is_schedule,
    CASE WHEN parked THEN original_ms ELSE head_ms END AS due_at_ms,
    CASE WHEN parked THEN 'parked' WHEN attempt > 0 THEN 'retrying' ELSE 'scheduled' END AS state,
    original_ms AS original_due_at_ms,
    CASE WHEN parked THEN head_ms END AS parked_at_ms
  FROM (
    SELECT partition, shard, parked, kind, variant, variant >= 2 AS is_schedule, backed_off,
      substr(key, CASE WHEN backed_off THEN 25 ELSE 13 END) AS reference,
      length(key) - CASE WHEN backed_off THEN 24 ELSE 12 END AS reference_length,
      CASE WHEN backed_off THEN attempt ELSE 0 END AS attempt,
      CASE WHEN head < 0 THEN head + 18446744073709551616.0 ELSE head END AS head_ms,
      CASE WHEN NOT backed_off THEN (CASE WHEN head < 0 THEN head + 18446744073709551616.0 ELSE head END)
        WHEN original < 0 THEN original + 18446744073709551616.0 ELSE original END AS original_ms,
      -- a parked row's value: its last error's length u16 BE, the error, the timer's value
      NOT parked OR (length(value) >= 2 AND
        (((instr('0123456789ABCDEF', substr(vh, 1, 1)) - 1) << 12) | ((instr('0123456789ABCDEF', substr(vh, 2, 1)) - 1) << 8)
         | ((instr('0123456789ABCDEF', substr(vh, 3, 1)) - 1) << 4) | (instr('0123456789ABCDEF', substr(vh, 4, 1)) - 1))
        + 2 <= length(value)) AS value_ok
    FROM (
      SELECT partition, shard, key, value, hex(substr(value, 1, 2)) AS vh, substr(h, 1, 4) = '0050' AS parked,
        length(key) >= 12 AND (instr('0123456789ABCDEF', substr(h, 24, 1)) - 1) % 2 = 1 AS backed_off,
        ((instr('0123456789ABCDEF', substr(h, 21, 1)) - 1) << 4) | (instr('0123456789ABCDEF', substr(h, 22, 1)) - 1) AS kind,
        ((instr('0123456789ABCDEF', substr(h, 23, 1)) - 1) << 4) | (instr('0123456789ABCDEF', substr(h, 24, 1)) - 1) AS variant,
        (((instr('0123456789ABCDEF', substr(h, 25, 1)) - 1) << 28)
        | ((instr('0123456789ABCDEF', substr(h, 26, 1)) - 1) << 24)
        | ((instr('0123456789ABCDEF', substr(h, 27, 1)) - 1) << 20)
        | ((instr('0123456789ABCDEF', substr(h, 28, 1)) - 1) << 16)
        | ((instr('0123456789ABCDEF', substr(h, 29, 1)) - 1) << 12)
        | ((instr('0123456789ABCDEF', substr(h, 30, 1)) - 1) << 8)
        | ((instr('0123456789ABCDEF', substr(h, 31, 1)) - 1) << 4)
        | (instr('0123456789ABCDEF', substr(h, 32, 1)) - 1)) AS attempt,
        (((instr('0123456789ABCDEF', substr(h, 5, 1)) - 1) << 60)
        | ((instr('0123456789ABCDEF', substr(h, 6, 1)) - 1) << 56)
        | ((instr('0123456789ABCDEF', substr(h, 7, 1)) - 1) << 52)
        | ((instr('0123456789ABCDEF', substr(h, 8, 1)) - 1) << 48)
        | ((instr('0123456789ABCDEF', substr(h, 9, 1)) - 1) << 44)
        | ((instr('0123456789ABCDEF', substr(h, 10, 1)) - 1) << 40)
        | ((instr('0123456789ABCDEF', substr(h, 11, 1)) - 1) << 36)
        | ((instr('0123456789ABCDEF', substr(h, 12, 1)) - 1) << 32)
        | ((instr('0123456789ABCDEF', substr(h, 13, 1)) - 1) << 28)
        | ((instr('0123456789ABCDEF', substr(h, 14, 1)) - 1) << 24)
        | ((instr('0123456789ABCDEF', substr(h, 15, 1)) - 1) << 20)
        | ((instr('0123456789ABCDEF', substr(h, 16, 1)) - 1) << 16)
        | ((instr('0123456789ABCDEF', substr(h, 17, 1)) - 1) << 12)
        | ((instr('0123456789ABCDEF', substr(h, 18, 1)) - 1) << 8)
        | ((instr('0123456789ABCDEF', substr(h, 19, 1)) - 1) << 4)
        | (instr('0123456789ABCDEF', substr(h, 20, 1)) - 1)) AS head,
        (((instr('0123456789ABCDEF', substr(h, 33, 1)) - 1) << 60)
        | ((instr('0123456789ABCDEF', substr(h, 34, 1)) - 1) << 56)
        | ((instr('0123456789ABCDEF', substr(h, 35, 1)) - 1) << 52)
        | ((instr('0123456789ABCDEF', substr(h, 36, 1)) - 1) << 48)
        | ((instr('0123456789ABCDEF', substr(h, 37, 1)) - 1) << 44)
        | ((instr('0123456789ABCDEF', substr(h, 38, 1)) - 1) << 40)
        | ((instr('0123456789ABCDEF', substr(h, 39, 1)) - 1) << 36)
        | ((instr('0123456789ABCDEF', substr(h, 40, 1)) - 1) << 32)
        | ((instr('0123456789ABCDEF', substr(h, 41, 1)) - 1) << 28)
        | ((instr('0123456789ABCDEF', substr(h, 42, 1)) - 1) << 24)
        | ((instr('0123456789ABCDEF', substr(h, 43, 1)) - 1) << 20)
        | ((instr('0123456789ABCDEF', substr(h, 44, 1)) - 1) << 16)
        | ((instr('0123456789ABCDEF', substr(h, 45, 1)) - 1) << 12)
        | ((instr('0123456789ABCDEF', substr(h, 46, 1)) - 1) << 8)
        | ((instr('0123456789ABCDEF', substr(h, 47, 1)) - 1) << 4)
        | (instr('0123456789ABCDEF', substr(h, 48, 1)) - 1)) AS original
      FROM (SELECT partition, shard, key, value, hex(key) AS h FROM timerwheel_kv
            WHERE (key >= x'0054' AND key < x'0055') OR (key >= x'0050' AND key < x'0051'))
    )
  )
  -- the checks keys.parse() and parse_parked() make (2024: keys.MAX_REFERENCE_BYTES)
  WHERE kind > 0 AND variant <= 3 AND (NOT backed_off OR attempt > 0)
    AND (backed_off OR NOT parked) AND reference_length <= 2024 AND reference_length >= 0 AND value_ok
);

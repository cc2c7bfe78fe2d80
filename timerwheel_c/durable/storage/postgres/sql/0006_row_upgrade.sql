-- Version 6 adds no table: the timer layer's identity rows, derived from the stored timer rows, are
-- now written by version 8's rewrite (storage/upgrades.py, timers/key_upgrade.py).
SELECT 1;

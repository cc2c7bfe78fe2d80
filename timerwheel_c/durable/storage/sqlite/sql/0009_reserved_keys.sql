-- Version 9 adds no table: the timer layer moves its rows into the reserved key space (0x00 first)
-- and names every timer (storage/upgrades.py, timers/key_upgrade.py), in the transaction that
-- records this version.
SELECT 1;

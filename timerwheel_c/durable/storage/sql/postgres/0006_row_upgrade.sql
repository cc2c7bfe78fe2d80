-- Version 6 adds no table: the layers above derive new rows from the stored ones (storage/upgrades.py;
-- the timer layer's identity rows), in the transaction that records this version.
SELECT 1;

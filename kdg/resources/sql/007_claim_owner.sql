-- Claims belong to one table, not to a name.
--
-- A claim table (kdg_dedup_<n>) is keyed by its sink table's identity, a name. Until now a table dropped
-- and made again under that name inherited the old table's claims: every record was suppressed as a
-- duplicate, and nothing was written (exit 0). Each window now records the oid of the table its claims
-- were made for; a writer compares it with the table it finds (kdg/store/owners.py) before reading a record.
--
-- NULL: not recorded yet (claims made before 007, or forgotten by `kdg db forget`); the next exactly-once
-- writer records the table it finds then.
ALTER TABLE kdg_windows ADD COLUMN sink_oid oid;

-- The producer ledger stores runs of records as one row each: O(delivered batches), not O(records).
--
-- A key kdg makes is derivable from its sequence number: a UUIDv7 is the time it was taken, a random part
-- fixed for the run, and the sequence in its last 8 hex digits; an --id template is text around {seq}. A
-- delivered batch of the idempotent producer is a run of consecutive sequence numbers at consecutive offsets
-- of one partition, so one row can stand for all of it:
--   idempotency_key  the first key's text before its sequence (the "head"),
--   seq, "offset"    the first record's,
--   seq_count        how many records (NULL: the row is one record, its key written whole, as before 006),
--   key_form         how a key is made from the head and a sequence: 'x8' head || 8 lower-case hex digits,
--                    'd' head || decimal || key_suffix.
-- kdg_ledger_keys expands the ledger into one row per record, exactly the rows 005 stored; the audit reads it.
ALTER TABLE kdg_ledger ADD COLUMN seq_count integer CHECK (seq_count > 0),
                       ADD COLUMN key_form text CHECK (key_form IN ('x8', 'd')),
                       ADD COLUMN key_suffix text,
                       ADD CONSTRAINT kdg_ledger_range_form CHECK ((seq_count IS NULL) = (key_form IS NULL));

CREATE VIEW kdg_ledger_keys AS
SELECT l.run_id,
       CASE l.key_form WHEN 'x8' THEN l.idempotency_key || lpad(to_hex(s.seq), 8, '0')
                       WHEN 'd' THEN l.idempotency_key || s.seq::text || coalesce(l.key_suffix, '')
                       ELSE l.idempotency_key END AS idempotency_key,
       l.topic, s.seq, l.status, l."partition", l."offset" + (s.seq - l.seq) AS "offset", l.error, l.recorded_at
FROM kdg_ledger l CROSS JOIN LATERAL generate_series(l.seq, l.seq + coalesce(l.seq_count, 1) - 1) AS s(seq);

-- Claims of offset keys kept as runs: one claim row per run of consecutive offsets, not one per record.
--
-- A record whose key is its own coordinates, topic/partition/offset (`--id-from offset`, and every record a
-- key falls back to them for), is claimed by those coordinates. Such claims are now kept as runs: a row's
-- "offset" is the run's first offset, last_offset its last, idempotency_key the first offset's key. A batch of
-- 10,000 such records in six partitions claims with a few rows where it made 10,000: the claim row was most
-- of what exactly-once added to Postgres's work per record (benchmarks/connect_upsert_bench.py). A claim
-- of any other key keeps last_offset NULL and is matched by its key, as before.
--
-- Runs never overlap one another in a claim table: every claim of a key without a time is made under the
-- table's lock for such keys (kdg/store/claims.py) after a look-up. So the run that could hold an offset is
-- the one starting last at or before it, one step down this index (kdg_claim_keys expands runs to keys).
--
-- The claims made before are turned into runs of one record (their rows rewritten, in this migration's
-- transaction: 6.1 s for a million offset-key claims on the benchmark machine), so every offset key is found
-- the same way.
ALTER TABLE kdg_dedup ADD COLUMN last_offset bigint CHECK (last_offset >= "offset");
UPDATE kdg_dedup SET last_offset = "offset" WHERE idempotency_key = topic || '/' || "partition" || '/' || "offset";
CREATE INDEX kdg_dedup_runs ON kdg_dedup (topic, "partition", "offset") INCLUDE (last_offset)
    WHERE last_offset IS NOT NULL;

-- Every claim as one row per record: a run expanded to the keys of its offsets. For readers (kdg audit).
CREATE VIEW kdg_claim_keys AS
    SELECT d.sink_table,
           CASE WHEN d.last_offset IS NULL THEN d.idempotency_key
                ELSE d.topic || '/' || d."partition" || '/' || o END AS idempotency_key,
           d.key_ms, d.topic, d."partition", o AS "offset", d.claimed_at, d.filtered
    FROM kdg_dedup d, generate_series(d."offset", coalesce(d.last_offset, d."offset")) AS o;

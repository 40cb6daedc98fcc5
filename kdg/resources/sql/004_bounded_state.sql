-- Bounded state: dedup claims and the producer ledger are partitioned by time, and whole partitions are
-- dropped when they leave their table's retention window (kdg/store/windows.py runs it); nothing is
-- deleted row by row.
--
-- * kdg_dedup is LIST-partitioned by sink table (kdg_dedup_<n>: one claim table per sink table, so each
--   keeps its own window) and each of those is RANGE-partitioned by key_ms, the time a key carries:
--   a UUIDv7's milliseconds (kdg's own ids), else the time of its first claim. A UUIDv7's key_ms is a
--   function of the key, so the primary key (sink_table, idempotency_key, key_ms) is unique per key.
--   Other keys are claimed under a lock with a look-up across the table's partitions (kdg/store/claims.py).
-- * kdg_ledger is RANGE-partitioned by recorded_at.
-- * kdg_windows holds each one's retention, partition width and horizon: state of times below the
--   horizon was dropped, so a key below it is no longer claimed (it can be neither proven new nor old).

-- The Unix milliseconds a UUIDv7 carries (RFC 9562, lower-case hex, as kdg writes it); NULL for any
-- other key. kdg.store.windows.key_ms is the same function in Python; tests/test_bounded_state.py holds them equal.
CREATE FUNCTION kdg_key_ms(k text) RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN k ~ '^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$'
                THEN ('x' || substr(k, 1, 8) || substr(k, 10, 4))::bit(48)::bigint END
$$;

CREATE TABLE kdg_windows (
    relation       text   PRIMARY KEY,       -- kdg_ledger, or kdg_dedup_<n>: one sink table's claims
    sink_table     text   UNIQUE,            -- whose claims (its identity); NULL for the ledger
    time_column    text   NOT NULL CHECK (time_column IN ('key_ms', 'recorded_at')),
    retention_ms   bigint CHECK (retention_ms > 0),   -- NULL: nothing expires
    retention_from text,                     -- who chose it (NULL: nobody yet, e.g. claims from before 004)
    width_ms       bigint NOT NULL CHECK (width_ms > 0),  -- of the partitions made from now on
    horizon_ms     bigint,                   -- state below this time was dropped (NULL: none was)
    updated_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE kdg_window_parts (
    relation text   NOT NULL REFERENCES kdg_windows ON DELETE CASCADE,
    lo_ms    bigint NOT NULL,
    hi_ms    bigint NOT NULL CHECK (hi_ms > lo_ms),
    part     text   NOT NULL UNIQUE,
    PRIMARY KEY (relation, lo_ms)
);

CREATE SEQUENCE kdg_claim_tables_seq;

-- The partition of window `rel` that holds time `t` (ms), made if missing; NULL if `t` is below the
-- window's horizon (that state was dropped). A new partition spans `t` rounded down to the window's
-- width, clipped so as not to overlap partitions made under another width.
CREATE FUNCTION kdg_window_part(rel text, t bigint) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    w kdg_windows%ROWTYPE;
    lo bigint;
    hi bigint;
    name text;
BEGIN
    SELECT part INTO name FROM kdg_window_parts WHERE relation = rel AND lo_ms <= t AND t < hi_ms;
    IF name IS NOT NULL THEN
        RETURN name;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('kdg_window_part'), hashtext(rel));
    SELECT part INTO name FROM kdg_window_parts WHERE relation = rel AND lo_ms <= t AND t < hi_ms;
    IF name IS NOT NULL THEN
        RETURN name;
    END IF;
    SELECT * INTO STRICT w FROM kdg_windows WHERE relation = rel;
    IF t < w.horizon_ms THEN
        RETURN NULL;
    END IF;
    lo := t - ((t % w.width_ms) + w.width_ms) % w.width_ms;
    hi := lo + w.width_ms;
    lo := greatest(lo, (SELECT max(hi_ms) FROM kdg_window_parts WHERE relation = rel AND hi_ms <= t));
    hi := least(hi, (SELECT min(lo_ms) FROM kdg_window_parts WHERE relation = rel AND lo_ms > t));
    name := format('%s_%s_%s', rel, lo, hi);
    IF w.time_column = 'key_ms' THEN
        EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%s) TO (%s)', name, rel, lo, hi);
    ELSE
        EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)', name, rel,
                       to_timestamp(lo / 1000.0), to_timestamp(hi / 1000.0));
    END IF;
    INSERT INTO kdg_window_parts (relation, lo_ms, hi_ms, part) VALUES (rel, lo, hi, name);
    RETURN name;
END
$$;

-- The claim table of sink table `sink` (an identity), made with its window (no retention yet) if missing.
CREATE FUNCTION kdg_claim_table(sink text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    rel text;
BEGIN
    SELECT relation INTO rel FROM kdg_windows WHERE sink_table = sink;
    IF rel IS NOT NULL THEN
        RETURN rel;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('kdg_claim_table'));
    SELECT relation INTO rel FROM kdg_windows WHERE sink_table = sink;
    IF rel IS NOT NULL THEN
        RETURN rel;
    END IF;
    rel := 'kdg_dedup_' || nextval('kdg_claim_tables_seq');
    EXECUTE format('CREATE TABLE %I PARTITION OF kdg_dedup FOR VALUES IN (%L) PARTITION BY RANGE (key_ms)', rel, sink);
    INSERT INTO kdg_windows (relation, sink_table, time_column, width_ms) VALUES (rel, sink, 'key_ms', 86400000);
    RETURN rel;
END
$$;

-- Claims: from one table to partitions, every claim kept.
ALTER TABLE kdg_dedup RENAME TO kdg_dedup_v3;
ALTER INDEX kdg_dedup_pkey RENAME TO kdg_dedup_v3_pkey;
CREATE TABLE kdg_dedup (
    sink_table      text        NOT NULL,
    idempotency_key text        NOT NULL,
    key_ms          bigint      NOT NULL,   -- kdg_key_ms(idempotency_key), else the first claim's time
    topic           text        NOT NULL,
    "partition"     integer     NOT NULL,
    "offset"        bigint      NOT NULL,
    claimed_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sink_table, idempotency_key, key_ms)
) PARTITION BY LIST (sink_table);

DO $$
DECLARE
    sink text;
    rel text;
    t bigint;
BEGIN
    FOR sink IN SELECT DISTINCT sink_table FROM kdg_dedup_v3 ORDER BY 1 LOOP
        rel := kdg_claim_table(sink);
        FOR t IN SELECT DISTINCT coalesce(kdg_key_ms(idempotency_key), (extract(epoch FROM claimed_at) * 1000)::bigint)
                 FROM kdg_dedup_v3 WHERE sink_table = sink LOOP
            PERFORM kdg_window_part(rel, t);
        END LOOP;
        EXECUTE format('INSERT INTO %I (sink_table, idempotency_key, key_ms, topic, "partition", "offset", claimed_at)
                        SELECT sink_table, idempotency_key,
                               coalesce(kdg_key_ms(idempotency_key), (extract(epoch FROM claimed_at) * 1000)::bigint),
                               topic, "partition", "offset", claimed_at
                        FROM kdg_dedup_v3 WHERE sink_table = $1', rel) USING sink;
    END LOOP;
END
$$;
DROP TABLE kdg_dedup_v3;

-- The ledger: from one table to partitions by the time each row was recorded, every row kept.
ALTER TABLE kdg_ledger RENAME TO kdg_ledger_v3;
ALTER INDEX kdg_ledger_topic_idx RENAME TO kdg_ledger_v3_topic_idx;
-- the same columns, defaults and checks as 001 made (and in the same order: the INSERT below copies by position)
CREATE TABLE kdg_ledger (LIKE kdg_ledger_v3 INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (recorded_at);
CREATE INDEX kdg_ledger_topic_idx ON kdg_ledger (topic, idempotency_key);
INSERT INTO kdg_windows (relation, time_column, width_ms) VALUES ('kdg_ledger', 'recorded_at', 86400000);

DO $$
DECLARE
    t bigint;
BEGIN
    FOR t IN SELECT DISTINCT (extract(epoch FROM recorded_at) * 1000)::bigint / 86400000 * 86400000
             FROM kdg_ledger_v3 LOOP
        PERFORM kdg_window_part('kdg_ledger', t);
    END LOOP;
END
$$;
INSERT INTO kdg_ledger SELECT * FROM kdg_ledger_v3;
DROP TABLE kdg_ledger_v3;

-- kdg core schema: the sink table, the dedup claims, consumer offsets and the producer ledger.

-- The default sink. Deliberately NO unique constraint: at-least-once duplicates must stay visible.
CREATE TABLE IF NOT EXISTS kdg_events (
    row_id          bigserial PRIMARY KEY,
    idempotency_key text        NOT NULL,
    consumer_group  text        NOT NULL,
    topic           text        NOT NULL,
    "partition"     integer     NOT NULL,
    "offset"        bigint      NOT NULL,
    key             bytea,
    value           bytea,
    headers         jsonb,
    consumed_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS kdg_events_key_idx ON kdg_events (topic, consumer_group, idempotency_key);

-- Exactly-once: a key is claimed once per sink table; the claim commits with the sink rows.
CREATE TABLE IF NOT EXISTS kdg_dedup (
    sink_table      text        NOT NULL,
    idempotency_key text        NOT NULL,
    topic           text        NOT NULL,
    "partition"     integer     NOT NULL,
    "offset"        bigint      NOT NULL,
    claimed_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sink_table, idempotency_key)
);

-- Next offset to read per group and partition, written in the same transaction as the results.
-- `fence` grows on every assignment; a writer holding an older fence is a zombie and is refused.
CREATE TABLE IF NOT EXISTS kdg_offsets (
    consumer_group  text        NOT NULL,
    topic           text        NOT NULL,
    "partition"     integer     NOT NULL,
    next_offset     bigint,
    fence           bigint      NOT NULL DEFAULT 0,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, "partition")
);

-- Producer ledger: every record kdg produced and what Kafka said about it.
-- status: acked (with partition/offset), failed, or sent (acks=0: no answer expected).
CREATE TABLE IF NOT EXISTS kdg_ledger (
    run_id          uuid        NOT NULL,
    idempotency_key text        NOT NULL,
    topic           text        NOT NULL,
    seq             bigint      NOT NULL,
    status          text        NOT NULL CHECK (status IN ('acked', 'failed', 'sent')),
    "partition"     integer,
    "offset"        bigint,
    error           text,
    recorded_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS kdg_ledger_topic_idx ON kdg_ledger (topic, idempotency_key);

CREATE TABLE IF NOT EXISTS kdg_producer_runs (
    run_id      uuid        PRIMARY KEY,
    topic       text        NOT NULL,
    guarantee   text        NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    summary     jsonb
);

-- kdg spark-replay: one row per run and the per-partition range [from, to) it covered.
-- When a run is recorded (before or after writing) and when the group's offsets in kdg_offsets
-- advance is decided by the guarantee's commit mode (kdg/replay.py), never here.
CREATE TABLE IF NOT EXISTS kdg_replays (
    replay_id      uuid        PRIMARY KEY,
    consumer_group text        NOT NULL,
    topic          text        NOT NULL,
    sink_table     text        NOT NULL,
    guarantee      text        NOT NULL,
    ranges         jsonb       NOT NULL,   -- {"partition": [from, to)}
    status         text        NOT NULL CHECK (status IN ('running', 'done', 'failed')),
    started_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz,
    summary        jsonb,
    error          text
);
CREATE INDEX IF NOT EXISTS kdg_replays_group_idx ON kdg_replays (consumer_group, topic, started_at);

-- The accounts the payments move: psql "$KDG_PG_DSN" -f setup.sql
CREATE TABLE IF NOT EXISTS accounts (id text PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);
INSERT INTO accounts (id) SELECT 'acct-' || n FROM generate_series(0, 9) AS n ON CONFLICT DO NOTHING;

-- One identity per table: kdg_dedup and kdg_replays name a sink table by its schema-qualified name as
-- Postgres resolves it (kdg/store/identity.py), never by how a user spelled it. Before this, claims were
-- keyed by the spelling, so `idt` and `public.idt` were two namespaces for one table (every record written
-- twice), and `ev` under two search paths was one namespace for two tables (the second one lost everything).
--
-- Rows written before carry the spelling. An unqualified one is resolved here, with the search path of the
-- role that migrates (the writers' search path is not known any more); a table that no longer exists is
-- put in current_schema(). A key claimed under two spellings of one table keeps one claim: the first
-- spelling's, in the order below — either one proves the record was written.

CREATE FUNCTION pg_temp.kdg_identity(spelling text) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT CASE WHEN n.nspname ~ '^[a-z_][a-z0-9_]*$' THEN n.nspname ELSE quote_ident(n.nspname) END || '.' ||
                CASE WHEN c.relname ~ '^[a-z_][a-z0-9_]*$' THEN c.relname ELSE quote_ident(c.relname) END
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.oid = to_regclass(CASE WHEN spelling LIKE '%.%' THEN spelling ELSE quote_ident(spelling) END)),
        CASE WHEN spelling LIKE '%.%' THEN spelling ELSE coalesce(current_schema(), 'public') || '.' || spelling END)
$$;

DO $$
DECLARE
    spelling text;
    identity text;
BEGIN
    FOR spelling IN SELECT DISTINCT sink_table FROM kdg_dedup ORDER BY 1 LOOP
        identity := pg_temp.kdg_identity(spelling);
        CONTINUE WHEN identity = spelling;
        DELETE FROM kdg_dedup d WHERE d.sink_table = spelling
            AND EXISTS (SELECT 1 FROM kdg_dedup k WHERE k.sink_table = identity AND k.idempotency_key = d.idempotency_key);
        UPDATE kdg_dedup SET sink_table = identity WHERE sink_table = spelling;
    END LOOP;
    UPDATE kdg_replays SET sink_table = pg_temp.kdg_identity(sink_table)
    WHERE sink_table <> pg_temp.kdg_identity(sink_table);
END
$$;

DROP FUNCTION pg_temp.kdg_identity(text);

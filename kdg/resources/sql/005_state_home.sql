-- kdg's state partitions live where kdg's state lives, whatever the search path of the session that makes them.
--
-- Until now kdg_claim_table and kdg_window_part made their tables in the caller's first schema: a
-- consumer under search_path=sa,public put its claim table (kdg_dedup_<n>) and its partitions in sa. Every
-- session whose path does not name sa then failed on that window ("relation kdg_dedup_<n> does not exist"),
-- `kdg db maintain` included, and DROP SCHEMA sa CASCADE took the claims with it. The two functions now run
-- with the search path pinned to kdg's schema (the one kdg_windows is in), and tables already made
-- elsewhere are moved there, rows and all.
DO $$
DECLARE
    home regnamespace := (SELECT relnamespace FROM pg_class WHERE oid = 'kdg_windows'::regclass);
    misplaced regclass;
BEGIN
    EXECUTE format('ALTER FUNCTION kdg_window_part(text, bigint) SET search_path = %s, pg_temp', home);
    EXECUTE format('ALTER FUNCTION kdg_claim_table(text) SET search_path = %s, pg_temp', home);
    FOR misplaced IN
        SELECT c.oid::regclass
        FROM (SELECT relid FROM pg_partition_tree('kdg_dedup') UNION ALL
              SELECT relid FROM pg_partition_tree('kdg_ledger')) t
        JOIN pg_class c ON c.oid = t.relid
        WHERE c.relnamespace <> home
    LOOP
        EXECUTE format('ALTER TABLE %s SET SCHEMA %s', misplaced, home);
    END LOOP;
END
$$;

"""One identity per table: exactly-once claims are keyed by the table Postgres resolves a spelling to.

Before migration 003, ``kdg_dedup`` was keyed by the spelling: ``idt`` and ``public.idt`` wrote every
record twice into one table, and ``ev`` under two search paths lost every record of the second table.
Claims made under the old spelling keys are converted by the migrations; tests/test_bounded_state.py runs
the old kdg on a database and finishes its work with today's.
"""

import uuid
from urllib.parse import urlsplit, urlunsplit

from conftest import as_json, audited
from pg_server import fresh_database, run_sql

from kdg.store.pg import Store

N = 600


def _with_search_path(dsn: str, path: str) -> str:
    """``dsn`` whose sessions start with ``search_path`` set (asyncpg passes unknown URL parameters to the server)."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(query=(f"{parts.query}&" if parts.query else "") + f"search_path={path}"))


def test_three_spellings_of_one_table_write_each_record_once(kdg, topic):
    table = f"idt_{uuid.uuid4().hex[:8]}"
    kdg("produce", topic, "-g", "exactly-once", "--count", N, "--json")
    spellings = [table, f"public.{table}", f'"public"."{table}"']
    reports = [as_json(kdg("consume", topic, "-G", f"g{i}-{topic}", "-g", "exactly-once", "--table", spelling, "-e",
                           "--json")) for i, spelling in enumerate(spellings)]
    # one table, one namespace: the later groups' records were all claimed already, and none was written again
    assert [r["duplicates_suppressed"] for r in reports] == [0, N, N], reports
    audit = audited(kdg, topic, "--table", spellings[2], "-G", f"g0-{topic}")
    assert (audit["rows"], audit["processed_unique"], audit["duplicates"], audit["lost"]) == (N, N, 0, 0), audit
    # a later group wrote nothing: every record it read was in the table already, not lost (it was called so)
    later = audited(kdg, topic, "--table", spellings[1], "-G", f"g1-{topic}")
    assert (later["rows"], later["lost"], later["written_by_other_groups"], later["balanced"]) == (0, 0, N, True), later


def test_one_spelling_under_two_search_paths_is_two_tables(kdg, conn, topic):
    """``"Ev"`` (quoted, mixed case) in schema sa, then in schema sb: each table gets every record."""
    sa, sb = (f"s{c}_{uuid.uuid4().hex[:6]}" for c in "ab")
    with Store(conn.pg_dsn) as store:
        for schema in (sa, sb):
            store.execute(f'CREATE SCHEMA "{schema}"')
    kdg("produce", topic, "-g", "exactly-once", "--count", N, "--json")
    for schema in (sa, sb):
        env = {"KDG_PG_DSN": _with_search_path(conn.pg_dsn, f"{schema},public")}
        report = as_json(kdg("consume", topic, "-G", f"g-{schema}", "-g", "exactly-once", "--table", '"Ev"', "-e",
                             "--json", env=env))
        assert (report["consumed"], report["duplicates_suppressed"]) == (N, 0), (schema, report)
        audit = audited(kdg, topic, "--table", '"Ev"', "-G", f"g-{schema}", env=env)
        assert (audit["rows"], audit["lost"], audit["duplicates"]) == (N, 0, 0), (schema, audit)
    with Store(conn.pg_dsn) as store:
        assert [store.fetchval(f'SELECT count(*) FROM "{s}"."Ev"') for s in (sa, sb)] == [N, N]
        claims = store.fetch("SELECT sink_table, count(*) AS n FROM kdg_dedup WHERE topic = $1 GROUP BY 1 ORDER BY 1",
                             topic)
    assert [(r["sink_table"], r["n"]) for r in claims] == [(f'{sa}."Ev"', N), (f'{sb}."Ev"', N)]
    # the claim tables live with kdg's state, not in the consumer's first schema: dropping the user's
    # schemas leaves them, and a session with another search path maintains them
    with Store(conn.pg_dsn) as store:
        homes = store.fetch("""SELECT DISTINCT c.relnamespace::regnamespace::text AS home FROM kdg_windows w,
                               pg_partition_tree(w.relation::regclass) t JOIN pg_class c ON c.oid = t.relid
                               WHERE w.sink_table = ANY($1)""", [f'{s}."Ev"' for s in (sa, sb)])
        for schema in (sa, sb):
            store.execute(f'DROP SCHEMA "{schema}" CASCADE')
    assert [r["home"] for r in homes] == ["public"], homes
    maintained = as_json(kdg("db", "maintain", "--json"))
    assert {f'{s}."Ev"' for s in (sa, sb)} <= {w["sink_table"] for w in maintained["windows"]}, maintained


def test_migrate_moves_state_tables_made_under_another_search_path_home(kdg, conn):
    """Before migration 005 a claim table was made in the consumer's first schema; migrating moves it,
    its partitions and rows to kdg's schema."""
    with fresh_database(conn.pg_dsn, f"kdg_{uuid.uuid4().hex[:10]}") as dsn:
        kdg("db", "migrate", env={"KDG_PG_DSN": dsn})
        run_sql(dsn, """SELECT kdg_window_part(kdg_claim_table('app.t'), 5);
                        INSERT INTO kdg_dedup VALUES ('app.t', 'k', 5, 'topic', 0, 0);
                        ALTER TABLE kdg_dedup_1_0_86400000 SET SCHEMA app; ALTER TABLE kdg_dedup_1 SET SCHEMA app;
                        DELETE FROM kdg_schema_migrations WHERE version = '005_state_home.sql'""")
        assert as_json(kdg("db", "migrate", "--json", env={"KDG_PG_DSN": dsn}))["applied"] == ["005_state_home.sql"]
        with Store(dsn) as store:
            assert store.fetchval("SELECT count(*) FROM public.kdg_dedup_1_0_86400000 WHERE key_ms = 5") == 1
            assert store.fetchval("SELECT count(*) FROM pg_class WHERE relnamespace = 'app'::regnamespace") == 0


def test_a_search_path_without_kdgs_schema_is_pointed_at_it_not_at_a_second_copy(kdg, conn, topic):
    """kdg's tables in public, a DSN whose search_path is only another schema: the consumer used to say "run kdg
    db migrate" for that DSN, which made a second copy of kdg's state there, and exactly-once through the two
    copies wrote every record of one table twice. Now both name the schema to put on the search path."""
    schema = f"sp_{uuid.uuid4().hex[:6]}"
    run_sql(conn.pg_dsn, f"CREATE SCHEMA {schema}")
    env = {"KDG_PG_DSN": _with_search_path(conn.pg_dsn, schema)}
    try:
        for argv, code in ((("consume", topic, "-G", f"g-{schema}", "-g", "exactly-once", "--table", "public.t",
                             "-e"), 3), (("db", "migrate"), 2)):
            proc = kdg(*argv, env=env, check=False)
            assert proc.returncode == code and "kdg's tables are in schema public" in proc.stderr \
                and f"search_path%3D{schema},public" in proc.stderr, (argv, proc.returncode, proc.stderr)
        assert as_json(kdg("db", "migrate", "--second-copy", "--json", env=env))["applied"]  # asked for: made
    finally:
        run_sql(conn.pg_dsn, f"DROP SCHEMA {schema} CASCADE")

"""One identity per table: exactly-once claims are keyed by the table Postgres resolves a spelling to.

Before migration 003, ``kdg_dedup`` was keyed by the spelling: ``idt`` and ``public.idt`` wrote every
record twice into one table, and ``ev`` under two search paths lost every record of the second table.
"""

import uuid
from urllib.parse import urlsplit, urlunsplit

from conftest import as_json, audited
from pg_server import fresh_database

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


def test_claims_made_under_the_old_spelling_keys_survive_the_migration(kdg, conn, stack, topic):
    """A table consumed halfway by kdg before migration 003, finished after it under another spelling.

    The old rows are made as the old code made them: ``kdg_dedup.sink_table`` holding the spelling
    (``idt``; a few keys claimed under ``public.idt`` too, as two spellings did), and 003 not applied.
    """
    table = f"idt_{uuid.uuid4().hex[:8]}"
    with fresh_database(stack.pg_dsn, f"kdg_{uuid.uuid4().hex[:10]}") as dsn:
        env = {"KDG_PG_DSN": dsn}
        kdg("db", "migrate", env=env)
        kdg("produce", topic, "-g", "exactly-once", "--count", N, "--json", env=env)
        first = as_json(kdg("consume", topic, "-G", f"a-{topic}", "-g", "exactly-once", "--table", table,
                            "-c", N // 2, "--batch-size", 100, "--json", env=env))
        assert first["consumed"] == N // 2
        with Store(dsn) as store:  # back to the schema and keys the code before 003 left
            store.execute("UPDATE kdg_dedup SET sink_table = $1", table)
            store.execute("""INSERT INTO kdg_dedup (sink_table, idempotency_key, topic, "partition", "offset")
                             SELECT 'public.' || sink_table, idempotency_key, topic, "partition", "offset"
                             FROM kdg_dedup ORDER BY idempotency_key LIMIT 10""")
            store.execute("DELETE FROM kdg_schema_migrations WHERE version = '003_table_identity.sql'")
        assert kdg("consume", topic, "-G", "g", "-e", env=env, check=False).returncode == 3  # 'run kdg db migrate'
        kdg("db", "migrate", env=env)
        rest = as_json(kdg("consume", topic, "-G", f"b-{topic}", "-g", "exactly-once", "--table", f"public.{table}",
                           "-e", "--json", env=env))
        assert (rest["consumed"], rest["duplicates_suppressed"]) == (N, N // 2), rest
        audit = audited(kdg, topic, "--table", table, env=env)  # both groups' rows: each record once
        assert (audit["acked"], audit["rows"], audit["lost"], audit["duplicates"]) == (N, N, 0, 0), audit
        with Store(dsn) as store:
            claims = store.fetch("SELECT sink_table, count(*) AS n FROM kdg_dedup GROUP BY 1")
        assert [(r["sink_table"], r["n"]) for r in claims] == [(f"public.{table}", N)]

"""kdg against a PostgreSQL server of the user's own, not the stack's: password login, sink tables in schema ``app``.

The module works in a database of its own on the ``external_pg`` server, so it starts un-migrated
whatever else the session did there. Every command gets the external DSN (``KDG_PG_DSN``, and
``--pg-dsn`` where a user would type it), and none may print its password.
"""

import uuid
from urllib.parse import urlsplit

import pytest
from conftest import as_json
from pg_server import fresh_database

from kdg.store.pg import Store

GUARANTEES = ["at-most-once", "at-least-once", "exactly-once"]


@pytest.fixture(scope="module")
def dsn(external_pg):
    """A fresh database on the external server (schema ``app`` created, kdg's tables not yet)."""
    with fresh_database(external_pg, f"kdg_{uuid.uuid4().hex[:10]}") as fresh:
        yield fresh


@pytest.fixture(scope="module")
def migrated(session_kdg, dsn) -> str:
    run(session_kdg, dsn, "db", "migrate", "--pg-dsn", dsn)
    return dsn


def run(kdg, dsn: str, *args, check: bool = True, timeout: float = 300):
    """``kdg ARGS`` pointed at ``dsn``; whatever it prints must not contain the DSN's password."""
    proc = kdg(*args, env={"KDG_PG_DSN": dsn}, check=check, timeout=timeout)
    password = urlsplit(dsn).password
    assert password not in proc.stdout and password not in proc.stderr, f"kdg {args[0]} printed the password"
    return proc


def audit(kdg, dsn: str, topic: str, table: str, *args) -> dict:
    proc = run(kdg, dsn, "audit", topic, "--table", table, *args, "--json", check=False)
    assert proc.returncode in (0, 7), f"kdg audit exited {proc.returncode}:\n{proc.stderr}"
    return as_json(proc)


def error_line(proc) -> str:
    """The one ``error:`` line of a refused command (and no traceback)."""
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def test_a_command_before_migrating_says_so_then_db_migrate_succeeds(kdg, dsn, topic, group):
    for args in (["produce", topic, "-g", "exactly-once", "--count", 10, "--pg-dsn", dsn],
                 ["consume", topic, "-G", group, "-g", "exactly-once", "--table", "app.events", "-e"],
                 ["audit", topic, "--table", "app.events"]):
        proc = run(kdg, dsn, *args, check=False)
        assert proc.returncode == 3, (args[0], proc.returncode, proc.stderr)
        assert "run: kdg db migrate" in error_line(proc), proc.stderr
    assert run(kdg, dsn, "db", "migrate", "--pg-dsn", dsn, check=False).returncode == 0
    assert run(kdg, dsn, "db", "migrate", "--pg-dsn", dsn, check=False).returncode == 0  # nothing left to apply


@pytest.mark.parametrize("guarantee", GUARANTEES)
def test_round_trip_into_a_schema_qualified_table_balances(kdg, migrated, stack, topic, group, guarantee):
    produced = as_json(run(kdg, migrated, "produce", topic, "-g", "exactly-once", "--count", 3000,
                           "--pg-dsn", migrated, "--json"))
    assert (produced["sent"], produced["failed"]) == (3000, 0)
    consumed = as_json(run(kdg, migrated, "consume", topic, "-G", group, "-g", guarantee, "--table", "app.events",
                           "-e", "--batch-size", 500, "--json"))
    assert consumed["consumed"] == 3000
    report = audit(kdg, migrated, topic, "app.events", "-G", group)
    assert (report["acked"], report["processed_unique"], report["lost"], report["duplicates"]) == (3000, 3000, 0, 0)
    assert report["balanced"], report

    with Store(migrated) as store:  # the sink is app.events; kdg's own tables and the ledger stay in public
        assert store.fetchval("SELECT to_regclass('app.events') IS NOT NULL")
        assert store.fetchval("SELECT to_regclass('public.kdg_ledger') IS NOT NULL")
        assert store.fetchval('SELECT count(*) FROM app.events WHERE topic = $1', topic) == 3000
        assert store.fetchval("SELECT count(*) FROM kdg_ledger_keys WHERE topic = $1", topic) == 3000
        if guarantee == "exactly-once":
            assert store.fetchval("SELECT count(*) FROM kdg_dedup WHERE sink_table = 'app.events' AND topic = $1",
                                  topic) == 3000
    with Store(stack.pg_dsn) as embedded:  # nothing of this went to the stack's own Postgres
        assert embedded.fetchval("SELECT count(*) FROM kdg_ledger WHERE topic = $1", topic) == 0


@pytest.mark.long  # make test budget: the other external-server tests stay, Spark's writer is the same Store
def test_spark_replay_into_a_schema_qualified_table_is_idempotent(kdg, migrated, topic):
    run(kdg, migrated, "produce", topic, "-g", "exactly-once", "--count", 3000, "--pg-dsn", migrated)
    replay = ("spark-replay", topic, "-g", "exactly-once", "--table", "app.replayed", "--json")
    first = as_json(run(kdg, migrated, *replay, timeout=600))
    assert (first["table"], first["rows_read"], first["rows_written"]) == ("app.replayed", 3000, 3000)
    report = audit(kdg, migrated, topic, "app.replayed")
    assert (report["lost"], report["duplicates"], report["rows"]) == (0, 0, 3000) and report["balanced"], report
    again = as_json(run(kdg, migrated, *replay, timeout=600))
    assert (again["rows_read"], again["rows_written"], again["duplicates_dropped"]) == (3000, 0, 3000)
    assert audit(kdg, migrated, topic, "app.replayed")["rows"] == 3000


@pytest.mark.parametrize("table, part", [('app."Events', "double-quoted"), ("a.b.c", "NAME or SCHEMA.NAME"),
                                         ("app.", "table name ''")])
@pytest.mark.parametrize("command", ["consume", "audit", "spark-replay"])
def test_a_malformed_table_name_is_refused_in_one_line(kdg, migrated, topic, group, command, table, part):
    args = {"consume": ["-G", group, "-e"], "audit": [], "spark-replay": ["-g", "exactly-once"]}[command]
    proc = run(kdg, migrated, command, topic, *args, "--table", table, check=False)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    line = error_line(proc)
    assert repr(table) in line and part in line, line


def test_a_schema_that_does_not_exist_is_not_created(kdg, migrated, topic, group):
    proc = run(kdg, migrated, "consume", topic, "-G", group, "-e", "--table", "nosuch.events", check=False)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    line = error_line(proc)
    assert 'schema "nosuch" does not exist' in line and "CREATE SCHEMA nosuch" in line, line
    assert ":***@" in line, line  # the DSN is named, its password redacted
    with Store(migrated) as store:
        assert store.fetchval("SELECT to_regnamespace('nosuch') IS NULL")

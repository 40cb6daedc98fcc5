"""Claims belong to one table, not to a name: a table dropped and made again under the same name is a new
table, and the exactly-once claims made for the old one must not suppress its records.

kdg records the oid of the table each claim table was made for (migration 007). A table kdg creates
itself takes its name's old claims with it; a table someone else made again stops an exactly-once consumer
before it reads anything, with one line naming ``kdg db forget --table T``, which deletes them.
"""

import json
import uuid

import pytest
from conftest import as_json

from kdg.store.pg import Store

RECORDS = 300
COLUMNS = ["--column", "n bigint = json:n", "--column", "name text = json:name"]


@pytest.fixture
def table(conn) -> str:
    name = f"app.rebuilt_{uuid.uuid4().hex[:8]}"
    with Store(conn.pg_dsn) as store:
        store.execute("CREATE SCHEMA IF NOT EXISTS app")
    return name


def produce(kdg, topic, tmp_path) -> None:
    src = tmp_path / "orders.jsonl"
    src.write_text("".join(json.dumps({"key": None, "value": json.dumps({"n": i, "name": f"o{i}"}), "headers": []})
                           + "\n" for i in range(RECORDS)))
    assert as_json(kdg("produce", topic, "--format", "json", "--file", src, "--json"))["sent"] == RECORDS


def consume(kdg, topic, group, table, *args, check=True):
    proc = kdg("consume", topic, "-G", group, "-g", "exactly-once", "-e", "--json", "--table", table, *COLUMNS,
               *args, check=check)
    return (as_json(proc), proc.stderr) if check else proc


def rows(conn, table) -> int:
    with Store(conn.pg_dsn) as store:
        return store.fetchval(f"SELECT count(*) FROM {table}")


def drop(conn, table, *, made_again: str | None = None) -> None:
    with Store(conn.pg_dsn) as store:
        store.execute(f"DROP TABLE {table}")
        if made_again:
            store.execute(f"CREATE TABLE {table} ({made_again})")


def error_line(proc) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def test_a_table_kdg_creates_again_takes_its_old_claims_with_it(kdg, conn, topic, group, table, tmp_path):
    produce(kdg, topic, tmp_path)
    first, _ = consume(kdg, topic, group, table, "--create-table")
    assert (first["written"], rows(conn, table)) == (RECORDS, RECORDS)
    drop(conn, table)
    # a new group reads the topic again, into the table kdg makes again: every record is new to that table
    again, stderr = consume(kdg, topic, f"{group}-2", table, "--create-table")
    assert (again["written"], again["duplicates_suppressed"], rows(conn, table)) == (RECORDS, 0, RECORDS), stderr
    assert f"dropped {RECORDS} exactly-once claims of {table}" in stderr, stderr
    # and they are claimed for the new table: reading once more suppresses every one
    third, _ = consume(kdg, topic, f"{group}-3", table, "--create-table")
    assert (third["written"], third["duplicates_suppressed"], rows(conn, table)) == (0, RECORDS, RECORDS)


def test_claims_made_before_tables_were_recorded_are_given_the_table_found_then(kdg, conn, topic, group, table,
                                                                              tmp_path):
    produce(kdg, topic, tmp_path)
    consume(kdg, topic, group, table, "--create-table")
    with Store(conn.pg_dsn) as store:  # as claims made before migration 007 are
        store.execute("UPDATE kdg_windows SET sink_oid = NULL WHERE sink_table = $1", table)
    again, _ = consume(kdg, topic, f"{group}-2", table)
    assert (again["written"], again["duplicates_suppressed"]) == (0, RECORDS)
    with Store(conn.pg_dsn) as store:
        assert store.fetchval("SELECT sink_oid = to_regclass($1)::oid FROM kdg_windows WHERE sink_table = $1", table)


def test_a_table_made_again_by_hand_stops_the_consumer_until_its_claims_are_forgotten(kdg, conn, topic, group,
                                                                                      table, tmp_path):
    produce(kdg, topic, tmp_path)
    consume(kdg, topic, group, table, "--create-table")
    drop(conn, table, made_again="n bigint, name text")
    stopped = consume(kdg, topic, f"{group}-2", table, check=False)
    assert stopped.returncode == 2
    assert f"kdg db forget --table {table}" in error_line(stopped)
    assert rows(conn, table) == 0
    with Store(conn.pg_dsn) as store:  # nothing was read: the group has no position
        assert store.fetchval("SELECT count(*) FROM kdg_offsets WHERE consumer_group = $1", f"{group}-2") == 0
    forgot = as_json(kdg("db", "forget", "--table", table, "--group", group, "--yes", "--json"))
    assert (forgot["table"], forgot["claims"], forgot["topics"]) == (table, RECORDS, [topic])
    assert forgot["offsets"] == 3  # the group's three partitions: it reads from the beginning again
    again, _ = consume(kdg, topic, group, table)
    assert (again["written"], again["duplicates_suppressed"], rows(conn, table)) == (RECORDS, 0, RECORDS)


def test_forget_without_yes_and_without_a_terminal_refuses(kdg, conn, topic, group, table, tmp_path):
    produce(kdg, topic, tmp_path)
    consume(kdg, topic, group, table, "--create-table")
    refused = kdg("db", "forget", "--table", table, check=False, stdin="y\n")
    assert refused.returncode == 2
    assert "--yes" in error_line(refused)
    with Store(conn.pg_dsn) as store:  # nothing was removed
        relation = store.fetchval("SELECT relation FROM kdg_windows WHERE sink_table = $1", table)
        assert store.fetchval(f"SELECT count(*) FROM {relation}") == RECORDS


def test_spark_replay_meets_the_same_check_before_spark_starts(kdg, conn, topic, group, table, tmp_path):
    produce(kdg, topic, tmp_path)
    kdg("consume", topic, "-G", group, "-g", "exactly-once", "-e", "--table", table)  # the generic sink
    drop(conn, table, made_again="LIKE kdg_events INCLUDING ALL")
    stopped = kdg("spark-replay", topic, "-G", f"{group}-2", "-g", "exactly-once", "--table", table, "--from",
                  "earliest", "--to", "latest", check=False)
    assert stopped.returncode == 2
    assert f"kdg db forget --table {table}" in error_line(stopped)
    assert rows(conn, table) == 0

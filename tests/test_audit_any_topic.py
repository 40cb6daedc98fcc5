"""`kdg audit` on a topic kdg did not produce: without a ledger the topic itself is the truth.

Records are made with a plain client (no kdg-id header, no ledger row), consumed with ``--id-from json:id``
as a user's topic would be, and audited against the sink.
"""

import json
import uuid

from confluent_kafka import Producer
from conftest import audited, change_stream

from kdg.store.pg import Store

N = 300


def send(conn, topic: str, values: list[bytes | None], keys: list[int] | None = None) -> None:
    """``values`` to ``topic`` with a plain client, keyed ``{"id": key}`` (default: their index) with the key in
    header ``id`` too, so that records of one key share a partition."""
    producer = Producer({"bootstrap.servers": conn.bootstrap_servers, "enable.idempotence": True})
    for i, value in zip(keys or range(len(values)), values):
        producer.produce(topic, value=value, key=json.dumps({"id": i}).encode(), headers=[("id", str(i).encode())])
    assert producer.flush(30) == 0


def test_without_a_ledger_every_record_the_group_passed_is_in_the_table(kdg, conn, topic, group):
    values = [json.dumps({"id": i, "v": f"v{i}"}).encode() for i in range(N)]
    send(conn, topic, values + [b"{not json"])  # bad JSON: dead-lettered, known by where it was read
    consume = ("consume", topic, "-G", group, "-g", "at-least-once", "--id-from", "json:id", "--json")
    kdg(*consume, "-c", 120, "--batch-size", 40)
    partial = audited(kdg, topic, "-G", group, "--id-from", "json:id")
    assert partial["truth"] == "topic" and partial["lost"] == 0 and partial["pending"] > 0, partial
    kdg(*consume, "-e")

    report = audited(kdg, topic, "-G", group, "--id-from", "json:id")
    assert report["balanced"] and "unexpected" not in report, report
    assert {k: report[k] for k in ("truth", "records", "keys", "rows", "lost", "pending", "duplicates",
                                   "dead_lettered")} == {
        "truth": "topic", "records": N + 1, "keys": N, "rows": N, "lost": 0, "pending": 0, "duplicates": 0,
        "dead_lettered": 1}, report
    assert "topic" in kdg("audit", topic, "-G", group, "--id-from", "json:id").stdout

    with Store(conn.pg_dsn) as store:  # three rows gone, one written twice
        store.execute("DELETE FROM kdg_events WHERE topic = $1 AND idempotency_key IN ('7', '70', '170')", topic)
        store.execute("INSERT INTO kdg_events (idempotency_key, consumer_group, topic, \"partition\", \"offset\") "
                      "SELECT idempotency_key, consumer_group, topic, \"partition\", \"offset\" FROM kdg_events "
                      "WHERE topic = $1 AND idempotency_key = '42'", topic)
    broken = audited(kdg, topic, "-G", group, "--id-from", "json:id")
    assert (broken["lost"], broken["duplicates"], broken["rows"]) == (3, 1, N - 2), broken
    assert broken["examples"]["lost"] == ["170", "7", "70"] and broken["examples"]["duplicated"] == ["42"], broken


def test_an_output_topics_records_are_keyed_as_their_inputs_were(kdg, conn, topic, group):
    """A Kafka sink copies each record without a kdg-id: its copies are keyed by the same --id-from."""
    send(conn, topic, [json.dumps({"id": i}).encode() for i in range(100)])
    out = f"kafka:{topic}-out"
    kdg("consume", topic, "-G", group, "-g", "at-least-once", "--id-from", "json:id", "--sink", out, "-e", "--json")
    report = audited(kdg, topic, "-G", group, "--sink", out, "--id-from", "json:id")
    assert {k: report[k] for k in ("truth", "keys", "rows", "claims", "lost", "duplicates")} == {
        "truth": "topic", "keys": 100, "rows": 100, "claims": None, "lost": 0, "duplicates": 0}, report


def test_a_typed_upsert_table_counts_its_rows_and_its_claims_apart(kdg, conn, topic, group):
    """Exactly-once into an upsert table: two versions of each id are one row, and neither is lost."""
    table = f"app.orders_{uuid.uuid4().hex[:8]}"
    with Store(conn.pg_dsn) as store:
        store.execute("CREATE SCHEMA IF NOT EXISTS app")
        store.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, v text)")
    ids = N // 2
    send(conn, topic, [json.dumps({"id": i % ids, "v": f"v{i}", "eid": f"e{i}"}).encode() for i in range(N)])
    kdg("consume", topic, "-G", group, "-g", "exactly-once", "--table", table, "--mode", "upsert",
        "--column", "id bigint = json:id", "--column", "v text = json:v", "--id-from", "json:eid", "-e", "--json")

    report = audited(kdg, topic, "-G", group, "--table", table, "--id-from", "json:eid")
    assert "unexpected" not in report, report
    assert {k: report[k] for k in ("truth", "records", "keys", "rows", "claims", "lost", "duplicates")} == {
        "truth": "topic", "records": N, "keys": N, "rows": ids, "claims": N, "lost": 0, "duplicates": 0}, report


def test_an_unknown_topic_is_a_usage_error(kdg):
    proc = kdg("audit", f"nosuch.{uuid.uuid4().hex[:8]}", "--json", check=False)
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.startswith("error:") and "nosuch" in proc.stderr, proc.stderr


def test_a_change_streams_replaced_versions_and_deleted_keys_are_not_lost(kdg, conn, topic, group):
    """At-least-once into an upsert table keyed as its rows are (no claims): the unit is the key, so the
    versions an upsert replaced are one row, and a key whose delete (op d, and maybe its tombstone) removed its
    row is accounted for, not lost."""
    table = f"app.orders_{uuid.uuid4().hex[:8]}"
    with Store(conn.pg_dsn) as store:
        store.execute("CREATE SCHEMA IF NOT EXISTS app")
        store.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text, idempotency_key text)")
    events, source = change_stream(43, snapshot=30, steps=150, ids=45)
    values, keys = [], []
    for op, row_id, before, after in events:
        values.append(json.dumps({"before": before, "after": after, "op": op, "source": {"table": "orders"}}).encode())
        keys.append(row_id)
        if op == "d" and row_id % 2:  # a tombstone after some deletes only, as tombstones.on.delete may say
            values.append(None)
            keys.append(row_id)
    send(conn, topic, values, keys)
    cdc = ("--envelope", "debezium", "--id-from", "json:id")
    kdg("consume", topic, "-G", group, "-g", "at-least-once", "--table", table, "--column", "id = json:id",
        "--column", "name = json:name", "--column", "idempotency_key = idempotency_key", *cdc, "-e", "--json")

    report = audited(kdg, topic, "-G", group, "--table", table, *cdc)
    assert {k: report[k] for k in ("records", "keys", "rows", "claims", "lost", "duplicates")} == {
        "records": len(values), "keys": len(set(keys)), "rows": len(source), "claims": 0, "lost": 0,
        "duplicates": 0}, report

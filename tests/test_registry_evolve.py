"""Columns from the records' schema when the records name a Schema Registry schema id (issue 47), through the
session's real registry: Avro v1 → v2 adds an optional field mid-topic. Under evolve = "add-columns" and
exactly-once, with the consumer SIGKILLed between the versions, the table gains the column, v1 rows have NULL,
v2 rows the value, 0 lost, 0 duplicated; under evolve = "none" the new field is said, not written; and an Avro
key record's fields are the table's primary key, a Debezium change stream's in Avro too.
"""

import json
import signal
import uuid
from pathlib import Path

import pytest
from conftest import as_json, audited

from kdg.kafka.admin import ensure_topic
from kdg.store.pg import Store

pytestmark = pytest.mark.stack
SCHEMAS = Path(__file__).parent / "schemas"
V1 = {"type": "record", "name": "Visit", "namespace": "kdgtest",
      "fields": [{"name": "id", "type": "long"}, {"name": "pageName", "type": "string"}]}
V2 = {**V1, "fields": V1["fields"] + [{"name": "referrer", "type": ["null", "string"], "default": None}]}


def visits(kdg, env, topic, tmp_path, n: int) -> dict:
    """``n`` visits in v1, then ``n`` in v2 (ids n to 2n-1, each with a referrer), produced through the registry;
    what each id's row should be."""
    want = {}
    for version, schema, ids in (("v1", V1, range(n)), ("v2", V2, range(n, 2 * n))):
        path, lines = tmp_path / f"{topic}-{version}.avsc", tmp_path / f"{topic}-{version}.jsonl"
        path.write_text(json.dumps(schema))
        docs = [{"id": i, "pageName": f"p{i}"} | ({"referrer": f"r{i}"} if version == "v2" else {}) for i in ids]
        lines.write_text("".join(json.dumps(d) + "\n" for d in docs))
        sent = as_json(kdg("produce", topic, "--value-format", "avro", "--schema", path, "--file", lines,
                           "-g", "exactly-once", "--json", env=env))
        assert (sent["sent"], sent["failed"]) == (n, 0), sent
        want |= {d["id"]: (d["pageName"], d.get("referrer")) for d in docs}
    return want


def consume(topic, group, table, *flags) -> tuple:
    return ("consume", topic, "-G", group, "-g", "exactly-once", "--table", table, "--value-format", "avro",
            "--columns", "from-schema", "--create-table", "--id-from", "offset", "--batch-size", 20, "-e", "--json",
            *flags)


def table_rows(conn, table: str, columns: str) -> list:
    with Store(conn.pg_dsn) as store:
        return [tuple(r) for r in store.fetch(f"SELECT {columns} FROM {table} ORDER BY id")]


def test_a_field_added_mid_topic_adds_its_column_across_a_consumer_kill(kdg, conn, group, schema_registry, tmp_path):
    env, n = {"KDG_SCHEMA_REGISTRY": schema_registry}, 60
    topic, table = f"visits-{uuid.uuid4().hex[:8]}", f"visits_{uuid.uuid4().hex[:8]}"
    ensure_topic(conn.bootstrap_servers, topic, partitions=1)
    want = visits(kdg, env, topic, tmp_path, n)
    run = consume(topic, group, table, "--evolve", "add-columns")
    # batches of 20: the 4th is the first of v2; the consumer is killed after writing it, before its commit
    crashed = kdg(*run, env={**env, "KDG_FAULT": "after-process-before-commit@4"}, check=False)
    assert crashed.returncode == -signal.SIGKILL, f"the fault did not fire: {crashed.stderr}"
    assert table_rows(conn, table, "id, page_name") == [(i, f"p{i}") for i in range(n)]  # v1 only, committed

    report = as_json(kdg(*run, env=env))
    assert report["dead_lettered"] == 0, report
    assert table_rows(conn, table, "id, page_name, referrer") == [(i, *want[i]) for i in range(2 * n)]
    with Store(conn.pg_dsn) as store:  # the column added: nullable text, as the Avro union ["null", "string"]
        added = store.fetch("SELECT data_type, is_nullable FROM information_schema.columns WHERE table_name = $1 "
                            "AND column_name = 'referrer'", table)
    assert [tuple(r) for r in added] == [("text", "YES")], added
    audit = audited(kdg, topic, "--table", table, "-G", group, "--id-from", "offset")
    assert (audit["lost"], audit["duplicates"]) == (0, 0) and audit["balanced"], audit


def test_under_evolve_none_a_new_registry_field_is_said_and_not_written(kdg, conn, group, schema_registry, tmp_path):
    env = {"KDG_SCHEMA_REGISTRY": schema_registry}
    topic, table = f"visits-{uuid.uuid4().hex[:8]}", f"visits_{uuid.uuid4().hex[:8]}"
    ensure_topic(conn.bootstrap_servers, topic, partitions=1)
    visits(kdg, env, topic, tmp_path, 10)
    done = kdg(*consume(topic, group, table), env=env)
    report = as_json(done)
    assert (report["processed"], report["dead_lettered"]) == (20, 0), report
    said = [(c["column"], c["change"]) for c in report["schema_changes"]]
    assert said == [("referrer", "not followed (evolve = none: its values are not written)")], report
    assert f"public.{table}: column referrer text not followed" in done.stderr, done.stderr
    with Store(conn.pg_dsn) as store:
        names = [r["column_name"] for r in store.fetch("SELECT column_name FROM information_schema.columns "
                                                        "WHERE table_name = $1 ORDER BY ordinal_position", table)]
    assert "referrer" not in names and {"id", "page_name"} <= set(names), names
    assert table_rows(conn, table, "id, page_name") == [(i, f"p{i}") for i in range(20)]
    # kdg pipeline check reads the newest record's schema through the registry too: what add-columns would do
    route = tmp_path / "route.toml"
    route.write_text(f'[[route]]\ntopics = ["{topic}"]\ntable = "{table}"\ncolumns = "from-schema"\n'
                     'value_format = "avro"\nid_from = "offset"\nevolve = "add-columns"\n')
    checked = kdg("pipeline", "check", route, env=env)
    assert "would add column referrer text" in checked.stdout + checked.stderr, checked.stdout + checked.stderr


def test_an_avro_key_record_gives_the_primary_key_and_upserts_on_it(kdg, conn, group, schema_registry):
    """Avro keys of schema {id}: the table made from the first schema has id as its primary key, and an upsert
    route keeps each id's last value."""
    from confluent_kafka import Producer

    from kdg.schemas.codecs import SchemaEncoder
    from kdg.schemas.registry import Registry

    topic, table = f"visits-{uuid.uuid4().hex[:8]}", f"visits_{uuid.uuid4().hex[:8]}"
    ensure_topic(conn.bootstrap_servers, topic, partitions=1)
    registry = Registry({"schema.registry.url": schema_registry})
    key_schema = {"type": "record", "name": "VisitKey", "namespace": "kdgtest",
                  "fields": [{"name": "id", "type": "long"}]}
    encode_key = SchemaEncoder("avro", json.dumps(key_schema), f"{topic}-key", registry)
    encode_value = SchemaEncoder("avro", json.dumps(V1), f"{topic}-value", registry)
    producer = Producer({"bootstrap.servers": conn.bootstrap_servers})
    for i in range(30):  # ids 0-9, three times each
        doc = json.dumps({"id": i % 10, "pageName": f"p{i}"}).encode()
        producer.produce(topic, encode_value(doc), encode_key(json.dumps({"id": i % 10}).encode()))
    producer.flush(30)
    report = as_json(kdg(*consume(topic, group, table, "--key-format", "avro", "--mode", "upsert"),
                         env={"KDG_SCHEMA_REGISTRY": schema_registry}))
    assert report["dead_lettered"] == 0, report
    with Store(conn.pg_dsn) as store:
        key = store.fetch("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                          "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = $1::regclass AND i.indisprimary", table)
    assert [r["attname"] for r in key] == ["id"], key
    assert table_rows(conn, table, "id, page_name") == [(i, f"p{20 + i}") for i in range(10)]


def test_a_debezium_change_stream_in_avro_makes_its_table_from_the_after_schema(kdg, conn, group, schema_registry):
    """Debezium's events in Avro (AvroConverter: the envelope's after names the row record before defines), keyed
    by Avro {id}: the replica is made from the row's schema with id as its primary key, and equals the source."""
    from confluent_kafka import Producer

    from kdg.schemas.codecs import SchemaEncoder
    from kdg.schemas.registry import Registry

    topic, table = f"cdc-{uuid.uuid4().hex[:8]}", f"replica_{uuid.uuid4().hex[:8]}"
    ensure_topic(conn.bootstrap_servers, topic, partitions=1)
    registry = Registry({"schema.registry.url": schema_registry})
    key_schema = {"type": "record", "name": "Key", "namespace": "shop.orders",
                  "fields": [{"name": "id", "type": "long"}]}
    encode_key = SchemaEncoder("avro", json.dumps(key_schema), f"{topic}-key", registry)
    encode_value = SchemaEncoder("avro", (SCHEMAS / "change.avsc").read_text(), f"{topic}-value", registry)
    producer, source = Producer({"bootstrap.servers": conn.bootstrap_servers}), {}
    events = [("c", i, {"id": i, "name": f"n{i}", "qty": i}) for i in range(10)] + \
             [("u", i, {"id": i, "name": f"m{i}", "qty": 10 * i}) for i in range(0, 10, 3)] + [("d", 4, None)]
    for op, i, after in events:
        before = source.get(i)
        source[i] = after
        event = {"before": before, "after": after, "op": op, "ts_ms": 1767323045123}
        producer.produce(topic, encode_value(json.dumps(event).encode()),
                         encode_key(json.dumps({"id": i}).encode()))
    producer.flush(30)
    report = as_json(kdg("consume", topic, "-G", group, "-g", "exactly-once", "--table", table, "--envelope",
                         "debezium", "--value-format", "avro", "--key-format", "avro", "--columns", "from-schema",
                         "--create-table", "--id-from", "offset", "-e", "--json",
                         env={"KDG_SCHEMA_REGISTRY": schema_registry}))
    assert report["dead_lettered"] == 0, report
    with Store(conn.pg_dsn) as store:
        key = store.fetchval("SELECT string_agg(a.attname, ',') FROM pg_index i JOIN pg_attribute a ON "
                             "a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                             "WHERE i.indrelid = $1::regclass AND i.indisprimary", table)
        got = {r["id"]: dict(r) for r in store.fetch(f"SELECT id, name, qty FROM {table}")}
    assert key == "id" and got == {i: row for i, row in source.items() if row is not None}, (key, got)

"""Columns from the records' schema on Spark (issue 47): `kdg spark-replay` meets a field added halfway.

Records are Kafka Connect JsonConverter's ``{"schema", "payload"}``, made by hand; from id 100 on they carry a
new optional field ``tier``. One Spark job replays two copies of the topic under exactly-once: one route follows
the change (``evolve = "add-columns"``: the driver adds the column once, before any task writes), the other
does not (``evolve = "none"``: the change is said, not followed). Both are audited 0 lost, 0 duplicated.
"""

import json
import uuid

import pytest
from confluent_kafka import Producer
from conftest import as_json, audited

from kdg.errors import UsageError
from kdg.flow.pipeline_file import load_pipeline
from kdg.kafka.admin import ensure_topic
from kdg.spark.routing import spark_router
from kdg.spark.schemas import record_head
from kdg.store.pg import Store

KEY = {"type": "struct", "fields": [{"field": "id", "type": "int64", "optional": False}]}
ROUTE = """[[route]]
topics = ["{topic}"]
table = "{table}"
columns = "from-schema"
evolve = "{evolve}"
create_table = true
id_from = "offset"
"""


def _value(i: int) -> bytes:
    row = {"id": i, "qty": i * 2} | ({"tier": f"t{i % 3}"} if i >= 100 else {})
    fields = [{"field": "id", "type": "int64", "optional": False}, {"field": "qty", "type": "int64", "optional": False}]
    fields += [{"field": "tier", "type": "string", "optional": True}] if i >= 100 else []
    return json.dumps({"schema": {"type": "struct", "fields": fields}, "payload": row}).encode()


def _columns(store: Store, table: str) -> list[str]:
    return [r["attname"] for r in store.fetch("SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND "
                                              "attnum > 0 AND NOT attisdropped ORDER BY attnum", table)]


def test_spark_replay_adds_a_field_new_halfway_once_or_says_it_is_not_followed(kdg, conn, group, tmp_path):
    prefix = f"ev{uuid.uuid4().hex[:8]}"
    topics = {evolve: f"{prefix}-{evolve}" for evolve in ("add-columns", "none")}
    producer = Producer({"bootstrap.servers": conn.bootstrap_servers})
    for topic in topics.values():
        ensure_topic(conn.bootstrap_servers, topic, partitions=2)
        for i in range(200):
            producer.produce(topic, _value(i), json.dumps({"schema": KEY, "payload": {"id": i}}).encode())
    producer.flush(30)
    pipeline = tmp_path / "routes.toml"
    pipeline.write_text("".join(ROUTE.format(topic=t, table=f"{prefix}_{e.split('-')[0]}", evolve=e)
                                for e, t in topics.items()))

    report = as_json(kdg("spark-replay", "--pipeline", pipeline, "-G", group, "-g", "exactly-once", "--json",
                         timeout=600))
    assert (report["rows_read"], report["rows_written"], report["dead_lettered"]) == (400, 400, 0), report
    added, ignored = f"public.{prefix}_add", f"public.{prefix}_none"
    assert sorted((c["table"], c["column"], c["change"]) for c in report["schema_changes"]) == [
        (added, "tier", "added"),
        (ignored, "tier", "not followed (evolve = none: its values are not written)")], report["schema_changes"]
    with Store(conn.pg_dsn) as store:
        assert _columns(store, added) == ["id", "qty", "tier"] and _columns(store, ignored) == ["id", "qty"]
        got = {r["id"]: (r["qty"], r["tier"]) for r in store.fetch(f"SELECT id, qty, tier FROM {added}")}
        assert store.fetchval(f"SELECT count(*) FROM {ignored}") == 200
    assert got == {i: (i * 2, f"t{i % 3}" if i >= 100 else None) for i in range(200)}
    for evolve, topic in topics.items():
        audit = audited(kdg, topic, "--table", f"{prefix}_{evolve.split('-')[0]}", "-G", group, "--id-from", "offset")
        assert (audit["lost"], audit["duplicates"], audit["rows"]) == (0, 0, 200) and audit["balanced"], audit


@pytest.mark.parametrize("extra, said", [('value_format = "avro"', "JsonConverter schemas only yet"),
                                         ('transform = "json:loads"', "takes no transform")])
def test_what_spark_does_not_do_yet_is_refused_before_anything_runs(tmp_path, extra, said):
    pipeline = tmp_path / "route.toml"
    pipeline.write_text(ROUTE.format(topic="t", table="t", evolve="none") + extra + "\n")
    with pytest.raises(UsageError, match=said):
        spark_router([], None, None, None, None, load_pipeline(pipeline))


def test_a_record_schema_is_known_by_the_text_before_its_payload():
    assert record_head(_value(1)) == json.dumps({"schema": {"type": "struct", "fields": [
        {"field": "id", "type": "int64", "optional": False}, {"field": "qty", "type": "int64", "optional": False}]},
        "payload": 0})[:-len('"payload": 0}')]
    assert record_head(_value(1)) != record_head(_value(100)) and record_head(_value(100)) == record_head(_value(101))
    assert record_head(b'{"id": 1, "payload": 2}') is None and record_head(None) is None

"""A typed mapping made from the schema a record carries (kdg.mapping.from_record).

Events are shaped as Debezium's JsonConverter writes them (schema + payload, an envelope of before, after,
source, op, ts_ms; a key of the primary key's fields). Offline: the columns, types and key derived from them,
and what their sources read. Then once on the stack: the table created from the derived mapping by
``Store.prepare_typed``, and change events written into it by ``kdg consume --mapping``.
"""

import base64
import json
import uuid
from dataclasses import replace
from datetime import date, datetime
from decimal import Decimal

import pytest
from conftest import as_json

from kdg.errors import UsageError
from kdg.mapping.connect import LOGICAL as DECODED
from kdg.mapping.events import RecordReader
from kdg.mapping.from_record import LOGICAL, column_type, mapping_from_record
from kdg.mapping.spec import Mapping, build_mapping, validate
from kdg.records import Record
from kdg.schemas.derive import to_toml
from kdg.settings import table_name
from kdg.store.pg import Store

DBZ, CONNECT = "io.debezium.", "org.apache.kafka.connect.data."
TABLE = table_name("app.orders")


def field(name: str, kind: str, logical: str | None = None, optional: bool = True, **extra) -> dict:
    schema = {"type": kind, "optional": optional, **({"name": logical, "version": 1} if logical else {}), **extra}
    return {**schema, "field": name}


ROW = [field("id", "int32", optional=False),
       field("price", "bytes", CONNECT + "Decimal", parameters={"scale": "2", "connect.decimal.precision": "10"}),
       field("placedAt", "int64", DBZ + "time.MicroTimestamp", optional=False),
       field("shipDay", "int32", DBZ + "time.Date"),
       field("note", "string"),
       field("address", "struct", fields=[field("city", "string"), field("zip", "string")]),
       field("active", "boolean", optional=False),
       field("tags", "array", items={"type": "string", "optional": False}),
       field("seenAt", "string", DBZ + "time.ZonedTimestamp"),
       field("ref", "string", DBZ + "data.Uuid")]
DERIVED = [("id", "integer", "json:id"), ("price", "numeric(10,2)", "json:price"),
           ("placed_at", "timestamp", "json:placedAt"), ("ship_day", "date", "json:shipDay"),
           ("note", "text", "json:note"), ("address", "jsonb", "json:address"), ("active", "boolean", "json:active"),
           ("tags", "text[]", "json:tags"), ("seen_at", "timestamptz", "json:seenAt"), ("ref", "uuid", "json:ref")]
KEY_SCHEMA = {"type": "struct", "name": "shop.public.orders.Key", "optional": False,
              "fields": [field("id", "int32", optional=False)]}
CDC = Mapping(table_name("placeholder"), (), mode="upsert", on_tombstone="delete", create_table=True,
              envelope="debezium")


def envelope(row: list[dict]) -> dict:
    value = {"type": "struct", "fields": row, "optional": True, "name": "shop.public.orders.Value"}
    return {"type": "struct", "name": "shop.public.orders.Envelope", "optional": False,
            "fields": [{**value, "field": "before"}, {**value, "field": "after"},
                       field("source", "struct", optional=False, fields=[field("lsn", "int64")]),
                       field("op", "string", optional=False), field("ts_ms", "int64")]}


def wrapped(schema: dict, payload) -> bytes:
    return json.dumps({"schema": schema, "payload": payload}, separators=(",", ":")).encode()


def event(op: str, before, after, lsn: int, row: list[dict] = ROW) -> bytes:
    return wrapped(envelope(row), {"before": before, "after": after, "source": {"lsn": lsn}, "op": op,
                                   "ts_ms": 1_760_551_615_000})


def key(row_id: int, schema: dict = KEY_SCHEMA) -> bytes:
    return wrapped(schema, {"id": row_id})


def cents(amount: int) -> str:
    """A Connect Decimal's wire form: the unscaled value's big-endian two's complement bytes, base64."""
    return base64.b64encode(amount.to_bytes(8, "big", signed=True).lstrip(b"\x00") or b"\x00").decode()


def order(row_id: int, price_cents: int, note: str | None = None) -> dict:
    return {"id": row_id, "price": cents(price_cents), "placedAt": 1_760_551_615_254_053 + row_id,
            "shipDay": 19_723 + row_id, "note": note, "address": {"city": "Lyon", "zip": f"6900{row_id}"},
            "active": row_id % 2 == 1, "tags": ["a", f"b {row_id}"], "seenAt": "2025-10-15T18:06:55.25+02:00",
            "ref": str(uuid.UUID(int=row_id))}


def described(mapping: Mapping) -> list[tuple]:
    return [(c.name, c.type_name, c.source.spec) for c in mapping.columns]


# -- offline: what is derived -------------------------------------------------------------------------------

def test_a_debezium_event_gives_its_rows_columns_and_its_keys_primary_key():
    """Each field of after becomes a column of the type its logical type decodes into; the key's fields the key;
    the route's settings are kept, its placeholder columns are not."""
    mapping = mapping_from_record(event("c", None, order(1, 823), lsn=1), key(1), CDC, TABLE)
    assert described(mapping) == DERIVED
    assert (mapping.table, mapping.key) == (TABLE, ("id",))
    assert (mapping.mode, mapping.on_tombstone, mapping.envelope, mapping.create_table) == \
        ("upsert", "delete", "debezium", True)
    assert validate(mapping) == mapping
    # a delete's event carries the same schema (after null, before the row): the same mapping
    assert mapping_from_record(event("d", order(1, 823), None, lsn=2), key(1), CDC, TABLE) == mapping


def test_a_key_field_the_row_lacks_is_read_from_the_key():
    """The key's fields are the primary key; one the row does not hold becomes a key:FIELD column."""
    schema = {**KEY_SCHEMA, "fields": [field("id", "int32", optional=False),
                                       field("tenantId", "int64", optional=False)]}
    value = event("c", None, order(1, 1), lsn=1)
    mapping = mapping_from_record(value, wrapped(schema, {"id": 1, "tenantId": 7}), CDC, TABLE)
    assert mapping.key == ("id", "tenant_id")
    assert described(mapping)[-1] == ("tenant_id", "bigint", "key:tenantId")
    # a plain JSON key (no schema) of the row's own fields: the key all the same, typed as the row says
    assert mapping_from_record(value, b'{"id": 1}', CDC, TABLE).key == ("id",)


def test_without_the_envelope_the_wrapper_is_read_as_it_is():
    """Without --envelope debezium json: reads JsonConverter's wrapper as it is: /payload/FIELD, and a key
    under on_tombstone = delete comes from the record key (a tombstone has no value)."""
    row = [field("id", "int64", optional=False), field("total", "float64"), field("a/b", "int16")]
    value = wrapped({"type": "struct", "fields": row}, {"id": 5, "total": 1.5, "a/b": 3})
    base = Mapping(table_name("x"), (), mode="upsert", on_tombstone="delete", create_table=True)
    mapping = mapping_from_record(value, key(5, {**KEY_SCHEMA, "fields": [row[0]]}), base, TABLE)
    assert described(mapping) == [("id", "bigint", "key:/payload/id"), ("total", "double precision",
                                                                         "json:/payload/total"),
                                  ("a_b", "smallint", "json:/payload/a~1b")]
    rec = Record(value, key(5, {**KEY_SCHEMA, "fields": [row[0]]}))
    reader = RecordReader([c.source for c in mapping.columns], [c.type for c in mapping.columns])
    assert reader.texts(rec, None, reader.document(rec), ["id", "total", "a_b"]) == ["5", "1.5", "3"]


def test_the_sources_read_each_value_as_the_source_held_it():
    """The derived columns' readers decode the logical types: the Decimal exact, micro-seconds without a float,
    days as a date, a zoned timestamp kept, the struct as JSON, an optional string null."""
    value, rec_key = event("r", None, order(2, -55), lsn=1), key(2)
    mapping = mapping_from_record(value, rec_key, CDC, TABLE)
    reader = RecordReader([c.source for c in mapping.columns], [c.type for c in mapping.columns],
                          envelope="debezium")
    rec = Record(value, rec_key)
    texts = dict(zip([c.name for c in mapping.columns],
                     reader.texts(rec, None, reader.document(rec), [c.name for c in mapping.columns])))
    assert texts == {"id": "2", "price": "-0.55", "placed_at": "2025-10-15 18:06:55.254055", "ship_day": "2024-01-03",
                     "note": None, "address": '{"city":"Lyon","zip":"69002"}', "active": "false",
                     "tags": '["a","b 2"]', "seen_at": "2025-10-15T18:06:55.25+02:00",
                     "ref": "00000000-0000-0000-0000-000000000002"}


@pytest.mark.parametrize("value", [b'{"id": 1, "note": "plain JSON"}', None, b"not json at all",
                                   b'{"schema": "a word", "payload": {}}'])
def test_a_record_without_a_schema_gives_none(value):
    """Plain JSON, a tombstone, bytes that are not JSON: nothing to derive, the caller waits for a record that
    has a schema."""
    assert mapping_from_record(value, key(1), CDC, TABLE) is None


def test_a_debezium_record_without_a_row_schema_gives_none():
    """A heartbeat (or a schema-change event) under the envelope: no after or before, no columns from it."""
    heartbeat = wrapped({"type": "struct", "name": "io.debezium.connector.common.Heartbeat",
                         "fields": [field("ts_ms", "int64", optional=False)]}, {"ts_ms": 1})
    assert mapping_from_record(heartbeat, None, CDC, TABLE) is None


def test_what_cannot_make_columns_is_said():
    flat = Mapping(table_name("x"), ())
    with pytest.raises(UsageError, match="is a Connect string, not a struct"):
        mapping_from_record(wrapped({"type": "string"}, "hello"), None, flat, TABLE)
    with pytest.raises(UsageError, match="fields 'orderId' and 'order_id' would both be column 'order_id'"):
        twice = {"type": "struct", "fields": [field("orderId", "int32"), field("order_id", "int32")]}
        mapping_from_record(wrapped(twice, {}), None, flat, TABLE)
    with pytest.raises(UsageError, match="value_format avro"):
        mapping_from_record(b"\x00\x00\x00\x00\x01", None, Mapping(table_name("x"), (), value_format="avro"), TABLE)


@pytest.mark.parametrize(("schema", "expected"), [
    ({"type": "int8"}, "smallint"), ({"type": "int16"}, "smallint"), ({"type": "int64"}, "bigint"),
    ({"type": "float32"}, "real"), ({"type": "double"}, "double precision"), ({"type": "float"}, "real"),
    ({"type": "bytes"}, "bytea"),
    ({"type": "map", "values": {"type": "int32"}}, "jsonb"),
    ({"type": "array", "items": {"type": "int64"}}, "bigint[]"),
    ({"type": "array", "items": {"type": "bytes"}}, "jsonb"),  # base64 items: bytea[] would take the text
    ({"type": "array", "items": {"type": "int32", "name": DBZ + "time.Date"}}, "jsonb"),
    ({"type": "array", "items": {"type": "array", "items": {"type": "int32"}}}, "jsonb"),
    ({"type": "bytes", "name": CONNECT + "Decimal", "parameters": {"scale": "3"}}, "numeric"),
    ({"type": "struct", "name": DBZ + "data.VariableScaleDecimal", "fields": []}, "numeric"),
    ({"type": "string", "name": DBZ + "time.ZonedTime"}, "timetz"),
    ({"type": "int64", "name": DBZ + "time.NanoTimestamp"}, "timestamp"),
    ({"type": "int64", "name": CONNECT + "Timestamp"}, "timestamp"),
    ({"type": "int32", "name": CONNECT + "Time"}, "time"),
    ({"type": "string", "name": DBZ + "data.Json"}, "jsonb"),
    ({"type": "int64", "name": "com.example.Ticks"}, "text"),  # a logical type kdg does not decode: as sent
    ({"type": "struct", "name": DBZ + "data.geometry.Point", "fields": []}, "jsonb"),
])
def test_column_types(schema, expected):
    assert column_type(schema) == expected


def test_every_logical_type_kdg_decodes_has_a_column_type():
    assert set(LOGICAL) | {CONNECT + "Decimal"} == set(DECODED)


# -- on the stack: the table made from it, and events written into it -------------------------------------

def test_the_derived_mapping_creates_the_table_and_writes_the_change_stream(kdg, conn, topic, group, tmp_path):
    """prepare_typed creates the table from the derived mapping, with the key as its primary key; kdg consume
    with that mapping (as a TOML file) applies a snapshot, an update and a delete, each value exact."""
    table = table_name(f"app.from_record_{uuid.uuid4().hex[:8]}")
    events = [(key(1), event("r", None, order(1, 823, "first"), lsn=1)),
              (key(2), event("c", None, order(2, 100), lsn=2)),
              (key(2), event("u", order(2, 100), order(2, -55, "cheaper"), lsn=3)),
              (key(3), event("c", None, order(3, 12_345_678), lsn=4)),
              (key(3), event("d", order(3, 12_345_678), None, lsn=5)), (key(3), None)]
    mapping = mapping_from_record(events[0][1], events[0][0], CDC, table)
    with Store(conn.pg_dsn) as store:
        store.execute("CREATE SCHEMA IF NOT EXISTS app")
        _, shape = store.prepare_typed(mapping)
        assert shape.primary_key == ("id",)
        with pytest.raises(UsageError, match=r"upsert on \(id, active\) needs a primary key or unique index"):
            store.prepare_typed(replace(mapping, key=("id", "active")))  # a key the table's does not agree with
        # every logical type's column type is one Postgres has (timetz, xml: resolved on the server)
        every = [field("id", "int32")] + [field(f"f{i}", "string", name) for i, name in enumerate(DECODED)]
        unmade = table_name(f"{table.text}_all")
        whole = mapping_from_record(wrapped({"type": "struct", "fields": every}, {}), None, Mapping(unmade, ()), unmade)
        assert store.prepare_typed(replace(whole, create_table=True), dry_run=True)[1] is None
        assert shape.types == {"id": "integer", "price": "numeric(10,2)", "placed_at": "timestamp without time zone",
                               "ship_day": "date", "note": "text", "address": "jsonb", "active": "boolean",
                               "tags": "text[]", "seen_at": "timestamp with time zone", "ref": "uuid"}

    doc = mapping.to_dict()
    doc["columns"] = {c["name"]: {"type": c["type"], "from": c["from"]} for c in doc["columns"]}
    (tmp_path / "mapping.toml").write_text(to_toml(doc))
    assert build_mapping(file=tmp_path / "mapping.toml") == mapping
    src = tmp_path / "events.jsonl"
    src.write_text("".join(json.dumps({"key": k.decode(), "value": v and v.decode(), "headers": []}) + "\n"
                           for k, v in events))
    sent = as_json(kdg("produce", topic, "-g", "at-least-once", "--format", "json", "--file", src, "--json"))
    assert (sent["sent"], sent["failed"]) == (len(events), 0), sent
    report = as_json(kdg("consume", topic, "-G", group, "-g", "at-least-once", "-e", "-o", "beginning", "--json",
                         "--mapping", tmp_path / "mapping.toml"))
    assert (report["consumed"], report["dead_lettered"]) == (len(events), 0), report

    with Store(conn.pg_dsn) as store:
        rows = [dict(r) for r in store.fetch(f"SELECT * FROM {table.sql} ORDER BY id")]
    for row in rows:
        row["address"] = json.loads(row["address"])
    assert rows == [
        {"id": 1, "price": Decimal("8.23"), "placed_at": datetime(2025, 10, 15, 18, 6, 55, 254_054),
         "ship_day": date(2024, 1, 2), "note": "first", "address": {"city": "Lyon", "zip": "69001"}, "active": True,
         "tags": ["a", "b 1"], "seen_at": datetime.fromisoformat("2025-10-15T16:06:55.25+00:00"),
         "ref": uuid.UUID(int=1)},
        {"id": 2, "price": Decimal("-0.55"), "placed_at": datetime(2025, 10, 15, 18, 6, 55, 254_055),
         "ship_day": date(2024, 1, 3), "note": "cheaper", "address": {"city": "Lyon", "zip": "69002"},
         "active": False, "tags": ["a", "b 2"], "seen_at": datetime.fromisoformat("2025-10-15T16:06:55.25+00:00"),
         "ref": uuid.UUID(int=2)}]

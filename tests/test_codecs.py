"""The schema'd formats' pure half: the wire format, Protobuf values, Avro from JSON, mappings from schemas.
Everything that needs the registry is in test_schemas.py."""

import io
import json
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import fastavro
import pytest

from kdg.errors import UsageError
from kdg.mapping.sources import as_text, json_text
from kdg.schemas.codecs import _avro_ready
from kdg.schemas.derive import column_name, derive_mapping, detect_format, to_toml
from kdg.schemas.proto import ProtoFile, message_values
from kdg.schemas.wire import frame, split_frame, split_indexes

SCHEMAS = Path(__file__).parent / "schemas"


def test_the_wire_format_frames_and_refuses_what_is_not_it():
    assert split_frame(frame(258, b"abc")) == (258, b"abc")
    assert frame(258, b"") == b"\x00\x00\x00\x01\x02"
    with pytest.raises(ValueError, match="the first byte is 0x7b"):
        split_frame(b'{"id": 1}')
    with pytest.raises(ValueError, match="fewer than its 5-byte header"):
        split_frame(b"\x00\x01")
    assert split_indexes(b"\x00rest") == ((0,), b"rest")
    assert split_indexes(b"\x04\x02\x06rest") == ((1, 3), b"rest")  # zigzag: count 2, then 1 and 3


def test_protobuf_values_keep_defaults_bytes_enums_and_timestamps():
    cls = ProtoFile((SCHEMAS / "order.proto").read_text()).message()
    msg = cls(id=0, customer="c", tags=["a"])
    msg.placed_at.FromDatetime(datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc))
    values = message_values(cls.FromString(msg.SerializeToString()))
    assert values == {"id": 0, "version": 0, "customer": "c", "amount": "", "tags": ["a"], "note": None,
                      "placed_at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)}
    with pytest.raises(ValueError, match="not a valid .proto schema"):
        ProtoFile("syntax = 'proto3'; message { }")


def test_avro_from_json_takes_decimals_bytes_and_unions():
    schema = fastavro.parse_schema({"type": "record", "name": "R", "fields": [
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "blob", "type": ["null", "bytes"]}, {"name": "x", "type": "double"}]})
    doc = _avro_ready(schema, json.loads('{"amount": 12.30, "blob": "\\u00ffA", "x": 1.5}', parse_float=Decimal))
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, doc, strict=True)
    back = fastavro.schemaless_reader(io.BytesIO(buf.getvalue()), schema, None)
    assert back == {"amount": Decimal("12.30"), "blob": b"\xffA", "x": 1.5}
    assert (as_text(back["blob"]), as_text(back["amount"])) == ("\\xff41", "12.30")  # bytea's hex input form
    assert json_text({"at": datetime(2026, 1, 2, tzinfo=timezone.utc)}) == '{"at":"2026-01-02T00:00:00+00:00"}'


def test_a_mapping_derived_from_each_kind_of_schema():
    avro = derive_mapping((SCHEMAS / "order_v2.avsc").read_text(), "avro", "app.orders", ("id",))
    assert avro["mode"] == "upsert" and avro["create_table"] and avro["value_format"] == "avro"
    assert avro["columns"]["placed_at"] == {"type": "timestamptz", "from": "json:placedAt"}
    assert [c["type"] for c in avro["columns"].values()] == [
        "bigint", "integer", "text", "numeric(12,2)", "timestamptz", "text[]", "text", "text"]
    proto = derive_mapping((SCHEMAS / "order.proto").read_text(), "protobuf", "o")
    assert proto["columns"]["placed_at"]["type"] == "timestamptz" and proto["columns"]["id"]["type"] == "bigint"
    js = derive_mapping((SCHEMAS / "order.schema.json").read_text(), "json-schema", "o")
    assert js["columns"]["tags"]["type"] == "text[]" and js["columns"]["note"]["type"] == "text"
    assert detect_format((SCHEMAS / "order.schema.json").read_text(), "AVRO") == "json-schema"  # no schemaType
    assert detect_format((SCHEMAS / "order.proto").read_text(), "AVRO") == "protobuf"
    assert 'key = ["id"]' in to_toml(avro)
    assert column_name("orderId") == "order_id"
    wide = json.dumps({"type": "record", "name": "W", "fields": [{"name": "n", "type": {
        "type": "bytes", "logicalType": "decimal", "precision": 1001, "scale": 0}}]})
    assert derive_mapping(wide, "avro", "w")["columns"]["n"]["type"] == "numeric"  # past Postgres's 1000 digits
    with pytest.raises(UsageError, match="--key 'nope'"):
        derive_mapping((SCHEMAS / "order_v1.avsc").read_text(), "avro", "o", ("nope",))


def test_avro_values_python_cannot_hold_reach_postgres_as_text_it_reads():
    """timestamp-nanos (fastavro gives a bare number, which a timestamptz column would read as milliseconds),
    years outside 1-9999, and NaN or Infinity in a double: each as the text Postgres's input takes."""
    from kdg.schemas.codecs import _add_logical_readers

    _add_logical_readers()
    ts = {"type": "long", "logicalType": "timestamp-millis"}
    schema = fastavro.parse_schema({"type": "record", "name": "T", "fields": [
        {"name": "ns", "type": ["null", {"type": "long", "logicalType": "timestamp-nanos"}]},
        {"name": "ms", "type": ts}, {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "x", "type": "double"}, {"name": "xs", "type": {"type": "array", "items": "double"}}]})

    def decoded(**doc):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, schema, doc)
        return {k: as_text(v) for k, v in fastavro.schemaless_reader(io.BytesIO(buf.getvalue()), schema, None).items()}

    assert decoded(ns=1_700_000_000_123_456_789, ms=-1, day=-1, x=float("nan"), xs=[1.5, float("-inf")]) == {
        "ns": "2023-11-14T22:13:20.123456+00:00", "ms": "1969-12-31T23:59:59.999000+00:00", "day": "1969-12-31",
        "x": "NaN", "xs": "{1.5,-Infinity}"}
    assert decoded(ns=None, ms=253_402_300_800_000, day=-719_163, x=float("inf"), xs=[2.0]) == {
        "ns": None, "ms": "10000-01-01 00:00:00.000000+00", "day": "0001-12-31 BC", "x": "Infinity", "xs": "[2.0]"}
    with pytest.raises(ValueError, match="NaN or Infinity"):
        json_text({"x": float("nan")})  # a jsonb column: JSON has no words for them


def test_a_json_number_with_a_fraction_fits_a_nullable_double():
    schema = fastavro.parse_schema({"type": "record", "name": "P", "fields": [
        {"name": "price", "type": ["null", "double"]}, {"name": "n", "type": ["null", "long", "double"]}]})
    doc = _avro_ready(schema, json.loads('{"price": 1.5, "n": 2.5e3}', parse_float=Decimal))
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, doc, strict=True)
    assert fastavro.schemaless_reader(io.BytesIO(buf.getvalue()), schema, None) == {"price": 1.5, "n": 2500.0}


@pytest.mark.parametrize("settings, says", [
    ({"schema.registry.url": "alice:S3cretPW@127.0.0.1:8081"}, "use http://HOST:PORT"),
    ({"schema.registry.url": "http://h:1", "schema.registry.timeout": "abc"}, "not a number of seconds"),
    ({"schema.registry.url": "http://h:1", "basic.auth.credentials.source": "SASL_INHERIT"}, "USER_INFO or URL"),
    ({"schema.registry.url": "http://h:1", "basic.auth.user.info": "aliceS3cretPW"}, "must be USER:PASSWORD"),
    ({"schema.registry.url": "http://h:1", "schema.registry.ssl.ca.location": "/nonexistent"}, "no such file"),
    ({"schema.registry.url": "http://x:S3cretPW@h:1", "basic.auth.user.info": "a:b"}, "given twice"),
])
def test_registry_settings_that_cannot_work_are_usage_errors_that_never_show_the_login(settings, says):
    from kdg.schemas.registry import Registry

    with pytest.raises(UsageError, match=says) as refused:
        Registry(settings)
    assert "S3cretPW" not in str(refused.value)

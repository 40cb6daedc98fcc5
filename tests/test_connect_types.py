"""Kafka Connect's and Debezium's logical types, deletes by key, and json:/source:/envelope: under the envelope.

Events are shaped exactly as Debezium's JsonConverter writes them (schema + payload; an envelope of before,
after, source, op, ts_ms, transaction), produced to a real topic, read by a real `kdg consume --envelope
debezium` into a table of the user's, and read back with SQL. The converters' own edge cases are checked
in pure Python first.
"""

import json
import uuid
from datetime import date, datetime, time, timezone
from decimal import Decimal

import pytest
from conftest import as_json

from kdg.errors import UsageError
from kdg.keys import KeyResolver
from kdg.mapping import RowMaker, build_mapping, parse_type
from kdg.mapping.connect import converter
from kdg.records import Record
from kdg.store.pg import Store

DBZ, CONNECT = "io.debezium.", "org.apache.kafka.connect.data."


# -- Debezium's JsonConverter shape ----------------------------------------------------------------------

def field(name: str, kind: str, logical: str | None = None, optional: bool = True, **extra) -> dict:
    """One field's schema as JsonConverter writes it: type, optional, name and version, parameters, field."""
    schema = {"type": kind, "optional": optional}
    if logical:
        schema.update(name=logical, version=1)
    schema.update(extra)
    schema["field"] = name
    return schema


SOURCE_SCHEMA = field("source", "struct", "io.debezium.connector.postgresql.Source", optional=False, fields=[
    field("version", "string", optional=False), field("connector", "string", optional=False),
    field("name", "string", optional=False), field("ts_ms", "int64", optional=False),
    field("db", "string", optional=False),
    field("schema", "string", optional=False), field("table", "string", optional=False), field("txId", "int64"),
    field("lsn", "int64"), field("xmin", "int64")])


def envelope_schema(row_fields: list[dict], table: str = "t") -> dict:
    row = {"type": "struct", "fields": row_fields, "optional": True, "name": f"shop.public.{table}.Value"}
    return {"type": "struct", "fields": [{**row, "field": "before"}, {**row, "field": "after"}, SOURCE_SCHEMA,
                                         field("op", "string", optional=False), field("ts_ms", "int64"),
                                         field("transaction", "struct", fields=[
                                             field("id", "string", optional=False),
                                             field("total_order", "int64", optional=False)])],
            "optional": False, "name": f"shop.public.{table}.Envelope", "version": 1}


def change(schema: dict, op: str, before, after, lsn: int, ts_ms: int = 1_760_551_615_000) -> str:
    source = {"version": "2.7.0.Final", "connector": "postgresql", "name": "shop", "ts_ms": ts_ms - 7, "db": "shop",
              "schema": "public", "table": "t", "txId": 700 + lsn % 97, "lsn": lsn, "xmin": None}
    payload = {"before": before, "after": after, "source": source, "op": op, "ts_ms": ts_ms, "transaction": None}
    return json.dumps({"schema": schema, "payload": payload}, separators=(",", ":"))


KEY_SCHEMA = {"type": "struct", "fields": [field("id", "int32", optional=False)], "optional": False,
              "name": "shop.public.t.Key"}


def record_key(row_id: int) -> str:
    return json.dumps({"schema": KEY_SCHEMA, "payload": {"id": row_id}}, separators=(",", ":"))


def produce(kdg, topic: str, tmp_path, pairs: list[tuple]) -> None:
    src = tmp_path / f"{uuid.uuid4().hex[:6]}.jsonl"
    src.write_text("".join(json.dumps({"key": k, "value": v, "headers": []}) + "\n" for k, v in pairs))
    report = as_json(kdg("produce", topic, "-g", "at-least-once", "--format", "json", "--file", src, "--json"))
    assert (report["sent"], report["failed"]) == (len(pairs), 0), report


def consume(kdg, topic, group, *args, guarantee="at-least-once", check=True):
    proc = kdg("consume", topic, "-G", group, "-g", guarantee, "-e", "-o", "beginning", "--json", "--envelope",
               "debezium", *args, check=check)
    return as_json(proc) if check else proc


def dead_reasons(kdg, topic) -> list[str]:
    lines = kdg("consume", f"{topic}.dlq", "-G", f"dlq-{uuid.uuid4().hex[:6]}", "--sink", "stdout", "--format",
                "json", "-o", "beginning", "-e").stdout.splitlines()
    return [h["value"] for line in lines for h in json.loads(line)["headers"] if h["name"] == "kdg-dlq-reason"]


@pytest.fixture
def table(conn) -> str:
    name = f"app.cdc_{uuid.uuid4().hex[:8]}"
    with Store(conn.pg_dsn) as store:
        store.execute("CREATE SCHEMA IF NOT EXISTS app")
    return name


def create(conn, ddl: str) -> None:
    with Store(conn.pg_dsn) as store:
        store.execute(ddl)


def fetch(conn, sql: str) -> list[dict]:
    with Store(conn.pg_dsn) as store:
        return [dict(r) for r in store.fetch(sql)]


# -- each logical type, stored exactly -------------------------------------------------------------------

# column, its Postgres type, its field's schema (type, logical name, parameters): one column per type
TYPED = [
    ("d", "date", field("d", "int32", DBZ + "time.Date")),
    ("cd", "date", field("cd", "int32", CONNECT + "Date")),
    ("t", "time", field("t", "int32", DBZ + "time.Time")),
    ("ct", "time", field("ct", "int32", CONNECT + "Time")),
    ("mt", "time", field("mt", "int64", DBZ + "time.MicroTime")),
    ("nt", "time", field("nt", "int64", DBZ + "time.NanoTime")),
    ("ts", "timestamp", field("ts", "int64", DBZ + "time.Timestamp")),
    ("cts", "timestamp", field("cts", "int64", CONNECT + "Timestamp")),
    ("mts", "timestamp", field("mts", "int64", DBZ + "time.MicroTimestamp")),
    ("nts", "timestamp", field("nts", "int64", DBZ + "time.NanoTimestamp")),
    ("mtz", "timestamptz", field("mtz", "int64", DBZ + "time.MicroTimestamp")),
    ("ztz", "timestamptz", field("ztz", "string", DBZ + "time.ZonedTimestamp")),
    ("zt", "timetz", field("zt", "string", DBZ + "time.ZonedTime")),
    ("price", "numeric(10,2)", field("price", "bytes", CONNECT + "Decimal",
                                     parameters={"scale": "2", "connect.decimal.precision": "10"})),
    ("v", "numeric", field("v", "struct", DBZ + "data.VariableScaleDecimal", doc="Variable scaled decimal",
                           fields=[field("scale", "int32", optional=False), field("value", "bytes", optional=False)])),
    ("doc", "jsonb", field("doc", "string", DBZ + "data.Json")),
    ("u", "uuid", field("u", "string", DBZ + "data.Uuid")),
    ("status", "text", field("status", "string", DBZ + "data.Enum", parameters={"allowed": "ACTIVE,GONE"})),
    ("tags", "text[]", field("tags", "string", DBZ + "data.EnumSet", parameters={"allowed": "a,b,c d"})),
    ("tag_text", "text", field("tag_text", "string", DBZ + "data.EnumSet", parameters={"allowed": "a,b,c d"})),
    ("raw", "bytea", field("raw", "bytes")),
]
UID = "b3b1a8e4-5a51-4f3e-9a4e-0c7f4a3d2e11"
# as Debezium sends them, and as Postgres stores them
SENT = {
    1: {"d": 19723, "cd": 20376, "t": 45_296_789, "ct": 3_723_004, "mt": 45_296_789_012, "nt": 45_296_789_012_345,
        "ts": 1_760_551_615_254, "cts": -1, "mts": 1_760_551_615_254_053, "nts": 1_760_551_615_254_053_001,
        "mtz": 1_760_551_615_254_053, "ztz": "2025-10-15T18:06:55.254053Z", "zt": "18:06:55.25Z", "price": "Azc=",
        "v": {"scale": 3, "value": "AOI="}, "doc": '{"a": [1, 2.50], "b": null}', "u": UID, "status": "ACTIVE",
        "tags": "a,c d", "tag_text": "a,c d", "raw": "AQID"},
    2: {"d": -1, "cd": 0, "t": 0, "ct": 86_399_999, "mt": 1, "nt": 999, "ts": -86_400_001, "cts": 0,
        "mts": -1, "nts": 1, "mtz": -1, "ztz": "1969-12-31T23:59:59Z", "zt": "00:00:00Z", "price": "/8k=",
        "v": {"scale": 0, "value": "/w=="}, "doc": "[]", "u": UID.upper(), "status": "GONE", "tags": "",
        "tag_text": "", "raw": ""},
}
UTC = timezone.utc
STORED = {
    1: {"d": date(2024, 1, 1), "cd": date(2025, 10, 15), "t": time(12, 34, 56, 789_000), "ct": time(1, 2, 3, 4_000),
        "mt": time(12, 34, 56, 789_012), "nt": time(12, 34, 56, 789_012),
        "ts": datetime(2025, 10, 15, 18, 6, 55, 254_000), "cts": datetime(1969, 12, 31, 23, 59, 59, 999_000),
        "mts": datetime(2025, 10, 15, 18, 6, 55, 254_053), "nts": datetime(2025, 10, 15, 18, 6, 55, 254_053),
        "mtz": datetime(2025, 10, 15, 18, 6, 55, 254_053, UTC), "ztz": datetime(2025, 10, 15, 18, 6, 55, 254_053, UTC),
        "zt": time(18, 6, 55, 250_000, UTC), "price": Decimal("8.23"), "v": Decimal("0.226"),
        "doc": {"a": [1, 2.5], "b": None}, "u": uuid.UUID(UID), "status": "ACTIVE", "tags": ["a", "c d"],
        "tag_text": "a,c d", "raw": b"\x01\x02\x03"},
    2: {"d": date(1969, 12, 31), "cd": date(1970, 1, 1), "t": time(0, 0), "ct": time(23, 59, 59, 999_000),
        "mt": time(0, 0, 0, 1), "nt": time(0, 0, 0, 1), "ts": datetime(1969, 12, 30, 23, 59, 59, 999_000),
        "cts": datetime(1970, 1, 1), "mts": datetime(1969, 12, 31, 23, 59, 59, 999_999),
        "nts": datetime(1970, 1, 1), "mtz": datetime(1969, 12, 31, 23, 59, 59, 999_999, UTC),
        "ztz": datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC), "zt": time(0, 0, tzinfo=UTC), "price": Decimal("-0.55"),
        "v": Decimal("-1"), "doc": [], "u": uuid.UUID(UID), "status": "GONE", "tags": [], "tag_text": "", "raw": b""},
}


def test_each_connect_and_debezium_type_is_stored_exactly(kdg, conn, topic, group, table, tmp_path):
    """Every logical type of a snapshot read, a create and an update reaches its column as the source held it:
    days as a date, micro- and nanoseconds without a float, base64 decimals with their scale, JSON as JSON."""
    schema = envelope_schema([field("id", "int32", optional=False)] + [s for _, _, s in TYPED])
    first = {"id": 1, **SENT[1]}
    pairs = [(record_key(1), change(schema, "r", None, first, lsn=100)),
             (record_key(2), change(schema, "c", None, {"id": 2, **SENT[2], "price": "AA=="}, lsn=200)),
             (record_key(2), change(schema, "u", None, {"id": 2, **SENT[2]}, lsn=300))]
    produce(kdg, topic, tmp_path, pairs)
    create(conn, f"CREATE TABLE {table} (id integer PRIMARY KEY, "
                 + ", ".join(f"{name} {pg}" for name, pg, _ in TYPED) + ")")
    columns = [arg for name in ["id"] + [n for n, _, _ in TYPED] for arg in ("--column", f"{name} = json:{name}")]
    report = consume(kdg, topic, group, "--table", table, *columns)
    assert (report["consumed"], report["dead_lettered"]) == (3, 0), report
    found = {r.pop("id"): r for r in fetch(conn, f"SELECT * FROM {table}")}
    for row in found.values():
        row["doc"] = json.loads(row["doc"])
    assert found == STORED


def test_a_type_its_column_cannot_take_is_dead_lettered_with_the_reason(kdg, conn, topic, group, table, tmp_path):
    """A Decimal (JsonConverter's numeric form) and a type kdg does not know, each into a date column: without
    their schemas both digits would be read as epoch milliseconds; they are dead-lettered, the Date is stored."""
    def event(row_id: int, x_schema: dict, x) -> tuple:
        schema = envelope_schema([field("id", "int32", optional=False), x_schema])
        return record_key(row_id), change(schema, "c", None, {"id": row_id, "x": x}, lsn=row_id)

    produce(kdg, topic, tmp_path, [
        event(1, field("x", "int32", DBZ + "time.Date"), 19723),
        event(2, field("x", "bytes", CONNECT + "Decimal", parameters={"scale": "0"}), 19723),
        event(3, field("x", "int64", "com.example.Ticks"), 1_700_000_000_000)])
    create(conn, f"CREATE TABLE {table} (id integer PRIMARY KEY, x date)")
    report = consume(kdg, topic, group, "--table", table, "--column", "id = json:id", "--column", "x = json:x")
    assert (report["consumed"], report["dead_lettered"]) == (3, 2), report
    assert fetch(conn, f"SELECT id, x FROM {table}") == [{"id": 1, "x": date(2024, 1, 1)}]
    assert sorted(dead_reasons(kdg, topic)) == [
        "column 'x': com.example.Ticks (a Connect int64) is a type kdg does not convert: it can go to a text or "
        "jsonb column, not date", f"column 'x': {CONNECT}Decimal cannot go to a date column"]


# -- deletes ---------------------------------------------------------------------------------------------

def test_a_delete_without_before_deletes_by_the_record_key(kdg, conn, topic, group, table, tmp_path):
    """REPLICA IDENTITY NOTHING: Debezium's delete has a null before, and the record key holds the id. It deletes
    that row; a delete with neither before nor a key is dead-lettered, saying why (never silently nothing)."""
    schema = envelope_schema([field("id", "int32", optional=False), field("name", "string")])
    produce(kdg, topic, tmp_path, [
        (record_key(1), change(schema, "c", None, {"id": 1, "name": "a"}, lsn=1)),
        (record_key(2), change(schema, "c", None, {"id": 2, "name": "b"}, lsn=2)),
        (record_key(1), change(schema, "d", None, None, lsn=3)),
        (None, change(schema, "d", None, None, lsn=4))])
    create(conn, f"CREATE TABLE {table} (id integer PRIMARY KEY, name text)")
    report = consume(kdg, topic, group, "--table", table, "--column", "id = json:id", "--column", "name = json:name")
    assert (report["consumed"], report["dead_lettered"]) == (4, 1), report
    assert fetch(conn, f"SELECT id, name FROM {table}") == [{"id": 2, "name": "b"}]
    assert dead_reasons(kdg, topic) == [
        "a delete without its key: key column 'id' has no value (before is null, and json:id read the record key, "
        "which has no such field); nothing says which row to delete"]


# -- json:, source: and envelope: ------------------------------------------------------------------------

@pytest.mark.parametrize("id_from", ["json:id", "source:lsn"])
def test_id_from_reads_the_row_or_the_source_and_columns_read_the_envelope(kdg, conn, topic, group, table, tmp_path,
                                                                         id_from):
    """Exactly-once under the envelope: --id-from json:id reads after's id (as the column does), source:lsn the
    source block's lsn; a second group re-reading the topic finds every key claimed. Columns read source:ts_ms
    and envelope:op."""
    schema = envelope_schema([field("id", "int32", optional=False), field("name", "string")])
    produce(kdg, topic, tmp_path, [(record_key(i), change(schema, "c", None, {"id": i, "name": f"n{i}"}, lsn=i * 10,
                                                          ts_ms=1_760_000_000_000 + i)) for i in range(1, 4)])
    create(conn, f"CREATE TABLE {table} (id integer PRIMARY KEY, at bigint, op text)")
    args = ["--table", table, "--column", "id = json:id", "--column", "at = source:ts_ms", "--column",
            "op = envelope:op", "--id-from", id_from]
    report = consume(kdg, topic, group, *args, guarantee="exactly-once")
    assert (report["processed"], report["dead_lettered"]) == (3, 0), report
    again = consume(kdg, topic, f"{group}-again", *args, guarantee="exactly-once")
    assert (again["dead_lettered"], again["duplicates_suppressed"]) == (0, 3), again
    assert fetch(conn, f"SELECT * FROM {table} ORDER BY id") == [
        {"id": i, "at": 1_760_000_000_000 + i - 7, "op": "c"} for i in range(1, 4)]


def test_an_id_from_that_finds_nothing_says_what_was_given_and_why():
    schema = envelope_schema([field("id", "int32", optional=False)])
    rec = Record(change(schema, "c", None, {"id": 1}, lsn=5).encode(), None, [], 0, "t", 9, 0)
    assert KeyResolver("json:id", envelope="debezium").key(rec) == "1"
    assert KeyResolver("envelope:/source/lsn", envelope="debezium").key(rec) == "5"
    given = KeyResolver("json:/source/lsn", envelope="debezium")
    assert given.key(rec) is None
    assert given.missing(rec).startswith("--id-from json:/source/lsn found nothing in record t/0/9 (no kdg-id "
                                         "header either): under --envelope debezium json: reads the change event's "
                                         "row")
    with pytest.raises(UsageError, match="give --envelope debezium"):
        KeyResolver("source:lsn", envelope="none")
    with pytest.raises(UsageError, match="a field of a change event: give --envelope debezium"):
        build_mapping(columns=["at bigint = source:ts_ms"], table="t")


# -- the converters and their plans, in Python -----------------------------------------------------------

@pytest.mark.parametrize("logical, kind, column, sent, text", [
    (DBZ + "time.Date", "int32", "timestamptz", 19723, "2024-01-01 00:00:00+00"),
    (DBZ + "time.MicroTimestamp", "int64", "bigint", 1_760_551_615_254_053, "1760551615254053"),  # as sent
    (DBZ + "time.NanoTimestamp", "int64", "timestamp", -1, "1969-12-31 23:59:59.999999999"),
    (DBZ + "time.ZonedTimestamp", "string", "timestamp", "2024-01-01T10:00:00+02:00", "2024-01-01T08:00:00"),
    (DBZ + "time.MicroTime", "int64", "timetz", 86_400_000_000, "24:00:00+00"),
    (CONNECT + "Decimal", "bytes", "numeric", "AA==", "0.00"),
    (DBZ + "data.EnumSet", "string", "text[]", 'x,y"z', '{"x","y\\"z"}'),
    (DBZ + "data.Json", "string", "jsonb", '"a"', '"a"'),
])
def test_a_logical_type_becomes_the_text_its_column_reads(logical, kind, column, sent, text):
    params = {"parameters": {"scale": "2"}} if logical.endswith("Decimal") else {}
    column_type = parse_type(column) if column != "timetz" else \
        parse_type(column).resolved("time with time zone", False)  # as Postgres names it
    assert converter(field("f", kind, logical, **params), column_type)(sent) == text


def test_a_schema_is_read_and_planned_once_not_per_record():
    """Records with the same schema text share its parsed schema and one plan; another schema gets its own."""
    maker = RowMaker(build_mapping(columns=["id integer = json:id", "d date = json:d"], table="app.t",
                                   envelope="debezium", key=("id",)))
    one = envelope_schema([field("id", "int32", optional=False), field("d", "int32", DBZ + "time.Date")])
    two = envelope_schema([field("id", "int32", optional=False), field("d", "string")])
    values = [change(one, "c", None, {"id": i, "d": i}, lsn=i) for i in range(3)] + \
        [change(two, "c", None, {"id": 9, "d": "2024-02-29"}, lsn=9)]
    rows, dead = maker.rows([(Record(v.encode(), None, [], 0, "t", i, 0), str(i)) for i, v in enumerate(values)])
    assert dead == [] and [r[6:] for r in rows] == [("0", "1970-01-01"), ("1", "1970-01-02"), ("2", "1970-01-03"),
                                                    ("9", "2024-02-29")]
    reader = maker._reader
    assert len(reader._value_json._known) == 2 and len(reader._plans) == 2


# -- Avro: Confluent's AvroConverter keeps Connect's names in connect.name --------------------------------

def avro_type(kind: str, logical: str) -> dict:
    return {"type": kind, "connect.version": 1, "connect.name": logical}


AVRO_ENVELOPE = {"type": "record", "name": "Envelope", "namespace": "shop.public.t", "fields": [
    {"name": "before", "type": ["null", {"type": "record", "name": "Value", "fields": [
        {"name": "id", "type": "int"},
        {"name": "d", "type": ["null", avro_type("int", DBZ + "time.Date")], "default": None},
        {"name": "mts", "type": ["null", avro_type("long", DBZ + "time.MicroTimestamp")], "default": None},
        {"name": "doc", "type": ["null", avro_type("string", DBZ + "data.Json")], "default": None}],
        "connect.name": "shop.public.t.Value"}], "default": None},
    {"name": "after", "type": ["null", "Value"], "default": None},
    {"name": "op", "type": "string"}, {"name": "ts_ms", "type": ["null", "long"], "default": None}],
    "connect.name": "shop.public.t.Envelope"}


def test_debezium_types_in_avro_are_read_from_the_writer_schema(kdg, conn, group, table, tmp_path, schema_registry):
    """The same types through the Schema Registry: the writer schema's connect.name says what each int is."""
    schema = tmp_path / "envelope.avsc"
    schema.write_text(json.dumps(AVRO_ENVELOPE))
    after = {"id": 1, "d": 19723, "mts": 1_760_551_615_254_053, "doc": '{"a": 1}'}
    src = tmp_path / "events.jsonl"
    src.write_text(json.dumps({"key": "1", "value": json.dumps({"before": None, "after": after, "op": "c",
                                                                "ts_ms": 1}), "headers": []}) + "\n")
    topic, env = f"t-{uuid.uuid4().hex[:10]}", {"KDG_SCHEMA_REGISTRY": schema_registry}
    sent = as_json(kdg("produce", topic, "--value-format", "avro", "--schema", schema, "--format", "json", "--file",
                       src, "--json", env=env))
    assert sent["sent"] == 1, sent
    create(conn, f"CREATE TABLE {table} (id integer PRIMARY KEY, d date, mts timestamp, doc jsonb)")
    report = as_json(kdg("consume", topic, "-G", group, "-e", "-o", "beginning", "--json", "--envelope", "debezium",
                         "--value-format", "avro", "--table", table, *[a for c in ("id", "d", "mts", "doc")
                                                                        for a in ("--column", f"{c} = json:{c}")],
                         env=env))
    assert (report["consumed"], report["dead_lettered"]) == (1, 0), report
    assert fetch(conn, f"SELECT * FROM {table}") == [
        {"id": 1, "d": date(2024, 1, 1), "mts": datetime(2025, 10, 15, 18, 6, 55, 254_053), "doc": '{"a": 1}'}]

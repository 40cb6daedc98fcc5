"""Typed sinks, the pure-Python half: SOURCE grammar, JSON Pointer, types, --column, TOML, rows, checks.

No Kafka or Postgres here (the stack half is tests/test_typed_sink.py): these are the parsers and
the Python side of the mapping, which must be exact before any SQL sees their output.
"""

import json
import subprocess
import sys
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest

from kdg.keys import KeyResolver
from kdg.errors import UsageError
from kdg.guarantees import policy_for
from kdg.mapping import RowMaker, build_mapping, parse_column, parse_pointer, parse_source, parse_type
from kdg.mapping.rows import DELETE_REASON, TOMBSTONE_REASON
from kdg.mapping.sources import as_text, json_text, parse_json, walk
from kdg.records import Record
from kdg.store.tables import TableShape, check_mapping, create_table_sql
from kdg.store.typed import TypedTarget

ROOT = Path(__file__).parent.parent

# -- SOURCE grammar ------------------------------------------------------------------------------


@pytest.mark.parametrize("spec, kind, path, pointer, name", [
    ("json:amount", "value", ("amount",), False, ""),
    ("json:a.b", "value", ("a.b",), False, ""),                 # dots taken literally
    ("json:/customer/name", "value", ("customer", "name"), True, ""),
    ("json:/a~1b/m~0n", "value", ("a/b", "m~n"), True, ""),
    ("key", "key_text", (), False, ""),
    ("key:id", "key", ("id",), False, ""),
    ("key:/id/0", "key", ("id", "0"), True, ""),
    ("header:source", "header", (), False, "source"),
    ("header:a:b=c", "header", (), False, "a:b=c"),
    ("topic", "meta", (), False, "topic"),
    ("partition", "meta", (), False, "partition"),
    ("offset", "meta", (), False, "offset"),
    ("timestamp", "meta", (), False, "timestamp"),
    ("idempotency_key", "meta", (), False, "idempotency_key"),
])
def test_each_source_form_parses(spec, kind, path, pointer, name):
    source = parse_source(spec)
    assert (source.kind, source.path, source.pointer, source.name, source.spec) == (kind, path, pointer, name, spec)


@pytest.mark.parametrize("spec", ["json:", "json", "header:", "value", "jsn:id", "key:", "offsets", "",
                                  "json:/a~2b"])
def test_an_unknown_source_is_a_usage_error_listing_the_forms(spec):
    with pytest.raises(UsageError) as err:
        parse_source(spec)
    assert repr(spec) in str(err.value)
    assert "json:/POINTER" in str(err.value) or "RFC 6901" in str(err.value)


# RFC 6901, section 5: the example document and what each pointer yields
RFC_DOC = {"foo": ["bar", "baz"], "": 0, "a/b": 1, "c%d": 2, "e^f": 3, "g|h": 4, "i\\j": 5, 'k"l': 6, " ": 7,
           "m~n": 8}


@pytest.mark.parametrize("pointer, expected", [
    ("/foo", ["bar", "baz"]), ("/foo/0", "bar"), ("/", 0), ("/a~1b", 1), ("/c%d", 2), ("/e^f", 3), ("/g|h", 4),
    ("/i\\j", 5), ('/k"l', 6), ("/ ", 7), ("/m~0n", 8),
    ("/foo/2", None), ("/foo/-", None), ("/foo/01", None), ("/foo/x", None), ("/nope", None), ("/foo/0/x", None),
])
def test_json_pointer_follows_rfc_6901(pointer, expected):
    assert walk(RFC_DOC, parse_pointer(pointer), True) == expected


def test_pointer_escapes_decode_tilde_one_before_tilde_zero():
    assert parse_pointer("/~01") == ("~1",)  # RFC 6901: '~01' is '~1', not '/'


def test_a_field_never_indexes_an_array_a_pointer_does():
    assert walk(["x"], ("0",), False) is None
    assert walk(["x"], ("0",), True) == "x"


# -- values as text ------------------------------------------------------------------------------

def test_values_become_the_text_postgres_will_cast():
    doc = parse_json(b'{"s": "12.50", "n": 12.50, "i": 9007199254740993, "t": true, "f": false, "z": null, '
                     b'"o": {"b": [1, 2.0]}, "e": 1e3}')
    assert [as_text(doc[k]) for k in ("s", "n", "i", "t", "f", "z", "o", "e")] == [
        "12.50", "12.50", "9007199254740993", "true", "false", None, '{"b":[1,2.0]}', "1e3"]


def test_jsonb_values_are_json_text_with_numbers_exactly_as_written():
    doc = parse_json(b'{"a": [0.10, "x\\u00e9", {"k": null}], "s": "plain"}')
    assert json_text(doc["a"]) == '[0.10,"x\u00e9",{"k":null}]'
    assert json.loads(json_text(doc["a"]), parse_float=Decimal) == doc["a"]
    assert json_text(doc["s"]) == '"plain"'
    assert json_text(None) is None


def test_nan_and_infinity_are_not_json():
    for text in (b'{"a": NaN}', b'{"a": Infinity}'):
        with pytest.raises(ValueError):
            parse_json(text)


# -- types ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, name, formatted", [
    ("text", "text", "text"), ("INTEGER", "integer", "integer"), ("int", "integer", "integer"),
    ("bigint", "bigint", "bigint"), ("int8", "bigint", "bigint"), ("numeric", "numeric", "numeric"),
    ("numeric(12, 2)", "numeric(12,2)", "numeric(12,2)"), ("decimal(5)", "numeric(5,0)", "numeric(5,0)"),
    ("boolean", "boolean", "boolean"), ("bool", "boolean", "boolean"),
    ("timestamptz", "timestamptz", "timestamp with time zone"),
    ("timestamp  with time zone", "timestamptz", "timestamp with time zone"),
    ("date", "date", "date"), ("jsonb", "jsonb", "jsonb"), ("bytea", "bytea", "bytea"), ("uuid", "uuid", "uuid"),
])
def test_types_parse_to_the_name_format_type_reports(text, name, formatted):
    parsed = parse_type(text)
    assert (parsed.name, parsed.formatted) == (name, formatted)
    assert parsed.staged == "text"  # jsonb too: a value Postgres refuses fails its row's cast, not the COPY


@pytest.mark.parametrize("text, name, formatted", [
    ("varchar(20)", "varchar(20)", "character varying(20)"), ("Character Varying (5)", "varchar(5)",
                                                                "character varying(5)"),
    ("float8", "double precision", "double precision"), ("double  precision", "double precision", "double precision"),
    ("int2", "smallint", "smallint"), ("timestamp", "timestamp", "timestamp without time zone"),
    ("timestamp(3) with time zone", "timestamptz(3)", "timestamp(3) with time zone"),
    ("text[]", "text[]", "text[]"), ("varchar(20)[]", "varchar(20)[]", "character varying(20)[]"),
    ("interval", "interval", "interval"), ("json", "json", "json"),
])
def test_more_types_parse_to_what_format_type_reports(text, name, formatted):
    parsed = parse_type(text)
    assert (parsed.name, parsed.formatted) == (name, formatted)


def test_a_type_postgres_must_name_waits_for_it():
    """An enum, a domain, a range, a type in a schema: a name only, until Postgres resolves it."""
    mood = parse_type('App."Mood"')
    assert (mood.name, mood.lookup, mood.pg) == ('app."Mood"', 'app."Mood"', None)
    with pytest.raises(ValueError):
        mood.cast("v")
    resolved = mood.resolved('app."Mood"', False)
    assert resolved.cast("s.c0") == '(s.c0)::app."Mood"' and resolved.staged == "text"


@pytest.mark.parametrize("text", ["bigint; drop table t", "text)", "int[", "x(1)(2)", '"a""b"', "numeric(0)",
                                  "numeric(3,4)", "int -- c", "text/*", "'text'"])
def test_what_is_not_a_type_name_is_a_usage_error_naming_the_column(text):
    with pytest.raises(UsageError) as err:
        parse_type(text, "amount")
    assert "'amount'" in str(err.value) and repr(text) in str(err.value)


def test_which_table_types_a_mapping_type_fits():
    def fits(mapping_type, table_type, table_pg):
        typ = parse_type(mapping_type)
        return typ.fits(table_type, table_pg)
    assert fits("text", "character varying(20)", "character varying") and fits("text", "character(3)", "character")
    assert fits("numeric", "numeric(12,2)", "numeric")
    assert fits("numeric(12,2)", "numeric(12,2)", "numeric") and not fits("numeric(12,2)", "numeric", "numeric")
    assert not fits("integer", "bigint", "bigint") and not fits("integer", "numeric(12,2)", "numeric")
    assert fits("timestamptz", "timestamp with time zone", "timestamp with time zone")
    assert not fits("timestamptz", "timestamp without time zone", "timestamp without time zone")
    assert fits("varchar(20)", "character varying(20)", "character varying")
    assert not fits("varchar(20)", "character varying(10)", "character varying")
    assert fits("timestamp(3) with time zone", "timestamp(3) with time zone", "timestamp with time zone")
    assert fits("text[]", "text[]", "text[]") and not fits("text", "text[]", "text[]")


def test_timestamps_take_iso_text_or_epoch_millis():
    cast = parse_type("timestamptz").cast("s.c0")
    assert "to_timestamp((s.c0)::numeric / 1000)" in cast and "(s.c0)::timestamptz" in cast
    assert "^-?[0-9]+$" in cast
    assert "AT TIME ZONE 'UTC'" in parse_type("timestamp").cast("s.c0")
    assert "decode(substr(v, 3), 'hex')" in parse_type("bytea").cast("v")  # \x hex: decoded Avro/Protobuf bytes
    assert "ELSE convert_to(v, 'UTF8')" in parse_type("bytea").cast("v")
    # the length of a varchar(5) is the INSERT's to apply (22001), never cut by an explicit cast
    assert parse_type("varchar(5)").cast("v") == "v"
    assert "jsonb_array_elements_text((v)::jsonb))::integer[]" in parse_type("int[]").cast("v")


# -- --column and the TOML file ------------------------------------------------------------------

def test_column_specs_parse():
    col = parse_column("placed_at timestamp with time zone = json:/order/placed")
    assert (col.name, col.type.name, col.source.path) == ("placed_at", "timestamptz", ("order", "placed"))
    assert parse_column("amount numeric(12, 2)=json:amount").describe() == "amount numeric(12,2) = json:amount"
    assert parse_column("h text = header:a=b").source.name == "a=b"  # only the first '=' splits


@pytest.mark.parametrize("spec, says", [
    ("order_id bigint", "expected 'NAME [TYPE] = SOURCE'"), ("= json:id", "expected 'NAME [TYPE] = SOURCE'"),
    ("order_id bigint = ", "expected 'NAME [TYPE] = SOURCE'"), ('"Order bigint = json:id', "column name '\"Order'"),
    ("order_id big;int = json:id", "'big;int' is not a type name"), ("order_id bigint = jsn:id", "unknown source"),
])
def test_a_bad_column_spec_is_a_usage_error(spec, says):
    with pytest.raises(UsageError) as err:
        parse_column(spec)
    assert says in str(err.value)


ORDERS_TOML = """
table = "app.orders"
mode = "upsert"
key = ["order_id"]
on_tombstone = "delete"

[columns]
order_id = { type = "bigint", from = "key" }
customer = { type = "text", from = "json:/customer/name" }
amount = { type = "numeric(12,2)", from = "json:amount" }
"""


def test_the_mapping_file_and_flags_that_override_it(tmp_path):
    path = tmp_path / "orders.toml"
    path.write_text(ORDERS_TOML)
    mapping = build_mapping(file=path)
    assert mapping.to_dict() == {
        "table": "app.orders", "mode": "upsert", "key": ["order_id"], "on_tombstone": "delete",
        "on_truncate": "dead-letter", "create_table": False,
        "envelope": "none", "value_format": "json", "key_format": "json",
        "columns": [{"name": "order_id", "type": "bigint", "from": "key"},
                    {"name": "customer", "type": "text", "from": "json:/customer/name"},
                    {"name": "amount", "type": "numeric(12,2)", "from": "json:amount"}]}
    over = build_mapping(file=path, table="app.orders_copy", mode="insert", on_tombstone="ignore", create_table=True,
                         columns=["amount numeric = json:total", "note text = header:note"])
    assert (over.table.text, over.mode, over.on_tombstone, over.create_table) == (
        "app.orders_copy", "insert", "ignore", True)
    assert [c.describe() for c in over.columns] == [
        "order_id bigint = key", "customer text = json:/customer/name", "amount numeric = json:total",
        "note text = header:note"]


def test_no_typed_option_means_the_generic_sink():
    assert build_mapping(table="app.events") is None
    assert build_mapping() is None


@pytest.mark.parametrize("toml, flags, says", [
    ('table = "t"\n[columns]\nid = { type = "bigint", from = "json:id" }\nextra = 1\n', {}, "must be"),
    ('table = "t"\ncolumn = {}\n', {}, "unknown key 'column'"),
    ('table = "t"\n[columns]\nid = { type = "bigint" }\n', {}, "column 'id' must be"),
    ('table = "t"\n[columns]\nid = { type = "bigint", from = "json:id", null = true }\n', {}, "column 'id' must be"),
    ('table = "t"\n[columns]\nid = { type = "bigint", from = "json:id" }\n', {"mode": "merge"}, "mode 'merge'"),
    ('table = "t"\nmode = 3\n[columns]\nid = { type = "bigint", from = "json:id" }\n', {}, "mode must be a str"),
    ('table = "t"\n[columns]\nid = { type = "bigint", from = "json:id" }\n', {"on_tombstone": "drop"},
     "on_tombstone 'drop'"),
    ('[columns]\nid = { type = "bigint", from = "json:id" }\n', {}, "needs its table"),
    ('table = "t"\n', {}, "needs columns"),
    ('table = "t"\nkey = ["nope"]\n[columns]\nid = { type = "bigint", from = "json:id" }\n', {},
     "key column 'nope'"),
    ('table = "t"\nkey = ["id"]\non_tombstone = "delete"\n[columns]\nid = { type = "bigint", from = "json:id" }\n',
     {}, "a tombstone has no value"),
    ('table = "a.b.c"\n[columns]\nid = { type = "bigint", from = "json:id" }\n', {}, "NAME or SCHEMA.NAME"),
    ("table = [\n", {}, "not TOML"),
])
def test_a_bad_mapping_file_is_one_usage_error(tmp_path, toml, flags, says):
    path = tmp_path / "m.toml"
    path.write_text(toml)
    with pytest.raises(UsageError) as err:
        build_mapping(file=path, **flags)
    assert says in str(err.value), str(err.value)


def test_a_missing_mapping_file_names_it(tmp_path):
    with pytest.raises(UsageError) as err:
        build_mapping(file=tmp_path / "nope.toml")
    assert "nope.toml" in str(err.value)


# -- records to staged rows ----------------------------------------------------------------------

def _rec(value, key=None, headers=(), offset=0, timestamp=1732350000000):
    return Record(value, key, list(headers), 1, "orders", offset, timestamp)


def _maker(*columns, **options):
    return RowMaker(build_mapping(columns=list(columns), table="app.orders", **options))


def test_rows_carry_metadata_then_one_text_per_column():
    maker = _maker("id bigint = json:id", "name text = json:/customer/name", "tags jsonb = json:tags",
                   "raw_key text = key", "kid bigint = key:/id", "src text = header:src", "p integer = partition",
                   "o bigint = offset", "ts timestamptz = timestamp", "ik text = idempotency_key",
                   "missing text = json:/customer/age", "nothing text = json:gone")
    rows, dead = maker.rows([(_rec(b'{"id": 7, "customer": {"name": "Ann"}, "tags": ["a", 1.50], "gone": null}',
                                   b'{"id": 7}', [("src", b"web")], offset=42), "order-7")])
    assert dead == []
    assert rows == [(0, "order-7", "orders", 1, 42, False, "7", "Ann", '["a",1.50]', '{"id": 7}', "7", "web", "1",
                     "42", "1732350000000", "order-7", None, None)]


@pytest.mark.parametrize("on_tombstone, staged", [("dead-letter", False), ("delete", True), ("ignore", True)])
def test_tombstones_follow_on_tombstone(on_tombstone, staged):
    maker = _maker("id bigint = key", "amount numeric = json:amount", mode="upsert", on_tombstone=on_tombstone,
                   key=("id",))
    rows, dead = maker.rows([(_rec(b'{"amount": 1}', b"5"), "a"), (_rec(None, b"5", offset=1), "b")])
    assert rows[0] == (0, "a", "orders", 1, 0, False, "5", "1")
    if staged:
        assert rows[1:] == [(1, "b", "orders", 1, 1, True, "5", None)] and dead == []
    else:
        assert rows[1:] == [] and [(d[1], d[2]) for d in dead] == [(TOMBSTONE_REASON, "b")]


def _event(op, before=None, after=None, schemas=False) -> bytes:
    event = {"before": before, "after": after, "op": op, "source": {"db": "shop", "table": "orders"}, "ts_ms": 1}
    return json.dumps({"schema": {"type": "struct"}, "payload": event} if schemas else event).encode()


@pytest.mark.parametrize("on_tombstone", ["delete", "ignore", "dead-letter"])
def test_a_debezium_change_stream_upserts_after_and_deletes_by_before(on_tombstone):
    """Creates, updates and snapshot reads stage `after`; a delete stages a tombstone with `before`'s key (the
    table deletes it, or, under ignore, it is claimed and not applied); JsonConverter's schema/payload unwrapped.
    Debezium's tombstone has its row in the record key: json:id reads the key's id."""
    maker = _maker("id bigint = json:id", "name text = json:name", "kid bigint = key:id", envelope="debezium",
                   key=("id",), **({} if on_tombstone == "delete" else {"on_tombstone": on_tombstone}))
    assert (maker.mapping.mode, maker.mapping.on_tombstone) == ("upsert", on_tombstone)
    key = json.dumps({"schema": {"type": "struct"}, "payload": {"id": 5}}).encode()
    rows, dead = maker.rows([
        (_rec(_event("r", after={"id": 5, "name": "a"}), key), "k0"),
        (_rec(_event("c", after={"id": 6, "name": "b"}, schemas=True), b'{"id": 6}', offset=1), "k1"),
        (_rec(_event("u", {"id": 5, "name": "a"}, {"id": 5, "name": "c"}), key, offset=2), "k2"),
        (_rec(_event("d", before={"id": 5, "name": "c"}, schemas=True), key, offset=3), "k3"),
        (_rec(None, key, offset=4), "k4"),  # Debezium's tombstone after a delete, for compaction
    ])
    assert [r[5:] for r in rows[:3]] == [(False, "5", "a", "5"), (False, "6", "b", "6"), (False, "5", "c", "5")]
    if on_tombstone == "dead-letter":
        assert rows[3:] == [] and [(d[1], d[2]) for d in dead] == [(DELETE_REASON, "k3"), (TOMBSTONE_REASON, "k4")]
    else:
        assert [r[1:] for r in rows[3:]] == [("k3", "orders", 1, 3, True, "5", "c", "5"),
                                             ("k4", "orders", 1, 4, True, "5", None, "5")] and dead == []


@pytest.mark.parametrize("value, says", [
    (b'{"id": 1}', "not a Debezium change event: no op"), (_event("x"), "op 'x': only c, u, r, d and t"),
    (_event("t"), "a Debezium truncate (op t): --on-truncate dead-letter"),
    (_event("c"), "op c) without an after row"), (b"[1]", "no op"), (b"{bad", "bad JSON"),
])
def test_what_is_not_a_change_event_is_a_dead_letter(value, says):
    maker = _maker("id bigint = json:id", envelope="debezium", key=("id",))
    rows, dead = maker.rows([(_rec(value), "k")])
    assert rows == [] and len(dead) == 1 and says in dead[0][1], dead


def test_a_json_key_may_delete_only_under_an_envelope_that_carries_before():
    with pytest.raises(UsageError, match="a tombstone has no value"):
        build_mapping(columns=["id bigint = json:id"], table="t", mode="upsert", key=("id",), on_tombstone="delete")
    assert build_mapping(columns=["id bigint = json:id"], table="t", key=("id",), envelope="debezium").envelope \
        == "debezium"
    with pytest.raises(UsageError, match="envelope 'maxwell': use none or debezium"):
        build_mapping(columns=["id bigint = json:id"], table="t", envelope="maxwell")


@pytest.mark.parametrize("value, key, says", [
    (b"{not json", None, "bad JSON"), (b'{"a": NaN}', None, "bad JSON"),
    (b'{"a": 1}', b"{bad", "bad JSON in the record key"),
    (b'{"a": "x\\u0000y"}', None, "Postgres text cannot hold"),
    (b'{"a": "\\ud800"}', None, "Postgres text cannot hold"),
])
def test_what_postgres_could_not_take_becomes_a_dead_letter_with_a_reason(value, key, says):
    maker = _maker("a text = json:a", "k text = key:id")
    rows, dead = maker.rows([(_rec(value, key), "k1")])
    assert rows == [] and len(dead) == 1 and says in dead[0][1] and dead[0][2] == "k1"


def test_a_nul_escape_in_jsonb_is_refused_but_an_escaped_backslash_is_not():
    maker = _maker("doc jsonb = json:d")
    rows, dead = maker.rows([(_rec(rb'{"d": ["\\u0000"]}'), "ok"), (_rec(rb'{"d": ["\u0000"]}'), "nul")])
    assert [r[1] for r in rows] == ["ok"] and rows[0][-1] == '["\\\\u0000"]'
    assert [d[2] for d in dead] == ["nul"]


# -- --id-from reads JSON through the same sources -------------------------------------------------

def test_id_from_takes_the_same_json_forms_as_a_column():
    rec = _rec(b'{"id": 12, "a.b": "dotted", "order": {"ids": ["x", "y"]}, "f": 1.50, "o": {"k": true}}')
    assert KeyResolver("json:id").key(rec) == "12"
    assert KeyResolver("json:a.b").key(rec) == "dotted"
    assert KeyResolver("json:/order/ids/1").key(rec) == "y"
    assert KeyResolver("json:f").key(rec) == "1.50"
    assert KeyResolver("json:o").key(rec) == '{"k":true}'
    assert KeyResolver("json:/order/none").key(rec) is None
    assert KeyResolver("offset").key(rec) == "orders/1/0"
    assert KeyResolver("json:id").key(_rec(b'{"id": 1}', headers=[("kdg-id", b"from-header")])) == "from-header"
    with pytest.raises(ValueError):
        KeyResolver("json:id").key(_rec(b"{nope"))
    with pytest.raises(ValueError):
        KeyResolver("json:id").key(_rec(None))  # a tombstone has no JSON to key it by: dead-lettered


@pytest.mark.parametrize("spec", ["json:", "json:/a~9", "key:id", "column:x", "offset:3"])
def test_a_bad_id_from_is_a_usage_error(spec):
    with pytest.raises(UsageError):
        KeyResolver(spec)


# -- the mapping against a table's shape ---------------------------------------------------------

ORDERS_SHAPE = TableShape(
    types={"order_id": "bigint", "customer": "character varying(20)", "amount": "numeric(12,2)",
           "placed_at": "timestamp with time zone", "note": "text", "status": "text"},
    base={"order_id": ("bigint", False), "customer": ("character varying", False), "amount": ("numeric", False),
          "placed_at": ("timestamp with time zone", False), "note": ("text", False), "status": ("text", False)},
    unfilled=("order_id",), unique_keys=(frozenset({"order_id"}), frozenset({"customer", "placed_at"})),
    primary_key=("order_id",))
ORDER_COLUMNS = ["order_id bigint = json:id", "customer text = json:customer", "amount numeric = json:amount",
                 "placed_at timestamptz = json:placed_at"]


def test_a_fitting_mapping_gets_the_primary_key_as_its_key():
    checked = check_mapping(build_mapping(columns=ORDER_COLUMNS, table="app.orders", mode="upsert"), ORDERS_SHAPE)
    assert checked.key == ("order_id",)
    mapping = build_mapping(columns=ORDER_COLUMNS, table="app.orders", mode="upsert", key=("customer", "placed_at"))
    assert check_mapping(mapping, ORDERS_SHAPE).key == ("customer", "placed_at")


@pytest.mark.parametrize("columns, options, shape_changes, says", [
    (ORDER_COLUMNS + ["extra text = json:x"], {}, {}, 'column "extra" is not in table app.orders'),
    (["order_id integer = json:id"] + ORDER_COLUMNS[1:], {}, {},
     'column "order_id": the mapping says integer, table app.orders has bigint'),
    (ORDER_COLUMNS[1:], {}, {}, 'column "order_id" of app.orders is NOT NULL with no default'),
    (ORDER_COLUMNS, {"mode": "upsert", "key": ("amount",)}, {},
     "upsert on (amount) needs a primary key or unique index on exactly those columns"),
    (ORDER_COLUMNS, {"mode": "upsert"}, {"primary_key": (), "unique_keys": ()}, "upsert needs key columns"),
    (ORDER_COLUMNS, {"on_tombstone": "delete"}, {},
     "key column 'order_id' comes from 'json:id', and a tombstone has no value"),
])
def test_a_mapping_that_does_not_fit_the_table_names_the_column(columns, options, shape_changes, says):
    mapping = build_mapping(columns=columns, table="app.orders", **options)
    with pytest.raises(UsageError) as err:
        check_mapping(mapping, replace(ORDERS_SHAPE, **shape_changes))
    assert says in str(err.value), str(err.value)


def test_create_table_makes_the_key_the_primary_key():
    mapping = build_mapping(columns=["id bigint = key", "doc jsonb = json:/", "at date = json:at"],
                            table="app.t", mode="upsert", key=("id",), create_table=True)
    assert create_table_sql(mapping) == ('CREATE TABLE IF NOT EXISTS "app"."t" ("id" bigint, "doc" jsonb, '
                                         '"at" date, PRIMARY KEY ("id"))')


def test_upsert_sql_keeps_the_latest_version_and_never_merges_null_keys():
    mapping = build_mapping(columns=["id bigint = key", "doc jsonb = json:d"], table="app.t", mode="upsert",
                            key=("id",), on_tombstone="delete")
    target = TypedTarget(mapping)
    [sql] = target.write_sql()
    assert "DISTINCT ON ((s.c0)::bigint, CASE WHEN s.c0 IS NULL THEN s.seq END)" in sql
    assert "s.seq DESC" in sql and 'ON CONFLICT ("id") DO UPDATE SET "doc" = EXCLUDED."doc"' in sql
    assert "DELETE FROM \"app\".\"t\" t USING latest l WHERE l.tomb" in sql
    assert "c1 text" in target.stage_ddl() and "c0 text" in target.stage_ddl() and "(l.c1)::jsonb" in sql
    only_key = TypedTarget(build_mapping(columns=["id bigint = key"], table="t", mode="upsert", key=("id",)))
    assert only_key.write_sql()[0].endswith('DO UPDATE SET "id" = EXCLUDED."id"')  # counted as written


# -- the policy speaks of write modes from its own fields ------------------------------------------

def test_policy_says_what_upsert_makes_of_each_guarantee():
    assert policy_for("at-least-once").write_mode_effect("upsert") == (
        "idempotent writes make at-least-once effectively-once for this table — but not for side effects of the "
        "handler")
    assert "duplicate rows" in policy_for("at-least-once").write_mode_effect("insert")
    assert "claimed once" in policy_for("exactly-once").write_mode_effect("upsert")
    assert "loses" in policy_for("at-most-once").write_mode_effect("upsert")
    with pytest.raises(UsageError):
        policy_for("exactly-once").write_mode_effect("merge")


# -- the command line, without a stack -------------------------------------------------------------

def _kdg(*args):
    return subprocess.run([sys.executable, "-m", "kdg", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)


def test_mapping_check_offline_reads_the_file(tmp_path):
    path = tmp_path / "orders.toml"
    path.write_text(ORDERS_TOML)
    proc = _kdg("mapping", "check", path, "--offline", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["table"], report["mode"], report["key"], report["table_state"], report["ok"]) == (
        "app.orders", "upsert", ["order_id"], "not checked (--offline)", True)
    # offline, a type is checked to be a type name (whether Postgres has it needs Postgres)
    path.write_text(ORDERS_TOML.replace('"bigint"', '"bigint); drop table x; --"'))
    proc = _kdg("mapping", "check", path, "--offline")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == [
        "error: column 'order_id': 'bigint); drop table x; --' is not a type name (e.g. bigint, varchar(20), "
        "double precision, text[], numeric(12,2), myschema.mood)"]


def test_policy_mode_row(tmp_path):
    proc = _kdg("policy", "at-least-once", "--mode", "upsert", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "effectively-once for this table" in json.loads(proc.stdout)["write_mode"]["effect"]


def test_the_field_watch_reads_a_jsonconverter_payload_not_its_wrapper():
    """Values in JsonConverter's {"schema", "payload"}: the watch holds the mapping against the payload's fields
    (it once said every mapped field absent, and schema and payload unmapped), and still says a new one."""
    import json as _json

    from kdg.mapping import RowMaker, build_mapping
    from kdg.records import Record

    mapping = build_mapping(columns=["id bigint = json:id", "name text = json:name"], table="t", mode="upsert",
                            key=("id",))
    maker = RowMaker(mapping, watch=True)
    fields = [{"type": "int64", "field": "id", "optional": False}, {"type": "string", "field": "name"}]

    def wrapped(i, payload):
        schema = {"type": "struct", "optional": False, "fields": fields + (
            [{"type": "string", "field": "tier"}] if "tier" in payload else [])}
        return (Record(_json.dumps({"schema": schema, "payload": payload}).encode(), None, [], 0, "t", i, 0), str(i))

    maker.rows([wrapped(i, {"id": i, "name": f"n{i}"}) for i in range(300)])
    assert maker.watch.news() == []
    maker.watch._next = 0.0  # the watch looks once a second: this batch is looked at now
    maker.rows([wrapped(i, {"id": i, "name": f"n{i}", "tier": "gold"}) for i in range(300, 600)])
    assert [(n.kind, n.field) for n in maker.watch.news()] == [("unmapped", "tier")]

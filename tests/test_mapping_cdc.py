"""Change-data-capture as Debezium really sends it, offline: truncates, unavailable-value placeholders, heartbeats
and schema-change events, and the source block mapped to columns beside a schema's (issue 47).

The same stream through Kafka and Postgres, killed and restarted, is tests/test_many_topics.py's CDC replica.
"""

import base64
import json

import pytest

from kdg.errors import UsageError
from kdg.flow.pipeline_file import load_pipeline
from kdg.flow.routes import Route
from kdg.mapping import RowMaker, build_mapping
from kdg.mapping.from_record import mapping_from_record
from kdg.mapping.rows import NOT_APPLIED_REASON, TRUNCATE_REASON, UNAVAILABLE, UNAVAILABLE_B64
from kdg.records import Record
from kdg.settings import table_name
from kdg.store.typed import KEEP, TypedResult, TypedTarget

COLUMNS = ["id bigint = json:id", "name text = json:name", "bio text = json:bio", "avatar text = json:avatar",
           "tags text = json:tags"]


def _rec(value: bytes | None, key: bytes | None = b'{"id": 1}', topic: str = "shop.public.customers", offset: int = 0):
    return Record(value, key, [], 0, topic, offset, 1)


def _event(op: str, after: dict | None = None, before: dict | None = None) -> bytes:
    return json.dumps({"before": before, "after": after, "op": op, "ts_ms": 2,
                       "source": {"table": "customers", "ts_ms": 1_764_320_000_123, "lsn": 24_000_100,
                                  "txId": 761}}).encode()


def _maker(*columns: str, truncates: bool = True, **options) -> RowMaker:
    mapping = build_mapping(columns=list(columns or COLUMNS), table="app.customers", envelope="debezium", key=("id",),
                            **options)
    return RowMaker(mapping, truncates=truncates)


def _staged(maker: RowMaker, values: list[bytes | None]):
    staged = maker.staged([(_rec(v, None if v and b'"op": "t"' in v else b'{"id": 1}', offset=n), f"k{n}")
                           for n, v in enumerate(values)])
    return list(staged), staged


# -- truncates ---------------------------------------------------------------------------------------------------

def test_a_truncate_is_a_dead_letter_by_default_with_the_reason():
    rows, staged = _staged(_maker(), [_event("c", {"id": 1, "name": "a"}), _event("t")])
    assert [r[0] for r in rows] == [0] and staged.truncates == []
    assert [(d[1], d[2]) for d in staged.dead] == [(TRUNCATE_REASON, "k1")]


def test_an_applied_truncate_is_staged_in_record_order_as_a_row_without_values():
    """Its row carries the claim (exactly-once: a truncate applied before is a duplicate, never applied again) and
    no values: a tombstone whose NULL key deletes nothing by key; the store empties the table at its seq."""
    rows, staged = _staged(_maker(on_truncate="apply"), [
        _event("c", {"id": 1, "name": "a"}), _event("t"), _event("c", {"id": 2, "name": "b"})])
    assert rows[1] == (1, "k1", "shop.public.customers", 0, 1, True, None, None, None, None, None)
    assert staged.truncates == [1] and staged.tombs == {1} and staged.dead == []
    assert list(zip(*staged.claims())) == [(f"k{n}", "shop.public.customers", 0, n) for n in range(3)]


def test_a_writer_that_cannot_keep_record_order_dead_letters_an_applied_truncate():
    """Spark's tasks write their ranges at once: its RowMaker (truncates=False) says why instead of applying it."""
    rows, staged = _staged(_maker(on_truncate="apply", truncates=False), [_event("t")])
    assert rows == [] and [d[1] for d in staged.dead] == [NOT_APPLIED_REASON]


def test_on_truncate_is_apply_or_dead_letter_and_only_under_the_debezium_envelope(tmp_path):
    with pytest.raises(UsageError, match="on_truncate 'delete': use dead-letter or apply"):
        _maker(on_truncate="delete")
    with pytest.raises(UsageError, match='give envelope = "debezium"'):
        build_mapping(columns=["id bigint = json:id"], table="t", on_truncate="apply")
    file = tmp_path / "customers.toml"
    file.write_text('table = "app.c"\nenvelope = "debezium"\non_truncate = "apply"\nkey = ["id"]\n'
                    '[columns]\nid = { type = "bigint", from = "json:id" }\n')
    assert build_mapping(file=file).on_truncate == "apply"
    assert build_mapping(file=file, on_truncate="dead-letter").on_truncate == "dead-letter"  # the flag wins
    pipeline = tmp_path / "p.toml"
    pipeline.write_text('[[route]]\ntopics = ["a"]\ntable = "t"\nenvelope = "debezium"\ncolumns = "from-schema"\n'
                        'on_truncate = "apply"\n')
    assert load_pipeline(pipeline).route("a").mapping.on_truncate == "apply"


def test_an_applied_truncate_counts_as_deleted_even_where_tombstones_are_ignored():
    rows, staged = _staged(_maker(on_truncate="apply", on_tombstone="ignore"), [
        _event("c", {"id": 1}), _event("d", before={"id": 1}), _event("t")])
    result = TypedResult(written=0, truncated=1).account(staged, 0, deleting=False)
    assert (result.deleted, result.filtered, result.superseded) == (1, 1, 1)


# -- unavailable-value placeholders ------------------------------------------------------------------------------

def test_a_placeholder_is_staged_null_and_listed_so_its_column_keeps_its_value():
    """Text, a bytes column's base64 of the placeholder, an array of it: each column staged NULL, listed in keeps,
    and counted; a real NULL stays a NULL to write, and a delete's before is not looked at."""
    maker = _maker()
    rows, staged = _staged(maker, [
        _event("u", {"id": 1, "name": None, "bio": UNAVAILABLE, "avatar": UNAVAILABLE_B64, "tags": [UNAVAILABLE]}),
        _event("u", {"id": 1, "name": "b", "bio": "kept", "avatar": "AAE=", "tags": ["x"]}),
        _event("d", before={"id": 1, "bio": UNAVAILABLE}),
    ])
    assert rows[0][6:] == ("1", None, None, None, None) and rows[1][6:] == ("1", "b", "kept", "AAE=", '["x"]')
    assert staged.keeps == [(0, 2), (0, 3), (0, 4)]
    assert UNAVAILABLE_B64 == base64.b64encode(UNAVAILABLE.encode()).decode()


def test_a_key_column_is_never_taken_for_a_placeholder():
    maker = _maker("id text = json:id", "bio text = json:bio")
    rows, staged = _staged(maker, [_event("u", {"id": UNAVAILABLE, "bio": UNAVAILABLE})])
    assert rows[0][6:] == (UNAVAILABLE, None) and staged.keeps == [(0, 1)]


def test_an_upsert_keeps_a_placeholders_column_from_the_batch_or_the_table_and_only_when_asked():
    mapping = build_mapping(columns=["id bigint = json:id", "bio text = json:bio"], table="app.c",
                            envelope="debezium", key=("id",))
    target = TypedTarget(mapping)
    plain, keeping = target.write_sql()[0], target.write_sql(keeping=True)[0]
    assert KEEP not in plain
    assert f"FROM {KEEP} k WHERE k.seq = l.seq AND k.col = 1" in keeping  # bio: listed for the latest row
    assert "ORDER BY x.seq DESC LIMIT 1" in keeping and 'SELECT t."bio" FROM "app"."c" t' in keeping
    assert "k.col = 0" not in keeping  # the key is never kept


# -- heartbeats and schema-change events --------------------------------------------------------------------------

HEARTBEAT = json.dumps({"schema": {"type": "struct", "name": "io.debezium.connector.common.Heartbeat",
                                   "fields": [{"field": "ts_ms", "type": "int64"}]},
                        "payload": {"ts_ms": 1_764_320_000_000}}).encode()
SCHEMA_CHANGE = json.dumps({"source": {"table": "customers"}, "databaseName": "shop", "schemaName": "public",
                            "ddl": "ALTER TABLE customers ADD COLUMN loyalty_tier text", "tableChanges": []}).encode()


def test_heartbeats_and_schema_change_events_are_skipped_and_counted_never_dead_lettered_nor_claimed():
    maker = _maker()
    records = [(_rec(HEARTBEAT, b'{"serverName": "shop"}', topic="shop.heartbeat.shop"), "k0"),
               (_rec(HEARTBEAT, None, topic="__debezium-heartbeat.shop", offset=1), "k1"),
               (_rec(SCHEMA_CHANGE, b'{"databaseName": "shop"}', topic="shop", offset=2), "k2"),
               (_rec(b'{"ts_ms": 5}', None, topic="shop.public.customers", offset=3), "k3")]  # no op, not a heartbeat
    staged = maker.staged(records)
    assert list(staged) == [] and [d[2] for d in staged.dead] == ["k3"]
    assert staged.skipped == {"heartbeat": 2, "schema change": 1}
    assert list(zip(*staged.claims())) == []
    assert TypedResult().account(staged, 0, deleting=True).filtered == 3


def test_a_pattern_never_takes_debeziums_default_heartbeat_topic():
    """``__debezium-heartbeat.PREFIX`` starts with ``__``, as Kafka's own topics do: a pattern never reads it (listed
    by name, or under another topic.heartbeat.prefix, its heartbeats are skipped as above)."""
    route = Route("r", pattern=r".*")
    assert not route.takes("__debezium-heartbeat.shop") and route.takes("shop.heartbeat.shop")


# -- the source block, beside a schema's columns -----------------------------------------------------------------

def _wrapped(payload: dict, fields: list[dict]) -> bytes:
    row = {"type": "struct", "optional": True, "fields": fields}
    return json.dumps({"schema": {"type": "struct", "fields": [{**row, "field": "before"}, {**row, "field": "after"},
                                                              {"field": "op", "type": "string"}]},
                       "payload": payload}).encode()


def test_source_fields_map_to_columns_beside_the_schemas_and_read_epoch_milliseconds():
    base = build_mapping(table="t", envelope="debezium", from_schema=True, columns=[
        "synced_at timestamptz = source:ts_ms", "lsn bigint = source:lsn", "tx bigint = source:txId"])
    assert base.columns == () and [c.name for c in base.extra_columns] == ["synced_at", "lsn", "tx"]
    fields = [{"field": "id", "type": "int64"}, {"field": "name", "type": "string", "optional": True}]
    value = _wrapped(json.loads(_event("c", {"id": 1, "name": "a"})), fields)
    key = json.dumps({"schema": {"type": "struct", "fields": fields[:1]}, "payload": {"id": 1}}).encode()
    found = mapping_from_record(value, key, base, table_name("app.customers"))
    assert [c.describe() for c in found.columns] == [
        "id bigint = json:id", "name text = json:name", "synced_at timestamptz = source:ts_ms",
        "lsn bigint = source:lsn", "tx bigint = source:txId"]
    assert found.extra_columns == base.extra_columns and found.key == ("id",)
    rows, dead = RowMaker(found).rows([(_rec(value, key), "k")])
    assert dead == [] and rows[0][6:] == ("1", "a", "1764320000123", "24000100", "761")
    clash = build_mapping(table="t", envelope="debezium", from_schema=True, columns=["name text = source:table"])
    with pytest.raises(UsageError, match="column 'name' .* is also a field of the record's schema"):
        mapping_from_record(value, key, clash, table_name("app.customers"))


def test_columns_beside_a_schemas_must_read_what_the_row_has_not(tmp_path):
    with pytest.raises(UsageError, match="column 'name' reads 'json:name'"):
        build_mapping(table="t", envelope="debezium", from_schema=True, columns=["name text = json:name"])
    with pytest.raises(UsageError, match="give --envelope debezium"):
        build_mapping(table="t", from_schema=True, columns=["at timestamptz = source:ts_ms"])
    pipeline = tmp_path / "p.toml"
    route = '[[route]]\ntopics = ["a"]\ntable = "t"\nenvelope = "debezium"\n'
    pipeline.write_text(route + 'columns = "from-schema"\n[route.extra_columns]\n'
                                'synced_at = { type = "timestamptz", from = "source:ts_ms" }\n')
    assert [c.describe() for c in load_pipeline(pipeline).route("a").mapping.extra_columns] == [
        "synced_at timestamptz = source:ts_ms"]
    pipeline.write_text(route + '[route.columns]\nid = { type = "bigint", from = "json:id" }\n'
                                '[route.extra_columns]\nsynced_at = { type = "timestamptz", from = "source:ts_ms" }\n')
    with pytest.raises(UsageError, match='extra_columns go with columns = "from-schema"'):
        load_pipeline(pipeline)

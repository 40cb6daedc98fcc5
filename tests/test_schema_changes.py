"""Schemas that change under a route with columns from the records' schema (issue 47).

Records are Kafka Connect JsonConverter's ``{"schema", "payload"}``, made by hand. First offline: the table of
widenings (:func:`kdg.mapping.evolution.type_change`), what a changed schema asks of a table, and the route
key ``on_incompatible``. Then on the stack: a field that turns from int32 to string where the column is
``integer`` stops the route with one error line naming what to run, nothing written past it; after that ALTER
TABLE a restart finishes with nothing lost; with ``on_incompatible = "dead-letter"`` the same records go to the
dead-letter topic with the reason; and under add-columns a widened type, a field become optional and a new one
are followed.
"""

import json
import re
import uuid

import pytest
from confluent_kafka import Producer
from conftest import as_json, audited

from kdg.errors import UsageError
from kdg.flow.pipeline_file import load_pipeline
from kdg.kafka.admin import ensure_topic
from kdg.mapping.evolution import plan_changes, type_change
from kdg.mapping.from_record import mapping_from_record, optional_columns
from kdg.mapping.spec import Mapping
from kdg.settings import table_name
from kdg.store.pg import Store

KEY = {"type": "struct", "fields": [{"field": "id", "type": "int64", "optional": False}]}


def value(row: dict, **types) -> bytes:
    """A JsonConverter value of ``row``; each field int64 unless ``types`` says ``name=(type, optional)``."""
    fields = [{"field": name, "type": types.get(name, ("int64", False))[0],
               "optional": types.get(name, ("int64", False))[1]} for name in row]
    return json.dumps({"schema": {"type": "struct", "fields": fields}, "payload": row}).encode()


def key(i: int) -> bytes:
    return json.dumps({"schema": KEY, "payload": {"id": i}}).encode()


# -- offline: the widening table, a plan, the route key --------------------------------------------

@pytest.mark.parametrize("column, field, verdict", [
    ("integer", "integer", "same"),
    ("timestamp without time zone", "timestamp", "same"),      # format_type's spelling and column_type's
    ("integer", "bigint", "widening"), ("smallint", "integer", "widening"), ("real", "double precision", "widening"),
    ("integer", "numeric", "widening"), ("bigint", "numeric", "widening"),
    ("numeric(10,2)", "numeric(12,2)", "widening"), ("numeric(10,2)", "numeric", "widening"),
    ("bigint", "integer", "holds"), ("double precision", "real", "holds"), ("numeric", "numeric(10,2)", "holds"),
    ("text", "integer", "holds"), ("character varying(20)", "text", "holds"),  # a column altered to text
    ("integer", "text", "incompatible"), ("bigint", "double precision", "incompatible"),  # a double loses digits
    ("numeric(10,2)", "numeric(10,4)", "incompatible"), ("numeric(10,2)", "integer", "incompatible"),
    ("integer", "boolean", "incompatible"), ("jsonb", "text", "incompatible"), ("text", "bytea", "incompatible"),
])
def test_the_widening_table(column, field, verdict):
    assert type_change(column, field) == verdict


def test_a_changed_schema_asks_a_column_each_of_add_widen_drop_not_null_and_incompatible():
    base = Mapping(table_name("t"), (), from_schema=True)
    record = value({"id": 1, "qty": 5, "note": "x", "tier": "a"}, qty=("int64", True), note=("string", False),
                   tier=("string", True))
    found = mapping_from_record(record, key(1), base, table_name("t"))
    optional = optional_columns(record, "none")
    assert optional == {"qty", "tier"}
    changes = plan_changes(found, optional, {"id": "bigint", "qty": "integer", "note": "integer"},
                           not_null={"id", "qty"}, primary_key=("id",))
    assert [(c.column, c.change, c.type, c.was) for c in changes] == [
        ("qty", "widen", "bigint", "integer"), ("qty", "drop not null", "bigint", "integer"),
        ("note", "incompatible", "text", "integer"), ("tier", "add", "text", None)]
    reason = changes[2].reason(table_name("app.t"))
    assert "column note of app.t is integer" in reason and "makes it text" in reason, reason
    assert reason.endswith('ALTER TABLE "app"."t" ALTER COLUMN "note" TYPE text USING "note"::text'), reason


def test_on_incompatible_is_a_route_key_checked_like_the_others(tmp_path):
    route = '[[route]]\ntopics = ["t"]\ntable = "t"\ncolumns = "from-schema"\n'
    good = tmp_path / "good.toml"
    good.write_text(route + 'on_incompatible = "dead-letter"\n')
    assert load_pipeline(good).route("t").mapping.on_incompatible == "dead-letter"
    for text, said in ((route + 'on_incompatable = "dead-letter"\n', "did you mean 'on_incompatible'"),
                       (route + 'on_incompatible = "skip"\n', "on_incompatible 'skip': use stop or dead-letter"),
                       (route.replace('columns = "from-schema"\n', 'columns = { id = { from = "json:id" } }\n')
                        + 'on_incompatible = "dead-letter"\n', 'give columns = "from-schema" too')):
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(UsageError, match=re.escape(said)):
            load_pipeline(bad)


# -- on the stack -------------------------------------------------------------------------------------

def narrowing_topic(conn) -> str:
    """200 records whose qty is an int32, then 100 whose qty is a string: ids 0-299, one partition."""
    topic = f"narrow-{uuid.uuid4().hex[:8]}"
    ensure_topic(conn.bootstrap_servers, topic, partitions=1)
    producer = Producer({"bootstrap.servers": conn.bootstrap_servers})
    for i in range(300):
        qty = ("int32", False) if i < 200 else ("string", False)
        producer.produce(topic, value({"id": i, "qty": i if i < 200 else str(i)}, qty=qty), key(i))
    producer.flush(30)
    return topic


def rows(conn, table: str) -> dict:
    with Store(conn.pg_dsn) as store:
        return {r["id"]: r["qty"] for r in store.fetch(f"SELECT id, qty FROM {table}")}


def test_a_type_kdg_will_not_widen_stops_the_route_and_it_resumes_after_alter_table(kdg, conn, group):
    topic, table = narrowing_topic(conn), f"narrow_{uuid.uuid4().hex[:8]}"
    run = ("consume", topic, "-G", group, "-g", "exactly-once", "--table", table, "--columns", "from-schema",
           "--evolve", "add-columns", "--create-table", "--id-from", "offset", "-e", "--batch-size", 100, "--json")
    stopped = kdg(*run, check=False)
    assert stopped.returncode == 2, stopped.stderr
    errors = [line for line in stopped.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stopped.stderr
    assert f"column qty of public.{table} is integer, and the record's schema now makes it text" in errors[0]
    alter = re.search(r'ALTER TABLE \S+ ALTER COLUMN "qty" TYPE text USING "qty"::text', errors[0])
    assert alter is not None, errors[0]
    written = rows(conn, table)  # whole batches of int32 only, their offsets with them; nothing past them
    with Store(conn.pg_dsn) as store:
        stored = store.fetchval("SELECT next_offset FROM kdg_offsets WHERE consumer_group = $1", group)
    assert 0 < len(written) <= 200 and written == {i: i for i in range(stored)}, (stored, sorted(written)[-3:])

    with Store(conn.pg_dsn) as store:  # what the error said to run, then the same command again
        store.execute(alter[0])
    report = as_json(kdg(*run))
    assert report["dead_lettered"] == 0, report
    assert rows(conn, table) == {i: str(i) for i in range(300)}
    audit = audited(kdg, topic, "--table", table, "-G", group, "--id-from", "offset")
    assert (audit["lost"], audit["duplicates"]) == (0, 0) and audit["balanced"], audit


def test_on_incompatible_dead_letter_sends_those_records_to_the_dlq_with_the_reason(kdg, conn, group, tmp_path):
    topic, table = narrowing_topic(conn), f"narrow_{uuid.uuid4().hex[:8]}"
    pipeline = tmp_path / "route.toml"
    pipeline.write_text(f'[[route]]\ntopics = ["{topic}"]\ntable = "{table}"\ncolumns = "from-schema"\n'
                        'create_table = true\nid_from = "offset"\non_incompatible = "dead-letter"\n')
    report = as_json(kdg("consume", "--pipeline", pipeline, "-G", group, "-g", "exactly-once", "-e",
                         "--batch-size", 100, "--max-dead-letters", "all", "--json"))
    assert (report["processed"], report["dead_lettered"]) == (200, 100), report
    assert rows(conn, table) == {i: i for i in range(200)}
    lines = kdg("consume", f"{topic}.dlq", "-G", f"dlq-{group}", "--sink", "stdout", "--format", "json",
                "-o", "beginning", "-e").stdout.splitlines()
    dead = [json.loads(line) for line in lines]
    reasons = {h["value"] for d in dead for h in d["headers"] if h["name"] == "kdg-dlq-reason"}
    assert len(dead) == 100 and len(reasons) == 1, (len(dead), reasons)
    assert f"column qty of public.{table} is integer, and the record's schema now makes it text" in reasons.pop()
    audit = audited(kdg, topic, "--table", table, "-G", group, "--id-from", "offset")
    assert (audit["dead_lettered"], audit["lost"], audit["duplicates"]) == (100, 0, 0) and audit["balanced"], audit


def test_add_columns_widens_a_type_drops_not_null_and_adds_a_field(kdg, conn, group):
    """The user's table says qty integer NOT NULL; from id 50 the schema makes qty an optional int64 (some
    null, some past integer's range) and brings a tier: qty becomes bigint and nullable, tier is added."""
    topic, table = f"widen-{uuid.uuid4().hex[:8]}", f"widen_{uuid.uuid4().hex[:8]}"
    ensure_topic(conn.bootstrap_servers, topic, partitions=1)
    with Store(conn.pg_dsn) as store:
        store.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, qty integer NOT NULL)")
    producer, want = Producer({"bootstrap.servers": conn.bootstrap_servers}), {}
    for i in range(100):
        if i < 50:
            row, types = {"id": i, "qty": i}, {"qty": ("int32", False)}
        else:
            row = {"id": i, "qty": None if i % 2 else 2**40 + i, "tier": f"t{i % 3}"}
            types = {"qty": ("int64", True), "tier": ("string", True)}
        want[i] = (row["qty"], row.get("tier"))
        producer.produce(topic, value(row, **types), key(i))
    producer.flush(30)
    report = as_json(kdg("consume", topic, "-G", group, "-g", "exactly-once", "--table", table, "--columns",
                         "from-schema", "--evolve", "add-columns", "--id-from", "offset", "-e", "--batch-size", 30,
                         "--json"))
    assert report["dead_lettered"] == 0, report
    assert sorted((c["column"], c["change"]) for c in report["schema_changes"]) == [
        ("qty", "NOT NULL dropped"), ("qty", "widened from integer"), ("tier", "added")], report
    with Store(conn.pg_dsn) as store:
        got = {r["id"]: (r["qty"], r["tier"]) for r in store.fetch(f"SELECT id, qty, tier FROM {table}")}
        shape = store.fetch("SELECT format_type(atttypid, NULL) AS type, attnotnull FROM pg_attribute "
                            "WHERE attrelid = $1::regclass AND attname = 'qty'", table)[0]
    assert got == want and (shape["type"], shape["attnotnull"]) == ("bigint", False), (shape, got)

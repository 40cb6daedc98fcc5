"""Schemas that change under a route with columns from the records' schema (issue 47).

Records are Kafka Connect JsonConverter's ``{"schema", "payload"}``, made by hand. First offline: the table of
widenings (:func:`kdg.mapping.evolution.type_change`), what a changed schema asks of a table, and the route
key ``on_incompatible``. Then on the stack: a field that turns from int32 to string where the column is
``integer`` stops the route with one error line naming what to run, nothing written past it; after that ALTER
TABLE a restart finishes with nothing lost; with ``on_incompatible = "dead-letter"`` the same records go to the
dead-letter topic with the reason; and under add-columns a widened type, a field become optional and a new one
are followed. What evolution would do, `kdg pipeline check` and `kdg mapping from-schema --preview` show without
doing it; and two members of one group meeting a new field at once add its column once.
"""

import json
import re
import signal
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from conftest import as_json, audited

from kdg.errors import UsageError
from kdg.flow.pipeline_file import load_pipeline
from kdg.kafka.admin import ensure_topic
from kdg.mapping.evolution import SchemaChange, plan_changes, type_change
from kdg.mapping.from_record import mapping_from_record, optional_columns
from kdg.mapping.preview import describe
from kdg.mapping.spec import Mapping
from kdg.settings import table_name
from kdg.store.pg import Store

SCHEMAS = Path(__file__).parent / "schemas"
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


def test_evolve_none_says_a_new_field_and_takes_it_up_once_the_user_adds_its_column(kdg, conn, group):
    """evolve = none: a field new to the table is said (not followed), its values not written; after the user's
    own ALTER TABLE a run that meets the old schema first, then the new one, takes the field up (the table has
    it) and writes its new records' values; records written before keep NULL (--reprocess fills them)."""
    topic, table = f"none-{uuid.uuid4().hex[:8]}", f"none_{uuid.uuid4().hex[:8]}"
    ensure_topic(conn.bootstrap_servers, topic, partitions=1)
    producer = Producer({"bootstrap.servers": conn.bootstrap_servers})

    def send(ids) -> None:
        for i in ids:
            producer.produce(topic, value({"id": i, "tier": f"t{i}"} if i >= 10 else {"id": i},
                                          tier=("string", True)), key(i))
        producer.flush(30)

    run = ("consume", topic, "-G", group, "-g", "exactly-once", "--table", table, "--columns", "from-schema",
           "--create-table", "--id-from", "offset", "-e", "--json")
    send(range(20))
    first = as_json(kdg(*run))
    assert [(c["column"], c["change"][:12]) for c in first["schema_changes"]] == [("tier", "not followed")], first
    with Store(conn.pg_dsn) as store:
        store.execute(f"ALTER TABLE {table} ADD COLUMN tier text")
    send(range(20, 30))
    again = list(run)
    again[again.index(group)] = f"{group}-again"  # from the start: the old schema first
    second = as_json(kdg(*again, "-o", "beginning"))
    assert [(c["column"], c["change"]) for c in second["schema_changes"]] == [("tier", "taken up (added before)")]
    assert (second["written"], second["duplicates_suppressed"]) == (10, 20), second
    with Store(conn.pg_dsn) as store:
        got = {r["id"]: r["tier"] for r in store.fetch(f"SELECT id, tier FROM {table}")}
    assert got == {i: None if i < 20 else f"t{i}" for i in range(30)}, got


# -- evolution previewed: pipeline check and mapping from-schema alter nothing ------------------------

def table_columns(conn, table: str) -> list[tuple]:
    """The table as the catalog has it: (column, type, NOT NULL) in order."""
    with Store(conn.pg_dsn) as store:
        return [tuple(r) for r in store.fetch(
            "SELECT attname::text, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute "
            "WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum", table)]


def test_a_previewed_change_is_said_as_the_routes_evolve_and_on_incompatible_would_treat_it():
    table = table_name("app.t")
    add, widen = SchemaChange("tier", "add", "text"), SchemaChange("qty", "widen", "bigint", "integer")
    optional, wrong = SchemaChange("qty", "drop not null", "bigint", "integer"), SchemaChange(
        "note", "incompatible", "text", "integer")
    said = lambda change, evolve="add-columns", then="stop": describe(change, table, evolve, then)  # noqa: E731
    assert [said(c) for c in (add, widen, optional)] == [
        "would add column tier text", "would widen qty integer → bigint", "would drop NOT NULL of qty"]
    assert said(add, "none") == "would not add column tier text (evolve = none: said once; its values are not written)"
    assert said(optional, "none").endswith("(evolve = none: said once; a null is dead-lettered)")
    assert said(wrong).startswith("incompatible: column note of app.t is integer") and said(wrong).endswith(
        "(stops the route)")
    assert said(wrong, then="dead-letter").endswith('(its records go to the dead-letter topic: '
                                                   'on_incompatible = "dead-letter")')


def test_pipeline_check_shows_what_evolution_would_do_to_each_table_and_alters_nothing(kdg, conn, tmp_path):
    """Three from-schema routes against tables made before their schemas grew: one whose newest record adds,
    widens and makes optional; one whose table already fits; one whose qty became a string (it would stop)."""
    names = [f"preview_{uuid.uuid4().hex[:8]}" for _ in range(3)]
    producer = Producer({"bootstrap.servers": conn.bootstrap_servers})
    with Store(conn.pg_dsn) as store:
        for name in names:
            ensure_topic(conn.bootstrap_servers, name, partitions=2)
            store.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, qty integer NOT NULL)")
    for i in range(10):  # the older records fit every table; the newest differ
        for name in names:
            producer.produce(name, value({"id": i, "qty": i}, qty=("int32", False)), key(i), partition=i % 2)
    producer.produce(names[0], value({"id": 10, "qty": 2**40, "tier": "gold"}, qty=("int64", True),
                                     tier=("string", True)), key(10), partition=0)
    producer.produce(names[2], value({"id": 10, "qty": "ten"}, qty=("string", False)), key(10), partition=1)
    producer.flush(30)
    routes = "".join(f'[[route]]\ntopics = ["{n}"]\ntable = "{n}"\ncolumns = "from-schema"\nevolve = "add-columns"\n'
                     for n in names[:2])
    pipeline = tmp_path / "routes.toml"
    pipeline.write_text(routes)
    before = {n: table_columns(conn, n) for n in names}

    report = as_json(kdg("pipeline", "check", pipeline, "--json"))
    evolution = {t["topic"]: t["evolution"] for r in report["routes"] for t in r["topics"]}
    assert evolution[names[0]]["lines"] == ["would widen qty integer → bigint", "would drop NOT NULL of qty",
                                            "would add column tier text"], evolution
    assert [(c["column"], c["change"]) for c in evolution[names[0]]["changes"]] == [
        ("qty", "widen"), ("qty", "drop not null"), ("tier", "add")]
    assert evolution[names[1]]["lines"] == ["up to date"] and report["ok"], report
    text = kdg("pipeline", "check", pipeline).stdout
    assert "    would add column tier text\n" in text and "    up to date\n" in text, text

    pipeline.write_text(routes + f'[[route]]\ntopics = ["{names[2]}"]\ntable = "{names[2]}"\n'
                        'columns = "from-schema"\nevolve = "add-columns"\n')
    stops = kdg("pipeline", "check", pipeline, check=False)
    assert stops.returncode == 2, stops.stderr
    assert f"incompatible: column qty of public.{names[2]} is integer, and the record's schema now makes it text" \
        in stops.stdout and "(stops the route)" in stops.stdout, stops.stdout
    assert f"error: route 3: topic {names[2]}: table {names[2]}: its newest record would stop the route" \
        in stops.stderr, stops.stderr
    pipeline.write_text(pipeline.read_text() + 'on_incompatible = "dead-letter"\n')
    sent = kdg("pipeline", "check", pipeline).stdout
    assert '(its records go to the dead-letter topic: on_incompatible = "dead-letter")' in sent, sent
    assert {n: table_columns(conn, n) for n in names} == before  # nothing altered


def test_mapping_from_schema_previews_evolution_of_the_live_table(kdg, conn, schema_registry, tmp_path):
    """The registry subject's Avro order against a table of an older shape: what evolve = "add-columns" would
    do, on stderr (the TOML still on stdout) and in --json; the table untouched."""
    from kdg.schemas.registry import Registry

    subject, table = f"preview-{uuid.uuid4().hex[:8]}-value", f"preview_{uuid.uuid4().hex[:8]}"
    Registry({"url": schema_registry}).register(subject, (SCHEMAS / "order_v1.avsc").read_text(), "AVRO")
    with Store(conn.pg_dsn) as store:
        store.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, version smallint NOT NULL, customer text, "
                      "note text NOT NULL)")
    before = table_columns(conn, table)
    env = {"KDG_SCHEMA_REGISTRY": schema_registry}
    shown = kdg("mapping", "from-schema", subject, "--table", table, "--key", "id", "--preview", env=env)
    assert shown.stdout.startswith(f"# kdg mapping from-schema {subject}") and "[columns]" in shown.stdout
    assert shown.stderr.splitlines() == [
        f"evolution of public.{table} (table exists), nothing altered:", "  would widen version smallint → integer",
        "  would add column amount numeric(12,2)", "  would add column placed_at timestamptz",
        "  would add column tags text[]", "  would drop NOT NULL of note"], shown.stderr
    report = as_json(kdg("mapping", "from-schema", subject, "--table", table, "--preview", "--json", env=env))
    assert report["evolution"]["state"] == "exists" and len(report["evolution"]["changes"]) == 5, report
    assert table_columns(conn, table) == before  # nothing altered


# -- two members of one group meet the new field at once ----------------------------------------------

def _wait(check, what: str, members, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in members:
            assert proc.poll() is None, f"a member exited {proc.returncode} waiting for {what}: {proc.stderr.read()}"
        if check():
            return
        time.sleep(0.2)
    for proc in members:
        proc.kill()
    raise AssertionError(f"no {what} within {timeout} s: {[p.communicate()[1][-1500:] for p in members]}")


def test_two_members_meeting_a_new_field_at_once_add_its_column_once(kdg_spawn, kdg, conn, group):
    """Each member of the group holds one partition; both have written the old schema's records. The test holds
    the table's evolution lock while the new field arrives in both partitions, until both members wait on it:
    they meet the change at once. One adds the column, the other takes it up; no error, 0 lost, 0 duplicated."""
    from confluent_kafka.admin import AdminClient

    topic, table = f"race-{uuid.uuid4().hex[:8]}", f"race_{uuid.uuid4().hex[:8]}"
    ensure_topic(conn.bootstrap_servers, topic, partitions=2)
    with Store(conn.pg_dsn) as store:
        store.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, qty bigint)")
    members = [kdg_spawn("consume", topic, "-G", group, "-g", "exactly-once", "--table", table, "--columns",
                         "from-schema", "--evolve", "add-columns", "--id-from", "offset", "--batch-size", 20, "--json")
               for _ in range(2)]
    admin = AdminClient({"bootstrap.servers": conn.bootstrap_servers})

    def one_partition_each() -> bool:
        found = admin.describe_consumer_groups([group], request_timeout=5)[group].result()
        held = [len(m.assignment.topic_partitions) for m in found.members]
        return str(found.state).endswith("STABLE") and held == [1, 1]

    producer, written = Producer({"bootstrap.servers": conn.bootstrap_servers}), Store(conn.pg_dsn)
    try:
        _wait(one_partition_each, "two members holding a partition each", members)
        for i in range(40):  # the old schema, 20 records a partition
            producer.produce(topic, value({"id": i, "qty": i}), key(i), partition=i % 2)
        producer.flush(30)
        count = lambda: written.fetchval(f"SELECT count(*) FROM {table}")  # noqa: E731
        _wait(lambda: count() == 40, "the old schema's 40 rows", members)
        written.execute("SELECT pg_advisory_lock(hashtext($1))", f"kdg-evolve:public.{table}")
        for i in range(40, 80):  # a field new to the table, at offset 20 of both partitions
            producer.produce(topic, value({"id": i, "qty": i, "tier": f"t{i % 3}"}, tier=("string", True)), key(i),
                             partition=i % 2)
        producer.flush(30)
        waiting = ("SELECT count(*) FROM pg_locks w JOIN pg_locks mine ON mine.pid = pg_backend_pid() AND "
                   "mine.locktype = 'advisory' AND (w.classid, w.objid, w.objsubid) = (mine.classid, mine.objid, "
                   "mine.objsubid) WHERE w.locktype = 'advisory' AND NOT w.granted")
        _wait(lambda: written.fetchval(waiting) == 2, "both members waiting to evolve the table", members)
        written.execute("SELECT pg_advisory_unlock(hashtext($1))", f"kdg-evolve:public.{table}")
        _wait(lambda: count() == 80, "all 80 rows", members)
        got = dict(written.fetch(f"SELECT id, tier FROM {table}"))
    finally:
        written.close()
        for proc in members:
            proc.send_signal(signal.SIGTERM)
    outcomes = [proc.communicate(timeout=60) for proc in members]
    for proc, (_, err) in zip(members, outcomes):
        assert proc.returncode == 0 and "error:" not in err, err
    changes = sorted(c["change"] for out, _ in outcomes for c in json.loads(out)["schema_changes"])
    assert changes == ["added", "taken up (added before)"], changes
    assert got == {i: None if i < 40 else f"t{i % 3}" for i in range(80)}
    assert [c[0] for c in table_columns(conn, table)] == ["id", "qty", "tier"]
    audit = audited(kdg, topic, "--table", table, "-G", group, "--id-from", "offset")
    assert (audit["lost"], audit["duplicates"]) == (0, 0) and audit["balanced"], audit

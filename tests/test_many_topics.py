"""Many topics into many tables in one `kdg consume`: patterns, templates, positions per topic."""

import json
import signal
import time
import uuid
from datetime import datetime, timezone

import cdc_source
from confluent_kafka import Producer
from conftest import as_json, audited, finished, wait_stopped

from kdg.kafka.admin import ensure_topic
from kdg.store.pg import Store


def test_a_pattern_reads_a_topic_created_later_and_keeps_positions_it_has(kdg, kdg_spawn, group):
    """Topic A was read by the group before; the pattern's run continues A from there (a -o beginning on A
    would write A's first records again: at-least-once keeps every duplicate), starts B, created only once
    the run is going, at -o, and routes each to its table by the template. The dead-letter topic the run
    makes (A.dlq) matches the pattern too, and is never read back as rows."""
    prefix = f"mt{uuid.uuid4().hex[:8]}"
    a, b = f"{prefix}.a", f"{prefix}.b"
    kdg("produce", a, "-g", "exactly-once", "--count", 300)
    kdg("consume", a, "-G", group, "--table", f"{prefix}_a", "-e")
    kdg("produce", a, "-g", "exactly-once", "--count", 99)
    kdg("produce", a, "-g", "exactly-once", "--count", 1, "--size", 3000)  # oversize: to A.dlq

    run = kdg_spawn("consume", "--topic-pattern", rf"{prefix}\.(.*)", "-G", group, "--table", prefix + "_{1}",
                    "-o", "beginning", "--idle-timeout", 25, "--max-bytes", 2000, "--json")
    try:
        time.sleep(4)  # subscribed, A's partitions assigned and read
        kdg("produce", b, "-g", "exactly-once", "--count", 200)
        out, err = run.communicate(timeout=120)
    finally:
        run.kill()
    assert run.returncode == 0, err
    report = as_json(type("P", (), {"stdout": out}))
    assert report["consumed"] == 300 and report["dead_lettered"] == 1, report  # A's 100 new and B's, once
    assert {t: e["written"] for t, e in report["tables"].items()} == {f"public.{prefix}_a": 99,
                                                                     f"public.{prefix}_b": 200}
    for topic, table in ((a, f"{prefix}_a"), (b, f"{prefix}_b")):
        found = audited(kdg, topic, "--table", table, "-G", group)
        assert (found["lost"], found["duplicates"], found["pending"]) == (0, 0, 0), found


def test_polls_of_several_topics_sorted_as_columns_give_each_table_its_own_records(kdg, conn, group, tmp_path):
    """Records without headers (what Connect and Debezium write) of three topics, in fetches small enough that
    each poll holds runs of all three. Two upsert into typed tables, the third goes to a generic table, under
    exactly-once with offset keys. Such polls are sorted as columns, and each table's share of one is cut
    from them by runs: every table holds its own topic's records, each once."""
    prefix = f"col{uuid.uuid4().hex[:6]}"
    producer, ids = Producer({"bootstrap.servers": conn.bootstrap_servers}), 400
    for name in "abc":
        ensure_topic(conn.bootstrap_servers, f"{prefix}.{name}", partitions=2)
    for i in range(ids):
        for name in "abc":
            producer.produce(f"{prefix}.{name}", json.dumps({"id": i, "v": f"{name}{i}"}).encode(), partition=i % 2)
    producer.flush(30)
    typed = "".join(f"""[[route]]
topics = ["{prefix}.{name}"]
table = "{prefix}_{name}"
mode = "upsert"
key = ["id"]
create_table = true
[route.columns]
id = {{ type = "bigint", from = "json:id" }}
v = {{ type = "text", from = "json:v" }}
""" for name in "ab")
    pipeline = tmp_path / "columns.toml"
    pipeline.write_text(typed + f'[[route]]\ntopics = ["{prefix}.c"]\ntable = "{prefix}_c"\n')
    report = as_json(kdg("consume", "--pipeline", pipeline, "-G", group, "-g", "exactly-once", "--id-from", "offset",
                         "-o", "beginning", "-e", "--batch-size", 200, "-X", "max.partition.fetch.bytes=2048",
                         "--json"))
    assert report["consumed"] == 3 * ids and report["dead_lettered"] == 0, report
    with Store(conn.pg_dsn) as store:
        for name in "ab":
            rows = store.fetch(f'SELECT id, v FROM "{prefix}_{name}"')
            assert sorted((r["id"], r["v"]) for r in rows) == [(i, f"{name}{i}") for i in range(ids)], name
        rows = store.fetch(f'SELECT topic, "offset", convert_from(value, \'UTF8\') AS v FROM "{prefix}_c"')
        assert len(rows) == ids and {r["topic"] for r in rows} == {f"{prefix}.c"}
        assert sorted(json.loads(r["v"])["id"] for r in rows) == list(range(ids))


# -- a change-data-capture replica: three Debezium topics, one route, one process ------------------------

def test_a_cdc_replica_of_three_tables_is_exact_through_a_kill_inside_the_transaction(kdg, conn, group, tmp_path):
    """One route, one pattern, a {source.table} template and columns from the events' schema: three Debezium
    topics into three tables in one process, as Debezium really sends them: customers gains loyalty_tier halfway
    (evolve = add-columns), its unchanged TOASTed bio and avatar come as the unavailable-value placeholder,
    order_lines is truncated halfway (on_truncate = apply), each row's source.ts_ms is mapped to a column, and the
    pattern takes the connector's heartbeat topic too. Killed inside a multi-table transaction, restarted: every
    table equals its source's final state. The same fault under at-least-once, rows inserted as they come,
    writes duplicates."""
    prefix = f"shop{uuid.uuid4().hex[:6]}"
    # ~1,000 events a table: a snapshot, creates, updates, deletes, tombstones; a truncate, placeholders, a new column
    events = cdc_source.generate(seed=3, toast=True, truncate=True, loyalty_tier=True)
    cdc_source.produce(conn.bootstrap_servers, prefix, events)
    finals, sources = cdc_source.final_state(events), cdc_source.last_sources(events)
    pipeline = tmp_path / "replica.toml"
    pipeline.write_text(f"""[[route]]
name = "replica"
topic_pattern = '{prefix}\\..*'
table = "{prefix}_{{source.table}}"
envelope = "debezium"
columns = "from-schema"
evolve = "add-columns"
on_truncate = "apply"
create_table = true
id_from = "offset"
[route.extra_columns]
synced_at = {{ type = "timestamptz", from = "source:ts_ms" }}
""")
    # small fetches: a batch holds records of every topic, so the kill lands in a transaction of three tables
    run = ("consume", "--pipeline", pipeline, "-G", group, "-g", "exactly-once", "-o", "beginning", "-e",
           "--batch-size", 300, "-X", "max.partition.fetch.bytes=4096", "--json")
    # the same kill point under both guarantees: exactly-once reaches it inside the transaction that holds the
    # batch's rows of every table and its offsets; at-least-once after that transaction, before Kafka's commit
    fault = {"KDG_FAULT": "after-process-before-commit@4"}
    crashed = kdg(*run, env=fault, check=False)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    # the heartbeat topic (topic.heartbeat.prefix = PREFIX.heartbeat) appears meanwhile; the pattern takes it
    cdc_source.produce_heartbeats(conn.bootstrap_servers, prefix, 5, heartbeat_prefix=f"{prefix}.heartbeat")
    done = kdg(*run)
    report = as_json(done)
    assert report["dead_lettered"] == 0 and len(report["tables"]) == 3, report
    assert report["skipped_events"] == {"heartbeat": 5} and report["unavailable_values"] > 0, report
    # loyalty_tier is added by this run, or was by the killed one (whose report is lost); nothing else changes
    assert {c["column"] for c in report["schema_changes"]} <= {"loyalty_tier"}, report
    assert "Debezium heartbeat events skipped" in done.stderr and "unavailable-value placeholder" in done.stderr
    with Store(conn.pg_dsn) as store:
        for table, final in finals.items():
            rows = {r["id"]: dict(r) for r in store.fetch(f'SELECT * FROM "{prefix}_{table}"')}
            synced = {i: datetime.fromtimestamp(sources[table][i]["ts_ms"] / 1000, timezone.utc) for i in final}
            assert rows == {i: {**row, "synced_at": synced[i]} for i, row in final.items()}, table
    assert finals["customers"] and all("loyalty_tier" in r and r["bio"] for r in finals["customers"].values())
    assert any(r["loyalty_tier"] for r in finals["customers"].values())

    alo = tmp_path / "alo.toml"  # the generic table: every event a row, keyed by its offset
    alo.write_text(f"[[route]]\ntopic_pattern = '{prefix}\\.public\\.(.*)'\ntable = \"{prefix}_alo_{{1}}\"\n"
                   'id_from = "offset"\n')
    alo_run = ("consume", "--pipeline", alo, "-G", f"{group}-alo", "-o", "beginning", "-e", "--batch-size", 300)
    assert kdg(*alo_run, env=fault, check=False).returncode == -signal.SIGKILL
    kdg(*alo_run)
    duplicated = [audited(kdg, f"{prefix}.public.{t}", "--table", f"{prefix}_alo_{t}", "-G", f"{group}-alo",
                          "--id-from", "offset")["duplicates"] for t in cdc_source.TABLES]
    assert sum(duplicated) > 0, duplicated


def test_a_field_new_to_the_table_adds_its_column_mid_stream(kdg, conn, group, tmp_path):
    """customers gains loyalty_tier mid-stream (Debezium's schema says so from that event on). With evolve =
    add-columns the column is added before the batch that carries it, the rows written before keep NULL, and a
    kill between the two schemas' batches loses nothing. Without evolve, the new field is said, not followed."""
    topic = f"evo{uuid.uuid4().hex[:6]}.public.customers"
    ensure_topic(conn.bootstrap_servers, topic, partitions=1)
    fields = [{"field": "id", "type": "int64"}, {"field": "name", "type": "string", "optional": True}]
    tier = {"field": "loyalty_tier", "type": "string", "optional": True}
    key_schema = {"type": "struct", "fields": [{"field": "id", "type": "int64"}]}
    producer, final = Producer({"bootstrap.servers": conn.bootstrap_servers}), {}
    for n in range(400):  # ids 0-199 created (v1), then 200 changes of ids 100-299 under v2, which adds the tier
        i, v2 = (n, False) if n < 200 else (n - 100, True)
        row = {"id": i, "name": f"c{n}", **({"loyalty_tier": f"tier{n % 3}"} if v2 else {})}
        final[i] = {"loyalty_tier": None, **row}
        side = {"type": "struct", "optional": True, "fields": fields + ([tier] if v2 else [])}
        schema = {"type": "struct", "fields": [{**side, "field": "before"}, {**side, "field": "after"},
                                               {"field": "op", "type": "string"}]}
        event = {"before": None, "after": row, "op": "c" if n < 200 or i >= 200 else "u"}
        producer.produce(topic, json.dumps({"schema": schema, "payload": event}).encode(),
                         json.dumps({"schema": key_schema, "payload": {"id": i}}).encode())
    producer.flush(30)
    table = f"evo_{uuid.uuid4().hex[:6]}"
    pipeline = tmp_path / "evolve.toml"
    pipeline.write_text(f'[[route]]\ntopics = ["{topic}"]\ntable = "{table}"\nenvelope = "debezium"\n'
                        'columns = "from-schema"\nevolve = "add-columns"\ncreate_table = true\nid_from = "offset"\n')
    run = ("consume", "--pipeline", pipeline, "-G", group, "-g", "exactly-once", "-e", "--batch-size", 100, "--json")
    crashed = kdg(*run, env={"KDG_FAULT": "inside-pg-transaction@2"}, check=False)  # the last batch of v1
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    report = as_json(kdg(*run))
    assert [(c["column"], c["change"]) for c in report["schema_changes"]] == [("loyalty_tier", "added")], report
    with Store(conn.pg_dsn) as store:
        rows = {r["id"]: dict(r) for r in store.fetch(f"SELECT * FROM {table}")}
    assert rows == final

    plain = tmp_path / "plain.toml"  # the same topic without evolve: the field is said, and left out
    plain.write_text(pipeline.read_text().replace('evolve = "add-columns"\n', "").replace(table, f"{table}_fixed"))
    seen = kdg("consume", "--pipeline", plain, "-G", f"{group}-fixed", "-e", "--batch-size", 100)
    assert "column loyalty_tier text not followed (evolve = none" in seen.stderr, seen.stderr


def test_a_batch_read_again_after_its_connection_was_cut_counts_its_debezium_events_once(kdg_spawn, conn, group, tmp_path):
    """Debezium's heartbeats and unavailable-value placeholders are counted where their batch is accounted for,
    not where it is read: the consumer is stopped inside its first transaction, its Postgres connections are
    terminated (as an administrator's pg_terminate_backend or a failover would), and once resumed it reads the
    batch again. The report counts each heartbeat and each placeholder once."""
    from kdg.mapping.rows import UNAVAILABLE, UNAVAILABLE_B64

    prefix = f"cut{uuid.uuid4().hex[:6]}"
    topic = cdc_source.topic_of(prefix, "customers")
    ensure_topic(conn.bootstrap_servers, topic, partitions=1)
    events = [(key, value) for table, key, value in cdc_source.generate(11, per_table=60, toast=True)
              if table == "customers"]
    # first in the only partition: the heartbeats are in the batch whose transaction is cut
    records = cdc_source.heartbeats(prefix, 5) + events
    producer = Producer({"bootstrap.servers": conn.bootstrap_servers, "enable.idempotence": True})
    for key, value in records:
        producer.produce(topic, value, key)
    assert producer.flush(30) == 0
    afters = [json.loads(value)["payload"]["after"] for _, value in events if value is not None]
    placeholders = sum(v in (UNAVAILABLE, UNAVAILABLE_B64) for after in afters if after for v in after.values())
    assert placeholders > 0
    mapping = cdc_source.mapping_toml("customers", f"{prefix}_customers") + \
        'bio = { type = "text", from = "json:bio" }\navatar = { type = "bytea", from = "json:avatar" }\n'
    path = tmp_path / "customers.toml"
    path.write_text(mapping)
    proc = kdg_spawn("consume", topic, "-G", group, "-g", "exactly-once", "--mapping", path, "--id-from", "offset", "-o", "beginning",
                     "-e", "--json", env={"KDG_FAULT": "inside-pg-transaction@1:stop"})
    try:
        wait_stopped(proc, "its first transaction")
        with Store(conn.pg_dsn) as store:  # its connections name it: application_name kdg[PID]
            cut = store.fetch("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
                              f"kdg[{proc.pid}]")
        assert cut and all(r[0] for r in cut), cut
    finally:
        proc.send_signal(signal.SIGCONT)
    code, out, err = finished(proc, 120)
    assert code == 0, err[-3000:]
    report = json.loads(out)
    assert report["pg_outages"] == 1 and "Postgres is back" in err, (report, err[-2000:])  # read again
    assert report["consumed"] == len(records) and report["dead_lettered"] == 0, report
    assert report["skipped_events"] == {"heartbeat": 5}, report
    assert report["unavailable_values"] == placeholders, (report, placeholders)

"""Many topics into many tables in one `kdg consume`: patterns, templates, positions per topic."""

import base64
import json
import signal
import time
import uuid
from decimal import Decimal

from conftest import as_json, audited, change_stream

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
                    "-o", "beginning", "--idle-timeout", 12, "--max-bytes", 2000, "--json")
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


# -- a change-data-capture replica: three Debezium topics, one route, one process ------------------------

SHAPES = {  # each source table's columns (Connect type, logical name) besides id, made from a change's name and qty
    "customers": {"name": ("string", None), "email": ("string", None), "balance": ("bytes", "Decimal")},
    "orders": {"customer_id": ("int64", None), "total": ("bytes", "Decimal"), "status": ("string", None)},
    "order_lines": {"order_id": ("int64", None), "sku": ("string", None), "qty": ("int32", None)},
}


def _row(table: str, row: dict | None) -> dict | None:
    """A change_stream row (id, name, qty) as ``table``'s row, Python values."""
    if row is None:
        return None
    i, name, qty = row["id"], row["name"], row["qty"]
    return {"customers": {"id": i, "name": name, "email": f"{name}@example.com", "balance": Decimal(qty) / 100},
            "orders": {"id": i, "customer_id": qty % 50, "total": Decimal(qty * 7) / 100, "status": name[:1]},
            "order_lines": {"id": i, "order_id": qty % 90, "sku": f"sku-{name}", "qty": qty}}[table]


def _connect(value, logical):
    """A value as JsonConverter writes it: a Decimal as the base64 of its unscaled big-endian bytes (scale 2)."""
    if logical != "Decimal" or value is None:
        return value
    unscaled = int(value * 100)
    return base64.b64encode(unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)).decode()


def _schema(table: str) -> dict:
    def field(name, kind, logical):
        spec = {"field": name, "type": kind, "optional": name != "id"}
        if logical:
            spec.update(name="org.apache.kafka.connect.data.Decimal", parameters={"scale": "2"})
        return spec

    row = {"type": "struct", "optional": True, "name": f"shop.public.{table}.Value",
           "fields": [field("id", "int64", None)] + [field(n, k, lg) for n, (k, lg) in SHAPES[table].items()]}
    source = {"type": "struct", "field": "source", "fields": [{"field": "schema", "type": "string"},
                                                              {"field": "table", "type": "string"}]}
    return {"type": "struct", "name": f"shop.public.{table}.Envelope",
            "fields": [{**row, "field": "before"}, {**row, "field": "after"}, source,
                       {"field": "op", "type": "string"}, {"field": "ts_ms", "type": "int64", "optional": True}]}


def _events(table: str, seed: int) -> tuple[list[tuple[bytes, bytes | None]], dict]:
    """``table``'s change stream as Debezium sends it (JsonConverter, keyed by id; each delete followed by its
    tombstone), and the source table's final rows by id."""
    events, final = change_stream(seed, snapshot=300, steps=700, ids=420)
    schema, shapes, out = _schema(table), SHAPES[table], []
    key_schema = {"type": "struct", "fields": [{"field": "id", "type": "int64"}]}
    for op, i, before, after in events:
        key = json.dumps({"schema": key_schema, "payload": {"id": i}}).encode()
        rows = [{k: _connect(v, shapes.get(k, (None, None))[1]) for k, v in r.items()} if r else None
                for r in (_row(table, before), _row(table, after))]
        event = {"before": rows[0], "after": rows[1], "op": op, "ts_ms": 1767323045123,
                 "source": {"schema": "public", "table": table}}
        out.append((key, json.dumps({"schema": schema, "payload": event}).encode()))
        if op == "d":
            out.append((key, None))
    return out, {i: _row(table, r) for i, r in final.items()}


def test_a_cdc_replica_of_three_tables_is_exact_through_a_kill_inside_the_transaction(kdg, conn, group, tmp_path):
    """One route, one pattern, a {source.table} template and columns from the events' schema: three Debezium
    topics into three tables in one process. Killed inside a multi-table transaction, restarted: every table
    equals its source. The same fault under at-least-once, rows inserted as they come, writes duplicates."""
    from confluent_kafka import Producer

    from kdg.kafka.admin import ensure_topic

    prefix = f"shop{uuid.uuid4().hex[:6]}"
    producer, finals = Producer({"bootstrap.servers": conn.bootstrap_servers}), {}
    for seed, table in enumerate(SHAPES):
        topic = f"{prefix}.public.{table}"
        ensure_topic(conn.bootstrap_servers, topic, partitions=3)
        events, finals[table] = _events(table, seed)
        for key, value in events:
            producer.produce(topic, value, key)
        producer.flush(30)
    pipeline = tmp_path / "replica.toml"
    pipeline.write_text(f"""[[route]]
name = "replica"
topic_pattern = '{prefix}\\.public\\..*'
table = "{prefix}_{{source.table}}"
envelope = "debezium"
columns = "from-schema"
create_table = true
id_from = "offset"
""")
    # small fetches: a batch holds records of every topic, so the kill lands in a transaction of three tables
    run = ("consume", "--pipeline", pipeline, "-G", group, "-g", "exactly-once", "-o", "beginning", "-e",
           "--batch-size", 300, "-X", "max.partition.fetch.bytes=4096", "--json")
    # the same kill point under both guarantees: exactly-once reaches it inside the transaction that holds the
    # batch's rows of every table and its offsets; at-least-once after that transaction, before Kafka's commit
    fault = {"KDG_FAULT": "after-process-before-commit@4"}
    crashed = kdg(*run, env=fault, check=False)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    report = as_json(kdg(*run))
    assert report["dead_lettered"] == 0 and len(report["tables"]) == 3, report
    with Store(conn.pg_dsn) as store:
        for table, final in finals.items():
            rows = {r["id"]: dict(r) for r in store.fetch(f'SELECT * FROM "{prefix}_{table}"')}
            assert rows == final, table

    alo = tmp_path / "alo.toml"  # the generic table: every event a row, keyed by its offset
    alo.write_text(f"[[route]]\ntopic_pattern = '{prefix}\\.public\\.(.*)'\ntable = \"{prefix}_alo_{{1}}\"\n"
                   'id_from = "offset"\n')
    alo_run = ("consume", "--pipeline", alo, "-G", f"{group}-alo", "-o", "beginning", "-e", "--batch-size", 300)
    assert kdg(*alo_run, env=fault, check=False).returncode == -signal.SIGKILL
    kdg(*alo_run)
    duplicated = [audited(kdg, f"{prefix}.public.{t}", "--table", f"{prefix}_alo_{t}", "-G", f"{group}-alo",
                          "--id-from", "offset")["duplicates"] for t in SHAPES]
    assert sum(duplicated) > 0, duplicated


def test_a_field_new_to_the_table_adds_its_column_mid_stream(kdg, conn, group, tmp_path):
    """customers gains loyalty_tier mid-stream (Debezium's schema says so from that event on). With evolve =
    add-columns the column is added before the batch that carries it, the rows written before keep NULL, and a
    kill between the two schemas' batches loses nothing. Without evolve, the new field is said, not followed."""
    from confluent_kafka import Producer

    from kdg.kafka.admin import ensure_topic

    topic = f"evo{uuid.uuid4().hex[:6]}.public.customers"
    ensure_topic(conn.bootstrap_servers, topic, partitions=1)
    v1, v2 = _schema("customers"), _schema("customers")
    for side in v2["fields"][:2]:  # before and after gain an optional string
        side["fields"] = side["fields"] + [{"field": "loyalty_tier", "type": "string", "optional": True}]
    key_schema = {"type": "struct", "fields": [{"field": "id", "type": "int64"}]}
    producer, final = Producer({"bootstrap.servers": conn.bootstrap_servers}), {}
    for n in range(400):  # ids 0-199 created (v1), then 200 updates of ids 100-299 under v2
        i, v2_now = (n, False) if n < 200 else (n - 100, True)
        row = _row("customers", {"id": i, "name": f"c{n}", "qty": n})
        if v2_now:
            row["loyalty_tier"] = f"tier{n % 3}"
        final[i] = {**{"loyalty_tier": None}, **row}
        after = {k: _connect(v, SHAPES["customers"].get(k, (None, None))[1]) for k, v in row.items()}
        event = {"before": None, "after": after, "op": "c" if n < 200 or i >= 200 else "u",
                 "source": {"schema": "public", "table": "customers"}}
        producer.produce(topic, json.dumps({"schema": v2 if v2_now else v1, "payload": event}).encode(),
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

"""A mapping held against the data: a misspelled field and a field nobody maps are said, never silent.

``kdg mapping check --sample`` before a run (exit 7 when a mapped field is in no record), and the running
consumer's warning lines and report. The pure half (which rows are looked at) is FieldWatch's doctest.
"""

import json
import uuid

from confluent_kafka import Producer
from conftest import as_json

from kdg.store.pg import Store


def test_a_misspelled_field_and_an_unmapped_one_are_said_before_and_during_a_run(kdg, conn, topic, group, tmp_path):
    producer = Producer({"bootstrap.servers": conn.bootstrap_servers})
    for i in range(40):
        producer.produce(topic, json.dumps({"id": i, "customerId": f"c{i}", "total": i * 2}).encode())
    assert producer.flush(30) == 0
    table = f"app.fields_{uuid.uuid4().hex[:8]}"
    mapping = tmp_path / "orders.toml"
    mapping.write_text(f'table = "{table}"\ncreate_table = true\n[columns]\n'
                       'id = { type = "bigint", from = "json:id" }\n'
                       'customer = { type = "text", from = "json:customerid" }\n')

    check = kdg("mapping", "check", mapping, "--sample", 25, "--topic", topic, "--json", check=False)
    assert check.returncode == 7, check.stderr
    found = json.loads(check.stdout)["sample"]
    assert (found["records"], found["absent"], found["unmapped"]) == (
        25, [{"field": "customerid", "from": "json:customerid"}], ["customerId", "total"]), found
    assert "'customerid'" in check.stderr and "error:" in check.stderr

    proc = kdg("consume", topic, "-G", group, "-g", "at-least-once", "-e", "--mapping", mapping, "--json")
    report = as_json(proc)
    assert report["written"] == 40
    assert {(n["kind"], n["field"]) for n in report["field_notes"]} == {
        ("absent", "customerid"), ("unmapped", "customerId"), ("unmapped", "total")}, report
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: mapping of")]
    assert len(warnings) == 3 and any("json:customerid reads field 'customerid'" in w for w in warnings), proc.stderr
    with Store(conn.pg_dsn) as store:  # what the warning was about: NULL in every row
        assert store.fetchval(f"SELECT count(*) FROM {table} WHERE customer IS NULL") == 40

    good = tmp_path / "good.toml"
    good.write_text(mapping.read_text().replace("json:customerid", "json:customerId"))
    clean = as_json(kdg("mapping", "check", good, "--sample", 25, "--topic", topic, "--json"))
    assert (clean["ok"], clean["sample"]["absent"], clean["sample"]["unmapped"]) == (True, [], ["total"]), clean

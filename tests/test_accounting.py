"""Every record read ends in exactly one bucket, and too many dead letters stop a run (exit 7).

On the real stack: records made with a plain client, so that each bucket is reached on purpose.
"""

import json
import uuid

import pytest
from confluent_kafka import Producer
from conftest import as_json

from kdg.kafka.admin import ensure_topic
from kdg.store.pg import Store

BUCKETS = ("written", "superseded", "deleted", "filtered", "duplicates_suppressed", "dead_lettered",
           "probes_skipped")


def one_partition_topic(conn) -> str:
    name = f"acc-{uuid.uuid4().hex[:10]}"
    ensure_topic(conn.bootstrap_servers, name, partitions=1)
    return name


def send(conn, topic: str, records: list[tuple]) -> None:
    """``(event id or None, key JSON, value bytes or None[, extra headers])`` in order, to partition 0."""
    producer = Producer({"bootstrap.servers": conn.bootstrap_servers, "enable.idempotence": True})
    for eid, key, value, *extra in records:
        headers = ([("eid", eid.encode())] if eid else []) + (extra[0] if extra else [])
        producer.produce(topic, value=value, key=json.dumps(key).encode(), headers=headers, partition=0)
    assert producer.flush(30) == 0


def order(i: int, v: str) -> bytes:
    return json.dumps({"id": i, "v": v}).encode()


@pytest.fixture
def table(conn) -> str:
    name = f"app.acc_{uuid.uuid4().hex[:8]}"
    with Store(conn.pg_dsn) as store:
        store.execute("CREATE SCHEMA IF NOT EXISTS app")
        store.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, v text)")
    return name


def consume(kdg, topic, group, table, *args, check=True):
    return kdg("consume", topic, "-G", group, "-g", "exactly-once", "-e", "--json", "--table", table,
               "--mode", "upsert", "--column", "id bigint = key:id", "--column", "v text = json:v",
               "--id-from", "header:eid", "--batch-ms", "2000", *args, check=check)


@pytest.mark.parametrize("on_tombstone", ["delete", "ignore"])
def test_every_record_read_is_in_exactly_one_bucket(kdg, conn, group, table, on_tombstone):
    topic = one_partition_topic(conn)
    send(conn, topic, [
        ("e1", {"id": 1}, order(1, "a")),
        ("e2", {"id": 1}, order(1, "b")),      # a later version of id 1 in the batch: e1 is superseded
        ("e3", {"id": 2}, order(2, "c")),
        ("e1", {"id": 1}, order(1, "a")),      # e1 again: a duplicate, suppressed
        ("e5", {"id": 2}, None),               # a tombstone of id 2: deleted (or, ignored, filtered)
        ("e6", {"id": 4}, b"{not json"),       # dead-lettered: bad JSON
        ("e7", {"id": 3}, order(3, "d")),
        (None, {"id": 9}, b"probe", [("kdg-doctor", b"1")]),  # `kdg doctor`'s probe: stepped over
    ])
    report = as_json(consume(kdg, topic, group, table, "--on-tombstone", on_tombstone))
    assert report["consumed"] == 8 == sum(report[b] for b in BUCKETS), report
    deleting = on_tombstone == "delete"
    assert {b: report[b] for b in BUCKETS} == {
        "written": 3 - deleting, "superseded": 1 + deleting, "deleted": int(deleting), "filtered": int(not deleting),
        "duplicates_suppressed": 1, "dead_lettered": 1, "probes_skipped": 1}, report
    assert report["dead_letter_reasons"] == {"bad JSON": 1}, report
    with Store(conn.pg_dsn) as store:
        found = {r["id"]: r["v"] for r in store.fetch(f"SELECT id, v FROM {table}")}
    # ignored, the tombstone leaves e3's row; deleted, e3 never lands as itself (superseded by the delete)
    assert found == ({1: "b", 3: "d"} if deleting else {1: "b", 2: "c", 3: "d"})


def test_too_many_dead_letters_stop_the_run_after_committing_the_good_ones(kdg, conn, group, table):
    topic = one_partition_topic(conn)
    good = [(f"g{i}", {"id": i}, order(i, "ok")) for i in range(20)]
    bad = [(f"b{i}", {"id": 100 + i}, b"{bad") for i in range(20)]
    send(conn, topic, good + bad)
    proc = consume(kdg, topic, group, table, check=False)
    assert proc.returncode == 7, proc.stderr
    report = json.loads(proc.stdout)
    assert report["stopped_by"] == "too many dead letters" and report["max_dead_letters"] == "10%", report
    assert "went to" in proc.stderr and "--max-dead-letters" in proc.stderr
    assert "dead letters: 20 of 40 records read" in proc.stderr  # said out loud, by reason
    with Store(conn.pg_dsn) as store:
        assert store.fetchval(f"SELECT count(*) FROM {table}") == 20
    again = as_json(consume(kdg, topic, group, table, "--max-dead-letters", "all"))  # the offsets moved on
    assert again["consumed"] == 0 and again["stopped_by"] == "end of topic", again
    other = as_json(consume(kdg, topic, f"{group}-all", f"{table}", "--max-dead-letters", "all"))
    assert (other["dead_lettered"], other["duplicates_suppressed"]) == (20, 20), other


def test_a_malformed_dead_letter_limit_is_refused_before_anything_is_read(kdg, conn, group, table):
    proc = consume(kdg, "no-such-topic-needed", group, table, "--max-dead-letters", "lots", check=False)
    assert proc.returncode == 2 and "--max-dead-letters 'lots'" in proc.stderr, proc.stderr

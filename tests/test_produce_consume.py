"""Produce → consume → audit on the real stack, for every guarantee and sink; deliveries the brokers refuse."""

import json
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from conftest import as_json, audited

GUARANTEES = ["at-most-once", "at-least-once", "exactly-once"]


@pytest.mark.parametrize("guarantee", GUARANTEES)
def test_round_trip_into_postgres_balances(kdg, topic, group, guarantee):
    produced = as_json(kdg("produce", topic, "-g", guarantee, "--count", 3000, "--size", 64, "--json"))
    assert produced["sent"] == 3000 and produced["failed"] == 0
    consumed = as_json(kdg("consume", topic, "-G", group, "-g", guarantee, "-e", "--batch-size", 500, "--json"))
    assert consumed["consumed"] == 3000
    audit = audited(kdg, topic)
    assert (audit["acked"], audit["processed_unique"], audit["lost"], audit["duplicates"]) == (3000, 3000, 0, 0)


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_a_queue_full_in_the_middle_of_a_chunk_loses_and_repeats_nothing(kdg, topic, group, guarantee):
    """A ``--count`` load goes out 1,000 records at a time; with room for 50 in librdkafka's queue every chunk
    stops at a full queue again and again, and the record it stopped at goes once reports are served."""
    produced = as_json(kdg("produce", topic, "-g", guarantee, "--count", 3000, "--size", 64,
                           "-X", "queue.buffering.max.messages=50", "--json"))
    assert (produced["sent"], produced["acked"], produced["failed"]) == (3000, 3000, 0)
    kdg("consume", topic, "-G", group, "-g", "exactly-once", "-e", "--json")
    audit = audited(kdg, topic, "-G", group)
    assert (audit["acked"], audit["processed_unique"], audit["lost"], audit["duplicates"]) == (3000, 3000, 0, 0)


def test_exactly_once_consumer_drops_keys_it_already_wrote(kdg, topic):
    """The same 500 keys sent twice (a producer re-run): exactly-once writes each once, at-least-once twice.

    The second send lands in the same consume batch as the first, and in later batches, so both the
    batch-internal repeat and the claim made by an earlier transaction are exercised.
    """
    for _ in range(2):
        kdg("produce", topic, "-g", "at-least-once", "--count", 500, "--id", f"{topic}-{{seq}}", "--json")
    once, twice = f"eo-{topic}", f"alo-{topic}"
    eo = as_json(kdg("consume", topic, "-G", once, "-g", "exactly-once", "-e", "--batch-size", 300, "--json"))
    assert (eo["consumed"], eo["processed"], eo["duplicates_suppressed"]) == (1000, 1000, 500)
    assert audited(kdg, topic, "-G", once)["duplicates"] == 0
    as_json(kdg("consume", topic, "-G", twice, "-g", "at-least-once", "-e", "--batch-size", 300, "--json"))
    audit = audited(kdg, topic, "-G", twice)
    assert (audit["lost"], audit["duplicates"], audit["processed_unique"]) == (0, 500, 500)


def test_audit_counts_every_kind_of_discrepancy(kdg, topic, group, conn):
    """One of each: a row deleted (lost), a row written three times, a row nobody produced, a failed send."""
    from kdg.store.pg import Store

    kdg("produce", topic, "-g", "at-least-once", "--count", 10, "--id", f"{topic}-{{seq}}", "--json")
    kdg("consume", topic, "-G", group, "-g", "at-least-once", "-e", "--json")
    with Store(conn.pg_dsn) as store:
        store.execute("DELETE FROM kdg_events WHERE topic = $1 AND idempotency_key = $2", topic, f"{topic}-3")
        for key in (f"{topic}-5", f"{topic}-5", f"{topic}-stranger"):
            store.execute("""INSERT INTO kdg_events (idempotency_key, consumer_group, topic, "partition", "offset")
                             VALUES ($1, $2, $3, 0, 0)""", key, group, topic)
        store.copy_ledger([(uuid.uuid4(), f"{topic}-failed", topic, 99, "failed", None, None, "MSG_TIMED_OUT")])
    audit = audited(kdg, topic)
    counts = {k: audit[k] for k in ("acked", "failed", "processed_unique", "rows", "lost", "duplicates", "unexpected")}
    assert counts == {"acked": 10, "failed": 1, "processed_unique": 10, "rows": 12, "lost": 1, "duplicates": 2,
                      "unexpected": 1}
    assert audit["examples"] == {"lost": [f"{topic}-3"], "written_by_other_groups": [], "pending": [],
                                 "duplicated": [f"{topic}-5"],
                                 "duplicated_beyond_dedup_window": [], "unexpected": [f"{topic}-stranger"],
                                 "outside_window": []}  # nothing expired: no window to fall out of
    assert (audit["outside_window"], audit["duplicates_beyond_dedup_window"]) == (0, 0)
    assert audit["balanced"] is False


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_round_trip_through_kafka_sink(kdg, topic, group, guarantee):
    kdg("produce", topic, "-g", guarantee, "--count", 2000, "--json")
    out = f"{topic}-out"
    kdg("consume", topic, "-G", group, "-g", guarantee, "--sink", f"kafka:{out}", "-e", "--json")
    audit = audited(kdg, topic, "--sink", f"kafka:{out}")
    assert (audit["acked"], audit["processed_unique"], audit["lost"], audit["duplicates"]) == (2000, 2000, 0, 0)


def test_an_output_topic_with_a_transaction_left_open_is_not_counted_as_lost(kdg, conn, topic, group):
    """A writer of the output topic that died inside a transaction holds it open until Kafka times it out, and
    records committed after it cannot be read meanwhile. The audit called them lost (exit 7); it now says why
    it cannot count (exit 5)."""
    from confluent_kafka import Producer

    out = f"{topic}-out"
    kdg("produce", topic, "-g", "exactly-once", "--count", 2000, "--json")
    sink = ("-G", group, "-g", "exactly-once", "--sink", f"kafka:{out}", "--json")
    assert as_json(kdg("consume", topic, *sink, "-c", 1000))["consumed"] == 1000
    dead = Producer({"bootstrap.servers": conn.bootstrap_servers, "transactional.id": f"dead-{out}",
                     "transaction.timeout.ms": 120_000})
    dead.init_transactions(30)
    dead.begin_transaction()
    dead.produce(out, b"left open")
    assert dead.flush(30) == 0  # written, never committed nor aborted: as a writer SIGKILLed mid-transaction leaves it
    assert as_json(kdg("consume", topic, *sink, "-e"))["consumed"] == 1000  # the rest, committed after it
    proc = kdg("audit", topic, "--sink", f"kafka:{out}", "-G", group, "--json", check=False)
    assert proc.returncode == 5 and "has a transaction open" in proc.stderr, (proc.returncode, proc.stderr)
    dead.abort_transaction(30)
    audit = audited(kdg, topic, "--sink", f"kafka:{out}", "-G", group)
    assert (audit["processed_unique"], audit["lost"], audit["duplicates"]) == (2000, 0, 0), audit


def test_envelopes_replay_with_the_same_ids(kdg, topic, group):
    kdg("produce", topic, "-g", "exactly-once", "--json", stdin="alpha\nbeta\ngamma\n")
    lines = kdg("consume", topic, "-G", group, "--sink", "stdout", "--format", "json", "-e").stdout.splitlines()
    ids = sorted(next(h["value"] for h in json.loads(l)["headers"] if h["name"] == "kdg-id") for l in lines)
    assert len(ids) == 3
    again = f"{topic}-again"
    kdg("produce", again, "-g", "exactly-once", "--format", "json", "--json", stdin="\n".join(lines) + "\n")
    relines = kdg("consume", again, "-G", group, "--sink", "stdout", "--format", "json", "-e").stdout.splitlines()
    reids = sorted(next(h["value"] for h in json.loads(l)["headers"] if h["name"] == "kdg-id") for l in relines)
    assert reids == ids
    assert sorted(json.loads(l)["value"] for l in relines) == ["alpha", "beta", "gamma"]


def test_stdout_sink_is_refused_under_exactly_once(kdg, topic, group):
    proc = kdg("consume", topic, "-G", group, "-g", "exactly-once", "--sink", "stdout", "-e", check=False)
    assert proc.returncode == 2 and "stdout" in proc.stderr


def test_weakening_property_is_refused_at_the_command_line(kdg, topic):
    proc = kdg("produce", topic, "-g", "exactly-once", "-X", "acks=1", "--count", 1, check=False)
    assert proc.returncode == 2 and "acks" in proc.stderr


def test_records_without_key_stop_exactly_once_before_writing(kdg, topic, group, conn):
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": conn.bootstrap_servers})
    for i in range(5):
        p.produce(topic, json.dumps({"idempotency_key": f"{topic}-k{i}", "n": i}).encode())  # new to kdg_events
    p.flush(10)
    proc = kdg("consume", topic, "-G", group, "-g", "exactly-once", "-e", check=False)
    assert proc.returncode == 2 and "idempotency key" in proc.stderr
    rows = audited(kdg, topic)["rows"]
    assert rows == 0
    # with --id-from json:idempotency_key (the first seed's format) the same records go through
    done = as_json(kdg("consume", topic, "-G", group, "-g", "exactly-once", "-e", "--id-from",
                       "json:idempotency_key", "--json"))
    assert done["processed"] == 5
    # a topic kdg did not produce is audited against itself, keyed as the consume keyed it
    assert audited(kdg, topic, "--id-from", "json:idempotency_key")["processed_unique"] == 5


def test_handler_runs_inside_the_sink_transaction(kdg, topic, group, conn):
    import asyncio

    import asyncpg

    kdg("produce", topic, "-g", "exactly-once", "--count", 1200, "--json")
    kdg("consume", topic, "-G", group, "-g", "exactly-once", "-e", "--batch-size", 500,
        "--handler", "sample_handler:count_rows", env={"PYTHONPATH": str(Path(__file__).parent)})

    async def total():
        c = await asyncpg.connect(conn.pg_dsn)
        try:
            return await c.fetchval("SELECT sum(n) FROM handler_counts WHERE topic = $1", topic)
        finally:
            await c.close()

    assert asyncio.run(total()) == 1200


def _landed(kdg, topic: str) -> dict[str, tuple[int, int]]:
    """kdg-id → (partition, offset) of every record in ``topic``, read back from Kafka."""
    lines = kdg("consume", topic, "-G", f"read-{topic}", "--sink", "stdout", "--format", "json", "-e").stdout
    landed = {}
    for env in map(json.loads, lines.splitlines()):
        key = next(h["value"] for h in env["headers"] if h["name"] == "kdg-id")
        assert key not in landed, f"{key} landed twice"
        landed[key] = (env["partition"], env["offset"])
    return landed


def _some_too_large(conn, topic: str) -> tuple[str, set[str]]:
    """A topic whose brokers refuse records over 1,000 bytes, and 300 input lines of which every tenth is 3,000."""
    from kdg.kafka.admin import ensure_topic

    ensure_topic(conn.bootstrap_servers, topic, partitions=3, config={"max.message.bytes": "1000"})
    lines = ["x" * 3000 if i % 10 == 3 else f"small {i}" for i in range(300)]
    return "\n".join(lines) + "\n", {f"{topic}-{i}" for i in range(300) if i % 10 == 3}


@pytest.mark.parametrize("ledger", [True, False], ids=["ledger", "no-ledger"])
def test_only_records_the_brokers_acknowledged_count_when_some_deliveries_fail(kdg, conn, ledger):
    """Brokers refuse the too-large records (MSG_SIZE_TOO_LARGE, not retriable): those are failed, the rest acked.

    One record per request (-X batch.num.messages=1), so a refused record takes no other with it. The
    ledger holds every acked record at the partition and offset it has in the topic, and the others as
    failed; without the ledger the report's counts still add up to what landed.

    With the ledger, every record goes to one partition, so the acked ones between two refusals sit at
    consecutive offsets: the ledger stores each such run as one row (a range), and a refused record,
    which takes no offset, ends one range and starts the next.
    """
    from kdg.store.pg import Store

    topic = f"t-{uuid.uuid4().hex[:10]}"
    stdin, too_large = _some_too_large(conn, topic)
    proc = kdg("produce", topic, "-g", "at-least-once", "--id", f"{topic}-{{seq}}", "-X", "batch.num.messages=1",
               "--json", *(["-p", "1"] if ledger else ["--no-ledger"]), stdin=stdin, check=False)
    assert proc.returncode == 7, proc.stderr  # some records were not delivered
    report = as_json(proc)
    landed = _landed(kdg, topic)
    assert set(landed) == {f"{topic}-{i}" for i in range(300)} - too_large
    assert (report["sent"], report["acked"], report["failed"], report["unconfirmed"]) == (300, 270, 30, 0)
    assert report["errors"] == {"MSG_SIZE_TOO_LARGE": 30}
    with Store(conn.pg_dsn) as store:
        rows = store.fetch("""SELECT idempotency_key, status, "partition", "offset", error FROM kdg_ledger_keys
                              WHERE topic = $1""", topic)
        stored = store.fetch("""SELECT seq, seq_count, key_form, status FROM kdg_ledger WHERE topic = $1""", topic)
    if not ledger:
        assert rows == [] and stored == []
        return
    assert len(rows) == 300 and len({r["idempotency_key"] for r in rows}) == 300
    acked = {r["idempotency_key"]: (r["partition"], r["offset"]) for r in rows if r["status"] == "acked"}
    assert acked == landed  # offset for offset
    failed = [r for r in rows if r["status"] == "failed"]
    assert {r["idempotency_key"] for r in failed} == too_large
    assert all(r["partition"] is None and r["offset"] is None and r["error"] for r in failed)
    ranges = [r for r in stored if r["seq_count"] is not None]
    assert ranges and all(r["status"] == "acked" and r["key_form"] == "d" for r in ranges)
    assert len(stored) < 100, f"{len(stored)} ledger rows for 300 records: runs were not stored as ranges"
    refused = {i for i in range(300) if i % 10 == 3}
    for r in ranges:  # none spans a refusal; each refusal is a row of its own
        assert not refused & set(range(r["seq"], r["seq"] + r["seq_count"])), dict(r)
    assert sorted(r["seq"] for r in stored if r["status"] == "failed") == sorted(refused)


def test_ledger_ranges_of_a_killed_producer_match_the_topic_offset_for_offset(kdg, kdg_spawn, conn):
    """A producer SIGKILLed mid-run: every record its ledger holds, runs expanded (kdg_ledger_keys), is in the
    topic with that key at that partition and offset. Records sent after its last ledger write are in the topic
    only; the ledger never claims one that is not there."""
    from kdg.store.pg import Store

    topic = f"t-{uuid.uuid4().hex[:10]}"
    proc = kdg_spawn("produce", topic, "-g", "at-least-once", "--count", 1_000_000, "--rate", 10_000, "--json")
    try:
        with Store(conn.pg_dsn) as store:
            deadline = time.monotonic() + 60
            while (store.fetchval("SELECT coalesce(sum(coalesce(seq_count, 1)), 0) FROM kdg_ledger WHERE topic = $1",
                                  topic) < 5_000 and proc.poll() is None and time.monotonic() < deadline):
                time.sleep(0.2)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL, "the producer ended before it was killed"
    with Store(conn.pg_dsn) as store:
        ledger = {r["idempotency_key"]: (r["partition"], r["offset"]) for r in store.fetch(
            """SELECT idempotency_key, "partition", "offset" FROM kdg_ledger_keys WHERE topic = $1
               AND status = 'acked'""", topic)}
        rows, ranges = store.fetch("SELECT count(*), count(seq_count) FROM kdg_ledger WHERE topic = $1", topic)[0]
    landed = _landed(kdg, topic)
    assert len(ledger) >= 5_000
    assert {k: landed.get(k) for k in ledger} == ledger  # offset for offset
    assert len(landed) > len(ledger), "nothing was sent after the last ledger write: the kill came too late"
    # runs of one delivery report each: at --rate 10000 about 20 records a row on a quiet machine, fewer when the
    # suite's other workers slow the producer's polls (19.6 seen on 2 busy cores); one a record would be no ranges
    assert ranges and rows < len(ledger) / 10, f"{rows} rows for {len(ledger)} records: no ranges"


def test_an_audit_over_ledger_ranges_and_ids_from_the_input_balances(kdg, conn):
    """Both kinds of ids in one run: every third record brings its own kdg-id (a row each in the ledger), the
    others get kdg's UUIDv7 (runs of them stored as ranges). The audit counts every record once: 0 lost,
    0 duplicated, 0 unexpected; and a record deleted from the sink is lost, from a range or not."""
    from kdg.store.pg import Store

    topic, n = f"t-{uuid.uuid4().hex[:10]}", 900
    lines = [json.dumps({"value": f"v{i}", "headers": [{"name": "kdg-id", "value": f"own-{topic}-{i}"}]
                                                       if i % 3 == 0 else []}) for i in range(n)]
    kdg("produce", topic, "-g", "at-least-once", "-p", "0", "--format", "json", "--json", stdin="\n".join(lines) + "\n")
    table = f"mix_{uuid.uuid4().hex[:8]}"
    kdg("consume", topic, "-G", f"g-{topic}", "-g", "exactly-once", "--table", table, "-e", "--json")
    with Store(conn.pg_dsn) as store:
        plain, ranges = store.fetch("SELECT count(*) FILTER (WHERE seq_count IS NULL), count(seq_count) "
                                    "FROM kdg_ledger WHERE topic = $1", topic)[0]
        assert plain >= n // 3 and ranges > 0, (plain, ranges)
        audit = audited(kdg, topic, "--table", table, "-G", f"g-{topic}")
        assert (audit["acked"], audit["rows"], audit["lost"], audit["duplicates"], audit["unexpected"]) == (
            n, n, 0, 0, 0), audit
        store.execute(f"DELETE FROM {table} WHERE idempotency_key = $1 OR idempotency_key = "
                      "(SELECT idempotency_key FROM kdg_ledger_keys WHERE topic = $2 AND seq = 1)",
                      f"own-{topic}-3", topic)
    audit = audited(kdg, topic, "--table", table, "-G", f"g-{topic}")
    assert (audit["lost"], audit["duplicates"]) == (2, 0), audit


def test_at_most_once_counts_refused_records_as_sent(kdg, conn):
    """The weaker guarantee's anomaly: acks=0 hears no refusal, so records that never landed count as sent."""
    from kdg.store.pg import Store

    topic = f"t-{uuid.uuid4().hex[:10]}"
    stdin, too_large = _some_too_large(conn, topic)
    report = as_json(kdg("produce", topic, "-g", "at-most-once", "--id", f"{topic}-{{seq}}",
                         "-X", "batch.num.messages=1", "--json", stdin=stdin, check=False))
    landed = _landed(kdg, topic)
    assert not too_large & set(landed)
    assert report["sent"] == 300 and report["acked"] == 0 and report["unconfirmed"] + report["failed"] == 300
    with Store(conn.pg_dsn) as store:
        sent = {r["idempotency_key"] for r in store.fetch(
            "SELECT idempotency_key FROM kdg_ledger_keys WHERE topic = $1 AND status = 'sent'", topic)}
    assert len(sent) == report["unconfirmed"]
    assert sent - set(landed), "every record counted as sent landed: the refusals were not exercised"


def _one_too_large(kdg, conn, refusing: str) -> str:
    """A 1-partition topic of 100 records, the 51st (offset 50) 3,000 bytes, and the topic ``refusing``, whose
    brokers take no record over 1,000 bytes."""
    from kdg.kafka.admin import ensure_topic

    topic = f"t-{uuid.uuid4().hex[:10]}"
    ensure_topic(conn.bootstrap_servers, topic, partitions=1)
    ensure_topic(conn.bootstrap_servers, refusing.format(topic=topic), partitions=1,
                 config={"max.message.bytes": "1000"})
    lines = ["x" * 3000 if i == 50 else f"small {i}" for i in range(100)]
    kdg("produce", topic, "-g", "at-least-once", "--id", f"{topic}-{{seq}}", "--json", stdin="\n".join(lines) + "\n")
    return topic


def _committed(conn, group: str, topic: str) -> int | None:
    from confluent_kafka import Consumer

    from kdg.kafka.consumer import committed_offsets

    reader = Consumer({"bootstrap.servers": conn.bootstrap_servers, "group.id": group})
    try:
        return committed_offsets(reader, topic, [0])[0]
    finally:
        reader.close()


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_a_dead_letter_kafka_refuses_stops_the_consumer_and_loses_nothing(kdg, conn, group, guarantee):
    """The 3,000-byte record is over --max-bytes, so a dead letter, and its DLQ topic refuses it
    (MSG_SIZE_TOO_LARGE): the consumer stops with that error, its batch unwritten; run again with a
    --max-bytes that lets it through, the record is written and the audit finds nothing lost."""
    topic = _one_too_large(kdg, conn, "{topic}.dlq")
    proc = kdg("consume", topic, "-G", group, "-g", guarantee, "-e", "--batch-size", 10, "--max-bytes", 2000,
               "--json", check=False)
    assert proc.returncode == 6, proc.stderr
    assert f"dead letters to {topic}.dlq were refused by Kafka: 1 MSG_SIZE_TOO_LARGE" in proc.stderr
    assert audited(kdg, topic, "-G", group)["processed_unique"] == 50  # the batches before the refused one
    again = as_json(kdg("consume", topic, "-G", group, "-g", guarantee, "-e", "--batch-size", 10, "--json"))
    assert (again["consumed"], again["dead_lettered"]) == (50, 0)
    audit = audited(kdg, topic, "-G", group)
    assert (audit["processed_unique"], audit["lost"], audit["duplicates"]) == (100, 0, 0)


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_a_record_the_kafka_sinks_topic_refuses_stops_the_consumer_before_its_offsets_move(kdg, conn, group,
                                                                                            guarantee):
    """The output topic refuses the 3,000-byte record: the consumer stops with that error and the group's
    offset stays at the refused record's batch (offset 50), so a later run reads it again.

    Under exactly-once the refusal often reaches the producer only after its transaction failed; the batch is
    still not tried again (each try would add an aborted transaction to the output topic): the topic ends
    after the 5 committed batches of 10 (a commit marker each) and that one try's abort marker."""
    from kdg.kafka.admin import watermarks

    out = "{topic}-out"
    topic = _one_too_large(kdg, conn, out)
    proc = kdg("consume", topic, "-G", group, "-g", guarantee, "--sink", f"kafka:{out.format(topic=topic)}", "-e",
               "--batch-size", 10, "--json", check=False)
    assert proc.returncode == 6, proc.stderr
    # the refused record's whole produce request is refused with it: 1 to 10 records
    assert re.search(r"were refused by Kafka: \d+ MSG_SIZE_TOO_LARGE", proc.stderr), proc.stderr
    assert _committed(conn, group, topic) == 50
    if guarantee == "exactly-once":
        ends = watermarks(conn.bootstrap_servers, out.format(topic=topic), isolation="read_uncommitted")
        assert ends[0][1] <= 5 * 11 + 1, f"the refused batch was tried again: the output topic ends at {ends[0][1]}"


def test_a_refused_record_stops_an_exactly_once_producer_at_once_with_kafkas_reason(kdg, conn):
    """A record the topic refuses fails its transaction; sent again it would be refused again, so kdg produce
    stops there, naming the refusal, rather than aborting the same transaction over and over. Nothing of it
    is read from the topic."""
    from kdg.kafka.admin import ensure_topic

    refusing = f"t-{uuid.uuid4().hex[:10]}"
    ensure_topic(conn.bootstrap_servers, refusing, partitions=1, config={"max.message.bytes": "1000"})
    proc = kdg("produce", refusing, "-g", "exactly-once", "--json", stdin="\n".join(["small"] * 20 + ["x" * 3000]) + "\n",
               check=False)
    assert proc.returncode == 6, proc.stderr
    assert re.search(r"none of it was committed\) were refused by Kafka: \d+ MSG_SIZE_TOO_LARGE", proc.stderr), proc.stderr
    # the small records, batched apart from the large one, reached the log in the aborted transaction: none is read
    consumed = as_json(kdg("consume", refusing, "-G", f"g-{refusing}", "-g", "exactly-once", "-e", "--json"))
    assert consumed["consumed"] == 0, consumed


def _second_commit_dies(monkeypatch) -> list:
    """Make KdgProducer's second commit answer as a client dead of OUT_OF_ORDER_SEQUENCE_NUMBER does (after its
    records reached the brokers); the commits made, as (KdgProducer, its client) pairs."""
    from confluent_kafka import KafkaError

    from kdg.kafka.producer import KdgProducer

    real_commit, commits = KdgProducer.commit, []

    def dies_once(self):
        commits.append((self, self._producer))
        if len(commits) == 2:
            self._producer.flush(30)  # its records are on the brokers, in the open transaction
            err = KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "rewound sequence number", fatal=True)
            raise self._fatal_error("commit_transaction", err)
        real_commit(self)

    monkeypatch.setattr(KdgProducer, "commit", dies_once)
    return commits


def test_a_producer_dead_of_a_renewable_fatal_error_is_replaced_and_its_transaction_sent_once(kdg, conn, topic,
                                                                                             monkeypatch):
    """librdkafka kills a transactional client for good on some errors of its own sequence bookkeeping (seen
    in the soak: OUT_OF_ORDER_SEQUENCE_NUMBER after timed-out requests), and no fault makes one on demand.
    So the second commit here answers as a dead client does; everything after is real: a new client takes
    the transactional.id over, which aborts the open transaction on the brokers, and sends it again. The
    audit is 0/0 (each record once, for a read_committed reader), in `produce` and in the Kafka sink of
    `consume`; a fenced producer is not replaced."""
    from confluent_kafka import KafkaError

    from kdg.consume import ConsumeRequest, run_consume
    from kdg.errors import ProducerFatal
    from kdg.produce import ProduceRequest, run_produce
    from kdg.sources import LineOptions, synthetic

    commits = _second_commit_dies(monkeypatch)
    report = run_produce(ProduceRequest(topic, "exactly-once", synthetic(3000, 64, None, LineOptions()), conn,
                                        txn_size=1000, txn_interval_ms=600_000))  # by size only: 3 transactions
    assert (report.sent, report.acked, report.transactions, report.producer_renewals) == (3000, 3000, 3, 1), report
    assert commits[1][1] is not commits[2][1]  # the third attempt was made by a new client
    consumed = as_json(kdg("consume", topic, "-G", f"g-{topic}", "-g", "exactly-once", "-e", "--json"))
    assert consumed["consumed"] == 3000, consumed  # the aborted first copy of the second transaction is never read
    audit = audited(kdg, topic, "-G", f"g-{topic}")
    assert (audit["acked"], audit["rows"], audit["lost"], audit["duplicates"]) == (3000, 3000, 0, 0), audit

    # the Kafka sink: the batch whose commit died is read again from its first offsets, by a new client
    commits.clear()
    out = f"{topic}-out"
    sunk = run_consume(ConsumeRequest(topic, f"k-{topic}", "exactly-once", conn, sink=f"kafka:{out}", exit_at_end=True,
                                      batch_size=1000))
    assert (sunk.consumed, sunk.fenced_batches) == (3000, 1) and len(commits) >= 4, (sunk, len(commits))
    audit = audited(kdg, topic, "--sink", f"kafka:{out}")
    assert (audit["acked"], audit["lost"], audit["duplicates"], audit["unexpected"]) == (3000, 0, 0, 0), audit

    fenced = KafkaError(KafkaError.PRODUCER_FENCED, "fenced", fatal=True)
    with pytest.raises(ProducerFatal, match="took this transactional.id over") as refused:
        raise commits[0][0]._fatal_error("commit_transaction", fenced)
    assert not refused.value.renewable


def test_lines_on_an_open_stdin_commit_without_waiting_for_the_next_line(kdg, kdg_spawn, topic, group):
    """`tail -f log | kdg produce -g exactly-once`: the transaction holding the lines read so far commits within
    --txn-interval-ms while stdin stays open and quiet. It used to stay open until the next line came, so a
    read_committed consumer saw nothing, and a pause past Kafka's transaction timeout lost the lines."""
    producer = kdg_spawn("produce", topic, "-g", "exactly-once", "--json", stdin=subprocess.PIPE)
    try:
        producer.stdin.write("first\nsecond\n")
        producer.stdin.flush()
        seen = as_json(kdg("consume", topic, "-G", group, "-g", "exactly-once", "-c", 2, "--idle-timeout", 20,
                           "--json"))
        assert (seen["consumed"], seen["stopped_by"]) == (2, "count"), seen  # while stdin is still open
    finally:
        out, err = producer.communicate(timeout=60)  # closes stdin: the input ends
    assert producer.returncode == 0, err
    assert json.loads(out)["sent"] == 2

"""`kdg produce` when Kafka answers badly: requests that time out, records whose offset is never told.

librdkafka reports a record delivered without an offset when a retried batch was already written (the broker
answers DUPLICATE_SEQUENCE_NUMBER, which the idempotent producer takes for success, "offset and timestamp
invalid"); a broker killed with requests in flight is one way there. The ledger then has no offset for it.
"""

import signal
import subprocess
import sys
import time
import uuid

import pytest

from conftest import as_json, audited

from kdg.metrics import Metrics
from kdg.produce import ProduceReport, _Outcomes
from kdg.records import id_maker


def _outcomes(make) -> _Outcomes:
    outcomes = _Outcomes(ProduceReport("exactly-once", "t", "r"), None, "run", "t", True, Metrics("produce", "g"),
                         keys=make)
    outcomes.due = float("inf")  # rows stay in memory, to be read here
    return outcomes


@pytest.mark.parametrize("unknown", [range(8, 13), range(0, 5), range(15, 20)], ids=["middle", "first", "last"])
def test_deliveries_without_an_offset_inside_a_run_are_recorded_without_one(unknown):
    """A run of delivered records (one partition, consecutive sequences and offsets) with a batch in the middle
    delivered but with no offsets (None): every record is acknowledged once, those without an offset have none
    in the ledger, and the others keep theirs. (It used to stop the producer: 'NoneType' - 'int'.)"""
    make = id_maker(None)
    keys = make.many(0, 20)
    head = make.head_part(keys[0])
    reports = [(key, seq, 0, None if seq in unknown else 100 + seq, None, None, head) for seq, key in enumerate(keys)]
    outcomes = _outcomes(make)
    outcomes._record(reports)
    outcomes._write()
    assert (outcomes.report.acked, outcomes.report.failed) == (20, 0)
    by_seq = {}
    for row in outcomes.rows:
        _, key, _, seq, status, partition, offset, _, n, form, suffix = row
        for s in range(seq, seq + (n or 1)):
            assert s not in by_seq, f"seq {s} twice in the ledger"
            by_seq[s] = (status, partition, None if offset is None else offset + s - seq)
    assert by_seq == {s: ("acked", 0, None if s in unknown else 100 + s) for s in range(20)}


# Requests held back by the proxy time out after socket.timeout.ms; message.timeout.ms bounds a record's whole life.
TIMEOUTS = ["-X", "request.timeout.ms=1500", "-X", "socket.timeout.ms=2000"]


@pytest.mark.disrupts_stack  # the proxy binds the fault stack's proxy ports, which one test at a time can hold
def test_exactly_once_producer_rides_out_timed_out_requests(kdg, stack, topic, group):
    """Produce responses held back (the broker wrote the records, the producer never hears so): librdkafka times
    the requests out and sends them again, or the transaction is aborted and sent again. The run ends with exit 0,
    every record committed once, and each in the ledger: the audit after an exactly-once consume is balanced.
    (An abort after timed-out requests can itself die of a fence, librdkafka's own epoch bump answered as one:
    the producer takes its transactional.id over again and goes on; it used to exit 6.)"""
    from kdg.chaos.proxy import FaultProxy

    n = 1000
    with FaultProxy(stack) as proxy:
        proxy.drop_produce_responses(4)  # each may fail its transaction: fewer than MAX_TXN_RETRIES in a row
        proc = kdg("produce", topic, "-g", "exactly-once", "-b", stack.proxy_bootstrap, "--count", n, "--size", 50,
                   "--rate", 500, "--json", *TIMEOUTS, check=False, timeout=240)
    assert proxy.dropped > 0  # the fault fired
    assert proc.returncode == 0, proc.stderr
    produced = as_json(proc)
    assert produced["acked"] == n and produced["failed"] == 0, produced
    kdg("consume", topic, "-G", group, "-g", "exactly-once", "-e", "--json")
    audit = audited(kdg, topic)
    assert (audit["processed_unique"], audit["lost"], audit["duplicates"], audit["balanced"]) == (n, 0, 0, True), audit


def test_a_record_too_large_refuses_no_neighbour(kdg, conn):
    """A broker refuses a batch over its topic's max.message.bytes whole, and librdkafka never splits one: batched
    as librdkafka likes, the small records sent with a record too large were refused with it, and so were small
    records enough to fill a batch past the limit. Batches now fit the topic: only the records too large themselves
    are refused (exit 7), each small one is acknowledged, and the ledger says which is which."""
    from kdg.kafka.admin import ensure_topic
    from kdg.store.pg import Store

    topic = f"t-{uuid.uuid4().hex[:10]}"
    ensure_topic(conn.bootstrap_servers, topic, partitions=1, config={"max.message.bytes": "1000"})
    lines = ["x" * 3000 if i % 50 == 7 else f"small record {i:04d} " + "y" * 40 for i in range(400)]
    too_large = {f"{topic}-{i}" for i in range(400) if i % 50 == 7}
    proc = kdg("produce", topic, "-g", "at-least-once", "--id", f"{topic}-{{seq}}", "--json",
               "-X", "linger.ms=200", stdin="\n".join(lines) + "\n", check=False)  # linger: full batches
    assert proc.returncode == 7, proc.stderr
    report = as_json(proc)
    assert (report["acked"], report["failed"], report["errors"]) == (392, 8, {"MSG_SIZE_TOO_LARGE": 8}), report
    with Store(conn.pg_dsn) as store:
        failed = store.fetch("SELECT idempotency_key FROM kdg_ledger_keys WHERE topic = $1 AND status = 'failed'",
                             topic)
    assert {r["idempotency_key"] for r in failed} == too_large


def _ledger_records(conn, topic: str) -> int:
    from kdg.store.pg import Store

    with Store(conn.pg_dsn) as store:
        return store.fetchval("SELECT coalesce(sum(coalesce(seq_count, 1)), 0) FROM kdg_ledger WHERE topic = $1",
                              topic)


def _settled_and_audited(kdg, topic: str, group: str) -> dict:
    """The next exactly-once run (same transactional.id) settles what the killed one left; then every committed
    record is read into a table and audited against the ledger."""
    kdg("produce", topic, "-g", "exactly-once", "--count", 10, "--json")
    kdg("consume", topic, "-G", group, "-g", "exactly-once", "-e", "--json")
    return audited(kdg, topic, "-G", group)


def test_a_killed_exactly_once_producer_leaves_no_committed_record_out_of_its_ledger(kdg, kdg_spawn, conn, group):
    """SIGKILLed mid-run: each transaction's ledger rows were written before it committed, so no committed record
    lacks its row (the ledger used to be written up to a second after the commits: 'unexpected' records)."""
    topic = f"t-{uuid.uuid4().hex[:10]}"
    proc = kdg_spawn("produce", topic, "-g", "exactly-once", "--count", 1_000_000, "--rate", 5_000, "--json")
    try:
        deadline = time.monotonic() + 60
        while _ledger_records(conn, topic) < 3_000 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.3)  # mid-transaction, or between a commit and the next ledger write
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL, "the producer ended before it was killed"
    audit = _settled_and_audited(kdg, topic, group)
    assert (audit["lost"], audit["duplicates"], audit["unexpected"]) == (0, 0, 0), audit
    assert audit["acked"] >= 3_000, audit


_DIES_BEFORE_ITS_THIRD_COMMIT = """
import os, sys
from kdg.kafka.producer import KdgProducer
from kdg.produce import ProduceRequest, run_produce
from kdg.settings import Connection
from kdg.sources import LineOptions, synthetic

commit, commits = KdgProducer.commit, []
def dies(self):
    commits.append(1)
    if len(commits) == 3:
        os._exit(9)  # as a SIGKILL would: its rows are written, its transaction is open
    commit(self)
KdgProducer.commit = dies
run_produce(ProduceRequest(sys.argv[1], "exactly-once", synthetic(3000, 64, None, LineOptions()),
                           Connection(bootstrap_servers=sys.argv[2], pg_dsn=sys.argv[3]), txn_size=1000,
                           txn_interval_ms=600_000))
"""


def test_rows_of_a_transaction_a_kill_left_uncommitted_are_settled_failed_by_the_next_run(kdg, conn, group):
    """Killed after writing a transaction's ledger rows and before committing it: the rows stand for records
    that were never committed. The next run with the transactional.id (whose start aborted that transaction)
    finds them, reads Kafka, and marks them failed: the audit counts none of them lost."""
    from kdg.store.pg import Store

    topic = f"t-{uuid.uuid4().hex[:10]}"
    proc = subprocess.run([sys.executable, "-c", _DIES_BEFORE_ITS_THIRD_COMMIT, topic, conn.bootstrap_servers,
                           conn.pg_dsn], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    assert _ledger_records(conn, topic) == 3000  # the third transaction's rows too, its commit never made
    audit = _settled_and_audited(kdg, topic, group)
    assert (audit["acked"], audit["lost"], audit["duplicates"], audit["unexpected"]) == (2010, 0, 0, 0), audit
    with Store(conn.pg_dsn) as store:
        failed = store.fetchval("SELECT count(*) FROM kdg_ledger_keys WHERE topic = $1 AND status = 'failed'", topic)
    assert failed == 1000


def test_a_fatal_error_served_with_delivery_reports_comes_out_as_kdg_s_own(conn, topic):
    """A transactional producer fenced while its records wait to be sent: its flush meets librdkafka's fatal
    event, which confluent-kafka raises itself, then the records' delivery reports, whose callback then fails
    with a SystemError caused by it. Both come out of flush as ProducerFatal (what produce's renewal and its
    clean stop handle), not as an unexpected SystemError."""
    from kdg.errors import ProducerFatal
    from kdg.guarantees import policy_for
    from kdg.kafka.producer import DeliveryReports, KdgProducer

    policy, tid = policy_for("exactly-once"), f"kdg-fenced-{uuid.uuid4().hex[:8]}"
    old = KdgProducer(policy, conn.bootstrap_servers, {"linger.ms": 10_000}, transactional_id=tid)  # (unsent)
    old.begin()
    reports = DeliveryReports()
    n = 50
    old.send_many(topic, [b"v"] * n, [None] * n, [None] * n, [None] * n, reports.trackers([f"k{i}" for i in range(n)],
                                                                                         list(range(n))))
    new = KdgProducer(policy, conn.bootstrap_servers, transactional_id=tid)  # its init fences the old one
    try:
        with pytest.raises(ProducerFatal) as caught:
            old.flush(30)
        assert caught.value.fenced and "another producer took this transactional.id over" in str(caught.value)
    finally:
        new.abort()

"""The steps the scenarios are made of: say a step, produce with plain acks into kdg's ledger, find a
partition's leader, pause its followers, fail it over, audit a topic."""

import contextlib
import json
import signal
import time
import uuid

from kdg.audit import run_audit
from kdg.errors import StackError
from kdg.records import ID_HEADER

# A follower's fetch waits at the leader up to replica.fetch.wait.max.ms (Kafka's default 500 ms) for
# new records. A fetch sent just before the follower was paused is still answered, into the paused
# follower's socket, and would carry the records across; so they are produced once it has expired.
PARKED_FETCH_EXPIRY_S = 3.0

last_errors: dict[str, int] = {}  # error name → count, of the latest produce_acked() call


def say(echo, text: str) -> None:
    if echo:
        echo(text)


def audit_topic(topic: str, layout, echo, sink: str = "postgres", table: str = "kdg_events") -> dict:
    from kdg.settings import Connection

    report = run_audit(topic, Connection(layout.bootstrap_servers, layout.pg_dsn, layout.admin_properties()),
                       sink=sink, table=table)
    say(echo, f"  audit {topic}: acked={report.acked} failed={report.failed} unique={report.processed_unique} "
              f"lost={report.lost} duplicates={report.duplicates} unexpected={report.unexpected}")
    return report.to_dict()


def produce_acked(layout, topic: str, n: int, acks: str, timeout_ms: int, retries: int | None = None,
                  bootstrap: str | None = None, first_seq: int = 0) -> tuple[dict[str, tuple[int, int]], int]:
    """Produce ``n`` records with plain acks (not a kdg policy) and write kdg's ledger for them.

    Records are numbered from ``first_seq``, their kdg id ``{topic}-{seq}``: a second call on the same
    topic starts after the first's, or its ids repeat the first's and the audit counts them once.
    Returns the acknowledged records, ``{kdg id: (partition, offset)}`` as their delivery reports
    gave them, and the number that failed; the failures' error names are kept in ``last_errors``.
    """
    from kdg.kafka.clients import probe_producer
    from kdg.store.pg import Store

    run_id = uuid.uuid4()
    rows: list[tuple] = []
    acked: dict[str, tuple[int, int]] = {}
    config = {"acks": acks, "enable.idempotence": False, "message.timeout.ms": timeout_ms, "linger.ms": 5}
    if retries is not None:
        config["retries"] = retries
    producer = probe_producer(bootstrap or layout.bootstrap_servers, **layout.admin_properties(), **config)
    last_errors.clear()
    for seq in range(first_seq, first_seq + n):
        key = f"{topic}-{seq}"

        def done(err, msg, key=key, seq=seq):
            if err:
                last_errors[err.name()] = last_errors.get(err.name(), 0) + 1
            else:
                acked[key] = (msg.partition(), msg.offset())
            rows.append((run_id, key, topic, seq, "failed" if err else "acked", msg.partition(),
                         None if err else msg.offset(), err.str() if err else None))

        producer.produce(topic, json.dumps({"seq": seq}).encode(), headers=[(ID_HEADER, key.encode())],
                         on_delivery=done)
    producer.flush(timeout_ms / 1000 + 10)
    with Store(layout.pg_dsn) as store:
        store.copy_ledger(rows)
    return acked, len(rows) - len(acked)


def raw_produce(layout, topic: str, n: int, acks: str, timeout_ms: int, retries: int | None = None,
                bootstrap: str | None = None) -> tuple[int, int]:
    """:func:`produce_acked`, counted: (acknowledged, failed)."""
    acked, failed = produce_acked(layout, topic, n, acks, timeout_ms, retries, bootstrap)
    return len(acked), failed


def replicas(layout, topic: str, until=lambda part: True, what: str = "a leader",
             timeout: float = 60) -> tuple[int, list[int]]:
    """Partition 0's leader and followers, once it has a leader and ``until(partition)`` holds.

    Each broker learns of new topics, elections and ISR changes at its own pace, so this asks again.
    """
    from confluent_kafka import KafkaException

    from kdg.kafka.admin import admin_client

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            topics = admin_client(layout.bootstrap_servers, layout.admin_properties()).list_topics(topic, timeout=10).topics
            part = topics[topic].partitions.get(0)
        except (KafkaException, KeyError):  # no answer (the controllers regain their quorum) or no topic yet
            part = None
        if part is not None and part.leader >= 0 and until(part):
            return part.leader, [r for r in part.replicas if r != part.leader]
        time.sleep(0.5)
    raise StackError(f"partition 0 of {topic} did not get {what} within {timeout:.0f}s (a loaded machine?)")


@contextlib.contextmanager
def followers_paused(layout, followers: list[int], echo, step: int):
    """The block runs with ``followers`` SIGSTOPped (in the ISR, copying nothing), once the fetches they sent
    before the pause expired; they are continued after it, whatever happened."""
    from kdg.stack import kafka_node

    try:
        for f in followers:
            kafka_node.signal(layout, f, signal.SIGSTOP)
        say(echo, f"{step}. followers {followers} paused (SIGSTOP): they stay in the ISR but copy nothing; "
                  f"{PARKED_FETCH_EXPIRY_S:.0f} s for the fetches they sent before the pause to expire")
        time.sleep(PARKED_FETCH_EXPIRY_S)
        yield
    finally:
        for f in followers:
            kafka_node.signal(layout, f, signal.SIGCONT)


def fail_over(layout, topic: str, leader: int, echo, step: int) -> int:
    """After ``leader`` was killed: wait for a new leader from the ISR, start the old one again and wait
    until it is back in the ISR (its log cut back to the new leader's); the new leader."""
    from kdg.stack import cluster

    try:
        elected, _ = replicas(layout, topic, lambda part: part.leader != leader, "a new leader", timeout=180)
        say(echo, f"{step}. followers resumed; broker {elected} was elected from the ISR "
                  "(unclean election stays off)")
    finally:
        cluster.start_node(layout, leader)
    replicas(layout, topic, lambda part: leader in part.isrs, f"broker {leader} back in its ISR", timeout=120)
    return elected

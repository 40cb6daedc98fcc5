"""`kdg chaos scenario read-anomaly`: the second seed's read anomaly, and why Kafka's consumers never meet it.

A consumer reads only below the high watermark, the offset every in-sync replica has reached. Records
the leader has and its followers lack lie above it: a leader that dies takes them away, and no
consumer had read them. Under acks=1 the producer was told "ok" for exactly such records: acknowledged,
never readable, then lost.
"""

import time
import uuid

from kdg.chaos.steps import audit_topic, fail_over, followers_paused, produce_acked, raw_produce, replicas, say
from kdg.errors import StackError
from kdg.records import ID_HEADER
from kdg.stack import kafka_node
from kdg.stack.layout import HOST

COMMITTED = 20       # produced with acks=all first, so the reader is seen to read, and where it stops
ACKS_1 = 200         # produced with acks=1 while the followers are paused
READ_PAST_END_S = 3  # how long a reader keeps fetching once it has read up to the high watermark


def read_anomaly(layout, echo) -> tuple[bool, str, dict]:
    from kdg.kafka.admin import ensure_topic, high_watermarks

    extra = layout.admin_properties()
    topic = f"scenario-read-{uuid.uuid4().hex[:6]}"
    ensure_topic(layout.bootstrap_servers, topic, partitions=1, extra=extra)
    leader, followers = replicas(layout, topic)
    at_leader = f"{HOST}:{layout.client_port(leader)}"  # the paused brokers would leave a request unanswered
    committed, _ = raw_produce(layout, topic, COMMITTED, "all", timeout_ms=30_000)
    say(echo, f"1. topic {topic} (1 partition, RF 3): leader broker {leader}, followers {followers}; "
              f"{committed} records produced with acks=all, so every replica has them")
    with followers_paused(layout, followers, echo, step=2):
        acked, failed = produce_acked(layout, topic, ACKS_1, "1", timeout_ms=8000, bootstrap=at_leader,
                                      first_seq=COMMITTED)
        offsets = sorted(offset for _, offset in acked.values())
        say(echo, f"3. acks=1: the leader alone acknowledged {len(acked)} of {ACKS_1} records "
                  f"({failed} failed), at offsets {_span(offsets)}")
        hw_before = high_watermarks(at_leader, topic, extra)[0]
        above = sum(offset >= hw_before for offset in offsets)
        say(echo, f"4. ListOffsets(latest) from the leader: high watermark {hw_before}; "
                  f"{above} of the {len(offsets)} acknowledged offsets are at or above it")
        read_before = _read(at_leader, extra, topic, hw_before)
        seen_before = len(read_before.keys() & acked.keys())
        say(echo, f"5. a reader (read_uncommitted) from offset 0 read {len(read_before)} records, offsets "
                  f"{_span(sorted(read_before.values()))}, and for {READ_PAST_END_S} s more nothing: "
                  f"{seen_before} of the acknowledged ones")
        kafka_node.stop(layout, leader, hard=True)
        say(echo, f"6. leader {leader} SIGKILLed before any follower copied the acknowledged records")
    elected = fail_over(layout, topic, leader, echo, step=7)
    hw_after = high_watermarks(layout.bootstrap_servers, topic, extra)[0]
    read_after = _read(layout.bootstrap_servers, extra, topic, hw_after)
    seen_after = len(read_after.keys() & acked.keys())
    say(echo, f"8. broker {leader} restarted and rejoined the ISR, its log cut back to the new leader's; "
              f"high watermark {hw_after}, the log end too with every replica in sync")
    say(echo, f"   a reader from offset 0 read {len(read_after)} records, {seen_after} of the acknowledged ones: "
              "they are gone")
    say(echo, "9. audit: the producer ledger against the topic")
    audit = audit_topic(topic, layout, echo, sink=f"kafka:{topic}")
    ok = (len(acked) > 0 and len(read_before) == committed and seen_before == 0 and hw_before <= offsets[0]
          and seen_after == 0 and audit["lost"] == len(acked))
    details = {"topic": topic, "leader": leader, "elected": elected, "committed": committed,
               "acked": len(acked), "acked_offsets": [offsets[0], offsets[-1]] if offsets else [],
               "high_watermark_before": hw_before, "read_before": len(read_before), "acked_read_before": seen_before,
               "high_watermark_after": hw_after, "read_after": len(read_after), "acked_read_after": seen_after,
               "audit": audit}
    return ok, (f"acks=1 acknowledged {len(acked)} records above the high watermark {hw_before}; readers saw "
                f"{seen_before} of them before the leader died and {seen_after} after; the audit lost "
                f"{audit['lost']}"), details


def _read(bootstrap: str, extra: dict, topic: str, end: int, timeout: float = 30) -> dict[str, int]:
    """``{kdg id: offset}`` of what a reader gets from partition 0, from offset 0 up to ``end`` and
    for ``READ_PAST_END_S`` more."""
    from confluent_kafka import TopicPartition

    from kdg.kafka.clients import reader

    consumer = reader(bootstrap, extra, group="kdg-scenario-reader", isolation="read_uncommitted")
    consumer.assign([TopicPartition(topic, 0, 0)])
    read: dict[str, int] = {}
    deadline = time.monotonic() + timeout
    reached = time.monotonic() if end == 0 else None
    try:
        while time.monotonic() < deadline and (reached is None or time.monotonic() - reached < READ_PAST_END_S):
            for msg in consumer.consume(1000, 0.5):
                if msg.error():
                    raise StackError(f"the reader of {topic} failed: {msg.error().str()}")
                read[dict(msg.headers() or [])[ID_HEADER].decode()] = msg.offset()
                if reached is None and msg.offset() + 1 >= end:
                    reached = time.monotonic()
    finally:
        consumer.close()
    return read


def _span(offsets: list[int]) -> str:
    return f"{offsets[0]}..{offsets[-1]}" if offsets else "none"

"""May the configured user write, read and commit? Asked of Kafka itself, with one tiny real record.

``kdg doctor --topic T --group G`` calls :func:`probe_permissions`: it writes one record (header
``kdg-doctor``, no ``kdg-id``) to ``T``, reads it back by assignment, and commits for ``G`` the offset the group already has — unchanged — or, for a group with none on
that partition, the partition's first offset (where such a group starts anyway). A denied step is
an :class:`~kdg.errors.AccessDenied` naming it; a group with live members refusing an outsider's
commit still proves the ACL allowed it (Kafka authorizes before it checks membership).

Every kdg consumer and Spark job steps over the probe record: its offset moves on, nothing is written,
and the report counts it in ``probes_skipped`` (:attr:`kdg.records.Record.is_probe`).
"""

import time

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from kdg.errors import ConnectionFailed
from kdg.kafka.access import check, raise_queued
from kdg.kafka.admin import topic_partitions
from kdg.kafka.clients import Role, client_config, new_producer, reader
from kdg.kafka.consumer import committed_offsets
from kdg.records import PROBE_HEADER

_GROUP_BUSY = {KafkaError.UNKNOWN_MEMBER_ID, KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS,
               KafkaError.FENCED_INSTANCE_ID}


def probe_permissions(bootstrap: str, props: dict[str, str], topic: str, group: str,
                      timeout: float = 20) -> dict[str, str]:
    """``{"write": detail, "read": detail, "commit": detail}``; raises at the first step Kafka refuses."""
    topic_partitions(bootstrap, topic, props)  # exists, and the user may describe it
    partition, offset = _write(bootstrap, props, topic, timeout)
    found = {"write": f"wrote 1 record to {topic}[{partition}] at offset {offset}"}
    consumer = reader(bootstrap, props, group=group, isolation="read_uncommitted")
    try:
        _read(consumer, topic, partition, offset, timeout)
        found["read"] = f"read it back from {topic}[{partition}]"
        found["commit"] = _commit(consumer, topic, partition, group)
    finally:
        consumer.close()
    return found


def _write(bootstrap: str, props: dict[str, str], topic: str, timeout: float) -> tuple[int, int]:
    producer = new_producer(client_config(Role.DEAD_LETTERS, bootstrap, props), Role.DEAD_LETTERS)
    outcome: list = []
    producer.produce(topic, b"kdg doctor: may this user write here?", headers=[(PROBE_HEADER, b"1")],
                     on_delivery=lambda err, msg: outcome.append((err, msg)))
    producer.flush(timeout)
    if not outcome:
        raise_queued(producer)
        raise ConnectionFailed(f"writing to {topic!r}: no acknowledgement within {timeout:.0f} s")
    err, msg = outcome[0]
    if err is not None:
        check(err, f"writing to topic {topic!r}")
        raise ConnectionFailed(f"writing to {topic!r} failed: {err.str()}")
    return msg.partition(), msg.offset()


def _read(consumer, topic: str, partition: int, offset: int, timeout: float) -> None:
    consumer.assign([TopicPartition(topic, partition, offset)])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for msg in consumer.consume(10, 1.0):
            if msg.error():
                check(msg.error(), f"reading topic {topic!r}")
                continue
            if msg.partition() == partition and msg.offset() >= offset:
                return
    raise ConnectionFailed(f"reading {topic!r}: the record just written did not arrive within {timeout:.0f} s")


def _commit(consumer, topic: str, partition: int, group: str) -> str:
    try:
        stored = committed_offsets(consumer, topic, [partition])[partition]
    except KafkaException as exc:
        check(exc.args[0], f"reading group {group!r}'s offsets")
        raise
    if stored is None:
        stored = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)[0]
    try:
        consumer.commit(offsets=[TopicPartition(topic, partition, stored)], asynchronous=False)
    except KafkaException as exc:
        err = exc.args[0]
        check(err, f"committing for group {group!r}")
        if err.code() in _GROUP_BUSY:
            return f"allowed for group {group} (it has live members, so the offset was left to them)"
        raise ConnectionFailed(f"committing for group {group!r} failed: {err.str()}") from None
    return f"committed group {group}'s offset {stored} on {topic}[{partition}] (unchanged)"

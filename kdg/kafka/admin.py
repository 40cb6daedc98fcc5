"""Admin operations kdg needs: wait for brokers, create and describe topics, read watermarks."""

import re
import time

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec

from kdg.errors import ConnectionFailed, DeliveryError, UnknownTopic, UsageError
from kdg.kafka.access import check, raise_queued
from kdg.kafka.clients import admin_client, reader


def _unreachable(client, bootstrap: str, exc: KafkaException, doing: str = "") -> ConnectionFailed:
    """The error to raise for a failed request: a refused login or an ACL if that was the cause."""
    raise_queued(client)
    check(exc.args[0], doing)
    return ConnectionFailed(f"cannot reach Kafka at {bootstrap}: {exc.args[0].str()}")


def _metadata(admin, topic: str | None = None, timeout: float = 10.0):
    """``list_topics`` in slices of a second: between them a refused login or certificate, queued by the error
    callback, is raised (:func:`raise_queued`), so it is named within a second or two, not after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return admin.list_topics(topic, timeout=min(1.0, max(deadline - time.monotonic(), 0.1)))
        except KafkaException:
            raise_queued(admin)
            if time.monotonic() >= deadline:
                raise


def wait_brokers_registered(bootstrap: str, node_ids: set[int], timeout: float = 90.0,
                            props: dict | None = None) -> None:
    admin = admin_client(bootstrap, props)
    deadline = time.monotonic() + timeout
    seen: set[int] = set()
    while time.monotonic() < deadline:
        try:
            seen = set(_metadata(admin, timeout=5).brokers)  # the stack's own login refused: fails now, not in 90 s
            if node_ids <= seen:
                return
        except KafkaException:
            pass
        time.sleep(0.3)
    raise ConnectionFailed(f"brokers {sorted(node_ids - seen)} did not register with the cluster "
                           f"within {timeout:.0f}s (registered: {sorted(seen)})")


def _cluster(bootstrap: str, extra: dict | None, timeout: float):
    """The cluster's metadata (brokers, topics); a refused login or certificate is named as such."""
    admin = admin_client(bootstrap, extra)
    try:
        return _metadata(admin, timeout=timeout)
    except KafkaException as exc:
        raise _unreachable(admin, bootstrap, exc) from None


def broker_ids(bootstrap: str, extra: dict | None = None, timeout: float = 10) -> list[int]:
    """The registered brokers' ids."""
    return sorted(_cluster(bootstrap, extra, timeout).brokers)


def topic_partitions(bootstrap: str, topic: str, extra: dict | None = None, timeout: float = 10) -> list[int]:
    """Partition ids of ``topic``; a usage error if it does not exist."""
    admin = admin_client(bootstrap, extra)
    try:
        md = _metadata(admin, topic, timeout)
    except KafkaException as exc:
        raise _unreachable(admin, bootstrap, exc) from None
    t = md.topics.get(topic)
    if t is not None and t.error is not None:
        check(t.error, f"to topic {topic!r}")
    if t is None or t.error is not None:
        raise UnknownTopic(f"topic {topic!r} does not exist")
    return sorted(t.partitions)


_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")  # Kafka's own rule (Topic.validate)


def ensure_topic(bootstrap: str, topic: str, *, partitions: int = 3, extra: dict | None = None,
                 config: dict | None = None, timeout: float = 10) -> bool:
    """Create ``topic`` with the cluster's default replication if missing; True if created."""
    if not _TOPIC_NAME.match(topic) or topic in (".", ".."):
        raise UsageError(f"topic {topic!r}: a Kafka topic name is 1 to 249 of a-z, A-Z, 0-9, '.', '_' and '-'")
    admin = admin_client(bootstrap, extra)
    try:
        md = _metadata(admin, timeout=timeout)
    except KafkaException as exc:
        raise _unreachable(admin, bootstrap, exc) from None
    if topic in md.topics and md.topics[topic].error is None:
        return False
    future = admin.create_topics([NewTopic(topic, num_partitions=partitions, config=config or {})])[topic]
    try:
        future.result(30)
    except KafkaException as exc:
        if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
            check(exc.args[0], f"creating topic {topic!r}")
            raise DeliveryError(f"could not create topic {topic!r}: {exc.args[0].str()}") from exc
        return False
    _wait_topic_visible(admin, topic, partitions)
    return True


def delete_topics(bootstrap: str, topics: list[str], extra: dict | None = None, timeout: float = 30) -> list[str]:
    """Delete those of ``topics`` that exist, and wait until the controller has; the ones deleted."""
    admin = admin_client(bootstrap, extra)  # held until the answers: a destroyed client fails its futures
    try:
        existing = _metadata(admin, timeout=timeout).topics
    except KafkaException as exc:
        raise _unreachable(admin, bootstrap, exc) from None
    doomed = [t for t in topics if t in existing]
    if not doomed:
        return []
    for topic, future in admin.delete_topics(doomed, operation_timeout=timeout).items():
        try:
            future.result(timeout + 5)
        except KafkaException as exc:
            if exc.args[0].name() != "UNKNOWN_TOPIC_OR_PART":  # gone meanwhile: what was asked for
                check(exc.args[0], f"deleting topic {topic!r}")
                raise DeliveryError(f"could not delete topic {topic!r}: {exc.args[0].str()}") from exc
    return doomed


def topic_names(bootstrap: str, extra: dict | None = None, timeout: float = 10) -> list[str]:
    """Every topic's name, sorted."""
    return sorted(_cluster(bootstrap, extra, timeout).topics)


def all_partitions(bootstrap: str, extra: dict | None = None, timeout: float = 10) -> dict[str, list[int]]:
    """Every topic's partition ids, from one metadata request."""
    return {name: sorted(t.partitions) for name, t in _cluster(bootstrap, extra, timeout).topics.items()
            if t.error is None}


def active_groups(bootstrap: str, extra: dict | None = None, timeout: float = 10) -> set[str]:
    """The consumer groups that have members now (stable or rebalancing)."""
    from confluent_kafka import ConsumerGroupState

    admin = admin_client(bootstrap, extra)
    try:
        listed = admin.list_consumer_groups(request_timeout=timeout).result(timeout + 5)
    except KafkaException as exc:
        raise _unreachable(admin, bootstrap, exc, "listing consumer groups") from None
    idle = {ConsumerGroupState.EMPTY, ConsumerGroupState.DEAD}
    return {g.group_id for g in listed.valid if g.state not in idle}


def _wait_topic_visible(admin: AdminClient, topic: str, partitions: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        t = admin.list_topics(topic, timeout=5).topics.get(topic)
        if t and t.error is None and len(t.partitions) == partitions and all(
                p.leader >= 0 for p in t.partitions.values()):
            return
        time.sleep(0.2)


def describe_topic(bootstrap: str, topic: str, extra: dict | None = None) -> dict:
    """Replication factor per partition and the topic's effective ``min.insync.replicas`` (Kafka's word)."""
    admin = admin_client(bootstrap, extra)
    t = admin.list_topics(topic, timeout=10).topics[topic]
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([res])[res].result(15)
    return {
        "partitions": len(t.partitions),
        "replication_factors": sorted({len(p.replicas) for p in t.partitions.values()}),
        "leaders": {p.id: p.leader for p in t.partitions.values()},
        "min.insync.replicas": int(configs["min.insync.replicas"].value),
    }


def topic_config(bootstrap: str, topic: str, names: tuple[str, ...], extra: dict | None = None) -> dict[str, str]:
    """The effective values of the topic configs ``names`` (the broker's defaults where the topic sets none)."""
    admin = admin_client(bootstrap, extra)
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    try:
        configs = admin.describe_configs([res])[res].result(15)
    except KafkaException as exc:
        raise _unreachable(admin, bootstrap, exc, f"describing topic {topic!r}") from None
    return {n: configs[n].value for n in names if n in configs}


def describe_broker_config(bootstrap: str, broker_id: int, names: list[str],
                           extra: dict | None = None) -> dict[str, str]:
    admin = admin_client(bootstrap, extra)
    res = ConfigResource(ConfigResource.Type.BROKER, str(broker_id))
    try:
        configs = admin.describe_configs([res])[res].result(15)
    except KafkaException as exc:
        raise _unreachable(admin, bootstrap, exc, "describing the brokers' configuration") from None
    return {n: configs[n].value for n in names if n in configs}


def watermarks(bootstrap: str, topic: str, extra: dict | None = None,
               isolation: str = "read_committed") -> dict[int, tuple[int, int]]:
    """``{partition: (low, high)}``; under read_committed ``high`` is the last stable offset."""
    consumer = reader(bootstrap, extra, group="kdg-watermarks", isolation=isolation)
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
                for p in topic_partitions(bootstrap, topic, extra)}
    except KafkaException as exc:
        raise_queued(consumer)
        check(exc.args[0], f"to topic {topic!r}")
        raise ConnectionFailed(f"cannot read the end offsets of {topic!r} from Kafka at {bootstrap}: "
                               f"{exc.args[0].str()}") from exc
    finally:
        consumer.close()


def high_watermarks(bootstrap: str, topic: str, extra: dict | None = None) -> dict[int, int]:
    """``{partition: high watermark}``, asked of each partition's leader (ListOffsets, latest, read_uncommitted).

    The high watermark is the end of what any consumer may read: the offset every in-sync replica has
    reached. Records the leader has and a follower lacks lie at or above it.
    """
    admin = admin_client(bootstrap, extra)
    specs = {TopicPartition(topic, p): OffsetSpec.latest() for p in topic_partitions(bootstrap, topic, extra)}
    try:
        futures = admin.list_offsets(specs, isolation_level=IsolationLevel.READ_UNCOMMITTED, request_timeout=15)
        return {tp.partition: future.result().offset for tp, future in futures.items()}
    except KafkaException as exc:
        raise _unreachable(admin, bootstrap, exc, f"listing the offsets of {topic!r}") from None

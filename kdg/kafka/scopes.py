"""Which librdkafka properties belong to which kind of client (CONFIGURATION.md's C/P column).

A ``-X`` bag feeds every client a command creates. A property of the other kind is meaningless
to a client, so it is dropped for that client instead of reaching librdkafka, which warns about
it (or, for a property the guarantee owns, instead of being refused by a client that never uses
it). ``tests/test_clients.py`` checks these sets against librdkafka's own warnings.
"""

CONSUMER_ONLY = frozenset({
    "group.id", "group.instance.id", "partition.assignment.strategy", "session.timeout.ms",
    "heartbeat.interval.ms", "group.protocol.type", "group.protocol", "group.remote.assignor",
    "coordinator.query.interval.ms", "max.poll.interval.ms", "max.poll.records", "enable.auto.commit",
    "auto.commit.interval.ms", "enable.auto.offset.store", "queued.min.messages",
    "queued.max.messages.kbytes", "fetch.wait.max.ms", "fetch.queue.backoff.ms", "fetch.message.max.bytes",
    "max.partition.fetch.bytes", "fetch.max.bytes", "fetch.min.bytes", "fetch.error.backoff.ms",
    "isolation.level", "enable.partition.eof", "check.crcs", "auto.offset.reset", "auto.commit.enable",
    "consume.callback.max.messages",
})

PRODUCER_ONLY = frozenset({
    "transactional.id", "transaction.timeout.ms", "enable.idempotence", "enable.gapless.guarantee",
    "queue.buffering.max.messages", "queue.buffering.max.kbytes", "queue.buffering.max.ms", "linger.ms",
    "message.send.max.retries", "retries", "queue.buffering.backpressure.threshold", "compression.codec",
    "compression.type", "batch.num.messages", "batch.size", "delivery.report.only.error",
    "sticky.partitioning.linger.ms", "request.required.acks", "acks", "request.timeout.ms",
    "message.timeout.ms", "delivery.timeout.ms", "partitioner", "compression.level",
})

# librdkafka reports an invalid value under a property's canonical name; users typed the alias.
ALIASES = {
    "queue.buffering.max.ms": "linger.ms", "request.required.acks": "acks", "message.send.max.retries": "retries",
    "max.in.flight.requests.per.connection": "max.in.flight", "message.timeout.ms": "delivery.timeout.ms",
    "compression.codec": "compression.type", "metadata.broker.list": "bootstrap.servers",
    "fetch.message.max.bytes": "max.partition.fetch.bytes",
}


def applies(name: str, *, producer_side: bool) -> bool:
    """Whether property ``name`` means anything to a producer-side (producer, admin) or consumer client."""
    return name not in (CONSUMER_ONLY if producer_side else PRODUCER_ONLY)

"""The one factory of Kafka clients: (role, user properties, policy) → a config, then a client.

Every client kdg creates comes from here — the producer and consumer of a command, the
dead-letter producer, the admin client, the readers of the audit and of watermarks, Spark's Kafka
source options and the chaos probes — so the guard rails cannot be skipped:

1. A user property (``-X``) that would weaken the command's policy is refused, whichever client it
   would reach (``merge_overrides`` against the policy's whole config).
2. A property that means nothing to a role (a consumer property for a producer) is dropped for
   that role; the roles that use it still get it.
3. The role's own fixed keys win as the policy's do (the dead-letter producer is always durable,
   the audit reads committed records only).
4. Logs go through Python logging (``kdg.kafka``); a bad property value is a usage error naming
   the property as the user typed it.
"""

import weakref
from enum import Enum

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from kdg.errors import PolicyViolation, UsageError
from kdg.guarantees import OWNED, DeliveryPolicy, merge_overrides
from kdg.kafka.access import on_error
from kdg.kafka.java_security import is_security, java_security
from kdg.kafka.logs import client_log_config
from kdg.kafka.scopes import ALIASES, applies
from kdg.profile import redact


class Role(str, Enum):
    PRODUCER = "producer"
    CONSUMER = "consumer"
    DEAD_LETTERS = "dead-letter producer"
    ADMIN = "admin client"
    READER = "reader"                 # assign()-only: the audit, watermarks, offset lookups; never commits
    SPARK_SOURCE = "Spark Kafka source"
    PROBE = "chaos probe"             # an experiment's own acks; no policy, no user properties


_PRODUCER_SIDE = {Role.PRODUCER, Role.DEAD_LETTERS, Role.ADMIN, Role.PROBE}

PRODUCER_TUNING = {"linger.ms": 5, "batch.size": 1_000_000, "queue.buffering.max.messages": 500_000,
                   "queue.buffering.max.kbytes": 262_144, "compression.type": "none"}
CONSUMER_TUNING = {
    "session.timeout.ms": 10_000,       # a dead consumer's partitions move within seconds
    "heartbeat.interval.ms": 1_000,
    "max.poll.interval.ms": 120_000,
    "queued.max.messages.kbytes": 65_536,  # bounds memory by the queue, not by the topic
    "fetch.max.bytes": 52_428_800,
    "topic.metadata.refresh.interval.ms": 5_000,
}
# Records that could not be written must never be lost on their way to the dead-letter topic.
DEAD_LETTER_CONFIG = {"acks": "all", "enable.idempotence": True}
READER_CONFIG = {"enable.auto.commit": False, "enable.auto.offset.store": False, "enable.partition.eof": False}


def vet_properties(props: dict[str, str], policy: DeliveryPolicy | None) -> None:
    """Refuse a property that weakens ``policy``, whatever client of the command it would reach."""
    if policy is not None:
        merge_overrides(policy.client_config(), {k: v for k, v in props.items() if k in OWNED})


def client_config(role: Role, bootstrap: str, props: dict[str, str] | None = None,
                  policy: DeliveryPolicy | None = None, **fixed: object) -> dict[str, object]:
    """The librdkafka config of a ``role`` client: tuning, then policy and fixed keys, then user properties."""
    props = dict(props or {}) if role is not Role.PROBE else {}
    vet_properties(props, policy)
    base: dict[str, object] = {**_tuning(role), **_policy_part(role, policy), **fixed}
    producer_side = role in _PRODUCER_SIDE
    # an owned key the role does not set was vouched for by the policy check above; the role has no use for it
    kept = {k: v for k, v in props.items() if applies(k, producer_side=producer_side) and (k not in OWNED or k in base)}
    try:
        merged = merge_overrides(base, kept)
    except PolicyViolation as exc:
        raise PolicyViolation(f"{exc} [{role.value}]") from None
    return {**client_log_config(), "error_cb": on_error, **merged, "bootstrap.servers": bootstrap}


def _tuning(role: Role) -> dict[str, object]:
    if role is Role.PRODUCER:
        return dict(PRODUCER_TUNING)
    if role is Role.CONSUMER:
        return dict(CONSUMER_TUNING)
    return {}


def _policy_part(role: Role, policy: DeliveryPolicy | None) -> dict[str, object]:
    if role is Role.DEAD_LETTERS:
        return dict(DEAD_LETTER_CONFIG)
    if role is Role.READER:
        return dict(READER_CONFIG)
    if policy is None:
        return {}
    if role is Role.PRODUCER:
        return policy.producer_config()
    if role in (Role.CONSUMER, Role.SPARK_SOURCE):
        return policy.consumer_config()
    return {}


def weakly(method):
    """The bound ``method`` as a client callback that does not keep its object alive.

    A client holding its owner's bound method is a cycle (owner → client → callback → owner) that
    reference counting never frees. The cycle collector frees it later, maybe only while Python
    shuts down, when librdkafka's threads can still call back into a half-gone interpreter. One
    `kdg produce` with a refused login in 80 died of SIGSEGV that way, after printing the right error.
    With this, dropping the owner destroys its client at once, where the owner was let go."""
    ref = weakref.WeakMethod(method)

    def call(*args):
        bound = ref()
        if bound is not None:
            return bound(*args)

    return call


def new_producer(config: dict[str, object], role: Role = Role.PRODUCER) -> Producer:
    return _create(Producer, config, role)


def new_consumer(config: dict[str, object], role: Role = Role.CONSUMER) -> Consumer:
    return _create(Consumer, config, role)


def admin_client(bootstrap: str, props: dict[str, str] | None = None) -> AdminClient:
    return _create(AdminClient, client_config(Role.ADMIN, bootstrap, props), Role.ADMIN)


def reader(bootstrap: str, props: dict[str, str] | None = None, *, group: str = "kdg-reader",
           isolation: str = "read_committed") -> Consumer:
    """A consumer that is only ``assign``ed: it reads at ``isolation`` (committed records by default), never commits."""
    return new_consumer(reader_config(bootstrap, props, group=group, isolation=isolation), Role.READER)


def reader_config(bootstrap: str, props: dict[str, str] | None = None, *, group: str = "kdg-reader",
                  isolation: str = "read_committed") -> dict[str, object]:
    return client_config(Role.READER, bootstrap, props, None, **{"group.id": group, "isolation.level": isolation})


def vet_unguarded(bootstrap: str, props: dict[str, str]) -> None:
    """For a command with no guarantee of its own (the audit), which reads with :func:`reader` only.

    A property kdg owns is refused unless it is what the reader fixes anyway (``acks`` or
    ``transactional.id`` mean nothing to a reader, and silently dropping them would hide a typo of
    intent); a bad value is refused by building the reader once, before anything is read.
    """
    config = reader_config(bootstrap, props)
    try:
        merge_overrides(config, {k: v for k, v in props.items() if k in OWNED})
    except PolicyViolation as exc:
        raise PolicyViolation(f"{exc} [{Role.READER.value}: this command has no guarantee to weaken or set]") from None
    new_consumer(config, Role.READER).close()


def probe_producer(bootstrap: str, **config: object) -> Producer:
    """A producer with exactly the settings a chaos experiment chose (acks=1 is the point of some)."""
    return new_producer(client_config(Role.PROBE, bootstrap, None, None, **config), Role.PROBE)


def spark_source_options(bootstrap: str, props: dict[str, str] | None, policy: DeliveryPolicy) -> dict[str, str]:
    """Options for Spark's Kafka source (``kafka.``-prefixed Java client properties).

    Spark's reader owns offsets, group and commits, so of the policy only ``isolation.level``
    travels; a user property that would weaken it is refused like anywhere else. Security
    properties are translated to the Java client's (:mod:`kdg.kafka.java_security`).
    """
    config = client_config(Role.SPARK_SOURCE, bootstrap, props, policy)
    security = java_security(config)  # librdkafka's names mean nothing to Java's client: translated, or refused
    kept = {k: v for k, v in config.items() if k not in _SPARK_OWNS and not is_security(k)}
    return {f"kafka.{k}": _java_value(v) for k, v in {**kept, **security}.items()}


# Spark's source commits nothing and seeks itself: it refuses these, or they mean nothing to it
_SPARK_OWNS = {"logger", "log_level", "error_cb", "enable.auto.commit", "enable.auto.offset.store", "auto.offset.reset"}


def _java_value(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _create(kind, config: dict[str, object], role: Role):
    try:
        return kind(config)
    except (KafkaException, ValueError, TypeError) as exc:
        shown = redact(_explain(exc, config), {k: str(v) for k, v in config.items()})  # never a password
        raise UsageError(f"invalid {role.value} configuration: {shown}") from None


def _explain(exc: Exception, config: dict[str, object]) -> str:
    """librdkafka's complaint, naming the property as the user typed it (``linger.ms``, not its alias)."""
    text = exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else str(exc)
    for canonical, alias in ALIASES.items():
        if f'"{canonical}"' in text and alias in config:
            return f"{text} (-X {alias}={config[alias]})"
    return text

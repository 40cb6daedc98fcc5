"""The client factory: property scopes checked against librdkafka itself, and the guard rails on every role."""

import logging

import pytest
from confluent_kafka import Consumer, Producer

from conftest import as_json
from kdg.errors import PolicyViolation, UsageError
from kdg.guarantees import policy_for
from kdg.kafka.clients import Role, client_config, new_producer, spark_source_options
from kdg.kafka.scopes import ALIASES, CONSUMER_ONLY, PRODUCER_ONLY

# a value librdkafka accepts for each property (the rest take "1", "true" and friends)
VALUES = {"fetch.max.bytes": "1048576", "group.protocol.type": "consumer", "max.poll.interval.ms": "300000",
          "delivery.report.only.error": "false", "isolation.level": "read_committed", "auto.offset.reset": "earliest",
          "partition.assignment.strategy": "range", "group.protocol": "classic", "partitioner": "murmur2",
          "compression.codec": "none", "compression.type": "none", "group.remote.assignor": "uniform",
          "transactional.id": "kdg", "group.instance.id": "kdg", "group.id": "kdg", "acks": "1",
          "request.required.acks": "1", "compression.level": "-1", "retries": "0", "message.send.max.retries": "0",
          "transaction.timeout.ms": "60000"}


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _ignored(kind, name: str) -> list[str]:
    """What librdkafka logs about property ``name`` given to a client of ``kind`` (one that has no use for it)."""
    log = logging.getLogger(f"kdg.test.scopes.{name}")
    handler = _Lines()
    log.handlers, log.propagate = [handler], False
    config = {"bootstrap.servers": "127.0.0.1:1", name: VALUES.get(name, "1"), "logger": log, "log_level": 4}
    if kind is Consumer:
        config["group.id"] = "kdg-scope-check"
    client = kind(config)
    client.poll(0)
    if kind is Consumer:
        client.close()
    canonical = {alias: name for name, alias in ALIASES.items()}.get(name, name)  # librdkafka names the canonical
    return [line for line in handler.lines if canonical in line and "will be ignored" in line]


@pytest.mark.parametrize("name", sorted(CONSUMER_ONLY))
def test_consumer_only_properties_are_ignored_by_librdkafkas_producer(name):
    assert _ignored(Producer, name), f"{name} is not a consumer-only property for librdkafka"


@pytest.mark.parametrize("name", sorted(PRODUCER_ONLY))
def test_producer_only_properties_are_ignored_by_librdkafkas_consumer(name):
    assert _ignored(Consumer, name), f"{name} is not a producer-only property for librdkafka"


def test_a_property_meaningless_for_a_role_is_dropped_for_it_only():
    eos = policy_for("exactly-once")
    props = {"fetch.min.bytes": "2", "linger.ms": "7", "isolation.level": "read_committed"}
    producer = client_config(Role.PRODUCER, "b:1", props, eos)
    consumer = client_config(Role.CONSUMER, "b:1", props, eos)
    dead_letters = client_config(Role.DEAD_LETTERS, "b:1", props, eos)
    assert producer["linger.ms"] == "7" and "fetch.min.bytes" not in producer and "isolation.level" not in producer
    assert consumer["fetch.min.bytes"] == "2" and "linger.ms" not in consumer
    assert dead_letters["linger.ms"] == "7" and dead_letters["acks"] == "all"


@pytest.mark.parametrize("role", [r for r in Role if r is not Role.PROBE])
def test_a_weakening_property_is_refused_by_every_role_of_an_exactly_once_command(role):
    with pytest.raises(PolicyViolation, match="isolation.level"):
        client_config(role, "b:1", {"isolation.level": "read_uncommitted"}, policy_for("exactly-once"))


def test_a_chaos_probe_takes_the_experiments_settings_and_no_user_properties():
    config = client_config(Role.PROBE, "b:1", {"acks": "0"}, None, acks="1")
    assert config["acks"] == "1"


def test_the_audit_reader_reads_committed_records_only_whatever_the_user_says():
    with pytest.raises(PolicyViolation, match="isolation.level"):
        client_config(Role.READER, "b:1", {"isolation.level": "read_uncommitted"}, None,
                      **{"isolation.level": "read_committed"})


def test_spark_source_options_carry_the_policy_and_refuse_weakening():
    options = spark_source_options("h:1", {"fetch.min.bytes": "2", "linger.ms": "5"}, policy_for("exactly-once"))
    assert options["kafka.isolation.level"] == "read_committed"
    assert options["kafka.bootstrap.servers"] == "h:1" and options["kafka.fetch.min.bytes"] == "2"
    assert "kafka.linger.ms" not in options and "kafka.enable.auto.commit" not in options
    with pytest.raises(PolicyViolation, match="isolation.level"):
        spark_source_options("h:1", {"isolation.level": "read_uncommitted"}, policy_for("exactly-once"))


def test_spark_source_options_translate_a_scram_profile_to_the_java_client(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    profile = {"security.protocol": "sasl_ssl", "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "orders",
               "sasl.password": 'p"w\\', "ssl.ca.location": str(ca)}
    options = spark_source_options("h:1", profile, policy_for("exactly-once"))
    assert options["kafka.security.protocol"] == "SASL_SSL" and options["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert options["kafka.sasl.jaas.config"] == ('org.apache.kafka.common.security.scram.ScramLoginModule required '
                                                 'username="orders" password="p\\"w\\\\";')
    assert options["kafka.ssl.truststore.type"] == "PEM" and options["kafka.ssl.truststore.location"] == str(ca)
    assert not {k for k in options if k in ("kafka.sasl.username", "kafka.sasl.password", "kafka.ssl.ca.location")}


@pytest.mark.parametrize("profile, named", [
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"}, "sasl.mechanism"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}, "sasl.mechanism"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u"}, "sasl.password"),
    ({"security.protocol": "SSL", "ssl.key.location": "/k.pem"}, "ssl.key.location"),
    ({"security.protocol": "SSL", "ssl.ca.location": "/nonexistent/ca.pem"}, "ssl.ca.location"),
    ({"security.protocol": "PLAINTEXT", "sasl.username": "u"}, "sasl.username"),
    ({"security.protocol": "KERBEROS"}, "security.protocol"),
])
def test_spark_source_options_refuse_what_they_cannot_translate_by_name(profile, named):
    with pytest.raises(UsageError, match=f"cannot pass {named} "):
        spark_source_options("h:1", profile, policy_for("exactly-once"))


def test_a_plain_login_gets_the_plain_login_module():
    options = spark_source_options("h:1", {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                                           "sasl.username": "u", "sasl.password": "pw"}, policy_for("at-least-once"))
    assert options["kafka.sasl.jaas.config"].startswith("org.apache.kafka.common.security.plain.PlainLoginModule ")
    assert "kafka.ssl.truststore.location" not in options


def test_a_bad_value_names_the_property_as_typed():
    with pytest.raises(UsageError, match=r"-X linger.ms=abc"):
        new_producer(client_config(Role.PRODUCER, "b:1", {"linger.ms": "abc"}, policy_for("at-least-once")))


@pytest.mark.parametrize("argv", [
    ["consume", "{topic}", "-G", "g", "-g", "exactly-once", "-e", "-X", "isolation.level=read_uncommitted"],
    ["spark-replay", "{topic}", "-g", "exactly-once", "-X", "isolation.level=read_uncommitted"],
    ["audit", "{topic}", "-X", "isolation.level=read_uncommitted"],
    ["produce", "{topic}", "-g", "exactly-once", "--count", "5", "-X", "acks=1"],
    ["consume", "{topic}", "-G", "g", "-g", "exactly-once", "--sink", "kafka:{topic}-out", "-e", "-X", "acks=1"],
    ["consume", "{topic}", "-G", "g", "-g", "at-least-once", "--sink", "kafka:{topic}-out", "-e", "-X", "acks=1"],
], ids=["consume", "spark-replay", "audit", "produce", "kafka-sink-eos", "kafka-sink-alo"])
def test_each_command_refuses_a_weakening_property(kdg, topic, argv):
    proc = kdg(*[a.format(topic=topic) for a in argv], check=False)
    assert proc.returncode == 2, proc.stderr
    assert "refused" in proc.stderr and ("isolation.level" in proc.stderr or "acks" in proc.stderr)
    assert "Traceback" not in proc.stderr


def test_a_consumer_property_does_not_stop_produce_and_a_producer_property_does_not_stop_consume(kdg, topic, group):
    produced = as_json(kdg("produce", topic, "-g", "exactly-once", "--count", "50", "--json",
                           "-X", "fetch.min.bytes=1", "-X", "linger.ms=2"))
    assert produced["acked"] == 50
    consumed = as_json(kdg("consume", topic, "-G", group, "-g", "exactly-once", "-e", "--json",
                           "-X", "fetch.min.bytes=1", "-X", "linger.ms=2"))
    assert consumed["processed"] == 50


def test_a_transactional_call_that_outlives_its_timeout_is_given_up_not_waited_for():
    """librdkafka can wait for ever in send_offsets_to_transaction (librdkafka#5456); each guarded call runs on a
    thread of its own. Here a real init_transactions against no broker takes its whole 0.5 s timeout, and the
    guard is told to give up 0.4 s before that ends: given up at 0.1 s, as a renewable error, the client
    kept (never destroyed under the thread inside it). A call that answers in time answers for itself."""
    import time

    from confluent_kafka import KafkaException

    from kdg.errors import ProducerFatal
    from kdg.kafka.producer import KdgProducer

    stuck = KdgProducer(policy_for("exactly-once"), "127.0.0.1:9", transactional_id="kdg-stuck", init=False)
    stuck.hung_after_s = -0.4
    started = time.monotonic()
    with pytest.raises(ProducerFatal, match="did not return") as given_up:
        stuck._guarded("init_transactions", (0.5,))
    assert given_up.value.renewable and given_up.value.hung and time.monotonic() - started < 0.4
    assert stuck._stuck == [stuck._producer]
    in_time = KdgProducer(policy_for("exactly-once"), "127.0.0.1:9", transactional_id="kdg-in-time", init=False)
    with pytest.raises(KafkaException):  # its own timeout, handed back to the caller's thread
        in_time._guarded("init_transactions", (0.5,))
    assert in_time._stuck == []

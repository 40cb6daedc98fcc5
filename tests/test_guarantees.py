"""The policy table: each guarantee's exact client configuration, and refusals of weakening overrides."""

import pytest

from kdg.errors import PolicyViolation, UsageError
from kdg.guarantees import CommitMode, merge_overrides, policy_for
from kdg.kafka.clients import CONSUMER_TUNING
from kdg.kafka.producer import producer_config


def test_at_most_once_config():
    p = policy_for("at-most-once")
    cfg = producer_config(p, "b:1", {}, None)
    assert (cfg["acks"], cfg["retries"], cfg["enable.idempotence"]) == ("0", 0, False)
    assert p.consumer_config() == {"isolation.level": "read_uncommitted", "enable.auto.commit": False,
                                   "enable.auto.offset.store": False}
    assert p.commit_mode is CommitMode.BEFORE_PROCESSING and not p.dedup and not p.transactional


def test_at_least_once_config():
    p = policy_for("at-least-once")
    cfg = producer_config(p, "b:1", {}, None)
    assert cfg["acks"] == "all" and cfg["enable.idempotence"] is False
    assert cfg["max.in.flight.requests.per.connection"] == 1
    assert "retries" not in cfg  # unbounded within delivery.timeout.ms
    assert p.consumer_config()["isolation.level"] == "read_uncommitted"
    assert p.commit_mode is CommitMode.AFTER_PROCESSING and not p.dedup


def test_exactly_once_config():
    p = policy_for("exactly-once")
    cfg = producer_config(p, "b:1", {}, "tx-1")
    assert cfg["acks"] == "all" and cfg["enable.idempotence"] is True and cfg["transactional.id"] == "tx-1"
    assert cfg["max.in.flight.requests.per.connection"] <= 5
    assert p.consumer_config()["isolation.level"] == "read_committed"
    assert p.commit_mode is CommitMode.IN_SINK_TRANSACTION and p.dedup and p.transactional


def test_transactional_needs_an_id():
    with pytest.raises(UsageError):
        producer_config(policy_for("exactly-once"), "b:1", {}, None)


@pytest.mark.parametrize("key,value,guarantee", [
    ("acks", "1", "exactly-once"),
    ("enable.idempotence", "false", "exactly-once"),
    ("isolation.level", "read_uncommitted", "exactly-once"),
    ("enable.auto.commit", "true", "at-least-once"),
    ("max.in.flight.requests.per.connection", "5", "at-least-once"),
    ("retries", "3", "at-most-once"),
])
def test_weakening_override_is_refused_with_its_name(key, value, guarantee):
    p = policy_for(guarantee)
    with pytest.raises(PolicyViolation, match=key):
        merge_overrides({**p.producer_config(), **p.consumer_config()}, {key: value})


def test_harmless_overrides_pass_and_policy_keys_win():
    p = policy_for("exactly-once")
    merged = merge_overrides(p.producer_config(), {"linger.ms": "20", "acks": "all"})
    assert merged["linger.ms"] == "20" and merged["acks"] == "all"


def test_unknown_guarantee_is_a_usage_error():
    with pytest.raises(UsageError, match="exactly-once"):
        policy_for("twice")


def test_consumer_tuning_never_sets_policy_keys():
    assert not set(CONSUMER_TUNING) & set(policy_for("exactly-once").consumer_config())

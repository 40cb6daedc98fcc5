"""`kdg chaos scenario`: the failure stories of kdg's seed documents, replayed step by step.

Each scenario prints what it does and what Kafka and Postgres answered, ends with `kdg audit`,
and says whether the ending is the one the story predicts.
"""

import json
import signal
import uuid
from dataclasses import dataclass
from typing import Callable

from kdg.chaos.cell import Cell, finish
from kdg.chaos.read_anomaly import read_anomaly
from kdg.chaos.steps import audit_topic, fail_over, followers_paused, last_errors, raw_produce, replicas, say
from kdg.errors import UsageError
from kdg.stack import cluster, kafka_node
from kdg.stack.layout import HOST, StackLayout


@dataclass(frozen=True)
class Scenario:
    title: str
    run: Callable


def _crash_story(layout, echo, guarantee: str, point: str) -> dict:
    cell = Cell(layout, guarantee, "scenario", 1, 2000, "postgres")
    say(echo, f"1. produce 2000 records (exactly-once producer, so the topic holds each once) to {cell.topic}")
    cell.produce(guarantee="exactly-once")
    say(echo, f"2. consume under {guarantee}; the consumer is SIGKILLed at '{point}' in its 2nd batch")
    code, _, _ = finish(cell.consume("-e", env={"KDG_FAULT": f"{point}@2"}))
    say(echo, f"   consumer exit status {code} ({'killed' if code == -signal.SIGKILL else 'NOT killed'})")
    say(echo, "3. restart the consumer in the same group; it resumes from the committed offsets")
    finish(cell.consume("-e"))
    say(echo, "4. audit: the producer ledger against the sink table")
    return {"killed": code == -signal.SIGKILL, "audit": audit_topic(cell.topic, layout, echo)}


def commit_before_processing(layout, echo) -> tuple[bool, str, dict]:
    out = _crash_story(layout, echo, "at-most-once", "after-commit-before-process")
    a = out["audit"]
    return out["killed"] and a["lost"] > 0 and a["duplicates"] == 0, f"lost {a['lost']}, duplicates {a['duplicates']}", out


def crash_before_commit(layout, echo) -> tuple[bool, str, dict]:
    out = _crash_story(layout, echo, "at-least-once", "after-process-before-commit")
    a = out["audit"]
    return out["killed"] and a["duplicates"] > 0 and a["lost"] == 0, \
        f"duplicates {a['duplicates']}, lost {a['lost']}", out


def ack_lost_duplicate(layout, echo) -> tuple[bool, str, dict]:
    from kdg.chaos.proxy import FaultProxy

    out = {}
    for producer_guarantee in ("at-least-once", "exactly-once"):
        cell = Cell(layout, "at-least-once", "scenario", 1, 1000, "postgres")
        with FaultProxy(layout) as proxy:
            proxy.drop_produce_responses(3)
            say(echo, f"1. {producer_guarantee} producer through the fault proxy; the broker's answers to 3 produce "
                      "requests are dropped on the way back")
            cell.produce("-b", layout.proxy_bootstrap, "-X", "request.timeout.ms=2000", "-X", "socket.timeout.ms=3000",
                         guarantee=producer_guarantee)
            say(echo, f"   {proxy.dropped} acknowledgements lost; the producer timed out and sent those batches again")
            dropped = proxy.dropped
        say(echo, "2. consume at-least-once (no consumer-side dedup, so the topic's contents show through)")
        finish(cell.consume("-e"))
        out[producer_guarantee] = {"dropped": dropped, "audit": audit_topic(cell.topic, layout, echo)}
    plain, idem = out["at-least-once"], out["exactly-once"]
    ok = plain["dropped"] > 0 and idem["dropped"] > 0 and plain["audit"]["duplicates"] > 0 and \
        idem["audit"]["duplicates"] == 0
    return ok, (f"retries without idempotence duplicated {plain['audit']['duplicates']}; "
                f"the idempotent producer duplicated {idem['audit']['duplicates']}"), out


def _leader_loss(layout, echo, acks: str) -> dict:
    from kdg.kafka.admin import ensure_topic

    topic = f"scenario-acks{acks}-{uuid.uuid4().hex[:6]}"
    ensure_topic(layout.bootstrap_servers, topic, partitions=1, extra=layout.admin_properties())
    leader, followers = replicas(layout, topic)
    say(echo, f"1. acks={acks}: topic {topic}, leader broker {leader}, followers {followers}")
    with followers_paused(layout, followers, echo, step=2):
        acked, failed = raw_produce(layout, topic, 200, acks, timeout_ms=8000,
                                    bootstrap=f"{HOST}:{layout.client_port(leader)}")
        say(echo, f"3. produced 200 records to the leader: {acked} acknowledged, {failed} failed")
        kafka_node.stop(layout, leader, hard=True)
        say(echo, f"4. leader {leader} SIGKILLed before any follower copied the records")
    fail_over(layout, topic, leader, echo, step=5)
    say(echo, f"6. broker {leader} restarted, truncated its log to the new leader's and rejoined the ISR")
    return audit_topic(topic, layout, echo, sink=f"kafka:{topic}")


def acks1_leader_loss(layout, echo) -> tuple[bool, str, dict]:
    out = {acks: _leader_loss(layout, echo, acks) for acks in ("1", "all")}
    acks_1, acks_all = out["1"], out["all"]
    ok = acks_1["acked"] > 0 and acks_1["lost"] > 0 and acks_all["lost"] == 0
    return ok, (f"acks=1 lost {acks_1['lost']} of {acks_1['acked']} acknowledged records; "
                f"acks=all lost {acks_all['lost']} of {acks_all['acked']}"), out


def not_enough_replicas(layout, echo) -> tuple[bool, str, dict]:
    from kdg.kafka.admin import ensure_topic

    topic = f"scenario-minisr-{uuid.uuid4().hex[:6]}"
    ensure_topic(layout.bootstrap_servers, topic, partitions=1, extra=layout.admin_properties())
    leader, followers = replicas(layout, topic)
    for f in followers:
        kafka_node.stop(layout, f)
    say(echo, f"1. brokers {followers} stopped: 1 replica left, min.insync.replicas=2")
    acked_all, failed_all = raw_produce(layout, topic, 50, "all", timeout_ms=6000, retries=0)
    errors = dict(last_errors)
    say(echo, f"2. acks=all, no retries: {acked_all} acknowledged, {failed_all} refused with {errors} — "
              "back-pressure the producer sees, not silent loss")
    acked_one, failed_one = raw_produce(layout, topic, 50, "1", timeout_ms=6000)
    say(echo, f"3. acks=1: {acked_one} acknowledged by a lone replica — min.insync.replicas only guards acks=all")
    for f in followers:
        cluster.start_node(layout, f)
    say(echo, f"4. brokers {followers} restarted")
    out = {"acks_all": {"acked": acked_all, "failed": failed_all, "errors": errors},
           "acks_1": {"acked": acked_one, "failed": failed_one}}
    refused = errors.get("NOT_ENOUGH_REPLICAS", 0) + errors.get("NOT_ENOUGH_REPLICAS_AFTER_APPEND", 0)
    return refused == 50 and acked_one == 50, f"acks=all refused {failed_all}/50, acks=1 accepted {acked_one}/50", out


def seed_consumers(layout, echo) -> tuple[bool, str, dict]:
    """The first seed's three consumers: commit first, commit after, and Postgres idempotency keys."""
    from kdg.kafka.admin import ensure_topic

    topic = f"scenario-seed-{uuid.uuid4().hex[:6]}"
    ensure_topic(layout.bootstrap_servers, topic, partitions=1, extra=layout.admin_properties())
    say(echo, f"1. 1000 JSON messages with an 'idempotency_key' field (no kdg-id header) to {topic}")
    from kdg.kafka.clients import probe_producer
    from kdg.store.pg import Store

    run_id, rows = uuid.uuid4(), []
    producer = probe_producer(layout.bootstrap_servers, acks="all", **layout.admin_properties())
    for seq in range(1000):
        key = str(uuid.uuid4())
        producer.produce(topic, json.dumps({"idempotency_key": key, "message": f"m{seq}"}).encode())
        rows.append((run_id, key, topic, seq, "acked", 0, None, None))
    producer.flush(30)
    with Store(layout.pg_dsn) as store:
        store.copy_ledger(rows)
    out = {}
    for guarantee, point in (("at-most-once", "after-commit-before-process"),
                             ("at-least-once", "after-process-before-commit"),
                             ("exactly-once", "after-process-before-commit")):
        table = "seed_" + guarantee.replace("-", "_")
        cell = Cell(layout, guarantee, "scenario", 1, 1000, "postgres")
        cell.topic = topic
        args = ["--table", table, "--id-from", "json:idempotency_key", "-e"]
        say(echo, f"2. {guarantee} consumer into table {table}, SIGKILLed at '{point}', then restarted")
        finish(cell.consume(*args, env={"KDG_FAULT": f"{point}@2"}))
        finish(cell.consume(*args))
        out[guarantee] = audit_topic(topic, layout, echo, table=table)
    ok = out["at-most-once"]["lost"] > 0 and out["at-least-once"]["duplicates"] > 0 and \
        out["exactly-once"]["lost"] == 0 and out["exactly-once"]["duplicates"] == 0
    return ok, ("at-most-once lost {}, at-least-once duplicated {}, exactly-once lost {} and duplicated {}"
                .format(out["at-most-once"]["lost"], out["at-least-once"]["duplicates"],
                        out["exactly-once"]["lost"], out["exactly-once"]["duplicates"])), out


SCENARIOS = {
    "ack-lost-duplicate": Scenario("a lost acknowledgement makes a retry duplicate; the idempotent producer does not",
                                   ack_lost_duplicate),
    "commit-before-processing": Scenario("committing before processing loses a batch when the consumer dies",
                                         commit_before_processing),
    "crash-before-commit": Scenario("crashing after processing, before the commit, processes a batch twice",
                                    crash_before_commit),
    "acks1-leader-loss": Scenario("acks=1 loses acknowledged writes when the leader dies before replicating; "
                                  "acks=all does not", acks1_leader_loss),
    "read-anomaly": Scenario("readers stop at the high watermark: acks=1 records above it are acknowledged, "
                             "never read, and die with the leader", read_anomaly),
    "not-enough-replicas": Scenario("below min.insync.replicas, acks=all producers are refused, not silently lost",
                                    not_enough_replicas),
    "seed-consumers": Scenario("the first seed's three consumers, the last with a Postgres idempotency key",
                               seed_consumers),
}


def run_scenario(layout: StackLayout, name: str, echo=print) -> dict:
    if name not in SCENARIOS:
        raise UsageError(f"unknown scenario {name!r}; `kdg chaos scenario --list` names them")
    say(echo, f"== {name}: {SCENARIOS[name].title}")
    ok, ending, details = SCENARIOS[name].run(layout, echo)
    say(echo, f"ending: {ending} — {'as the story predicts' if ok else 'NOT as expected'}")
    return {"scenario": name, "as_expected": ok, "ending": ending, "details": details}

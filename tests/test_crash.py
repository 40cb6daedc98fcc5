"""Crash a consumer (SIGKILL at a named point in its loop), restart it, and audit.

Each guarantee must hold — and the weaker guarantees must show their anomaly, which is how we
know the kill really fired at a place that matters. `make test` runs the ``kafka:`` sink at the two
points where the guarantees part (the Postgres sink's cells at every kill point are the chaos test's
consumer-kill cells); the rest of the matrix is in the ``long`` tier.
"""

import base64
import json
import signal
import subprocess
import sys
import os
import time

import pytest
from conftest import as_json, audited

N = 3000
BATCH = 300


def _crash_and_restart(kdg, topic, group, guarantee, point, sink="postgres"):
    kdg("produce", topic, "-g", "exactly-once", "--count", N, "--size", 50, "--json")
    args = ["consume", topic, "-G", group, "-g", guarantee, "--sink", sink, "--batch-size", BATCH, "-e", "--json",
            "--transactional-id", f"tx-{group}"]
    crashed = kdg(*args, env={"KDG_FAULT": f"{point}@3"}, check=False)
    assert crashed.returncode == -signal.SIGKILL, f"the fault did not fire: {crashed.stderr}"
    kdg(*args)
    return audited(kdg, topic, *(["--sink", sink] if sink != "postgres" else []))


SINKS = [pytest.param("postgres", marks=pytest.mark.long), "kafka"]
TELLING = ("after-process-before-commit", "after-commit-before-process")  # where the weaker guarantees break


def _sink(name, topic):
    return "postgres" if name == "postgres" else f"kafka:{topic}-out"


@pytest.mark.parametrize("sink", SINKS)
def test_at_most_once_loses_when_killed_after_commit(kdg, topic, group, sink):
    audit = _crash_and_restart(kdg, topic, group, "at-most-once", "after-commit-before-process", _sink(sink, topic))
    assert audit["lost"] > 0, audit
    assert audit["duplicates"] == 0


@pytest.mark.parametrize("sink", SINKS)
def test_at_least_once_duplicates_when_killed_before_commit(kdg, topic, group, sink):
    audit = _crash_and_restart(kdg, topic, group, "at-least-once", "after-process-before-commit", _sink(sink, topic))
    assert audit["duplicates"] > 0, audit
    assert audit["lost"] == 0


@pytest.mark.parametrize("sink", SINKS)
@pytest.mark.parametrize("point", [p if p in TELLING else pytest.param(p, marks=pytest.mark.long) for p in (
    "after-poll-before-process", "after-process-before-commit", "after-commit-before-process", "during-rebalance")])
def test_exactly_once_neither_loses_nor_duplicates(kdg, topic, group, sink, point):
    if point == "during-rebalance":
        # the first assignment is the only rebalance of a lone consumer
        kdg("produce", topic, "-g", "exactly-once", "--count", N, "--json")
        args = ["consume", topic, "-G", group, "-g", "exactly-once", "--sink", _sink(sink, topic), "-e", "--json",
                "--transactional-id", f"tx-{group}"]
        assert kdg(*args, env={"KDG_FAULT": point}, check=False).returncode == -signal.SIGKILL
        kdg(*args)
        audit = audited(kdg, topic, "--sink", _sink(sink, topic))
    else:
        audit = _crash_and_restart(kdg, topic, group, "exactly-once", point, _sink(sink, topic))
    assert (audit["lost"], audit["duplicates"], audit["unexpected"]) == (0, 0, 0), audit
    assert audit["processed_unique"] == N


def test_group_of_three_with_one_killed_stays_exactly_once(kdg, stack, topic, group):
    """Three members share the partitions while records still arrive; one is SIGKILLed mid-batch."""
    env = {**os.environ, "KDG_BOOTSTRAP_SERVERS": stack.bootstrap_servers, "KDG_PG_DSN": stack.pg_dsn}
    env.pop("KDG_FAULT", None)
    cmd = [sys.executable, "-m", "kdg", "consume", topic, "-G", group, "-g", "exactly-once", "--batch-size", 100,
           "--idle-timeout", 15, "--json"]
    procs = [subprocess.Popen(list(map(str, cmd)), env={**env, **({"KDG_FAULT": "after-process-before-commit@4"}
                                                                  if i == 0 else {})},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(3)]
    time.sleep(8)  # let the group form, so every member owns a partition when records arrive
    kdg("produce", topic, "-g", "exactly-once", "--count", 9000, "--size", 50, "--rate", 1500, "--json")
    codes = [p.wait(timeout=240) for p in procs]
    assert codes[0] == -signal.SIGKILL and codes[1:] == [0, 0], [p.stderr.read() for p in procs]
    audit = audited(kdg, topic)
    assert (audit["processed_unique"], audit["lost"], audit["duplicates"]) == (9000, 0, 0), audit


def test_bad_payloads_go_to_the_dead_letter_topic_and_the_audit_balances(kdg, topic, group, tmp_path):
    lines = [json.dumps({"value": f"good {i}"}) for i in range(50)]
    lines += [json.dumps({"value": base64.b64encode(b"\xff\xfe bad bytes").decode(), "value_b64": True})] * 3
    lines += [json.dumps({"value": "x" * 2000})] * 2
    src = tmp_path / "mixed.jsonl"
    src.write_text("\n".join(lines) + "\n")
    kdg("produce", topic, "-g", "exactly-once", "--format", "json", "--file", src, "--json")
    report = as_json(kdg("consume", topic, "-G", group, "-g", "exactly-once", "--max-bytes", 1000, "-e", "--json"))
    assert (report["processed"], report["dead_lettered"]) == (50, 5)
    audit = audited(kdg, topic)
    assert (audit["acked"], audit["processed_unique"], audit["dead_lettered"]) == (55, 50, 5)
    assert (audit["lost"], audit["duplicates"]) == (0, 0)


def test_bad_input_file_sends_nothing(kdg, topic, tmp_path):
    src = tmp_path / "broken.jsonl"
    src.write_text(json.dumps({"value": "fine"}) + "\n{not json\n")
    proc = kdg("produce", topic, "--format", "json", "--file", src, check=False)
    assert proc.returncode == 2 and "broken.jsonl:2" in proc.stderr
    audit = audited(kdg, topic)  # nothing in the ledger: the topic is the truth, and it holds nothing
    assert (audit["truth"], audit["records"], audit["lost"]) == ("topic", 0, 0), audit


def test_a_kafka_sink_killed_in_its_transaction_restarts_with_its_default_transactional_id(kdg, topic, group):
    """Without --transactional-id a Kafka sink's id holds its pid, so the next run does not fence the dead
    member's transaction, and the group's offsets stay unstable until Kafka aborts it (its 30 s timeout). The
    restart used to give up reading them after 30 s (exit 6); it waits, within --wait-timeout."""
    kdg("produce", topic, "-g", "exactly-once", "--count", N, "--size", 50, "--json")
    sink = f"kafka:{topic}-out"
    args = ["consume", topic, "-G", group, "-g", "exactly-once", "--sink", sink, "--batch-size", BATCH, "-e", "--json"]
    crashed = kdg(*args, env={"KDG_FAULT": "after-process-before-commit@3"}, check=False)
    assert crashed.returncode == -signal.SIGKILL, f"the fault did not fire: {crashed.stderr}"
    kdg(*args)
    audit = audited(kdg, topic, "--sink", sink)
    assert (audit["lost"], audit["duplicates"], audit["unexpected"], audit["processed_unique"]) == (0, 0, 0, N), audit

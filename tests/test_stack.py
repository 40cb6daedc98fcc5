"""The local stack: real brokers and Postgres, checked with Kafka's own admin API."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from conftest import TEST_BROKER_PORT, TEST_PG_PORT, as_json

from kdg.kafka.admin import describe_topic, ensure_topic
from kdg.stack import cluster, kafka_node, procs
from kdg.stack.layout import StackLayout


def test_help_lists_the_commands():
    out = subprocess.run([sys.executable, "-m", "kdg", "--help"], capture_output=True, text=True, check=True).stdout
    for command in ("stack", "produce", "consume", "audit", "policy", "doctor"):
        assert command in out


def test_status_reports_three_brokers_and_postgres(kdg):
    report = as_json(kdg("stack", "status", "--json"))
    assert [b["up"] for b in report["brokers"]] == [True, True, True]
    assert report["postgres"]["up"] is True
    assert sum(b["controller"] for b in report["brokers"]) == 1  # the quorum has exactly one leader
    assert "password" not in kdg("stack", "status", "--json").stdout


def test_topic_defaults_are_durable(conn):
    ensure_topic(conn.bootstrap_servers, "durability-check", partitions=3)
    seen = describe_topic(conn.bootstrap_servers, "durability-check")
    assert seen["replication_factors"] == [3]
    assert seen["min.insync.replicas"] == 2


@pytest.mark.disrupts_stack
def test_killed_broker_is_reported_down_and_up_restores_it(kdg, stack):
    pid = kafka_node.pid(stack, 3)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while kafka_node.is_running(stack, 3) and time.monotonic() < deadline:
        time.sleep(0.1)
    down = kdg("stack", "status", "--json", check=False)
    assert down.returncode == 7
    assert [b["up"] for b in as_json(down)["brokers"]] == [True, True, False]
    kdg("stack", "up", "--json")  # with KDG_PG_DSN set, as every command here has it: the data commands' database
    status = as_json(kdg("stack", "status", "--json"))
    assert status["healthy"] is True and status["postgres"]["embedded"] is True, status  # not turned external
    assert kafka_node.pid(stack, 3) != pid


def test_doctor_passes_on_a_healthy_stack(kdg):
    report = as_json(kdg("doctor", "--json"))
    assert report["ok"], report


def test_doctor_names_the_failing_check(kdg):
    proc = kdg("doctor", "--json", "--pg-dsn", "postgresql://kdg:hunter2@127.0.0.1:1/kdg", check=False)
    assert proc.returncode == 7
    failed = [c["name"] for c in as_json(proc)["checks"] if not c["ok"]]
    assert failed == ["postgres"]
    assert "hunter2" not in proc.stdout + proc.stderr  # secrets are never printed


@pytest.mark.stack  # a stack of its own, on ports of its own
def test_single_broker_stack_and_down_leaves_nothing_running():
    """`--brokers 1`: RF 1 / min ISR 1; `down` stops every process `up` started."""
    state = Path(tempfile.mkdtemp(prefix="kdg-test-single-"))
    layout = StackLayout(state_dir=state, brokers=1, broker_port=TEST_BROKER_PORT + 1000,
                         pg_port=TEST_PG_PORT + 1000)
    try:
        cluster.up(layout, echo=lambda *a: None)
        ensure_topic(layout.bootstrap_servers, "single", partitions=2)
        seen = describe_topic(layout.bootstrap_servers, "single")
        assert seen["replication_factors"] == [1] and seen["min.insync.replicas"] == 1
    finally:
        cluster.down(layout, purge=True)
        leftovers = subprocess.run(["pgrep", "-f", str(state)], capture_output=True, text=True).stdout.split()
        shutil.rmtree(state, ignore_errors=True)  # also when `up` failed
    assert leftovers == []


def test_schema_registry_speaks_the_confluent_api_and_is_in_status(schema_registry, kdg):
    def call(path: str, body: dict | None = None):
        request = urllib.request.Request(f"{schema_registry}{path}", data=body and json.dumps(body).encode(),
                                         headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            return json.load(reply)

    assert isinstance(call("/subjects"), list)
    subject = f"s-{uuid.uuid4().hex[:10]}-value"
    avro = {"type": "record", "name": "Reading", "fields": [{"name": "celsius", "type": "double"}]}
    registered = call(f"/subjects/{subject}/versions", {"schema": json.dumps(avro)})
    assert isinstance(registered["id"], int)
    assert subject in call("/subjects")
    shown = as_json(kdg("stack", "status", "--json"))["schema_registry"]
    assert shown["url"] == schema_registry and shown["up"] is True
    assert procs.pid_matches(shown["pid"], "quarkus-run.jar")  # the registry's own live process


def test_cluster_ids_never_look_like_an_option():
    from kdg.stack.kafka_node import new_cluster_id

    ids = [new_cluster_id() for _ in range(5000)]  # one raw draw in 64 starts with '-'
    assert not [i for i in ids if i.startswith("-")] and all(len(i) == 22 for i in ids)

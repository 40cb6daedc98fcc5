"""`kdg spark-replay` on a real Spark standalone cluster, against the session's Kafka and Postgres.

The master and two workers are started by the same code as `kdg stack up --spark-workers 2`, in the
session stack's state directory (so `--master stack` and `kdg stack status` find them), and stopped by
pid when this module ends. Executors run in their own JVMs with their own Python workers and import
kdg from the zip the driver ships; each test shows it ran there, not in the driver.
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from conftest import TEST_BROKER_PORT, as_json, audited
from kdg.errors import KdgError
from kdg.kafka.admin import ensure_topic
from kdg.stack import procs, spark_cluster
from kdg.stack.layout import StackLayout
from kdg.store.pg import Store

APP_NAME = "kdg spark-replay"


@pytest.fixture(scope="module")
def spark(session_stack):
    """A master and 2 workers (1 core, 1 GiB each) beside the session stack; gone again, files and all, after."""
    try:
        spark_cluster.up(session_stack, 2, echo=lambda *a: None)
    except KdgError as exc:
        spark_cluster.down(session_stack)
        pytest.fail(f"could not start the Spark cluster: {exc}", pytrace=False)
    yield session_stack
    spark_cluster.down(session_stack)
    spark_cluster.purge(session_stack)  # the session stack has no Spark part again


def _apps(layout: StackLayout) -> dict[str, dict]:
    """Every application the master knows, running or completed, by id."""
    status = spark_cluster.master_json(layout)
    return {app["id"]: app for app in status.get("activeapps", []) + status.get("completedapps", [])}


def _executor_logs(layout: StackLayout, app_id: str) -> list[Path]:
    """Each executor's stderr for ``app_id``, in the workers' directories: ``work/<app>/<executor>/stderr``."""
    return sorted(spark_cluster.spark_dir(layout).glob(f"worker-*/work/{app_id}/*/stderr"))


def _new_apps(layout: StackLayout, before: dict) -> list[dict]:
    deadline = time.monotonic() + 30  # the master moves an application to completed shortly after it stops
    while True:
        apps = [a for i, a in _apps(layout).items() if i not in before]
        if all(a.get("state") == "FINISHED" for a in apps) or time.monotonic() > deadline:
            return apps
        time.sleep(0.5)


def _one_partition_topic(conn) -> str:
    name = f"t1-{uuid.uuid4().hex[:10]}"
    ensure_topic(conn.bootstrap_servers, name, partitions=1)
    return name


def _table() -> str:
    return f"cluster_{uuid.uuid4().hex[:8]}"


def test_a_stack_without_spark_has_no_spark_part(kdg, stack):
    """Before this module's cluster starts: the session stack, started without --spark-workers, reports
    exactly what it did before (no Spark part); `--master stack` says how to get a cluster."""
    assert spark_cluster.saved_workers(stack) is None
    assert "spark" not in as_json(kdg("stack", "status", "--json"))
    refused = kdg("spark-replay", "whatever", "--master", "stack", check=False)
    assert refused.returncode == 2 and "has no Spark cluster" in refused.stderr, refused.stderr
    with tempfile.TemporaryDirectory() as empty:
        proc = kdg("spark-replay", "whatever", "--master", "stack", env={"KDG_STATE_DIR": empty}, check=False)
    assert proc.returncode == 2 and "no local stack" in proc.stderr, proc.stderr


def test_stack_up_with_spark_workers_status_and_down(kdg, stack):
    """`kdg stack up --spark-workers 1` on a small stack of its own: status shows the master and the worker
    (and a dead worker as down, exit 7), `up` brings it back, `down` stops every process it started."""
    state = Path(tempfile.mkdtemp(prefix="kdg-test-spark-stack-"))
    env = {"KDG_STATE_DIR": str(state)}
    port = TEST_BROKER_PORT + 50
    layout = StackLayout(state_dir=state, brokers=1, broker_port=port, external_pg_dsn=stack.pg_dsn)
    try:
        up = as_json(kdg("stack", "up", "--brokers", 1, "--broker-port", port, "--pg-dsn", stack.pg_dsn,
                         "--spark-workers", 1, "--json", env=env))
        spark = up["spark"]
        assert spark["master_url"] == f"spark://127.0.0.1:{port + 600}" and spark["master_up"], spark
        assert [(w["worker"], w["up"]) for w in spark["workers"]] == [(1, True)], spark
        assert spark_cluster.master_json(layout)["aliveworkers"] == 1
        pids = [spark["master_pid"], spark["workers"][0]["pid"]]
        text = kdg("stack", "status", env=env).stdout
        assert "spark master" in text and f"spark://127.0.0.1:{port + 600}" in text and "spark worker 1" in text

        os.kill(pids[1], 9)
        deadline = time.monotonic() + 10
        while procs.pid_matches(pids[1], str(state)) and time.monotonic() < deadline:
            time.sleep(0.1)
        down = kdg("stack", "status", "--json", env=env, check=False)
        assert down.returncode == 7 and as_json(down)["spark"]["workers"][0]["up"] is False
        again = as_json(kdg("stack", "up", "--json", env=env))  # remembers the Spark part
        assert again["healthy"] and again["spark"]["workers"][0]["up"], again
        pids.append(again["spark"]["workers"][0]["pid"])

        stopped = as_json(kdg("stack", "down", "--purge", "--json", env=env))
        assert stopped["spark"] == ["worker-1", "master"] and stopped["brokers"] == [1], stopped
        alive = [p for p in pids if procs.process_state(p) not in (None, "Z")]
        assert alive == [], alive
    finally:
        kdg("stack", "down", "--purge", env=env, check=False)
        leftovers = subprocess.run(["pgrep", "-f", str(state)], capture_output=True, text=True).stdout.split()
        subprocess.run(["rm", "-rf", str(state)])
    assert leftovers == []


# Runs in a process of its own, as a caller of kdg's library would: a replay that succeeds and one that
# fails on the executors, then what the two left behind in that process.
_IN_PROCESS = textwrap.dedent("""
    import json, os, sys, tempfile
    from pathlib import Path
    from kdg.errors import KdgError
    from kdg.replay import ReplayRequest, run_spark_replay
    from kdg.settings import Connection

    topic, keyless, table, local_dir = sys.argv[1:5]
    conn = Connection(bootstrap_servers=os.environ["KDG_BOOTSTRAP_SERVERS"], pg_dsn=os.environ["KDG_PG_DSN"])
    env, path = dict(os.environ), list(sys.path)
    conf = {"spark.local.dir": local_dir}  # the driver's own copy of the zip goes there
    out = {}
    report = run_spark_replay(ReplayRequest(topic=topic, guarantee="exactly-once", conn=conn, table=table,
                                            master="stack", spark_conf=conf, echo=lambda _: None))
    out["report"] = report.to_dict()
    try:
        run_spark_replay(ReplayRequest(topic=keyless, guarantee="exactly-once", conn=conn, table=table + "_k",
                                       master="stack", spark_conf=conf | {"spark.cores.max": "1"},  # 1 executor
                                       echo=lambda _: None))
    except KdgError as exc:
        out["failed"] = str(exc)
    out["env_changed"] = sorted(k for k in set(env) | set(os.environ) if env.get(k) != os.environ.get(k))
    out["path_added"] = [p for p in sys.path if p not in path]
    out["left_behind"] = [str(p) for p in Path(tempfile.gettempdir()).rglob("*") if "kdg" in p.name]
    print(json.dumps(out))
""")


@pytest.mark.long  # make test budget: the cluster replays of test_a_python_worker_killed_mid_write stay
def test_exactly_once_on_the_cluster_leaves_nothing_behind_in_the_caller(kdg, spark, conn, topic):
    """Each key once and the audit balanced; the application ran on the workers' executors with the shipped
    kdg zip; afterwards the caller's environment and sys.path are as before and no temp zip is left,
    also after a replay that failed on the executors."""
    kdg("produce", topic, "-g", "exactly-once", "--count", 3000, "--id", f"{topic}-{{seq}}")
    keyless = _one_partition_topic(conn)
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": conn.bootstrap_servers, "log_level": 2})
    for _ in range(20):
        producer.produce(keyless, b"no key")
    producer.flush(30)
    table = _table()
    before = _apps(spark)
    with tempfile.TemporaryDirectory(prefix="kdg-cluster-caller-") as tmp:
        scratch = Path(tmp) / "tmp"
        scratch.mkdir()
        env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "KDG_FAULT")}
        env |= {"KDG_BOOTSTRAP_SERVERS": conn.bootstrap_servers, "KDG_PG_DSN": conn.pg_dsn,
                "KDG_STATE_DIR": str(spark.state_dir), "TMPDIR": str(scratch)}
        proc = subprocess.run([sys.executable, "-c", _IN_PROCESS, topic, keyless, table, str(Path(tmp) / "local")],
                              capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout.splitlines()[-1])
        leftover_zips = [str(p) for p in Path(tmp).rglob("*.zip")]
    report = out["report"]
    assert (report["rows_read"], report["rows_written"], report["duplicates_dropped"]) == (3000, 3000, 0), report
    assert "no kdg-id header" in out["failed"], out
    with Store(conn.pg_dsn) as store:
        assert store.fetchval(f"SELECT count(DISTINCT idempotency_key) FROM {table}") == 3000
        assert store.fetchval(f"SELECT count(*) FROM {table}") == 3000
    audit = audited(kdg, topic, "--table", table)
    assert audit["balanced"] and audit["rows"] == 3000, audit

    # the caller's process: env (PYSPARK_PYTHON included) and sys.path as before, no kdg zip or scratch folder
    assert out["env_changed"] == [] and out["path_added"] == [], out
    assert out["left_behind"] == [] and leftover_zips == [], (out, leftover_zips)

    # it ran on the cluster: two applications on the master, each with executors on the workers
    apps = _new_apps(spark, before)
    assert [a["name"] for a in apps] == [APP_NAME, APP_NAME], apps
    for app in apps:
        logs = _executor_logs(spark, app["id"])
        assert len(logs) >= 1, app
        assert any("Running task" in log.read_text(errors="replace") for log in logs), app
    # and the executors' Python ran the shipped zip's code: the failed task's traceback names it
    failed_app = max(apps, key=lambda a: a["starttime"])
    tracebacks = "".join(log.read_text(errors="replace") for log in _executor_logs(spark, failed_app["id"]))
    assert "KeylessRecord" in tracebacks and "kdg.zip/kdg/spark/writer.py" in tracebacks


# at-least-once's duplicates for a killed task are also test_spark_replay's test_a_task_that_dies_mid_write (make test)
@pytest.mark.parametrize("guarantee", ["exactly-once", pytest.param("at-least-once", marks=pytest.mark.long)])
def test_a_python_worker_killed_mid_write_on_an_executor(kdg, spark, conn, guarantee):
    """The existing fault, on the cluster: the first task's Python worker, on an executor, is SIGKILLed after
    its first chunk committed; Spark retries the task. Exactly-once: each key once. At-least-once: the
    retried chunk twice."""
    topic = _one_partition_topic(conn)
    kdg("produce", topic, "-g", "at-least-once", "--count", 1000)  # offsets 0..999, no transaction markers
    table, group = _table(), f"g-{uuid.uuid4().hex[:8]}"
    proc = kdg("spark-replay", topic, "-g", guarantee, "-G", group, "--table", table, "--chunk-rows", 100,
               "--master", "stack", "--json", env={"KDG_FAULT": "spark-task-mid-write"}, check=False, timeout=600)
    assert proc.returncode == 0, proc.stderr
    # the fault fired, on an executor (never the driver), and Spark retried the task
    failed = re.search(r"spark: task 0 failed \(attempt 1 of 4; Spark retries it\) — details in (\S+)", proc.stderr)
    assert failed, proc.stderr
    lost = [line for line in Path(failed.group(1)).read_text(errors="replace").splitlines()
            if "Lost task 0.0 in stage" in line]
    assert lost and re.search(r"\(127\.0\.0\.1 executor \d+\): .*Python worker exited unexpectedly", lost[0]), lost

    report = as_json(proc)
    audit = audited(kdg, topic, "--table", table)
    with Store(conn.pg_dsn) as store:
        keys = store.fetchval(f"SELECT count(DISTINCT idempotency_key) FROM {table}")
        rows = store.fetchval(f"SELECT count(*) FROM {table}")
        stored = store.stored_offsets(group, topic)
    assert stored == {0: 1000} and keys == 1000
    if guarantee == "exactly-once":
        assert report["duplicates_dropped"] == 100 and report["rows_written"] == 900, report
        assert rows == 1000 and (audit["lost"], audit["duplicates"]) == (0, 0), audit
    else:
        assert rows == 1100 and (audit["lost"], audit["duplicates"]) == (0, 100), audit  # the chunk, again


@pytest.mark.long  # make test budget: the stream's driver kill is test_spark_stream's, the executor kill replay's
def test_spark_stream_on_the_cluster_through_an_executor_kill_and_a_driver_kill(kdg, spark, conn, tmp_path):
    """kdg spark-stream exactly-once with --master stack: a Python worker killed on an executor mid-batch (Spark
    retries the task), then the driver killed after writing a micro-batch (restarted from its checkpoint, Spark
    runs that batch again): every key once."""
    topic = _one_partition_topic(conn)
    kdg("produce", topic, "-g", "at-least-once", "--count", 1000)
    table, group = _table(), f"g-{uuid.uuid4().hex[:8]}"
    args = ("spark-stream", topic, "-G", group, "-g", "exactly-once", "--table", table, "--master", "stack",
            "--checkpoint", tmp_path / "checkpoint", "--max-per-batch", 400, "--chunk-rows", 100, "--trigger",
            "available-now", "--json")
    first = kdg(*args, env={"KDG_FAULT": "spark-task-mid-write"}, timeout=600)
    assert re.search(r"spark: task 0 failed \(attempt 1 of 4; Spark retries it\)", first.stderr), first.stderr
    assert json.loads(first.stdout.splitlines()[-1])["duplicates_dropped"] == 100  # the retried task's first chunk

    kdg("produce", topic, "-g", "at-least-once", "--count", 1000)
    killed = kdg(*args, env={"KDG_FAULT": "spark-stream-before-positions@2"}, check=False, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    again = [json.loads(line) for line in kdg(*args, timeout=600).stdout.splitlines()]
    assert again[0]["duplicates_dropped"] == again[0]["rows_in"] > 0, again  # the killed batch, claimed already
    audit = audited(kdg, topic, "--table", table, "-G", group)
    assert (audit["lost"], audit["duplicates"], audit["pending"], audit["rows"]) == (0, 0, 0, 2000), audit

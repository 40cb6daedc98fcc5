"""Many topics into many tables on Spark (issue 45): `spark-stream --topic-pattern` and `spark-replay t1 t2`.

Each topic's records go to the table its route names (``--table`` templates); under exactly-once a
driver killed between writing a micro-batch and storing its positions leaves every table 0 lost, 0
duplicated, per table.
"""

import json
import signal
import subprocess
import sys
import uuid

from conftest import as_json, audited
from kdg.kafka.admin import ensure_topic

DRIVER_KILL = {"KDG_FAULT": "spark-stream-before-positions@2"}  # the second micro-batch, once written


def _topics(conn, *names: str, partitions: int = 2) -> None:
    for name in names:
        ensure_topic(conn.bootstrap_servers, name, partitions=partitions)


def _lines(proc) -> list[dict]:
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def test_a_pattern_stream_into_two_tables_survives_a_driver_kill(kdg, conn, group, tmp_path):
    """Two topics a pattern takes, each into its table (``{1}``); the driver killed once the second batch is
    written, before its positions are stored; the restart finds that batch's keys claimed: 0/0 per table."""
    prefix = f"sm{uuid.uuid4().hex[:8]}"
    a, b = f"{prefix}.a", f"{prefix}.b"
    _topics(conn, a, b)
    kdg("produce", a, "-g", "at-least-once", "--count", 600)  # no transaction markers: batches as planned
    kdg("produce", b, "-g", "at-least-once", "--count", 400)
    stream = ("spark-stream", "--topic-pattern", rf"{prefix}\.(a|b)", "-G", group, "-g", "exactly-once",
              "--table", prefix + "_{1}", "--checkpoint", tmp_path / "checkpoint", "--max-per-batch", 400,
              "--trigger", "available-now", "--json")

    killed = kdg(*stream, env=DRIVER_KILL, check=False, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    [first] = _lines(killed)  # the second batch died before it was reported
    assert all("/" in k for k in first["next_offsets"]), first  # positions by TOPIC/PARTITION

    *batches, report = _lines(kdg(*stream, timeout=600))
    assert report["started_from"] == "checkpoint" and report["stopped_by"] == "end of available data", report
    rerun = batches[0]  # Spark's batch 1 again: written before the kill, so every key is found claimed
    assert rerun["batch_id"] == 1 and rerun["rows_in"] > 0 and rerun["duplicates_dropped"] == rerun["rows_in"], rerun
    assert sum(x["rows_in"] for x in batches) == 1000 - first["rows_in"], batches
    tables = {t: (e["topics"], e["rows_read"]) for t, e in report["tables"].items()}
    assert sum(e["rows_written"] + e["duplicates_dropped"] for e in report["tables"].values()) == report["rows_in"]
    assert tables == {f"public.{prefix}_a": ([a], 600 - _of(first, a)),
                      f"public.{prefix}_b": ([b], 400 - _of(first, b))}, report["tables"]
    for topic, table, count in ((a, f"{prefix}_a", 600), (b, f"{prefix}_b", 400)):
        found = audited(kdg, topic, "--table", table, "-G", group)
        assert (found["lost"], found["duplicates"], found["pending"], found["rows"]) == (0, 0, 0, count), found


def _of(batch: dict, topic: str) -> int:
    """Records of ``topic`` a batch took: what its positions moved by (the first batch starts at 0)."""
    return sum(n for k, n in batch["next_offsets"].items() if k.startswith(topic + "/"))


def test_replay_of_two_topics_into_two_tables_in_one_job(kdg, conn, group):
    prefix = f"sr{uuid.uuid4().hex[:8]}"
    a, b = f"{prefix}_a", f"{prefix}_b"
    _topics(conn, a, b)
    kdg("produce", a, "-g", "exactly-once", "--count", 500)
    kdg("produce", b, "-g", "exactly-once", "--count", 300)
    report = as_json(kdg("spark-replay", a, b, "-G", group, "-g", "exactly-once", "--table", "r_{topic}", "--json",
                         timeout=600))
    assert (report["topic"], report["rows_read"], report["rows_written"]) == (f"{a},{b}", 800, 800), report
    assert {t: (e["topics"], e["rows_written"]) for t, e in report["tables"].items()} == {
        f"public.r_{a}": ([a], 500), f"public.r_{b}": ([b], 300)}, report["tables"]
    for topic, count in ((a, 500), (b, 300)):
        found = audited(kdg, topic, "--table", f"r_{topic}", "-G", group)
        assert (found["lost"], found["duplicates"], found["pending"], found["rows"]) == (0, 0, 0, count), found


def test_bad_routes_are_one_error_line_before_anything_runs(tmp_path):
    """Offline: refused while the command line is read (no Kafka, no Spark)."""
    overlap = tmp_path / "overlap.toml"
    overlap.write_text('[[route]]\nname = "one"\ntopics = ["x.a"]\n\n'
                       '[[route]]\nname = "two"\ntopic_pattern = \'x\\..*\'\ntable = "t_{topic}"\n')
    cases = [(("spark-replay", "a", "--table", "t_{nope}"), "unknown field {nope}"),
             (("spark-stream", "--pipeline", overlap, "-G", "g"), "taken by two routes, one and two"),
             (("spark-stream", "a", "-G", "g", "--table", "t.{source.table}", "--envelope", "debezium",
               "--column", "id bigint = json:id"), "only kdg consume does for now")]
    for argv, says in cases:
        proc = subprocess.run([sys.executable, "-m", "kdg", *map(str, argv)], capture_output=True, text=True,
                              env={"KDG_BOOTSTRAP_SERVERS": "127.0.0.1:1", "KDG_PG_DSN": "postgresql://u@127.0.0.1:1/d",
                                   "KDG_WAIT_TIMEOUT": "1", "PATH": "/usr/bin:/bin"}, timeout=60)
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
        assert proc.returncode == 2 and len(errors) == 1 and says in errors[0], (argv, proc.stderr)

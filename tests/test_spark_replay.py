"""`kdg spark-replay` on a real local Spark against the real test stack.

Each guarantee test also shows the weaker guarantee's anomaly, so the fault is known to be real.
"""

import subprocess
import sys
import uuid

import pytest

from conftest import as_json, audited
from kdg.kafka.admin import ensure_topic
from kdg.store.pg import Store


def _table() -> str:
    return f"replay_{uuid.uuid4().hex[:8]}"


def _one_partition_topic(conn) -> str:
    name = f"t1-{uuid.uuid4().hex[:10]}"
    ensure_topic(conn.bootstrap_servers, name, partitions=1)
    return name


def _audit(kdg, topic, table) -> dict:
    return audited(kdg, topic, "--table", table)


def _replay(kdg, topic, *args, env=None, check=True):
    return kdg("spark-replay", topic, *args, "--json", env=env, check=check, timeout=600)


@pytest.mark.long  # make test budget: a range replayed again adds nothing in make demo's replay (test_demo_output)
def test_exactly_once_replay_twice_adds_nothing_the_second_time(kdg, topic):
    kdg("produce", topic, "-g", "exactly-once", "--count", 3000, "--id", f"{topic}-{{seq}}")
    table = _table()
    first = as_json(_replay(kdg, topic, "-g", "exactly-once", "--table", table))
    assert (first["rows_read"], first["rows_written"], first["duplicates_dropped"]) == (3000, 3000, 0)
    assert first["rows_per_s"] > 0 and first["tasks"] >= 1
    again = as_json(_replay(kdg, topic, "-g", "exactly-once", "--table", table))
    assert (again["rows_read"], again["rows_written"], again["duplicates_dropped"]) == (3000, 0, 3000)
    audit = _audit(kdg, topic, table)
    assert audit["balanced"] and audit["rows"] == 3000, audit

    # the weaker guarantee, same range twice: every record twice
    plain = _table()
    for _ in range(2):
        _replay(kdg, topic, "-g", "at-least-once", "--table", plain)
    audit = _audit(kdg, topic, plain)
    assert (audit["lost"], audit["duplicates"]) == (0, 3000), audit


def test_replay_over_what_consume_wrote_and_from_stored_offsets(kdg, conn, topic, group):
    kdg("produce", topic, "-g", "exactly-once", "--count", 2000)
    table = _table()
    kdg("consume", topic, "-G", group, "-g", "exactly-once", "--table", table, "-c", 800)
    kdg("produce", topic, "-g", "exactly-once", "--count", 1000)
    kdg("doctor", "--topic", topic, "--group", f"doctor-{group}")  # its probe record (no kdg-id) is stepped over

    rest = as_json(_replay(kdg, topic, "-g", "exactly-once", "-G", group, "--from", "stored", "--table", table))
    assert (rest["rows_read"], rest["rows_written"], rest["probes_skipped"]) == (3001 - 800, 2200, 1), rest
    assert _audit(kdg, topic, table)["balanced"]  # a whole range replayed again adds nothing: make demo's second run

    # the group's stored offsets now stand at the end: nothing is left to replay
    nothing = _replay(kdg, topic, "-g", "exactly-once", "-G", group, "--from", "stored", "--table", table, check=False)
    assert nothing.returncode == 2 and "nothing to replay" in nothing.stderr
    with Store(conn.pg_dsn) as store:
        runs = store.fetch("SELECT status, ranges FROM kdg_replays WHERE consumer_group = $1 ORDER BY started_at",
                           group)
    assert [r["status"] for r in runs] == ["done"]  # the refused second run recorded nothing


# make test budget: exactly-once's run is long; make demo's replay (test_demo_output) kills the same task under
# exactly-once and checks the retry dropped what the dead attempt wrote, and the audit 0/0/0; at-least-once's
# run here checks the run's record and stored offsets after the retry, and is the weaker guarantee's anomaly
# (duplicates); at-most-once's range lost to a dead task without retries is long (a Spark JVM, 69 s)
@pytest.mark.parametrize("guarantee", [pytest.param("exactly-once", marks=pytest.mark.long), "at-least-once",
                                       pytest.param("at-most-once", marks=pytest.mark.long)])
def test_a_task_that_dies_mid_write(kdg, conn, guarantee):
    """The Python worker of the first task is SIGKILLed after its first chunk committed, on its first attempt."""
    topic = _one_partition_topic(conn)
    kdg("produce", topic, "-g", "at-least-once", "--count", 1000)  # no transaction markers: offsets 0..999
    table, group = _table(), f"g-{uuid.uuid4().hex[:8]}"
    proc = _replay(kdg, topic, "-g", guarantee, "-G", group, "--table", table, "--chunk-rows", 100,
                   env={"KDG_FAULT": "spark-task-mid-write"}, check=False)
    audit = _audit(kdg, topic, table)
    with Store(conn.pg_dsn) as store:
        run = store.fetch("SELECT status, error FROM kdg_replays WHERE consumer_group = $1", group)[0]
        stored = store.stored_offsets(group, topic)
    if guarantee == "exactly-once":
        report = as_json(proc)
        assert report["duplicates_dropped"] == 100  # the retry re-claimed the chunk the dead attempt wrote
        assert (audit["lost"], audit["duplicates"]) == (0, 0), audit
        assert (run["status"], stored) == ("done", {0: 1000})
    elif guarantee == "at-least-once":
        assert proc.returncode == 0, proc.stderr
        assert audit["lost"] == 0 and audit["duplicates"] == 100, audit  # the retry wrote the first chunk again
        assert (run["status"], stored) == ("done", {0: 1000})
    else:
        assert proc.returncode == 6 and "retries are off" in proc.stderr, proc.stderr
        assert audit["duplicates"] == 0 and audit["lost"] == 900, audit  # only the first chunk made it
        assert run["status"] == "done" and run["error"], run  # recorded as done BEFORE writing: the range is lost
        assert stored == {0: 1000}


@pytest.mark.long  # make test budget: the source's read_committed is test_clients' (spark_source_options)
def test_aborted_transactions_are_never_replayed_under_exactly_once(kdg, conn):
    from confluent_kafka import Producer

    topic = _one_partition_topic(conn)
    producer = Producer({"bootstrap.servers": conn.bootstrap_servers, "transactional.id": f"txn-{topic}",
                         "log_level": 2})
    producer.init_transactions(30)
    for outcome in ("aborted", "committed"):
        producer.begin_transaction()
        for seq in range(200):
            producer.produce(topic, b"v", headers=[("kdg-id", f"{outcome}-{seq}".encode())])
        producer.flush(30)
        if outcome == "aborted":
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)

    def keys(table):
        with Store(conn.pg_dsn) as store:
            return {r["idempotency_key"].split("-")[0] for r in store.fetch(f"SELECT idempotency_key FROM {table}")}

    committed = _table()
    report = as_json(_replay(kdg, topic, "-g", "exactly-once", "--table", committed))
    assert report["rows_written"] == 200 and keys(committed) == {"committed"}
    uncommitted = _table()  # read_uncommitted shows what an aborted transaction left in the log
    report = as_json(_replay(kdg, topic, "-g", "at-least-once", "--table", uncommitted))
    assert report["rows_written"] == 400 and keys(uncommitted) == {"aborted", "committed"}


@pytest.mark.long  # make test budget: four Spark runs (280 s with every worker busy)
def test_records_without_a_key_stop_exactly_once_but_not_the_weaker_guarantees(kdg, conn):
    from confluent_kafka import Producer

    topic = _one_partition_topic(conn)
    producer = Producer({"bootstrap.servers": conn.bootstrap_servers, "log_level": 2})
    for seq in range(50):  # the amount is a JSON number written with a trailing zero
        producer.produce(topic, f'{{"order": "o-{seq % 25}", "ref": {{"amount": {seq % 25}.50}}}}'.encode())
    producer.flush(30)
    refused = _replay(kdg, topic, "-g", "exactly-once", "--table", _table(), check=False)
    assert refused.returncode == 2 and "no kdg-id header" in refused.stderr, refused.stderr
    keyed = as_json(_replay(kdg, topic, "-g", "exactly-once", "--table", _table(), "--id-from", "json:order"))
    assert (keyed["rows_read"], keyed["rows_written"], keyed["duplicates_dropped"]) == (50, 25, 25)
    # a JSON Pointer, read by the executors with kdg consume's own resolver: the number as written
    replayed, consumed = _table(), _table()
    keyed = as_json(_replay(kdg, topic, "-g", "exactly-once", "--table", replayed, "--id-from", "json:/ref/amount"))
    assert (keyed["rows_read"], keyed["rows_written"], keyed["duplicates_dropped"]) == (50, 25, 25)
    kdg("consume", topic, "-G", f"g-{uuid.uuid4().hex[:8]}", "-g", "exactly-once", "-e", "--table", consumed,
        "--id-from", "json:/ref/amount")
    with Store(conn.pg_dsn) as store:
        found = [{r["k"] for r in store.fetch(f"SELECT idempotency_key AS k FROM {t}")} for t in (replayed, consumed)]
    assert found[0] == found[1] == {f"{n}.50" for n in range(25)}, found
    plain = as_json(_replay(kdg, topic, "-g", "at-least-once", "--table", _table()))
    assert plain["rows_written"] == 50  # keyed by topic/partition/offset


def test_bad_input_is_refused_before_spark_starts_and_records_nothing(kdg, conn, topic, group):
    kdg("produce", topic, "-g", "at-least-once", "--count", 30, "--no-ledger")
    cases = {
        ("does-not-exist-topic",): (2, "does not exist"),
        (topic, "--from", "0:99999"): (2, "past the end"),
        (topic, "--to", "7:1"): (2, "no partition 7"),
        (topic, "--from", "latest"): (2, "nothing to replay"),
        (topic, "--from", "yesterday"): (2, "--from 'yesterday'"),
        (topic, "--table", "Robert'); DROP TABLE x"): (2, "must match"),
        (topic, "--id-from", "header:a'b"): (2, "--id-from"),
        (topic, "--conf", "spark.task.maxFailures=9"): (2, "spark.task.maxFailures"),
        (topic, "--pg-dsn", "postgresql://kdg:s3cret-pw@127.0.0.1:1/kdg"): (5, "cannot reach Postgres"),
    }
    for args, (code, message) in cases.items():
        proc = _replay(kdg, *args, "-G", group, env={"KDG_WAIT_TIMEOUT": "1"}, check=False)  # Postgres: 1 s, not 60
        assert proc.returncode == code and message in proc.stderr, (args, proc.returncode, proc.stderr)
        assert "Traceback" not in proc.stderr and "s3cret-pw" not in proc.stderr + proc.stdout
    with Store(conn.pg_dsn) as store:
        assert store.fetchval("SELECT count(*) FROM kdg_replays WHERE consumer_group = $1", group) == 0


def test_records_deleted_from_the_log_are_named_not_skipped(kdg, conn):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    topic = _one_partition_topic(conn)
    kdg("produce", topic, "-g", "at-least-once", "--count", 100, "--no-ledger")
    admin = AdminClient({"bootstrap.servers": conn.bootstrap_servers})
    for future in admin.delete_records([TopicPartition(topic, 0, 40)]).values():
        future.result(30)
    proc = _replay(kdg, topic, "-g", "exactly-once", "--from", "0:0", "--table", _table(), check=False)
    assert proc.returncode == 2 and "no longer in the log" in proc.stderr and "starts at 40" in proc.stderr
    report = as_json(_replay(kdg, topic, "-g", "exactly-once", "--table", _table()))  # earliest = 40
    assert report["rows_read"] == 60 and report["partitions"] == {"0": {"from": 40, "to": 100}}


_MAPPED = """
import sys
from pyspark import SparkContext
from kdg.spark.classes import archive_path
from kdg.spark.session import spark_session
with spark_session("local[1]", task_retries=False, echo=lambda *a: None) as run:
    maps = open(f"/proc/{SparkContext._gateway.proc.pid}/maps").read()
    print(str(archive_path()) in maps)
"""


@pytest.mark.stack  # a Spark JVM: not in the pure tier
def test_the_driver_jvm_maps_the_class_archive_that_stack_fetch_made(kdg):
    """`kdg stack fetch` makes Spark's class archive (kdg.spark.classes), and a Spark session's JVM really maps
    it: a JVM that refused it (another class path, another Java) would start as slowly as before, silently."""
    fetched = kdg("stack", "fetch")
    assert "Spark class archive in " in fetched.stdout, fetched.stdout
    proc = subprocess.run([sys.executable, "-c", _MAPPED], capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip().splitlines()[-1:] == ["True"], (proc.stdout, proc.stderr[-2000:])


def test_the_class_archive_is_used_when_there_and_can_be_turned_off(monkeypatch, tmp_path):
    from kdg.spark import classes

    monkeypatch.setenv("KDG_CACHE", str(tmp_path))
    monkeypatch.delenv(classes.OFF_ENV, raising=False)
    assert classes.java_options() == ""  # none made in this cache
    classes.archive_path().parent.mkdir(parents=True)
    classes.archive_path().write_bytes(b"")
    assert classes.java_options() == f'-XX:SharedArchiveFile="{classes.archive_path()}"'
    monkeypatch.setenv(classes.OFF_ENV, "off")
    assert classes.java_options() == ""

"""`kdg spark-stream` on a real local Spark against the real test stack.

The driver is killed between writing a micro-batch and storing its positions (``KDG_FAULT``), the
point where Spark runs the batch again on restart: exactly-once ends 0/0, at-least-once shows the
batch twice, so the fault is known to be real.
"""

import json
import shutil
import signal
import time
import uuid

import pytest

from conftest import audited
from kdg.store.pg import Store
from test_typed_sink import UPSERT_TABLE, create, expected_row, mapping_file, produce_orders, rows

DRIVER_KILL = {"KDG_FAULT": "spark-stream-before-positions@2"}  # the second micro-batch, once written


def _stream(kdg, topic, group, *args, env=None, check=True):
    return kdg("spark-stream", topic, "-G", group, *args, "--json", env=env, check=check, timeout=600)


def _lines(proc) -> list[dict]:
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("guarantee,repeats", [("exactly-once", False), ("at-least-once", True)])
def test_a_driver_killed_after_writing_a_batch_then_a_lost_checkpoint(kdg, topic, group, tmp_path, guarantee,
                                                                            repeats):
    kdg("produce", topic, "-g", "at-least-once", "--count", 1500)  # no transaction markers: ~500 records a batch
    table, checkpoint = f"stream_{uuid.uuid4().hex[:8]}", tmp_path / "checkpoint"
    common = ("-g", guarantee, "--table", table, "--checkpoint", checkpoint, "--max-per-batch", 500,
              "--trigger", "available-now")
    killed = _stream(kdg, topic, group, *common, env=DRIVER_KILL, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    [first] = _lines(killed)  # the second batch died before it was reported

    again = _stream(kdg, topic, group, *common)
    *batches, report = _lines(again)
    assert report["started_from"] == "checkpoint" and report["stopped_by"] == "end of available data", report
    assert sum(b["rows_in"] for b in batches) == 1500 - first["rows_in"], batches  # the killed batch again, the rest
    rerun = batches[0]  # Spark's batch 1 again, from its offset log: its rows were written before the kill
    assert rerun["batch_id"] == 1 and rerun["duplicates_dropped"] == (0 if repeats else rerun["rows_in"])
    assert batches[-1]["lag"] and not any(batches[-1]["lag"].values()), batches[-1]
    audit = audited(kdg, topic, "--table", table, "-G", group)
    assert (audit["lost"], audit["duplicates"], audit["pending"]) == (0, rerun["rows_in"] if repeats else 0, 0), audit
    if repeats:
        return

    # the checkpoint lost: the stream starts from the group's positions in kdg_offsets, nothing twice
    shutil.rmtree(checkpoint)
    kdg("produce", topic, "-g", "at-least-once", "--count", 300)
    *_, report = _lines(_stream(kdg, topic, group, *common))
    assert (report["started_from"], report["rows_in"], report["rows_written"]) == ("kdg_offsets", 300, 300), report
    audit = audited(kdg, topic, "--table", table, "-G", group)
    assert (audit["lost"], audit["duplicates"], audit["rows"]) == (0, 0, 1800), audit


def test_members_looking_for_a_stream_see_none_but_a_stream(conn, group):
    """Each `kdg consume` member asks whether a Spark stream reads its group (``Store.stream_running``), and
    members started together ask at once. Four asking 150 times each at once never see a stream; a stream
    taking and letting go of its lock meanwhile always gets it; once it holds it, every member sees it.
    (Asking by taking the lock for an instant failed both ways: a member of three started together exited 2,
    "kdg spark-stream is reading".)"""
    from concurrent.futures import ThreadPoolExecutor

    from kdg.store.offsets import _STREAM_LOCK

    topic = f"t-{uuid.uuid4().hex[:8]}"
    stores = [Store(conn.pg_dsn) for _ in range(5)]
    members, stream = stores[:4], stores[4]
    try:
        def look(store) -> int:
            return sum(store.stream_running(group, topic) for _ in range(150))

        def stream_comes_and_goes() -> int:
            taken = 0
            for _ in range(60):
                taken += stream.hold_stream(group, topic)
                stream.fetchval("SELECT pg_advisory_unlock($1, hashtext($2))", _STREAM_LOCK, f"{group}/{topic}")
            return taken

        with ThreadPoolExecutor(5) as pool:
            seen = list(pool.map(look, members))
            assert seen == [0, 0, 0, 0], f"members saw a stream where none ran: {seen}"
            looking = [pool.submit(look, m) for m in members]
            assert stream_comes_and_goes() == 60, "a member's look kept a stream from its lock"
            for f in looking:
                f.result()
        assert stream.hold_stream(group, topic)
        assert [m.stream_running(group, topic) for m in members] == [True] * 4
        assert not members[0].stream_running(group, f"{topic}-other")  # another topic's lock is not this one's
    finally:
        for store in stores:
            store.close()


def test_handoff_consume_stream_consume_with_a_kill_in_each(kdg, kdg_spawn, conn, topic, group, tmp_path):
    """One group, three pipelines in turn, each killed once mid-way and started again: nothing lost or repeated.
    While the stream runs, `kdg consume` on its group is refused, and a second stream too."""
    table, checkpoint = f"handoff_{uuid.uuid4().hex[:8]}", tmp_path / "checkpoint"
    consume = ("consume", topic, "-G", group, "-g", "exactly-once", "--table", table, "-e", "--batch-size", 200)

    kdg("produce", topic, "-g", "exactly-once", "--count", 1000)
    died = kdg(*consume, env={"KDG_FAULT": "after-process-before-commit@2"}, check=False)
    assert died.returncode == -signal.SIGKILL, died.stderr
    kdg(*consume)

    kdg("produce", topic, "-g", "exactly-once", "--count", 1000)
    stream = ("-g", "exactly-once", "--table", table, "--checkpoint", checkpoint, "--max-per-batch", 300)
    died = _stream(kdg, topic, group, *stream, "--trigger", "available-now", env=DRIVER_KILL, check=False)
    assert died.returncode == -signal.SIGKILL, died.stderr
    running = kdg_spawn("spark-stream", topic, "-G", group, *stream, "--trigger", "1s", "--json")
    try:
        _wait_for_rows(conn, table, 2000)
        refused = kdg(*consume, check=False)
        assert refused.returncode == 2 and "kdg spark-stream is reading" in refused.stderr, refused.stderr
        second = _stream(kdg, topic, group, *stream, check=False)
        assert second.returncode == 2 and "another kdg spark-stream" in second.stderr, second.stderr
    finally:
        running.send_signal(signal.SIGTERM)
        out, err = running.communicate(timeout=120)
    assert running.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["stopped_by"] == "SIGTERM"

    kdg("produce", topic, "-g", "exactly-once", "--count", 1000)
    died = kdg(*consume, env={"KDG_FAULT": "after-process-before-commit@2"}, check=False)
    assert died.returncode == -signal.SIGKILL, died.stderr
    kdg(*consume)
    audit = audited(kdg, topic, "--table", table, "-G", group)
    assert (audit["lost"], audit["duplicates"], audit["pending"], audit["rows"]) == (0, 0, 0, 3000), audit


def test_typed_upsert_keeps_the_latest_of_two_versions_per_key(kdg, conn, topic, group, tmp_path):
    table = f"stream_orders_{uuid.uuid4().hex[:8]}"
    create(conn, UPSERT_TABLE, table)
    produce_orders(kdg, topic, tmp_path, orders=30, versions=2)
    kdg("doctor", "--topic", topic, "--group", f"doctor-{group}")  # its probe record (no kdg-id) is stepped over
    *batches, report = _lines(_stream(kdg, topic, group, "-g", "exactly-once", "--mapping",
                                      mapping_file(tmp_path, table, mode="upsert"), "--checkpoint",
                                      tmp_path / "checkpoint", "--trigger", "available-now"))
    assert (report["rows_in"], report["dead_lettered"], report["probes_skipped"]) == (61, 0, 1), report
    ended = ("rows_written", "superseded", "duplicates_dropped", "dead_lettered", "probes_skipped", "deleted", "filtered")
    assert sum(report[b] for b in ended) == report["rows_in"], report  # every record read, in one bucket
    found = [{k: v for k, v in r.items() if k != "idempotency_key"} for r in rows(conn, table)]
    assert found == [expected_row(i, 2) for i in range(30)]  # Kafka order within a partition: version 2 won
    audit = audited(kdg, topic, "--table", table, "-G", group)
    assert (audit["processed_unique"], audit["lost"], audit["duplicates"]) == (60, 0, 0) and audit["balanced"], audit


def test_at_most_once_and_a_bad_trigger_are_refused_before_spark_starts(kdg, topic, group):
    proc = _stream(kdg, topic, group, "-g", "at-most-once", check=False)
    assert proc.returncode == 2 and "no fewer than one delivery" in proc.stderr, proc.stderr
    proc = _stream(kdg, topic, group, "--trigger", "soon", check=False)
    assert proc.returncode == 2 and "--trigger 'soon'" in proc.stderr, proc.stderr


def _wait_for_rows(conn, table: str, n: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    with Store(conn.pg_dsn) as store:
        while time.monotonic() < deadline:
            if store.fetchval("SELECT to_regclass($1) IS NOT NULL", table) and store.fetchval(
                    f"SELECT count(*) FROM {table}") >= n:  # the stream makes the table once it is up
                return
            time.sleep(1)
    raise AssertionError(f"{table} did not reach {n} rows in {timeout} s")


@pytest.mark.long
@pytest.mark.disrupts_stack
def test_postgres_down_mid_stream_is_waited_for_and_the_batch_written_again(kdg, kdg_spawn, stack, conn, topic, group,
                                                                           tmp_path):
    from kdg.stack import postgres

    kdg("produce", topic, "-g", "at-least-once", "--count", 3000)
    table = f"stream_{uuid.uuid4().hex[:8]}"
    running = kdg_spawn("spark-stream", topic, "-G", group, "-g", "exactly-once", "--table", table, "--checkpoint",
                        tmp_path / "checkpoint", "--max-per-batch", 150, "--trigger", "500ms", "--json")
    try:
        _wait_for_rows(conn, table, 300)
        postgres.stop(stack, hard=True)
        time.sleep(8)
        postgres.start(stack)
        _wait_for_rows(conn, table, 3000)
    finally:
        running.send_signal(signal.SIGTERM)
        out, err = running.communicate(timeout=120)
    assert running.returncode == 0, err[-3000:]
    assert "Postgres" in err and ("went away" in err or "unreachable" in err), err[-3000:]  # the outage was met
    audit = audited(kdg, topic, "--table", table, "-G", group)
    assert (audit["lost"], audit["duplicates"], audit["pending"]) == (0, 0, 0), audit


def test_a_sigterm_just_after_a_batch_is_written_does_not_write_it_twice(kdg, conn, topic, group, tmp_path):
    """SIGTERM at the moment a micro-batch is written and accounted for, before Spark's commit log has it
    (``KDG_FAULT=…:term``), with more batches waiting. The stop waits for Spark to record that batch, and
    the next one, begun meanwhile, writes nothing: before, it ran (and a stop landing inside it cancelled
    it half-written: each of its written rows again on restart under at-least-once, and exit 6)."""
    kdg("produce", topic, "-g", "exactly-once", "--count", 1500)
    table = f"stop_{uuid.uuid4().hex[:8]}"
    stream = ("-g", "at-least-once", "--table", table, "--checkpoint", tmp_path / "checkpoint", "--max-per-batch", 500)
    stopped = _lines(_stream(kdg, topic, group, *stream, "--trigger", "200ms",
                             env={"KDG_FAULT": "spark-stream-after-batch@1:term"}))[-1]
    assert (stopped["stopped_by"], stopped["batches"]) == ("SIGTERM", 1), stopped
    *batches, rest = _lines(_stream(kdg, topic, group, *stream, "--trigger", "available-now"))
    assert stopped["rows_written"] + rest["rows_written"] == 1500, (stopped, rest)
    # caught up: no lag, though each partition ends in a transaction marker (exactly-once produce) past its last
    # record, where Spark goes on from
    assert batches[-1]["lag"] and not any(batches[-1]["lag"].values()), batches[-1]
    audit = audited(kdg, topic, "--table", table, "-G", group)
    assert (audit["rows"], audit["duplicates"], audit["lost"]) == (1500, 0, 0), audit

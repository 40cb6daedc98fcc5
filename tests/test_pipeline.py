"""Pipelined exactly-once writes (`kdg consume --pipeline`): faults aimed at the overlap itself.

The kill point ``pipelined-commit`` is reached only when a batch is about to commit while the next
batch is being written on the other connection, so every test here proves first that the consumer
really stopped (or died) there. Each fault must leave exactly-once at 0 lost / 0 duplicates; the
weaker guarantees' anomalies under the same kinds of fault are shown in test_crash.py and
test_typed_sink.py (they write one batch at a time, which the last test here checks). A typed table's
batches are pipelined too: test_typed_sink.py kills its upsert at ``pipelined-commit``.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import audited, finished, wait_stopped

from kdg.stack import postgres

N = 3000
BATCH = 200


def _produce(kdg, topic):
    kdg("produce", topic, "-g", "exactly-once", "--count", N, "--size", 50, "--json")


def _consume_args(topic, group, guarantee="exactly-once", *extra):
    return ["consume", topic, "-G", group, "-g", guarantee, "--batch-size", BATCH, "--json", *extra]


def _exactly_once(kdg, topic, group) -> dict:
    audit = audited(kdg, topic, "-G", group)
    assert (audit["lost"], audit["duplicates"], audit["unexpected"], audit["processed_unique"]) == (0, 0, 0, N), audit
    return audit


def _spawn(stack, args, fault: str | None = None) -> subprocess.Popen:
    env = {**{k: v for k, v in os.environ.items() if k != "KDG_FAULT"}, "KDG_BOOTSTRAP_SERVERS":
           stack.bootstrap_servers, "KDG_PG_DSN": stack.pg_dsn, "KDG_STATE_DIR": str(stack.state_dir),
           **({"KDG_FAULT": fault} if fault else {})}
    return subprocess.Popen([sys.executable, "-m", "kdg", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, dict, str]:
    code, out, err = finished(proc, timeout)
    return code, (json.loads(out) if out.strip() else {}), err


def test_sigkill_while_a_batch_commits_and_the_next_is_written(kdg, topic, group, nth=3):
    _produce(kdg, topic)
    args = _consume_args(topic, group, "exactly-once", "-e")
    crashed = kdg(*args, env={"KDG_FAULT": f"pipelined-commit@{nth}"}, check=False)
    assert crashed.returncode == -signal.SIGKILL, f"the fault did not fire: {crashed.stderr[-2000:]}"
    before = audited(kdg, topic, "-G", group)
    # killed mid-run: what is past the stored offsets is pending (read again on restart), nothing lost or doubled
    assert before["pending"] > 0 and (before["lost"], before["duplicates"]) == (0, 0), before
    report = json.loads(kdg(*args).stdout)
    assert report["consumed"] == before["pending"], report  # the restart read on from what Postgres stored
    _exactly_once(kdg, topic, group)


@pytest.mark.disrupts_stack
def test_postgres_restarted_between_two_pipelined_batches(kdg, stack, topic, group):
    """Stopped with one batch about to commit and the next being written; Postgres SIGKILLed and
    restarted under both connections; resumed: both batches' fates are read back from kdg_offsets."""
    _produce(kdg, topic)
    proc = _spawn(stack, _consume_args(topic, group, "exactly-once", "-e"), "pipelined-commit@3:stop")
    try:
        wait_stopped(proc, "pipelined-commit")
        postgres.restart(stack, hard=True)
    finally:
        proc.send_signal(signal.SIGCONT)
    code, report, err = _finish(proc)
    assert code == 0, err[-3000:]
    assert report["pg_outages"] >= 1 and "Postgres is back" in err, (report, err[-2000:])
    assert report["lost_in_outages"] == 0, report
    _exactly_once(kdg, topic, group)


def test_rebalance_between_two_pipelined_batches(kdg, stack, topic, group):
    """A member stops mid-overlap past its session timeout; a second member takes the partitions; the first
    resumes as a zombie. Its batch that had moved the offsets commits (the successor's fence bump waited for
    it); anything later is fenced or chained out. Each record once."""
    _produce(kdg, topic)
    zombie = _spawn(stack, _consume_args(topic, group, "exactly-once", "--idle-timeout", 20), "pipelined-commit@2:stop")
    successor = None
    try:
        wait_stopped(zombie, "pipelined-commit")
        successor = _spawn(stack, _consume_args(topic, group, "exactly-once", "--idle-timeout", 20))
        time.sleep(15)  # > session.timeout.ms: the group moves the stopped member's partitions
    finally:
        zombie.send_signal(signal.SIGCONT)
    zcode, zreport, zerr = _finish(zombie)
    scode, sreport, serr = _finish(successor)
    assert (zcode, scode) == (0, 0), (zerr[-2000:], serr[-2000:])
    assert sreport["processed"] > 0, sreport  # the second member really took partitions over
    _exactly_once(kdg, topic, group)


def test_sequential_writers_never_reach_the_overlap(kdg, topic, group):
    """The kill point is specific to the overlap: with --pipeline 0, and under at-least-once (which never
    pipelines: its offsets go to Kafka after the write), the same fault never fires."""
    _produce(kdg, topic)
    for guarantee, extra, g in (("exactly-once", ["--pipeline-depth", 0], group), ("at-least-once", [], f"{group}-alo")):
        done = kdg(*_consume_args(topic, g, guarantee, "-e", *extra), env={"KDG_FAULT": "pipelined-commit"},
                   check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(done.stdout)["consumed"] == N


def test_batches_read_again_start_from_the_earliest_first_offset_of_each_partition():
    from kdg.sinks import Batch

    a = Batch(first_offsets={("t", 0): 100, ("t", 1): 50}, next_offsets={("t", 0): 200, ("t", 1): 60})
    b = Batch(first_offsets={("t", 0): 200, ("t", 2): 7}, next_offsets={("t", 0): 300, ("t", 2): 9})
    merged = Batch.earliest([b, a])
    assert merged.first_offsets == {("t", 0): 100, ("t", 1): 50, ("t", 2): 7}
    assert merged.next_offsets == {("t", 0): 300, ("t", 1): 60, ("t", 2): 9}

"""`-e` after crashes: the whole topic is read before exiting, and the audit tells pending from lost."""

import os
import signal
import subprocess
import sys
import time

from conftest import as_json, audited

SESSION_TIMEOUT_S = 10  # kdg's consumer session.timeout.ms: a dead member holds its partitions this long


def test_e_after_three_crashes_waits_for_the_dead_members_partitions(kdg, topic, group):
    kdg("produce", topic, "-g", "exactly-once", "--count", 30_000, "--size", 50)
    consume = ("consume", topic, "-G", group, "-g", "exactly-once", "--batch-size", 1000, "-e", "--json")
    for _ in range(3):  # each member commits a batch, then dies holding its partitions (the next one unwritten)
        crashed = kdg(*consume, env={"KDG_FAULT": "after-commit-before-process@1"}, check=False)
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    last_death = time.monotonic()

    midway = audited(kdg, topic)  # records nobody has read yet are pending, not lost
    assert midway["pending"] > 0 and midway["lost"] == 0 and midway["duplicates"] == 0
    assert midway["positions_of"] == group and sum(midway["pending_by_partition"].values()) == midway["pending"]

    report = as_json(kdg(*consume))
    assert report["stopped_by"] == "end of topic"
    # it could only finish once the dead sessions expired and their partitions came to it
    assert time.monotonic() - last_death >= SESSION_TIMEOUT_S - 1
    final = audited(kdg, topic)
    assert (final["lost"], final["duplicates"], final["pending"], final["acked"]) == (0, 0, 0, 30_000)


def test_e_waits_for_partitions_a_slower_live_member_holds(kdg, stack, topic, group):
    """The -e member's own partitions end first; it must not exit while the group's other member still reads.

    With the old rule (exit when the partitions this member holds are at their end) this member
    stops early and the audit at that moment shows pending records.
    """
    kdg("produce", topic, "-g", "exactly-once", "--count", 6000, "--size", 50)
    env = {**{k: v for k, v in os.environ.items() if k != "KDG_FAULT"},
           "KDG_BOOTSTRAP_SERVERS": stack.bootstrap_servers, "KDG_PG_DSN": stack.pg_dsn}
    slow = subprocess.Popen([sys.executable, "-m", "kdg", "consume", topic, "-G", group, "-g", "exactly-once",
                             "--batch-size", "100", "--handler", "slow_handler:slow", "-e", "--json"],
                            env={**env, "PYTHONPATH": os.path.dirname(__file__)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(6)  # the slow member owns every partition and has started
        fast = as_json(kdg("consume", topic, "-G", group, "-g", "exactly-once", "-e", "--json"))
        at_exit = audited(kdg, topic)
        assert fast["stopped_by"] == "end of topic"
        assert at_exit["pending"] == 0 and at_exit["lost"] == 0 and at_exit["duplicates"] == 0, at_exit
    finally:
        out, err = slow.communicate(timeout=300)
    assert slow.returncode == 0, err
    assert audited(kdg, topic)["processed_unique"] == 6000


def test_the_audit_still_calls_skipped_records_lost(kdg, topic, group):
    """At-most-once commits before writing: what a crash skipped is behind the group's position, so lost."""
    kdg("produce", topic, "-g", "at-least-once", "--count", 5000, "--size", 50)
    args = ("consume", topic, "-G", group, "-g", "at-most-once", "--batch-size", 500, "-e")
    crashed = kdg(*args, env={"KDG_FAULT": "after-commit-before-process@2"}, check=False)
    assert crashed.returncode == -signal.SIGKILL
    kdg(*args)
    audit = audited(kdg, topic, "-G", group)
    assert audit["lost"] == 500 and audit["pending"] == 0 and not audit["balanced"]


def test_a_partition_read_again_is_not_at_its_end_until_read_to_it_again(kdg, conn, topic, group):
    """A batch read again (its write failed: a lost connection, a fenced batch) seeks its partitions back. `-e`
    must then read them to their end again: had the end seen before stood, the run stopped with the batch
    unwritten and said "end of topic"."""
    from kdg.guarantees import policy_for
    from kdg.kafka.consumer import KdgConsumer, StartOffset

    kdg("produce", topic, "-g", "at-least-once", "--count", 60)
    consumer = KdgConsumer(policy_for("at-least-once"), conn.bootstrap_servers, group, start=StartOffset("beginning"),
                           eof=True)
    consumer.subscribe([topic], lambda partitions: partitions, lambda partitions: None)

    def read_to_end() -> list:
        got, deadline = [], time.monotonic() + 60
        while not (consumer.assigned and consumer.held_at_end()) and time.monotonic() < deadline:
            got += consumer.poll_batch(100, 0.2)
        assert consumer.assigned and consumer.held_at_end(), "never read to the end"
        return got

    try:
        first = read_to_end()
        assert len(first) == 60
        again = first[0]
        consumer.seek(again.topic(), again.partition(), 0)
        assert not consumer.held_at_end()
        reread = read_to_end()
        assert sorted(m.offset() for m in reread) == sorted(m.offset() for m in first
                                                             if m.partition() == again.partition())
    finally:
        consumer.close()

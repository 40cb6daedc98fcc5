"""What an exactly-once producer killed mid-run left in its ledger, settled by the next run with its transactional.id.

A transactional ``kdg produce`` writes each transaction's ledger rows (one COPY) before it commits the transaction
(``kdg.produce._Transaction``), so a kill never leaves a committed record without its row. Killed between the
write and the commit, its last rows stand for records that were never committed: the next producer with the same
transactional.id fenced it (its ``init_transactions`` aborted the open transaction), so whether that transaction
committed is decided now, and for good, by reading its first record's offset with a read_committed reader. A
committed record is read there; an aborted one is skipped.
"""

import time

from confluent_kafka import KafkaException, TopicPartition

from kdg.kafka.admin import watermarks
from kdg.kafka.clients import reader
from kdg.settings import Connection

READ_FOR_S = 10.0  # how long to wait for the record at an offset below the last stable offset


def settle_killed_runs(store, conn: Connection, topic: str, transactional_id: str, run_id,
                       notice=lambda text: None) -> int:
    """Settle every killed run of ``topic`` that had ``transactional_id`` (not ``run_id``, the caller's, which
    holds that id now): its last ledger write failed if its transaction was aborted, and the run finished. A run
    whose transaction cannot be told yet (another producer's transaction open before it) is left for the next
    run. Returns the number settled."""
    settled = 0
    for run in store.killed_runs(topic, transactional_id, run_id):
        committed = True if run["offset"] is None else _committed(conn, topic, run["partition"], run["offset"])
        if committed is None:
            continue
        store.settle_killed_run(run["run_id"], topic, run["recorded_at"], committed)
        settled += 1
        if not committed:
            notice(f"producer ledger: run {run['run_id']} was killed before committing its last transaction, "
                   "whose rows are marked failed")
    return settled


def _committed(conn: Connection, topic: str, partition: int, offset: int) -> bool | None:
    """Whether the record at ``offset`` of ``partition`` was committed: True, False (aborted), or None when a
    transaction still open at or before it keeps a read_committed reader from telling."""
    stable = watermarks(conn.bootstrap_servers, topic, conn.extra).get(partition, (0, 0))[1]
    if stable <= offset:
        return None
    consumer = reader(conn.bootstrap_servers, conn.extra, group="kdg-ledger-settle")
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        deadline = time.monotonic() + READ_FOR_S
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                return msg.offset() == offset  # beyond it: the record at offset was skipped, aborted
            # nothing committed from it to the last stable offset, only aborted records and markers, which the
            # reader steps over without a message: its position tells
            if consumer.position([TopicPartition(topic, partition)])[0].offset >= stable:
                return False
        return None
    except KafkaException:
        return None
    finally:
        consumer.close()

"""The offset protocol of `kdg consume`: where a group's positions live, and when they move.

One object reads the policy's ``commit_mode`` and owns start positions, commits and rewinds, so
the consume loop never decides any of it:

- ``before-processing``: the batch's offsets are committed to Kafka before the sink sees it.
- ``after-processing``: they are committed to Kafka after the sink wrote it.
- ``in-sink-transaction``: the sink stores them with its results — in Postgres (``kdg_offsets``,
  fenced per assignment) or in the Kafka sink's producer transaction.
"""

import time

from confluent_kafka import TopicPartition

from kdg import faults
from kdg.errors import UsageError
from kdg.guarantees import CommitMode, DeliveryPolicy
from kdg.kafka.admin import watermarks
from kdg.kafka.consumer import KdgConsumer
from kdg.sinks import Batch


class OffsetProtocol:
    def __init__(self, policy: DeliveryPolicy, consumer: KdgConsumer, sink):
        self.mode = policy.commit_mode
        self.atomic = self.mode is CommitMode.IN_SINK_TRANSACTION
        if self.atomic and not sink.atomic_offsets:
            raise UsageError(f"{policy.guarantee.value} needs a sink that commits offsets with its results "
                             "(postgres or kafka:TOPIC)")
        self.in_sink = self.atomic and sink.keeps_offsets
        self.consumer, self.sink = consumer, sink

    def assign(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Where each newly assigned partition starts: the sink's stored offset when it keeps them, else Kafka's."""
        stored = self.sink.acquire([(p.topic, p.partition) for p in partitions]) if self.in_sink else {}
        return [TopicPartition(p.topic, p.partition, self.consumer.initial_offset(
                    p, stored.get((p.topic, p.partition)), kdg_owns_offsets=self.in_sink))
                for p in partitions]

    def revoke(self, partitions: list[TopicPartition]) -> None:
        if self.in_sink:
            self.sink.release([(p.topic, p.partition) for p in partitions])

    def before_write(self, batch: Batch) -> bool:
        """Commit first when the policy says so; False if the partitions are no longer ours (skip the batch)."""
        if self.mode is not CommitMode.BEFORE_PROCESSING:
            return True
        if not self.consumer.commit(batch.next_offsets):
            return False
        faults.reach("after-commit-before-process")
        return True

    def after_write(self, batch: Batch) -> None:
        if self.mode is CommitMode.AFTER_PROCESSING:
            faults.reach("after-process-before-commit")
            self.consumer.commit(batch.next_offsets)
        elif self.in_sink:
            self.consumer.commit_quietly(batch.next_offsets)  # information for lag tools only
        if self.mode is not CommitMode.BEFORE_PROCESSING:
            faults.reach("after-commit-before-process")  # committed; the next batch is not processed yet

    def rewind(self, batch: Batch) -> None:
        """Read a batch that was not written again, from its first offsets (partitions still ours only)."""
        for (topic, partition), offset in batch.first_offsets.items():
            self.consumer.seek(topic, partition, offset)

    def resume_after_outage(self, batch: Batch) -> bool:
        """The sink lost Postgres while writing ``batch`` and is back: where to read on from.

        The batch's transaction may have committed or not (the answer was lost with the
        connection). Where the sink keeps the offsets, its stored offsets say which, so the batch
        is read again from there; under ``after-processing`` it is read again (a duplicate if it
        had committed); under ``before-processing`` its offsets were committed before the write,
        so it is not read again. Returns whether the batch will be read again.
        """
        if self.mode is CommitMode.BEFORE_PROCESSING:
            return False
        stored = self.sink.stored_offsets({t for t, _ in batch.first_offsets}) if self.in_sink else {}
        for tp, first in batch.first_offsets.items():
            self.consumer.seek(*tp, stored.get(tp, first))
        return True

    def stored(self, topic: str, partitions: list[int]) -> dict[int, int | None]:
        """The group's stored next offset of each partition of ``topic``, wherever the policy keeps them."""
        if self.in_sink:
            found = self.sink.stored_offsets([topic])
            return {p: found.get((topic, p)) for p in partitions}
        return self.consumer.committed(topic, partitions)


class TopicEnd:
    """``-e``: every topic is read for this group, not only the partitions this member holds.

    Held partitions must be at their end; the others (held by nobody yet, by another member, or by
    a dead member whose session has not expired) must have their stored offset at the end, in
    Postgres or Kafka as the policy keeps them. Until then the consumer keeps polling, and picks
    partitions up when they move to it. ``topics()`` gives the topics read and their partitions (a
    pattern's grow as topics appear).
    """

    CHECK_EVERY_S = 1.0

    def __init__(self, offsets, consumer, bootstrap, extra, topics, isolation):
        self.offsets, self.consumer = offsets, consumer
        self.bootstrap, self.extra, self.topics = bootstrap, extra, topics
        self.isolation = isolation
        self._checked = 0.0
        self._reader = None

    def reached(self) -> bool:
        if not self.consumer.held_at_end():
            return False
        start = getattr(self.consumer, "start", None)
        if start is not None and start.explicit() and not self.consumer.stored_wins and not self.consumer.rebalanced:
            return False  # -o moves the stored positions at this member's first assignment: not judged by them before
        held = self.consumer.assigned
        others = {t: [p for p in parts if (t, p) not in held] for t, parts in self.topics().items()}
        others = {t: parts for t, parts in others.items() if parts}
        if not others:
            return True
        if time.monotonic() - self._checked < self.CHECK_EVERY_S:
            return False
        self._checked = time.monotonic()
        behind = {}
        for topic, parts in others.items():
            ends = watermarks(self.bootstrap, topic, self.extra, self.isolation)
            stored = self.offsets.stored(topic, parts)
            for p in parts:
                at = stored[p] if stored.get(p) is not None else ends[p][0]
                if at < ends[p][1]:
                    behind[topic, p] = (at, ends[p][1])
        return not behind or self._only_markers(behind)

    def _only_markers(self, positions: dict[tuple[str, int], tuple[int, int]]) -> bool:
        """Whether nothing but transaction markers lies between each stored position and the end.

        A transactional producer ends each partition with a commit marker: the group's next offset
        stops one short of the end offset, with nothing left to read.
        """
        from kdg.kafka.clients import reader

        if self._reader is None:
            self._reader = reader(self.bootstrap, self.extra, group="kdg-end-check", isolation=self.isolation)
        self._reader.assign([TopicPartition(t, p, at) for (t, p), (at, _) in positions.items()])
        try:
            if any(m.error() is None for m in self._reader.consume(100, 1.0)):
                return False
            return all(self._reader.position([TopicPartition(t, p)])[0].offset >= end
                       for (t, p), (_, end) in positions.items())
        finally:
            self._reader.unassign()

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()

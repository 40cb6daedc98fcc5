"""The offset protocol of `kdg consume`: where a group's positions live, and when they move.

One object reads the policy's ``commit_mode`` and owns start positions, commits and rewinds, so
the consume loop never decides any of it:

- ``before-processing``: the batch's offsets are committed to Kafka before the sink sees it.
- ``after-processing``: they are committed to Kafka after the sink wrote it.
- ``in-sink-transaction``: the sink stores them with its results — in Postgres (``kdg_offsets``,
  fenced per assignment) or in the Kafka sink's producer transaction.
"""

from confluent_kafka import TopicPartition

from kdg import faults
from kdg.errors import UsageError
from kdg.guarantees import CommitMode, DeliveryPolicy
from kdg.kafka.consumer import KdgConsumer
from kdg.sinks import Batch


class OffsetProtocol:
    def __init__(self, policy: DeliveryPolicy, consumer: KdgConsumer, sink, topic: str):
        self.mode = policy.commit_mode
        self.atomic = self.mode is CommitMode.IN_SINK_TRANSACTION
        if self.atomic and not sink.atomic_offsets:
            raise UsageError(f"{policy.guarantee.value} needs a sink that commits offsets with its results "
                             "(postgres or kafka:TOPIC)")
        self.in_sink = self.atomic and sink.keeps_offsets
        self.consumer, self.sink, self.topic = consumer, sink, topic

    def assign(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Where each newly assigned partition starts: the sink's stored offset when it keeps them, else Kafka's."""
        stored = self.sink.acquire([p.partition for p in partitions]) if self.in_sink else {}
        return [TopicPartition(p.topic, p.partition,
                               self.consumer.initial_offset(p, stored.get(p.partition), kdg_owns_offsets=self.in_sink))
                for p in partitions]

    def revoke(self, partitions: list[TopicPartition]) -> None:
        if self.in_sink:
            self.sink.release([p.partition for p in partitions])

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

    def stored(self, partitions: list[int]) -> dict[int, int | None]:
        """The group's stored next offset of each partition, wherever the policy keeps them."""
        if self.in_sink:
            found = self.sink.stored_offsets()
            return {p: found.get(p) for p in partitions}
        return self.consumer.committed(self.topic, partitions)

"""The Kafka sink (consume-transform-produce): under exactly-once, output and input offsets in one transaction."""

from confluent_kafka import TopicPartition

from kdg import faults
from kdg.errors import ProducerFatal, RetryBatch, TransactionAborted
from kdg.kafka.admin import ensure_topic
from kdg.kafka.producer import KdgProducer, refusals_for_good, refused
from kdg.records import GROUP_HEADER
from kdg.sinks import Batch, Sink, WriteResult
from kdg.sinks.dead_letters import DeadLetterQueue


class KafkaSink(Sink):
    atomic_offsets = True   # the consumer's offsets go into the producer's transaction
    keeps_offsets = False   # ... and so they stay in Kafka, with the group

    def __init__(self, policy, bootstrap: str, extra: dict, out_topic: str, dlq: DeadLetterQueue,
                 transactional_id: str, consumer, group: str, partitions: int = 3, own_id: bool = False):
        """``own_id``: the transactional.id is this process's alone (kdg's default names host and pid), so
        a fence can only be librdkafka bumping its own epoch after a timeout (seen after broker kills), and
        the producer is replaced; a zombie member is still stopped by the group's generation, which its
        offsets carry. A user's --transactional-id may be another live process's: a fence then stops it.

        Each output record carries its input's headers and, last, ``kdg-group``: the group that wrote it,
        so an audit of an output topic that several groups write into counts each group's own records."""
        self.out_topic, self.dlq, self.consumer, self.own_id = out_topic, dlq, consumer, own_id
        self.written_by = (GROUP_HEADER, group.encode())
        # failures only (take_failures): a record Kafka refuses stops the consumer before its offsets move
        self.producer = KdgProducer(policy, bootstrap, extra, transactional_id=transactional_id, every_report=False)
        self._bootstrap, self._extra, self._partitions = bootstrap, extra, partitions
        self._outs: dict[str, str] = {}  # input topic → its output topic (``kafka:{topic}.out``), made on first use
        if "{topic}" not in out_topic:
            ensure_topic(bootstrap, out_topic, partitions=partitions, extra=extra)

    def _out(self, topic: str) -> str:
        found = self._outs.get(topic)
        if found is None:
            found = self.out_topic.replace("{topic}", topic)
            if found != self.out_topic:
                ensure_topic(self._bootstrap, found, partitions=self._partitions, extra=self._extra)
            self._outs[topic] = found
        return found

    def _send(self, batch: Batch) -> None:
        send, mark, topic, out = self.producer.send, self.written_by, None, None
        for rec, _key in batch.records:
            if rec.topic != topic:
                topic, out = rec.topic, self._out(rec.topic)
            send(out, rec.value, rec.key, [*rec.headers, mark])  # of a repeated name the last counts

    def write(self, batch: Batch, *, atomic: bool) -> WriteResult:
        if not atomic:
            self.dlq.send(batch.dead)
            self._send(batch)
            faults.reach("inside-pg-transaction")
            self.producer.deliver(f"records to {self.out_topic}", timeout=120)
            return WriteResult(len(batch.records), 0)
        self.producer.begin()
        committing = False
        try:
            self._send(batch)
            self.dlq.send(batch.dead, producer=self.producer)
            offsets = [TopicPartition(t, p, o) for (t, p), o in batch.next_offsets.items()]
            self.producer.send_offsets(offsets, self.consumer.group_metadata())
            faults.reach("inside-pg-transaction")
            faults.reach("after-process-before-commit")
            committing = True
            self.producer.commit()
        except TransactionAborted as exc:
            failures = self.producer.take_failures()  # records of the transaction Kafka refused, if that is why
            try:
                self.producer.abort()
            except ProducerFatal as fatal:  # aborting anyway: nothing of it was committed
                self._renew(fatal, committing=False)
            # the aborted transaction's other records, purged; and a refusal that came too late to fail the
            # commit (a commit can fail as soon as the brokers answer, before the refused records' reports)
            failures += refusals_for_good(self.producer.take_failures())
            if failures:  # sent again, they would be refused again: stop, nothing of the batch committed
                raise refused(f"records to {self.out_topic} (or dead letters to {self.dlq.topic})", failures) from exc
            raise RetryBatch(str(exc)) from exc
        except ProducerFatal as exc:
            self._renew(exc, committing=committing)
            raise RetryBatch(f"{exc}; a new producer took the transactional.id over") from exc
        return WriteResult(len(batch.records), 0)

    def _renew(self, exc: ProducerFatal, *, committing: bool) -> None:
        """Replace the producer if its transaction is known never to have committed, else raise ``exc``: a
        renewable error (from produce requests, settled before EndTxn), or a fence of kdg's own per-process
        transactional.id met before the commit was asked for (a fence answering the commit itself leaves
        its outcome unknown: stopping, the group's committed offsets tell the restart where to go on)."""
        self.producer.recover(exc, fenced_too=self.own_id and not committing)

    def close(self) -> None:
        if self.producer.in_transaction:
            self.producer.abort()
        self.producer.flush(30)

"""The Postgres sink: rows into a sink table; under exactly-once, dedup and offsets in the same transaction."""

from json.encoder import encode_basestring_ascii as _esc

from confluent_kafka import TopicPartition

from kdg import faults
from kdg.sinks import Batch, WriteResult
from kdg.sinks.dead_letters import DeadLetterQueue
from kdg.store.pg import Store


def _headers_json(headers) -> str:
    """Headers as a JSON object, exactly as ``json.dumps`` would write it, at under half the cost.

    A repeated header name appears twice in the text; ``jsonb`` keeps the last, as a dict would.
    """
    return "{" + ",".join([_esc(k) + ":" + ("null" if v is None else _esc(v.decode("utf-8", "replace")))
                           for k, v in headers]) + "}"


def _row(rec, key: str) -> tuple:
    return (key, rec.topic, rec.partition, rec.offset, rec.key, rec.value, _headers_json(rec.headers))


class PostgresSink:
    atomic_offsets = True

    def __init__(self, dsn: str, table: str, group: str, topic: str, dlq: DeadLetterQueue, handler=None):
        self.store = Store(dsn)
        self.table = self.store.ensure_sink_table(table)
        self.group, self.topic, self.dlq, self.handler = group, topic, dlq, handler
        self.fences: dict[int, int] = {}

    def assign(self, consumer, partitions: list[TopicPartition], owns_offsets: bool) -> list[TopicPartition]:
        """Start each partition where Postgres says (exactly-once) or where Kafka says (otherwise)."""
        if not owns_offsets:
            return [TopicPartition(p.topic, p.partition, consumer.initial_offset(p, None)) for p in partitions]
        taken = self.store.acquire_partitions(self.group, self.topic, [p.partition for p in partitions])
        chosen = []
        for p in partitions:
            fence, stored = taken[p.partition]
            self.fences[p.partition] = fence
            chosen.append(TopicPartition(p.topic, p.partition, consumer.initial_offset(p, stored, kdg_owns_offsets=True)))
        return chosen

    def revoke(self, partitions) -> None:
        for p in partitions:
            self.fences.pop(p.partition, None)

    def write(self, batch: Batch, *, atomic: bool) -> WriteResult:
        rows = [_row(rec, key) for rec, key in batch.records]
        self.dlq.send(batch.dead)  # durable before the rows and offsets that account for them commit

        def at_commit():
            faults.reach("inside-pg-transaction")
            faults.reach("after-process-before-commit")

        if atomic:
            offsets = {p: o for (t, p), o in batch.next_offsets.items()}
            fences = {p: self.fences.get(p, -1) for p in offsets}
            written = self.store.write_exactly_once(self.table, self.group, rows, offsets, self.topic, fences,
                                                    handler=self.handler, before_commit=at_commit)
            return WriteResult(written, len(rows) - written)
        written = self.store.write_plain(self.table, self.group, rows, handler=self.handler,
                                         before_commit=lambda: faults.reach("inside-pg-transaction"))
        return WriteResult(written, 0)

    def close(self) -> None:
        self.store.close()

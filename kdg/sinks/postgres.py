"""The Postgres sink: rows into a sink table; under exactly-once, dedup and offsets in the same transaction."""

from kdg import faults
from kdg.settings import table_name
from kdg.sinks import Batch, WriteResult
from kdg.sinks.dead_letters import DeadLetterQueue
from kdg.store.pg import Store
from kdg.store.rows import sink_row


class PostgresSink:
    atomic_offsets = True   # results and offsets can commit in one transaction
    keeps_offsets = True    # ... and then the offsets live here (kdg_offsets), not in Kafka

    def __init__(self, dsn: str, table: str, group: str, topic: str, dlq: DeadLetterQueue, handler=None):
        table = table_name(table)  # a malformed name is refused before Postgres is reached
        self.store = Store(dsn)
        self.table = self.store.ensure_sink_table(table)
        self.group, self.topic, self.dlq, self.handler = group, topic, dlq, handler
        self.fences: dict[int, int] = {}

    def acquire(self, partitions: list[int]) -> dict[int, int | None]:
        """Own ``partitions`` (each fence bumped, so an older owner's batches are refused); their stored offsets."""
        taken = self.store.acquire_partitions(self.group, self.topic, partitions)
        for p, (fence, _) in taken.items():
            self.fences[p] = fence
        return {p: stored for p, (_, stored) in taken.items()}

    def release(self, partitions: list[int]) -> None:
        for p in partitions:
            self.fences.pop(p, None)

    def stored_offsets(self) -> dict[int, int]:
        return self.store.stored_offsets(self.group, self.topic)

    def write(self, batch: Batch, *, atomic: bool) -> WriteResult:
        rows = [sink_row(rec, key) for rec, key in batch.records]
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

    def lost_connection(self) -> bool:
        """Whether a failed write means Postgres went away (wait for it) rather than refused something."""
        return self.store.lost()

    def reconnect(self, give_up_after: float, notice) -> float:
        """Wait for Postgres to answer again (backing off, ``notice`` told each retry); seconds waited."""
        return self.store.reconnect(give_up_after, notice)

    def close(self) -> None:
        self.store.close()

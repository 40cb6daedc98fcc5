"""The typed Postgres sink: records into the user's own table through a mapping.

Offsets, fences and claims are the generic Postgres sink's. What differs is the row: each record
becomes the mapped columns' values, cast by Postgres; a record the mapping cannot read (not JSON,
a tombstone under ``dead-letter``) or a row Postgres refuses goes to the dead-letter topic, and
the rest of its batch is written — under exactly-once with the offsets, in the same transaction.
"""

from kdg import faults
from kdg.mapping import Mapping, RowMaker
from kdg.sinks import Batch, WriteResult
from kdg.sinks.dead_letters import DeadLetterQueue, refused_row, tally
from kdg.sinks.postgres import PostgresSink
from kdg.store.pg import Store


class TypedPostgresSink(PostgresSink):
    takes_rows = False  # a mapping reads each Record

    def __init__(self, dsn: str, mapping: Mapping, group: str, topic: str, dlq: DeadLetterQueue, handler=None,
                 registry: dict[str, str] | None = None):
        self.store = Store(dsn)
        try:
            self.target, _ = self.store.prepare_typed(mapping)  # checked before any record is read
        except BaseException:
            self.store.close()
            raise
        self.table = self.target.mapping.table  # its identity, schema-qualified
        # registry: for a schema'd value or key format; watch: mapped fields no record has, fields nothing maps
        self.rows = RowMaker(self.target.mapping, registry, watch=True)
        self._setup(dsn, group, topic, dlq, handler, pipeline=0)  # typed batches are written one at a time

    def field_notes(self) -> list:
        """What the mapping's watch found since last asked (:class:`kdg.mapping.fields.FieldNote`)."""
        return self.rows.watch.news() if self.rows.watch is not None else []

    def field_counts(self) -> dict[str, int]:
        return self.rows.watch.counts() if self.rows.watch is not None else {}

    def write(self, batch: Batch, *, atomic: bool) -> WriteResult:
        """Write ``batch``; ``handler(rows, conn)`` gets the staged rows (see :mod:`kdg.mapping.rows`)."""
        self.rows.prepare(batch.records)  # a registry that is away is waited for here, not inside the COPY
        rows = self.rows.staged(batch.records, keep=self.handler is not None)  # made as the COPY reads them
        self.dlq.send(batch.dead)  # durable before the rows and offsets that account for them commit
        records = batch.records

        def dead_letter(unreadable, rejected) -> None:  # inside the transaction: durable before it commits
            self.dlq.send(unreadable + [refused_row(*records[seq], state, message) for seq, state, message in rejected])

        def at_commit() -> None:
            faults.reach("inside-pg-transaction")
            if atomic:
                faults.reach("after-process-before-commit")

        offsets = {p: o for (_, p), o in batch.next_offsets.items()} if atomic else None
        result = self.store.write_typed(
            self.target, rows, claim=atomic, group=self.group, topic=self.topic, next_offsets=offsets,
            fences={p: self.fences.get(p, -1) for p in offsets or ()}, dead_letter=dead_letter,
            handler=self.handler, before_commit=at_commit)
        dead = rows.dead + [refused_row(*records[seq], state, message) for seq, state, message in result.rejected]
        return WriteResult(result.written, result.duplicates, len(dead), result.superseded, result.deleted,
                           result.filtered, tally(dead))

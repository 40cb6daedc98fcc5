"""The Postgres sink: rows into a sink table; under exactly-once, dedup and offsets in the same transaction."""

import time

from kdg import faults
from kdg.settings import table_name
from kdg.sinks import Batch, Outcome, Sink, WriteResult
from kdg.sinks.dead_letters import DeadLetterQueue
from kdg.sinks.pipeline import Pipeline
from kdg.store.pg import Store
from kdg.store.rows import SinkRows, sink_row


class PostgresSink(Sink):
    atomic_offsets = True   # results and offsets can commit in one transaction
    keeps_offsets = True    # ... and then the offsets live here (kdg_offsets), not in Kafka
    takes_rows = True       # the generic table's rows: sorted per batch (kdg.batching) where the batch allows

    def __init__(self, dsn: str, table: str, group: str, topic: str, dlq: DeadLetterQueue, handler=None,
                 pipeline: int = 0):
        table = table_name(table)  # a malformed name is refused before Postgres is reached
        self.store = Store(dsn)
        try:
            self.table = self.store.ensure_sink_table(table)
            self._setup(dsn, group, topic, dlq, handler, pipeline)
        except BaseException:
            self.store.close()
            raise

    def _setup(self, dsn, group, topic, dlq, handler, pipeline: int) -> None:
        self.group, self.topic, self.dlq, self.handler = group, topic, dlq, handler
        self.fences: dict[int, int] = {}
        self.stored: dict[int, int | None] = {}  # per partition: the offset the last batch written will store
        # exactly-once batches are written on `pipeline` connections of their own, in turn (see kdg.sinks.pipeline)
        self.pipeline = Pipeline(lambda: Store(dsn), pipeline) if pipeline > 0 else None
        self._held: list[Outcome] = []  # outcomes drained at a rebalance, handed back with the next ones
        self.window = None  # exactly-once: the table's claim window, maintained from here (keep_window)
        self.partitions_dropped = 0
        self._maintain_at = 0.0

    def keep_window(self, window) -> None:
        """Maintain ``window`` (:class:`kdg.store.windows.Window`) while consuming: at most once per
        partition width (1 s to 5 min), under the database's maintenance lock (another process may hold it)."""
        self.window = window
        self._maintain_every = min(300.0, max(1.0, window.width_ms / 1000))
        self._maintain_at = time.monotonic() + self._maintain_every

    def maintain_if_due(self) -> list:
        """Drop the window's expired partitions if it is time; the passes that were skipped (and why)."""
        if self.window is None or time.monotonic() < self._maintain_at:
            return []
        self._maintain_at = time.monotonic() + self._maintain_every
        done = self.store.maintain(relations=[self.window.relation])
        self.partitions_dropped += sum(m.dropped for m in done)
        return [m for m in done if m.skipped and "another process" not in m.skipped]

    def _stores(self) -> list[Store]:
        """Every connection of this sink: its own, and the pipeline's."""
        return [self.store] + (self.pipeline.stores if self.pipeline is not None else [])

    def healed(self) -> list[str]:
        """Claim state its writes or upkeep found dropped outside kdg since last asked, on every connection."""
        notes = []
        for store in self._stores():
            while store.healed:
                notes.append(store.healed.popleft())
        return notes

    def unclaimed(self) -> int:
        """Rows written without a claim (older than the window), on every connection of this sink."""
        return sum(store.unclaimed for store in self._stores())

    def acquire(self, partitions: list[int]) -> dict[int, int | None]:
        """Own ``partitions`` (each fence bumped, so an older owner's batches are refused); their stored offsets."""
        taken = self.store.acquire_partitions(self.group, self.topic, partitions)
        for p, (fence, stored) in taken.items():
            self.fences[p] = fence
            self.stored[p] = stored
        return {p: stored for p, (_, stored) in taken.items()}

    def release(self, partitions: list[int]) -> None:
        if self.pipeline is not None:  # batches of these partitions end before another member takes them
            self._held += self.pipeline.drain()
        for p in partitions:
            self.fences.pop(p, None)
            self.stored.pop(p, None)

    def stored_offsets(self) -> dict[int, int]:
        found = self.store.stored_offsets(self.group, self.topic)
        if self.pipeline is not None and not self.pipeline.records_in_flight:
            self.stored.update({p: found.get(p) for p in self.stored})  # what the next batch chains on
        return found

    @property
    def records_in_flight(self) -> int:
        """Records submitted whose outcome the loop has not had yet (drained at a rebalance included)."""
        if self.pipeline is None:
            return 0
        return self.pipeline.records_in_flight + sum(len(done.batch) for done in self._held)

    def submit(self, batch: Batch, *, atomic: bool) -> list[Outcome]:
        if self.pipeline is None or not atomic:
            return super().submit(batch, atomic=atomic)
        rows = _rows(batch)
        self.dlq.send(batch.dead)  # durable before the rows and offsets that account for them commit
        offsets = {p: o for (_, p), o in batch.next_offsets.items()}
        fences = {p: self.fences.get(p, -1) for p in offsets}
        expected = {p: self.stored.get(p) for p in offsets}
        self.stored.update(offsets)

        def write(store: Store, turn) -> WriteResult:
            written = store.write_exactly_once(self.table, self.group, rows, offsets, self.topic, fences,
                                               handler=self.handler, before_commit=_at_commit,
                                               expected=expected, turn=turn)
            return WriteResult(written, len(rows) - written)

        return self._finished(self.pipeline.submit(batch, write))

    def drain(self) -> list[Outcome]:
        return self._finished(self.pipeline.drain()) if self.pipeline is not None else []

    def collect(self) -> list[Outcome]:
        return self._finished(self.pipeline.finished()) if self.pipeline is not None else []

    def _finished(self, outcomes: list[Outcome]) -> list[Outcome]:
        """Outcomes in order; after a failure, also those of every later batch (they chained on it)."""
        outcomes, self._held = self._held + outcomes, []
        if any(o.error is not None for o in outcomes):
            outcomes += self.pipeline.drain()
            if not self.lost_connection():
                self.stored_offsets()  # the next batch chains on what Postgres really holds
        return outcomes

    def write(self, batch: Batch, *, atomic: bool) -> WriteResult:
        rows = _rows(batch)
        self.dlq.send(batch.dead)  # durable before the rows and offsets that account for them commit

        if atomic:
            offsets = {p: o for (t, p), o in batch.next_offsets.items()}
            fences = {p: self.fences.get(p, -1) for p in offsets}
            written = self.store.write_exactly_once(self.table, self.group, rows, offsets, self.topic, fences,
                                                    handler=self.handler, before_commit=_at_commit)
            return WriteResult(written, len(rows) - written)
        written = self.store.write_plain(self.table, self.group, rows, handler=self.handler,
                                         before_commit=lambda: faults.reach("inside-pg-transaction"))
        return WriteResult(written, 0)

    def lost_connection(self) -> bool:
        """Whether a failed write means Postgres went away (wait for it) rather than refused something."""
        return self.store.lost() or (self.pipeline is not None and self.pipeline.lost())

    def reconnect(self, give_up_after: float, notice, sleep=time.sleep) -> float:
        """Wait for Postgres to answer again (backing off, ``notice`` told each retry); seconds waited.

        Call it with nothing in flight (after :meth:`drain`). ``sleep`` waits between attempts
        (see :meth:`Store.reconnect`).
        """
        waited = self.store.reconnect(give_up_after, notice, sleep) if not self.store.alive() else 0.0
        if self.pipeline is not None:
            waited += self.pipeline.reconnect(give_up_after - waited, notice, sleep)
        return waited

    def close(self) -> None:
        try:
            if self.pipeline is not None:
                self.pipeline.close()
        finally:
            self.store.close()


def _rows(batch: Batch) -> SinkRows:
    """The batch's rows: as the loop sorted them per batch, or made from its records one by one (a batch is
    sorted one way or the other; only batches merged to be read again hold both, and they are not written)."""
    if batch.rows is not None:
        return batch.rows
    return SinkRows.of([sink_row(rec, key) for rec, key in batch.records])


def _at_commit() -> None:
    faults.reach("inside-pg-transaction")
    faults.reach("after-process-before-commit")

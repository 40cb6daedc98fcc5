"""Where `kdg consume` writes: Postgres rows, another Kafka topic, or stdout.

Every sink takes a :class:`Batch`. Sinks that can store offsets atomically with their results
(``atomic_offsets``) do so under a policy whose commit mode is ``in-sink-transaction``.
The consume loop hands batches to :meth:`Sink.submit` and gets one :class:`Outcome` per batch back: at once
from a sink that writes each batch before the next is polled, later from a pipelined one
(:mod:`kdg.sinks.pipeline`).
"""

from collections import Counter
from dataclasses import dataclass, field

from kdg.records import Record, RecordColumns
from kdg.store.rows import SinkRows


@dataclass
class Batch:
    """What one poll produced, sorted out: rows to write, records to dead-letter, offsets to move."""

    # (record, idempotency key) pairs; a poll sorted a list at a time holds them as columns (RecordColumns)
    records: list[tuple[Record, str]] | RecordColumns = field(default_factory=list)
    dead: list[tuple[Record, str, str | None]] = field(default_factory=list)  # (record, reason, key)
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    first_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    submitted_at: float = 0.0  # time.monotonic() when handed to the sink (commit latency)
    # the good records as sink rows instead of ``records``, sorted straight from a poll for the generic
    # Postgres sink (kdg.batching): no Record per message
    rows: SinkRows | None = None
    first_timestamps: dict[tuple[str, int], int] = field(default_factory=dict)  # per partition, its first record's
    probes: list[tuple[str, int]] = field(default_factory=list)  # the (topic, partition) of each `kdg doctor` probe
    #                                                   record stepped over: read, offsets moved on, nothing written
    filtered: int = 0   # records a transform left out (returned None): read, counted, nothing written
    exploded: int = 0   # rows beyond one per record that transforms made (a record that became several rows)
    # what a route's transform filtered out, (topic, route, key, partition, offset) each: claimed as filtered
    gone: list[tuple] = field(default_factory=list)

    @property
    def good(self) -> int:
        """Records to write (not dead letters)."""
        return len(self.records) + (len(self.rows) if self.rows is not None else 0)

    def topic_partitions(self) -> list[tuple[str, int]]:
        """The (topic, partition) of each record to write."""
        found = list(zip(self.rows.columns[1], self.rows.columns[2])) if self.rows is not None else []
        columns = RecordColumns.of(self.records)
        if columns is not None:
            return found + list(zip(columns.topics, columns.partitions))
        return found + [(rec.topic, rec.partition) for rec, _ in self.records]

    def __len__(self) -> int:
        """The records read (a record a transform made several rows of counts once)."""
        return self.good - self.exploded + len(self.dead) + len(self.probes) + self.filtered

    @staticmethod
    def earliest(batches: "list[Batch]") -> "Batch":
        """Several batches to read again, as one: each partition from the earliest first offset among them."""
        merged = Batch()
        columns = [b.rows for b in batches if b.rows is not None]
        merged.rows = SinkRows.concat(columns) if columns else None
        for batch in batches:
            merged.records += batch.records
            merged.dead += batch.dead
            merged.probes += batch.probes
            merged.filtered += batch.filtered
            merged.exploded += batch.exploded
            merged.gone += batch.gone
            for tp, offset in batch.first_offsets.items():
                merged.first_offsets[tp] = min(offset, merged.first_offsets.get(tp, offset))
            for tp, offset in batch.next_offsets.items():
                merged.next_offsets[tp] = max(offset, merged.next_offsets.get(tp, offset))
        return merged


@dataclass
class WriteResult:
    """Where a batch's good records ended (its ``dead`` are the loop's to count): each in exactly one of these."""

    written: int = 0
    duplicates_suppressed: int = 0
    dead_lettered: int = 0  # records of the batch the sink itself sent to the dead-letter topic
    superseded: int = 0     # an upsert's earlier versions of a key in the same batch
    deleted: int = 0        # tombstones and change-data-capture deletes applied
    filtered: int = 0       # left out on purpose (a tombstone under on_tombstone = ignore)
    dead_reasons: Counter = field(default_factory=Counter)  # the sink's own dead letters, by reason class
    tables: dict = field(default_factory=dict)  # table → its share (kdg.store.unit.PartResult): a routed batch
    events: Counter = field(default_factory=Counter)  # (table or topic, kind): Debezium's heartbeats and schema-
    # change events skipped, and its placeholders read (kind "unavailable"), in this batch


def parse_sink(spec: str) -> tuple[str, str | None]:
    """``postgres`` | ``stdout`` | ``kafka:OUT_TOPIC`` → (kind, out_topic)."""
    from kdg.errors import UsageError

    if spec in ("postgres", "stdout"):
        return spec, None
    kind, sep, topic = spec.partition(":")
    if kind == "kafka" and sep and topic:
        return "kafka", topic
    raise UsageError(f"--sink {spec!r}: use postgres, stdout or kafka:OUT_TOPIC")


@dataclass
class Outcome:
    """A batch the sink is done with: its result, or the error that rolled it back."""

    batch: Batch
    result: WriteResult | None = None
    error: BaseException | None = None


class Sink:
    """What every sink offers the consume loop; a sink only needs ``write`` (and ``close``)."""

    atomic_offsets = False  # results and offsets can commit in one transaction
    keeps_offsets = False   # ... and then the offsets live in the sink, not in Kafka
    records_in_flight = 0   # submitted, outcome not handed back yet
    partitions_dropped = 0  # expired claim partitions its maintenance dropped (the Postgres sink)
    takes_rows = False      # writes a batch's SinkRows (Batch.rows) as they are: the loop may sort per batch

    def write(self, batch: Batch, *, atomic: bool) -> WriteResult:
        raise NotImplementedError

    def submit(self, batch: Batch, *, atomic: bool) -> list[Outcome]:
        """Write ``batch``; the outcomes of the batches finished so far, oldest first.

        An error that means "read the batch again" (fenced, rolled back, Postgres gone) comes back
        as an outcome; any other error is raised.
        """
        from kdg.errors import ConnectionFailed, Fenced, RetryBatch

        try:
            return [Outcome(batch, result=self.write(batch, atomic=atomic))]
        except (Fenced, RetryBatch, ConnectionFailed) as exc:
            return [Outcome(batch, error=exc)]

    def drain(self) -> list[Outcome]:
        """Wait for every batch still being written; their outcomes, oldest first."""
        return []

    def collect(self) -> list[Outcome]:
        """The outcomes of batches finished since the last call, without waiting for the others."""
        return []

    def lost_connection(self) -> bool:
        """Whether a failed write means the sink's server went away (wait for it) rather than refused something."""
        return False

    def maintain_if_due(self) -> list:
        """Look after the sink's own state if it is time (the Postgres sink drops expired claims); the
        passes that were skipped, and why."""
        return []

    def healed(self) -> list[str]:
        """What the sink found of its own state dropped outside kdg since last asked, in words (the Postgres
        sink's claims: :func:`kdg.store.windows.forget_dropped`)."""
        return []

    def field_notes(self) -> list:
        """Mapped fields no record of a batch had, and fields no column maps, found since last asked (a typed
        sink's :class:`kdg.mapping.fields.FieldNote`; each said once)."""
        return []

    def field_counts(self) -> dict[str, int]:
        """Fields said so far by :meth:`field_notes`, by kind (absent, unmapped)."""
        return {}

    def unclaimed(self) -> int:
        """Rows written without a claim, their keys older than the table's window (the Postgres sink)."""
        return 0

    def close(self) -> None:
        pass

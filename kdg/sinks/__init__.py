"""Where `kdg consume` writes: Postgres rows, another Kafka topic, or stdout.

Every sink takes a :class:`Batch`. Sinks that can store offsets atomically with their results
(``atomic_offsets``) do so under a policy whose commit mode is ``in-sink-transaction``.
"""

from dataclasses import dataclass, field

from kdg.records import Record


@dataclass
class Batch:
    """What one poll produced, sorted out: rows to write, records to dead-letter, offsets to move."""

    records: list[tuple[Record, str]] = field(default_factory=list)   # (record, idempotency key)
    dead: list[tuple[Record, str, str | None]] = field(default_factory=list)  # (record, reason, key)
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    first_offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.records) + len(self.dead)


@dataclass
class WriteResult:
    written: int = 0
    duplicates_suppressed: int = 0
    dead_lettered: int = 0  # records of the batch the sink itself sent to the dead-letter topic


def parse_sink(spec: str) -> tuple[str, str | None]:
    """``postgres`` | ``stdout`` | ``kafka:OUT_TOPIC`` → (kind, out_topic)."""
    from kdg.errors import UsageError

    if spec in ("postgres", "stdout"):
        return spec, None
    kind, sep, topic = spec.partition(":")
    if kind == "kafka" and sep and topic:
        return "kafka", topic
    raise UsageError(f"--sink {spec!r}: use postgres, stdout or kafka:OUT_TOPIC")

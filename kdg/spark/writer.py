"""Executor side of `kdg spark-replay` and `kdg spark-stream`: one Spark task writes its rows through the store.

Everything here runs in Spark's Python workers. It holds no driver state: a task gets a picklable
:class:`WriteSpec` (or a :class:`RoutedSpec`, one WriteSpec per topic) and Arrow batches, opens its own
:class:`~kdg.store.pg.Store`, and yields one summary row. Spark keeps only successful tasks' results, so
the summed counts are exact even when a task was retried.

Spark's Kafka source reads one topic-partition (or a slice of one) per task, so a task reads one topic
and writes its route's table (a fan-out's: each route's): its claims and offsets stay per (topic, partition).
A task with a transform, a handler or a fan-out writes through :mod:`kdg.spark.logic`.
"""

import base64
import itertools
import json
from dataclasses import dataclass
from typing import Iterator

from kdg import faults
from kdg.errors import KeylessRecord
from kdg.records import PROBE_HEADER, Record
from kdg.store.rows import SINK_COLUMNS

# what each task counts (summed on the driver): every row read ends in one of rows_written, duplicates_dropped,
# dead_lettered, probes_skipped, superseded, deleted or filtered (kdg.accounting); exploded: rows a transform made
# beyond one per record (rows_read + exploded: what those end in)
SUMMARY_COUNTS = ("rows_read", "rows_written", "duplicates_dropped", "chunks", "dead_lettered", "probes_skipped",
                  "superseded", "deleted", "filtered", "exploded")
# topic: the one topic this task read ("" for none); offsets: {partition: the highest offset it read}, as JSON
SUMMARY_SCHEMA = ", ".join(f"{name} long" for name in SUMMARY_COUNTS) + ", topic string, offsets string"
COLUMNS = SINK_COLUMNS
# a typed sink rebuilds each record: the sink row, its timestamp, and its headers' bytes (kdg.spark.job.sink_rows)
RECORD_COLUMNS = (*SINK_COLUMNS, "timestamp", "header_bytes")


@dataclass(frozen=True)
class DeadLetterSpec:
    """Where a typed sink's executors send rows Postgres refused: ``TOPIC.dlq``, by the policy's rules."""

    guarantee: str
    bootstrap: str
    topic: str
    extra: dict
    group: str             # the replay's or stream's group, stamped on each dead letter (kdg-group)


@dataclass(frozen=True)
class WriteSpec:
    dsn: str
    table: str             # canonical NAME or SCHEMA.NAME (TableName.text); the store quotes it
    group: str
    dedup: bool            # exactly-once: claim each key in kdg_dedup with its row
    chunk_rows: int        # rows per Postgres transaction
    typed: "object | None" = None            # a TypedTarget: the user's table, through a mapping
    dead_letters: DeadLetterSpec | None = None
    id_from: str | None = None             # a json: key, read here in Python where the kdg-id header is missing
    value_format: str = "json"             # how that json: key reads the value (a typed sink: its mapping's)
    registry: dict | None = None           # Schema Registry settings, for schema'd formats (never in Spark's conf)
    transform: object = None               # the route's --transform: module:function (or a function)
    handler: object = None                 # --handler: module:function (or a function), in each chunk's transaction
    roots: tuple[str, ...] = ()            # where the driver found their modules (kdg.spark.logic)
    fans: tuple = ()                       # a fan-out's topic: (route name, WriteSpec) of each of its routes
    from_schema: bool = False              # columns = "from-schema": typed is the table the driver met schemas with
    schemas: frozenset = frozenset()       # ... the record schemas it met (kdg.spark.schemas.record_head)
    refused: tuple = ()                    # ... and (schema, why) of those on_incompatible = dead-letter refuses

    @property
    def has_logic(self) -> bool:
        """A transform, a handler or a fan-out: the task's records go through :mod:`kdg.spark.logic`."""
        return self.transform is not None or self.handler is not None or bool(self.fans)


@dataclass(frozen=True)
class RoutedSpec:
    """Several topics, each with its own :class:`WriteSpec` (its route's table, mapping and dead letters)."""

    specs: dict  # topic → WriteSpec


def _keys(spec: WriteSpec):
    """``fill(key, record)``: the key Spark SQL found, else ``--id-from json:…`` (None: no such option)."""
    if spec.id_from is None:
        return None
    from kdg.keys import KeyResolver

    from kdg.schemas.codecs import optional_decoder

    resolver = KeyResolver(spec.id_from, optional_decoder(spec.value_format, spec.registry),
                           envelope=spec.typed.mapping.envelope if spec.typed is not None else None)
    return lambda key, rec: key if key is not None else resolver.key_or_fallback(rec, fallback=not spec.dedup)


def write_task(batches: Iterator, spec: "WriteSpec | RoutedSpec") -> Iterator:
    """``mapInArrow`` function: write this task's rows in chunks of ``spec.chunk_rows``; yield one summary row."""
    import pyarrow as pa

    topic = ""
    if isinstance(spec, RoutedSpec):
        topic, batches = _one_topic(batches)
        if topic is None:  # nothing to read in this task
            yield pa.RecordBatch.from_pylist([{**dict.fromkeys(SUMMARY_COUNTS, 0), "topic": "", "offsets": "{}"}])
            return
        if topic not in spec.specs:
            raise RuntimeError(f"no route was prepared for topic {topic!r} (the driver prepares each before its batch)")
        spec = spec.specs[topic]
    yield from _write(batches, spec, topic)


def _one_topic(batches: Iterator) -> tuple[str | None, Iterator]:
    """The topic of this task's rows (None: it has none), and the batches as they come, each checked to hold
    only that topic (Spark's Kafka source gives a task one topic-partition)."""
    import pyarrow.compute as pc

    batches = iter(batches)
    first = next((b for b in batches if b.num_rows), None)
    if first is None:
        return None, iter(())
    topic = first.column("topic")[0].as_py()

    def checked():
        for b in itertools.chain([first], batches):
            if b.num_rows and pc.any(pc.not_equal(b.column("topic"), topic)).as_py():
                raise RuntimeError(f"a Spark task read records of {topic!r} and of another topic; kdg writes one "
                                   "topic's records per task")
            yield b

    return topic, checked()


def _write(batches: Iterator, spec: WriteSpec, topic: str) -> Iterator:
    import pyarrow as pa
    from pyspark import TaskContext

    from kdg.store.pg import Store

    ctx = TaskContext.get()
    # fires once: in the first Spark partition, on its first attempt, after one chunk committed (a stream's: in its
    # first micro-batch only, or every batch would lose a worker)
    fault_armed = ctx is not None and ctx.partitionId() == 0 and ctx.attemptNumber() == 0 and \
        ctx.getLocalProperty("streaming.sql.batchId") in (None, "0")
    high: dict[int, int] = {}
    batches = _noting_offsets(batches, high)
    if spec.from_schema and spec.typed is None:
        raise RuntimeError(f"no record schema of {topic!r} was met before its records were written (columns = "
                           '"from-schema": the driver meets each first)')
    if spec.has_logic or spec.typed is not None:
        from kdg.spark.logic import write_with_logic

        write = write_with_logic if spec.has_logic else _write_typed
        yield pa.RecordBatch.from_pylist([{**write(batches, spec, fault_armed), "topic": topic,
                                           "offsets": json.dumps(high)}])
        return
    read = written = dropped = chunks = probes = 0
    seen: set[str] = set()
    pending: list[tuple] = []
    fill = _keys(spec)
    with Store(spec.dsn) as store:
        def flush() -> None:
            nonlocal written, dropped, chunks
            if spec.dedup:
                inserted = store.write_claimed(spec.table, spec.group, pending)
                dropped += len(pending) - inserted
            else:
                inserted = store.write_plain(spec.table, spec.group, pending)
            written += inserted
            chunks += 1
            pending.clear()
            if fault_armed:
                faults.reach("spark-task-mid-write")

        for batch in batches:
            columns = [batch.column(name).to_pylist() for name in COLUMNS]
            for row in zip(*columns):
                read += 1
                if row[0] is None and _is_probe(row[6]):  # `kdg doctor`'s record (job.key_expression)
                    probes += 1
                    continue
                if fill is not None and row[0] is None:
                    row = (fill(None, Record(row[5], row[4], [], row[2], row[1], row[3], None)), *row[1:])
                if spec.dedup:
                    key = row[0]
                    if key is None:
                        raise KeylessRecord(f"record {row[1]}/{row[2]}/{row[3]} has no kdg-id header and no "
                                            "--id-from key; exactly-once needs an idempotency key for every record")
                    if key in seen:  # a repeat within this task's range never reaches Postgres
                        dropped += 1
                        continue
                    seen.add(key)
                pending.append(row)
                if len(pending) >= spec.chunk_rows:
                    flush()
        if pending:
            flush()
    yield pa.RecordBatch.from_pylist(
        [{**dict.fromkeys(SUMMARY_COUNTS, 0), "rows_read": read, "rows_written": written, "duplicates_dropped": dropped,
          "chunks": chunks, "probes_skipped": probes, "topic": topic, "offsets": json.dumps(high)}])


def _is_probe(headers: str | None) -> bool:
    """A keyless row's headers (a JSON object) are `kdg doctor`'s probe record's."""
    return bool(headers) and PROBE_HEADER in json.loads(headers)


def _noting_offsets(batches: Iterator, high: dict[int, int]) -> Iterator:
    """The Arrow batches as they come, noting each partition's highest offset in ``high`` (vectorised: a
    continuous stream stores where each partition got to)."""
    import pyarrow as pa

    for batch in batches:
        if batch.num_rows:
            per = pa.Table.from_batches([batch]).group_by("partition").aggregate([("offset", "max")])
            for p, o in zip(per.column("partition").to_pylist(), per.column("offset_max").to_pylist()):
                high[p] = max(o, high.get(p, -1))
        yield batch


def _write_typed(batches: Iterator, spec: WriteSpec, fault_armed: bool) -> dict:
    """A typed sink's task: each record through the same mapping and store method as `kdg consume`'s."""
    from kdg.mapping import RowMaker
    from kdg.sinks.dead_letters import refused_row
    from kdg.store.pg import Store

    maker, dlq = RowMaker(spec.typed.mapping, spec.registry), _LazyDeadLetters(spec.dead_letters)
    totals = dict.fromkeys(SUMMARY_COUNTS, 0)
    seen: set[str] = set()
    pending: list[tuple[Record, str]] = []
    refused: list[tuple] = []  # columns = "from-schema": (record, why, key) of a schema the driver refused
    fill = _keys(spec)
    with Store(spec.dsn) as store:
        def flush() -> None:
            dlq.send(refused)  # durable before the rows that account for them commit
            totals["dead_lettered"] += len(refused)
            refused.clear()
            if not pending:
                return
            rows = maker.staged(pending)  # made as the COPY reads them
            result = store.write_typed(spec.typed, rows, claim=spec.dedup, dead_letter=lambda unreadable, rejected:
                                       dlq.send(unreadable + [refused_row(*pending[seq], state, message)
                                                              for seq, state, message in rejected]))
            totals["rows_written"] += result.written
            totals["duplicates_dropped"] += result.duplicates
            totals["dead_lettered"] += len(rows.dead) + len(result.rejected)
            totals["superseded"] += result.superseded
            totals["deleted"] += result.deleted
            totals["filtered"] += result.filtered
            totals["chunks"] += 1
            pending.clear()
            if fault_armed:
                faults.reach("spark-task-mid-write")

        for batch in batches:
            for rec, key in keyed_records(batch, spec, fill, seen, totals):
                why = _refused(spec, rec) if spec.from_schema else None
                if why is not None:
                    refused.append((rec, why, key))
                    continue
                pending.append((rec, key))
                if len(pending) >= spec.chunk_rows:
                    flush()
        if pending or refused:
            flush()
    return totals


def _refused(spec: WriteSpec, rec: Record) -> str | None:
    """Columns from the schema: why the driver refused ``rec``'s record schema (None: it met it and the table
    takes it); a schema it never met stops the task, never dropping a field in silence."""
    from kdg.spark.schemas import record_head

    head = record_head(rec.value)
    if head is None or head in spec.schemas:
        return None
    why = dict(spec.refused).get(head)
    if why is None:
        raise RuntimeError(f"record {rec.topic}/{rec.partition}/{rec.offset} carries a schema the driver did not meet "
                           "with its table; nothing of it is written")
    return why


def keyed_records(batch, spec: WriteSpec, fill, seen: set, totals: dict) -> Iterator[tuple[Record, str | None]]:
    """One Arrow batch's records with their idempotency keys (``fill``: --id-from's, for records without one):
    `kdg doctor`'s probes stepped over, and under exactly-once a keyless record refused and a key the task's
    range repeats (in ``seen``) dropped, each counted in ``totals``."""
    for rec, key in _records(batch):
        totals["rows_read"] += 1
        if key is None and rec.is_probe:  # `kdg doctor`'s record (job.key_expression)
            totals["probes_skipped"] += 1
            continue
        if fill is not None:
            key = fill(key, rec)
        if spec.dedup:
            if key is None:
                raise KeylessRecord(f"record {rec.topic}/{rec.partition}/{rec.offset} has no kdg-id header and no "
                                    "--id-from key; exactly-once needs an idempotency key for every record")
            if key in seen:  # a repeat within this task's range: neither transformed nor written
                totals["duplicates_dropped"] += 1
                continue
            seen.add(key)
        yield rec, key


def _records(batch) -> Iterator[tuple[Record, str | None]]:
    """Arrow rows back into records (headers as their bytes, from a JSON object of base64: a repeated name keeps
    its last value, as in `kdg consume`'s mapping)."""
    for key, topic, partition, offset, k, v, _text, ts, raw in zip(
            *[batch.column(name).to_pylist() for name in RECORD_COLUMNS]):
        pairs = [(name, None if h is None else base64.b64decode(h)) for name, h in json.loads(raw).items()]
        yield Record(v, k, pairs, partition, topic, offset, ts), key


class _LazyDeadLetters:
    """The task's dead-letter producer, made on the first dead letter only."""

    def __init__(self, spec: DeadLetterSpec):
        self.spec, self._dlq = spec, None

    def send(self, dead: list) -> None:
        if not dead:
            return
        if self._dlq is None:
            from kdg.guarantees import policy_for
            from kdg.sinks.dead_letters import DeadLetterQueue

            self._dlq = DeadLetterQueue(policy_for(self.spec.guarantee), self.spec.bootstrap, self.spec.topic,
                                        self.spec.extra, self.spec.group)
        self._dlq.send(dead)

"""`kdg mapping check`: a mapping file read and checked against its live table, writing nothing."""

from dataclasses import asdict, dataclass, field
from pathlib import Path

from kdg.mapping.spec import build_mapping, spelled
from kdg.settings import redact_dsn


@dataclass
class MappingCheckReport:
    file: str
    table: str
    mode: str
    key: list[str]
    on_tombstone: str
    create_table: bool
    table_state: str                 # exists | would be created | not checked (--offline)
    envelope: str = "none"           # none | debezium
    dsn: str | None = None           # without its password
    columns: list[dict] = field(default_factory=list)  # name (as SQL spells it), type, from, table_type
    sample: dict | None = None       # --sample: the records read, and what they showed (kdg.mapping.fields)

    @property
    def ok(self) -> bool:
        """False when a sample of the topic has no record with a field the mapping reads."""
        return not (self.sample and self.sample["absent"])

    def to_dict(self) -> dict:
        return asdict(self) | {"ok": self.ok}


def run_mapping_check(path: Path, dsn: str | None, *, sample: int = 0, topic: str | None = None,
                      conn=None) -> MappingCheckReport:
    """Parse ``path``; with ``dsn``, check it against the table there (a dry run: nothing is created); with
    ``sample``, against that many of ``topic``'s latest records too (``conn``: a :class:`kdg.settings.Connection`).

    A problem with the file or the table is a usage error naming it; the sample's findings are in the
    report (``ok`` is False when a mapped field is in none of the records read).
    """
    mapping = build_mapping(file=path)
    shape, state = None, "not checked (--offline)"
    if dsn is not None:
        from kdg.store.pg import Store

        with Store(dsn) as store:
            target, shape = store.prepare_typed(mapping, dry_run=True)
        mapping = target.mapping
        state = "exists" if shape is not None else "would be created"
    found = sample_fields(mapping, conn, topic, sample) if sample else None
    return MappingCheckReport(
        sample=found, file=str(path), table=mapping.table.text, mode=mapping.mode, key=list(map(spelled, mapping.key)),
        on_tombstone=mapping.on_tombstone, create_table=mapping.create_table, table_state=state,
        envelope=mapping.envelope,
        dsn=redact_dsn(dsn) if dsn else None,
        columns=[{"name": spelled(c.name), "type": c.type_name, "from": c.source.spec,
                  "table_type": shape.types.get(c.name) if shape is not None else None} for c in mapping.columns])


def sample_fields(mapping, conn, topic: str, count: int) -> dict:
    """Read the latest ``count`` records of ``topic`` (at most, spread over its partitions) and hold the
    mapping against the rows its ``json:`` sources would read: which mapped fields none of them has, which
    fields none of the columns maps, and the records that could not be read at all."""
    from kdg.mapping import RowMaker
    from kdg.mapping.fields import FieldWatch

    maker, watch = RowMaker(mapping, conn.registry), FieldWatch(mapping)
    records = latest_records(conn, topic, count)
    rows, unreadable = [], 0
    for rec in records:
        try:
            rows.append(maker.document(rec))
        except ValueError:
            unreadable += 1
    watch.batch(rows)
    notes = watch.news()
    return {"topic": topic, "records": len(records), "unreadable": unreadable,
            "absent": [{"field": n.field, "from": n.source} for n in notes if n.kind == "absent"],
            "unmapped": [n.field for n in notes if n.kind == "unmapped"]}


def latest_records(conn, topic: str, count: int) -> list:
    """Up to ``count`` of ``topic``'s latest committed records, as :class:`kdg.records.Record`."""
    import math

    from confluent_kafka import TopicPartition

    from kdg.kafka.admin import watermarks
    from kdg.kafka.clients import reader
    from kdg.records import Record

    ends = watermarks(conn.bootstrap_servers, topic, conn.extra, "read_committed")
    held = sorted((high - low, p) for p, (low, high) in ends.items() if high > low)
    starts, wanted = {}, count
    for i, (available, p) in enumerate(held):  # an even share of each partition, what a small one lacks from the rest
        take = min(available, math.ceil(wanted / (len(held) - i)))
        starts[p], wanted = ends[p][1] - take, wanted - take
    if not starts:
        return []
    consumer = reader(conn.bootstrap_servers, conn.extra, group="kdg-mapping-check")
    records: list = []
    try:
        consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
        left = {p: ends[p][1] for p in starts}
        idle = 0
        while left and len(records) < count and idle < 10:
            msgs = consumer.consume(min(500, count - len(records)), 1.0)
            idle = 0 if msgs else idle + 1
            for msg in msgs:
                if msg.error() is not None:
                    continue
                records.append(Record(msg.value(), msg.key(), msg.headers() or [], msg.partition(), msg.topic(),
                                      msg.offset(), msg.timestamp()[1]))
                if msg.offset() + 1 >= left.get(msg.partition(), 0):
                    left.pop(msg.partition(), None)
    finally:
        consumer.close()
    return records[:count]

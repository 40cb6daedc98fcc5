"""`kdg audit`: compare what the producer ledger says was acknowledged with what reached the sink."""

import time
from collections import Counter
from dataclasses import asdict, dataclass, field

from kdg.records import ID_HEADER
from kdg.settings import Connection, sql_identifier
from kdg.sinks import parse_sink
from kdg.sinks.dead_letters import dlq_topic

EXAMPLES = 5
IDLE_LIMIT_S = 15  # an open transaction can hold read_committed readers back; do not wait forever


@dataclass
class AuditReport:
    topic: str
    sink: str
    group: str | None
    acked: int = 0              # records the producer saw acknowledged (or sent, under acks=0)
    failed: int = 0             # records the producer was told failed
    processed_unique: int = 0   # distinct keys in the sink
    rows: int = 0               # rows in the sink, duplicates included
    dead_lettered: int = 0      # distinct keys in the dead-letter topic
    lost: int = 0               # acked, and neither in the sink nor dead-lettered
    duplicates: int = 0         # rows beyond the first per key
    unexpected: int = 0         # keys in the sink the ledger never acked
    examples: dict = field(default_factory=dict)

    @property
    def balanced(self) -> bool:
        return self.lost == 0 and self.duplicates == 0 and self.unexpected == 0

    def to_dict(self) -> dict:
        return asdict(self) | {"balanced": self.balanced}


def _ledger(store, topic: str) -> tuple[set[str], int]:
    rows = store.fetch("""SELECT idempotency_key, bool_or(status <> 'failed') AS ok
                          FROM kdg_ledger WHERE topic = $1 GROUP BY idempotency_key""", topic)
    acked = {r["idempotency_key"] for r in rows if r["ok"]}
    return acked, len(rows) - len(acked)


def _sink_counts_pg(store, table: str, topic: str, group: str | None) -> Counter:
    rows = store.fetch(f"""SELECT idempotency_key, count(*) AS n FROM {table}
                           WHERE topic = $1 AND ($2::text IS NULL OR consumer_group = $2)
                           GROUP BY idempotency_key""", topic, group)
    return Counter({r["idempotency_key"]: r["n"] for r in rows})


def read_topic_keys(bootstrap: str, topic: str, extra: dict) -> Counter:
    """Count ``kdg-id`` headers in ``topic`` (read_committed) from the beginning to the end."""
    from confluent_kafka import Consumer, TopicPartition

    from kdg.kafka.admin import topic_partitions, watermarks

    counts: Counter = Counter()
    try:
        ends = watermarks(bootstrap, topic, extra)
    except Exception:  # no such topic: nothing was written to it
        return counts
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kdg-audit", "enable.auto.commit": False, "log_level": 2,
                         "isolation.level": "read_committed", **extra})
    todo = {p for p, (low, high) in ends.items() if high > low}
    consumer.assign([TopicPartition(topic, p, ends[p][0]) for p in topic_partitions(bootstrap, topic, extra)])
    idle_since = time.monotonic()
    try:
        while todo and time.monotonic() - idle_since < IDLE_LIMIT_S:
            msgs = consumer.consume(10_000, 1.0)
            if msgs:
                idle_since = time.monotonic()
            for msg in msgs:
                if msg.error():
                    continue
                key = dict(msg.headers() or []).get(ID_HEADER)
                if key is not None:
                    counts[key.decode()] += 1
                if msg.offset() + 1 >= ends[msg.partition()][1]:
                    todo.discard(msg.partition())
            # a partition whose last offsets are transaction markers never yields its end offset
            for p in list(todo):
                pos = consumer.position([TopicPartition(topic, p)])[0].offset
                if pos >= ends[p][1]:
                    todo.discard(p)
    finally:
        consumer.close()
    return counts


def run_audit(topic: str, conn: Connection, *, sink: str = "postgres", table: str = "kdg_events",
              group: str | None = None) -> AuditReport:
    from kdg.store.pg import Store

    kind, out_topic = parse_sink(sink)
    report = AuditReport(topic=topic, sink=sink, group=group)
    with Store(conn.pg_dsn) as store:
        acked, report.failed = _ledger(store, topic)
        if kind == "kafka":
            got = read_topic_keys(conn.bootstrap_servers, out_topic, conn.extra)
        else:
            got = _sink_counts_pg(store, sql_identifier(table), topic, group)
    dead = set(read_topic_keys(conn.bootstrap_servers, dlq_topic(topic), conn.extra))
    report.acked = len(acked)
    report.processed_unique = len(got)
    report.rows = sum(got.values())
    report.dead_lettered = len(dead)
    lost = acked - set(got) - dead
    dups = {k: n for k, n in got.items() if n > 1}
    unexpected = set(got) - acked
    report.lost = len(lost)
    report.duplicates = sum(n - 1 for n in dups.values())
    report.unexpected = len(unexpected)
    report.examples = {"lost": sorted(lost)[:EXAMPLES], "duplicated": sorted(dups)[:EXAMPLES],
                       "unexpected": sorted(unexpected)[:EXAMPLES]}
    return report

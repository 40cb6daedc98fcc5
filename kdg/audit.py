"""`kdg audit`: compare what the producer ledger says was acknowledged with what reached the sink."""

import time
from collections.abc import Iterator
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


# Every count is made in Postgres, so an audit of 100M records needs no more client memory than
# one of 100: the ledger, the sink's keys and the dead-lettered keys are joined server-side.
_KEYS = """CREATE TEMP TABLE {name} (idempotency_key text NOT NULL)"""

_JOIN = """INSERT INTO kdg_audit (k, ok, n, dlq)
WITH led AS (SELECT idempotency_key, bool_or(status <> 'failed') AS ok
             FROM kdg_ledger WHERE topic = $1 GROUP BY idempotency_key),
     got AS ({got}),
     dead AS (SELECT DISTINCT idempotency_key, true AS present FROM kdg_audit_dead)
SELECT idempotency_key, led.ok, got.n, coalesce(dead.present, false)
FROM led FULL JOIN got USING (idempotency_key) LEFT JOIN dead USING (idempotency_key)"""

_GOT_PG = """SELECT idempotency_key, count(*) AS n FROM {table}
             WHERE topic = $1 AND ($2::text IS NULL OR consumer_group = $2) GROUP BY idempotency_key"""
_GOT_TOPIC = "SELECT idempotency_key, count(*) AS n FROM kdg_audit_got GROUP BY idempotency_key"

# One definition of each discrepancy, for the counts and for the example keys alike.
_EXAMPLES = {"lost": "ok AND n IS NULL AND NOT dlq", "duplicated": "n > 1",
             "unexpected": "n IS NOT NULL AND ok IS NOT TRUE"}

_TOTALS = f"""SELECT count(*) FILTER (WHERE ok) AS acked,
                     count(*) FILTER (WHERE NOT ok) AS failed,
                     count(n) AS processed_unique,
                     coalesce(sum(n), 0)::bigint AS rows,
                     count(*) FILTER (WHERE {_EXAMPLES["lost"]}) AS lost,
                     coalesce(sum(n - 1), 0)::bigint AS duplicates,
                     count(*) FILTER (WHERE {_EXAMPLES["unexpected"]}) AS unexpected,
                     (SELECT count(DISTINCT idempotency_key) FROM kdg_audit_dead) AS dead_lettered
              FROM kdg_audit"""


def _load_topic_keys(store, name: str, conn: Connection, topic: str) -> None:
    """Stream the ``kdg-id`` headers of ``topic`` into temp table ``name``, a batch at a time."""
    store.execute(_KEYS.format(name=name))
    for keys in iter_topic_keys(conn.bootstrap_servers, topic, conn.extra):
        store.copy_rows(name, [(k,) for k in keys], ("idempotency_key",))


def iter_topic_keys(bootstrap: str, topic: str, extra: dict) -> Iterator[list[str]]:
    """Yield the ``kdg-id`` headers of ``topic`` (read_committed), a batch at a time, beginning to end."""
    from confluent_kafka import Consumer, TopicPartition

    from kdg.kafka.admin import topic_partitions, watermarks

    try:
        ends = watermarks(bootstrap, topic, extra)
    except Exception:  # no such topic: nothing was written to it
        return
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
            keys = []
            for msg in msgs:
                if msg.error():
                    continue
                key = dict(msg.headers() or []).get(ID_HEADER)
                if key is not None:
                    keys.append(key.decode(errors="replace").replace("\x00", "\ufffd"))  # text holds no NUL
                if msg.offset() + 1 >= ends[msg.partition()][1]:
                    todo.discard(msg.partition())
            if keys:
                yield keys
            # a partition whose last offsets are transaction markers never yields its end offset
            for p in list(todo):
                pos = consumer.position([TopicPartition(topic, p)])[0].offset
                if pos >= ends[p][1]:
                    todo.discard(p)
    finally:
        consumer.close()


def run_audit(topic: str, conn: Connection, *, sink: str = "postgres", table: str = "kdg_events",
              group: str | None = None) -> AuditReport:
    from kdg.store.pg import Store

    kind, out_topic = parse_sink(sink)
    report = AuditReport(topic=topic, sink=sink, group=group)
    with Store(conn.pg_dsn) as store:
        _load_topic_keys(store, "kdg_audit_dead", conn, dlq_topic(topic))
        if kind == "kafka":
            _load_topic_keys(store, "kdg_audit_got", conn, out_topic)
            got, args = _GOT_TOPIC, (topic,)
        else:
            got, args = _GOT_PG.format(table=sql_identifier(table)), (topic, group)
        store.execute("CREATE TEMP TABLE kdg_audit (k text, ok boolean, n bigint, dlq boolean)")
        store.execute(_JOIN.format(got=got), *args)
        for name, value in store.fetch(_TOTALS)[0].items():
            setattr(report, name, value)
        report.examples = {name: [r["k"] for r in store.fetch(
            f'SELECT k FROM kdg_audit WHERE {where} ORDER BY k COLLATE "C" LIMIT {EXAMPLES}')] for name, where in _EXAMPLES.items()}
    return report

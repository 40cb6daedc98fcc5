"""The audit's reading of topics, and its truth when kdg's ledger knows nothing of a topic: the topic itself.

A topic kdg did not produce has no ledger rows, so what should be in the sink is read from the topic:
every record (read_committed, beginning to end) keyed as `kdg consume` keyed it (:class:`kdg.keys.KeyResolver`
with the same ``--id-from``). A key is lost when its group read past one of its records and the sink has
no row of it, and none of its records was accounted for otherwise (dead-lettered, or, in a typed table,
a tombstone or a change event's delete that removed it or was left out). The unit is the key, not the
record: the versions of one key that an upsert folded into one row are one key. Keys in the sink that the
topic no longer holds (its retention dropped them) cannot be told from strangers, so "unexpected" is not
counted from a topic.
"""

import time
from collections.abc import Callable, Iterator

from kdg.errors import ConnectionFailed, UnknownTopic, UsageError
from kdg.keys import KeyResolver
from kdg.records import GROUP_HEADER, Record

IDLE_LIMIT_S = 15  # an open transaction can hold read_committed readers back; do not wait forever
OPEN_TXN_WAIT_S = 10.0  # how long an open transaction in a topic the audit reads is waited for
SOURCE_HEADER = "kdg-source"  # a dead letter's TOPIC/PARTITION/OFFSET (kdg.sinks.dead_letters)

# Which truth an audit used: the producer ledger kdg wrote, or the topic read back.
LEDGER, TOPIC = "ledger", "topic"

# The sink's keys per source record, for both joins: a transform's explode wrote the i-th row of record KEY
# as KEY#i (kdg.flow.transform), so a sink key ending in #i that is not itself a key of the truth (``led``)
# counts for KEY, and a record's rows count once: ``n`` is 1 plus the rows beyond the first of each KEY#i.
PER_RECORD = """rows_of AS ({got}),
     named AS (SELECT CASE WHEN r.idempotency_key ~ '#[0-9]+$' AND NOT EXISTS (
                               SELECT 1 FROM led WHERE led.idempotency_key = r.idempotency_key)
                          THEN regexp_replace(r.idempotency_key, '#[0-9]+$', '') ELSE r.idempotency_key END
                          AS idempotency_key, r.n, r.gp, r.go
               FROM rows_of r),
     got AS (SELECT idempotency_key, (sum(n) - count(*) + 1)::bigint AS n, min(gp) AS gp, min(go) AS go
             FROM named GROUP BY idempotency_key)"""
# Keys a transform filtered out of the sink's table (claimed as filtered: kdg.store.filtered), for both joins
FILTERED = "filt AS (SELECT DISTINCT idempotency_key, true AS present FROM kdg_audit_filtered)"

# Each record read: its key (``keyed`` false: unreadable, named by where it was read), where it was read,
# its time and whether it is a tombstone.
_SOURCE_TABLE = ("CREATE TEMP TABLE kdg_audit_src (k text NOT NULL, p int NOT NULL, o bigint NOT NULL, ts bigint, "
                 "keyed boolean NOT NULL, tomb boolean NOT NULL)")
_SOURCE_COLUMNS = ("k", "p", "o", "ts", "keyed", "tomb")

# :data:`kdg.audit._JOIN`'s counterpart with the topic as the truth, into the same ``kdg_audit`` rows, so
# one set of definitions counts both. Per key: ``passed`` when the group's position is past one of its
# records; ``dlq`` when one of its records was dead-lettered, by key or by where it was read (a record whose
# key could not be read has none), or ({tombs}) in a typed table, a tombstone deleted or left it out;
# ``outside`` as in the ledger's join, with the record's own time for a key's time. Only the topic's keys
# are joined (a LEFT JOIN): no key is unexpected. $5 is unused here.
TOPIC_JOIN = """INSERT INTO kdg_audit (k, ok, n, dlq, passed, p, outside, beyond, elsewhere, filtered)
WITH dead_at AS (SELECT DISTINCT source FROM kdg_audit_dl WHERE source IS NOT NULL),
     src AS (SELECT s.k, s.p, s.ts, coalesce(NOT $2 OR s.o < pos.next_offset, false) AS passed,
                    dead_at.source IS NOT NULL OR (s.tomb AND {tombs}) AS accounted
             FROM kdg_audit_src s LEFT JOIN kdg_audit_pos pos ON pos."partition" = s.p
                  LEFT JOIN dead_at ON dead_at.source = $1 || '/' || s.p || '/' || s.o),
     led AS (SELECT k AS idempotency_key, min(p) AS p, bool_or(passed) AS passed, bool_or(accounted) AS accounted,
                    bool_or(($3::timestamptz IS NULL OR ts >= extract(epoch FROM $3::timestamptz) * 1000)
                            AND ($4::timestamptz IS NULL OR ts < extract(epoch FROM $4::timestamptz) * 1000)) AS inside,
                    max(ts) AS t
             FROM src GROUP BY k),
     {per_record},
     arg AS (SELECT $5::bigint AS ledger_horizon, $7::text AS sink_arg),  -- typed here, used or not
     dead AS (SELECT DISTINCT idempotency_key, true AS present FROM kdg_audit_dl),
     {filtered},
     elsewhere AS ({elsewhere})
SELECT idempotency_key, true, got.n, led.accounted OR coalesce(dead.present, false), led.passed, led.p,
       NOT led.inside OR coalesce($8 AND got.n IS NULL AND coalesce(kdg_key_ms(idempotency_key), led.t) < $6, false),
       coalesce(got.n > 1 AND coalesce(kdg_key_ms(idempotency_key), led.t) < $6, false),
       elsewhere.idempotency_key IS NOT NULL, coalesce(filt.present, false)
FROM led LEFT JOIN got USING (idempotency_key) LEFT JOIN dead USING (idempotency_key)
     LEFT JOIN elsewhere USING (idempotency_key) LEFT JOIN filt USING (idempotency_key)""".replace(
    "{per_record}", PER_RECORD).replace("{filtered}", FILTERED)

TOPIC_NOTE = ("no ledger of this topic: the topic itself is the truth, each record keyed as --id-from says; a key is "
              "lost once the group read past it with no row and no dead letter. Keys the topic no longer holds "
              "(retention) cannot be told from strangers, so nothing is counted unexpected")


def has_ledger(store, topic: str) -> bool:
    """Whether kdg's producer ledger holds any record of ``topic``."""
    return store.fetchval("SELECT EXISTS (SELECT 1 FROM kdg_ledger WHERE topic = $1)", topic)


def require_topic(bootstrap: str, topic: str, extra: dict) -> None:
    """A topic neither in Kafka nor in the ledger is a usage error (exit 2): nothing could be audited."""
    from kdg.kafka.admin import topic_partitions

    try:
        topic_partitions(bootstrap, topic, extra)
    except UnknownTopic:
        raise UnknownTopic(f"topic {topic!r} does not exist in Kafka, and kdg's ledger has no record of it: "
                           "nothing to audit (is it spelled as the consumer read it?)") from None


def key_resolver(id_from: str | None, envelope: str | None, value_format: str | None,
                 registry: dict[str, str] | None) -> KeyResolver:
    """The consume's :class:`KeyResolver`, from the options it was given (checked before anything is read)."""
    from kdg.mapping.spec import ENVELOPES
    from kdg.schemas import check_format
    from kdg.schemas.codecs import optional_decoder

    if envelope not in (None, *ENVELOPES):
        raise UsageError(f"--envelope {envelope!r}: use {' or '.join(ENVELOPES)}")
    value_format = check_format(value_format or "json")
    return KeyResolver(id_from, optional_decoder(value_format, registry) if id_from else None,
                       envelope=envelope or "none")


def load_topic(store, bootstrap: str, topic: str, extra: dict, resolver: KeyResolver) -> tuple[int, int]:
    """Read ``topic`` into temp table ``kdg_audit_src``, each record keyed by ``resolver`` as `kdg consume` keyed
    it; returns (records, distinct keys). A record `kdg doctor` wrote is stepped over, as the consumer does."""
    store.execute("DROP TABLE IF EXISTS kdg_audit_src")
    store.execute(_SOURCE_TABLE)
    records = 0
    deletes = None  # under an envelope, a change event's delete is one as well as a tombstone
    if resolver.envelope != "none":
        from kdg.mapping.events import RecordReader

        deletes = RecordReader((), (), envelope=resolver.envelope, decode_value=resolver.decode)
    for rows in iter_topic(bootstrap, topic, extra, lambda msg: _keyed(resolver, deletes, topic, msg)):
        rows = [r for r in rows if r is not None]
        records += len(rows)
        store.copy_rows("kdg_audit_src", rows, _SOURCE_COLUMNS)
    return records, store.fetchval("SELECT count(DISTINCT k) FROM kdg_audit_src WHERE keyed")


def _keyed(resolver: KeyResolver, deletes, topic: str, msg) -> tuple | None:
    """One record as ``kdg_audit_src`` holds it, keyed as ``kdg.flow.source.sort_batch`` keys it; None: a probe.
    ``deletes``: what reads a change event, to tell its deletes (None: only tombstones delete)."""
    partition, offset = msg.partition(), msg.offset()
    rec = Record(msg.value(), msg.key(), msg.headers() or [], partition, topic, offset, msg.timestamp()[1])
    where = f"{topic}/{partition}/{offset}"
    try:
        key, keyed = resolver.key(rec), True
    except ValueError:  # unreadable: the consumer dead-lettered it without a key
        if rec.is_probe:
            return None
        key, keyed = where, False
    if (key is None or resolver.kind == "offset") and rec.is_probe:
        return None
    # no key: at-least-once and at-most-once write it under where it was read (exactly-once stops there)
    return (key if key is not None else where), partition, offset, rec.timestamp, keyed, _deletes(deletes, rec)


def _deletes(deletes, rec: Record) -> bool:
    if rec.value is None or deletes is None:
        return rec.value is None
    try:
        return deletes.document(rec).deleted
    except ValueError:  # not a change event: its dead letter accounts for it
        return False


def output_key_picker(resolver: KeyResolver) -> Callable | None:
    """How to key an output topic's records (a Kafka sink copies each input record's value, key and headers):
    as the input's were keyed, when ``--id-from`` reads what was copied (``header:``, ``json:``); None when
    only their ``kdg-id`` headers can say (``offset``: an output record's offset is its own)."""
    if resolver.kind not in ("header", "json"):
        return None

    def pick(msg) -> tuple:
        rec = Record(msg.value(), msg.key(), msg.headers() or [], msg.partition(), msg.topic(), msg.offset())
        try:
            key = resolver.key(rec)
        except ValueError:
            key = None
        group = rec.header(GROUP_HEADER)
        return key, None if group is None else group.decode(errors="replace")

    return pick


def iter_topic(bootstrap: str, topic: str, extra: dict, pick: Callable) -> Iterator[list]:
    """Yield ``pick(message)`` of each record of ``topic`` (read_committed, beginning to end), a batch at a time.
    An absent topic yields nothing."""
    from confluent_kafka import KafkaError, TopicPartition

    from kdg.kafka.access import check
    from kdg.kafka.admin import topic_partitions
    from kdg.kafka.clients import reader

    try:
        ends = _stable_ends(bootstrap, topic, extra)
    except UnknownTopic:  # nothing was written to it
        return
    consumer = reader(bootstrap, extra, group="kdg-audit")
    todo = {p for p, (low, high) in ends.items() if high > low}
    consumer.assign([TopicPartition(topic, p, ends[p][0]) for p in topic_partitions(bootstrap, topic, extra)])
    idle_since = time.monotonic()
    try:
        while todo and time.monotonic() - idle_since < IDLE_LIMIT_S:
            msgs = consumer.consume(10_000, 1.0)
            if msgs:
                idle_since = time.monotonic()
            found = []
            for msg in msgs:
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    check(msg.error(), f"reading {topic!r}")
                    raise ConnectionFailed(f"cannot read {topic!r} to its end: {msg.error().str()}")
                found.append(pick(msg))
                if msg.offset() + 1 >= ends[msg.partition()][1]:
                    todo.discard(msg.partition())
            if found:
                yield found
            # a partition whose last offsets are transaction markers never yields its end offset
            for p in list(todo):
                pos = consumer.position([TopicPartition(topic, p)])[0].offset
                if pos >= ends[p][1]:
                    todo.discard(p)
        if todo:  # a count built on a partial read would call every unread record lost
            raise ConnectionFailed(f"could not read {topic!r} to its end within {IDLE_LIMIT_S} s "
                                   f"(partitions {sorted(todo)} stopped short); nothing was counted")
    finally:
        consumer.close()


def _stable_ends(bootstrap: str, topic: str, extra: dict) -> dict[int, tuple[int, int]]:
    """``topic``'s watermarks as read_committed sees them, once no transaction is open in it (waited for up to
    :data:`OPEN_TXN_WAIT_S`). Committed records after an open transaction cannot be read until it ends (a
    writer killed mid-transaction holds it open until Kafka times it out): a count made then would call them
    lost, so it is a :class:`ConnectionFailed` (exit 5) instead."""
    from kdg.kafka.admin import high_watermarks, watermarks

    deadline = time.monotonic() + OPEN_TXN_WAIT_S
    while True:
        ends = watermarks(bootstrap, topic, extra)
        highs = high_watermarks(bootstrap, topic, extra)
        held = {p: stable for p, (_, stable) in ends.items() if stable < highs.get(p, stable)}
        if not held:
            return ends
        if time.monotonic() >= deadline:
            shown = ", ".join(f"{p} from offset {offset}" for p, offset in sorted(held.items()))
            raise ConnectionFailed(
                f"{topic!r} has a transaction open (partition {shown}) after {OPEN_TXN_WAIT_S:g} s: its writer is "
                "still writing, or died mid-transaction and Kafka aborts it after its transaction.timeout.ms. "
                "Records committed after it cannot be read yet, so nothing was counted; audit again once it ends")
        time.sleep(0.5)

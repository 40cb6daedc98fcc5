"""Whose positions an audit counts with: a missing record is lost only once its group has read past it.

With ``-G`` that group's. Without it, the groups that consumed the topic decide:

- a kdg-shaped sink names each row's ``consumer_group``, and an output topic each record's (its
  ``kdg-group`` header): each group that wrote into it is audited on its own (its rows, its positions);
- any other sink (a user's table, an output topic written before kdg-group), or one nobody wrote into
  yet, cannot be split: the groups with positions on the topic (``kdg_offsets``, or offsets committed to Kafka)
  are used if there is one, or if all of them stand at the same place in the ledger (the topic, without
  one); else the user is asked for one (a usage error listing them). No group at all: every missing record
  counts as lost.
"""

import time
from dataclasses import dataclass
from typing import NoReturn

from kdg.errors import ConnectionFailed, UnknownTopic, UsageError
from kdg.settings import Connection

# kdg's own assign()-only readers (kdg.kafka.clients.reader): they never commit, so they should never show;
# left out anyway, since none of them consumes for a sink
INTERNAL_GROUPS = frozenset({"kdg-reader", "kdg-audit", "kdg-watermarks", "kdg-end-check", "kdg-replay-ranges",
                             "kdg-scenario-reader"})
GIVE_UP_AFTER_S = 30  # a group coordinator still loading after a restart answers "try again"

# Per partition, how many acknowledged ledger rows the positions $2/$3 have passed (as the audit's
# ``passed`` counts them); two groups with the same answer call the same records lost.
_PASSED = """SELECT pos.p, count(*) AS n FROM unnest($2::int[], $3::bigint[]) AS pos(p, o)
             JOIN kdg_ledger_keys l ON l.topic = $1 AND l."partition" = pos.p AND l.status <> 'failed'
                              AND (l."offset" IS NULL OR l."offset" < pos.o)
             GROUP BY pos.p"""
# ... and with the topic as the truth (kdg.audit_topic), how many of its records they have passed
_PASSED_IN_TOPIC = """SELECT pos.p, count(*) AS n FROM unnest($2::int[], $3::bigint[]) AS pos(p, o)
                      JOIN kdg_audit_src s ON s.p = pos.p AND s.o < pos.o AND $1::text IS NOT NULL
                      GROUP BY pos.p"""


@dataclass(frozen=True)
class Standing:
    """One audit's group: whose rows it counts and whose positions tell lost from pending."""

    rows_of: str | None                  # only this group's rows of a kdg-shaped sink (None: every row)
    positions_of: str | None             # the group (or agreeing groups, comma-joined); None: none known
    next_offsets: dict[int, int] | None  # partition → the next offset to read; None: every record passed
    several: bool = False                # positions_of names several groups that agree (their dead letters all count)

    @property
    def group(self) -> str | None:
        """The one group whose positions count (None: several agreeing, or none known)."""
        return None if self.several else self.positions_of


def standings(store, conn: Connection, topic: str, group: str | None, *, rows_table: str | None,
              sink: str, from_topic: bool = False) -> list[Standing]:
    """One :class:`Standing` per audit to make: several only when several groups wrote into a kdg-shaped sink.

    ``rows_table``: the sink table's SQL name when it has a ``consumer_group`` column (else None);
    ``sink``: how to name the sink to the user (``kafka:OUT``, or the table); ``from_topic``: the truth is
    the topic read into ``kdg_audit_src`` (groups agree when they passed the same records of it), not the ledger.
    """
    if group is not None:
        return [Standing(group, group, positions(store, conn, topic, group))]
    writers = _writers(store, topic, rows_table) if rows_table is not None else []
    if len(writers) == 1:
        return [Standing(None, writers[0], positions(store, conn, topic, writers[0]))]
    if writers:
        return [Standing(w, w, positions(store, conn, topic, w)) for w in writers]
    found = {g: positions(store, conn, topic, g) for g in sorted(_positioned(store, conn, topic))}
    if not found:
        return [Standing(None, None, None)]
    if len({_passed(store, topic, offsets, from_topic) for offsets in found.values()}) > 1:
        why = (f"no record of {sink} names the group that wrote it (a kdg-group header)"
               if sink.startswith("kafka:") else f"none of them wrote into {sink}" if rows_table is not None else
               f"{sink} has no consumer_group column to tell their rows apart")
        raise UsageError(f"{len(found)} groups consumed {topic!r} and stand at different positions "
                         f"({', '.join(found)}); {why}: pass -G GROUP to audit one")
    return [Standing(None, ", ".join(found), next(iter(found.values())), several=len(found) > 1)]


def _writers(store, topic: str, table: str) -> list[str]:
    return [r["g"] for r in store.fetch(
        f"SELECT DISTINCT consumer_group AS g FROM {table} WHERE topic = $1 AND consumer_group IS NOT NULL "
        "ORDER BY 1", topic)]


def _positioned(store, conn: Connection, topic: str) -> set[str]:
    """Groups with positions on ``topic``: in ``kdg_offsets`` or committed to Kafka; kdg's own readers left out."""
    stored = {r["g"] for r in store.fetch(
        "SELECT DISTINCT consumer_group AS g FROM kdg_offsets WHERE topic = $1 AND next_offset IS NOT NULL", topic)}
    return (stored | _kafka_groups(conn, topic)) - INTERNAL_GROUPS


def _passed(store, topic: str, next_offsets: dict[int, int], from_topic: bool) -> frozenset:
    parts = sorted(next_offsets)
    return frozenset((r["p"], r["n"]) for r in store.fetch(_PASSED_IN_TOPIC if from_topic else _PASSED, topic,
                                                           parts, [next_offsets[p] for p in parts]))


def positions(store, conn: Connection, topic: str, group: str) -> dict[int, int]:
    """The group's next offset per partition: the furthest of Postgres (``kdg_offsets``) and Kafka (committed)."""
    found = {p: o for p, o in _kafka_committed(conn, topic, group).items() if o is not None}
    for r in store.fetch('SELECT "partition", next_offset FROM kdg_offsets WHERE consumer_group = $1 AND topic = $2 '
                         "AND next_offset IS NOT NULL", group, topic):
        found[r["partition"]] = max(found.get(r["partition"], 0), r["next_offset"])
    return found


def load_positions(store, next_offsets: dict[int, int] | None) -> bool:
    """``next_offsets`` into temp table ``kdg_audit_pos``; False when no group's positions are known."""
    store.execute('DROP TABLE IF EXISTS kdg_audit_pos')
    store.execute('CREATE TEMP TABLE kdg_audit_pos ("partition" int PRIMARY KEY, next_offset bigint)')
    if next_offsets is None:
        return False
    store.copy_rows("kdg_audit_pos", sorted(next_offsets.items()), ("partition", "next_offset"))
    return True


def _kafka_committed(conn: Connection, topic: str, group: str) -> dict[int, int | None]:
    from confluent_kafka import KafkaException

    from kdg.kafka.access import check
    from kdg.kafka.admin import topic_partitions
    from kdg.kafka.clients import reader
    from kdg.kafka.consumer import committed_offsets

    try:
        partitions = topic_partitions(conn.bootstrap_servers, topic, conn.extra)
    except UnknownTopic:
        return {}
    consumer = reader(conn.bootstrap_servers, conn.extra, group=group)
    try:
        return committed_offsets(consumer, topic, partitions)
    except KafkaException as exc:
        check(exc.args[0], f"reading group {group!r}'s committed offsets")
        raise ConnectionFailed(f"cannot read group {group!r}'s committed offsets: {exc.args[0].str()}") from exc
    finally:
        consumer.close()


def _kafka_groups(conn: Connection, topic: str) -> set[str]:
    """The groups with an offset committed to Kafka on a partition of ``topic``."""
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition

    from kdg.kafka.admin import topic_partitions
    from kdg.kafka.clients import admin_client

    try:
        partitions = [TopicPartition(topic, p) for p in topic_partitions(conn.bootstrap_servers, topic, conn.extra)]
    except UnknownTopic:
        return set()
    admin = admin_client(conn.bootstrap_servers, conn.extra)
    try:
        listed = admin.list_consumer_groups(request_timeout=15).result()
    except KafkaException as exc:
        _fail(exc, "listing consumer groups")
    if listed.errors:
        _fail(KafkaException(listed.errors[0]), "listing consumer groups")
    todo, found = {g.group_id for g in listed.valid} - INTERNAL_GROUPS, set()
    deadline = time.monotonic() + GIVE_UP_AFTER_S
    while todo:
        asked = {g: admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(g, partitions)],
                                                      request_timeout=15)[g] for g in todo}
        for g, future in asked.items():
            try:
                if any(tp.offset >= 0 for tp in future.result().topic_partitions):
                    found.add(g)
                todo.discard(g)
            except KafkaException as exc:
                if not exc.args[0].retriable() or time.monotonic() >= deadline:
                    _fail(exc, f"reading group {g!r}'s committed offsets")
        if todo:
            time.sleep(0.5)
    return found


def _fail(exc, doing: str) -> NoReturn:
    from kdg.kafka.access import check

    check(exc.args[0], doing)
    raise ConnectionFailed(f"{doing} in Kafka failed: {exc.args[0].str()}") from exc

"""Dead letters: records a sink cannot take go to ``TOPIC.dlq`` with the reason in headers; nothing is lost."""

import functools
import re
import threading
from collections import Counter

from kdg.guarantees import DeliveryPolicy
from kdg.kafka.admin import ensure_topic
from kdg.kafka.clients import Role
from kdg.kafka.producer import KdgProducer
from kdg.records import GROUP_HEADER, ID_HEADER, Record

REASON_HEADER = "kdg-dlq-reason"
SQLSTATE_HEADER = "kdg-sqlstate"        # a row Postgres refused: its SQL error code, e.g. 23514
SQL_MESSAGE_HEADER = "kdg-sql-message"  # ... and the error's message


def refused_row(rec: Record, key: str, sqlstate: str, message: str) -> tuple:
    """A dead letter for a row Postgres refused, with the SQL error's code and message in headers."""
    return (rec, f"postgres refused the row: {sqlstate} {message}", key,
            [(SQLSTATE_HEADER, sqlstate.encode()), (SQL_MESSAGE_HEADER, message.encode())])


def reason_class(reason: str | None, sqlstate: str | None = None) -> str:
    """A dead letter's reason without its particulars, to count alike ones together.

    ``oversize: 2000000 bytes > 1048576`` → ``oversize``; a row Postgres refused → its SQLSTATE and
    condition name, e.g. ``postgres refused the row: 23514 check_violation``.
    """
    if sqlstate:
        return f"postgres refused the row: {sqlstate} {_condition(sqlstate)}".rstrip()
    if not reason:
        return "(no reason header)"
    return reason.split(":", 1)[0][:80]


def tally(dead: list[tuple]) -> Counter:
    """Dead letters ``(record, reason, key[, headers])`` counted by :func:`reason_class`."""
    counts: Counter = Counter()
    for _, reason, _, *extra in dead:
        state = next((v.decode() for k, v in extra[0] if k == SQLSTATE_HEADER), None) if extra else None
        counts[reason_class(reason, state)] += 1
    return counts


def _condition(sqlstate: str) -> str:
    """Postgres's condition name for a SQLSTATE (as asyncpg names its exception classes), or ''."""
    return _conditions().get(sqlstate, "")


@functools.cache
def _conditions() -> dict[str, str]:
    """Every SQLSTATE asyncpg knows → its condition name, built once (an audit asks per dead letter)."""
    import asyncpg

    names, classes = {}, [asyncpg.PostgresError]
    for cls in classes:
        if (state := getattr(cls, "sqlstate", None)) and state not in names:
            names[state] = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__.removesuffix("Error")).lower()
        classes.extend(cls.__subclasses__())
    return names


def dlq_topic(topic: str) -> str:
    return f"{topic}.dlq"


def dead_letter_headers(rec: Record, reason: str, key: str | None, group: bytes) -> list[tuple[str, bytes]]:
    """The record's headers, then the reason, where it was read, the group that read it (``kdg-group``: an
    audit counts a dead letter for that group only) and its key."""
    headers = [(k, v) for k, v in rec.headers if k != ID_HEADER]
    headers += [(REASON_HEADER, reason.encode()), ("kdg-source", f"{rec.topic}/{rec.partition}/{rec.offset}".encode()),
                (GROUP_HEADER, group)]
    if key is not None:
        headers.append((ID_HEADER, key.encode()))
    return headers


class DeadLetterQueue:
    """A durable (acks=all, idempotent) producer of dead letters: each to its source topic's ``TOPIC.dlq``,
    created on first use.

    The producer is made at once, so a property it cannot take fails the command before any record is read.
    """

    def __init__(self, policy: DeliveryPolicy, bootstrap: str, topic: str | None, extra: dict, group: str):
        """``topic``: the one source topic (Spark's task), or None: each dead letter's own record's."""
        self.bootstrap, self.extra, self.group = bootstrap, extra, group.encode()
        self.topic = dlq_topic(topic) if topic is not None else "TOPIC.dlq"  # as errors name it
        self._fixed = topic
        # failures only: a dead letter Kafka refuses is an error of the batch that sent it (see send)
        self._producer = KdgProducer(policy, bootstrap, extra, role=Role.DEAD_LETTERS, every_report=False)
        self._ready: set[str] = set()
        self._sending = threading.Lock()  # a pipelined batch's refused rows go from its connection's thread

    def send(self, dead: list[tuple], producer=None) -> None:
        """Send ``dead``; through ``producer`` (an open transaction) when given, else durably now: a dead
        letter Kafka refuses or does not acknowledge raises :class:`~kdg.errors.DeliveryError`, before the
        caller commits anything that accounts for it.

        Each is ``(record, reason, key)``, or ``(record, reason, key, extra_headers)``.
        """
        if not dead:
            return
        with self._sending:
            self._send(dead, producer)

    def _send(self, dead: list[tuple], producer) -> None:
        own = producer is None
        target = self._producer if own else producer
        sent = set()
        for rec, reason, key, *extra in dead:
            topic = dlq_topic(self._fixed or rec.topic)
            if topic not in self._ready:
                ensure_topic(self.bootstrap, topic, partitions=1, extra=self.extra)
                self._ready.add(topic)
            sent.add(topic)
            headers = dead_letter_headers(rec, reason, key, self.group)
            target.send(topic, rec.value, rec.key, headers + extra[0] if extra else headers)
        if own:
            self._producer.deliver(f"dead letters to {', '.join(sorted(sent))}", timeout=60)

"""The one module that owns confluent-kafka's Consumer: config from the policy, batches, offsets, rebalances."""

import time
from typing import Callable

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, OFFSET_STORED, KafkaError, KafkaException, Message, TopicPartition

from kdg.errors import DeliveryError, UsageError
from kdg.guarantees import DeliveryPolicy
from kdg.kafka.access import FatalWatch, check
from kdg.kafka.clients import Role, client_config, new_consumer
from kdg.lifecycle import StopRequested

_REBALANCED = {KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID, KafkaError.REBALANCE_IN_PROGRESS,
               KafkaError.FENCED_INSTANCE_ID, KafkaError._ASSIGNMENT_LOST, KafkaError._NO_OFFSET}


COMMIT_RETRY_S = 60  # how long a commit is asked again while the group's coordinator moves or loads
# the group coordinator moving or still loading its offsets, or a slow answer: asking again is the fix.
# _WAIT_COORD is librdkafka's own "no coordinator yet" (a soak's at-least-once consumer died of it after a
# broker kill: "Commit failed: Local: Waiting for coordinator"); librdkafka does not call it retriable
_TRANSIENT = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
              KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.REQUEST_TIMED_OUT, KafkaError._TIMED_OUT,
              KafkaError._WAIT_COORD}


def committed_offsets(consumer, topic: str, partitions: list[int], give_up_after: float = 30,
                      stop: Callable[[], bool] | None = None) -> dict[int, int | None]:
    """The group's committed next offsets of ``partitions`` (None: never committed), read with ``consumer``.

    Right after a broker restart or a consumer crash the group's coordinator may be moving or
    loading ("Not coordinator"); a member that died inside a transaction leaves the group's offsets unstable
    until Kafka aborts it (a read then times out). Such answers are asked again for ``give_up_after`` seconds,
    then the last KafkaException is raised; ``stop()`` true ends the wait with :class:`StopRequested`.
    """
    deadline = time.monotonic() + give_up_after
    while True:
        try:
            found = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
            return {tp.partition: tp.offset if tp.offset >= 0 else None for tp in found}
        except KafkaException as exc:
            err = exc.args[0]
            if not (err.retriable() or err.code() in _TRANSIENT) or time.monotonic() >= deadline:
                raise
            if stop is not None and stop():
                raise StopRequested("the group's committed offsets") from exc
            time.sleep(0.5)


class StartOffset:
    """``-o``: beginning | end | stored | N | s@TIMESTAMP_MS."""

    def __init__(self, spec: str = "stored"):
        self.spec = spec
        self.timestamp = None
        if spec in ("beginning", "end", "stored"):
            self.absolute = None
        elif spec.startswith("s@") and spec[2:].isdigit():
            self.timestamp = int(spec[2:])
            self.absolute = None
        elif spec.lstrip("-").isdigit() and int(spec) >= 0:
            self.absolute = int(spec)
        else:
            raise UsageError(f"-o {spec!r}: use beginning, end, stored, an offset N or s@TIMESTAMP_MS")

    @property
    def reset(self) -> str:
        return "latest" if self.spec == "end" else "earliest"

    def explicit(self) -> bool:
        return self.spec != "stored"

    def kafka_offset(self) -> int:
        return {"beginning": OFFSET_BEGINNING, "end": OFFSET_END}.get(self.spec, self.absolute
                                                                        if self.absolute is not None else OFFSET_STORED)


PATTERN_REFRESH_MS = 5_000  # a pattern's new topics are found within this (a -X property of that name wins)


class KdgConsumer:
    """A group consumer bound to one delivery policy; kdg alone decides when offsets commit."""

    def __init__(self, policy: DeliveryPolicy, bootstrap: str, group: str, extra: dict | None = None,
                 start: StartOffset | None = None, eof: bool = False, offsets_wait_s: float = 30,
                 stop: Callable[[], bool] | None = None, patterns: bool = False):
        """``patterns``: topics are subscribed to by pattern too; the cluster's topics are then looked at every
        :data:`PATTERN_REFRESH_MS` (librdkafka's default is 5 minutes) so that a new topic is read soon."""
        self.policy = policy
        self.offsets_wait_s, self._stop = offsets_wait_s, stop  # how long, and until what, committed() waits
        self.start = start or StartOffset()
        config = client_config(Role.CONSUMER, bootstrap, extra, policy, **{
            "group.id": group, "auto.offset.reset": self.start.reset, "enable.partition.eof": eof,
            **({"topic.metadata.refresh.interval.ms": PATTERN_REFRESH_MS} if patterns else {})})
        self._errors = FatalWatch()  # error_cb: a fatal error heard means the client can read no more
        self._consumer = new_consumer({**config, "error_cb": self._errors})
        self.eof_partitions: set[tuple[str, int]] = set()
        self.assigned: set[tuple[str, int]] = set()
        self.ever_assigned: set[tuple[str, int]] = set()
        self.stored_wins = False  # several topics: -o is for partitions without a stored position (initial_offset)
        self._seen_first_assignment: set[tuple[str, int]] = set()
        self.rebalanced = False  # the group has given this member its partitions (none, maybe) at least once

    def subscribe(self, topics: list[str], on_assign, on_revoke) -> None:
        """``topics``: names, and patterns as ``^REGEX``; ``on_assign(partitions)`` returns the partitions with
        the offsets to start from."""

        def assigned(consumer, partitions):
            chosen = on_assign(partitions)
            self.assigned |= {(p.topic, p.partition) for p in chosen}
            self.ever_assigned |= {(p.topic, p.partition) for p in chosen}
            self.rebalanced = True
            consumer.assign(chosen)

        def revoked(consumer, partitions):
            on_revoke(partitions)
            self.assigned -= {(p.topic, p.partition) for p in partitions}
            self.eof_partitions -= {(p.topic, p.partition) for p in partitions}
            consumer.unassign()

        try:
            self._consumer.subscribe(list(topics), on_assign=assigned, on_revoke=revoked, on_lost=revoked)
        except KafkaException as exc:
            raise UsageError(f"cannot subscribe to {', '.join(topics)}: {exc.args[0].str()}; a topic pattern must "
                             "be a regular expression librdkafka reads (no lookarounds or backreferences)") from None

    def initial_offset(self, tp: TopicPartition, stored: int | None, kdg_owns_offsets: bool = False) -> int:
        """Where ``tp`` starts: an explicit ``-o`` on its first assignment, else ``stored``.

        With no stored offset: Kafka's committed offset, or when kdg keeps offsets outside Kafka
        (``kdg_owns_offsets``), the reset position. Reading several topics (:attr:`stored_wins`), a
        partition the group has a position for continues from it, and ``-o`` is where the others start.
        """
        key = (tp.topic, tp.partition)
        first = key not in self._seen_first_assignment
        self._seen_first_assignment.add(key)
        if first and self.stored_wins and self.start.explicit() and not kdg_owns_offsets and stored is None:
            stored = self.committed(tp.topic, [tp.partition]).get(tp.partition)
        if first and self.start.explicit() and not (self.stored_wins and stored is not None):
            if self.start.timestamp is not None:
                found = self._consumer.offsets_for_times([TopicPartition(tp.topic, tp.partition, self.start.timestamp)],
                                                         timeout=10)[0]
                return found.offset if found.offset >= 0 else OFFSET_END
            return self.start.kafka_offset()
        if stored is not None:
            return stored
        if not kdg_owns_offsets:
            return OFFSET_STORED
        return OFFSET_BEGINNING if self.start.reset == "earliest" else OFFSET_END

    def _fatal_error(self, err: KafkaError) -> DeliveryError:
        """A fatal error (a bare _FATAL replaced by the one error_cb heard) as kdg's: the member stops, where
        librdkafka would leave it polling a dead client for ever."""
        cause = self._errors.cause(err)
        text = cause.str().rsplit("Fatal consumer error: ", 1)[-1]  # (librdkafka says it twice)
        # (error_cb hears _FATAL, the broker's code only in the text: confluent-kafka does not read the cause)
        fenced = cause.code() == KafkaError.FENCED_INSTANCE_ID or "group.instance.id" in text
        hint = "; another member joined the group with this one's group.instance.id: give each its own" \
            if fenced else ""
        return DeliveryError(f"the consumer hit a fatal Kafka error and can read no more ({text}){hint}")

    def poll_batch(self, max_records: int, timeout: float) -> list:
        """Up to ``max_records`` messages; partition EOF events are noted, errors raised or skipped; a fatal
        error (heard by error_cb, or a message's) raised as :class:`~kdg.errors.DeliveryError`."""
        msgs = self._consumer.consume(max_records, timeout)
        if self._errors.heard is not None:
            raise self._fatal_error(self._errors.heard)
        if not any(map(Message.error, msgs)):  # the common case, checked in C (a KafkaError is truthy)
            if self.eof_partitions:
                self.eof_partitions.difference_update(zip(map(Message.topic, msgs), map(Message.partition, msgs)))
            return msgs
        batch = []
        for msg in msgs:
            err = msg.error()
            if err is None:
                batch.append(msg)
                self.eof_partitions.discard((msg.topic(), msg.partition()))
            elif err.code() == KafkaError._PARTITION_EOF:
                self.eof_partitions.add((msg.topic(), msg.partition()))
            elif err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART and (msg.topic() or "").startswith("^"):
                continue  # a pattern nothing matches yet: topics that appear are read as they do
            elif err.fatal() or err.code() == KafkaError._FATAL:
                check(err, "consuming")
                raise self._fatal_error(err)
            elif err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.TOPIC_AUTHORIZATION_FAILED,
                                KafkaError.GROUP_AUTHORIZATION_FAILED):
                check(err, "consuming")
                raise DeliveryError(f"consumer error: {err.str()}")
        return batch

    def lags(self) -> dict[tuple[str, int], int]:
        """Records between this member's position and the end of each partition it holds, from the
        watermarks its last fetches brought (no request; under read_committed the end is the last
        stable offset). Partitions not fetched yet are left out."""
        held = [TopicPartition(t, p) for t, p in self.assigned]
        if not held:
            return {}
        try:
            positions = self._consumer.position(held)
        except KafkaException:
            return {}
        lags = {}
        for tp in positions:
            try:
                start, end = self._consumer.get_watermark_offsets(tp, cached=True)
            except KafkaException:
                continue
            if end < 0 or (tp.offset < 0 and start != end):
                continue  # not fetched yet, or nothing read yet where there is something: unknown
            lags[(tp.topic, tp.partition)] = max(end - tp.offset, 0) if tp.offset >= 0 else 0
        return lags

    def held_at_end(self) -> bool:
        """Every partition this member holds is read to its end (true when it holds none)."""
        return self.assigned <= self.eof_partitions

    def committed(self, topic: str, partitions: list[int]) -> dict[int, int | None]:
        """The group's next offsets in Kafka for ``partitions`` (held by this member or not); None if never committed."""
        try:
            return committed_offsets(self._consumer, topic, partitions, self.offsets_wait_s, self._stop)
        except KafkaException as exc:
            check(exc.args[0], "reading the group's committed offsets")
            raise DeliveryError(f"cannot read the group's committed offsets within {self.offsets_wait_s:g} s: "
                                f"{exc.args[0].str()} (a member that died inside a transaction holds them until Kafka "
                                "aborts it, after its transaction.timeout.ms: start again, or raise --wait-timeout)"
                                ) from exc

    def commit(self, next_offsets: dict[tuple[str, int], int]) -> bool:
        """Synchronously commit ``{(topic, partition): next_offset}``.

        False when the group has moved on (this member lost its partitions in a rebalance): the
        offsets were not committed, and the partitions' new owner reads from the last commit.
        """
        if not next_offsets:
            return True
        tps = [TopicPartition(t, p, o) for (t, p), o in next_offsets.items()]
        deadline = time.monotonic() + COMMIT_RETRY_S
        while True:
            try:
                self._consumer.commit(offsets=tps, asynchronous=False)
                return True
            except KafkaException as exc:
                err = exc.args[0]
                if err.code() in _REBALANCED:
                    return False
                # the coordinator moving or loading its offsets (a broker restarted): the same offsets again
                if (err.retriable() or err.code() in _TRANSIENT) and time.monotonic() < deadline:
                    time.sleep(0.5)
                    continue
                check(err, "committing offsets")
                raise DeliveryError(f"offset commit failed: {err.str()}") from exc

    def commit_quietly(self, next_offsets: dict[tuple[str, int], int]) -> None:
        """Asynchronously commit offsets that are informational only (for lag tools)."""
        if next_offsets:
            try:
                self._consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in next_offsets.items()],
                                      asynchronous=True)
            except KafkaException:
                pass

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Read ``partition`` again from ``offset`` (held partitions only). It is no longer at its end: a batch
        read again after a lost connection is read before ``-e`` can see the end it saw before."""
        if (topic, partition) in self.assigned:
            self.eof_partitions.discard((topic, partition))
            try:
                self._consumer.seek(TopicPartition(topic, partition, offset))
            except KafkaException:
                pass  # not fetching yet: the assignment's own offset applies

    def group_metadata(self):
        return self._consumer.consumer_group_metadata()

    def close(self) -> None:
        self._consumer.close()

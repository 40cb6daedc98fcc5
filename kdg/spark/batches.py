"""One micro-batch of `kdg spark-stream` (``foreachBatch``): take its new topics, write it, store its positions.

Each batch is written by the executors' writer `kdg spark-replay` uses (:mod:`kdg.spark.writer`), each
task into its topic's table. Then the driver stores where every (topic, partition) got to: in
``kdg_offsets`` under the fences the stream took (exactly-once), or as the group's committed offsets in
Kafka (at-least-once). A pattern's topic new in a batch (or a new partition) is taken first: its lock,
its route's table and claim window, its fences.
"""

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kdg import faults
from kdg.errors import ConnectionFailed, Fenced, UsageError

# what a stream counts per table (its report's tables entries), as the executors' summaries name them
COUNTS = ("rows_read", "rows_written", "duplicates_dropped", "dead_lettered", "probes_skipped", "superseded",
          "deleted", "filtered", "exploded")


@dataclass
class BatchReport:
    batch_id: int
    rows_in: int
    rows_written: int
    duplicates_dropped: int
    dead_lettered: int
    duration_s: float
    rows_per_s: float
    next_offsets: dict          # partition → the offset the group reads next ("TOPIC/PARTITION" with several topics)
    lag: dict                   # partition → records behind the end of the partition, after this batch (same keys)
    attempts: int = 1           # > 1: Postgres went away and the batch was written again once it was back

    def to_dict(self) -> dict:
        return asdict(self)


def offsets_log(checkpoint: str) -> Path | None:
    """The checkpoint's offsets log (a batch's planned offsets, one file per batch id), or None for a URI
    this process cannot look into (``hdfs://…``)."""
    if "://" in checkpoint and not checkpoint.startswith("file://"):
        return None
    return Path(checkpoint.removeprefix("file://")) / "offsets"


class MicroBatches:
    """``foreachBatch``: write a micro-batch with the executors' writer, then store the group's positions."""

    def __init__(self, req, policy, store, routes, report, topics, *, single: bool):
        """``req``/``report``: the stream's (kdg.spark.stream); ``routes``: kdg.spark.routing.SparkRoutes;
        ``topics``: kdg.flow.topics.PipelineTopics, asked when a checkpoint's plan cannot be read."""
        self.req, self.policy, self.store, self.routes, self.report = req, policy, store, routes, report
        self.topics, self.single = topics, single  # single: one topic named, positions shown by partition
        self.fences: dict[str, dict[int, int]] = {}      # topic → partition → this stream's fence (exactly-once)
        self.positions: dict[str, dict[int, int]] = {}   # topic → partition → next offset, as far as this stream knows
        self.held: set[str] = set()       # the topics whose lock this stream holds
        self.known: dict[str, set[int]] = {}  # topic → the partitions taken (fenced, under exactly-once)
        self._locked_on = store.conn      # the connection holding the locks (kdg.store.offsets.hold_stream)
        self.failed: BaseException | None = None  # what ended the query from inside a batch
        self.active = False
        self.finished = -1  # the last batch written and accounted for (Spark records it in its commit log next)

    def hold(self, topics) -> None:
        """The lock that says this stream reads ``topic`` for the group (`kdg consume` checks it), per topic."""
        for topic in sorted(set(topics) - self.held):
            if not self.store.hold_stream(self.req.group, topic):
                raise UsageError(f"another kdg spark-stream is reading {topic} for group {self.req.group!r}; one "
                                 "group is read by one pipeline at a time")
            self.held.add(topic)

    def take(self, topic: str, partitions) -> None:
        """Make ``topic`` this stream's: its lock, its route's table (and claim window), and under exactly-once a
        fence on each of ``partitions`` it has none on yet."""
        self.hold([topic])
        self.routes.prepare(topic)
        entry = self.routes.tables_entry(topic, self.report.tables)
        if topic not in entry["topics"]:
            entry["topics"].append(topic)
            entry.update({k: entry.get(k, 0) for k in COUNTS})
        self.report.table = ",".join(self.report.tables)
        known = self.known.setdefault(topic, set())
        new = sorted(set(partitions) - known)
        if new and self.policy.dedup:
            taken = self.store.acquire_partitions(self.req.group, topic, new)
            self.fences.setdefault(topic, {}).update({p: fence for p, (fence, _) in taken.items()})
        known.update(new)

    def _take_planned(self, batch_id: int) -> None:
        """A pattern's topic (or a partition) new in this batch is taken before the batch is written: where
        Spark planned the batch says which (else, for a checkpoint this process cannot read, the cluster)."""
        planned = planned_ends(self.report.checkpoint, batch_id)
        if planned is None:
            planned = self.topics.current()
        for topic, partitions in planned.items():
            if set(partitions) - self.known.get(topic, set()):
                self.take(topic, partitions)

    def __call__(self, frame, batch_id: int) -> None:
        from kdg.spark.job import run_write

        self.active = True  # before the stop check: a stop asked from here on waits for this batch
        if self.req.shutdown.requested:
            # nothing written: the query ends failed, and the restart runs this batch, planned alike, from its
            # offsets (a batch cancelled mid-write would be written twice under at-least-once)
            self.active = False
            raise NotStarted(f"batch {batch_id} not started: a stop was asked")
        started, attempts = time.monotonic(), 0
        try:
            self._take_planned(batch_id)
            self.report.schema_changes += self.routes.follow(frame)  # before a task writes: executors never ALTER
            while True:
                attempts += 1
                try:
                    totals = run_write(frame.sparkSession, frame, self.routes.routed())
                    break
                except Exception as exc:
                    if not self._postgres_gone(exc) or attempts > 5:
                        raise
                    self.req.echo(f"batch {batch_id}: Postgres went away mid-write; waiting for it, then writing "
                                  "the batch again")
                    self._wait_for_postgres()
            faults.reach("spark-stream-before-positions")  # a driver dying here leaves Spark's batch uncommitted
            nexts = totals["next_offsets"]
            self._store_positions(nexts)
            for topic, at in nexts.items():
                self.positions.setdefault(topic, {}).update(at)
            self._account(batch_id, totals, nexts, time.monotonic() - started, attempts)
            self.finished = batch_id
            faults.reach("spark-stream-after-batch")  # a stop here must wait for Spark to record the batch
        except BaseException as exc:
            self.failed = exc
            raise
        finally:
            self.active = False

    def _postgres_gone(self, exc: BaseException) -> bool:
        text = str(exc)
        if "ConnectionFailed" not in text and "Python worker exited" not in text:
            return False
        return not self.store.alive()

    def _wait_for_postgres(self) -> None:
        self.store.reconnect(self.req.pg_wait, self.req.echo, self.req.shutdown.sleep)
        self._hold_again()

    def _store_positions(self, nexts: dict[str, dict[int, int]]) -> None:
        if nexts and self.policy.dedup:
            for topic, at in sorted(nexts.items()):
                self.store.across_restart(lambda: self.store.move_forward(self.req.group, topic, at,
                                                                           self.fences[topic]), self.req.pg_wait)
        elif nexts:
            _commit_to_group(self.req, nexts)
        self._hold_again()

    def _hold_again(self) -> None:
        """The topics' locks went with a connection Postgres dropped: take them again on the new one, or stop."""
        if self.store.conn is self._locked_on:
            return
        for topic in sorted(self.held):
            if not self.store.hold_stream(self.req.group, topic):
                raise Fenced(f"while Postgres was away another pipeline took group {self.req.group!r} on {topic}; "
                             "this stream stops")
        self._locked_on = self.store.conn

    def _account(self, batch_id: int, totals: dict, nexts: dict[str, dict[int, int]], seconds: float,
                 attempts: int) -> None:
        r = self.report
        r.batches += 1
        r.rows_in += totals["rows_read"]
        for name in COUNTS[1:]:
            setattr(r, name, getattr(r, name) + totals[name])
        for topic, counts in totals["per_topic"].items():
            entry = self.routes.tables_entry(topic, r.tables)
            for name in COUNTS:
                entry[name] += counts[name]
        if self.req.on_batch is None:
            return
        from kdg.kafka.admin import high_watermarks

        # where Spark goes on from: past a transaction's closing marker, which no record's offset (positions) shows
        planned = planned_ends(self.report.checkpoint, batch_id) or {}
        lag: dict[str, dict[int, int]] = {}
        for topic in sorted(set(planned) | set(self.positions)):
            at = dict(planned.get(topic, {}))
            at.update({p: max(o, at.get(p, o)) for p, o in self.positions.get(topic, {}).items()})
            try:
                ends = high_watermarks(self.req.conn.bootstrap_servers, topic, self.req.conn.extra)
                lag[topic] = {p: max(end - at[p], 0) for p, end in sorted(ends.items()) if p in at}
            except ConnectionFailed:
                pass
        self.req.on_batch(BatchReport(batch_id, totals["rows_read"], totals["rows_written"],
                                      totals["duplicates_dropped"], totals["dead_lettered"], round(seconds, 3),
                                      round(totals["rows_read"] / seconds, 1) if seconds else 0.0,
                                      self._shown(nexts), self._shown(lag), attempts))

    def _shown(self, per_topic: dict[str, dict[int, int]]) -> dict:
        """By partition for a stream of one named topic (as it always was); else by ``TOPIC/PARTITION``."""
        if self.single:
            return {p: n for at in per_topic.values() for p, n in at.items()}
        return {f"{t}/{p}": n for t, at in sorted(per_topic.items()) for p, n in at.items()}


def planned_ends(checkpoint: str, batch_id: int) -> dict[str, dict[int, int]] | None:
    """Where Spark planned micro-batch ``batch_id`` to end on each topic's partitions: the last line of its
    offsets log, in a checkpoint this process can read (None for another URI, or a log it cannot read)."""
    offsets = offsets_log(checkpoint)
    if offsets is None:
        return None
    try:
        planned = (offsets / str(batch_id)).read_text().splitlines()
        return {t: {int(p): int(o) for p, o in at.items()} for t, at in json.loads(planned[-1]).items()}
    except (OSError, ValueError, AttributeError, IndexError):
        return None


def _commit_to_group(req, nexts: dict[str, dict[int, int]]) -> None:
    """At-least-once: the positions as the group's committed offsets in Kafka (refused while it has members)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition

    from kdg.kafka.access import check
    from kdg.kafka.clients import admin_client

    admin = admin_client(req.conn.bootstrap_servers, req.conn.extra)
    asked = ConsumerGroupTopicPartitions(req.group, [TopicPartition(t, p, o) for t, at in sorted(nexts.items())
                                                     for p, o in at.items()])
    deadline = time.monotonic() + req.wait_timeout
    while True:
        try:
            admin.alter_consumer_group_offsets([asked], request_timeout=15)[req.group].result()
            return
        except KafkaException as exc:
            err = exc.args[0]
            if any(word in err.name() for word in ("NOT_EMPTY", "UNKNOWN_MEMBER", "ILLEGAL_GENERATION", "FENCED")):
                raise Fenced(f"group {req.group!r} has members now (kdg consume?); this stream stops: one group is "
                             "read by one pipeline at a time") from exc
            check(err, f"committing group {req.group!r}'s offsets")
            if time.monotonic() >= deadline or req.shutdown.sleep(1):  # a coordinator moving (a broker restart)
                raise ConnectionFailed(f"cannot commit group {req.group!r}'s offsets: {err.str()}") from exc


class NotStarted(Exception):
    """A micro-batch refused because a stop was asked before it began (:meth:`MicroBatches.__call__`)."""

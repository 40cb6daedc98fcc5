"""`kdg spark-stream`: topics into Postgres as records arrive, as a Spark Structured Streaming query.

One topic, several, or every topic a ``--topic-pattern`` matches (Spark's ``subscribe`` /
``subscribePattern``); each record goes to the table its route names (:mod:`kdg.spark.routing`). A
pattern's topic that appears while the stream runs is taken (its lock, table, window and fences) before
the first batch that reads it is written.

Each micro-batch is written by the executors' writer `kdg spark-replay` uses (:mod:`kdg.spark.writer`):
one Postgres transaction per chunk of a task, with each key claimed in ``kdg_dedup`` under
exactly-once. Then the driver stores where every partition got to:

- **exactly-once**: in ``kdg_offsets``, under fences this stream took when it started, so ``kdg audit -G``
  tells pending from lost as it does for `kdg consume`. A batch Spark runs again (a task retried, a
  driver restarted from its checkpoint, a checkpoint lost and the stream started from the stored
  positions) finds its keys claimed and adds nothing.
- **at-least-once**: as the group's committed offsets in Kafka. A batch run again writes its rows again.
- **at-most-once** is refused: Spark runs a failed batch again from its offset log, so it cannot promise
  fewer than one delivery.

Without a checkpoint the stream starts at the group's positions (``kdg_offsets``, or the committed Kafka
offsets for at-least-once), so one group can move from `kdg consume` to `kdg spark-stream` and back.
Only one of them reads a group at a time: a stream holds a Postgres advisory lock for its group on each of its
topics while it runs (`kdg consume` refuses to start under it), refuses a group with members, and under exactly-once a
`kdg consume` that takes the partitions anyway fences the stream out at its next batch.
"""

import json
import re
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from kdg import faults
from kdg.errors import ConnectionFailed, DeliveryError, Fenced, UsageError
from kdg.guarantees import CommitMode, policy_for
from kdg.lifecycle import DEFAULT_WAIT_TIMEOUT_S, Shutdown, StopRequested, wait_until_up
from kdg.retention import check_dedup_retention
from kdg.settings import Connection

if TYPE_CHECKING:
    from kdg.flow.routes import Router
    from kdg.mapping import Mapping

_INTERVAL = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|m|milliseconds?|seconds?|minutes?)$")
_UNITS = {"ms": "milliseconds", "s": "seconds", "m": "minutes"}


@dataclass
class StreamRequest:
    topic: "str | list[str]"          # one topic, or several (none: topic_pattern or routes)
    group: str
    guarantee: str
    conn: Connection
    table: str = "kdg_events"
    mapping: "Mapping | None" = None
    value_format: str = "json"         # how --id-from json: reads values outside a mapping (kdg.schemas)
    master: str = "local[*]"
    checkpoint: str | None = None     # a directory or a Hadoop URI; default: <state dir>/spark-stream/<group>-<topic>-<hash>
    trigger: str = "1s"               # an interval, available-now, or real-time[:INTERVAL]
    max_per_batch: int | None = None  # maxOffsetsPerTrigger
    id_from: str | None = None
    chunk_rows: int = 20_000
    spark_conf: dict[str, str] = field(default_factory=dict)
    dedup_retention: str | None = None
    pg_wait: float = 120.0            # a batch that met Postgres down waits this long for it, then runs again
    shutdown: Shutdown = field(default_factory=Shutdown)
    wait_timeout: float = DEFAULT_WAIT_TIMEOUT_S
    on_batch: Callable[["BatchReport"], None] | None = None
    echo: Callable[[str], None] = print
    topic_pattern: str | None = None  # every topic this regular expression matches whole, those created later too
    routes: "Router | None" = None    # --pipeline FILE's routes; None: the command line is one route

    @property
    def topics(self) -> list[str]:
        return [self.topic] if isinstance(self.topic, str) else [t for t in self.topic if t]


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


@dataclass
class StreamReport:
    guarantee: str
    topic: str                  # the topics: a, a,b or /pattern/
    group: str
    table: str                  # the tables, comma-separated
    checkpoint: str
    started_from: str = ""      # checkpoint | kdg_offsets | kafka group | earliest
    batches: int = 0
    rows_in: int = 0
    rows_written: int = 0
    duplicates_dropped: int = 0
    dead_lettered: int = 0
    probes_skipped: int = 0     # `kdg doctor --topic` probe records: read, never written
    superseded: int = 0         # a typed upsert: earlier versions of a key in the same chunk
    deleted: int = 0            # tombstones and change-data-capture deletes applied
    filtered: int = 0           # left out on purpose (on_tombstone = ignore)
    spark_start_s: float = 0.0
    duration_s: float = 0.0
    stopped_by: str = ""
    tables: dict = field(default_factory=dict)  # per table: its route, its topics, where its rows ended

    def to_dict(self) -> dict:
        return asdict(self)


_COUNTS = ("rows_read", "rows_written", "duplicates_dropped", "dead_lettered", "probes_skipped", "superseded",
           "deleted", "filtered")


def parse_trigger(text: str) -> dict:
    """``--trigger`` as ``DataStreamWriter.trigger`` keywords.

    >>> parse_trigger("500ms"), parse_trigger("available-now")
    ({'processingTime': '500 milliseconds'}, {'availableNow': True})
    """
    text = text.strip().lower()
    if text == "available-now":
        return {"availableNow": True}
    if text.startswith("real-time"):
        raise UsageError("--trigger real-time: Spark 4.2 refuses foreachBatch in real-time mode "
                         "(STREAMING_REAL_TIME_MODE.OPERATOR_OR_SINK_NOT_IN_ALLOWLIST: its sink allowlist has Kafka and "
                         "foreach), and foreachBatch is how kdg writes a batch before it stores the batch's positions; "
                         "use an interval such as 500ms")
    found = _INTERVAL.match(text)
    if not found:
        raise UsageError(f"--trigger {text!r}: use an interval (500ms, 2s, 1m) or available-now")
    unit = _UNITS.get(found.group(2), found.group(2).rstrip("s") + "s")
    return {"processingTime": f"{found.group(1)} {unit}"}


def default_checkpoint(group: str, topic: str) -> Path:
    from kdg.paths import default_state_dir

    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{group}-{topic}")[:100]
    return default_state_dir() / "spark-stream" / f"{safe}-{uuid.uuid5(uuid.NAMESPACE_URL, group + '/' + topic).hex[:8]}"


def _offsets_log(checkpoint: str) -> Path | None:
    """The checkpoint's offsets log (a batch's planned offsets, one file per batch id), or None for a URI
    this process cannot look into (``hdfs://…``)."""
    if "://" in checkpoint and not checkpoint.startswith("file://"):
        return None
    return Path(checkpoint.removeprefix("file://")) / "offsets"


def _has_offsets(checkpoint: str) -> bool | None:
    """Whether a checkpoint already holds a planned batch (then Spark, not the group, says where to start);
    None for a URI this process cannot look into."""
    offsets = _offsets_log(checkpoint)
    if offsets is None:
        return None
    return offsets.is_dir() and any(p.name.isdigit() for p in offsets.iterdir())


def _local_checkpoint(text: str | None, group: str, topic: str) -> str:
    if text is None:
        return str(default_checkpoint(group, topic))
    if "://" in text:
        return text
    return str(Path(text).expanduser().resolve())


def run_spark_stream(req: StreamRequest) -> StreamReport:
    from kdg.flow.topics import PipelineTopics
    from kdg.kafka.clients import spark_source_options
    from kdg.spark.routing import SparkRoutes, describe, key_sql, spark_router
    from kdg.spark.session import check_conf, resolve_master
    from kdg.store.pg import Store

    policy = policy_for(req.guarantee)
    if policy.commit_mode is CommitMode.BEFORE_PROCESSING:
        raise UsageError("spark-stream cannot run at-most-once: Spark runs a failed micro-batch again from its "
                         "offset log, so it can promise no fewer than one delivery. Use -g at-least-once, or "
                         "exactly-once, or `kdg consume -g at-most-once`.")
    router = spark_router(req.topics, req.topic_pattern, req.table, req.mapping, req.id_from, req.routes)
    check_dedup_retention(req.dedup_retention, policy, "postgres")
    trigger = parse_trigger(req.trigger)
    key = key_sql(router, policy.dedup)
    if req.chunk_rows < 1:
        raise UsageError("--chunk-rows must be at least 1")
    if req.max_per_batch is not None and req.max_per_batch < 1:
        raise UsageError("--max-per-batch must be at least 1")
    check_conf(req.spark_conf)
    master = resolve_master(req.master)
    source_options = spark_source_options(req.conn.bootstrap_servers, req.conn.extra, policy)
    named = describe(router)
    checkpoint = _local_checkpoint(req.checkpoint, req.group, named)
    stopped = lambda: StreamReport(policy.guarantee.value, named, req.group, req.table, checkpoint,  # noqa: E731
                                   stopped_by=req.shutdown.signal or "stop requested")
    topics = PipelineTopics(router, req.conn.bootstrap_servers, req.conn.extra, req.wait_timeout, req.shutdown,
                            req.echo)
    try:
        found = topics.wait()  # a missing topic, two routes, a bad table name: refused here
        store = wait_until_up("Postgres", lambda: Store(req.conn.pg_dsn), req.wait_timeout, req.shutdown, req.echo)
    except StopRequested:
        return stopped()
    with store:
        routes = SparkRoutes(router, store, req.conn, policy, group=req.group, chunk_rows=req.chunk_rows,
                             value_format=req.value_format, dedup_retention=req.dedup_retention, echo=req.echo)
        report = StreamReport(policy.guarantee.value, named, req.group, "", checkpoint)
        batches = _Batches(req, policy, store, routes, report, topics, single=len(req.topics) == 1 and
                           req.topic_pattern is None and req.routes is None)
        batches.hold(found)  # every topic's lock first: another stream on one of them refuses this one
        try:
            _refuse_members(req)
        except StopRequested:
            return stopped()
        routes.check(found)
        for topic, partitions in sorted(found.items()):
            batches.take(topic, partitions)
        starting, batches.positions, report.started_from = _starting_offsets(req, policy, store, checkpoint, found)
        _run_query(req, master, policy, source_options, starting, checkpoint, trigger, key, batches, report)
    return report


def _refuse_members(req: StreamRequest) -> None:
    """A group whose members read now (kdg consume, or any Kafka consumer) is theirs: refused, by name."""
    from confluent_kafka import KafkaError, KafkaException

    from kdg.kafka.access import check
    from kdg.kafka.clients import admin_client

    admin = admin_client(req.conn.bootstrap_servers, req.conn.extra)
    deadline = time.monotonic() + req.wait_timeout
    while True:
        try:
            described = admin.describe_consumer_groups([req.group], request_timeout=15)[req.group].result()
            break
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() == KafkaError.GROUP_ID_NOT_FOUND:  # no such group yet
                return
            check(err, f"describing group {req.group!r}")  # a refused login or ACL: at once
            if time.monotonic() >= deadline:  # else (a coordinator moving with a broker restart): waited for
                raise ConnectionFailed(f"cannot describe group {req.group!r}: {err.str()}") from exc
            if req.shutdown.sleep(1):
                raise StopRequested("Kafka") from exc
    if described.members:
        hosts = ", ".join(sorted({m.client_id + "@" + m.host for m in described.members}))
        raise UsageError(f"group {req.group!r} has {len(described.members)} active member(s) ({hosts}); stop them "
                         "first: one group is read by one pipeline at a time")


def _starting_offsets(req: StreamRequest, policy, store, checkpoint: str,
                      found: dict[str, list[int]]) -> tuple[str, dict[str, dict[int, int]], str]:
    """Spark's ``startingOffsets`` (which Spark ignores once the checkpoint has batches), the group's positions
    per topic, and where the stream starts from."""
    from kdg.audit_groups import _kafka_committed

    stored: dict[str, dict[int, int]] = {}
    source = "kdg_offsets" if policy.dedup else "kafka group"
    for topic in found:
        if policy.dedup:
            stored[topic] = store.stored_offsets(req.group, topic)
        else:
            stored[topic] = {p: o for p, o in _kafka_committed(req.conn, topic, req.group).items() if o is not None}
    stored = {t: at for t, at in stored.items() if at}
    resumed = _has_offsets(checkpoint)
    if not stored:
        source = "earliest"
    if resumed:
        source = "checkpoint"
    elif resumed is None:
        source = f"the checkpoint, if it has batches; else {source}"
    if not stored:
        return "earliest", stored, source
    # Spark wants every topic-partition it reads named: -2, a partition never read, starts at its beginning
    at = {t: {str(p): stored.get(t, {}).get(p, -2) for p in parts} for t, parts in found.items()}
    return json.dumps(at), stored, source


class _Batches:
    """``foreachBatch``: write a micro-batch with the executors' writer, then store the group's positions."""

    def __init__(self, req: StreamRequest, policy, store, routes, report: StreamReport, topics, *, single: bool):
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
        self.routes.tables_entry(topic, self.report.tables)
        entry = self.report.tables[self.routes.table(topic)]
        if topic not in entry["topics"]:
            entry["topics"].append(topic)
            entry.update({k: entry.get(k, 0) for k in _COUNTS})
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
        planned = _planned(self.report.checkpoint, batch_id)
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
            raise _NotStarted(f"batch {batch_id} not started: a stop was asked")
        started, attempts = time.monotonic(), 0
        try:
            self._take_planned(batch_id)
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
        for name in _COUNTS[1:]:
            setattr(r, name, getattr(r, name) + totals[name])
        for topic, counts in totals["per_topic"].items():
            entry = r.tables[self.routes.table(topic)]
            for name in _COUNTS:
                entry[name] += counts[name]
        if self.req.on_batch is None:
            return
        from kdg.kafka.admin import high_watermarks

        # where Spark goes on from: past a transaction's closing marker, which no record's offset (positions) shows
        planned = _planned(self.report.checkpoint, batch_id) or {}
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


def _planned(checkpoint: str, batch_id: int) -> dict[str, dict[int, int]] | None:
    """Where Spark planned micro-batch ``batch_id`` to end on each topic's partitions: the last line of its
    offsets log, in a checkpoint this process can read (None for another URI, or a log it cannot read)."""
    offsets = _offsets_log(checkpoint)
    if offsets is None:
        return None
    try:
        planned = (offsets / str(batch_id)).read_text().splitlines()
        return {t: {int(p): int(o) for p, o in at.items()} for t, at in json.loads(planned[-1]).items()}
    except (OSError, ValueError, AttributeError, IndexError):
        return None


def _commit_to_group(req: StreamRequest, nexts: dict[str, dict[int, int]]) -> None:
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


def _run_query(req, master, policy, source_options, starting, checkpoint, trigger, key, batches, report) -> None:
    from kdg.spark.job import sink_rows
    from kdg.spark.routing import subscription
    from kdg.spark.session import spark_session

    started = time.monotonic()
    with spark_session(master, task_retries=policy.spark_task_retries, conf=req.spark_conf, echo=req.echo,
                       app="kdg spark-stream") as run:
        run.spark.conf.set("spark.sql.streaming.stopTimeout", str(int(req.shutdown.timeout * 1000)))
        reader = (run.spark.readStream.format("kafka").options(**source_options)
                  .options(**subscription(batches.routes.router))
                  .option("startingOffsets", starting)
                  .option("includeHeaders", "true")
                  .option("failOnDataLoss", "true"))
        if req.max_per_batch:
            reader = reader.option("maxOffsetsPerTrigger", str(req.max_per_batch))
        rows = sink_rows(reader.load(), key, with_timestamp=batches.routes.router.typed)
        query = (rows.writeStream.foreachBatch(batches).option("checkpointLocation", checkpoint)
                 .trigger(**trigger).queryName(f"kdg-{req.group}-{report.topic}"[:100]).start())
        report.spark_start_s = round(time.monotonic() - started, 3)
        req.shutdown.reclaim()  # had anything taken SIGINT meanwhile: a stop is kdg's to read between batches
        streaming = time.monotonic()
        try:
            _await(query, req.shutdown, batches, report)
        finally:
            if query.isActive:
                query.stop()
            report.duration_s = round(time.monotonic() - streaming, 3)
        stopped_waiting = req.shutdown.requested and isinstance(batches.failed, ConnectionFailed)
        if batches.failed is not None and not stopped_waiting:  # (a stop while Postgres was away: exit 0)
            raise _explain(batches.failed, policy)
        exc = query.exception()
        if exc is not None and not req.shutdown.requested:
            raise DeliveryError(f"the stream failed: {str(exc).splitlines()[0][:300]} (Spark's log: {run.log})")


class _NotStarted(Exception):
    """A micro-batch refused because a stop was asked before it began (:meth:`_Batches.__call__`)."""


def _await(query, shutdown: Shutdown, batches: _Batches, report: StreamReport) -> None:
    """Until the query ends (available-now drained, or it failed) or a stop is asked; a stop lets the batch in
    flight finish first, within the shutdown timeout, and Spark record it as done: stopped between our
    write and its commit log, Spark would run the batch again on restart (duplicates under at-least-once)."""
    while query.isActive:
        if shutdown.requested:
            deadline = time.monotonic() + shutdown.timeout
            while query.isActive and time.monotonic() < deadline and (
                    batches.active or not _recorded(query, batches.finished)):
                time.sleep(0.1)
            report.stopped_by = shutdown.signal or "stop requested"
            return
        try:
            query.awaitTermination(0.5)
        except Exception:  # the query failed (raised here as StreamingQueryException): read below
            break
    if shutdown.requested:  # the query ended on the batch a stop refused to start (_NotStarted)
        report.stopped_by = shutdown.signal or "stop requested"
    else:
        report.stopped_by = report.stopped_by or ("end of available data" if batches.failed is None else "failed")


def _recorded(query, batch_id: int) -> bool:
    """Whether Spark has recorded micro-batch ``batch_id`` as done: its progress for a batch is reported
    after the batch's commit-log entry is written."""
    if batch_id < 0:
        return True
    try:
        progress = query.lastProgress
    except Exception:  # the query ended meanwhile
        return True
    return progress is not None and progress["batchId"] >= batch_id


def _explain(exc: BaseException, policy):
    from kdg.replay import _explain as explain_job

    return explain_job(exc, policy)


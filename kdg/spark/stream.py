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

from kdg.errors import ConnectionFailed, DeliveryError, UsageError
from kdg.guarantees import CommitMode, policy_for
from kdg.lifecycle import DEFAULT_WAIT_TIMEOUT_S, Shutdown, StopRequested, wait_until_up
from kdg.retention import check_dedup_retention
from kdg.settings import Connection
from kdg.spark.batches import BatchReport, MicroBatches, NotStarted, offsets_log  # noqa: F401 (BatchReport: on_batch's)

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
    transform: object = None          # --transform: module:function (or a function), run on the executors
    handler: object = None            # --handler: called in each task's transaction (kdg.spark.logic)

    @property
    def topics(self) -> list[str]:
        return [self.topic] if isinstance(self.topic, str) else [t for t in self.topic if t]


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
    filtered: int = 0           # left out on purpose (on_tombstone = ignore, a transform's None)
    exploded: int = 0           # rows a transform made beyond one per record (a list of dicts)
    spark_start_s: float = 0.0
    duration_s: float = 0.0
    stopped_by: str = ""
    tables: dict = field(default_factory=dict)  # per table: its route, its topics, where its rows ended
    schema_changes: list = field(default_factory=list)  # columns from the schema: each change made, or asked

    def to_dict(self) -> dict:
        return asdict(self)


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


def _has_offsets(checkpoint: str) -> bool | None:
    """Whether a checkpoint already holds a planned batch (then Spark, not the group, says where to start);
    None for a URI this process cannot look into."""
    offsets = offsets_log(checkpoint)
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
    router = spark_router(req.topics, req.topic_pattern, req.table, req.mapping, req.id_from, req.routes,
                          req.transform, req.handler)
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
                             value_format=req.value_format, dedup_retention=req.dedup_retention, echo=req.echo,
                             handler=req.handler, resume="start the stream again: it resumes at the micro-batch "
                             "it stopped before, none of which was written")
        report = StreamReport(policy.guarantee.value, named, req.group, "", checkpoint)
        batches = MicroBatches(req, policy, store, routes, report, topics, single=len(req.topics) == 1 and
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


def _run_query(req, master, policy, source_options, starting, checkpoint, trigger, key, batches, report) -> None:
    from kdg.spark.job import sink_rows
    from kdg.spark.routing import subscription
    from kdg.spark.session import spark_session

    started = time.monotonic()
    with spark_session(master, task_retries=policy.spark_task_retries, conf=req.spark_conf, echo=req.echo,
                       app="kdg spark-stream", modules=batches.routes.modules) as run:
        run.spark.conf.set("spark.sql.streaming.stopTimeout", str(int(req.shutdown.timeout * 1000)))
        reader = (run.spark.readStream.format("kafka").options(**source_options)
                  .options(**subscription(batches.routes.router))
                  .option("startingOffsets", starting)
                  .option("includeHeaders", "true")
                  .option("failOnDataLoss", "true"))
        if req.max_per_batch:
            reader = reader.option("maxOffsetsPerTrigger", str(req.max_per_batch))
        rows = sink_rows(reader.load(), key, with_timestamp=batches.routes.whole_records)
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


def _await(query, shutdown: Shutdown, batches: "MicroBatches", report: StreamReport) -> None:
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
    if shutdown.requested:  # the query ended on the batch a stop refused to start (NotStarted)
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


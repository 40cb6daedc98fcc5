"""`kdg spark-replay`: replay Kafka ranges into Postgres sink tables with Spark, under a guarantee.

One topic or several (each with its own range, the same ``--from``/``--to`` on each), read in one Spark
job; each topic's records go to the table its route names (:mod:`kdg.spark.routing`). A run is recorded
per topic in ``kdg_replays``.

The policy decides three things here, and nothing else does:
- ``commit_mode``: at-most-once records the range as done (and advances the group's stored offsets)
  BEFORE writing; the others record it only after every task wrote.
- ``spark_task_retries``: whether a failed task is retried (off: a failed job loses its range).
- ``dedup``: whether each row's idempotency key is claimed in ``kdg_dedup`` with the row, so a
  retried task or a re-run of the range adds nothing.
"""

import contextlib
import re
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Callable

from kdg.errors import ConnectionFailed, DeliveryError, Interrupted, KdgError, UsageError
from kdg.guarantees import CommitMode, policy_for
from kdg.lifecycle import DEFAULT_WAIT_TIMEOUT_S, Shutdown, StopRequested, wait_until_up
from kdg.retention import check_dedup_retention
from kdg.settings import Connection
from kdg.spark.ranges import Ranges, parse_bound, resolve_range

if TYPE_CHECKING:
    from kdg.flow.routes import Router
    from kdg.mapping import Mapping

_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,200}$")


@dataclass
class ReplayRequest:
    topic: "str | list[str]"           # one topic, or several (none: topic_pattern or routes)
    guarantee: str
    conn: Connection
    group: str = "kdg-spark-replay"
    start: str = "earliest"            # each topic's range: the same bounds on each
    end: str = "latest"
    table: str = "kdg_events"          # a table, or a template of one (mt_{topic})
    master: str = "local[*]"
    id_from: str | None = None
    mapping: "Mapping | None" = None   # a typed sink: the user's table, through this mapping
    value_format: str = "json"         # how --id-from json: reads values outside a mapping (kdg.schemas)
    chunk_rows: int = 20_000
    spark_conf: dict[str, str] = field(default_factory=dict)
    on_range: Callable[[dict[str, Ranges]], None] | None = None  # topic → its ranges, shown before the job runs
    progress: Callable[[int, int, int], None] | None = None   # (tasks done, tasks, tasks failed)
    echo: Callable[[str], None] = print
    dedup_retention: str | None = None   # exactly-once: the table's claim window, if it has none yet (kdg.retention)
    beyond_dedup_window: bool = False    # replay records older than the window, knowing they are not deduplicated
    shutdown: Shutdown = field(default_factory=Shutdown)  # requested (a signal): cancel the job, record it failed
    wait_timeout: float = DEFAULT_WAIT_TIMEOUT_S  # start-up: how long to wait for Kafka and Postgres to come up
    topic_pattern: str | None = None     # every topic this regular expression matches whole, now
    routes: "Router | None" = None       # --pipeline FILE's routes; None: the command line is one route
    transform: object = None             # --transform: module:function (or a function), run on the executors
    handler: object = None               # --handler: called in each task's transaction (kdg.spark.logic)

    @property
    def topics(self) -> list[str]:
        return [self.topic] if isinstance(self.topic, str) else [t for t in self.topic if t]


@dataclass
class ReplayReport:
    replay_id: str                  # one per topic replayed (kdg_replays), comma-separated
    guarantee: str
    topic: str                      # the topics, comma-separated
    group: str
    table: str                      # the tables, comma-separated
    partitions: dict                # one topic: {partition: range}; several: {"TOPIC/PARTITION": range}
    rows_read: int = 0
    duplicates_dropped: int = 0
    rows_written: int = 0
    dead_lettered: int = 0          # a typed sink: records the mapping or Postgres refused, in TOPIC.dlq
    probes_skipped: int = 0         # `kdg doctor --topic` probe records: read, never written
    superseded: int = 0             # a typed upsert: earlier versions of a key in the same chunk
    deleted: int = 0                # tombstones and change-data-capture deletes applied
    filtered: int = 0               # left out on purpose (on_tombstone = ignore, a transform's None)
    exploded: int = 0               # rows a transform made beyond one per record (a list of dicts)
    tasks: int = 0
    recorded: str = ""              # when the range was recorded as done: before or after writing
    spark_start_s: float = 0.0      # starting the SparkSession (JVM, jars)
    duration_s: float = 0.0         # the Spark job itself: read, key, write
    rows_per_s: float = 0.0         # rows_read / duration_s
    tables: dict = field(default_factory=dict)  # per table: its route, its topics' ranges, where its rows ended
    schema_changes: list = field(default_factory=list)  # columns from the schema: each change made, or asked

    def to_dict(self) -> dict:
        return asdict(self)


_COUNTS = ("rows_read", "rows_written", "duplicates_dropped", "dead_lettered", "probes_skipped", "superseded",
           "deleted", "filtered", "exploded")


def run_spark_replay(req: ReplayRequest) -> ReplayReport:
    from kdg.flow.topics import PipelineTopics
    from kdg.kafka.clients import spark_source_options
    from kdg.spark.routing import SparkRoutes, key_sql, spark_router
    from kdg.spark.session import check_conf, resolve_master
    from kdg.store.pg import Store

    policy = policy_for(req.guarantee)
    router = spark_router(req.topics, req.topic_pattern, req.table, req.mapping, req.id_from, req.routes,
                          req.transform, req.handler)
    check_dedup_retention(req.dedup_retention, policy, "postgres")
    key = key_sql(router, policy.dedup)  # a malformed --id-from: refused first
    if not req.group.strip():
        raise UsageError("--group must not be empty")
    if req.chunk_rows < 1:
        raise UsageError("--chunk-rows must be at least 1")
    start, end = parse_bound(req.start, "--from"), parse_bound(req.end, "--to")
    check_conf(req.spark_conf)
    master = resolve_master(req.master)  # `stack`: the local stack's Spark master, which must be running
    source_options = spark_source_options(req.conn.bootstrap_servers, req.conn.extra, policy)  # refused before any record
    try:
        found = PipelineTopics(router, req.conn.bootstrap_servers, req.conn.extra, req.wait_timeout, req.shutdown,
                               req.echo).wait()  # a missing topic, two routes, a bad table name: refused here
        store = wait_until_up("Postgres", lambda: Store(req.conn.pg_dsn), req.wait_timeout, req.shutdown, req.echo)
    except StopRequested as exc:
        raise Interrupted(f"{req.shutdown.signal}: stopped while waiting for {exc}; nothing was replayed",
                          req.shutdown.signum) from None
    if not found:
        raise UsageError(f"no topic matches {req.topic_pattern or 'the routes'}: nothing to replay")
    with store:  # unreachable, or no kdg schema: a clear error before Spark starts
        several = len(found) > 1
        ranges = {t: r for t in sorted(found)
                  if (r := _resolve(req, t, found[t], policy.isolation_level, start, end, store, several))}
        if not ranges:  # a bad range creates nothing
            raise UsageError(f"the range is empty on every partition of {', '.join(sorted(found))}: nothing to replay")
        routes = SparkRoutes(router, store, req.conn, policy, group=req.group, chunk_rows=req.chunk_rows,
                             value_format=req.value_format, dedup_retention=req.dedup_retention, echo=req.echo,
                             handler=req.handler, resume="run the replay again: nothing of it was written")
        routes.check(ranges)  # every topic routed before any table is made
        for topic in ranges:  # tables checked (or created) and claim windows decided before Spark starts
            routes.prepare(topic)
            for table in routes.tables(topic) if policy.dedup else ():  # a fan-out's: each of its tables
                if table in routes.windows:  # (none yet: a from-schema table still to be made, with nothing in it)
                    _check_window(req, topic, policy.isolation_level, routes.windows[table], ranges[topic], store)
        if req.on_range:
            req.on_range(ranges)
        record_first = policy.commit_mode is CommitMode.BEFORE_PROCESSING
        replay_ids = {t: uuid.uuid4() for t in ranges}
        for topic, ids in replay_ids.items():
            store.record_replay(ids, req.group, topic, routes.table(topic), policy.guarantee.value, ranges[topic],
                                done=record_first)
        report = _report(req, policy, routes, ranges, replay_ids, record_first)

        def finish(status: str, **details) -> None:
            for topic, ids in replay_ids.items():
                store.finish_replay(ids, req.group, topic, ranges[topic], status=status, **details)

        try:
            totals = _run_job(req, master, policy, ranges, routes, key, source_options)
        except BaseException as exc:
            error = _explain(exc, policy) if not req.shutdown.requested else Interrupted(
                f"{req.shutdown.signal}: the Spark job was cancelled; the replay is recorded "
                f"{'done (at-most-once recorded it before writing)' if record_first else 'failed'}, and running "
                "the same range again finishes it", req.shutdown.signum)
            finish("done" if record_first else "failed", error=str(error))
            raise error from exc
        for name in (*_COUNTS, "tasks", "spark_start_s", "duration_s", "schema_changes"):
            setattr(report, name, totals[name])
        for topic, counts in totals["per_topic"].items():
            entry = routes.tables_entry(topic, report.tables)
            for name in _COUNTS:
                entry[name] += counts[name]
        report.rows_per_s = round(report.rows_read / report.duration_s, 1) if report.duration_s else 0.0
        finish("done", summary=report.to_dict(), advance=not record_first)
    return report


def _report(req: ReplayRequest, policy, routes, ranges: dict[str, Ranges], replay_ids: dict,
            record_first: bool) -> ReplayReport:
    """The report before the job: its ranges, and one entry per table (its route, its topics' ranges)."""
    one = len(ranges) == 1
    shown = {(str(p) if one else f"{t}/{p}"): {"from": s, "to": e}
             for t, r in ranges.items() for p, (s, e) in r.items()}
    report = ReplayReport(",".join(str(i) for i in replay_ids.values()), policy.guarantee.value, ",".join(ranges),
                          req.group, ",".join(dict.fromkeys(routes.shown(t) for t in ranges)),
                          shown, recorded="before writing" if record_first else "after writing")
    for topic, r in ranges.items():
        entry = routes.tables_entry(topic, report.tables)
        if "rows_read" not in entry:
            entry.update(dict.fromkeys(_COUNTS, 0), partitions={})
        entry["topics"].append(topic)
        entry["partitions"][topic] = {str(p): {"from": s, "to": e} for p, (s, e) in r.items()}
    return report


def _id_from(spec: str | None) -> tuple[str | None, str | None]:
    """``--id-from`` checked: a header name goes into Spark SQL, so it is held to a safe alphabet; a JSON
    field or pointer is read by the executors in Python (:mod:`kdg.keys`), exactly as `kdg consume` reads it."""
    from kdg.keys import KeyResolver

    resolver = KeyResolver(spec)  # one parser for --id-from, shared with `kdg consume`
    if resolver.kind == "header" and not _SAFE_NAME.match(resolver.arg):
        raise UsageError(f"--id-from {spec!r}: a header name may use letters, digits, '_', '.', '-'")
    return resolver.kind, resolver.arg


def _resolve(req: ReplayRequest, topic: str, partitions: list[int], isolation: str, start, end, store,
             several: bool) -> Ranges:
    """``topic``'s range; with several topics, one whose range is empty is left out (and said)."""
    from kdg.kafka.admin import watermarks

    ranges = resolve_range(topic, start, end, partitions=partitions,
                           watermarks=watermarks(req.conn.bootstrap_servers, topic, req.conn.extra, isolation),
                           stored=lambda: store.stored_offsets(req.group, topic),
                           offsets_for_time=lambda ms: _offsets_for_time(req, topic, isolation, partitions, ms),
                           allow_empty=several)
    if not ranges:
        req.echo(f"{topic}: the range is empty on every partition; nothing of it to replay")
    return ranges


def _offsets_for_time(req: ReplayRequest, topic: str, isolation: str, partitions: list[int],
                      ms: int) -> dict[int, int]:
    """Per partition, the first offset whose record's timestamp is at or after ``ms`` (-1: none is)."""
    from confluent_kafka import KafkaException, TopicPartition

    from kdg.kafka.clients import reader

    consumer = reader(req.conn.bootstrap_servers, req.conn.extra, group="kdg-replay-ranges", isolation=isolation)
    try:
        found = consumer.offsets_for_times([TopicPartition(topic, p, ms) for p in partitions], timeout=15)
    except KafkaException as exc:
        raise ConnectionFailed(f"cannot look up offsets by time in Kafka: {exc.args[0].str()}") from exc
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found}


def _check_window(req: ReplayRequest, topic: str, isolation: str, window, ranges: Ranges, store) -> None:
    """Exactly-once: refuse a range reaching back past the table's claim window, where a record already
    written would be written again — unless the table is new, or the user said ``--beyond-dedup-window``."""
    from kdg.retention import show
    from kdg.store.windows import now_ms

    if window.retention_ms is None:
        return
    cut = max(now_ms() - window.retention_ms, window.horizon_ms or 0)
    first_kept = _offsets_for_time(req, topic, isolation, sorted(ranges), cut)
    older = {p: (s, min(e, first_kept[p]) if first_kept[p] >= 0 else e) for p, (s, e) in sorted(ranges.items())}
    older = {p: r for p, r in older.items() if r[0] < r[1]}
    if not older:
        return
    when = f"@{cut}"
    what = ", ".join(f"{topic}/{p}: {s}–{e - 1}" for p, (s, e) in older.items())
    if window.horizon_ms is None and not store.fetchval(
            "SELECT EXISTS (SELECT 1 FROM kdg_dedup WHERE sink_table = $1)", window.sink_table):
        return  # a new table: nothing in it to write twice
    if req.beyond_dedup_window:
        req.echo(f"warning: offsets {what} are older than {window.sink_table}'s dedup window "
                 f"({show(window.retention_ms)}); they are written without a claim check (--beyond-dedup-window), "
                 "so any of them already in the table is written again")
        return
    raise UsageError(
        f"the range reaches back past {window.sink_table}'s dedup window: its claims are kept "
        f"{show(window.retention_ms)}, and records before {when} (Unix ms) may no longer be recognised as written. "
        f"Offsets {what} (topic/partition: first–last) are that old. Replay from {when} (--from {when}), or add "
        "--beyond-dedup-window to write them anyway: a record among them already in the table is written again")


def _run_job(req: ReplayRequest, master: str, policy, ranges: dict[str, Ranges], routes, key: str,
             source_options: dict) -> dict:
    """One Spark job for every topic: one frame of all their ranges, each task writing its topic's table."""
    from kdg.spark.job import kafka_frame, run_write, sink_rows
    from kdg.spark.session import spark_session

    started = time.monotonic()
    # an exception leaves this block carrying spark_log, Spark's log file, for _explain to name
    with spark_session(master, task_retries=policy.spark_task_retries, conf=req.spark_conf,
                       echo=req.echo, modules=routes.modules) as run, _cancel_on_stop(req.shutdown, run.spark):
        if req.shutdown.requested:  # asked while Spark started: the job is not begun (the caller says so)
            raise Interrupted(f"{req.shutdown.signal}: stopped before the Spark job began", req.shutdown.signum)
        job_started = time.monotonic()
        frame = kafka_frame(run.spark, ranges, source_options=source_options, split=not routes.in_order)
        rows = sink_rows(frame, key, with_timestamp=routes.whole_records)
        changes = routes.follow(rows)  # columns from the schema: each table meets its records' schemas first
        totals = run_write(run.spark, rows, routes.routed(), req.progress)
        totals["schema_changes"] = changes
        totals["duration_s"] = round(time.monotonic() - job_started, 3)
        totals["spark_start_s"] = round(job_started - started, 3)
    return totals


@contextlib.contextmanager
def _cancel_on_stop(shutdown: Shutdown, spark):
    """While the job runs, a stop request cancels it (from a thread of ours: the main thread is inside a
    py4j call). The signals are taken back first, should anything have installed its own handler since
    (PySpark does, for a context made on the main thread: kdg makes it on another, kdg.spark.session)."""
    shutdown.reclaim()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if shutdown.sleep(0.2):
                spark.sparkContext.cancelAllJobs()
                return

    watcher = threading.Thread(target=watch, name="kdg-replay-stop", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join(5)


_PY_ERROR = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.*)$", re.M)
_CAUSES = (("KeylessRecord", UsageError), ("HandlerNotAwaited", UsageError), ("ConnectionFailed", ConnectionFailed),
           ("Fenced", DeliveryError))


def _explain(exc: BaseException, policy) -> KdgError:
    """A failed Spark job as one readable kdg error: the executor's own exception when there is one."""
    if isinstance(exc, KdgError):
        return exc
    if isinstance(exc, KeyboardInterrupt):
        return DeliveryError("interrupted; the replay ledger says what was recorded")
    text = str(exc)
    log = getattr(exc, "spark_log", None)  # set by kdg.spark.session for whatever failed while Spark ran
    details = f"; Spark's log: {log}" if log else ""
    if "JAVA_GATEWAY_EXITED" in text:
        return DeliveryError(f"Spark's JVM did not start{details}")
    for name, kind in _CAUSES:
        found = re.search(rf"{name}: (.+)", text)
        if found:
            return kind(found.group(1).strip())
    raised = _PY_ERROR.search(text)  # the last line of the executor's Python traceback
    if "Python worker exited unexpectedly" in text:
        cause = "a Spark task's Python worker died"
    elif raised:
        cause = f"{raised.group(1)}: {raised.group(2).strip()}"
    else:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        cause = lines[0][:300] if lines else type(exc).__name__
    retry = ("task retries are off under this guarantee, so the job stopped"
             if not policy.spark_task_retries else "Spark gave up after retrying the task")
    return DeliveryError(f"the Spark job failed: {cause} ({retry}){details}")

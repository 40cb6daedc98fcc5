"""`kdg consume`: read a topic in a group and write a sink, committing offsets where the policy says."""

import os
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from collections import Counter

from kdg import faults
from kdg.accounting import crossed, dead_letter_status, parse_dead_letter_limit
from kdg.errors import ConnectionFailed, Fenced, RetryBatch, UsageError
from kdg.batching import sort_rows
from kdg.guarantees import CommitMode, policy_for
from kdg.kafka.consumer import KdgConsumer, StartOffset
from kdg.flow.routes import Router, command_line_router
from kdg.flow.source import Keys, sort_batch, value_decoder
from kdg.flow.topics import PipelineTopics
from kdg.lifecycle import DEFAULT_WAIT_TIMEOUT_S, Shutdown, StopRequested, wait_until_up
from kdg.mapping import Mapping
from kdg.memory import CalmCollector
from kdg.metrics import Metrics
from kdg.offsets import OffsetProtocol, TopicEnd
from kdg.retention import check_dedup_retention
from kdg.schemas.registry import waiting_for_registry
from kdg.settings import Connection
from kdg.sinks import Batch, parse_sink
from kdg.sinks.dead_letters import DeadLetterQueue, tally

TOO_MANY_DEAD_LETTERS = "too many dead letters"


@dataclass
class ConsumeRequest:
    topic: str | list[str]            # one topic, or several (none: --topic-pattern or --pipeline's routes)
    group: str
    guarantee: str
    conn: Connection
    sink: str = "postgres"
    table: str = "kdg_events"
    fmt: str = "text"                 # stdout: text | json envelope
    id_from: str | None = None        # header:NAME | json:FIELD | json:/POINTER | offset
    mapping: "Mapping | None" = None  # a typed sink: the user's table, through this mapping
    value_format: str = "json"        # how --id-from json: and the stdout sink read values (a typed sink: its mapping's)
    count: int | None = None          # -c
    exit_at_end: bool = False         # -e
    idle_timeout: float | None = None
    start: str = "stored"             # -o
    batch_size: int = 5_000
    batch_ms: int = 100               # a batch is written once it is full or this old, whichever comes first
    max_bytes: int = 1_048_576
    require_utf8: bool = True
    handler: str | None = None        # module:function
    transactional_id: str | None = None
    progress: Callable[[int], None] | None = None
    pg_wait: float = 120.0            # how long to wait for a Postgres that went away, before giving up
    pipeline: int = 2                 # exactly-once into Postgres: batches written at once, on as many connections
    notice: Callable[[str], None] = lambda text: None  # status lines (Postgres retries)
    dedup_retention: str | None = None  # exactly-once into Postgres: how long claims are kept (kdg.retention)
    shutdown: Shutdown = field(default_factory=Shutdown)  # requested (a signal): finish, commit, leave, return
    wait_timeout: float = DEFAULT_WAIT_TIMEOUT_S  # how long to wait for Kafka and Postgres to come up, and the registry
    metrics_port: int | None = None   # serve /metrics, /healthz and /readyz here (0: any free port)
    metrics_host: str = "0.0.0.0"
    max_dead_letters: str | None = None  # N | P% | all: past it the run stops, exit 7 (kdg.accounting)
    topic_pattern: str | None = None  # a regular expression: every topic it matches, as they appear
    routes: "Router | None" = None    # --pipeline FILE's routes (kdg.flow.pipeline_file); None: the command line's
    transform: "str | Callable | None" = None  # module:function (or a function): each record's rows (kdg.flow.transform)
    reprocess: bool = False           # exactly-once, typed upserts: a record claimed before is applied again

    @property
    def topics(self) -> list[str]:
        return [self.topic] if isinstance(self.topic, str) else [t for t in self.topic if t]

    def router(self) -> "Router":
        """The routes: the pipeline file's, or the command line as one route (``--table`` may be a template)."""
        return command_line_router(self.topics, self.topic_pattern, self.table, self.mapping, self.id_from,
                                   self.routes, self.transform)


@dataclass
class ConsumeReport:
    guarantee: str
    group: str
    topic: str
    sink: str
    consumed: int = 0                # records read: the sum of the buckets below (kdg.accounting)
    processed: int = 0               # records the sink took: written + superseded + deleted + filtered + duplicates
    written: int = 0                 # rows written (inserted or updated), or records sent on
    superseded: int = 0              # an upsert's earlier versions of a key in the same batch
    deleted: int = 0                 # tombstones and change-data-capture deletes applied
    filtered: int = 0                # left out on purpose (a transform's None; a tombstone under on_tombstone = ignore)
    exploded: int = 0                # rows beyond one per record a transform made: consumed + exploded = the buckets
    duplicates_suppressed: int = 0
    dead_lettered: int = 0
    dead_letter_reasons: dict = field(default_factory=dict)  # reason class → count (kdg.accounting)
    batches: int = 0
    fenced_batches: int = 0          # batches refused because this member had lost their partitions
    pg_outages: int = 0              # times Postgres went away mid-batch and came back
    pg_outage_s: float = 0.0         # seconds spent waiting for it
    lost_in_outages: int = 0         # records of batches committed before a write that Postgres never saw
    duration_s: float = 0.0
    msgs_per_s: float = 0.0
    stopped_by: str = ""
    never_assigned: list = field(default_factory=list)  # partitions of the topic this member never held
    dedup_window: str | None = None  # exactly-once into Postgres: how long the table keeps claims
    outside_dedup_window: int = 0    # rows written without a claim: their keys were older than the window
    claim_partitions_dropped: int = 0  # expired claim partitions this consumer's maintenance dropped
    probes_skipped: int = 0          # `kdg doctor --topic` probe records: read, stepped over, never written
    max_dead_letters: str = ""       # the limit this run kept to (--max-dead-letters)
    field_notes: list = field(default_factory=list)  # a typed sink: mapped fields no record had, fields unmapped
    tables: dict = field(default_factory=dict)  # Postgres: per table, where its rows ended (and its route)
    schema_changes: list = field(default_factory=list)  # evolve = add-columns: each column added (table, column, type)
    unavailable_values: int = 0      # Debezium's placeholders (unchanged TOASTed columns) read: each column's value kept
    skipped_events: dict = field(default_factory=dict)  # Debezium heartbeats and schema-change events: no rows, by kind
    reprocessed: int = 0             # --reprocess: records claimed before, applied again (also written or superseded)

    def to_dict(self) -> dict:
        return asdict(self)


def load_handler(spec: "str | Callable | None"):
    """``--handler module:function`` imported, found as ``--transform``'s are (a function given as it is)."""
    from kdg.flow.transform import load_function

    return load_function(spec or None, "--handler")


def _make_sink(req: ConsumeRequest, policy, router: Router, dlq: DeadLetterQueue, consumer: KdgConsumer,
               on_table=None):
    kind, out_topic = parse_sink(req.sink)
    if kind == "postgres":
        from kdg.sinks.postgres import PostgresSink

        depth = req.pipeline if policy.commit_mode is CommitMode.IN_SINK_TRANSACTION else 0  # chained offsets only
        return PostgresSink(req.conn.pg_dsn, router, req.group, dlq, load_handler(req.handler), depth,
                            registry=req.conn.registry, on_table=on_table, reprocess=req.reprocess)
    if kind == "kafka":
        from kdg.sinks.kafka import KafkaSink

        txn_id = req.transactional_id or f"kdg-{req.group}-{_shown(req)}-{socket.gethostname()}-{os.getpid()}"
        return KafkaSink(policy, req.conn.bootstrap_servers, req.conn.extra, out_topic, dlq, txn_id, consumer,
                         req.group, own_id=req.transactional_id is None)
    from kdg.sinks.stdout import StdoutSink

    return StdoutSink(req.fmt, dlq, decode=value_decoder(req))


def _shown(req: ConsumeRequest) -> str:
    """The topics read, as reports and metrics name them: ``t``, ``t1,t2``, ``/REGEX/`` or the pipeline file's."""
    if req.routes is not None:
        return ",".join(s for r in req.routes.routes for s in r.topics + ((f"/{r.pattern}/",) if r.pattern else ()))
    return ",".join(req.topics + ([f"/{req.topic_pattern}/"] if req.topic_pattern else []))


def run_consume(req: ConsumeRequest) -> ConsumeReport:
    policy = policy_for(req.guarantee)
    kind, _ = parse_sink(req.sink)
    if policy.commit_mode is CommitMode.IN_SINK_TRANSACTION and kind == "stdout":
        raise UsageError("exactly-once cannot write to stdout: a terminal cannot take back a line if the "
                         "consumer crashes before its offsets commit. Use --sink postgres or kafka:TOPIC.")
    router = req.router()
    if router.typed and kind != "postgres":
        raise UsageError(f"--column and --mapping write a Postgres table; they cannot go with --sink {req.sink}")
    if kind != "postgres" and (router.routes[0].templated or len(router.routes) > 1):
        raise UsageError(f"--table templates and pipeline routes choose Postgres tables; --sink {req.sink} writes "
                         "no table (kafka:{topic}.out names an output topic per input topic)")
    check_dedup_retention(req.dedup_retention, policy, kind)
    limit = parse_dead_letter_limit(req.max_dead_letters)  # malformed: refused before anything is read
    shown = _shown(req)
    report = ConsumeReport(policy.guarantee.value, req.group, shown, req.sink, max_dead_letters=limit.text)
    keys = Keys(req, router)
    with Metrics("consume", policy.guarantee.value, req.metrics_port, req.metrics_host,
                 lambda: req.shutdown.requested) as metrics:
        if metrics.enabled:
            req.notice(f"metrics on http://{req.metrics_host}:{metrics.port}/metrics (and /healthz, /readyz)")
        metrics.started(shown)

        def waiting(text: str) -> None:
            metrics.turned()  # waiting for the Schema Registry is not a hung loop
            req.notice(text)

        try:
            with waiting_for_registry(req.wait_timeout, req.shutdown, waiting):
                _consume(req, policy, kind, router, keys, report, metrics)
        except StopRequested:  # while waiting for Kafka, Postgres or the Schema Registry
            report.stopped_by = req.shutdown.signal or "stop requested"
    return report


def _consume(req: ConsumeRequest, policy, kind: str, router: Router, keys: Keys, report: ConsumeReport,
             metrics: Metrics) -> None:
    start = StartOffset(req.start)
    bootstrap, extra = req.conn.bootstrap_servers, req.conn.extra
    metrics.not_ready = "waiting for Kafka"
    topics = PipelineTopics(router, bootstrap, extra, req.wait_timeout, req.shutdown, req.notice)
    topics.wait()  # listed topics must exist; a pattern's may come later
    # a member killed inside a Kafka sink's transaction holds the group's offsets until Kafka aborts it: waited for
    consumer = KdgConsumer(policy, bootstrap, req.group, extra, start, eof=req.exit_at_end,
                           offsets_wait_s=max(30.0, req.wait_timeout), stop=req.shutdown.check,
                           patterns=any(r.pattern for r in router.routes))
    sink = None
    try:
        dlq = DeadLetterQueue(policy, bootstrap, None, extra, req.group)  # each to its source topic's TOPIC.dlq
        metrics.not_ready = "waiting for Postgres" if kind == "postgres" else "starting"
        # claims: exactly-once's, and under any guarantee the marks of what a transform filtered out (kdg audit)
        logic = any(r.transform is not None or r.fan is not None for r in router.routes)
        on_table = _claim_windows(req, report) if (policy.dedup or logic) and kind == "postgres" else None
        sink = wait_until_up("Postgres", lambda: _make_sink(req, policy, router, dlq, consumer, on_table),
                             req.wait_timeout, req.shutdown, req.notice)
        checked: set[str] = set()

        def not_streamed(tps) -> None:  # one group is read by one pipeline at a time
            for topic in {t for t, _ in tps} - checked:
                if kind == "postgres" and sink.store.stream_running(req.group, topic):
                    raise UsageError(f"kdg spark-stream is reading {topic} for group {req.group!r}; one group is "
                                     "read by one pipeline at a time: stop the stream first (it exits 0 on SIGTERM)")
                checked.add(topic)

        not_streamed([(t, 0) for t in topics.partitions])
        metrics.not_ready = "no partitions assigned"
        offsets = OffsetProtocol(policy, consumer, sink)

        def rebalanced(kind: str, changed: list) -> None:
            """Each topic's partitions held after the change, on the gauge (0 too: a member left with none)."""
            sign, by = (1 if kind == "assigned" else -1), _by_topic(changed)
            held = {t: sign * len(by.get(t, ())) for t in set(by) | set(topics.partitions)}
            for t, _ in consumer.assigned:
                held[t] = held.get(t, 0) + 1
            for topic, n in held.items():
                metrics.rebalanced(topic, kind, by.get(topic, []), n)
                if kind == "revoked" and topic in by:
                    metrics.forget(topic, by[topic])
            metrics.not_ready = None if sum(held.values()) > 0 else "no partitions assigned"

        def on_assign(assigned):
            assigned = [p for p in assigned if router.takes(p.topic)]  # never a TOPIC.dlq a pattern matched
            not_streamed([(p.topic, p.partition) for p in assigned])
            chosen = offsets.assign(assigned)
            faults.reach("during-rebalance")  # partitions taken (fences bumped), not yet fetching
            rebalanced("assigned", chosen)
            return chosen

        def on_revoke(revoked):
            offsets.revoke(revoked)
            rebalanced("revoked", revoked)

        # a pipeline of several topics continues those it has positions for, and starts the others at -o
        consumer.stored_wins = len(router.subscription()) > 1 or any(r.pattern for r in router.routes)
        consumer.subscribe(router.subscription(), on_assign=on_assign, on_revoke=on_revoke)
        end = TopicEnd(offsets, consumer, bootstrap, extra, topics.current, policy.isolation_level)
        try:
            _loop(req, policy, keys, consumer, offsets, sink, end, report, metrics)
        finally:
            end.close()
    finally:
        metrics.stopping = True
        never = sorted({(t, p) for t, parts in topics.partitions.items() for p in parts} - consumer.ever_assigned)
        report.never_assigned = [p if len(topics.partitions) == 1 else f"{t}/{p}" for t, p in never]
        consumer.close()  # leaves the group: its partitions move to the others at once
        if sink is not None:
            for table, writer in getattr(sink, "writers", {}).items():  # each table, with the route that writes it
                report.tables.setdefault(table, _table_entry())["route"] = writer.route
            report.outside_dedup_window = sink.unclaimed()
            report.claim_partitions_dropped = sink.partitions_dropped
            sink.close()


def _by_topic(partitions) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for p in partitions:
        found.setdefault(p.topic, []).append(p.partition)
    return found


def _claim_windows(req: ConsumeRequest, report: ConsumeReport):
    """Each table's claim window, decided as the first topic routed to it is: exactly-once's claims, and the
    filtered marks of a route with a transform under any guarantee (:mod:`kdg.store.filtered`)."""
    from kdg.retention import decide_dedup_window, show

    def on_table(store, table, topic: str, sink) -> None:
        window = decide_dedup_window(store, req.conn, topic, table, req.dedup_retention, req.notice)
        sink.keep_window(window)
        report.dedup_window = report.dedup_window or show(window.retention_ms)

    return on_table


def _loop(req, policy, keys, consumer, offsets, sink, end, report, metrics) -> None:
    started = last_data = time.monotonic()
    shutdown = req.shutdown
    calm = CalmCollector()
    try:
        while True:
            if shutdown.requested:  # read between client calls: what is being written ends, and is committed
                metrics.stopping = True
                _settle(sink.drain(), req, offsets, sink, report, metrics)
                report.stopped_by = shutdown.signal or "stop requested"
                break
            metrics.turned()
            if metrics.lag_due():
                metrics.set_lag(consumer.lags())
            want = req.batch_size
            if req.count is not None:
                want = min(want, req.count - report.consumed - sink.records_in_flight)
            msgs = consumer.poll_batch(want, req.batch_ms / 1000) if want > 0 else []
            got, n = bool(msgs), len(msgs)
            if got:
                last_data = time.monotonic()
                _handle(msgs, req, policy, keys, offsets, sink, report, metrics)
            elif sink.records_in_flight:  # idle: account for what finished writing meanwhile
                _settle(sink.collect(), req, offsets, sink, report, metrics)
            # caught up (a poll short of a full batch, none being written): what the burst pinned is let go
            calm.turned(n, busy=n >= req.batch_size or sink.records_in_flight >= req.batch_size)
            for skipped in _maintain(req, offsets, sink, report, metrics):  # busy or idle: claims expire either way
                req.notice(f"claim maintenance of {skipped.sink_table} skipped: {skipped.skipped}")
            for note in sink.healed():
                req.notice(f"warning: {note}")
            _schema_changes(req, sink, report, metrics)
            _field_notes(req, sink, report, metrics)
            stop = _stop_reason(req, got, end, report, last_data, sink.records_in_flight)
            if stop and sink.records_in_flight:  # decide on what is written, not on what is being written
                _settle(sink.drain(), req, offsets, sink, report, metrics)
                stop = _stop_reason(req, got, end, report, last_data, 0)
            if stop:
                report.stopped_by = stop
                break
    finally:
        report.duration_s = round(time.monotonic() - started, 3)
        report.msgs_per_s = round(report.consumed / report.duration_s, 1) if report.duration_s else 0.0


def _maintain(req, offsets, sink, report, metrics) -> list:
    """The sink's own upkeep; Postgres gone meanwhile is an outage like one met writing a batch: the batches
    in flight end (written, or read again), then it is waited for."""
    try:
        return sink.maintain_if_due()
    except ConnectionFailed as exc:
        if not sink.lost_connection():
            raise
        _settle(sink.drain(), req, offsets, sink, report, metrics)
        if sink.lost_connection():  # nothing in flight met it: wait for it here
            _wait_for_postgres(exc, Batch(), req, offsets, sink, report, metrics)
        return []


def _field_notes(req, sink, report, metrics) -> None:
    """Say each mapped field no record has, and each field no column maps, once (a typed sink's watch)."""
    notes = sink.field_notes()
    if not notes:
        return
    for table, note in notes:
        req.notice(f"warning: {note.describe(table.text)}")
        report.field_notes.append({"table": table.text, "kind": note.kind, "field": note.field,
                                   "from": note.source or None})
    metrics.mapping_fields(report.topic, sink.field_counts())


def _schema_changes(req, sink, report, metrics) -> None:
    """Say each change the records' schema made to a table since last asked (or, under evolve = none, asked of
    it), keep it in the report and count it (``kdg_schema_changes_total{table, change}``)."""
    changes = getattr(sink, "schema_changes", None)
    while changes:
        change = changes.pop(0)
        req.notice(f"{change['table']}: column {change['column']} {change['type']} {change['change']} "
                   f"({change['why']})")
        report.schema_changes.append(change)
        metrics.schema_changed(change["table"], change["change"].split(" (")[0])


def _cdc_counts(req, events: Counter, report) -> None:
    """A committed batch's Debezium placeholders read and heartbeats and schema-change events skipped
    (``events``: ``(table or topic, kind) → n``), into the report; each kind said the first time it is met."""
    totals, where = Counter(), {}
    for (place, kind), n in events.items():
        totals[kind] += n
        where.setdefault(kind, []).append(place)
    if totals["unavailable"] and not report.unavailable_values:
        req.notice(f"{', '.join(where['unavailable'])}: Debezium's unavailable-value placeholder (an unchanged TOASTed "
                   "column) read: its column keeps the value it has, the placeholder is never written")
    for kind in sorted(set(totals) - {"unavailable"} - set(report.skipped_events)):
        req.notice(f"{', '.join(where[kind])}: Debezium {kind} events skipped (no rows' changes; counted in "
                   "skipped_events)")
    report.unavailable_values += totals.pop("unavailable", 0)
    report.skipped_events = dict(Counter(report.skipped_events) + totals)


def _stop_reason(req, got: bool, end, report, last_data: float, in_flight: int) -> str | None:
    if parse_dead_letter_limit(report.max_dead_letters).exceeded(report.dead_lettered, report.consumed):
        return TOO_MANY_DEAD_LETTERS
    if req.count is not None and report.consumed + in_flight >= req.count:
        return "count"
    if req.exit_at_end and not got and end.reached():
        return "end of topic"
    if req.idle_timeout is not None and time.monotonic() - last_data >= req.idle_timeout:
        return "idle timeout"
    return None


def _handle(msgs, req, policy, keys, offsets, sink, report, metrics) -> None:
    faults.reach("after-poll-before-process")
    batch = None
    if sink.takes_rows and keys.plain:  # per batch where the batch allows (kdg.batching)
        batch = sort_rows(msgs, req.max_bytes, req.require_utf8, must_have_key=policy.dedup)
    if batch is None:
        batch = sort_batch(msgs, keys, req, must_have_key=policy.dedup)
        keys.transformed(batch)
    msgs.clear()
    if not offsets.before_write(batch):
        report.fenced_batches += 1  # not ours any more: processing it could repeat the new owner's work
        metrics.dropped(batch, report.topic, "not-held")
        return
    batch.submitted_at = time.monotonic()
    try:
        outcomes = sink.submit(batch, atomic=offsets.atomic)
    except StopRequested:  # stopped while waiting for the Schema Registry, the batch unwritten
        if offsets.mode is CommitMode.BEFORE_PROCESSING:  # its offsets were committed first: lost, and counted
            report.lost_in_outages += batch.good
            metrics.dropped(batch, report.topic, "registry-outage")
        raise
    _settle(outcomes, req, offsets, sink, report, metrics)


def _settle(outcomes, req, offsets, sink, report, metrics) -> None:
    """Account for batches the sink is done with, oldest first; read again those it could not write."""
    again, outage = [], None
    for done in outcomes:
        batch, result, error = done.batch, done.result, done.error
        if error is None:
            offsets.after_write(batch)
            metrics.settled(batch, result, report.topic, time.monotonic() - batch.submitted_at)
            _account(batch, result, req, report)
        elif isinstance(error, (Fenced, RetryBatch)):
            report.fenced_batches += 1
            again.append(batch)
        elif isinstance(error, ConnectionFailed) and sink.lost_connection():
            outage = outage or error
            again.append(batch)
        else:
            raise error
    if outage is not None:
        _wait_for_postgres(outage, Batch.earliest(again), req, offsets, sink, report, metrics)
    elif again:
        offsets.rewind(Batch.earliest(again))
    if outcomes and req.progress:
        req.progress(report.consumed)


def _account(batch, result, req, report) -> None:
    """Count a committed batch's records into their buckets; a status line as dead letters mount."""
    report.consumed += len(batch)
    report.batches += 1
    report.processed += batch.good - batch.exploded - result.dead_lettered + batch.filtered
    report.filtered += batch.filtered
    report.exploded += batch.exploded
    report.written += result.written
    report.superseded += result.superseded
    report.deleted += result.deleted
    report.filtered += result.filtered
    report.duplicates_suppressed += result.duplicates_suppressed
    dead_before = report.dead_lettered
    report.dead_lettered += len(batch.dead) + result.dead_lettered
    report.probes_skipped += len(batch.probes)
    if result.events:
        _cdc_counts(req, result.events, report)
    for table, part in result.tables.items():  # per table: where its rows ended
        report.reprocessed += getattr(part, "reprocessed", 0)
        entry = report.tables.setdefault(table, _table_entry())
        for name in ("written", "duplicates", "superseded", "deleted", "filtered"):
            entry[name] += getattr(part, name)
        entry["dead_lettered"] += len(part.rejected)
    if report.dead_lettered > dead_before:
        reasons = Counter(report.dead_letter_reasons)
        reasons.update(tally(batch.dead))
        reasons.update(result.dead_reasons)
        report.dead_letter_reasons = dict(reasons.most_common())
        if crossed(dead_before, report.dead_lettered):
            req.notice(dead_letter_status(report.dead_lettered, report.consumed, reasons, report.topic))


def _table_entry(route: str = "") -> dict:
    return {"route": route, "written": 0, "duplicates": 0, "superseded": 0, "deleted": 0, "filtered": 0,
            "dead_lettered": 0}


def _wait_for_postgres(exc, batch, req, offsets, sink, report, metrics) -> None:
    """Postgres went away mid-batch: not the records' fault, so no dead letters — wait, then read on.

    A stop requested meanwhile ends the wait: the batch is read again on restart (or, committed
    before processing, lost, as at-most-once allows).
    """
    req.notice(f"{exc}; reconnecting for up to {req.pg_wait:g} s")
    report.pg_outages += 1
    metrics.not_ready = "Postgres unreachable"
    started = time.monotonic()

    def waiting(text: str) -> None:
        metrics.turned()  # waiting for Postgres is not a hung loop
        req.notice(text)

    try:
        waited, back = sink.reconnect(req.pg_wait, waiting, req.shutdown.sleep), True
    except ConnectionFailed:
        if not req.shutdown.requested:
            raise
        waited, back = time.monotonic() - started, False
    report.pg_outage_s = round(report.pg_outage_s + waited, 3)
    metrics.outage(waited)
    if not back:  # stopped while waiting; the loop sees the request next
        if offsets.mode is CommitMode.BEFORE_PROCESSING:
            report.lost_in_outages += batch.good
            metrics.dropped(batch, report.topic, "postgres-outage")
        req.notice(f"stopped while waiting for Postgres ({waited:.1f} s): the batch in flight was not written")
        return
    metrics.not_ready = None if offsets.consumer.assigned else "no partitions assigned"
    again = offsets.resume_after_outage(batch)
    if not again:
        report.lost_in_outages += batch.good
        metrics.dropped(batch, report.topic, "postgres-outage")
    req.notice(f"Postgres is back after {waited:.1f} s; " + (
        "reading on from the stored offsets" if again else
        f"{batch.good} records of the batch in flight are not written (their offsets were committed first)"))

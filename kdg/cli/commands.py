"""Top-level commands. Each declares its options, calls one library function and renders its report."""

import contextlib
from pathlib import Path
from typing import Annotated, Optional

import typer

from kdg.checks import check_lifecycle as _check_lifecycle, check_min as _check_min, checked_formats as _formats
from kdg.checks import sink_table as _sink_table
from kdg.cli import app
from kdg.cli.options import (Bootstrap, ChunkRows, Columns, ColumnsFrom, CreateTable, DedupRetention, Envelope,
                             Evolve, Json, KeyFormat, MappingFile, MetricsHost, MetricsPort, Mode, OnTombstone,
                             OnTruncate, PgDsn, Profile, Properties, SchemaRegistry, ShutdownTimeout, SinkTable,
                             SparkConf, SparkIdFrom, SparkMaster, StateDir, ValueFormat, WaitTimeout)
from kdg.cli.render import console, err_console, key_value_table, plain, print_json
from kdg.errors import CheckFailed, UsageError

GuaranteeOpt = Annotated[str, typer.Option(
    "--guarantee", "-g", help="at-most-once | at-least-once | exactly-once (see `kdg policy`).")]


def _conn(bootstrap, pg_dsn, props, profile, schema_registry=None):
    from kdg.settings import connection

    return connection(bootstrap, pg_dsn, props, profile=profile, schema_registry=schema_registry)


def _progress(label: str, total: int | None, enabled: bool):
    """A rich progress bar on stderr, or a no-op for --json and pipes."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not enabled or not err_console.is_terminal:
        return None, (lambda n, total=None: None)
    bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err_console,
                   transient=True)
    task = bar.add_task(label, total=total)
    return bar, (lambda n, total=None: bar.update(task, completed=n, total=total))


def _notice(text: str) -> None:
    err_console.print(text, style="warn", markup=False, highlight=False, soft_wrap=True)


def _run_with_bar(bar, run, req):
    """Call ``run(req)`` (a long-running command) with the progress bar (if any) live on stderr, the native
    memory its clients free given back to the system, and the cyclic collector kept off its batches
    (:mod:`kdg.memory`)."""
    from kdg.memory import collected_rarely, returned_to_the_system

    with returned_to_the_system(), collected_rarely(), bar if bar is not None else contextlib.nullcontext():
        return run(req)


@app.command()
def policy(
    guarantee: Annotated[Optional[str], typer.Argument(help="One guarantee; all three if omitted.")] = None,
    mode: Annotated[Optional[str], typer.Option("--mode", help="Also say what a typed sink's write mode "
                    "(insert or upsert) makes of the guarantee.")] = None,
    as_json: Json = False,
) -> None:
    """Print every setting a guarantee decides, and why."""
    from rich.table import Table

    from kdg.guarantees import all_policies, policy_for

    policies = [policy_for(guarantee)] if guarantee else all_policies()
    effects = [p.write_mode_effect(mode) for p in policies] if mode is not None else [None] * len(policies)
    if as_json:
        shown = [p.to_dict() | ({"write_mode": {"value": mode, "effect": e}} if e else {})
                 for p, e in zip(policies, effects)]
        print_json(shown if len(shown) > 1 else shown[0])
        return
    for p in policies:
        table = Table(title=p.guarantee.value, title_justify="left")
        table.add_column("setting", style="key")
        table.add_column("value")
        table.add_column("why", style="dim")
        for row in p.table():
            table.add_row(*row)
        if mode is not None:
            table.add_row("write_mode", mode, p.write_mode_effect(mode))
        console.print(table)


@app.command()
def produce(
    topic: Annotated[str, typer.Argument(help="Topic to write (created with the cluster defaults if missing).")],
    guarantee: GuaranteeOpt = "at-least-once",
    file: Annotated[Optional[Path], typer.Option("--file", "-f", help="Read lines from a file, not stdin.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="text: one record per line; json: kdg envelopes.")] = "text",
    count: Annotated[Optional[int], typer.Option("--count", help="Synthetic load: this many records.")] = None,
    size: Annotated[int, typer.Option("--size", help="Synthetic record size in bytes.")] = 100,
    rate: Annotated[Optional[float], typer.Option("--rate", help="Synthetic: at most this many per second; without "
                    "--count, a steady load until stopped (SIGTERM or SIGINT, exit 0).")] = None,
    key: Annotated[Optional[str], typer.Option("-k", help="Key for every record.")] = None,
    key_delimiter: Annotated[Optional[str], typer.Option("-K", help="Split each line into key and value.")] = None,
    header: Annotated[Optional[list[str]], typer.Option("-H", help="Header name=value (repeatable).")] = None,
    partition: Annotated[Optional[int], typer.Option("-p", help="Write to this partition only.")] = None,
    id_template: Annotated[Optional[str], typer.Option("--id", help="Idempotency key template, e.g. 'order-{seq}' [default: UUIDv7].")] = None,
    txn_size: Annotated[int, typer.Option(help="exactly-once: records per transaction at most.")] = 10_000,
    txn_interval_ms: Annotated[int, typer.Option(help="exactly-once: commit a transaction at least this often.")] = 100,
    transactional_id: Annotated[Optional[str], typer.Option(help="exactly-once: stable transactional.id [default: kdg-produce-TOPIC].")] = None,
    no_ledger: Annotated[bool, typer.Option("--no-ledger", help="Keep no ledger in Postgres (throughput runs; audit cannot count losses).")] = False,
    ledger_retention: Annotated[Optional[str], typer.Option(help="Keep ledger rows this long (30d, 36h, forever); "
                                "stored once for every producer (kdg db maintain changes it). Default: as stored, "
                                "else forever.")] = None,
    partitions: Annotated[int, typer.Option(help="Partitions if the topic is created.")] = 3,
    value_format: Annotated[Optional[str], typer.Option("--value-format", help="json (the default: values as "
                            "given), or avro, protobuf or json-schema: each value, a JSON document, encoded with "
                            "--schema in the Schema Registry wire format.")] = None,
    schema: Annotated[Optional[Path], typer.Option("--schema", help="The value schema (.avsc, .proto: its first "
                      "message, or a JSON Schema), registered under TOPIC-value.")] = None,
    schema_registry: SchemaRegistry = None,
    shutdown_timeout: ShutdownTimeout = 30.0, wait_timeout: WaitTimeout = 60.0,
    metrics_port: MetricsPort = None, metrics_host: MetricsHost = "0.0.0.0",
    bootstrap: Bootstrap = None, pg_dsn: PgDsn = None, props: Properties = None, profile: Profile = None,
    as_json: Json = False,
) -> None:
    """Send records under a delivery guarantee; each carries an idempotency key (header kdg-id).

    SIGTERM or SIGINT stops it cleanly: no more records are sent, the open transaction is aborted,
    what was sent is settled in the ledger. A run with an end (--count, a file, stdin) stopped early
    exits 130 (SIGINT) or 143 (SIGTERM); an endless --rate load exits 0.
    """
    from kdg.api import produce_request
    from kdg.errors import Interrupted
    from kdg.lifecycle import Shutdown
    from kdg.produce import run_produce

    endless = count is None and rate is not None and file is None
    synthetic = count is not None or rate is not None
    req = produce_request(topic, guarantee=guarantee, file=file if file is not None or synthetic else "-", format=fmt,
                          count=count, size=size, rate=rate, key=key, key_delimiter=key_delimiter, headers=header,
                          partition=partition, id_template=id_template, txn_size=txn_size,
                          txn_interval_ms=txn_interval_ms, transactional_id=transactional_id, ledger=not no_ledger,
                          ledger_retention=ledger_retention, partitions=partitions, value_format=value_format,
                          schema=schema, schema_registry=schema_registry, shutdown_timeout=shutdown_timeout,
                          wait_timeout=wait_timeout, metrics_port=metrics_port, metrics_host=metrics_host,
                          bootstrap_servers=bootstrap, pg_dsn=pg_dsn, properties=props, profile=profile,
                          notice=_notice)  # checked, the file read once, a value schema registered: nothing sent
    bar, req.progress = _progress(f"producing to {topic}", count, not as_json)
    with Shutdown(shutdown_timeout).on_signals() as shutdown:
        req.shutdown = shutdown
        report = _run_with_bar(bar, run_produce, req)
    if as_json:
        print_json(report)
    else:
        console.print(key_value_table(f"produce {topic} ({report.guarantee})", report.to_dict()))
    if report.interrupted and not endless:
        raise Interrupted(f"{report.stopped_by}: stopped after {report.sent} records"
                          + (" (the open transaction was aborted)" if report.open_transaction_aborted else ""),
                          shutdown.signum)
    if report.failed:
        raise CheckFailed(f"{report.failed} record(s) were not delivered")


@app.command()
def consume(
    topic: Annotated[Optional[list[str]], typer.Argument(help="Topics to read (one or several; or --topic-pattern, "
                     "or --pipeline FILE's routes).", show_default=False)] = None,
    group: Annotated[str, typer.Option("--group", "-G", help="Consumer group id.")] = ...,
    topic_pattern: Annotated[Optional[str], typer.Option(help="Read every topic this regular expression matches "
                             "whole, those created later too (within the client's metadata refresh).")] = None,
    guarantee: GuaranteeOpt = "at-least-once",
    sink: Annotated[str, typer.Option(help="postgres | kafka:OUT_TOPIC | stdout.")] = "postgres",
    table: SinkTable = None,
    column: Columns = None, mapping: MappingFile = None, mode: Mode = None, create_table: CreateTable = False,
    on_tombstone: OnTombstone = None, envelope: Envelope = None, on_truncate: OnTruncate = None,
    columns_from: ColumnsFrom = None, evolve: Evolve = None,
    reprocess: Annotated[bool, typer.Option("--reprocess", help="Exactly-once, a typed table in upsert mode: apply "
                         "records whose key is claimed already again instead of suppressing them (a backfill of a "
                         "column added since). Only over a row from the same partition at no later an offset: map "
                         "partition and offset to columns.")] = False,
    value_format: ValueFormat = None, key_format: KeyFormat = None, schema_registry: SchemaRegistry = None,
    fmt: Annotated[str, typer.Option("--format", help="stdout sink: text or json envelope lines.")] = "text",
    id_from: Annotated[Optional[str], typer.Option(help="Key for records without kdg-id: header:NAME, json:FIELD, "
                       "json:/POINTER, or offset (topic/partition/offset: exact for re-reads, blind to producer "
                       "duplicates).")] = None,
    count: Annotated[Optional[int], typer.Option("-c", help="Stop after this many records.")] = None,
    exit_at_end: Annotated[bool, typer.Option("-e", help="Stop once the whole topic is read for this group: held "
                           "partitions at their end, the others' stored offsets too.")] = False,
    idle_timeout: Annotated[Optional[float], typer.Option(help="Stop after this many seconds without records.")] = None,
    offset: Annotated[str, typer.Option("-o", help="Start: beginning | end | stored | N | s@TIMESTAMP_MS.")] = "stored",
    batch_size: Annotated[int, typer.Option(help="Records per batch (one sink transaction each).")] = 5_000,
    batch_ms: Annotated[int, typer.Option(help="Write a batch once it is this many milliseconds old, full or "
                        "not: the bound on how long a record waits to be written.")] = 100,
    max_bytes: Annotated[int, typer.Option(help="Larger values go to the dead-letter topic.")] = 1_048_576,
    handler: Annotated[Optional[str], typer.Option(help="module:function called with each batch (and the open "
                       "Postgres connection, inside the transaction).")] = None,
    transform: Annotated[Optional[str], typer.Option(help="module:function called with each record (decoded): "
                         "returns a dict (the row), a list of dicts (one row each) or None (filtered out).")] = None,
    transactional_id: Annotated[Optional[str], typer.Option(help="kafka sink, exactly-once: transactional.id.")] = None,
    pg_wait: Annotated[float, typer.Option(help="Seconds to keep reconnecting while Postgres is unreachable, "
                       "restarting or out of connections, before giving up (exit 5).")] = 120.0,
    pipeline: Annotated[Optional[str], typer.Option("--pipeline", help="A pipeline file (TOML): [[route]] entries, "
                        "each taking topics (names or a pattern) into a table or table template, with its mapping. "
                        "See `kdg pipeline check`.")] = None,
    pipeline_depth: Annotated[int, typer.Option(help="Exactly-once into Postgres: batches written at once, each on "
                              "its own connection, while the next is read (0: each batch is written before the next "
                              "is polled). Offsets stay chained in order.")] = 2,
    dedup_retention: DedupRetention = None,
    max_dead_letters: Annotated[str, typer.Option(help="Stop (exit 7, after committing what was good) once more "
                                "records than this went to the dead-letter topic: a count (0: at the first), a "
                                "share of the records read (10%: past 10 dead letters), or all (never).")] = "10%",
    shutdown_timeout: ShutdownTimeout = 30.0, wait_timeout: WaitTimeout = 60.0,
    metrics_port: MetricsPort = None, metrics_host: MetricsHost = "0.0.0.0",
    bootstrap: Bootstrap = None, pg_dsn: PgDsn = None, props: Properties = None, profile: Profile = None,
    as_json: Json = False,
) -> None:
    """Read topics in a group and write a sink; offsets commit where the guarantee says.

    Several topics, a --topic-pattern, a --table template (mt_{topic}) or a --pipeline file route each
    topic's records to its table; under exactly-once one transaction per batch holds every table's rows
    and every partition's offsets.

    SIGTERM or SIGINT stops it cleanly: the batch in flight is written and committed, the group is
    left, and it exits 0.
    """
    from kdg.accounting import parse_dead_letter_limit
    from kdg.api import consume as consume_topics
    from kdg.consume import TOO_MANY_DEAD_LETTERS
    from kdg.lifecycle import Shutdown

    limit = parse_dead_letter_limit(max_dead_letters)
    if columns_from not in (None, "from-schema"):
        raise UsageError(f"--columns {columns_from}: the only value is from-schema (list columns with --column)")
    if pipeline is not None and pipeline.isdigit():  # --pipeline N was the depth before it named a file
        _notice(f"warning: --pipeline {pipeline} is now --pipeline-depth {pipeline}")
        pipeline_depth, pipeline = int(pipeline), None
    topics = topic or []
    shown = ",".join(topics) or topic_pattern or f"--pipeline {pipeline}"
    bar, progress = _progress(f"consuming {shown}", count, not as_json and sink != "stdout")
    with Shutdown(shutdown_timeout).on_signals() as shutdown:
        report = _run_with_bar(bar, lambda _: consume_topics(
            topics, group=group, guarantee=guarantee, topic_pattern=topic_pattern, sink=sink, table=table,
            columns=column, mapping=mapping, mode=mode, create_table=create_table, on_tombstone=on_tombstone,
            envelope=envelope, on_truncate=on_truncate, value_format=value_format, key_format=key_format,
            from_schema=columns_from is not None, evolve=evolve, reprocess=reprocess, schema_registry=schema_registry,
            format=fmt, id_from=id_from, count=count, until_end=exit_at_end, idle_timeout=idle_timeout,
            offset=offset, batch_size=batch_size, batch_ms=batch_ms, max_bytes=max_bytes, handler=handler,
            transform=transform, transactional_id=transactional_id, pg_wait=pg_wait, pipeline=pipeline,
            pipeline_depth=pipeline_depth, dedup_retention=dedup_retention, max_dead_letters=max_dead_letters,
            shutdown_timeout=shutdown_timeout, wait_timeout=wait_timeout, metrics_port=metrics_port,
            metrics_host=metrics_host, bootstrap_servers=bootstrap, pg_dsn=pg_dsn, properties=props, profile=profile,
            stop=shutdown, progress=progress, notice=_notice), None)
    if as_json:
        print_json(report)
    else:
        out = err_console if sink == "stdout" else console  # keep stdout for the records
        out.print(key_value_table(f"consume {report.topic} → {sink} ({report.guarantee})", report.to_dict()))
    if report.stopped_by == TOO_MANY_DEAD_LETTERS:
        raise CheckFailed(f"stopped: {report.dead_lettered:,} of {report.consumed:,} records read went to "
                          f"{'TOPIC.dlq' if len(topics) != 1 else topics[0] + '.dlq'}, {limit.describe()} (--max-dead-letters {limit.text}); what was good is "
                          "committed. See the reasons above; --max-dead-letters all never stops")


SparkTopicPattern = Annotated[Optional[str], typer.Option(
    help="Read every topic this regular expression matches whole (spark-stream: those created later too).")]
SparkPipeline = Annotated[Optional[Path], typer.Option(
    "--pipeline", help="A pipeline file (TOML): [[route]] entries, each taking topics (names or a pattern) into a "
    "table or table template, with its mapping. See `kdg pipeline check`.")]
SparkTransform = Annotated[Optional[str], typer.Option(
    help="module:function called with each record (decoded) on Spark's executors, as in kdg consume: returns a "
    "dict (the row), a list of dicts (one row each) or None (filtered out).")]
SparkHandler = Annotated[Optional[str], typer.Option(
    help="module:function called in each Spark task's Postgres transaction with the rows it writes (and the open "
    "connection).")]


@app.command("spark-replay")
def spark_replay(
    topic: Annotated[Optional[list[str]], typer.Argument(help="Topics to replay (one or several, each with its own "
                     "range; or --topic-pattern, or --pipeline FILE's routes).", show_default=False)] = None,
    guarantee: GuaranteeOpt = "exactly-once",
    group: Annotated[str, typer.Option("--group", "-G", help="Whose stored offsets `stored` means, and which "
                     "ones a finished replay advances.")] = "kdg-spark-replay",
    start: Annotated[str, typer.Option("--from", help="earliest | latest | stored | P:OFFSET,… | "
                     "@2026-11-22T10:00:00 (UTC) | @MILLIS; the same on each topic.")] = "earliest",
    end: Annotated[str, typer.Option("--to", help="Exclusive end, same forms as --from.")] = "latest",
    topic_pattern: SparkTopicPattern = None,
    pipeline: SparkPipeline = None,
    table: SinkTable = None,
    column: Columns = None, mapping: MappingFile = None, mode: Mode = None, create_table: CreateTable = False,
    on_tombstone: OnTombstone = None, envelope: Envelope = None,
    value_format: ValueFormat = None, key_format: KeyFormat = None, schema_registry: SchemaRegistry = None,
    master: SparkMaster = "local[*]",
    id_from: SparkIdFrom = None,
    chunk_rows: ChunkRows = 20_000,
    spark_conf: SparkConf = None,
    dedup_retention: DedupRetention = None,
    beyond_dedup_window: Annotated[bool, typer.Option(help="Exactly-once: replay records older than the table's "
                                   "dedup window too; one of them already in the table is written again.")] = False,
    transform: SparkTransform = None, handler: SparkHandler = None,
    shutdown_timeout: ShutdownTimeout = 30.0, wait_timeout: WaitTimeout = 60.0,
    bootstrap: Bootstrap = None, pg_dsn: PgDsn = None, props: Properties = None, profile: Profile = None,
    as_json: Json = False,
) -> None:
    """Replay Kafka ranges into Postgres with Spark; exactly-once adds each idempotency key once, however often it runs.

    Several topics (or a --topic-pattern) are replayed in one Spark job, each with its own range and
    into the table its route names (--table mt_{topic}, or --pipeline FILE).

    SIGTERM or SIGINT cancels the Spark job (its open Postgres transactions roll back), records the
    replay failed and exits 143 or 130; the same command finishes it later.
    """
    from rich.table import Table

    from kdg.lifecycle import Shutdown
    from kdg.replay import ReplayRequest, run_spark_replay
    from kdg.settings import parse_properties

    def show_range(ranges) -> None:
        if as_json:
            return
        shown = Table(title=f"replaying {', '.join(ranges)} "
                      f"({sum(e - s for r in ranges.values() for s, e in r.values())} offsets)", title_justify="left")
        for col in ("topic", "partition", "from", "to (exclusive)", "offsets"):
            shown.add_column(col, justify="right")
        for t, r in ranges.items():
            for p, (s, e) in sorted(r.items()):
                shown.add_row(t, str(p), str(s), str(e), str(e - s))
        err_console.print(shown)

    routes, typed, table = _spark_routes(pipeline, table, column, mapping, mode, on_tombstone, create_table,
                                         envelope, value_format, key_format, id_from)
    _check_lifecycle(shutdown_timeout, wait_timeout, None)
    bar, tasks_done = _progress("spark tasks", None, not as_json)
    with Shutdown(shutdown_timeout).on_signals() as shutdown:
        req = ReplayRequest(topic=topic or [], topic_pattern=topic_pattern, routes=routes, guarantee=guarantee,
                            conn=_conn(bootstrap, pg_dsn, props, profile, schema_registry), value_format=value_format,
                            group=group, start=start, end=end, table=table, mapping=typed,
                            master=master, id_from=id_from, chunk_rows=chunk_rows, dedup_retention=dedup_retention,
                            beyond_dedup_window=beyond_dedup_window, transform=transform, handler=handler,
                            spark_conf=parse_properties(spark_conf or [], "--conf", "a Spark property"),
                            on_range=show_range, progress=lambda done, total, failed: tasks_done(done, total),
                            echo=lambda text: err_console.print(text, soft_wrap=True, markup=False),
                            shutdown=shutdown, wait_timeout=wait_timeout)
        report = _run_with_bar(bar, run_spark_replay, req)
    if as_json:
        print_json(report)
    else:
        rows = {k: v for k, v in report.to_dict().items() if k not in ("partitions", "tables")}
        console.print(key_value_table(f"spark-replay {report.topic} → {report.table} ({report.guarantee})", rows))
        _show_spark_tables(report.tables)


@app.command("spark-stream")
def spark_stream(
    topic: Annotated[Optional[list[str]], typer.Argument(help="Topics to stream (one or several; or "
                     "--topic-pattern, or --pipeline FILE's routes).", show_default=False)] = None,
    group: Annotated[str, typer.Option("--group", "-G", help="The group whose positions the stream starts from "
                     "(without a checkpoint) and stores: kdg_offsets under exactly-once, Kafka's committed offsets "
                     "under at-least-once.")] = ...,
    guarantee: GuaranteeOpt = "exactly-once",
    topic_pattern: SparkTopicPattern = None,
    pipeline: SparkPipeline = None,
    table: SinkTable = None,
    column: Columns = None, mapping: MappingFile = None, mode: Mode = None, create_table: CreateTable = False,
    on_tombstone: OnTombstone = None, envelope: Envelope = None,
    value_format: ValueFormat = None, key_format: KeyFormat = None, schema_registry: SchemaRegistry = None,
    master: SparkMaster = "local[*]",
    checkpoint: Annotated[Optional[str], typer.Option(help="Spark's checkpoint directory or URI (default: under "
                          "the state dir, one per group and topics); on a cluster, a path every node sees.")] = None,
    trigger: Annotated[str, typer.Option(help="How often a micro-batch starts: an interval (500ms, 2s, 1m), or "
                       "available-now to write what is there and stop.")] = "1s",
    max_per_batch: Annotated[Optional[int], typer.Option(help="At most this many records per micro-batch "
                             "(maxOffsetsPerTrigger).")] = None,
    id_from: SparkIdFrom = None,
    chunk_rows: ChunkRows = 20_000,
    spark_conf: SparkConf = None,
    pg_wait: Annotated[float, typer.Option(help="Seconds a batch that met Postgres down waits for it before the "
                       "stream gives up (exit 5).")] = 120.0,
    dedup_retention: DedupRetention = None,
    transform: SparkTransform = None, handler: SparkHandler = None,
    shutdown_timeout: ShutdownTimeout = 30.0, wait_timeout: WaitTimeout = 60.0,
    bootstrap: Bootstrap = None, pg_dsn: PgDsn = None, props: Properties = None, profile: Profile = None,
    as_json: Json = False,
) -> None:
    """Stream topics into Postgres with Spark Structured Streaming, under the same guarantee as kdg consume.

    Several topics, a --topic-pattern (topics created later too) or --pipeline FILE route each record
    to its table (--table mt_{topic}).

    One line per micro-batch (with --json, one JSON object per line, then the report). SIGTERM or
    SIGINT lets the batch in flight finish, stops the query and exits 0; the next run goes on from
    the checkpoint.
    """
    from kdg.lifecycle import Shutdown
    from kdg.settings import parse_properties
    from kdg.spark.stream import StreamRequest, run_spark_stream

    if not group.strip():
        raise UsageError("--group must not be empty")
    _check_min(("--chunk-rows", chunk_rows, 1), ("--max-per-batch", max_per_batch, 1), ("--pg-wait", pg_wait, 0))
    _check_lifecycle(shutdown_timeout, wait_timeout, None)
    routes, typed, table = _spark_routes(pipeline, table, column, mapping, mode, on_tombstone, create_table,
                                         envelope, value_format, key_format, id_from)

    def on_batch(b) -> None:
        if as_json:
            print_json(b, compact=True)
            return
        lag = " ".join(f"{p}:{n}" for p, n in b.lag.items()) or "-"
        again = f", written again after {b.attempts - 1} Postgres outage(s)" if b.attempts > 1 else ""
        err_console.print(f"batch {b.batch_id}: {b.rows_in} in, {b.rows_written} written, {b.duplicates_dropped} "
                          f"duplicates dropped, {b.dead_lettered} dead-lettered, {b.rows_per_s:,.0f} rows/s; "
                          f"lag {lag}{again}", markup=False, highlight=False, soft_wrap=True)

    with Shutdown(shutdown_timeout).on_signals() as shutdown:
        req = StreamRequest(topic=topic or [], topic_pattern=topic_pattern, routes=routes, group=group,
                            guarantee=guarantee, conn=_conn(bootstrap, pg_dsn, props, profile, schema_registry),
                            value_format=value_format, table=table, mapping=typed, master=master,
                            checkpoint=checkpoint, trigger=trigger, max_per_batch=max_per_batch, id_from=id_from,
                            chunk_rows=chunk_rows,
                            spark_conf=parse_properties(spark_conf or [], "--conf", "a Spark property"),
                            dedup_retention=dedup_retention, pg_wait=pg_wait, shutdown=shutdown,
                            transform=transform, handler=handler,
                            wait_timeout=wait_timeout, on_batch=on_batch,
                            echo=lambda text: err_console.print(text, soft_wrap=True, markup=False))
        report = _run_with_bar(None, run_spark_stream, req)
    if as_json:
        print_json(report, compact=True)  # the last line of the stream: the report
    else:
        console.print(key_value_table(f"spark-stream {report.topic} → {report.table} ({report.guarantee})",
                                      {k: v for k, v in report.to_dict().items() if k != "tables"}))
        _show_spark_tables(report.tables)


def _spark_routes(pipeline, table, column, mapping, mode, on_tombstone, create_table, envelope, value_format,
                  key_format, id_from):
    """The Spark commands' routes from the command line: ``--pipeline``'s (refused now if malformed), or the mapping
    (built on the template's placeholder table when ``--table`` is a template) and the table."""
    from kdg.flow.pipeline_file import PLACEHOLDER_TABLE, load_pipeline
    from kdg.mapping import build_mapping

    routes = load_pipeline(pipeline) if pipeline is not None else None
    template = table is not None and "{" in table
    typed = build_mapping(file=mapping, columns=column, table=PLACEHOLDER_TABLE if template else table, mode=mode,
                          on_tombstone=on_tombstone, create_table=create_table, envelope=envelope,
                          value_format=value_format, key_format=key_format)
    _formats(value_format, key_format, typed, "" if (id_from or "").startswith("json:") else
             "the generic sink keeps each value's bytes as they are; decoding is for a typed sink (--column or "
             "--mapping) or --id-from json:")
    return routes, typed, table if template else typed.table.text if typed is not None else _sink_table(table)


def _show_spark_tables(tables: dict) -> None:
    """Several tables: one line each (its route, topics and rows written)."""
    if len(tables) < 2:
        return
    for name, entry in tables.items():
        console.print(f"  {name} ← {', '.join(entry['topics'])} ({entry['route']}): {entry.get('rows_written', 0):,} "
                      f"written, {entry.get('duplicates_dropped', 0):,} duplicates dropped, "
                      f"{entry.get('dead_lettered', 0):,} dead-lettered", markup=False, highlight=False)


@app.command()
def audit(
    topic: Annotated[Optional[str], typer.Argument(help="The topic the consumer read (recorded by kdg's producer "
                     "ledger, or not); none with --pipeline.", show_default=False)] = None,
    group: Annotated[Optional[str], typer.Option("--group", "-G", help="Only rows this group wrote; its stored "
                     "positions tell lost from pending. Default: each group that wrote into the sink, audited "
                     "apart; a sink not split by group (kafka:, a typed table) needs -G when several groups "
                     "consumed the topic.")] = None,
    sink: Annotated[str, typer.Option(help="postgres, or kafka:OUT_TOPIC to read the output topic.")] = "postgres",
    table: Annotated[str, typer.Option(help="Postgres sink table, NAME or SCHEMA.NAME.")] = "kdg_events",
    since: Annotated[Optional[str], typer.Option(help="Only records the producer recorded from this time on "
                     "(from a topic: with a timestamp from it on): ISO 8601 (UTC unless it says) or Unix "
                     "milliseconds.")] = None,
    until: Annotated[Optional[str], typer.Option(help="... and before this time.")] = None,
    id_from: Annotated[Optional[str], typer.Option(help="A topic kdg's ledger has no record of is its own truth: "
                       "key its records with the consume's --id-from (header:NAME, json:FIELD, json:/POINTER, "
                       "source:FIELD, envelope:FIELD or offset; a kdg-id header wins, as it did).")] = None,
    envelope: Annotated[Optional[str], typer.Option(help="With --id-from json: from a topic, the consume's "
                        "--envelope: none (the default) or debezium (json: reads the change event's row; its "
                        "deletes account for their keys).")] = None,
    value_format: Annotated[Optional[str], typer.Option(help="With --id-from json: from a topic, the consume's "
                            "--value-format (json, avro, protobuf, json-schema).")] = None,
    pipeline: Annotated[Optional[Path], typer.Option("--pipeline", help="Audit every route of this pipeline file: "
                        "each topic a route takes (listed, or matched in the cluster) against the table it "
                        "resolves to; one line per route.")] = None,
    schema_registry: SchemaRegistry = None,
    bootstrap: Bootstrap = None, pg_dsn: PgDsn = None, props: Properties = None, profile: Profile = None,
    as_json: Json = False,
) -> None:
    """Count lost, duplicated, unexpected and pending records: the producer ledger (or the topic) against the sink.

    With no ledger of the topic (kdg did not produce it), the topic itself is the truth: every record
    the group read past must be in the sink or dead-lettered; nothing is counted unexpected.
    Records left out (outside --since/--until, or whose ledger row or claim expired with its
    retention window) are counted apart as outside_window: never lost, never unexpected.

    With --pipeline FILE (and no TOPIC), each route of the file is audited: every topic it takes against
    the table it resolves to, one line per route.

    Exit 0 when balanced (pending records are not yet read, not lost), 7 when anything was lost,
    duplicated or unexpected (in any group's audit), 2 for a topic neither in Kafka nor in the ledger,
    5 when Kafka or Postgres could not be read.
    """
    from kdg.api import audit as audit_topic

    audits = audit_topic(topic, group=group, sink=sink, table=table, since=since, until=until, id_from=id_from,
                         envelope=envelope, value_format=value_format, pipeline=pipeline,
                         schema_registry=schema_registry, bootstrap_servers=bootstrap, pg_dsn=pg_dsn, properties=props,
                         profile=profile)
    if pipeline is not None:
        return _show_pipeline_audit(audits, as_json)
    several = len(audits.reports) > 1
    if as_json:
        print_json(audits if several else audits.reports[0])  # {"groups": [...], "balanced"} only for several
    else:
        for report in audits.reports:
            _show_audit(report, f"audit {topic} → {sink}" + (f", group {report.group}" if several else "")
                        + f" (truth: the {report.truth})")
    unbalanced = [r for r in audits.reports if not r.balanced]
    if unbalanced:
        raise CheckFailed("unbalanced: " + "; ".join(
            (f"group {r.group}: " if several else "") + f"lost {r.lost}, duplicates {r.duplicates}"
            + (f", unexpected {r.unexpected}" if r.truth == "ledger" else "") for r in unbalanced))


def _show_pipeline_audit(found, as_json: bool) -> None:
    """``kdg audit --pipeline FILE``: one line per route; 7 when any route is unbalanced."""
    if as_json:
        print_json(found)
    else:
        for route in found.routes:
            verdict = "[ok]balanced[/ok]" if route.balanced else "[bad]UNBALANCED[/bad]"
            console.print(f"route {plain(route.route)}: {plain(', '.join(route.topics) or '-')} → "
                          f"{plain(', '.join(route.tables) or '-')}: lost {route.total('lost')}, duplicates "
                          f"{route.total('duplicates')}, unexpected {route.total('unexpected')}, pending "
                          f"{route.total('pending')}, filtered {route.total('filtered')}, {verdict}", soft_wrap=True)
            for note in route.notes:
                console.print(f"  {plain(note)}", style="dim", soft_wrap=True)
    unbalanced = [r for r in found.routes if not r.balanced]
    if unbalanced:
        raise CheckFailed("unbalanced: " + "; ".join(
            f"route {r.route}: lost {r.total('lost')}, duplicates {r.total('duplicates')}, unexpected "
            f"{r.total('unexpected')}" for r in unbalanced))


def _show_audit(report, title: str) -> None:
    rows = {k: v for k, v in report.to_dict().items() if k not in ("examples", "dead_letter_reasons")}
    console.print(key_value_table(title, rows))
    for reason, n in report.dead_letter_reasons.items():
        console.print(f"dead-lettered {n:>8}  {reason}", markup=False, highlight=False)
    for kind, ids in report.examples.items():
        if ids:
            console.print(f"[warn]{kind}[/warn] e.g. {plain(', '.join(ids))}")


@app.command()
def doctor(
    state_dir: StateDir = None,
    bootstrap: Bootstrap = None, pg_dsn: PgDsn = None, props: Properties = None, profile: Profile = None,
    topic: Annotated[Optional[str], typer.Option(
        "--topic", help="Also check that the configured user may write, read and commit here: one small real "
        "record is written to this topic (header kdg-doctor, no kdg-id: kdg's consumers step over it). Needs --group.")] = None,
    group: Annotated[Optional[str], typer.Option(
        "--group", help="The consumer group of the --topic check; its committed offset is committed again "
        "unchanged (or the partition's first offset if it has none).")] = None,
    as_json: Json = False,
) -> None:
    """Check Java, the jars, brokers, TLS/SASL, the controller quorum, Postgres and the settings exactly-once needs."""
    from rich.table import Table
    from rich.text import Text

    from kdg.doctor import run_doctor

    if (topic is None) != (group is None):
        raise UsageError("--topic and --group go together: the check writes and reads the topic and commits for the group")
    report = run_doctor(bootstrap, pg_dsn, state_dir, props, profile, topic=topic, group=group)
    if as_json:
        print_json(report)
    else:
        table = Table(title="kdg doctor", title_justify="left")
        for col in ("check", "result", "detail"):
            table.add_column(col)
        for c in report.checks:
            table.add_row(c.name, "[ok]ok[/ok]" if c.ok else "[bad]FAIL[/bad]", Text(c.detail))
        console.print(table)
    if not report.ok:
        raise CheckFailed("failed: " + ", ".join(c.name for c in report.checks if not c.ok))

"""kdg as a library: the commands as functions, with keyword arguments that mirror the command line's options.

Example::

    import kdg

    report = kdg.consume("orders", group="etl", guarantee="exactly-once", table="app.orders",
                         columns=["id bigint = json:id", "total numeric = json:total"], create_table=True,
                         transform="shop.logic:orders", until_end=True)
    print(report.processed, report.filtered)

Each function returns its command's report dataclass and raises a :class:`kdg.errors.KdgError` (never
``SystemExit``). None installs a signal handler: a service stops a run with a :class:`StopToken` (``stop=``),
or asks for kdg's own SIGTERM/SIGINT handling with ``StopToken().on_signals()``.

Stability: what is public is what :data:`kdg.__all__` lists, the fields of the report dataclasses these
functions return, and the exceptions of :mod:`kdg.errors`. Everything else (the request dataclasses, every
other module) may change in any release.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Callable

from kdg.checks import MAX_BATCH, check_lifecycle, check_min, checked_formats, sink_table
from kdg.errors import UsageError
from kdg.lifecycle import DEFAULT_SHUTDOWN_TIMEOUT_S, Shutdown

if TYPE_CHECKING:
    from kdg.audit import GroupAudits
    from kdg.consume import ConsumeReport, ConsumeRequest
    from kdg.flow.audit import PipelineAudit
    from kdg.produce import ProduceReport, ProduceRequest
    from kdg.replay import ReplayReport
    from kdg.settings import Connection
    from kdg.spark.stream import BatchReport, StreamReport

log = logging.getLogger("kdg")
Function = Callable[..., Any]


class StopToken(Shutdown):
    """A request to stop a running :func:`consume`, :func:`produce`, :func:`spark_replay` or :func:`spark_stream`.

    ``token.stop()`` (from any thread, a signal handler included) makes the run stop as a SIGTERM would:
    ``consume`` finishes its batch, commits, leaves the group and returns its report.

    Example::

        token = kdg.StopToken()
        threading.Thread(target=lambda: kdg.consume("orders", group="etl", stop=token)).start()
        ...
        token.stop()

    ``timeout``: seconds a stop may take once kdg's own signal handling (:meth:`on_signals`, installed only
    when called) caught a signal, past which the process ends at once.
    """

    def __init__(self, timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S):
        super().__init__(timeout)

    def stop(self, reason: str = "stop requested") -> None:
        """Ask the run to stop; ``reason`` becomes its report's ``stopped_by``."""
        self.request(reason)

    @property
    def stopped(self) -> bool:
        """Whether a stop was asked for."""
        return self.requested


def connect(bootstrap_servers: str | None = None, pg_dsn: str | None = None,
            properties: Mapping[str, Any] | Iterable[str] | None = None, profile: str | Path | None = None,
            schema_registry: str | None = None) -> "Connection":
    """Where kdg's clients go: explicit values, then ``KDG_*`` environment variables, then the local stack
    (what ``--bootstrap-servers``, ``--pg-dsn``, ``-X``, ``-F`` and ``--schema-registry`` give the CLI).

    ``properties``: Kafka client properties, a dict (or ``-X``'s ``"key=value"`` strings)."""
    import os

    from kdg.settings import connection

    props = [f"{k}={v}" for k, v in properties.items()] if isinstance(properties, Mapping) else list(properties or [])
    profile = profile or os.environ.get("KDG_KAFKA_CONFIG")
    return connection(bootstrap_servers or os.environ.get("KDG_BOOTSTRAP_SERVERS"), pg_dsn, props,
                      profile=Path(profile) if profile else None,
                      schema_registry=schema_registry or os.environ.get("KDG_SCHEMA_REGISTRY"))


def consume(topic: str | list[str] | None = None, *, group: str, guarantee: str = "at-least-once",
            topic_pattern: str | None = None, sink: str = "postgres", table: str | None = None,
            columns: list[str] | None = None, mapping: str | Path | None = None, mode: str | None = None,
            create_table: bool = False, on_tombstone: str | None = None, envelope: str | None = None,
            on_truncate: str | None = None, value_format: str | None = None, key_format: str | None = None,
            from_schema: bool = False, evolve: str | None = None, reprocess: bool = False,
            schema_registry: str | None = None, format: str = "text", id_from: str | None = None,
            count: int | None = None, until_end: bool = False, idle_timeout: float | None = None,
            offset: str = "stored", batch_size: int = 5_000, batch_ms: int = 100,
            max_bytes: int = 1_048_576, handler: str | Function | None = None,
            transform: str | Function | None = None, transactional_id: str | None = None,
            pg_wait: float = 120.0, pipeline: str | Path | None = None, pipeline_depth: int = 2,
            dedup_retention: str | None = None, max_dead_letters: str = "10%",
            shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S, wait_timeout: float = 60.0,
            metrics_port: int | None = None, metrics_host: str = "0.0.0.0",
            bootstrap_servers: str | None = None, pg_dsn: str | None = None,
            properties: Mapping[str, Any] | Iterable[str] | None = None, profile: str | Path | None = None,
            stop: Shutdown | None = None, progress: Callable[[int], None] | None = None,
            notice: Callable[[str], None] | None = None) -> "ConsumeReport":
    """Read topics in a consumer group and write a sink under a delivery guarantee (``kdg consume``).

    Args:
        topic: a topic, or a list of them (none: ``topic_pattern=`` or ``pipeline=``'s routes).
        group: the consumer group id (``-G``).
        guarantee: ``at-most-once``, ``at-least-once`` or ``exactly-once``.
        table: the sink table (``SCHEMA.NAME``; a template such as ``mt_{topic}``); default ``kdg_events``.
        columns: a typed table's columns (``--column``), e.g. ``["id bigint = json:id"]``.
        mapping: a mapping file (``--mapping``), instead of ``columns``.
        from_schema: the typed table's columns from each record's own schema (``--columns from-schema``);
            ``columns`` then only adds what the row has not (``source:ts_ms``, a header, the key).
        evolve: with ``from_schema``, ``"none"`` (the default) or ``"add-columns"`` (``--evolve``).
        create_table: create the typed table if it is missing (its schema must exist).
        reprocess: exactly-once, a typed route in upsert mode: a record whose key was claimed before is applied
            again instead of suppressed, to fill columns added since (``--reprocess``); it updates only a row
            that came from the same partition at an offset no later than its own, so the mapping must map
            ``partition`` and ``offset`` to columns. Refused for insert routes and the generic table.
        until_end: stop once the whole topic is read for this group (``-e``).
        count: stop after this many records (``-c``).
        offset: where to start: ``beginning``, ``end``, ``stored`` (the default), an offset (``-o``).
        transform: each record's rows: ``"module:function"`` or the function, called with a
            :class:`~kdg.flow.transform.TransformRecord`; returns a dict, a list of dicts or None (filtered).
        handler: ``"module:function"`` or the function, called with the batch's rows and the open asyncpg
            connection, inside the transaction (sync or async).
        pipeline: a pipeline file (TOML ``[[route]]`` entries).
        bootstrap_servers: Kafka's brokers (``-b``); default ``KDG_BOOTSTRAP_SERVERS``, else the local stack.
        pg_dsn: Postgres (``--pg-dsn``); default ``KDG_PG_DSN``, else the local stack.
        properties: Kafka client properties, a dict (``-X``).
        profile: a client profile file (``-F``).
        stop: a :class:`StopToken`: ``stop.stop()`` finishes the batch, commits, leaves the group, returns.
        progress: called with the count of records read so far.
        notice: called with each status line (waiting for a server); default: the ``kdg`` logger, at INFO.

    The other arguments are the command's options, snake_case.

    Returns:
        The :class:`~kdg.consume.ConsumeReport`. A run stopped by ``max_dead_letters`` returns too, its
        ``stopped_by`` saying so (the command line exits 7 for it).

    Raises:
        kdg.errors.KdgError: a refused option (:class:`~kdg.errors.UsageError`), Kafka or Postgres out of
            reach (:class:`~kdg.errors.ConnectionFailed`), a delivery kdg cannot recover from.

    Example::

        report = kdg.consume("payments", group="balances", guarantee="exactly-once", table="app.payments",
                             columns=["id bigint = json:id"], create_table=True,
                             handler=apply_payments, until_end=True)
    """
    request = _consume_request(**locals())
    from kdg.consume import run_consume

    return run_consume(request)


def _consume_request(*, topic, group, guarantee, topic_pattern, sink, table, columns, mapping, mode, create_table,
                     on_tombstone, envelope, on_truncate, value_format, key_format, from_schema, evolve,
                     reprocess, schema_registry, format, id_from,
                     count, until_end, idle_timeout, offset, batch_size, batch_ms, max_bytes, handler, transform,
                     transactional_id, pg_wait, pipeline, pipeline_depth, dedup_retention, max_dead_letters,
                     shutdown_timeout, wait_timeout, metrics_port, metrics_host, bootstrap_servers, pg_dsn,
                     properties, profile, stop, progress, notice) -> "ConsumeRequest":
    """:func:`consume`'s arguments checked and built into a request (no server reached)."""
    from kdg.accounting import parse_dead_letter_limit
    from kdg.consume import ConsumeRequest, load_handler
    from kdg.flow.pipeline_file import PLACEHOLDER_TABLE, load_pipeline
    from kdg.mapping import build_mapping

    parse_dead_letter_limit(max_dead_letters)
    if format not in ("text", "json"):
        raise UsageError("--format must be text or json")
    if not group.strip():
        raise UsageError("--group must not be empty")
    check_min(("-c", count, 1), ("--batch-size", batch_size, 1), ("--batch-ms", batch_ms, 1),
              ("--idle-timeout", idle_timeout, 0), ("--max-bytes", max_bytes, 0), ("--pg-wait", pg_wait, 0),
              ("--pipeline-depth", pipeline_depth, 0))
    check_lifecycle(shutdown_timeout, wait_timeout, metrics_port)
    if batch_size > MAX_BATCH:
        raise UsageError(f"--batch-size {batch_size}: at most {MAX_BATCH:,} (what one poll of the Kafka client returns)")
    if pipeline_depth > 8:
        raise UsageError(f"--pipeline-depth {pipeline_depth}: at most 8 (each is a Postgres connection; 2 already "
                         "overlaps reading with writing)")
    routes = load_pipeline(Path(pipeline)) if pipeline is not None else None  # refused before anything is read
    template = table is not None and "{" in table  # a table per topic: checked as topics are routed
    typed = build_mapping(file=Path(mapping) if mapping is not None else None, columns=columns,
                          table=PLACEHOLDER_TABLE if template else table, mode=mode, on_tombstone=on_tombstone,
                          create_table=create_table, envelope=envelope, value_format=value_format,
                          key_format=key_format, on_truncate=on_truncate, from_schema=from_schema,
                          evolve=evolve)  # a bad mapping is refused now
    kind = sink.partition(":")[0]
    value_format = checked_formats(value_format, key_format, typed, "" if kind == "stdout" or (id_from or "").startswith(
        "json:") else f"the {kind} sink keeps each value's bytes as they are; decoding is for a typed sink "
        "(--column or --mapping), --id-from json: or the stdout sink")
    table = table if template else typed.table.text if typed is not None else sink_table(table)
    load_handler(handler)  # a handler that cannot be imported is refused before anything is read
    if transform is not None and routes is not None:
        raise UsageError("--transform is the command line's route's; in a pipeline file each route says "
                         "transform = \"module:function\"")
    if reprocess:
        _check_reprocess(guarantee, kind, typed, routes)
    topics = [topic] if isinstance(topic, str) else list(topic or [])
    return ConsumeRequest(
        topic=topics, topic_pattern=topic_pattern, routes=routes, group=group, guarantee=guarantee,
        conn=connect(bootstrap_servers, pg_dsn, properties, profile, schema_registry), sink=sink, table=table,
        mapping=typed, value_format=value_format, fmt=format,
        # binary values are fine to decode (avro …), keep (raw) or show as base64 envelopes
        require_utf8=value_format == "json" and not (kind == "stdout" and format == "json"), id_from=id_from,
        count=count, exit_at_end=until_end, idle_timeout=idle_timeout, start=offset, batch_size=batch_size,
        batch_ms=batch_ms, max_bytes=max_bytes, handler=handler, transactional_id=transactional_id,
        progress=progress, pg_wait=pg_wait, pipeline=pipeline_depth, dedup_retention=dedup_retention,
        shutdown=stop if stop is not None else Shutdown(shutdown_timeout), wait_timeout=wait_timeout,
        metrics_port=metrics_port, metrics_host=metrics_host, notice=notice or log.info,
        max_dead_letters=max_dead_letters, transform=transform, reprocess=reprocess)


def _check_reprocess(guarantee: str, kind: str, typed, routes) -> None:
    """``reprocess=True`` refused where it means nothing or would duplicate (before anything is read); a pipeline
    file's routes are checked as their tables are (:func:`kdg.store.reprocess.check_reprocess`)."""
    from kdg.guarantees import policy_for
    from kdg.store.reprocess import check_reprocess

    if not policy_for(guarantee).dedup:
        raise UsageError(f"--reprocess is for exactly-once, whose claims suppress a record read again; under "
                         f"{guarantee} nothing is suppressed: a record read again (-o beginning, a new group) is "
                         "written again already")
    if kind != "postgres":
        raise UsageError(f"--reprocess applies records to a Postgres table again; --sink {kind} writes none")
    if typed is None and routes is None:
        raise UsageError("--reprocess applies records already written again, and the generic table keeps each "
                         "record as a row of its own: each would be a second row. It needs a typed table in upsert "
                         "mode (--column or --mapping, --mode upsert)")
    if typed is not None:
        check_reprocess(typed)


def produce(topic: str, values: Iterable[Any] | None = None, *, guarantee: str = "at-least-once",
            file: str | Path | None = None, format: str = "text", count: int | None = None, size: int = 100,
            rate: float | None = None, key: str | None = None, key_delimiter: str | None = None,
            headers: Mapping[str, str] | Iterable[str] | None = None, partition: int | None = None,
            id_template: str | None = None, txn_size: int = 10_000, txn_interval_ms: int = 100,
            transactional_id: str | None = None, ledger: bool = True, ledger_retention: str | None = None,
            partitions: int = 3, value_format: str | None = None, schema: str | Path | None = None,
            schema_registry: str | None = None, shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S,
            wait_timeout: float = 60.0, metrics_port: int | None = None, metrics_host: str = "0.0.0.0",
            bootstrap_servers: str | None = None, pg_dsn: str | None = None,
            properties: Mapping[str, Any] | Iterable[str] | None = None, profile: str | Path | None = None,
            stop: Shutdown | None = None, progress: Callable[[int], None] | None = None,
            notice: Callable[[str], None] | None = None) -> "ProduceReport":
    """Send records under a delivery guarantee, each with an idempotency key (``kdg produce``).

    Args:
        topic: the topic (created with ``partitions`` if missing).
        values: the records' values: each a ``str`` or ``bytes`` as it is, anything else as JSON.
        file: instead of ``values``, a file's lines (``"-"``: standard input); ``format="json"``: kdg envelopes.
        count: instead, this many synthetic records of ``size`` bytes; ``rate``: at most this many a second
            (a ``rate`` without a ``count``: a steady load until stopped).
        key: a key for every record (``-k``).
        key_delimiter: split each line of ``file`` into key and value (``-K``).
        headers: name → value, on every record (``-H``; or ``"name=value"`` strings).
        ledger: keep the producer ledger in Postgres, which ``audit`` reads (``--no-ledger``: False).
        value_format: ``avro``, ``protobuf`` or ``json-schema``: each JSON line encoded with ``schema``.
        stop: a :class:`StopToken`; a stopped run returns its report with ``interrupted`` set.

    The other arguments are the command's options, snake_case (``--id`` is ``id_template``).

    Returns:
        The :class:`~kdg.produce.ProduceReport` (records not delivered are counted in ``failed``).

    Example::

        kdg.produce("orders", [{"id": 1, "total": "9.90"}], guarantee="exactly-once", id_template="order-{seq}")
    """
    request = produce_request(**locals())
    from kdg.produce import run_produce

    return run_produce(request)


def produce_request(topic: str, values: Iterable[Any] | None = None, *, guarantee: str = "at-least-once",
                    file: str | Path | None = None, format: str = "text", count: int | None = None, size: int = 100,
                    rate: float | None = None, key: str | None = None, key_delimiter: str | None = None,
                    headers: Mapping[str, str] | Iterable[str] | None = None, partition: int | None = None,
                    id_template: str | None = None, txn_size: int = 10_000, txn_interval_ms: int = 100,
                    transactional_id: str | None = None, ledger: bool = True, ledger_retention: str | None = None,
                    partitions: int = 3, value_format: str | None = None, schema: str | Path | None = None,
                    schema_registry: str | None = None, shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S,
                    wait_timeout: float = 60.0, metrics_port: int | None = None, metrics_host: str = "0.0.0.0",
                    bootstrap_servers: str | None = None, pg_dsn: str | None = None,
                    properties: Mapping[str, Any] | Iterable[str] | None = None, profile: str | Path | None = None,
                    stop: Shutdown | None = None, progress: Callable[[int], None] | None = None,
                    notice: Callable[[str], None] | None = None) -> "ProduceRequest":
    """:func:`produce`'s arguments checked and built into a request: the file read once, a value schema registered,
    nothing sent. The command line runs it before it takes over SIGTERM and SIGINT (until then a signal ends the
    process at once: there is nothing to finish)."""
    from kdg import sources
    from kdg.produce import ProduceRequest
    from kdg.records import id_maker
    from kdg.schemas.registry import waiting_for_registry

    header_items = [f"{k}={v}" for k, v in headers.items()] if isinstance(headers, Mapping) else list(headers or [])
    opts = sources.LineOptions(key=key, key_delimiter=key_delimiter, headers=sources.parse_headers(header_items),
                               partition=partition)
    if format not in ("text", "json"):
        raise UsageError("--format must be text or json")
    check_min(("-p", partition, 0), ("--txn-size", txn_size, 1), ("--txn-interval-ms", txn_interval_ms, 0),
              ("--partitions", partitions, 1))
    check_lifecycle(shutdown_timeout, wait_timeout, metrics_port)
    id_maker(id_template)  # a bad --id template is refused before the topic is created
    if file is not None and (count is not None or rate is not None):
        raise UsageError("--count and --rate make synthetic records; --file sends the file's lines: give one or the "
                         "other")
    if count is not None and format == "json":
        raise UsageError("--format json reads envelopes from --file or stdin; --count makes synthetic records")
    synthetic = count is not None or rate is not None and file is None
    if (values is not None) + (file is not None) + synthetic != 1:
        raise UsageError("give the records: values, a file (\"-\": standard input), or a count or rate of "
                         "synthetic ones")
    conn = connect(bootstrap_servers, pg_dsn, properties, profile, schema_registry)
    # the schema is registered before anything is sent (a stop meanwhile ends kdg at once: nothing to finish)
    with waiting_for_registry(wait_timeout, None, notice or log.info):
        encode = _value_encoder(value_format, Path(schema) if schema is not None else None, topic, conn,
                                synthetic=synthetic)
    if synthetic:
        records = sources.synthetic(count, size, rate, opts)
    else:
        reader = sources.envelopes if format == "json" else sources.text_lines
        if values is not None:
            reader = _values_reader(values)
        if encode is not None:
            from kdg.schemas.produce import encoded

            plain = reader
            # validated with the command's own options: the value to encode is what follows a -K delimiter
            reader = lambda path, _opts: encoded(plain(path, opts), encode, value_format)  # noqa: E731
        path = None if file is None or str(file) == "-" else Path(file)
        if path is not None:
            sources.validate_file(path, reader, opts)  # a bad line is reported before anything is sent
        records = reader(path, opts)
    # chunks never hold a record back: a synthetic load hands out only what is due at its rate
    # (SyntheticLoad.take); standard input, and headers at a rate, go one record at a time
    chunked = isinstance(records, sources.SyntheticLoad) or rate is None and (count is not None or path is not None or values is not None)
    return ProduceRequest(topic=topic, guarantee=guarantee, records=records, conn=conn, ledger=ledger,
                         ledger_retention=ledger_retention, id_template=id_template, txn_size=txn_size,
                         txn_interval_ms=txn_interval_ms, transactional_id=transactional_id, partitions=partitions,
                         progress=progress, shutdown=stop if stop is not None else Shutdown(shutdown_timeout),
                         wait_timeout=wait_timeout, metrics_port=metrics_port, metrics_host=metrics_host,
                         notice=notice or log.info, chunk=1000 if chunked else 1)


def _values_reader(values: Iterable[Any]):
    """A reader (as :mod:`kdg.sources` has) of a Python caller's values: ``str``/``bytes`` as they are, else JSON."""
    import json

    from kdg.records import Record

    def read(_path, opts):
        for v in values:
            value = v if isinstance(v, bytes) else v.encode() if isinstance(v, str) else json.dumps(v).encode()
            yield Record(value=value, key=opts.key.encode() if opts.key is not None else None,
                         headers=list(opts.headers), partition=opts.partition)

    return read


def _value_encoder(value_format, schema, topic: str, conn, *, synthetic: bool):
    """`kdg produce`'s encoder for a schema'd --value-format (its schema registered), else None."""
    from kdg.schemas import SCHEMA_FORMATS, check_format

    value_format = check_format(value_format or "json")
    if value_format not in SCHEMA_FORMATS:
        if schema is not None:
            raise UsageError("--schema is for --value-format avro, protobuf or json-schema")
        if value_format == "raw":
            raise UsageError("--value-format raw: kdg produce sends each line's bytes as they are already (json)")
        return None
    if schema is None:
        raise UsageError(f"--value-format {value_format} needs --schema FILE")
    if synthetic:
        raise UsageError(f"--value-format {value_format}: give the values as JSON lines (--file or stdin), "
                         "not --count or --rate")
    from kdg.schemas.produce import encoder_for

    return encoder_for(value_format, schema, topic, conn.registry)


def audit(topic: str | None = None, *, group: str | None = None, sink: str = "postgres", table: str = "kdg_events",
          since: datetime | str | None = None, until: datetime | str | None = None, id_from: str | None = None,
          envelope: str | None = None, value_format: str | None = None, pipeline: str | Path | None = None,
          schema_registry: str | None = None, bootstrap_servers: str | None = None, pg_dsn: str | None = None,
          properties: Mapping[str, Any] | Iterable[str] | None = None,
          profile: str | Path | None = None) -> "GroupAudits | PipelineAudit":
    """Count lost, duplicated, unexpected and pending records: the ledger (or the topic) against the sink.

    Args:
        topic: the topic a consumer read; or ``pipeline=`` a pipeline file, to audit each of its routes.
        group: only rows this group wrote (default: each group that wrote into the sink, audited apart).
        since: only records from this moment on: a datetime (a naive one is UTC), or as ``--since`` takes it,
            ISO 8601 text (UTC unless it says) or Unix milliseconds.
        until: ... and before this one.

    The other arguments are ``kdg audit``'s options, snake_case.

    Returns:
        For a topic, :class:`~kdg.audit.GroupAudits`: ``.reports`` (one :class:`~kdg.audit.AuditReport` per
        group, with ``lost``, ``duplicates``, ``filtered``, ``pending``, …) and ``.balanced``. For a pipeline,
        :class:`~kdg.flow.audit.PipelineAudit`: ``.routes``, each with ``.balanced``. An unbalanced audit is
        returned, not raised (the command line exits 7 for it).

    Example::

        assert kdg.audit("orders", group="etl", table="app.orders").balanced
    """
    from kdg.audit import run_audits
    from kdg.flow.audit import run_pipeline_audit
    from kdg.settings import table_name

    if (topic is None) == (pipeline is None):
        raise UsageError("give the TOPIC to audit, or --pipeline FILE to audit every route of a pipeline"
                         if topic is None else "--pipeline audits the topics its routes take; give no TOPIC too")
    table_name(table)  # NAME or SCHEMA.NAME, refused before anything is read
    since_at, until_at = _moment(since, "--since"), _moment(until, "--until")
    if since_at and until_at and since_at >= until_at:
        raise UsageError(f"--since {since} is not before --until {until}")
    conn = connect(bootstrap_servers, pg_dsn, properties, profile, schema_registry)
    options = dict(group=group, since=since_at, until=until_at, id_from=id_from, envelope=envelope,
                   value_format=value_format)
    if pipeline is not None:
        if sink != "postgres" or table != "kdg_events":
            raise UsageError(f"--pipeline {pipeline}: its routes name their tables; give no --sink or --table too")
        return run_pipeline_audit(Path(pipeline), conn, **options)
    return run_audits(topic, conn, sink=sink, table=table, **options)


def _moment(moment: datetime | str | None, option: str) -> datetime | None:
    """``since``/``until``: a datetime (naive: UTC), or ISO 8601 text (UTC unless it says) or Unix milliseconds,
    as an aware datetime."""
    from datetime import timezone

    from kdg.spark.ranges import parse_timestamp

    if moment is None or isinstance(moment, datetime):
        return moment.replace(tzinfo=timezone.utc) if moment is not None and moment.tzinfo is None else moment
    ms = parse_timestamp(moment, option)
    try:
        return datetime.fromtimestamp(ms / 1000, timezone.utc)
    except (ValueError, OverflowError, OSError):
        raise UsageError(f"{option} {moment}: outside the years 1 to 9999") from None


def _spark_routes(pipeline, table, columns, mapping, mode, on_tombstone, create_table, envelope, value_format,
                  key_format, id_from):
    """The Spark commands' routes: ``pipeline``'s, or the mapping (on the template's placeholder table when
    ``table`` is a template) and the table."""
    from kdg.flow.pipeline_file import PLACEHOLDER_TABLE, load_pipeline
    from kdg.mapping import build_mapping

    routes = load_pipeline(Path(pipeline)) if pipeline is not None else None
    template = table is not None and "{" in table
    typed = build_mapping(file=Path(mapping) if mapping is not None else None, columns=columns,
                          table=PLACEHOLDER_TABLE if template else table, mode=mode, on_tombstone=on_tombstone,
                          create_table=create_table, envelope=envelope, value_format=value_format,
                          key_format=key_format)
    checked_formats(value_format, key_format, typed, "" if (id_from or "").startswith("json:") else
                    "the generic sink keeps each value's bytes as they are; decoding is for a typed "
                    "sink (--column or --mapping) or --id-from json:")
    return routes, typed, table if template else typed.table.text if typed is not None else sink_table(table), \
        value_format


def spark_replay(topic: str | list[str] | None = None, *, guarantee: str = "exactly-once",
                 group: str = "kdg-spark-replay", start: str = "earliest", end: str = "latest",
                 topic_pattern: str | None = None, pipeline: str | Path | None = None, table: str | None = None,
                 columns: list[str] | None = None, mapping: str | Path | None = None, mode: str | None = None,
                 create_table: bool = False, on_tombstone: str | None = None, envelope: str | None = None,
                 value_format: str | None = None, key_format: str | None = None, master: str = "local[*]",
                 id_from: str | None = None, chunk_rows: int = 20_000, spark_conf: Mapping[str, str] | None = None,
                 dedup_retention: str | None = None, beyond_dedup_window: bool = False,
                 transform: str | Function | None = None, handler: str | Function | None = None,
                 shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S, wait_timeout: float = 60.0,
                 schema_registry: str | None = None, bootstrap_servers: str | None = None,
                 pg_dsn: str | None = None, properties: Mapping[str, Any] | Iterable[str] | None = None,
                 profile: str | Path | None = None, stop: Shutdown | None = None,
                 echo: Callable[[str], None] | None = None) -> "ReplayReport":
    """Replay Kafka ranges into Postgres with Spark (``kdg spark-replay``); exactly-once adds each idempotency
    key once, however often it runs.

    Args:
        topic: a topic or a list of them, each replayed from ``start`` to ``end`` (``--from``/``--to``:
            earliest, latest, stored, ``P:OFFSET,…``, ``@ISO-TIME`` or ``@MILLIS``).
        stop: a :class:`StopToken`; a stop cancels the Spark job and records the replay failed.
        transform: as :func:`consume`'s, run on Spark's executors (``"module:function"``, importable there; or a
            function, pickled with each task).
        handler: as :func:`consume`'s, called in each Spark task's transaction with the rows it writes.

    The other arguments are the command's options, snake_case (``--conf`` is ``spark_conf``, a dict).

    Returns:
        The :class:`~kdg.replay.ReplayReport`.
    """
    from kdg.replay import ReplayRequest, run_spark_replay

    routes, typed, table, value_format = _spark_routes(pipeline, table, columns, mapping, mode, on_tombstone,
                                                       create_table, envelope, value_format, key_format, id_from)
    check_lifecycle(shutdown_timeout, wait_timeout, None)
    req = ReplayRequest(topic=topic or [], topic_pattern=topic_pattern, routes=routes, guarantee=guarantee,
                        conn=connect(bootstrap_servers, pg_dsn, properties, profile, schema_registry),
                        value_format=value_format, group=group, start=start, end=end, table=table, mapping=typed,
                        master=master, id_from=id_from, chunk_rows=chunk_rows, dedup_retention=dedup_retention,
                        beyond_dedup_window=beyond_dedup_window, spark_conf=dict(spark_conf or {}),
                        transform=transform, handler=handler,
                        echo=echo or log.info, shutdown=stop if stop is not None else Shutdown(shutdown_timeout),
                        wait_timeout=wait_timeout)
    return run_spark_replay(req)


def spark_stream(topic: str | list[str] | None = None, *, group: str, guarantee: str = "exactly-once",
                 topic_pattern: str | None = None, pipeline: str | Path | None = None, table: str | None = None,
                 columns: list[str] | None = None, mapping: str | Path | None = None, mode: str | None = None,
                 create_table: bool = False, on_tombstone: str | None = None, envelope: str | None = None,
                 value_format: str | None = None, key_format: str | None = None, master: str = "local[*]",
                 checkpoint: str | None = None, trigger: str = "1s", max_per_batch: int | None = None,
                 id_from: str | None = None, chunk_rows: int = 20_000, spark_conf: Mapping[str, str] | None = None,
                 pg_wait: float = 120.0, dedup_retention: str | None = None,
                 transform: str | Function | None = None, handler: str | Function | None = None,
                 shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S, wait_timeout: float = 60.0,
                 schema_registry: str | None = None, bootstrap_servers: str | None = None,
                 pg_dsn: str | None = None, properties: Mapping[str, Any] | Iterable[str] | None = None,
                 profile: str | Path | None = None, stop: Shutdown | None = None,
                 on_batch: Callable[["BatchReport"], None] | None = None,
                 echo: Callable[[str], None] | None = None) -> "StreamReport":
    """Stream topics into Postgres with Spark Structured Streaming (``kdg spark-stream``).

    Args:
        topic: a topic or a list of them (or ``topic_pattern=``, or ``pipeline=``'s routes).
        group: the group whose positions the stream starts from and stores.
        trigger: an interval (``"500ms"``, ``"2s"``) or ``"available-now"`` to write what is there and return.
        stop: a :class:`StopToken`; a stop lets the micro-batch in flight finish and returns the report.
        on_batch: called with each micro-batch's report.
        transform: as :func:`consume`'s, run on Spark's executors.
        handler: as :func:`consume`'s, called in each Spark task's transaction with the rows it writes.

    The other arguments are the command's options, snake_case (``--conf`` is ``spark_conf``, a dict).

    Returns:
        The :class:`~kdg.spark.stream.StreamReport`.
    """
    from kdg.spark.stream import StreamRequest, run_spark_stream

    if not group.strip():
        raise UsageError("--group must not be empty")
    check_min(("--chunk-rows", chunk_rows, 1), ("--max-per-batch", max_per_batch, 1), ("--pg-wait", pg_wait, 0))
    check_lifecycle(shutdown_timeout, wait_timeout, None)
    routes, typed, table, value_format = _spark_routes(pipeline, table, columns, mapping, mode, on_tombstone,
                                                       create_table, envelope, value_format, key_format, id_from)
    req = StreamRequest(topic=topic or [], topic_pattern=topic_pattern, routes=routes, group=group,
                        guarantee=guarantee, conn=connect(bootstrap_servers, pg_dsn, properties, profile,
                                                          schema_registry),
                        value_format=value_format, table=table, mapping=typed, master=master, checkpoint=checkpoint,
                        trigger=trigger, max_per_batch=max_per_batch, id_from=id_from, chunk_rows=chunk_rows,
                        spark_conf=dict(spark_conf or {}), dedup_retention=dedup_retention, pg_wait=pg_wait,
                        shutdown=stop if stop is not None else Shutdown(shutdown_timeout),
                        wait_timeout=wait_timeout, on_batch=on_batch, echo=echo or log.info,
                        transform=transform, handler=handler)
    return run_spark_stream(req)

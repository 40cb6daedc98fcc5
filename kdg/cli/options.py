"""Option types shared between commands (declared once, reused by every command that takes them)."""

from pathlib import Path
from typing import Annotated, Optional

import typer

Bootstrap = Annotated[Optional[str], typer.Option(
    "-b", "--bootstrap-servers", envvar="KDG_BOOTSTRAP_SERVERS",
    help="Kafka bootstrap servers [default: the local stack].")]
PgDsn = Annotated[Optional[str], typer.Option(
    "--pg-dsn", envvar="KDG_PG_DSN", show_envvar=True,
    help="PostgreSQL DSN [default: the local stack's]. Never printed with its password.")]
Properties = Annotated[Optional[list[str]], typer.Option(
    "-X", help="librdkafka property key=value (repeatable); refused if it weakens the guarantee.")]
Profile = Annotated[Optional[Path], typer.Option(
    "-F", "--config-file", envvar="KDG_KAFKA_CONFIG", show_envvar=True,
    help="librdkafka properties file (key=value lines, # comments), kcat-style; -X wins over it. "
         "Values may be ${env:NAME} or @FILE.")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
StateDir = Annotated[Optional[Path], typer.Option(
    "--state-dir", envvar="KDG_STATE_DIR", help="Where the local stack keeps data, logs and pids.")]

# a typed sink: the user's own table, through a mapping (kdg consume, kdg spark-replay)
Columns = Annotated[Optional[list[str]], typer.Option(
    "--column", help="Typed sink column 'NAME [TYPE] = SOURCE' (repeatable; without TYPE, the table's own). SOURCE: json:FIELD, json:/POINTER, "
    "key, key:FIELD, key:/POINTER, header:NAME, topic, partition, offset, timestamp, idempotency_key.")]
MappingFile = Annotated[Optional[Path], typer.Option(
    "--mapping", help="Typed sink mapping, a TOML file: table, mode, key, on_tombstone, create_table and a columns table. "
    "Flags override its values.")]
Mode = Annotated[Optional[str], typer.Option(
    "--mode", help="Typed sink: insert (the default) or upsert (on the mapping's key, else the table's primary key).")]
CreateTable = Annotated[bool, typer.Option(
    "--create-table", help="Typed sink: create the table from the mapping if it is missing (key → primary key).")]
Envelope = Annotated[Optional[str], typer.Option(
    "--envelope", help="Typed sink: none (the default) or debezium: each value is a change event (bare, or Kafka "
    "Connect's JsonConverter schema/payload); json: sources read its after; op c/u/r upserts, op d deletes by key "
    "(mode defaults to upsert, --on-tombstone to delete).")]
OnTombstone = Annotated[Optional[str], typer.Option(
    "--on-tombstone", help="Typed sink, a record with a null value: dead-letter (the default), delete (by key) or "
    "ignore.")]
OnTruncate = Annotated[Optional[str], typer.Option(
    "--on-truncate", help="Typed sink, --envelope debezium, a truncate (op t): dead-letter (the default) or apply "
    "(every row deleted, in record order, inside the batch's transaction).")]
ColumnsFrom = Annotated[Optional[str], typer.Option(
    "--columns", help="Typed sink: from-schema: the columns (and key) from each record's own schema (Kafka "
    "Connect's JsonConverter, a Debezium envelope's after, or the Schema Registry's by the record's schema id); "
    "--column then adds only what the row has not.")]
Evolve = Annotated[Optional[str], typer.Option(
    "--evolve", help="Typed sink, --columns from-schema: none (the default: a schema change is said, not followed) "
    "or add-columns (a new field adds a nullable column, a widened type widens it, an optional field drops NOT NULL).")]

# exactly-once into Postgres: how long a sink table's claims are kept (kdg.retention)
DedupRetention = Annotated[Optional[str], typer.Option(
    "--dedup-retention", help="Exactly-once into Postgres: keep the table's claims this long (30d, 36h, 10s, or "
    "forever); a record read again later is written again. Stored with the table, so all its writers agree. "
    "Default: the stored one, else the topic's retention.ms + segment.ms.")]

# long-running commands under an orchestrator (kdg.lifecycle, kdg.metrics)
ShutdownTimeout = Annotated[float, typer.Option(
    "--shutdown-timeout", envvar="KDG_SHUTDOWN_TIMEOUT", help="On SIGTERM or SIGINT: seconds to finish the batch or "
    "transaction in flight, commit it and leave the group; past them (or on a second signal) it stops at once.")]
WaitTimeout = Annotated[float, typer.Option(
    "--wait-timeout", envvar="KDG_WAIT_TIMEOUT", help="Seconds to wait, backing off, for Kafka and Postgres to come up "
    "at start-up, and for a Schema Registry that is away (0: fail at once, exit 5). A refused login or an ACL is "
    "never waited for.")]
MetricsPort = Annotated[Optional[int], typer.Option(
    "--metrics-port", envvar="KDG_METRICS_PORT", help="Serve Prometheus metrics (/metrics), liveness (/healthz) and "
    "readiness (/readyz) on this port; 0 picks a free one and prints it.")]
MetricsHost = Annotated[str, typer.Option(
    "--metrics-host", envvar="KDG_METRICS_HOST", help="Address the metrics port listens on.")]

SinkTable = Annotated[Optional[str], typer.Option(
    "--table", help="Postgres sink table, NAME or SCHEMA.NAME (default: kdg_events; created like it, the schema "
    "must exist). With --column or --mapping: your table.")]
SparkMaster = Annotated[str, typer.Option(
    "--master", help="Spark master: local[*], spark://…, yarn, k8s://…, or stack for the local stack's Spark "
    "cluster (kdg stack up --spark-workers N).")]
SparkIdFrom = Annotated[Optional[str], typer.Option(
    "--id-from", help="Key for records without kdg-id: header:NAME, json:FIELD or offset.")]
ChunkRows = Annotated[int, typer.Option("--chunk-rows", help="Rows per Postgres transaction in a Spark task.")]
SparkConf = Annotated[Optional[list[str]], typer.Option("--conf", help="Spark property key=value (repeatable).")]

# schema'd records through a Schema Registry (kdg.schemas)
ValueFormat = Annotated[Optional[str], typer.Option(
    "--value-format", help="How values are read: json (the default), avro, protobuf or json-schema (Schema Registry "
    "wire format, decoded with the writer's schema), or raw. json: sources read the decoded value; one that cannot "
    "be decoded goes to the dead-letter topic with the reason. Typed sinks (or a mapping's value_format), --id-from "
    "json: and the stdout sink.")]
KeyFormat = Annotated[Optional[str], typer.Option(
    "--key-format", help="How key:FIELD sources read the record key: json (the default), avro, protobuf, "
    "json-schema or raw.")]
SchemaRegistry = Annotated[Optional[str], typer.Option(
    "--schema-registry", envvar="KDG_SCHEMA_REGISTRY", help="Schema Registry URL; without it, schema.registry.url "
    "in the -F profile, else the local stack's registry (kdg stack up --schema-registry). Its login: "
    "basic.auth.user.info in the profile, never printed.")]

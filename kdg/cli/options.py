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

"""`kdg stack up | status | down | fetch | kill | start`: the local cluster."""

from typing import Annotated, Optional

import typer
from rich.table import Table

from kdg.cli.options import Json, StateDir
from kdg.cli.render import console, err_console, flag, print_json
from kdg.errors import CheckFailed, DeliveryError

app = typer.Typer(help="Start, inspect and stop the local Kafka + Postgres stack (no Docker needed).",
                  no_args_is_help=True)


def _layout(state_dir, **overrides):
    from kdg.paths import default_state_dir
    from kdg.stack.cluster import resolve_layout

    return resolve_layout(state_dir or default_state_dir(), **overrides)


def _show(report, as_json: bool) -> None:
    if as_json:
        print_json(report)
    else:
        table = Table(title=f"Kafka {report.kafka_version} — {report.state_dir}", title_justify="left")
        for col in ("node", "port", "pid", "state", "quorum leader"):
            table.add_column(col)
        for b in report.brokers:
            table.add_row(str(b.node_id), str(b.port), str(b.pid or "-"), flag(b.up),
                          "yes" if b.controller else "")
        pg = report.postgres
        table.add_row("postgres", pg.dsn, str(pg.pid or "-"), flag(pg.up), "embedded" if pg.embedded else "external")
        if spark := report.spark:
            table.add_row("spark master", spark.master_url.rsplit(":", 1)[1], str(spark.master_pid or "-"),
                          flag(spark.master_up), f"web UI {spark.web_ui.rsplit(':', 1)[1]}")
            for w in spark.workers:
                table.add_row(f"spark worker {w.worker}", str(w.port), str(w.pid or "-"), flag(w.up), "")
        if registry := report.schema_registry:
            table.add_row("schema registry", str(registry.port), str(registry.pid or "-"), flag(registry.up), "")
        console.print(table)
        console.print(f"bootstrap servers: [key]{report.bootstrap_servers}[/key]"
                      + (" (SASL_SSL)" if report.secure else ""))
        if report.client_properties:
            console.print(f"client profile: [key]{report.client_properties}[/key] (used by default against this stack)")
        if spark:
            console.print(f"spark master: [key]{spark.master_url}[/key] (or `--master stack`)")
        if registry:
            console.print(f"schema registry: [key]{registry.url}[/key] (Confluent-compatible API, schemas in memory)")
    if not report.healthy:
        raise CheckFailed("some part of the stack is down")


@app.command()
def up(
    brokers: Annotated[Optional[int], typer.Option(help="Number of KRaft brokers (1 gives RF 1). [default: 3]")] = None,
    broker_port: Annotated[Optional[int], typer.Option(help="Client port of broker 1. [default: 19092]")] = None,
    pg_port: Annotated[Optional[int], typer.Option(help="Port of the embedded Postgres. [default: 15432]")] = None,
    pg_dsn: Annotated[Optional[str], typer.Option(
        "--pg-dsn", help="Use this PostgreSQL instead of the embedded one (remembered by the stack). Not read "
        "from KDG_PG_DSN: that names the database of data commands, and would silently turn the stack's own "
        "Postgres into an external one. Never printed with its password.")] = None,
    secure: Annotated[bool, typer.Option(
        "--secure", help="SASL_SSL client listener: a CA and broker certificate, SCRAM-SHA-512 users and ACLs; "
        "writes client.properties (mode 0600) into the state dir. Only when the stack is first made.")] = False,
    spark_workers: Annotated[Optional[int], typer.Option(help="Also a Spark standalone master and this many "
                             "workers (1 core, 1 GiB each) on 127.0.0.1; 0 stops them. Default: as before.")] = None,
    schema_registry: Annotated[Optional[bool], typer.Option(
        "--schema-registry/--no-schema-registry", help="Also a Schema Registry with the Confluent API "
        "(Apicurio Registry, schemas in memory) on 127.0.0.1, built with Maven once (~2 min, ~180 MB); "
        "--no-schema-registry stops it. Default: as before.", show_default=False)] = None,
    registry_port: Annotated[Optional[int], typer.Option(
        help="Port of the Schema Registry (implies --schema-registry). [default: 18081]")] = None,
    state_dir: StateDir = None,
    as_json: Json = False,
) -> None:
    """Start the brokers and Postgres (fetching Kafka's jars once); apply the schema. Idempotent."""
    from kdg.stack.cluster import up as run_up

    layout = _layout(state_dir, brokers=brokers, broker_port=broker_port, pg_port=pg_port, pg_dsn=pg_dsn,
                     secure=secure or None, schema_registry=schema_registry, registry_port=registry_port)
    parts = " and Postgres" if layout.registry_port is None else ", Postgres and the Schema Registry"
    with err_console.status(f"starting {layout.brokers} broker(s){parts} ..."):
        report = run_up(layout, echo=err_console.print, spark_workers=spark_workers)
    _show(report, as_json)


@app.command()
def status(state_dir: StateDir = None, as_json: Json = False) -> None:
    """Show each broker, the controller quorum's leader, Postgres, any Spark cluster and Schema Registry; exit 7 if
    anything is down."""
    from kdg.stack.cluster import status as run_status

    _show(run_status(_layout(state_dir)), as_json)


@app.command()
def down(
    purge: Annotated[bool, typer.Option(help="Also delete the stack's data.")] = False,
    state_dir: StateDir = None,
    as_json: Json = False,
) -> None:
    """Stop exactly the processes `up` started (by their recorded pids)."""
    from kdg.stack.cluster import down as run_down

    stopped = run_down(_layout(state_dir), purge=purge)
    if as_json:
        print_json(stopped)
    else:
        console.print(f"stopped brokers {stopped['brokers'] or 'none'}; "
                      f"postgres {'stopped' if stopped['postgres'] else 'was not running'}"
                      + (f"; spark {', '.join(stopped['spark'])}" if stopped.get("spark") else "")
                      + ("; schema registry stopped" if stopped.get("schema_registry") else "")
                      + ("; data deleted" if purge else ""))


@app.command()
def fetch(
    schema_registry: Annotated[bool, typer.Option(
        "--schema-registry", help="Also build the Schema Registry `up --schema-registry` runs (~2 min, ~180 MB "
        "from Maven Central).")] = False,
) -> None:
    """Download the pinned Kafka jars and Spark's Kafka connector into the cache (done on first use otherwise), and
    make Spark's class archive, with which a Spark command's JVM starts faster (made here only)."""
    from kdg.spark import classes
    from kdg.spark.jars import spark_jars, spark_lib_dir
    from kdg.stack.jars import ensure_kafka_jars, require_java

    require_java()
    console.print(f"Kafka jars in {ensure_kafka_jars(err_console.print)}")
    if schema_registry:
        from kdg.stack.registry import ensure_built

        console.print(f"Schema Registry in {ensure_built(err_console.print)}")
    spark_jars(err_console.print)
    console.print(f"Spark connector jars in {spark_lib_dir()}")
    try:
        console.print(f"Spark class archive in {classes.build(err_console.print)}")
    except DeliveryError as exc:  # an archive only makes Spark start sooner
        err_console.print(f"warning: {exc}; Spark commands start without it")


@app.command()
def kill(
    node: Annotated[int, typer.Argument(help="Broker node id.")],
    clean: Annotated[bool, typer.Option(help="SIGTERM (clean shutdown) instead of SIGKILL.")] = False,
    state_dir: StateDir = None,
) -> None:
    """Stop one broker (SIGKILL by default) — a fault for experiments; `kdg stack up` brings it back."""
    from kdg.stack.cluster import kill_node

    layout = _layout(state_dir)
    stopped = kill_node(layout, node, hard=not clean)
    console.print(f"broker {node}: {'stopped' if stopped else 'was not running'}")

"""`kdg mapping check FILE`: validate a typed sink's mapping file against its live table; `kdg mapping
from-schema SUBJECT`: derive one from a Schema Registry subject's latest schema."""

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from kdg.cli.options import Json, PgDsn, Profile, Properties, SchemaRegistry
from kdg.cli.render import console, print_json

app = typer.Typer(help="Typed sinks: check a mapping file (record fields → your table's columns), or derive one "
                  "from a Schema Registry subject.",
                  no_args_is_help=True)


@app.command()
def check(
    file: Annotated[Path, typer.Argument(help="The TOML mapping file.")],
    offline: Annotated[bool, typer.Option("--offline", help="Only parse the file; do not look at the table.")] = False,
    pg_dsn: PgDsn = None, as_json: Json = False,
) -> None:
    """Parse the mapping and check it against the table (columns, types, keys); writes nothing. Exit 2 if bad."""
    from kdg.mapping.check import run_mapping_check
    from kdg.settings import connection

    report = run_mapping_check(file, None if offline else connection(pg_dsn=pg_dsn).pg_dsn)
    if as_json:
        print_json(report)
        return
    table = Table(title=f"{report.file} → {report.table} ({report.mode}, table {report.table_state})",
                  title_justify="left")
    for col in ("column", "type", "from", "in the table"):
        table.add_column(col)
    for c in report.columns:
        table.add_row(c["name"], c["type"] or "(the table’s)", c["from"], c["table_type"] or "-")
    console.print(table)
    key = f"key ({', '.join(report.key)})" if report.key else "no key columns"
    envelope = f"; a {report.envelope} change stream (json: reads after)" if report.envelope != "none" else ""
    console.print(f"[ok]ok[/ok]: {key}; tombstones: {report.on_tombstone}{envelope}")


@app.command("from-schema")
def from_schema(
    subject: Annotated[str, typer.Argument(help="The subject, e.g. orders-value (its latest version).")],
    table: Annotated[Optional[str], typer.Option("--table", help="The table [default: the subject without "
                     "-value].")] = None,
    key: Annotated[Optional[list[str]], typer.Option("--key", help="A key column (repeatable): the mapping "
                   "upserts on it, and --create-table makes it the primary key.")] = None,
    out: Annotated[Optional[Path], typer.Option("-o", "--output", help="Write the TOML here, not to stdout.")] = None,
    schema_registry: SchemaRegistry = None, props: Properties = None, profile: Profile = None, as_json: Json = False,
) -> None:
    """Print a mapping (TOML, for --mapping) whose columns are the schema's top-level fields, typed for Postgres."""
    import json

    from kdg.schemas.derive import derive_mapping, detect_format, to_toml
    from kdg.schemas.registry import Registry
    from kdg.settings import connection, table_name

    conn = connection(properties=props, profile=profile, schema_registry=schema_registry)
    schema_id, text, schema_type, version = Registry(conn.registry).latest(subject)
    fmt = detect_format(text, schema_type)
    name = table or subject.removesuffix("-value").lower().replace("-", "_").replace(".", "_")
    doc = derive_mapping(text, fmt, table_name(name).text, tuple(key or ()))
    if as_json:
        print(json.dumps({"subject": subject, "version": version, "schema_id": schema_id, "mapping": doc}))
        return
    toml = f"# kdg mapping from-schema {subject}: version {version}, schema id {schema_id} ({fmt})\n" + to_toml(doc)
    if out is None:
        print(toml, end="")
        return
    out.write_text(toml, encoding="utf-8")
    console.print(f"wrote {out}: {len(doc['columns'])} columns of {subject} version {version} → {doc['table']}")

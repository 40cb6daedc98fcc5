"""`kdg mapping check FILE`: validate a typed sink's mapping file against its live table."""

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kdg.cli.options import Json, PgDsn
from kdg.cli.render import console, print_json

app = typer.Typer(help="Typed sinks: check a mapping file (record fields → your table's columns).",
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

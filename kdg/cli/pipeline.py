"""`kdg pipeline check FILE`: a pipeline file's routes checked, offline or against the cluster and its tables."""

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from kdg.cli.options import Bootstrap, Json, PgDsn, Profile, Properties, SchemaRegistry
from kdg.cli.render import console, err_console, print_json

app = typer.Typer(help="Pipeline files (--pipeline FILE): check which topics each route takes and which table each "
                  "writes.", no_args_is_help=True)


@app.command()
def check(
    file: Annotated[Path, typer.Argument(help="The TOML pipeline file ([[route]] entries).")],
    offline: Annotated[bool, typer.Option("--offline", help="Only read the file (keys, templates, mappings, the "
                       "topics it lists); do not look at Kafka or Postgres.")] = False,
    bootstrap: Bootstrap = None, pg_dsn: PgDsn = None, schema_registry: SchemaRegistry = None,
    props: Properties = None, profile: Profile = None, as_json: Json = False,
) -> None:
    """Check a pipeline file's routes: the topics each takes, the table each resolves to and whether it matches;
    for a route with columns = "from-schema", what evolution would do to its table for the newest record's schema.
    Writes and alters nothing. Exit 2 for a bad file, a topic two routes take, a table a template cannot name, or
    a schema change that would stop a route."""
    from kdg.errors import UsageError
    from kdg.flow.check import FROM_EVENTS, run_pipeline_check
    from kdg.settings import connection

    conn = None if offline else connection(bootstrap, pg_dsn, props, profile=profile, schema_registry=schema_registry)
    report = run_pipeline_check(file, conn)
    if as_json:
        print_json(report)
    else:
        where = "offline: the file alone" if report.offline else f"{report.cluster_topics} topics in the cluster"
        console.print(Text(f"pipeline {report.file} ({where})"), soft_wrap=True)
        for route in report.routes:
            console.print(Text(f"route {route.name}: {', '.join(route.takes)} → {route.table}"
                               + (" (typed)" if route.typed else "")), soft_wrap=True)
            for t in route.topics:
                if t.problem is not None:
                    console.print(Text(f"  {t.topic}: refused, {t.problem}", style="bad"), soft_wrap=True)
                else:
                    console.print(Text(f"  {t.topic} → {t.table or FROM_EVENTS}"
                                       + ("" if report.offline else f" (table {t.table_state})")), soft_wrap=True)
                for line in (t.evolution or {}).get("lines", ()):  # columns from the schema: evolution, previewed
                    style = "bad" if line.startswith("incompatible") else "dim" if line == "up to date" else None
                    console.print(Text(f"    {line}", style=style or ""), soft_wrap=True)
            for note in route.notes:
                console.print(Text(f"  {note}", style="dim"), soft_wrap=True)
        if report.ok:
            console.print(f"[ok]ok[/ok]: {len(report.routes)} route{'s' if len(report.routes) != 1 else ''}, no "
                          "topic taken twice, every table named" + ("" if report.offline else " and checked"))
    for problem in report.problems[:-1]:  # each refused topic or table on its own line; the last is the exit's
        err_console.print("[bad]error:[/bad]", Text(problem), soft_wrap=True)
    if report.problems:
        raise UsageError(report.problems[-1])

"""`kdg mapping check FILE`: validate a typed sink's mapping file against its live table; `kdg mapping
from-schema SUBJECT`: derive one from a Schema Registry subject's latest schema."""

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from kdg.cli.options import Bootstrap, Json, PgDsn, Profile, Properties, SchemaRegistry
from kdg.cli.render import console, err_console, plain, print_json

app = typer.Typer(help="Typed sinks: check a mapping file (record fields → your table's columns), or derive one "
                  "from a Schema Registry subject.",
                  no_args_is_help=True)


@app.command()
def check(
    file: Annotated[Path, typer.Argument(help="The TOML mapping file.")],
    offline: Annotated[bool, typer.Option("--offline", help="Only parse the file; do not look at the table.")] = False,
    sample: Annotated[int, typer.Option("--sample", help="Also read this many of --topic's latest records and report "
                      "mapped fields none of them has (exit 7) and fields no column maps.")] = 0,
    topic: Annotated[Optional[str], typer.Option("--topic", help="The topic --sample reads.")] = None,
    pg_dsn: PgDsn = None, bootstrap: Bootstrap = None, schema_registry: SchemaRegistry = None,
    props: Properties = None, profile: Profile = None, as_json: Json = False,
) -> None:
    """Parse the mapping and check it against the table (columns, types, keys), and with --sample against the
    data; writes nothing. Exit 2 if the mapping is bad, 7 if the data has none of a mapped field."""
    from kdg.errors import CheckFailed, UsageError
    from kdg.mapping.check import run_mapping_check
    from kdg.settings import connection

    if sample < 0 or (sample and not topic) or (topic and not sample):
        raise UsageError("--sample N and --topic TOPIC go together (N at least 1): the records to check the mapping "
                         "against")
    conn = connection(bootstrap, pg_dsn, props, profile=profile, schema_registry=schema_registry)
    report = run_mapping_check(file, None if offline else conn.pg_dsn, sample=sample, topic=topic, conn=conn)
    if as_json:
        print_json(report)
        _sample_verdict(report, CheckFailed)
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
    verdict = "[ok]ok[/ok]" if report.ok else "the mapping and its table are ok, the data is not"
    console.print(f"{verdict}: {key}; tombstones: {report.on_tombstone}{envelope}")
    if report.sample is not None:
        found = report.sample
        console.print(plain(f"sample: {found['records']:,} latest records of {found['topic']}"
                            + (f" ({found['unreadable']:,} could not be read)" if found["unreadable"] else "")))
        for absent in found["absent"]:
            console.print(plain(f"  absent: {absent['from']} reads field {absent['field']!r}, which none of them "
                                "has (it would write NULL)"))
        if found["unmapped"]:
            console.print(plain(f"  unmapped: {', '.join(found['unmapped'])} (in the records, mapped to no column)"))
        if not found["absent"] and not found["unmapped"]:
            console.print("  every mapped field is in the records, and every field is mapped")
    _sample_verdict(report, CheckFailed)


def _sample_verdict(report, error) -> None:
    if not report.ok:
        fields = ", ".join(repr(a["field"]) for a in report.sample["absent"])
        raise error(f"the mapping reads {fields}, which none of {report.sample['records']:,} records of "
                    f"{report.sample['topic']} has")


@app.command("from-schema")
def from_schema(
    subject: Annotated[str, typer.Argument(help="The subject, e.g. orders-value (its latest version).")],
    table: Annotated[Optional[str], typer.Option("--table", help="The table [default: the subject without "
                     "-value].")] = None,
    key: Annotated[Optional[list[str]], typer.Option("--key", help="A key column (repeatable): the mapping "
                   "upserts on it, and --create-table makes it the primary key.")] = None,
    out: Annotated[Optional[Path], typer.Option("-o", "--output", help="Write the TOML here, not to stdout.")] = None,
    preview: Annotated[bool, typer.Option("--preview", help="Also show what evolution (evolve = \"add-columns\") "
                       "would do to the live table (--table, in --pg-dsn) for this schema; alters nothing.")] = False,
    pg_dsn: PgDsn = None, schema_registry: SchemaRegistry = None, props: Properties = None, profile: Profile = None,
    as_json: Json = False,
) -> None:
    """Print a mapping (TOML, for --mapping) whose columns are the schema's top-level fields, typed for Postgres;
    with --preview, what evolution would do to the table as it is now (on stderr, the TOML staying on stdout)."""
    import json
    from dataclasses import asdict

    from kdg.schemas.derive import derive_mapping, detect_format, to_toml
    from kdg.schemas.registry import Registry
    from kdg.settings import connection, table_name

    conn = connection(pg_dsn=pg_dsn, properties=props, profile=profile, schema_registry=schema_registry)
    schema_id, text, schema_type, version = Registry(conn.registry).latest(subject)
    fmt = detect_format(text, schema_type)
    name = table or subject.removesuffix("-value").lower().replace("-", "_").replace(".", "_")
    doc = derive_mapping(text, fmt, table_name(name).text, tuple(key or ()))
    evolution = None
    if preview:
        from kdg.mapping.preview import preview_subject

        evolution = preview_subject(conn.pg_dsn, doc, text, fmt)
    if as_json:
        print(json.dumps({"subject": subject, "version": version, "schema_id": schema_id, "mapping": doc}
                         | ({"evolution": asdict(evolution)} if evolution is not None else {})))
        return
    toml = f"# kdg mapping from-schema {subject}: version {version}, schema id {schema_id} ({fmt})\n" + to_toml(doc)
    if out is None:
        print(toml, end="")
    else:
        out.write_text(toml, encoding="utf-8")
        console.print(f"wrote {out}: {len(doc['columns'])} columns of {subject} version {version} → {doc['table']}")
    if evolution is not None:
        said = err_console if out is None else console
        said.print(plain(f"evolution of {evolution.table} (table {evolution.state}), nothing altered:"))
        for line in evolution.lines:
            said.print(plain(f"  {line}"))

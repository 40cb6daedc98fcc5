"""`kdg db migrate | status`: the kdg schema in any PostgreSQL database."""

import typer
from rich.table import Table

from kdg.cli.options import Json, PgDsn
from kdg.cli.render import console, flag, print_json
from kdg.errors import CheckFailed

app = typer.Typer(help="Apply or inspect the kdg schema in a PostgreSQL database.", no_args_is_help=True)


def _dsn(pg_dsn: str | None) -> str:
    from kdg.settings import connection

    return connection(pg_dsn=pg_dsn).pg_dsn


@app.command()
def migrate(pg_dsn: PgDsn = None, as_json: Json = False) -> None:
    """Apply every pending migration, in order, under an advisory lock. Idempotent."""
    from kdg.store.migrations import apply_migrations

    report = apply_migrations(_dsn(pg_dsn))
    if as_json:
        print_json(report)
    elif report.applied:
        console.print(f"applied {', '.join(report.applied)} to [key]{report.dsn}[/key]")
    else:
        console.print(f"nothing to apply: [key]{report.dsn}[/key] has all {len(report.already_applied)} migrations")


@app.command()
def status(pg_dsn: PgDsn = None, as_json: Json = False) -> None:
    """List each migration kdg ships, applied (and when) or pending; exit 7 if any is pending."""
    from kdg.store.migrations import schema_status

    report = schema_status(_dsn(pg_dsn))
    if as_json:
        print_json(report)
    else:
        table = Table(title=f"kdg schema — {report.dsn}", title_justify="left")
        for col in ("migration", "state", "applied at"):
            table.add_column(col)
        for m in report.migrations:
            table.add_row(m.version, flag(m.is_applied, "applied", "pending"),
                          f"{m.applied_at:%Y-%m-%d %H:%M:%S %Z}" if m.applied_at else "-")
        console.print(table)
    if report.pending:
        raise CheckFailed(f"pending: {', '.join(report.pending)}; run: kdg db migrate --pg-dsn '{report.dsn}'")

"""`kdg db migrate | status | maintain | forget`: the kdg schema in any PostgreSQL database, and its state."""

from typing import Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from kdg.cli.options import Json, PgDsn
from kdg.cli.render import console, err_console, flag, print_json
from kdg.errors import CheckFailed, UsageError

app = typer.Typer(help="Apply or inspect the kdg schema in a PostgreSQL database.", no_args_is_help=True)


def _dsn(pg_dsn: str | None) -> str:
    from kdg.settings import connection

    return connection(pg_dsn=pg_dsn).pg_dsn


@app.command()
def migrate(pg_dsn: PgDsn = None, as_json: Json = False,
            second_copy: Annotated[bool, typer.Option(
                "--second-copy", help="Make kdg's tables in this DSN's search_path even though another schema of "
                "the database holds them (two copies keep two sets of claims: never let both write one table).")]
            = False) -> None:
    """Apply every pending migration, in order, under an advisory lock. Idempotent."""
    from kdg.store.migrations import apply_migrations

    report = apply_migrations(_dsn(pg_dsn), second_copy)
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
        table = Table(title=Text(f"kdg schema — {report.dsn}"), title_justify="left")
        for col in ("migration", "state", "applied at"):
            table.add_column(col)
        for m in report.migrations:
            table.add_row(m.version, flag(m.is_applied, "applied", "pending"),
                          f"{m.applied_at:%Y-%m-%d %H:%M:%S %Z}" if m.applied_at else "-")
        console.print(table)
    if report.pending:
        raise CheckFailed(f"pending: {', '.join(report.pending)}; run: kdg db migrate --pg-dsn '{report.dsn}'")


@app.command()
def maintain(
    table: Annotated[Optional[str], typer.Option(help="With --dedup-retention: the sink table whose claim window "
                     "changes.")] = None,
    dedup_retention: Annotated[Optional[str], typer.Option(help="Keep --table's exactly-once claims this long "
                               "(30d, 36h, 10s, forever), for every writer.")] = None,
    ledger_retention: Annotated[Optional[str], typer.Option(help="Keep producer ledger rows this long (30d, "
                                "forever).")] = None,
    pg_dsn: PgDsn = None, as_json: Json = False,
) -> None:
    """Drop expired claim and ledger partitions (whole, never row by row), make the next ones; set retention."""
    from kdg.maintenance import run_maintenance
    from kdg.retention import show

    if (table is None) != (dedup_retention is None):
        raise UsageError("--table and --dedup-retention go together: the table whose claims are kept that long")
    report = run_maintenance(_dsn(pg_dsn), table=table, dedup_retention=dedup_retention,
                             ledger_retention=ledger_retention)
    if as_json:
        print_json(report)
        return
    for change in report.changed:
        console.print(change)
    for note in (note for m in report.windows for note in m.healed):
        err_console.print(f"warning: {note}", style="warn", markup=False, highlight=False)
    shown = Table(title=Text(f"kdg state windows — {report.dsn}"), title_justify="left")
    for col in ("claims of / ledger", "kept for", "partitions", "dropped now", "forgotten before (UTC)", "size"):
        shown.add_column(col)
    for m in report.windows:
        kept_for = show(m.retention_ms) if m.width_ms else "-"  # "-": a claim table dropped outside kdg, forgotten
        shown.add_row(Text(m.sink_table or "producer ledger"), kept_for, str(m.kept), str(m.dropped),
                      _utc(m.horizon_ms), f"{m.bytes / 1e6:.1f} MB", style="warn" if m.skipped else None)
        if m.skipped:
            shown.add_row(Text(f"  skipped: {m.skipped}"), "", "", "", "", "")
    console.print(shown)


@app.command()
def forget(
    table: Annotated[str, typer.Option(help="The sink table whose exactly-once claims are deleted (it may be "
                                       "dropped already).", show_default=False)],
    group: Annotated[Optional[str], typer.Option("--group", "-G", help="Also delete this group's stored positions "
                     "(kdg_offsets) in the claims' topics: it reads them from the beginning next time.")] = None,
    topic: Annotated[Optional[list[str]], typer.Option(help="With --group: the topics whose positions are deleted "
                     "(repeatable; default: the topics the claims came from).")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation (needed without a "
                                      "terminal).")] = False,
    pg_dsn: PgDsn = None, as_json: Json = False,
) -> None:
    """Delete a table's exactly-once claims (to fill it again from records read before), and with --group, the
    group's stored positions. Asks first, unless --yes."""
    import sys

    from kdg.store.forget import forget_claims

    if topic and group is None:
        raise UsageError("--topic says which topics' positions --group deletes: give --group too")
    if not yes and not sys.stdin.isatty():
        raise UsageError("kdg db forget deletes claims for good: pass --yes to do it without a terminal to ask on")
    report = forget_claims(_dsn(pg_dsn), table, group=group, topics=topic or None,
                           confirm=None if yes else _ask)
    if as_json:
        print_json(report)
    else:
        console.print(_removal(report), markup=False, highlight=False)


def _removal(report) -> str:
    """What ``kdg db forget`` removes (or removed), in words."""
    verb = "forgot" if report.done else "will forget"
    said = f"{verb} {report.claims} exactly-once claims of {report.table}"
    if report.topics:
        said += f" (records of {', '.join(report.topics)})"
    if report.group is not None:
        said += (f"; {'removed' if report.done else 'will remove'} {report.offsets} stored positions of group "
                 f"{report.group!r}: it reads those topics from the beginning next time")
    return said


def _ask(report) -> bool:
    err_console.print(_removal(report) + ". A record read again into the table is then written again.",
                      markup=False, highlight=False)
    return typer.confirm("Forget them?", default=False, err=True)


def _utc(ms: int | None) -> str:
    from datetime import datetime, timezone

    return "-" if ms is None else f"{datetime.fromtimestamp(ms / 1000, timezone.utc):%Y-%m-%d %H:%M:%S.%f}"[:-3]

"""The `kdg` command line: options in, one library call, a report out.

Heavy libraries (confluent_kafka, asyncpg, pyspark) are imported inside commands only, so that
`kdg --help` stays fast.
"""

import sys

import typer

from kdg.cli import chaos, stack
from kdg.errors import KdgError

app = typer.Typer(
    name="kdg",
    help="Move data through Apache Kafka under a chosen delivery guarantee — and prove it held.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(stack.app, name="stack")
app.add_typer(chaos.app, name="chaos")


def _register() -> None:
    from kdg.cli import commands  # noqa: F401  (registers the top-level commands on `app`)


def main() -> None:
    """Entry point: run the app, turning kdg's own errors into a message and an exit code."""
    from rich.text import Text

    from kdg.cli.render import err_console

    _register()
    command = typer.main.get_command(app)
    try:
        command.main(prog_name="kdg")
    except KdgError as exc:
        err_console.print("[bad]error:[/bad]", Text(str(exc)), soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err_console.print("[warn]interrupted[/warn]")
        sys.exit(130)

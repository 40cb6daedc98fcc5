"""The `kdg` command line: options in, one library call, a report out.

Heavy libraries (confluent_kafka, asyncpg, pyspark) are imported inside commands only, so that
`kdg --help` stays fast.
"""

import gc
import os
import signal
import sys
import threading
from typing import Annotated


def _stop_at_once(signum, frame) -> None:
    os._exit(128 + signum)


# From the program's start until its command runs, a stop signal ends it at once (130, 143): nothing has
# started that needs finishing, and a KeyboardInterrupt raised inside an import would end it with a
# traceback and exit 1. Only when kdg is the program (`kdg`, `python -m kdg`), never for an importer.
_AS_PROGRAM = os.path.basename(sys.argv[0] if sys.argv else "") in ("kdg", "__main__.py")
if _AS_PROGRAM and threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGINT, _stop_at_once)
    signal.signal(signal.SIGTERM, _stop_at_once)
if _AS_PROGRAM:
    from kdg.lifecycle import die_with_parent

    die_with_parent()

import typer  # noqa: E402  (after the handlers: importing it is most of the start-up)

from kdg.cli import chaos, db, mapping, pipeline, stack
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
app.add_typer(db.app, name="db")
app.add_typer(mapping.app, name="mapping")
app.add_typer(pipeline.app, name="pipeline")


def _register() -> None:
    from kdg.cli import commands  # noqa: F401  (registers the top-level commands on `app`)


@app.callback()
def _options(verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", envvar="KDG_VERBOSE", help="Show every line librdkafka logs (default: warnings, "
        "one line each, repeats collapsed).")] = False) -> None:
    from kdg import faults
    from kdg.kafka.logs import configure

    configure(verbose)
    faults.check()


def main() -> None:
    """Entry point: run the app, turning errors into one line and an exit code.

    kdg's own errors print their message; anything unforeseen prints its type and message and
    exits 1 (``KDG_DEBUG=1`` lets its traceback through instead).
    """
    _register()
    code = _run(typer.main.get_command(app))
    if _AS_PROGRAM and threading.current_thread() is threading.main_thread():
        def exit_now(signum, frame):  # the command is over: a stop signal now only cuts the clean-up short
            os._exit(code if isinstance(code, int) else 1)

        signal.signal(signal.SIGINT, exit_now)
        signal.signal(signal.SIGTERM, exit_now)
    # A Kafka client caught in a cycle (a consumer's rebalance callbacks close over it; a producer's hold it
    # only weakly, kdg.kafka.clients.weakly) is freed by no reference count. The interpreter's last collection
    # would, after faulthandler and much else is gone, while librdkafka's threads still call back into Python:
    # 1 exit in 80 ended in SIGSEGV after the right error line. Collected here, clients go while Python works.
    gc.collect()
    sys.exit(code)


def _run(command) -> int | str | None:
    """Run ``command``; return the exit code it asked for, or the one its error stands for (printed here)."""
    from rich.text import Text

    from kdg.cli.render import err_console

    try:
        if _AS_PROGRAM and threading.current_thread() is threading.main_thread():
            # inside the try: a Ctrl-C that arrived a moment before is raised by the first line of Python after
            # this one (the enum signal.signal returns), and must meet the except below
            signal.signal(signal.SIGINT, signal.default_int_handler)  # commands: Ctrl-C, or their own Shutdown
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        command.main(prog_name="kdg")
    except SystemExit as exc:  # click's and typer's own ends: --help, a usage error, a command's typer.Exit
        return exc.code
    except KdgError as exc:
        err_console.print("[bad]error:[/bad]", Text(_one_line(str(exc))), soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        err_console.print("[warn]interrupted[/warn]")
        return 130
    except Exception as exc:  # noqa: BLE001 — the edge: one line unless asked for the traceback
        if os.environ.get("KDG_DEBUG") == "1":
            raise
        err_console.print("[bad]error:[/bad]", Text(f"unexpected {type(exc).__name__}: {_one_line(str(exc))} "
                                                    "(rerun with KDG_DEBUG=1 for the traceback)"), soft_wrap=True)
        return 1
    finally:
        _forget_caught_interrupts()
    return 0


def _forget_caught_interrupts() -> None:
    """Keep `python -m kdg`'s exit code the one kdg chose (130 after a Ctrl-C), not a death by SIGINT (-2).

    CPython marks a KeyboardInterrupt that ends any string exec or eval as unhandled, even once it is caught
    (a Ctrl-C that lands while an import builds a dataclass or a namedtuple), and under ``-m`` turns the
    exit into a death by SIGINT after finalisation: 4 of 240 start-ups interrupted at a random moment in
    their first 4 s. Every string eval clears that mark as it starts, so one that ends normally, last, clears it.
    """
    exec("None", {})  # noqa: S102 — a constant string, run for its effect on the interpreter's flag


def _one_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " — ".join(lines[:1] + lines[1:3]) if len(lines) > 1 else (lines[0] if lines else "")

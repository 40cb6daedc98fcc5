"""`kdg chaos run | scenario`: real faults on the local cluster, and whether each guarantee held."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from kdg.cli.options import Json, StateDir
from kdg.cli.render import console, err_console, print_json
from kdg.errors import CheckFailed
from kdg.lifecycle import Shutdown

# A stop signal ends the cell in progress at its next step: the longest wait between two is a fault's own
# (a paused member held for 15 s; two brokers restarted), then the stack is made whole and the cell deleted.
CHAOS_STOP_S = 120.0

app = typer.Typer(help="Inject real faults and show each guarantee hold or break.", no_args_is_help=True)


def _layout(state_dir, why: str = "chaos kills its processes"):
    from kdg.paths import default_state_dir
    from kdg.stack.cluster import resolve_layout, status

    layout = resolve_layout(state_dir or default_state_dir())
    if not status(layout, with_quorum=False).healthy:
        raise CheckFailed(f"the local stack is not fully up: run `kdg stack up` first ({why})")
    return layout


@app.command()
def run(
    guarantee: Annotated[str, typer.Option("--guarantee", "-g", help="all, or one or more guarantees, comma-separated.")] = "all",
    faults: Annotated[str, typer.Option(help="all, or a comma-separated list of: consumer-kill, consumer-pause, "
                                             "broker-kill, broker-bounce, ack-loss, postgres-restart, min-isr, and "
                                             "the spark-* faults of --engine spark.")] = "all",
    messages: Annotated[int, typer.Option(help="Records produced per cell.")] = 2000,
    repeat: Annotated[int, typer.Option(help="Repetitions per cell.")] = 1,
    topics: Annotated[int, typer.Option(help="Topics per cell (--messages each), read by one `kdg consume` per member: "
                                             "into one table per topic, so a batch's transaction spans tables (or "
                                             "kafka:{topic}-out), each audited; kdg consume's faults only.")] = 1,
    sink: Annotated[str, typer.Option(help="postgres or kafka.")] = "postgres",
    engine: Annotated[str, typer.Option(help="The pipeline `--faults all` runs through: consume (kdg consume's "
                                             "faults), spark (kdg spark-stream's: spark-driver-kill, "
                                             "spark-executor-kill, spark-broker-kill, spark-postgres-restart; "
                                             "at-most-once has no cells there), or both, side by side.")] = "consume",
    report: Annotated[Optional[Path], typer.Option(help="Write index.html, PNG charts and results.json here.")] = None,
    keep: Annotated[bool, typer.Option(help="Keep every cell's topics and Postgres rows to inspect them. Without "
                                            "it they are deleted once the cell is audited, except a failed "
                                            "cell's.")] = False,
    state_dir: StateDir = None,
    as_json: Json = False,
) -> None:
    """Each guarantee × fault: produce, consume through the fault, audit; PASS/FAIL by the outcome rules."""
    from kdg.chaos.run import parse_faults, parse_guarantees, run_chaos

    layout = _layout(state_dir)

    def show(results):
        cell = results["cells"][-1]
        if report is not None:  # kept on disk as it grows: an interrupted long run keeps what it measured
            from kdg.chaos.report import write_results

            write_results(results, report)
        if not as_json:
            style = "ok" if cell["verdict"] == "PASS" else "bad"
            err_console.print(f"[{style}]{cell['verdict']}[/{style}] {cell['guarantee']} × {cell['fault']} "
                              f"#{cell['repetition']}: {cell['note']}")

    guarantees, fault_list = parse_guarantees(guarantee), parse_faults(faults, engine)
    with Shutdown(timeout=CHAOS_STOP_S).on_signals() as shutdown:
        results = run_chaos(layout, guarantees=guarantees, faults=fault_list, messages=messages, repeat=repeat,
                            sink=sink, on_cell=show, keep=keep, shutdown=shutdown, topics=topics)
    if results.get("stopped_by"):
        left = "kept (--keep)" if keep else "deleted"
        err_console.print(f"stopped by {results['stopped_by']} after {len(results['cells'])} cell(s): the cell in "
                          f"progress was not audited, its processes were killed and its topics and rows {left}")
    _publish(results, report, as_json)


def _publish(results: dict, report: Optional[Path], as_json: bool, *, raw: bool = True) -> None:
    """Summary, report files (results.json too when ``raw``), table or JSON; exit 7 when a cell broke its guarantee."""
    from kdg.chaos.report import summarize, summary_table, write_report

    results["summary"] = summarize(results)
    if report is not None:
        results["report"] = str(write_report(results, report, raw=raw))
    if as_json:
        print_json(results)
    else:
        console.print(summary_table(results))
        if report is not None:
            console.print(f"report: {results['report']}")
    failed = [c for c in results["cells"] if c["verdict"] != "PASS"]
    if failed:
        raise CheckFailed(f"{len(failed)} cell(s) broke their guarantee")


@app.command()
def clean(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the cells left behind; delete nothing.")] = False,
    state_dir: StateDir = None,
    as_json: Json = False,
) -> None:
    """Delete the topics and Postgres rows that chaos cells left behind: kept (--keep) and failed cells, and the
    cell a killed run was in. A cell whose group still has members is left alone; run it with no chaos run going."""
    from dataclasses import asdict

    from kdg.chaos.clean import clean as clean_cells

    layout = _layout(state_dir, "the cells' topics and rows are deleted there")
    found = clean_cells(layout, layout.admin_properties(), dry_run=dry_run)
    if as_json:
        print_json({"dry_run": dry_run, "cells": [asdict(c) for c in found]})
        return
    if not found:
        console.print("no chaos cells left behind")
        return
    from rich.table import Table

    shown = Table(title="chaos cells left behind", title_justify="left")
    for col in ("input topic", "topics in Kafka", "done"):
        shown.add_column(col)
    for c in found:
        done = c.in_use or ("deleted" if c.deleted else "would delete")
        shown.add_row(c.topic, str(len(c.topics)), done, style="warn" if c.in_use else None)
    console.print(shown)


@app.command("report")
def report_(
    results_file: Annotated[Path, typer.Argument(help="A results.json written by `kdg chaos run --report DIR`.")],
    out: Annotated[Optional[Path], typer.Option(help="Write the page and charts here (default: the file's folder).")] = None,
    as_json: Json = False,
) -> None:
    """Render the page, charts and table again from a results.json — also one an interrupted run kept.

    The results file itself is only read: nothing is written over it or over any other results.json.
    """
    from kdg.chaos.report import load_results

    _publish(load_results(results_file), out or results_file.parent, as_json, raw=False)


@app.command()
def scenario(
    name: Annotated[Optional[str], typer.Argument(help="The scenario to replay (see --list).")] = None,
    list_: Annotated[bool, typer.Option("--list", help="Name the scenarios.")] = False,
    state_dir: StateDir = None,
    as_json: Json = False,
) -> None:
    """Replay a failure story of the seed documents step by step on the real cluster."""
    from kdg.chaos.scenarios import SCENARIOS, run_scenario

    if list_ or name is None:
        for key, sc in SCENARIOS.items():
            console.print(f"[key]{key}[/key]  {sc.title}")
        return
    layout = _layout(state_dir)
    result = run_scenario(layout, name, echo=None if as_json else console.print)
    if as_json:
        print_json(result)
    if not result["as_expected"]:
        raise CheckFailed(f"scenario {name} did not end as expected: {result['ending']}")


@app.command()
def soak(
    minutes: Annotated[float, typer.Option(help="How long the load and the nemesis run.")] = 60.0,
    rate: Annotated[float, typer.Option(help="Records per second the producer sends.")] = 200.0,
    seed: Annotated[int, typer.Option(help="Seed of the nemesis's schedule and targets.")] = 1,
    dedup_retention: Annotated[Optional[str], typer.Option(
        help="The typed table's claim window (default: 30s for a soak of 5 minutes or less, else 2m).")] = None,
    ledger_retention: Annotated[Optional[str], typer.Option(
        help="The producer ledger's window during the soak, restored after (default: 3 audit slices).")] = None,
    report: Annotated[Optional[Path], typer.Option(
        help="Write index.html, timeline.png, results.json and the processes' logs here.")] = None,
    state_dir: StateDir = None,
    as_json: Json = False,
) -> None:
    """Real processes under a steady load and a random nemesis: nothing lost, nothing duplicated, nothing leaks.

    Exit 7 when a check fails (the report is written either way).
    """
    from kdg.chaos.soak import SoakConfig, run_soak
    from kdg.chaos.soak_report import summary_table, write_report

    config = SoakConfig(minutes, rate, seed, dedup_retention, ledger_retention).resolved()
    layout = _layout(state_dir)
    results = run_soak(layout, config, logs=report / "logs" if report is not None else None)
    if report is not None:
        results["report"] = str(write_report(results, report))
    if as_json:
        print_json(results)
    else:
        console.print(summary_table(results))
        console.print(f"report: {results['report']}" if report is not None else f"logs: {results['logs']}")
    if not results["checks"]["passed"]:
        raise CheckFailed(f"the soak failed: {', '.join(results['checks']['failed'])}")

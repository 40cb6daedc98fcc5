"""`kdg chaos run`: every guarantee × fault, audited, judged by the outcome rules."""

import threading
import time
from dataclasses import asdict
from datetime import datetime, timezone
from typing import Callable

from kdg.audit import run_audit
from kdg.chaos.cell import Cell, CellResult
from kdg.chaos.injectors import INJECTORS, SPARK_INJECTORS
from kdg.errors import KdgError, UsageError
from kdg.guarantees import CommitMode, Guarantee, policy_for
from kdg.lifecycle import Shutdown, StopRequested
from kdg.machine import machine
from kdg.stack.layout import StackLayout


def verdict(result: CellResult) -> tuple[str, str]:
    """The outcome rules, read from the policy: what the guarantee promises, and what it allows.

    exactly-once → 0 lost and 0 duplicates; at-least-once → 0 lost; at-most-once → 0 duplicates.
    """
    policy = policy_for(result.guarantee)
    broken = []
    if result.lost and not policy.may_lose:
        broken.append(f"lost: {result.lost}")
    if result.duplicates and not policy.may_duplicate:
        broken.append(f"duplicates: {result.duplicates}")
    if result.unexpected:
        broken.append(f"unexpected: {result.unexpected}")
    if broken:
        return "FAIL", ", ".join(broken) + f" — not allowed by {result.guarantee}"
    allowed = [f"{name}: {n}" for name, n in (("lost", result.lost), ("duplicates", result.duplicates)) if n]
    if allowed:
        return "PASS", ", ".join(allowed) + f", allowed by {result.guarantee}"
    return "PASS", "nothing lost, nothing duplicated" + ("" if result.fault_fired else " (the fault did not fire)")


def run_cell(layout: StackLayout, guarantee: str, fault: str, repetition: int, messages: int,
             sink: str, keep: bool = False, shutdown: Shutdown | None = None,
             started: Callable[[Cell], None] = lambda cell: None, topics: int = 1) -> CellResult:
    """One cell, audited. Its topics and rows are deleted afterwards, unless ``keep`` or the cell failed.

    With ``topics`` > 1 the cell produces ``messages`` records to each of its topics, reads them all in one
    consume per member, and audits each topic against its table (or output topic); the counts are summed.

    A stop requested through ``shutdown`` ends the cell before its audit: its processes are killed (at once by
    the watcher that ``started`` hands the cell to, see :func:`_kill_on_stop`), the stack is made whole, its
    data deleted unless ``keep``, and StopRequested is raised."""
    cell = Cell(layout, guarantee, fault, repetition, messages, sink, stop=shutdown, topics=topics)
    started(cell)
    cell.start_sampling()
    try:
        try:
            {**INJECTORS, **SPARK_INJECTORS}[fault](cell)
            report = cell.drain()
            if "rows_in" in report:  # a stream's report: rows over its streaming time
                report["msgs_per_s"] = round(report["rows_in"] / report["duration_s"], 1) if report["duration_s"] else 0.0
            cell.result.consume_msgs_per_s = report.get("msgs_per_s", 0.0)
        finally:
            cell.stop_sampling()
            cell.stop_all()
            _restore_stack(cell)
    except BaseException as exc:  # a killed process may fail the step it was in: the stop is the cause
        if not cell.stopped():
            raise
        if not keep:
            _forget(cell)
        raise StopRequested(cell.stopped()) from exc
    _audit(cell)
    cell.result.duration_s = cell.now()
    cell.result.verdict, cell.result.note = verdict(cell.result)
    cell.result.kept = keep or cell.result.verdict != "PASS"  # a failed cell's records are there to be read
    if not cell.result.kept:
        _forget(cell)
    return cell.result


AUDITED = ("acked", "failed", "processed_unique", "rows", "lost", "duplicates", "unexpected")


def _audit(cell: Cell) -> None:
    """Each input topic against what it was written to, summed into the cell's result; with several topics, each
    topic's counts go on the timeline, and how many transactions wrote several tables at once."""
    for topic, sink, table in cell.targets():
        audit = run_audit(topic, cell.conn, sink=sink, table=table)
        for name in AUDITED:
            setattr(cell.result, name, getattr(cell.result, name) + getattr(audit, name))
        if cell.topic_count > 1:
            cell.event(f"audit {topic} → {sink if table == 'kdg_events' else table}: " +
                       " ".join(f"{name}={getattr(audit, name)}" for name in AUDITED))
    if cell.tables:
        spanning, batches = cell.transactions_across_tables()
        cell.event(f"{spanning} of {batches} sink transactions wrote several tables at once")


def _forget(cell: Cell) -> None:
    try:
        cell.forget()
    except KdgError as exc:  # the verdict stands; the data is only left behind, and said so (`kdg chaos clean`)
        cell.result.kept = True
        cell.event(f"could not delete the cell's topics and rows: {exc}")


def _restore_stack(cell: Cell) -> None:
    """Start again what a fault stopped and the cell did not restart (it was stopped, or failed, half-way)."""
    from kdg.stack import cluster

    if not cluster.status(cell.layout, with_quorum=False).healthy:
        cell.event("the cell ended with the stack partly down: starting what is missing")
        cluster.up(cell.layout, echo=lambda *args, **kwargs: None)


ENGINES = {"consume": list(INJECTORS), "spark": list(SPARK_INJECTORS), "both": [*INJECTORS, *SPARK_INJECTORS]}


def parse_faults(spec: str, engine: str = "consume") -> list[str]:
    """``--faults``: ``all`` is every fault of the ``--engine`` (kdg consume's, spark-stream's, or both)."""
    if engine not in ENGINES:
        raise UsageError(f"--engine {engine!r}: use consume, spark or both")
    faults = ENGINES[engine] if spec == "all" else [f.strip() for f in spec.split(",") if f.strip()]
    unknown = [f for f in faults if f not in ENGINES["both"]]
    if unknown:
        raise UsageError(f"unknown fault(s) {', '.join(unknown)}; choose from {', '.join(ENGINES['both'])}")
    return faults


def parse_guarantees(spec: str) -> list[str]:
    if spec == "all":
        return [g.value for g in Guarantee]
    return [policy_for(g.strip()).guarantee.value for g in spec.split(",")]


def run_chaos(layout: StackLayout, *, guarantees: list[str], faults: list[str], messages: int, repeat: int,
              sink: str, on_cell: Callable[[dict], None] | None = None, keep: bool = False,
              shutdown: Shutdown | None = None, topics: int = 1) -> dict:
    """Run the matrix; returns the results document that reports are written from.

    Repetitions are the outer loop, so a long run stopped part-way has whole matrices, not ten
    repetitions of the first faults and none of the last. `on_cell` sees the document after each
    cell (``complete`` stays False until the last one), so a caller can keep it on disk as it grows.
    A stop requested through ``shutdown`` ends the cell in progress unaudited (see :func:`run_cell`) and
    returns the cells done, with ``stopped_by``. ``topics`` > 1 gives every cell that many topics, read by one
    consume per member (kdg consume's faults only: spark-stream cells read one topic).
    """
    if sink not in ("postgres", "kafka"):
        raise UsageError("--sink must be postgres or kafka")
    if messages < 100:
        raise UsageError("--messages must be at least 100, so a batch can die mid-run")
    if repeat < 1:
        raise UsageError(f"--repeat {repeat}: must be at least 1")
    if topics < 1:
        raise UsageError(f"--topics {topics}: must be at least 1")
    spark = [f for f in faults if f in SPARK_INJECTORS]
    if topics > 1 and spark:
        raise UsageError(f"--topics {topics}: the spark-* faults ({', '.join(spark)}) stream one topic; run them "
                         "with --topics 1 (or --engine consume)")
    results = {"started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
               "messages": messages, "repeat": repeat, "sink": sink, "complete": False, "cells": []}
    if topics > 1:  # a run of one topic keeps the document it always had
        results["topics"] = topics
    started = time.monotonic()
    if sink != "postgres" and any(f in SPARK_INJECTORS for f in faults):
        raise UsageError("the spark-* faults stream into Postgres: use --sink postgres")
    cells: list[Cell] = []
    if shutdown is not None:
        _kill_on_stop(shutdown, cells)
    try:
        for rep in range(1, repeat + 1):
            for fault in faults:
                for guarantee in guarantees:
                    if fault in SPARK_INJECTORS and policy_for(guarantee).commit_mode is CommitMode.BEFORE_PROCESSING:
                        continue  # spark-stream refuses at-most-once: there is no such pipeline to break
                    if shutdown is not None and shutdown.requested:
                        raise StopRequested(shutdown.signal or "stop requested")
                    result = run_cell(layout, guarantee, fault, rep, messages, sink, keep, shutdown, cells.append,
                                      topics)
                    cells.clear()
                    results["cells"].append(asdict(result))
                    results["duration_s"] = round(time.monotonic() - started, 1)
                    if on_cell:
                        on_cell(results)
    except StopRequested as stop:
        results["stopped_by"] = str(stop) or "stop requested"
        results["duration_s"] = round(time.monotonic() - started, 1)
        return results
    results["complete"] = True
    return results


def _kill_on_stop(shutdown: Shutdown, cells: list[Cell]) -> None:
    """A thread that, once a stop is requested, kills the processes of the cell in progress: a cell's steps wait
    on its processes (a paused consumer would wait for ever), and it starts none after the stop."""
    def watch() -> None:
        while not shutdown.sleep(3600):
            pass
        for cell in list(cells):
            cell.kill_processes()

    threading.Thread(target=watch, name="kdg-chaos-stop", daemon=True).start()

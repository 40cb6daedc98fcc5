"""Your logic on Spark: a route's ``--transform`` and the ``--handler``, run by the executors as `kdg consume` runs them.

On the driver, :func:`check_logic` imports each function once (one that cannot be imported is a usage
error, exit 2, before anything is read) and notes the folder each module was found in. An executor's
Python worker imports the function again by its ``module:function`` name, with that folder first on its
``sys.path``: on the local master it is this machine's; off it, :func:`module_roots` says what to ship
with kdg itself (:meth:`kdg.spark.session.SparkRun.ship_package`). A function given as an object (the Python
API) is pickled with the task.

:func:`write_with_logic` is the executors' write of a task with a transform, a handler or a fan-out: each
record through its route's transform (a fan-out's: each route's) with `kdg consume`'s code
(:func:`kdg.flow.transform.fan_out`: a dict, a list of dicts keyed ``KEY#i``, None filtered, an exception
dead-lettered with ``kdg-error-type`` / ``kdg-error-message``), then each chunk of whole records in ONE
transaction of the store's unit (:meth:`kdg.store.unit.UnitMixin.write_unit`) holding every route's table,
which calls the handler with the rows that transaction writes (never a duplicate it suppressed).
"""

import importlib.util
import os
import sys
from pathlib import Path
from typing import Iterator

from kdg.errors import UsageError


def check_logic(router, handler) -> tuple[str, ...]:
    """Import every route's transform and the handler now (a usage error names one that cannot be); the folders
    their modules were found in, for the executors' ``sys.path``."""
    from kdg.flow.transform import load_function

    specs = [(r.transform, "--transform") for r in router.routes if r.transform is not None]
    specs += [(handler, "--handler")] if handler is not None else []
    roots: list[str] = []
    for spec, option in specs:
        load_function(spec, option)
        if isinstance(spec, str):
            root = _root_of(spec.partition(":")[0])
            if root is not None and root not in roots:
                roots.append(root)
    return tuple(roots)


def module_roots(router, handler) -> list[Path]:
    """What a cluster's executors need of the user's code: each named module's top-level file or package."""
    names = [s for s in [r.transform for r in router.routes] + [handler] if isinstance(s, str)]
    found = []
    for name in dict.fromkeys(s.partition(":")[0].split(".")[0] for s in names):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin in (None, "built-in", "frozen"):
            continue
        origin = Path(spec.origin)
        found.append(origin.parent if origin.name == "__init__.py" else origin)
    return found


def _root_of(module: str) -> str | None:
    """The ``sys.path`` folder ``module``'s top-level package (or module) was imported from."""
    top = sys.modules.get(module.split(".")[0])
    origin = getattr(top, "__file__", None)
    if origin is None:
        return None
    origin = Path(origin).resolve()
    return str(origin.parent.parent if origin.name == "__init__.py" else origin.parent)


def user_function(spec, option: str, roots: tuple[str, ...]):
    """On an executor: the function ``spec`` names (``module:function``, found in ``roots`` too), or ``spec`` itself."""
    if spec is None or callable(spec):
        return spec
    from kdg.flow.transform import load_function

    for root in reversed(roots):
        if root not in sys.path and os.path.isdir(root):
            sys.path.insert(0, root)
    try:
        return load_function(spec, option)
    except UsageError as exc:
        raise UsageError(f"{exc} (on a Spark executor: the module must be importable there too)") from None


class _Output:
    """One route a task's records go to: its spec, its transform and (a typed route) its row maker."""

    def __init__(self, route: str | None, spec):
        from kdg.flow.transform import Transform
        from kdg.schemas.codecs import optional_decoder

        self.route, self.spec, self.transform, self.maker = route, spec, None, None
        fn = user_function(spec.transform, "--transform", spec.roots)
        if fn is not None:  # decoded as `kdg consume` decodes: the mapping's formats, else the value format and JSON
            formats = (spec.typed.mapping.value_format, spec.typed.mapping.key_format) if spec.typed is not None \
                else (spec.value_format, "json")
            self.transform = Transform(fn, *[optional_decoder(f, spec.registry) for f in formats])
        if spec.typed is not None:
            from kdg.mapping import RowMaker

            self.maker = RowMaker(spec.typed.mapping, spec.registry)

    def part(self, chunk: list, keep: bool):
        """This route's share of a chunk, ``(record, key)`` each, as the store's :class:`~kdg.store.unit.Part`."""
        from kdg.flow.transform import generic_rows
        from kdg.settings import table_name
        from kdg.store.unit import Part

        if self.maker is not None:
            return Part(self.spec.typed.mapping.table, self.maker.staged(chunk, keep=keep), self.spec.typed)
        return Part(table_name(self.spec.table), generic_rows(chunk))


def write_with_logic(batches: Iterator, spec, fault_armed: bool) -> dict:
    """A task's records through its route's transform (a fan-out's: each route's), each chunk of whole records
    written in one transaction of the store's unit, every route's table in it, with the handler; the task's
    counts (:data:`kdg.spark.writer.SUMMARY_COUNTS`)."""
    from kdg import faults
    from kdg.flow.transform import fan_out
    from kdg.records import Record
    from kdg.sinks.dead_letters import refused_row
    from kdg.spark.writer import SUMMARY_COUNTS, _keys, _LazyDeadLetters, keyed_records
    from kdg.store.pg import Store

    outputs = [_Output(route, s) for route, s in spec.fans] if spec.fans else [_Output(None, spec)]
    by_route = {o.route: o for o in outputs}
    fanning = [(o.route, o.transform) for o in outputs]
    plain = len(outputs) == 1 and outputs[0].transform is None  # a handler alone: the records as they are
    handler = user_function(spec.handler, "--handler", spec.roots)
    dlq, fill = _LazyDeadLetters(spec.dead_letters), _keys(spec)
    totals = dict.fromkeys(SUMMARY_COUNTS, 0)
    seen: set[str] = set()
    pending: list[tuple[Record, str]] = []
    dead: list[tuple] = []
    gone: list[tuple] = []  # (topic, route, key, partition, offset) a route's transform filtered out
    with Store(spec.dsn) as store:
        def flush(rows: list) -> None:
            dlq.send(dead)  # durable before the rows that account for them commit
            totals["dead_lettered"] += len(dead)
            dead.clear()
            shares: dict = {}
            for pair in rows:
                shares.setdefault(pair[0].route, []).append(pair)
            filtered = _filtered(gone, by_route) if spec.dedup else None  # claimed as filtered, for the audit
            gone.clear()
            if not shares and not filtered:
                return
            parts = [(by_route[route].part(chunk, handler is not None), chunk) for route, chunk in shares.items()]

            def dead_letter(part, result) -> None:  # inside the transaction: durable before it commits
                chunk = next(c for p, c in parts if p is part)
                found = (part.rows.dead if part.target is not None else []) + [
                    refused_row(*chunk[seq], state, message) for seq, state, message in result.rejected]
                dlq.send(found)
                totals["dead_lettered"] += len(found)

            for result in store.write_unit([p for p, _ in parts], spec.group, claim=spec.dedup, handler=handler,
                                           dead_letter=dead_letter, filtered=filtered):
                for name, got in (("rows_written", result.written), ("duplicates_dropped", result.duplicates),
                                  ("superseded", result.superseded), ("deleted", result.deleted),
                                  ("filtered", result.filtered)):
                    totals[name] += got
            totals["chunks"] += 1
            if fault_armed:
                faults.reach("spark-task-mid-write")

        for batch in batches:
            pairs = list(keyed_records(batch, spec, fill, seen, totals))
            if plain:
                pending += pairs
            else:
                made, failed = len(pending), len(dead)
                filtered, extra = fan_out(pairs, fanning, pending, dead)
                totals["filtered"] += filtered
                totals["exploded"] += extra
                if filtered or len(fanning) > 1:  # (a fan-out's route may filter a record another writes)
                    gone += _left_out(pairs, fanning, pending[made:], dead[failed:])
            while len(pending) >= spec.chunk_rows:
                cut = _record_end(pending, spec.chunk_rows)
                flush(pending[:cut])
                del pending[:cut]
        if pending or dead or gone:  # (a task whose every record was filtered still claims them)
            flush(pending)
    return totals


def _left_out(pairs: list, outputs: list, rows: list, dead: list) -> list[tuple]:
    """``(topic, route, key, partition, offset)`` of each record a route's transform left without a row (and did
    not dead-letter), given the ``rows`` and ``dead`` letters :func:`~kdg.flow.transform.fan_out` made of ``pairs``."""
    made = {(rec.route, rec.partition, rec.offset) for rec, _ in rows}
    failed = {(rec.partition, rec.offset) for rec, *_ in dead}
    return [(rec.topic, route, key, rec.partition, rec.offset) for route, transform in outputs if transform is not None
            for rec, key in pairs
            if (route, rec.partition, rec.offset) not in made and (rec.partition, rec.offset) not in failed]


def _filtered(gone: list, by_route: dict) -> list[tuple]:
    """Per table, ``(table, [(key, topic, partition, offset), …])`` of what its route's transform filtered out (as
    :meth:`kdg.store.unit.UnitMixin.write_unit` claims them)."""
    from kdg.settings import table_name

    found: dict = {}
    for topic, route, key, partition, offset in gone:
        spec = by_route[route].spec
        found.setdefault(spec.table, (table_name(spec.table), []))[1].append((key, topic, partition, offset))
    return list(found.values())


def _record_end(rows: list, at: int) -> int:
    """Where a chunk of ``rows`` may end at or after ``at``: never between two rows of one record (a fan-out's
    or an explode's rows are written in one transaction, as `kdg consume` writes them)."""
    last = rows[at - 1][0]
    while at < len(rows) and (rows[at][0].partition, rows[at][0].offset) == (last.partition, last.offset):
        at += 1
    return at


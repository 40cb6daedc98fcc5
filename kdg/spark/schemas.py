"""Columns from the records' schema on Spark (issue 47): the driver meets each record schema with its table first.

A route with ``columns = "from-schema"`` takes its columns from each record's Kafka Connect JsonConverter schema,
as `kdg consume` does (:mod:`kdg.mapping.from_record`, :mod:`kdg.mapping.evolution`). On Spark the executors
never ALTER a table: before a replay's job, and before each micro-batch of a stream, the driver finds the
distinct record schemas of the data about to be written (:func:`distinct_schemas`: one small Spark aggregation,
a few rows per batch), and :class:`SchemaFollower` meets each new one with the live table as the consume sink
does. A missing table is made from the first schema; under ``evolve = "add-columns"`` a new field adds a
nullable column, a widened type widens it and a field become optional drops its NOT NULL, each through
:meth:`kdg.store.pg.Store.evolve_table` (a short transaction under the table's evolution lock); under
``evolve = "none"`` each change is said once, not followed. A type the column cannot take stops the command
(:class:`~kdg.errors.SchemaIncompatible`, before anything of the batch is written) or, under
``on_incompatible = "dead-letter"``, marks that schema's records for the dead-letter topic.

The executors then get the final column list, the schemas the driver met (:func:`record_head` names each)
and those it refused. A record whose schema the driver did not meet stops its task: its field is never dropped
in silence.
"""

import re
from dataclasses import dataclass, field, replace

# a JsonConverter value, as Spark SQL (a Java regular expression) and Python (bytes) both find it
_WRAPPED = r'^\s*\{\s*"schema"\s*:'
_WRAPPED_BYTES = re.compile(rb'\s*\{\s*"schema"\s*:')
_PAYLOAD = '"payload"'


def record_head(value: bytes | None) -> str | None:
    """The text a record schema is known by: a JsonConverter value's part before ``"payload"`` (what
    :func:`distinct_schemas` finds in Spark SQL); None for a value that is not JsonConverter's."""
    if value is None or not _WRAPPED_BYTES.match(value):
        return None
    cut = value.find(b'"payload"')
    return value[:cut].decode("utf-8", "replace") if cut >= 0 else None


def distinct_schemas(rows, topics: list[str]) -> list:
    """The distinct record schemas of ``topics``' values in ``rows`` (sink rows: :func:`kdg.spark.job.sink_rows`),
    each with one record carrying it, in the order they first appear: rows of ``(topic, head, value, key)``."""
    from pyspark.sql import functions as F

    text = F.col("value").cast("string")
    head = F.when(text.rlike(_WRAPPED) & (F.instr(text, _PAYLOAD) > 0), F.substring_index(text, _PAYLOAD, 1))
    found = (rows.where(F.col("topic").isin(topics)).select("topic", head.alias("head"), "value", "key", "partition",
                                                             "offset")
             .where(F.col("head").isNotNull())
             .groupBy("topic", "head")
             .agg(F.min_by(F.struct("value", "key"), F.struct("offset", "partition")).alias("sample"),
                  F.min(F.struct("offset", "partition")).alias("first"))
             .collect())
    found.sort(key=lambda r: (r["first"]["offset"], r["first"]["partition"]))
    return [(r["topic"], r["head"], r["sample"]["value"], r["sample"]["key"]) for r in found]


@dataclass
class FollowedTable:
    """One from-schema route's table as the driver knows it: its typed target (None until a schema made it),
    the schemas met, those refused (on_incompatible = dead-letter) with why, and the changes said under none."""

    typed: object = None
    heads: set = field(default_factory=set)
    refused: dict = field(default_factory=dict)
    said: set = field(default_factory=set)


class SchemaFollower:
    """Meets each record schema new to a from-schema route's table with the live table, on the driver."""

    def __init__(self, store, echo=print, resume: str = "run it again"):
        """``resume``: what the user does after altering the table (said in the incompatible change's error)."""
        self.store, self.echo, self.resume = store, echo, resume
        self.tables: dict = {}        # (route name, table as routed) → FollowedTable
        self.schema_changes: list[dict] = []

    def meet(self, made, target, head: str, value: bytes, key: bytes | None) -> None:
        """``head``'s record schema (``value``, ``key``: a record carrying it) met with ``target``'s table."""
        from kdg.mapping.evolution import SchemaChange, meet_schema, said
        from kdg.mapping.from_record import mapping_from_record, optional_columns

        followed = self.tables.setdefault(made, FollowedTable())
        if head in followed.heads or head in followed.refused:
            return
        found = mapping_from_record(value, key, target.mapping, target.table)
        if found is None:  # no row schema (a Debezium heartbeat): nothing to meet
            followed.heads.add(head)
            return
        if followed.typed is None:  # the first schema makes the table (or is checked against it), as in consume
            if found.evolve == "add-columns":
                for column in self.store.add_columns(target.table, found.columns):
                    self.schema_changes.append(said(target.table, SchemaChange(column.name, "add", column.type.name)))
            followed.typed, _ = self.store.prepare_typed(found)
        mapping = followed.typed.mapping
        met = meet_schema(self.store, mapping, found, optional_columns(value, mapping.envelope), followed.said,
                          self.resume)
        if met.refused is not None:
            followed.refused[head] = met.refused
            return
        followed.heads.add(head)
        self.schema_changes += met.said
        if met.changed:
            followed.typed, _ = self.store.prepare_typed(replace(mapping, columns=mapping.columns + met.columns))

    def take_said(self) -> list[dict]:
        """The changes made (or, under none, asked) since last asked, each said once as `kdg consume` says it."""
        said, self.schema_changes = self.schema_changes, []
        for change in said:
            self.echo(f"{change['table']}: column {change['column']} {change['type']} {change['change']} "
                      f"({change['why']})")
        return said

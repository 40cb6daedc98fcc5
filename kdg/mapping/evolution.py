"""A record schema that changed, against the table it writes: what it asks of each column (issue 47).

A route with columns from the records' schema (:mod:`kdg.mapping.from_record`) meets each distinct schema with
its table once. :func:`plan_changes` says what the schema asks: a column for a field the table lacks, a widening
where a field's type grew (:data:`WIDER`), NOT NULL dropped where a field became optional, or a change kdg never
applies (``incompatible``: a narrowing, or another kind of type), whose :meth:`SchemaChange.reason` names the
table, the column, both types and the ``ALTER TABLE`` a user may run. The sink applies what ``evolve`` allows
(:meth:`kdg.store.pg.Store.evolve_table`) and stops, or dead-letters, on the rest.
"""

import re
from dataclasses import dataclass, field

from kdg.errors import SchemaIncompatible
from kdg.mapping.spec import Column, Mapping
from kdg.settings import TableName

# how each kind of change is said (the report's schema_changes, the status line): why it is one, what it did,
# and what evolve = "none" leaves undone
WHY = {"add": "a field new to the table", "widen": "the field's type widened",
       "drop not null": "the field became optional"}
DONE = {"add": "added", "drop not null": "NOT NULL dropped"}
NOT_FOLLOWED = {"add": "its values are not written", "widen": "a value past the column's range is dead-lettered",
                "drop not null": "a null is dead-lettered"}

# WIDER[t]: the types a column of type t may become with every value it holds kept as it is. A field whose schema
# now gives one of them is a widening: evolve = "add-columns" alters the column to it. The other way round (a
# column already wider than the field) the column holds the field's values and nothing changes. numeric's
# modifiers count too: numeric(12,2) holds numeric(10,2), numeric holds every numeric(P,S).
WIDER = {"smallint": ("integer", "bigint", "numeric", "real", "double precision"),
         "integer": ("bigint", "numeric", "double precision"),
         "bigint": ("numeric",),
         "real": ("double precision",)}
# a character column holds these types' values as their text (a column altered to text takes the old ones too)
AS_TEXT = ("text", "smallint", "integer", "bigint", "numeric", "real", "double precision", "boolean", "uuid")
_CHARACTER = ("text", "character varying", "character")
_SPELLED = {"timestamp": "timestamp without time zone", "timestamptz": "timestamp with time zone",
            "time": "time without time zone", "timetz": "time with time zone"}
_MODS = re.compile(r"\((\d+)(?:,(\d+))?\)")


@dataclass(frozen=True)
class SchemaChange:
    """What a record's schema asks of a column of the table: ``add`` it (nullable), ``widen`` it to ``type``,
    ``drop not null`` (the field became optional), or nothing kdg applies: ``incompatible``."""

    column: str
    change: str
    type: str              # the type the schema gives the field (column_type's spelling)
    was: str | None = None  # the table's type (format_type), where the table has the column

    def alter_sql(self, table: TableName) -> str:
        """The statement that makes the table follow: what kdg runs under evolve = "add-columns", or, for an
        incompatible change, what the user may run."""
        column = Column(self.column, None, None).sql
        if self.change == "add":
            return f"ALTER TABLE {table.sql} ADD COLUMN {column} {self.type}"
        if self.change == "drop not null":
            return f"ALTER TABLE {table.sql} ALTER COLUMN {column} DROP NOT NULL"
        return f"ALTER TABLE {table.sql} ALTER COLUMN {column} TYPE {self.type} USING {column}::{self.type}"

    def reason(self, table: TableName) -> str:
        """Why an incompatible change is not applied, naming the table, the column and both types."""
        return (f"column {self.column} of {table.text} is {self.was}, and the record's schema now makes it "
                f"{self.type}: not a widening, and kdg never narrows or converts a column; to take such records, "
                f"alter it: {self.alter_sql(table)}")


def type_change(column: str, field: str) -> str:
    """How a table column of type ``column`` (``format_type``'s spelling) meets a field the schema types as
    ``field`` (:func:`column_type`'s): ``same``, ``holds`` (the column takes every value as it is), ``widening``
    (the column can become the field's type, :data:`WIDER`), or ``incompatible``.

    Example:
        >>> type_change("integer", "bigint"), type_change("bigint", "integer"), type_change("integer", "text")
        ('widening', 'holds', 'incompatible')
    """
    have, want = _base(column), _base(_SPELLED.get(field, field))
    if have == want and (have != "numeric" or _mods(column) == _mods(field)):
        return "same"
    if have == want == "numeric":
        if _numeric_holds(_mods(column), _mods(field)):
            return "holds"
        return "widening" if _numeric_holds(_mods(field), _mods(column)) else "incompatible"
    if (have == "numeric" and _mods(column)) or (want == "numeric" and _mods(field)):  # numeric(P,S): numerics only
        return "incompatible"
    if have in _CHARACTER and want in AS_TEXT:
        return "holds"
    if have in WIDER.get(want, ()):
        return "holds"
    return "widening" if want in WIDER.get(have, ()) else "incompatible"


def plan_changes(found: Mapping, optional: set, types: dict, not_null, primary_key=()) -> list[SchemaChange]:
    """What ``found`` (a record's mapping, :func:`~kdg.mapping.from_record.mapping_from_record`) asks of a table
    whose columns have ``types`` (column → format_type), of which ``not_null`` are NOT NULL: a column for each
    field it lacks, a widening or an incompatible change for each type that differs, and NOT NULL dropped where
    a field is ``optional`` (but the primary key's columns)."""
    changes = []
    for column in found.columns:
        kind = column.type.name
        if column.name not in types:
            changes.append(SchemaChange(column.name, "add", kind))
            continue
        verdict = type_change(types[column.name], kind)
        if verdict in ("widening", "incompatible"):
            changes.append(SchemaChange(column.name, "widen" if verdict == "widening" else verdict, kind,
                                        types[column.name]))
        if column.name in optional and column.name in not_null and column.name not in primary_key:
            changes.append(SchemaChange(column.name, "drop not null", kind, types[column.name]))
    return changes


def _base(kind: str) -> str:
    return _MODS.sub("", kind)


def _mods(kind: str) -> tuple | None:
    found = _MODS.search(kind)
    return (int(found[1]), int(found[2] or 0)) if found else None


def _numeric_holds(wide: tuple | None, narrow: tuple | None) -> bool:
    """Whether numeric(``wide``) takes every numeric(``narrow``) (None: numeric without a modifier)."""
    if wide is None:
        return True
    return narrow is not None and wide[0] - wide[1] >= narrow[0] - narrow[1] and wide[1] >= narrow[1]


@dataclass
class Met:
    """What meeting a record schema with its table came to (:func:`meet_schema`)."""

    refused: str | None = None  # on_incompatible = "dead-letter": why this schema's records go to the DLQ
    said: list = field(default_factory=list)  # the changes to report, as schema_changes entries
    columns: tuple = ()  # the columns the route's mapping takes up (the table has them now)
    changed: bool = False  # the table or the mapping changed: the writer's target is to be made again


def said(table: TableName, change: SchemaChange, wording: str | None = None) -> dict:
    """``change`` as the report's ``schema_changes`` and the status line say it."""
    return {"table": table.text, "column": change.column, "type": change.type,
            "change": wording or DONE.get(change.change) or f"widened from {change.was}", "why": WHY[change.change]}


def meet_schema(store, mapping: Mapping, found: Mapping, optional: set, said_before: set, resume: str) -> Met:
    """A record schema new to a route (``found``: the mapping it makes, :func:`~kdg.mapping.from_record.
    mapping_from_record`; ``optional``: its optional fields) met with the live table of ``mapping``, the route's
    mapping so far — in `kdg consume`'s sink and on Spark's driver alike.

    Under ``evolve = "add-columns"`` the table follows (:meth:`kdg.store.pg.Store.evolve_table`: a column added,
    widened, its NOT NULL dropped, each made once however many writers meet it). Under ``"none"`` each change is
    said once (``said_before``) and not made, but a field the table already has (a column its owner added) is
    taken up. A type the column cannot take raises :class:`~kdg.errors.SchemaIncompatible` (``resume``: what
    the user does after altering the table), or, under ``on_incompatible = "dead-letter"``, refuses the schema.
    """
    table = mapping.table
    shape = store.table_shape(table)
    changes = plan_changes(found, optional, shape.types, shape.not_null, shape.primary_key) if shape is not None else []
    mapped = {c.name for c in mapping.columns}
    new = [c for c in found.columns if c.name not in mapped]
    follow = mapping.evolve == "add-columns"
    if not follow:  # the table's own columns are taken up; what it lacks is said, not made
        new = [c for c in new if shape is not None and c.name in shape.types]
        taken = mapped | {c.name for c in new}
        changes = [c for c in changes if c.column in taken or c.change == "add"]
    wrong = next((c for c in changes if c.change == "incompatible"), None)
    if wrong is not None:
        reason = wrong.reason(table)
        if mapping.on_incompatible != "dead-letter":
            raise SchemaIncompatible(f"{reason}; then {resume} (or send such records to the dead-letter topic: "
                                     'on_incompatible = "dead-letter" in a pipeline file\'s route)')
        return Met(refused=f"a schema change kdg does not apply: {reason}")
    met = Met(columns=tuple(new))
    if follow:
        made = store.evolve_table(table, changes)
        met.said = [said(table, c) for c in made]
    else:
        made = []
        for change in changes:
            if (change.column, change.change) not in said_before:
                said_before.add((change.column, change.change))
                met.said.append(said(table, change, f"not followed (evolve = none: {NOT_FOLLOWED[change.change]})"))
    done = {c.column for c in made}
    met.said += [said(table, SchemaChange(c.name, "add", c.type.name), "taken up (added before)")
                 for c in new if c.name not in done]
    met.changed = bool(new or made)
    return met

"""A mapped column's Postgres type, and how Postgres casts a staged text value to it.

Any type Postgres can read from text is accepted: the mapping may name it (``varchar(20)``,
``double precision``, ``text[]``, an enum, a domain, a range), or leave it out and take the
column's type from the table. A named type is checked in two steps: here, that it is a type name
at all (words, a schema, one modifier list, ``[]``: nothing that could be more SQL than that); then
:func:`kdg.store.tables.resolve_types` asks Postgres what it is (:meth:`ColumnType.resolved`).

Values are staged as text and cast in ONE ``INSERT … SELECT``. The cast is
to the type *without* its modifier, so the INSERT's own assignment applies it as Postgres would for
any INSERT: a ``varchar(5)`` value too long is refused (22001), not cut; a ``numeric(12,2)`` rounded.
A few families read more than Postgres's text input: timestamps and dates take epoch milliseconds
too (digits alone, but for a JSON string of 8 digits, ISO 8601's basic date, which is staged to pass
that test by: :func:`kdg.mapping.events.dated_text`); money takes a number with an exponent (``1e5``), through
numeric; an array column takes a JSON array; bytea takes a text in Postgres's hex form (``\\x`` and
pairs of hex digits: how decoded Avro and Protobuf bytes, and a key's or a header's bytes, are staged)
as those bytes, any other text as its UTF-8 bytes.

Example:
    >>> parse_type("Numeric(12, 2)").name
    'numeric(12,2)'
    >>> parse_type("VARCHAR(20)[]").lookup
    'varchar[]'
"""

import re
from dataclasses import dataclass, replace

from kdg.errors import UsageError

# digits alone are epoch milliseconds; a JSON string of 8 digits comes with a leading space (rows.py), which
# this test does not pass and Postgres's date/time input skips: "20240229" is 2024-02-29, not 1970
_EPOCH_MS = "{v} ~ '^-?[0-9]+$'"
_EPOCH_FAMILIES = ("timestamp with time zone", "timestamp without time zone", "date")
_FROM_MS = "to_timestamp(({v})::numeric / 1000)"
# the families whose cast is not simply ``(v)::type``, by the name format_type() gives their type
_CASTS = {
    "text": "{v}", "character varying": "{v}", "character": "{v}",  # the INSERT applies the length
    "bit": "({v})::bit varying",  # a bare ::bit is bit(1); the INSERT applies the column's length
    # Postgres's own hex form (``\\x0aff``, how kdg stages Avro and Protobuf bytes) as those bytes, else the UTF-8 text
    "bytea": r"CASE WHEN {v} ~ '^\\x([0-9a-fA-F]{{2}})*$' THEN decode(substr({v}, 3), 'hex') "
             "ELSE convert_to({v}, 'UTF8') END",
    "timestamp with time zone": f"CASE WHEN {_EPOCH_MS} THEN {_FROM_MS} ELSE ({{v}})::timestamptz END",
    "timestamp without time zone": f"CASE WHEN {_EPOCH_MS} THEN {_FROM_MS} AT TIME ZONE 'UTC' "
                                   "ELSE ({v})::timestamp END",
    "date": f"CASE WHEN {_EPOCH_MS} THEN ({_FROM_MS} AT TIME ZONE 'UTC')::date ELSE ({{v}})::date END",
    # money's input has no exponent, numeric's has: a number as JSON wrote it (1e5, 100E-2) goes through numeric
    "money": r"CASE WHEN {v} ~ '^-?[0-9]+(\.[0-9]+)?[eE][-+]?[0-9]+$' THEN ({v})::numeric::money "
             "ELSE ({v})::money END",
}
# a JSON array ("[…]") becomes a Postgres array of its elements' text; anything else is Postgres's own
# array literal ('{a,b}')
_ARRAY = ("CASE WHEN left(ltrim({v}), 1) = '[' THEN ARRAY(SELECT jsonb_array_elements_text(({v})::jsonb))::{t} "
          "ELSE ({v})::{t} END")
# how format_type() spells the types of the short list kdg has always known, so they need no look-up
_KNOWN = {"text": "text", "integer": "integer", "bigint": "bigint", "numeric": "numeric", "boolean": "boolean",
          "timestamptz": "timestamp with time zone", "date": "date", "jsonb": "jsonb", "bytea": "bytea",
          "uuid": "uuid", "smallint": "smallint", "real": "real", "double precision": "double precision",
          "json": "json", "interval": "interval", "timestamp": "timestamp without time zone",
          "time": "time without time zone", "varchar": "character varying", "char": "character",
          "inet": "inet", "cidr": "cidr", "macaddr": "macaddr"}
_ALIASES = {"int": "integer", "int4": "integer", "int8": "bigint", "int2": "smallint", "bool": "boolean",
            "decimal": "numeric", "float8": "double precision", "float4": "real", "float": "double precision",
            "timestamp with time zone": "timestamptz", "timestamp without time zone": "timestamp",
            "time without time zone": "time", "character varying": "varchar", "character": "char"}
# a type name: words (unquoted or "quoted"), a schema before a dot, one modifier list, array brackets
_WORD = r'(?:[a-z_][a-z0-9_$]*|"[^"\x00-\x1f]+")'
_TYPE = re.compile(rf"^(?P<head>{_WORD}(?:\.{_WORD})?(?: {_WORD})*)"
                   rf"(?: ?\((?P<mods>\d+(?:,\d+)?)\))?(?P<tail>(?: {_WORD})*)(?P<array>(?:\[\d*\])*)$")
_NUMERIC = re.compile(r"^(\d+)(?:,(\d+))?$")


@dataclass(frozen=True)
class ColumnType:
    """A column type: ``name`` as written in DDL (``numeric(12,2)``, normalised), ``lookup`` the same without
    its modifier (what Postgres resolves), ``mods`` the modifier (``12,2``), and once resolved against
    Postgres: ``pg`` the type as ``format_type()`` names it without a modifier, ``array`` whether it is one."""

    name: str
    lookup: str
    mods: str = ""
    pg: str | None = None
    array: bool = False

    @property
    def base(self) -> str:
        """The cast family (format_type's name; ``array`` for any array); resolved or known types only."""
        return "array" if self.array else self._pg

    @property
    def _pg(self) -> str:
        if self.pg is None:
            raise ValueError(f"type {self.name!r} is not resolved against Postgres yet")
        return self.pg

    @property
    def staged(self) -> str:
        """The staging table's type for every column: text. A jsonb value Postgres refuses (a number past
        numeric's range) then fails its row's cast in the INSERT, found and dead-lettered like any refused
        row, where staged as jsonb it failed the whole batch's COPY."""
        return "text"

    @property
    def reads_json(self) -> bool:
        """Whether a JSON field goes to this column as JSON text (a string keeps its quotes): jsonb and json."""
        return self.base in ("jsonb", "json")

    @property
    def reads_epoch(self) -> bool:
        """Whether digits alone go to this column as epoch milliseconds: timestamptz, timestamp and date."""
        return self.base in _EPOCH_FAMILIES

    @property
    def formatted(self) -> str:
        """The type as ``format_type()`` reports it for a table column (modifier included)."""
        pg = self._pg
        if not self.mods:
            return pg
        element, brackets = (pg[:-2], "[]") if self.array and pg.endswith("[]") else (pg, "")
        word, space, rest = element.partition(" ")
        if word in ("timestamp", "time") and rest.endswith("time zone"):  # timestamp(3) with time zone
            return f"{word}({self.mods}){space}{rest}{brackets}"
        return f"{element}({self.mods}){brackets}"

    def cast(self, expr: str) -> str:
        """SQL casting the staged value ``expr`` to this type, without its modifier (the INSERT applies it)."""
        if self.array:
            return _ARRAY.format(v=expr, t=self._pg)
        return _CASTS.get(self._pg, "({v})::" + self._pg).format(v=expr)

    def resolved(self, pg: str, array: bool) -> "ColumnType":
        """This type as Postgres named it (``format_type(oid, NULL)``): safe to write into SQL as it is."""
        return replace(self, pg=pg, array=array)

    def fits(self, table_type: str, table_pg: str) -> bool:
        """Whether a table column of ``table_type`` (format_type with its modifier; ``table_pg`` without)
        takes this mapping type's values: the same type, and the same modifier where the mapping gives one;
        or text into any character type (a value too long is refused per row)."""
        if self._pg == "text" and not self.array:
            return table_pg in ("text", "character varying", "character")
        return table_pg == self._pg and (not self.mods or table_type == self.formatted)


def parse_type(text: str, column: str = "") -> ColumnType:
    """A type name, normalised (case-insensitive outside quotes, a few aliases: int, int8, float8, decimal);
    a usage error when it is not a type name at all. Whether Postgres has it is asked later."""
    where = f"column {column!r}: " if column else ""
    name = _normalise(text)
    found = _TYPE.match(name)
    if not found:
        raise UsageError(f"{where}{text.strip()!r} is not a type name (e.g. bigint, varchar(20), "
                         "double precision, text[], numeric(12,2), myschema.mood)")
    head = " ".join(p for p in (found["head"], found["tail"].strip()) if p)
    head = _ALIASES.get(head, head)
    mods, array = found["mods"] or "", found["array"]
    if head == "numeric" and mods:
        precision, scale = _NUMERIC.match(mods).groups()
        precision, scale = int(precision), int(scale or 0)
        if not 1 <= precision <= 1000 or scale > precision:
            raise UsageError(f"{where}{text.strip()!r} needs 1 <= P <= 1000 and 0 <= S <= P")
        mods = f"{precision},{scale}"
    lookup = head + array
    shown = head + (f"({mods})" if mods else "") + array
    if head in ("timestamptz", "timestamp", "time") and mods:  # timestamp(3) [with time zone]
        shown = f"{head}({mods}){array}"
    known = _KNOWN.get(head)
    if known is not None:
        return ColumnType(shown, lookup, mods, known + ("[]" if array else ""), bool(array))
    return ColumnType(shown, lookup, mods)


def _normalise(text: str) -> str:
    """Lower case and single spaces outside double quotes; no space inside a modifier list."""
    out = []
    for part in re.split(r'("[^"]*")', text.strip()):
        if part.startswith('"') and part.endswith('"') and len(part) > 1:
            out.append(part)
        else:
            out.append(" ".join(part.lower().split()))
    name = "".join(out)
    name = re.sub(r"\s*\(\s*", "(", name)
    name = re.sub(r"\s*,\s*", ",", name)
    name = re.sub(r"\s*\)", ")", name)
    return re.sub(r"\s*\[\s*", "[", re.sub(r"\s*\]", "]", name))

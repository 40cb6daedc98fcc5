"""The Postgres types a mapped column may have, and how Postgres casts a staged text value to each.

Values are staged as text (jsonb for jsonb columns) and cast in ONE ``INSERT … SELECT``; the cast
of each type is written here once. timestamptz and date take ISO strings or epoch milliseconds.

Example:
    >>> parse_type("Numeric(12, 2)").name
    'numeric(12,2)'
"""

import re
from dataclasses import dataclass

from kdg.errors import UsageError

_EPOCH_MS = "{v} ~ '^-?[0-9]+$'"
_CASTS = {
    "text": "{v}",
    "integer": "({v})::integer",
    "bigint": "({v})::bigint",
    "numeric": "({v})::numeric",
    "boolean": "({v})::boolean",
    "timestamptz": f"CASE WHEN {_EPOCH_MS} THEN to_timestamp(({{v}})::numeric / 1000) ELSE ({{v}})::timestamptz END",
    "date": f"CASE WHEN {_EPOCH_MS} THEN (to_timestamp(({{v}})::numeric / 1000) AT TIME ZONE 'UTC')::date "
            "ELSE ({v})::date END",
    "jsonb": "{v}",
    "bytea": "convert_to({v}, 'UTF8')",
    "uuid": "({v})::uuid",
}
# how Postgres's format_type() spells each type, when it differs from ours
_FORMAT = {"timestamptz": "timestamp with time zone"}
_ALIASES = {"int": "integer", "int4": "integer", "int8": "bigint", "bool": "boolean", "decimal": "numeric",
            "timestamp with time zone": "timestamptz"}
_NUMERIC = re.compile(r"^(?:numeric|decimal)\s*\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)$")
_TEXT_LIKE = re.compile(r"^(character varying|character|varchar|char)(\(\d+\))?$")
NAMES = tuple(_CASTS) + ("numeric(P,S)",)


@dataclass(frozen=True)
class ColumnType:
    """A column type: ``name`` as written in DDL (``numeric(12,2)``), ``base`` its family (``numeric``)."""

    name: str
    base: str

    @property
    def staged(self) -> str:
        """The staging table's type for this column: jsonb for jsonb, text for the rest."""
        return "jsonb" if self.base == "jsonb" else "text"

    @property
    def formatted(self) -> str:
        """The type as ``format_type()`` reports it for a table column."""
        return _FORMAT.get(self.name, self.name)

    def cast(self, expr: str) -> str:
        """SQL casting the staged value ``expr`` to this type (a numeric(P,S) rounds as an INSERT would)."""
        return _CASTS[self.base].format(v=expr)

    def fits(self, table_type: str) -> bool:
        """Whether a table column of ``table_type`` (format_type's text) takes this mapping type's values.

        The same type; or text into varchar/char (a value too long is refused per row); or plain
        numeric into any numeric(P,S) (rounded to its scale, as an INSERT would).
        """
        if table_type == self.formatted:
            return True
        if self.name == "text":
            return bool(_TEXT_LIKE.match(table_type))
        return self.name == "numeric" and table_type.startswith("numeric(")


def parse_type(text: str, column: str = "") -> ColumnType:
    """A type name (case-insensitive, a few aliases: int, int8, bool, decimal); else a usage error."""
    name = " ".join(text.lower().split())
    name = _ALIASES.get(name, name)
    if name in _CASTS:
        return ColumnType(name, name)
    found = _NUMERIC.match(name)
    if found:
        precision, scale = int(found.group(1)), int(found.group(2) or 0)
        if not 1 <= precision <= 1000 or scale > precision:
            raise UsageError(f"column {column!r}: {text.strip()!r} needs 1 <= P <= 1000 and 0 <= S <= P")
        return ColumnType(f"numeric({precision},{scale})", "numeric")
    where = f"column {column!r}: " if column else ""
    raise UsageError(f"{where}unknown type {text.strip()!r}: use one of {', '.join(NAMES)}")

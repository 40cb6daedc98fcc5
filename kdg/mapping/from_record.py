"""A typed sink's mapping made from the schema a record carries: Kafka Connect's JsonConverter and Debezium.

A route may leave its columns out and take them from its records (issue 47): a record written by Kafka
Connect's JsonConverter (``schemas.enable=true``) is ``{"schema", "payload"}``, and its schema names every
field, its Connect type and its logical type. :func:`mapping_from_record` turns that schema into the columns
of a :class:`~kdg.mapping.spec.Mapping`: each field of the value's struct (under ``envelope = "debezium"``,
of the change event's ``after`` row, or ``before``) becomes a column named by
:func:`kdg.schemas.derive.column_name` (``orderId`` → ``order_id``), typed as below, and read by ``json:``.
The record key's fields (Debezium's key: the row's primary key) become the mapping's key, so that
``create_table`` makes the table with that primary key and upserts and deletes find their rows.

Each type is one :mod:`kdg.mapping.connect` converts into, so a value arrives as the source held it:

    int8, int16 → smallint        int32 → integer          int64 → bigint         boolean → boolean
    float32 → real                float64 → double precision                     string → text
    bytes → bytea (base64 decoded)                          array of plain scalars → their type[]
    struct, map, other arrays → jsonb                       another logical name → text (or jsonb)
    Connect Decimal → numeric(P,S) (numeric without connect.decimal.precision)
    Connect/Debezium Date → date                            Time, MicroTime, NanoTime → time
    Connect/Debezium Timestamp, MicroTimestamp, NanoTimestamp → timestamp (Debezium's: the source's
      wall clock, without a zone)                           ZonedTimestamp → timestamptz, ZonedTime → timetz
    Year → integer, MicroDuration and Interval → interval, VariableScaleDecimal → numeric, Json → jsonb,
    Uuid → uuid, Enum → text, EnumSet → text[], Xml → xml, Ltree → text

A record without a schema (plain JSON, a tombstone, not JSON) gives None: the caller waits for one that has
it. So does a Debezium event with no row schema (a heartbeat, a schema-change event). Every column is
nullable: an optional field's values may be null, and a required one's NOT NULL is not said (the table's
primary key columns are NOT NULL all the same).

Example:
    >>> from kdg.mapping.spec import Column, Mapping
    >>> from kdg.mapping.sources import parse_source
    >>> from kdg.settings import table_name
    >>> base = Mapping(table_name("t"), (), mode="upsert", envelope="debezium", create_table=True)
    >>> value = b'{"schema": {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": [' \\
    ...     b'{"field": "id", "type": "int32"}, {"field": "placedAt", "type": "int64", ' \\
    ...     b'"name": "io.debezium.time.MicroTimestamp"}]}]}, "payload": {"op": "c", "after": {}}}'
    >>> key = b'{"schema": {"type": "struct", "fields": [{"field": "id", "type": "int32"}]}, "payload": {"id": 1}}'
    >>> found = mapping_from_record(value, key, base, table_name("app.orders"))
    >>> [c.describe() for c in found.columns], found.key
    (['id integer = json:id', 'placed_at timestamp = json:placedAt'], ('id',))
"""

import re
from dataclasses import dataclass, replace

from kdg.errors import UsageError
from kdg.mapping.record_schemas import envelope_field, is_wrapped
from kdg.mapping.sources import parse_json, parse_source
from kdg.mapping.spec import Column, Mapping, validate
from kdg.mapping.types import parse_type
from kdg.schemas.derive import column_name
from kdg.settings import TableName

_CONNECT, _DEBEZIUM = "org.apache.kafka.connect.data.", "io.debezium."
_DECIMAL = _CONNECT + "Decimal"
# a Connect type without a logical name
PLAIN = {"int8": "smallint", "int16": "smallint", "int32": "integer", "int64": "bigint", "float32": "real",
         "float64": "double precision", "boolean": "boolean", "string": "text", "bytes": "bytea"}
# each logical type kdg.mapping.connect decodes (but Decimal: its precision, below), to the type it goes to
LOGICAL = {
    _CONNECT + "Date": "date", _CONNECT + "Time": "time", _CONNECT + "Timestamp": "timestamp",
    _DEBEZIUM + "time.Date": "date", _DEBEZIUM + "time.Time": "time", _DEBEZIUM + "time.MicroTime": "time",
    _DEBEZIUM + "time.NanoTime": "time", _DEBEZIUM + "time.Timestamp": "timestamp",
    _DEBEZIUM + "time.MicroTimestamp": "timestamp", _DEBEZIUM + "time.NanoTimestamp": "timestamp",
    _DEBEZIUM + "time.ZonedTimestamp": "timestamptz", _DEBEZIUM + "time.ZonedTime": "timetz",
    _DEBEZIUM + "time.Year": "integer", _DEBEZIUM + "time.MicroDuration": "interval",
    _DEBEZIUM + "time.Interval": "interval", _DEBEZIUM + "data.VariableScaleDecimal": "numeric",
    _DEBEZIUM + "data.Json": "jsonb", _DEBEZIUM + "data.Uuid": "uuid", _DEBEZIUM + "data.Enum": "text",
    _DEBEZIUM + "data.EnumSet": "text[]", _DEBEZIUM + "data.Xml": "xml", _DEBEZIUM + "data.Ltree": "text",
}
_ROWS = ("after", "before")  # a change event's row schemas: the same struct, either present


def mapping_from_record(value: bytes | None, key: bytes | None, base: Mapping, table: TableName) -> Mapping | None:
    """The mapping of ``base``'s settings (mode, on_tombstone, envelope, create_table, formats; its columns
    ignored, its ``extra_columns`` added last) for ``table``, with the columns and key the record's JsonConverter
    schemas describe; None when
    the value carries no schema. A schema kdg cannot make columns of is a usage error saying why.

    ``base.key`` is kept only when the record key names no fields."""
    if base.value_format != "json":
        raise UsageError(f"columns from the record's schema: value_format {base.value_format} is not read for "
                         "its schema yet; derive the mapping with `kdg mapping from-schema SUBJECT`")
    schema = _row_schema(_schema_of(value), base.envelope)
    if schema is None:
        return None
    cdc = base.envelope == "debezium"
    fields = _fields(schema, "the record's schema")
    columns = {field: _column(field, spec, "json", cdc) for field, spec in fields.items()}
    key_fields = _key_fields(key, base, fields)
    for field, spec in key_fields.items():
        from_key = field not in columns or (not cdc and base.on_tombstone == "delete")  # a tombstone has no value
        if from_key:
            columns[field] = _column(field, spec, "key", cdc)
    _check_names(columns)
    names = {field: column.name for field, column in columns.items()}
    found = tuple(names[f] for f in key_fields) or base.key
    taken = next((c for c in base.extra_columns if c.name in names.values()), None)
    if taken is not None:
        raise UsageError(f"column {taken.name!r} ({taken.source.spec}) is also a field of the record's schema; "
                         "name it otherwise")
    return validate(replace(base, table=table, columns=tuple(columns.values()) + base.extra_columns, key=found))


def column_type(schema) -> str:
    """The Postgres type a field of Connect schema ``schema`` goes to (the module's table)."""
    if type(schema) is not dict:
        return "jsonb"
    name, kind = schema.get("name"), schema.get("type")
    if name == _DECIMAL:
        return _decimal_type(schema.get("parameters") or {})
    if name in LOGICAL:
        return LOGICAL[name]
    if kind == "array":
        items = schema.get("items")
        plain = type(items) is dict and items.get("name") is None and items.get("type") in PLAIN
        return f"{PLAIN[items['type']]}[]" if plain and items["type"] != "bytes" else "jsonb"
    if kind in ("struct", "map"):
        return "jsonb"
    if name is not None:  # a logical type kdg does not decode: its value as sent, which text holds
        return "text"
    return PLAIN.get(kind, "jsonb")


def _decimal_type(parameters: dict) -> str:
    """``numeric(P,S)`` where the schema gives a precision Postgres takes (Debezium's
    ``connect.decimal.precision``), else ``numeric``, which holds any scale."""
    try:
        precision, scale = int(parameters["connect.decimal.precision"]), int(parameters.get("scale", 0))
    except (KeyError, TypeError, ValueError):
        return "numeric"
    return f"numeric({precision},{scale})" if 1 <= precision <= 1000 and 0 <= scale <= precision else "numeric"


def _schema_of(data: bytes | None):
    """The JsonConverter schema of a value or key; None where it has none (or is not JSON)."""
    if data is None or (b'"schema"' not in data if type(data) is bytes else '"schema"' not in data):
        return None
    try:
        doc = parse_json(data)
    except ValueError:
        return None
    return doc["schema"] if is_wrapped(doc) else None


def _row_schema(schema, envelope: str):
    """The struct whose fields are the row: the value's, or a change event's ``after`` (else ``before``)."""
    if schema is None or envelope != "debezium":
        return schema
    return next((found for row in _ROWS if type(found := envelope_field(schema, row)) is dict
                 and found.get("type") == "struct"), None)


def _fields(schema: dict, what: str) -> dict:
    """``{field name: its schema}`` of a struct schema; a usage error where there are none."""
    if schema.get("type") != "struct":
        raise UsageError(f"{what} is a Connect {schema.get('type')}, not a struct: there are no fields to make "
                         "columns of")
    fields = {f["field"]: f for f in schema.get("fields") or () if type(f) is dict and type(f.get("field")) is str}
    if not fields:
        raise UsageError(f"{what} is a struct without fields: there are no columns to make of it")
    return fields


def _key_fields(key: bytes | None, base: Mapping, row: dict) -> dict:
    """The record key's fields with their schemas: a JsonConverter key's struct; under the Debezium envelope,
    a plain JSON key's members too, where the row has each (Debezium's key is the row's primary key)."""
    if key is None or base.key_format != "json":
        return {}
    try:
        doc = parse_json(key)
    except ValueError:
        return {}
    if is_wrapped(doc):
        schema = doc["schema"]
        return _fields(schema, "the record key's schema") if schema.get("type") == "struct" else {}
    if base.envelope == "debezium" and type(doc) is dict and doc and all(f in row for f in doc):
        return {f: row[f] for f in doc}
    return {}


def _column(field: str, schema, kind: str, cdc: bool) -> Column:
    """The column of ``field``, read from the value (``kind`` json) or the key: under the envelope, the event's
    row and the key's payload; without it, JsonConverter's wrapper is read as it is (``/payload/FIELD``)."""
    name = column_name(field)
    if cdc and not field.startswith("/"):
        spec = f"{kind}:{field}"
    else:
        spec = f"{kind}:{'' if cdc else '/payload'}/{field.replace('~', '~0').replace('/', '~1')}"
    return Column(name, parse_type(column_type(schema), name), parse_source(spec, f"source of column {name!r}"))


def _check_names(columns: dict) -> None:
    seen: dict[str, str] = {}
    for field, column in columns.items():
        if column.name in seen:
            raise UsageError(f"fields {seen[column.name]!r} and {field!r} would both be column {column.name!r}")
        seen[column.name] = field


# -- a schema that changed, against the table it writes (evolve) --------------------------------
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
    """What ``found`` (a record's mapping, :func:`mapping_from_record`) asks of a table whose columns have
    ``types`` (column → format_type), of which ``not_null`` are NOT NULL: a column for each field it lacks, a
    widening or an incompatible change for each type that differs, and NOT NULL dropped where a field is
    ``optional`` (but the primary key's columns)."""
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


def optional_columns(value: bytes | None, envelope: str) -> set:
    """The columns whose fields the record's schema says are optional (may be null)."""
    schema = _row_schema(_schema_of(value), envelope)
    if type(schema) is not dict:
        return set()
    return {column_name(f["field"]) for f in schema.get("fields") or ()
            if type(f) is dict and type(f.get("field")) is str and f.get("optional") is True}


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

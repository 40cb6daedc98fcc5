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
    float, float32 → real         double, float64 → double precision (JsonConverter writes float and double)
    string → text
    bytes → bytea (base64 decoded)                          array of plain scalars → their type[]
    struct, map, other arrays → jsonb                       another logical name → text (or jsonb)
    Connect Decimal → numeric(P,S) (numeric without connect.decimal.precision)
    Connect/Debezium Date → date                            Time, MicroTime, NanoTime → time
    Connect/Debezium Timestamp, MicroTimestamp, NanoTimestamp → timestamp (Debezium's: the source's
      wall clock, without a zone)                           ZonedTimestamp → timestamptz, ZonedTime → timetz
    Year → integer, MicroDuration and Interval → interval, VariableScaleDecimal → numeric, Json → jsonb,
    Uuid → uuid, Enum → text, EnumSet → text[], Xml → xml, Ltree → text

A record in a Schema Registry format (``value_format = "avro" | "protobuf" | "json-schema"``) names its writer's
schema by the id in its 5-byte header (:mod:`kdg.schemas.wire`): that schema's top-level fields become the
columns the way ``kdg mapping from-schema`` makes them (:func:`kdg.schemas.derive.schema_columns`, its types
table), and where the key is a record in a registry format too, its fields are the mapping's key
(:mod:`kdg.mapping.from_registry`).
:func:`schema_head` names a record's schema cheaply (the header, or JsonConverter's schema text), so that a
sink meets each schema once.

A record without a schema (plain JSON, a tombstone, not JSON, not the wire format, an id the registry does not
know) gives None: the caller waits for one that has it (and the record's decoding says why it cannot be read).
So does a Debezium event with no row schema (a heartbeat, a schema-change event). Every column is nullable: an
optional field's values may be null, and a required one's NOT NULL is not said (the table's primary key columns
are NOT NULL all the same).

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

from dataclasses import replace

from kdg.errors import UsageError
from kdg.mapping.record_schemas import envelope_field, is_wrapped
from kdg.mapping.sources import parse_json, parse_source
from kdg.mapping.spec import Column, Mapping, validate
from kdg.mapping.types import parse_type
from kdg.schemas.derive import column_name
from kdg.schemas.formats import SCHEMA_FORMATS
from kdg.schemas.wire import MAGIC
from kdg.settings import TableName

_CONNECT, _DEBEZIUM = "org.apache.kafka.connect.data.", "io.debezium."
_DECIMAL = _CONNECT + "Decimal"
# a Connect type without a logical name
# Connect's types as JsonConverter names them (its JSON schema says float and double) and as Connect's own Schema.Type
PLAIN = {"int8": "smallint", "int16": "smallint", "int32": "integer", "int64": "bigint", "float": "real",
         "double": "double precision", "float32": "real", "float64": "double precision", "boolean": "boolean",
         "string": "text", "bytes": "bytea"}
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


def schema_head(value: bytes | None, fmt: str) -> bytes | None:
    """What names the schema ``value`` carries, read without decoding it: a registry format's 5-byte header
    (the schema id), JsonConverter's schema text; None where it carries none."""
    if value is None:
        return None
    if fmt in SCHEMA_FORMATS:
        return value[:5] if len(value) >= 5 and value[0] == MAGIC else None
    cut = value.find(b'"payload"')
    return value[:cut] if cut >= 0 else None


def mapping_from_record(value: bytes | None, key: bytes | None, base: Mapping, table: TableName,
                        registry=None) -> Mapping | None:
    """The mapping of ``base``'s settings (mode, on_tombstone, envelope, create_table, formats; its columns
    ignored, its ``extra_columns`` added last) for ``table``, with the columns and key the record's schemas
    describe (JsonConverter's, or the registry's by id: ``registry``, a :class:`kdg.schemas.registry.Registry`);
    None when the value carries no schema. A schema kdg cannot make columns of is a usage error saying why.

    ``base.key`` is kept only when the record key names no fields."""
    if base.value_format in SCHEMA_FORMATS:
        from kdg.mapping.from_registry import mapping_from_registry

        return mapping_from_registry(value, key, base, table, registry)
    if base.value_format != "json":
        raise UsageError(f"columns from the record's schema: value_format {base.value_format} carries no schema; "
                         "use json (Kafka Connect's JsonConverter), avro, protobuf or json-schema")
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
    return made_mapping(base, table, tuple(columns.values()), tuple(names[f] for f in key_fields) or base.key)


def made_mapping(base: Mapping, table: TableName, columns: tuple[Column, ...], key: tuple[str, ...]) -> Mapping:
    """``base`` for ``table`` with the schema's ``columns`` (then its ``extra_columns``) and ``key``."""
    names = {c.name for c in columns}
    taken = next((c for c in base.extra_columns if c.name in names), None)
    if taken is not None:
        raise UsageError(f"column {taken.name!r} ({taken.source.spec}) is also a field of the record's schema; "
                         "name it otherwise")
    return validate(replace(base, table=table, columns=columns + base.extra_columns, key=key))


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


def optional_columns(value: bytes | None, envelope: str, fmt: str = "json", registry=None) -> set:
    """The columns whose fields the record's schema says are optional (may be null): JsonConverter's, or the
    registry's (``fmt`` a registry format, ``registry`` its client)."""
    if fmt in SCHEMA_FORMATS:
        from kdg.mapping.from_registry import optional_registry_columns

        return optional_registry_columns(value, envelope, fmt, registry)
    schema = _row_schema(_schema_of(value), envelope)
    if type(schema) is not dict:
        return set()
    return {column_name(f["field"]) for f in schema.get("fields") or ()
            if type(f) is dict and type(f.get("field")) is str and f.get("optional") is True}


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


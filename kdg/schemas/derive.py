"""`kdg mapping from-schema SUBJECT`: a typed sink's mapping derived from the writer's schema.

Each top-level field becomes a column (its name in snake_case, read by ``json:FIELD``), with the Postgres
type that holds the field's values; ``--create-table`` then makes the table from it. Nested records,
maps and unions of several types become ``jsonb``; arrays of scalars become Postgres arrays.
"""

import json
import re

from kdg.errors import UsageError
from kdg.settings import sql_identifier

_AVRO = {"null": "text", "boolean": "boolean", "int": "integer", "long": "bigint", "float": "real",
         "double": "double precision", "bytes": "bytea", "string": "text"}
_AVRO_LOGICAL = {"date": "date", "time-millis": "time", "time-micros": "time", "timestamp-millis": "timestamptz",
                 "timestamp-micros": "timestamptz", "timestamp-nanos": "timestamptz",
                 "local-timestamp-millis": "timestamp", "local-timestamp-micros": "timestamp", "uuid": "uuid"}
_JSON = {"integer": "bigint", "number": "numeric", "boolean": "boolean", "string": "text"}
_JSON_FORMATS = {"date-time": "timestamptz", "date": "date", "time": "time", "uuid": "uuid"}


def column_name(field: str) -> str:
    """``orderId`` → ``order_id``; a name Postgres cannot take unquoted is a usage error naming the field."""
    snake = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", field).lower()
    snake = re.sub(r"[^a-z0-9_]", "_", snake)
    return sql_identifier(snake if not snake[:1].isdigit() else f"_{snake}", f"column (from field {field!r})")


def detect_format(text: str, schema_type: str | None) -> str:
    """avro, protobuf or json-schema, from the registry's schemaType (which some registries leave out)."""
    if schema_type == "PROTOBUF":
        return "protobuf"
    try:
        doc = json.loads(text)
    except ValueError:
        return "protobuf"
    if schema_type == "JSON" or (isinstance(doc, dict) and doc.get("type") != "record"
                                 and ("properties" in doc or "$schema" in doc)):
        return "json-schema"
    return "avro"


def fields_of(text: str, fmt: str) -> list[tuple[str, str]]:
    """``(field name, Postgres type)`` of each top-level field of the schema's record or first message."""
    if fmt == "avro":
        schema = json.loads(text)
        if not isinstance(schema, dict) or schema.get("type") != "record":
            raise UsageError("the Avro schema is not a record: there are no fields to make columns of")
        named: dict[str, str] = {}
        return [(f["name"], _avro_type(f["type"], named)) for f in schema["fields"]]
    if fmt == "protobuf":
        from kdg.schemas.proto import ProtoFile

        try:
            message = ProtoFile(text).message((0,)).DESCRIPTOR
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return [(f.name, _proto_type(f)) for f in message.fields]
    schema = json.loads(text)
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        raise UsageError("the JSON Schema has no top-level properties to make columns of")
    return [(name, _json_type(spec)) for name, spec in props.items()]


def schema_columns(text: str, fmt: str, kind: str = "json") -> dict[str, dict]:
    """``{column: {"type", "from"}}``: each top-level field of the schema as a column, read by ``kind``
    (``json`` for the value, ``key`` for the record key). The one way a registry schema becomes columns:
    ``kdg mapping from-schema`` and a ``columns = "from-schema"`` route (:mod:`kdg.mapping.from_record`)."""
    columns, seen = {}, {}
    for field, pg_type in fields_of(text, fmt):
        name = column_name(field)
        if name in seen:
            raise UsageError(f"fields {seen[name]!r} and {field!r} would both be column {name!r}")
        seen[name] = field
        path = field if not field.startswith("/") else "/" + field.replace("~", "~0").replace("/", "~1")
        columns[name] = {"type": pg_type, "from": f"{kind}:{path}"}
    return columns


def derive_mapping(text: str, fmt: str, table: str, key: tuple[str, ...] = ()) -> dict:
    """The mapping (as :func:`kdg.mapping.spec.load_file` reads it from TOML) for ``table``."""
    columns = schema_columns(text, fmt)
    for name in key:
        if name not in columns:
            raise UsageError(f"--key {name!r} is not one of the derived columns: {', '.join(columns)}")
    doc = {"table": table, "create_table": True, "value_format": fmt}
    if key:
        doc |= {"mode": "upsert", "key": list(key)}
    return doc | {"columns": columns}


def to_toml(doc: dict) -> str:
    """The mapping as a TOML file (JSON's string escapes are TOML's basic strings')."""
    lines = []
    for name, value in doc.items():
        if name != "columns":
            lines.append(f"{name} = {json.dumps(value)}")
    lines.append("")
    lines.append("[columns]")
    for name, col in doc["columns"].items():
        lines.append(f'{name} = {{ type = {json.dumps(col["type"])}, from = {json.dumps(col["from"])} }}')
    return "\n".join(lines) + "\n"


def _avro_type(t, named: dict[str, str]) -> str:
    if isinstance(t, list):
        others = [x for x in t if x != "null"]
        return _avro_type(others[0], named) if len(others) == 1 else "jsonb"
    if isinstance(t, str):
        return _AVRO.get(t) or named.get(t) or named.get(t.rpartition(".")[2], "jsonb")
    logical, kind = t.get("logicalType"), t.get("type")
    if logical == "decimal" and "precision" in t:
        precision, scale = int(t["precision"]), int(t.get("scale", 0))
        # Postgres's numeric takes a precision of at most 1000; past it, numeric without one holds any value
        pg = f"numeric({precision},{scale})" if 1 <= precision <= 1000 and 0 <= scale <= precision else "numeric"
    elif logical in _AVRO_LOGICAL:
        pg = _AVRO_LOGICAL[logical]
    elif kind == "array":
        item = _avro_type(t.get("items"), named)
        pg = f"{item}[]" if item not in ("jsonb",) and not item.endswith("[]") else "jsonb"
    elif kind in ("record", "map"):
        pg = "jsonb"
    elif kind == "enum":
        pg = "text"
    elif kind == "fixed":
        pg = "bytea"
    else:
        pg = _avro_type(kind, named)
    if kind in ("record", "enum", "fixed") and "name" in t:
        named[t["name"]] = named[t["name"].rpartition(".")[2]] = pg
    return pg


def _proto_type(field) -> str:
    from google.protobuf.descriptor import FieldDescriptor as F

    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return "jsonb"
    if field.type == F.TYPE_MESSAGE:
        pg = "timestamptz" if field.message_type.full_name == "google.protobuf.Timestamp" else "jsonb"
    else:
        pg = {F.TYPE_DOUBLE: "double precision", F.TYPE_FLOAT: "real", F.TYPE_INT64: "bigint", F.TYPE_SINT64: "bigint",
              F.TYPE_SFIXED64: "bigint", F.TYPE_UINT64: "numeric(20,0)", F.TYPE_FIXED64: "numeric(20,0)",
              F.TYPE_INT32: "integer", F.TYPE_SINT32: "integer", F.TYPE_SFIXED32: "integer", F.TYPE_UINT32: "bigint",
              F.TYPE_FIXED32: "bigint", F.TYPE_BOOL: "boolean", F.TYPE_STRING: "text", F.TYPE_BYTES: "bytea",
              F.TYPE_ENUM: "text"}.get(field.type, "jsonb")
    repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == F.LABEL_REPEATED
    if repeated:
        return "jsonb" if pg == "jsonb" else f"{pg}[]"
    return pg


def _json_type(spec) -> str:
    if not isinstance(spec, dict):
        return "jsonb"
    kind = spec.get("type")
    if isinstance(kind, list):
        others = [k for k in kind if k != "null"]
        kind = others[0] if len(others) == 1 else None
    if kind == "string" and spec.get("format") in _JSON_FORMATS:
        return _JSON_FORMATS[spec["format"]]
    if kind == "array":
        item = _json_type(spec.get("items", {}))
        return "jsonb" if item == "jsonb" or item.endswith("[]") else f"{item}[]"
    return _JSON.get(kind, "jsonb")

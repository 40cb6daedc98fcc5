"""A typed sink's mapping made from the Schema Registry schema a record names (issue 47).

A record in Avro, Protobuf or JSON Schema carries its writer schema's id in its 5-byte header
(:mod:`kdg.schemas.wire`). The registry gives that schema's text (kept per id by
:class:`kdg.schemas.registry.Registry`), and its top-level fields become columns read by ``json:FIELD`` with
the types ``kdg mapping from-schema`` gives them: one converter, :func:`kdg.schemas.derive.schema_columns`,
whose columns are made once per schema. Under ``envelope = "debezium"`` (Avro, as Confluent's AvroConverter
writes Debezium's events) the row is the envelope's ``after`` record (else ``before``'s, which Debezium defines
first and ``after`` names). A key in a registry format whose schema is a record gives the key: its fields, read
by ``key:FIELD`` where the row lacks them, become the mapping's key (the table's primary key when it is made).

A value that is not in the wire format, or names an id the registry does not know (or of another format),
gives None: its decoding says why, record by record, and sends it to the dead-letter topic.
"""

import functools
import json

from kdg.errors import UsageError
from kdg.mapping.spec import Column, Mapping, make_column
from kdg.schemas.derive import schema_columns
from kdg.schemas.formats import REGISTRY_TYPE, SCHEMA_FORMATS
from kdg.settings import TableName

_ROWS = ("after", "before")  # a change event's row fields: the same record, either present


def mapping_from_registry(value: bytes | None, key: bytes | None, base: Mapping, table: TableName, registry):
    """:func:`kdg.mapping.from_record.mapping_from_record` of a record in a registry format (``registry``: the
    client its schemas are read with); None when the value names no schema the registry has."""
    from kdg.mapping.from_record import made_mapping

    if registry is None:
        raise UsageError(f"columns from the record's schema: value_format {base.value_format} needs the Schema "
                         "Registry the records' schemas are in")
    text = _row_text(_registered(value, base.value_format, registry), base)
    if text is None:
        return None
    columns = dict(registered_columns(text, base.value_format, "json"))
    key_text = _registered(key, base.key_format, registry) if base.key_format in SCHEMA_FORMATS else None
    key_columns = _key_columns(key_text, base.key_format) if key_text is not None else {}
    # without the envelope a tombstone deleting the row has no value: its key's fields are read from the key
    tombstones = base.on_tombstone == "delete" and base.envelope != "debezium"
    for name, column in key_columns.items():
        if name not in columns or tombstones:
            columns[name] = column
    return made_mapping(base, table, tuple(columns.values()), tuple(key_columns) or base.key)


def optional_registry_columns(value: bytes | None, envelope: str, fmt: str, registry) -> set:
    """The columns whose fields the registry schema ``value`` names lets be null (an Avro union with null, a JSON
    Schema property not required)."""
    from kdg.mapping.preview import optional_fields

    text = _registered(value, fmt, registry) if registry is not None else None
    if text is not None and envelope == "debezium":
        text = _debezium_row(text) if fmt == "avro" else None
    return optional_fields(text, fmt) if text is not None else set()


@functools.lru_cache(maxsize=64)
def registered_columns(text: str, fmt: str, kind: str) -> tuple[tuple[str, Column], ...]:
    """``(name, column)`` of each top-level field of a registry schema, made once per schema (the same id is the
    same text): :func:`kdg.schemas.derive.schema_columns`, as ``kdg mapping from-schema`` derives them."""
    return tuple((name, make_column(name, c["type"], c["from"])) for name, c in schema_columns(text, fmt, kind).items())


def _row_text(text: str | None, base: Mapping) -> str | None:
    """The schema whose fields are the row: the value's, or under the envelope its change event's row."""
    if text is None or base.envelope != "debezium":
        return text
    if base.value_format != "avro":
        raise UsageError(f"columns from the record's schema: a Debezium change event in {base.value_format} is not "
                         "read for its row's schema; use Avro or Kafka Connect's JsonConverter, or derive the "
                         "mapping with `kdg mapping from-schema SUBJECT`")
    return _debezium_row(text)


@functools.lru_cache(maxsize=64)
def _debezium_row(text: str) -> str | None:
    """The row record of a Debezium envelope's Avro schema, as schema text (``after``'s, resolved where it names
    the record ``before`` defines); None where the envelope has no row (a heartbeat's, a schema-change event's)."""
    envelope = json.loads(text)
    if not isinstance(envelope, dict) or envelope.get("type") != "record":
        return None
    named: dict = {}
    _collect_named(envelope, envelope.get("namespace"), named)
    fields = {f.get("name"): f.get("type") for f in envelope.get("fields") or () if isinstance(f, dict)}
    for row in _ROWS:
        kind = fields.get(row)
        branches = [b for b in (kind if isinstance(kind, list) else [kind]) if b not in ("null", None)]
        found = named.get(branches[0], branches[0]) if len(branches) == 1 and isinstance(branches[0], str) else \
            branches[0] if len(branches) == 1 else None
        if isinstance(found, dict) and found.get("type") == "record":
            return json.dumps(found)
    return None


def _collect_named(schema, namespace: str | None, named: dict) -> None:
    """Every named type defined in ``schema``, by its short and its full name."""
    if isinstance(schema, list):
        for branch in schema:
            _collect_named(branch, namespace, named)
        return
    if not isinstance(schema, dict):
        return
    kind, name = schema.get("type"), schema.get("name")
    if kind in ("record", "enum", "fixed") and isinstance(name, str):
        namespace = schema.get("namespace", namespace)
        full = name if "." in name or not namespace else f"{namespace}.{name}"
        named[full] = named[full.rpartition(".")[2]] = schema
    for field in schema.get("fields") or () if kind == "record" else ():
        if isinstance(field, dict):
            _collect_named(field.get("type"), namespace, named)
    for inner in ("items", "values"):
        if inner in schema:
            _collect_named(schema[inner], namespace, named)
    if isinstance(kind, (dict, list)):
        _collect_named(kind, namespace, named)


def _key_columns(text: str, fmt: str) -> dict:
    """The key's fields as columns (read by ``key:FIELD``), where its schema is a record; else none."""
    try:
        return dict(registered_columns(text, fmt, "key"))
    except UsageError:  # a key schema that is no record (a string, a long): the mapping's key stays
        return {}


def _registered(data: bytes | None, fmt: str, registry) -> str | None:
    """The text of the registry schema ``data`` names by its id; None where it names none the registry has in
    ``fmt`` (the record's decoding then says why it cannot be read)."""
    from kdg.mapping.from_record import schema_head

    if schema_head(data, fmt) is None:
        return None
    schema_id = int.from_bytes(data[1:5], "big")
    try:
        text, schema_type = registry.schema(schema_id)
    except ValueError:  # an id the registry does not know
        return None
    # a registry that leaves schemaType out means AVRO (as the decoder reads it, kdg.schemas.codecs)
    return None if schema_type and schema_type.upper() not in (REGISTRY_TYPE[fmt], "AVRO") else text

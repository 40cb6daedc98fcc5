"""Where a record's Connect schema is found, and a field's schema in it.

Kafka Connect's JsonConverter (``schemas.enable=true``) wraps each key and value as ``{"schema", "payload"}``:
:class:`ConnectJson` reads such JSON with each schema's text parsed once (the schema is most of such a
record's bytes), and names the schema by that text, so that what is made from it is made once. Confluent's
AvroConverter keeps each Connect name in the Avro schema (``connect.name``): :func:`from_avro` gives the Avro
writer schema the Connect shape. :func:`field_schema` finds a field's schema along a source's path; what its
logical type becomes is :mod:`kdg.mapping.connect`'s part.
"""

import json
import re

from kdg.mapping.sources import parse_json


def field_schema(schema, path: tuple[str, ...]):
    """The Connect schema of the field at ``path`` in a value of ``schema`` (struct fields, array items, map
    values); None where the schema does not say."""
    for token in path:
        if type(schema) is not dict:
            return None
        kind = schema.get("type")
        if kind == "struct":
            schema = next((f for f in schema.get("fields") or () if type(f) is dict and f.get("field") == token),
                          None)
        elif kind == "array" and token.isdigit():
            schema = schema.get("items")
        elif kind == "map":
            schema = schema.get("values")
        else:
            return None
    return schema


def envelope_field(schema, name: str):
    """The schema of a Debezium envelope's ``after``, ``before`` or ``source`` field."""
    return field_schema(schema, (name,))


_AVRO_TYPES = {"int": "int32", "long": "int64", "float": "float32", "double": "float64", "boolean": "boolean",
               "string": "string", "enum": "string", "bytes": "avro-bytes", "fixed": "avro-bytes", "null": "null"}


def from_avro(schema) -> dict | None:
    """An Avro schema (fastavro's parsed form) as the Connect schema it was made from: Confluent's AvroConverter
    keeps each type's Connect name in ``connect.name`` (and ``connect.parameters``). A type Avro decodes itself
    (a ``logicalType``: Connect's Decimal, Date, Time, Timestamp) needs nothing more, so has no name here; bytes
    arrive as bytes, not base64, so they are not Connect's plain ``bytes``."""
    named = schema.get("__named_schemas", {}) if type(schema) is dict else {}
    return _connect_of(schema, named, frozenset())


def _connect_of(schema, named: dict, seen: frozenset):
    if type(schema) is list:  # a union: the one branch that is not null, if there is one
        branches = [b for b in schema if b != "null"]
        return _connect_of(branches[0], named, seen) if len(branches) == 1 else None
    if type(schema) is str:
        if schema in named:
            return None if schema in seen else _connect_of(named[schema], named, seen | {schema})
        return {"type": _AVRO_TYPES.get(schema, schema)}
    if type(schema) is not dict:
        return None
    kind = schema.get("type")
    if type(kind) in (dict, list):
        return _connect_of(kind, named, seen)
    if kind == "record":
        inner = seen | {schema.get("name")}
        found = {"type": "struct", "fields": [{**(_connect_of(f.get("type"), named, inner) or {}), "field": f.get("name")}
                                              for f in schema.get("fields") or ()]}
    elif kind == "array":
        found = {"type": "array", "items": _connect_of(schema.get("items"), named, seen)}
    elif kind == "map":
        found = {"type": "map", "values": _connect_of(schema.get("values"), named, seen)}
    else:
        found = {"type": _AVRO_TYPES.get(kind, kind)}
    if schema.get("connect.name") and "logicalType" not in schema:
        found.update(name=schema["connect.name"], parameters=schema.get("connect.parameters") or {})
    return found


def is_wrapped(doc) -> bool:
    """Whether ``doc`` is Kafka Connect's JsonConverter ``{"schema", "payload"}``."""
    return type(doc) is dict and len(doc) == 2 and "payload" in doc and type(doc.get("schema")) is dict


_HEAD = re.compile(rb'\s*\{\s*"schema"\s*:\s*')
_WS = b" \t\r\n"


def split_envelope(data: bytes) -> tuple[int, int, int] | None:
    """Where the schema's text starts and ends, and the payload's starts, in JsonConverter's
    ``{"schema": S, "payload": P}`` (found with ``bytes.find``, no parsing); None for any other layout."""
    head = _HEAD.match(data)
    if head is None:
        return None
    start, size = head.end(), len(data)
    at = data.find(b'"payload"', start)
    while at > 0:
        comma = at - 1
        while data[comma] in _WS:
            comma -= 1
        colon = at + 9
        while colon < size and data[colon] in _WS:
            colon += 1
        if data[comma] == 44 and colon < size and data[colon] == 58:  # ',' before it and ':' after: a key
            return start, comma, colon + 1
        at = data.find(b'"payload"', at + 9)
    return None


class ConnectJson:
    """JSON values (or keys), JsonConverter's ``{"schema", "payload"}`` among them, read with each schema's
    text parsed once: ``read(data)`` → ``(doc, schema_id)``, where ``schema_id`` names the schema (the same text,
    the same id; None: not wrapped), for caching what is made from it."""

    LIMIT = 64  # schemas kept; a topic has a few at a time (one per table version)

    def __init__(self):
        self._known: dict[bytes, dict] = {}

    def read(self, data) -> tuple:
        if type(data) is str:
            data = data.encode("utf-8")
        if data.find(b'"schema"', 0, 32) < 0:  # not wrapped (the common case): no more looking
            doc = parse_json(data)
            return doc, None if not is_wrapped(doc) else self._named(doc)
        found = split_envelope(data)
        text = data[found[0]:found[1]].rstrip() if found else None
        schema = self._known.get(text) if text is not None else None
        if schema is not None:
            end = data.rstrip()
            if end.endswith(b"}"):
                try:
                    return {"schema": schema, "payload": parse_json(end[found[2]:-1])}, text
                except ValueError:  # not the shape it looked like: read it whole
                    pass
        doc = parse_json(data)
        if not is_wrapped(doc):
            return doc, None
        try:
            seen = text is not None and parse_json(text) == doc["schema"]
        except ValueError:
            seen = False
        if not seen:
            return doc, self._named(doc)
        if len(self._known) >= self.LIMIT:
            self._known.clear()
        self._known[text] = doc["schema"]
        return doc, text

    def known(self, text: bytes) -> dict:
        """The schema whose text :meth:`read` named ``text`` (parsed again if it was let go since)."""
        schema = self._known.get(text)
        return schema if schema is not None else parse_json(text)

    @staticmethod
    def _named(doc: dict) -> bytes:
        """A wrapper in another layout (``payload`` first): its schema's own JSON names it."""
        return json.dumps(doc["schema"], sort_keys=True, default=str).encode()

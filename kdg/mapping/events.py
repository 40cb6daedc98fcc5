"""What a record's sources read: its value's document, its key's, a change event's row, and their Connect types.

Under ``--envelope debezium`` each value is a change event (bare, or in JsonConverter's ``{"schema",
"payload"}``), and ``json:`` reads its row: ``after`` for a create, update or snapshot read (op c, u, r),
``before`` for a delete (op d). A delete whose ``before`` is null (``REPLICA IDENTITY NOTHING``) and a
tombstone have no row in the value: theirs is the record key (Debezium's key is the row's primary key).
``source:`` reads the event's ``source`` block, ``envelope:`` the whole event. A truncate (op t) has no row;
nor have the events of Debezium's heartbeat and schema-change topics, which carry no op: each is told apart by
:attr:`Document.control` (``truncate``, ``heartbeat``, ``schema change``). The typed sink's columns
(:class:`kdg.mapping.rows.RowMaker`) and ``--id-from`` (:class:`kdg.keys.KeyResolver`) read them through
one :class:`RecordReader`, so a key and a column read the same field the same way.

Where the record carries its schema (JsonConverter's), each field's Connect logical type is decoded for its
column (:mod:`kdg.mapping.connect`), by a plan made once per schema (:mod:`kdg.mapping.record_schemas`).
"""

import functools
import re
from typing import NamedTuple

from kdg.mapping.connect import converter
from kdg.mapping.record_schemas import ConnectJson, envelope_field, field_schema, from_avro, is_wrapped
from kdg.mapping.sources import as_text, json_text, parse_json

UPSERTS = frozenset(("c", "u", "r"))  # Debezium's create, update, read (snapshot): the row is `after`
TRUNCATE, HEARTBEAT, SCHEMA_CHANGE = "truncate", "heartbeat", "schema change"  # Document.control
_NO_PLAN = object()


class Document(NamedTuple):
    """One record as its sources see it."""

    deleted: bool      # a change event's delete (op d) or, under an envelope, a tombstone
    row: object        # what json: reads
    event: object      # the change event (source:, envelope:)
    key_doc: object    # the record key as JSON (key:FIELD)
    plan: tuple | None  # per source, its reader decoding the Connect types the schema names (None: none do)
    row_from_key: bool = False  # a delete without before, or a tombstone: the row is the record key
    control: str | None = None  # not a row's change: a truncate (op t), a heartbeat or a schema-change event


_NOTHING = Document(False, None, None, None, None)
_document = functools.partial(tuple.__new__, Document)  # Document(...) without its Python-level __new__


class RecordReader:
    """Reads ``sources`` (going to columns of ``types``; None: text) from records.

    ``decode_value``/``decode_key``: a schema'd format's decoder (:mod:`kdg.schemas.codecs`), or None for
    JSON; ``value_bad``/``key_bad``: what their errors are prefixed with.
    """

    def __init__(self, sources, types, *, envelope: str = "none", decode_value=None, decode_key=None,
                 value_bad: str = "bad JSON: ", key_bad: str = "bad JSON in the record key: "):
        self.sources, self.types = tuple(sources), tuple(types)
        self.cdc = envelope == "debezium"
        self._reads_value = self.cdc or any(s.kind in ("value", "source", "envelope") for s in self.sources)
        self._reads_key = any(s.kind == "key" for s in self.sources)
        self._value_json, self._key_json = ConnectJson(), ConnectJson()
        self._decode_value, self._decode_key = decode_value, decode_key
        self._value_bad, self._key_bad = value_bad, key_bad
        self._plans: dict = {}
        self._avro: dict = {}  # per schema id: its Connect schema (from_avro)
        self._plain = not self.cdc and self._reads_value and not self._reads_key and decode_value is None
        self._raw = tuple(_raw_reader(s, t) for s, t in zip(self.sources, self.types))
        self._readers = tuple(_reader(s, raw, _text(s, t)) for raw, s, t in zip(self._raw, self.sources, self.types))

    @property
    def json_values(self) -> bool:
        """Whether values are JSON (JsonConverter's wrapper among them) and no ``key:`` source reads the key:
        what :class:`~kdg.mapping.batch_read.BatchReader` may read a batch at a time."""
        return self._reads_value and self._decode_value is None and not self._reads_key

    @property
    def readers(self) -> tuple:
        """Per source, ``read(rec, key, row, key_doc, event)`` → its column's text, no schema's types decoded."""
        return self._readers

    @property
    def value_json(self) -> ConnectJson:
        return self._value_json

    def value_texts(self, schema, columns: list[int]) -> list:
        """For each source of ``columns`` (``json:`` and ``source:`` sources), value → its column's text: a Connect
        logical type decoded where ``schema`` (a JsonConverter value's schema; None: none) names one, as
        :meth:`_plan` has it (under the envelope, the schemas of the event's ``after`` and ``source``)."""
        roots = {} if schema is None else {"value": _wrapper(schema)} if not self.cdc else {
            "value": envelope_field(schema, "after"), "source": envelope_field(schema, "source")}
        found = []
        for i in columns:
            source, column_type = self.sources[i], self.types[i]
            root = roots.get(source.kind)
            convert = converter(field_schema(root, source.path), column_type) if root is not None else None
            found.append(convert if convert is not None else _text(source, column_type))
        return found

    def document(self, rec) -> Document:
        """What ``rec``'s sources read; ValueError (the record's dead letter) if its value or key cannot be read,
        or is not a change event under the envelope."""
        tomb = rec.value is None
        if rec.row is not None:  # a transform's row: already decoded
            return self._derived(rec)
        if not self.cdc:
            if self._plain:  # JSON values, no key: sources: the common case, kept short
                if tomb:
                    return _NOTHING
                try:
                    if rec.value.find(b'"schema"', 0, 32) < 0:  # not JsonConverter's (its schema comes first)
                        return _document((False, parse_json(rec.value), None, None, None, False, None))
                    row, vid = self._value_json.read(rec.value)
                except ValueError as exc:
                    raise ValueError(f"{self._value_bad}{exc}") from None
                if vid is None:
                    return Document(False, row, None, None, None)
                vschema = _wrapper(row["schema"])
            else:
                row, vid, vschema = self._value(rec) if self._reads_value and not tomb else (None, None, None)
            key_doc, kid, kschema = self._key(rec) if self._reads_key else (None, None, None)
            if vid is None and kid is None:
                return Document(False, row, None, key_doc, None)
            plan = self._plan((vid, None, kid), lambda: {"value": vschema, "key": kschema})
            return Document(False, row, None, key_doc, plan)
        event, vid, vschema = (None, None, None) if tomb else self._value(rec, unwrap=True)
        deleted, field = tomb, "key"
        if not tomb:
            op = event.get("op") if type(event) is dict else None
            if op in UPSERTS:
                field = "after"
                if type(event.get("after")) is not dict:
                    raise ValueError(f"a Debezium change event (op {op}) without an after row")
            elif op == "d":
                deleted, field = True, "before" if type(event.get("before")) is dict else "key"
            elif op == "t":
                return Document(False, None, event, None, None, False, TRUNCATE)
            elif op is None:
                control = control_event(event, rec)
                if control is None:
                    raise ValueError("not a Debezium change event: no op (with --envelope debezium)")
                return Document(False, None, event, None, None, False, control)
            else:
                raise ValueError(f"a Debezium change event with op {op!r}: only c, u, r, d and t are read")
        key_doc, kid, kschema = (None, None, None)
        if self._reads_key or field == "key":
            try:
                key_doc, kid, kschema = self._key(rec, unwrap=True)
            except ValueError:
                if self._reads_key:
                    raise
        row = key_doc if field == "key" else event[field]
        if vid is None and kid is None:
            return Document(deleted, row, event, key_doc, None, field == "key")

        def roots() -> dict:
            return {"value": kschema if field == "key" else envelope_field(vschema, field), "key": kschema,
                    "source": envelope_field(vschema, "source"), "envelope": vschema}
        return Document(deleted, row, event, key_doc, self._plan((vid, field, kid), roots), field == "key")

    def _derived(self, rec) -> Document:
        """A transform's row (``rec.row``, :mod:`kdg.flow.transform`): what ``json:`` reads; under the debezium
        envelope, the change event the transform returned."""
        key_doc = self._key(rec)[0] if self._reads_key and rec.key is not None else None
        if not self.cdc:
            return _document((False, rec.row, None, key_doc, None, False, None))
        event, op = rec.row, rec.row.get("op")
        if op in UPSERTS and type(event.get("after")) is dict:
            return Document(False, event["after"], event, key_doc, None)
        if op == "d" and type(event.get("before")) is dict:
            return Document(True, event["before"], event, key_doc, None)
        raise ValueError(f"the transform returned no Debezium change event (op {op!r} with its row)")

    def texts(self, rec, key, doc: Document, names) -> list:
        """The text of each source for ``rec`` (``key``: its idempotency key); a value its column cannot take
        is a ValueError naming the column (``names``)."""
        row, key_doc, event = doc.row, doc.key_doc, doc.event
        readers = self._readers if doc.plan is None else doc.plan
        try:
            return [read(rec, key, row, key_doc, event) for read in readers]
        except ValueError:  # said again source by source, to name the column that cannot take its value
            for read, name in zip(readers, names):
                try:
                    read(rec, key, row, key_doc, event)
                except ValueError as exc:
                    raise ValueError(f"{name}: {exc}") from None
            raise

    def _value(self, rec, unwrap: bool = False) -> tuple:
        """``(document, schema id, its schema)`` of the value: Connect's wrapper taken off when ``unwrap``."""
        return self._read(rec.value, self._decode_value, self._value_json, self._value_bad, unwrap)

    def _key(self, rec, unwrap: bool = False) -> tuple:
        return self._read(rec.key, self._decode_key, self._key_json, self._key_bad, unwrap)

    def _read(self, data, decode, connect_json: ConnectJson, bad: str, unwrap: bool) -> tuple:
        if data is None:
            return None, None, None
        try:
            if decode is None:
                doc, sid = connect_json.read(data)
            else:
                doc, sid = decode(data), None
        except ValueError as exc:
            raise ValueError(f"{bad}{exc}") from None
        if sid is not None:  # JsonConverter's wrapper
            if unwrap:
                return doc["payload"], sid, doc["schema"]
            return doc, sid, _wrapper(doc["schema"])  # read as it is: json:/payload/FIELD
        writer = getattr(decode, "writer_schema", None)
        found = writer(data) if writer is not None else None
        if found is None:
            return (doc["payload"] if unwrap and is_wrapped(doc) else doc), None, None
        sid = ("avro", found[0])
        schema = self._avro.get(sid)
        if schema is None:
            schema = self._avro[sid] = from_avro(found[1])
        return doc, sid, schema

    def _plan(self, ident: tuple, roots):
        """The readers for the schemas ``ident`` names, made once (``roots()``: each source kind's schema)."""
        plan = self._plans.get(ident, _NO_PLAN)
        if plan is _NO_PLAN:
            if len(self._plans) >= 256:
                self._plans.clear()
            found = roots()
            converters = [converter(field_schema(found.get(s.kind), s.path), t) if s.kind in _ROOTS else None
                          for s, t in zip(self.sources, self.types)]
            plan = self._plans[ident] = None if not any(converters) else tuple(
                read if convert is None else _reader(source, raw, convert)
                for source, raw, read, convert in zip(self.sources, self._raw, self._readers, converters))
        return plan


_ROOTS = ("value", "key", "source", "envelope")  # the source kinds a schema may describe
HEARTBEAT_TOPIC = "__debezium-heartbeat"  # Debezium's topic.heartbeat.prefix, by default
_HEARTBEAT_KEY = b'"serverName"'  # a heartbeat's key: {"serverName": topic.prefix}


def control_event(event, rec=None) -> str | None:
    """What a Debezium event without an op is: ``heartbeat`` (``{"ts_ms"}`` alone, on a heartbeat topic or
    keyed by the connector's server name), ``schema change`` (its ``ddl`` or ``tableChanges``), or None: not
    Debezium's. Neither is a row's change; a typed route skips them and counts them."""
    if type(event) is not dict:
        return None
    if "ddl" in event or "tableChanges" in event:
        return SCHEMA_CHANGE
    if set(event) <= {"ts_ms"} and event and rec is not None and (
            rec.topic.startswith(HEARTBEAT_TOPIC) or (rec.key is not None and _HEARTBEAT_KEY in rec.key)):
        return HEARTBEAT
    return None


def _wrapper(schema):
    """Without an envelope a wrapped value is read as it is (``json:/payload/FIELD``): its schema seen so."""
    return None if schema is None else {"type": "struct", "fields": [{**schema, "field": "payload"}]}


def _raw_reader(source, column_type):
    """``read(rec, key, row, key_doc, event)`` → the source's value as found (a top-level field without the
    general path walk: the common case, once per record and column)."""
    if column_type is not None and column_type.base == "bytea" and source.kind in ("key_text", "header"):
        raw = source.raw  # the bytes, in bytea's hex form: as UTF-8 text, any other byte would become U+FFFD
        return lambda rec, key, row, key_doc, event: raw(rec)
    if source.kind == "value" and not source.pointer:
        name = source.path[0]
        return lambda rec, key, row, key_doc, event: row.get(name) if type(row) is dict else None
    return source.read


def _text(source, column_type):
    """How a found value becomes its column's text: JSON text for json and jsonb, digits as epoch milliseconds
    for timestamps and dates (:func:`dated_text`), else :func:`kdg.mapping.sources.as_text`."""
    if column_type is None:
        return as_text
    if column_type.reads_json:
        return json_text
    if column_type.reads_epoch and source.kind in ("value", "key", "source", "envelope"):
        return dated_text
    return as_text


def _reader(source, raw, text):
    """``read(rec, key, row, key_doc, event)`` → the column's text: ``text`` of what ``raw`` finds, in one call
    for a top-level field (the common case, once per record and column)."""
    if source.kind == "value" and not source.pointer:
        name = source.path[0]
        return lambda rec, key, row, key_doc, event: text(row.get(name) if type(row) is dict else None)
    return lambda rec, key, row, key_doc, event: text(raw(rec, key, row, key_doc, event))


_BASIC_DATE = re.compile(r"[0-9]{8}").fullmatch  # ISO 8601's basic date, YYYYMMDD


def dated_text(value) -> str | None:
    """:func:`as_text` for a timestamptz, timestamp or date column. Digits alone are epoch milliseconds (a JSON
    number, or a string: producers that write 64-bit numbers as strings), except a JSON string of exactly 8
    digits, ISO 8601's basic date (``"20240229"``; as epoch milliseconds, 2 hours into 1970): it is staged with
    a leading space, which the cast's epoch test does not pass and Postgres's date input skips, so Postgres
    reads it as 2024-02-29, or refuses it and the row is dead-lettered with Postgres's reason."""
    if type(value) is str:
        return " " + value if _BASIC_DATE(value) else value
    return as_text(value)

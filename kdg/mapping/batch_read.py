"""A batch of JSON values read column by column: one decode of the whole batch into only the mapped fields.

The row maker reads a record at a time (:class:`~kdg.mapping.events.RecordReader`): parse the value, walk to
each field, turn it into its column's text. For the common batch — plain JSON values, or Kafka Connect
JsonConverter's ``{"schema", "payload"}`` with one schema, every ``json:`` source a top-level field of the
row (``json:id``, or ``json:/payload/id`` in the wrapper), no tombstone; or, under ``--envelope debezium``,
change events that all create, update or snapshot a row (op c, u or r), ``json:`` sources fields of their
``after`` and ``source:`` ones of their ``source`` block — :class:`BatchReader` does the same work a column at
a time:

1. the values are joined into one JSON array (for wrapped values: each payload, cut after the schema's text,
   which every record repeats and none is parsed for) and msgspec decodes it at once into a struct that holds
   only the mapped fields; the other fields are skipped unparsed;
2. each column is taken from the structs in C, and turned into its text by the same function the record
   reader uses for that source and that schema (a Connect logical type decoded, or the value as it is);
3. the staged rows are zipped in C.

Anything else gives None, and the batch is read record by record as before, which says what is wrong with
each record: a value that is not an object, a lone UTF-16 surrogate, a text Postgres cannot hold, a value its
column refuses, a tombstone, a transform's row, another layout or a second schema in the batch, a delete, a
truncate, a heartbeat, Debezium's unavailable-value placeholder. The two reads
give the same rows (``tests/test_batch_read.py`` holds them against each other).
"""

from itertools import repeat
from operator import attrgetter, getitem, itemgetter

import msgspec

from kdg.mapping.events import UPSERTS
from kdg.mapping.record_schemas import split_envelope
from kdg.mapping.sources import JsonNumber, as_text, json_number, plain_text, storable
from kdg.records import RecordColumns

_VALUE = attrgetter("value")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_TOPIC, _PARTITION, _OFFSET, _ROW = attrgetter("topic"), attrgetter("partition"), attrgetter("offset"), attrgetter("row")
_OP, _AFTER, _SOURCE = attrgetter("op"), attrgetter("after"), attrgetter("source")
_BRACE = ord("}")
LIMIT = 64  # schemas (and their decoders) kept, as ConnectJson keeps them


class BatchReader:
    """Reads batches for one :class:`~kdg.mapping.events.RecordReader` (``reader``) whose sources are ``json:``
    (and, under the envelope, ``source:``) fields and the record's own facts (``offset``, ``header:NAME``,
    ``key``, …), which are read per record as before; see :meth:`able`. A text Postgres cannot hold
    (:func:`~kdg.mapping.sources.storable`, the row maker's own test) sends the batch record by record;
    ``placeholders``: Debezium's unavailable-value marks,
    whose batches are read record by record."""

    def __init__(self, reader, jsonb: list[bool], placeholders: tuple[bytes, ...] = ()):
        self._reader, self._jsonb, self._marks = reader, jsonb, placeholders
        self._cdc = reader.cdc
        sources = reader.sources
        self._value_cols = [i for i, s in enumerate(sources) if s.kind in ("value", "source")]
        self._other_cols = [i for i, s in enumerate(sources) if s.kind not in ("value", "source")]
        values = [sources[i].path for i in self._value_cols if sources[i].kind == "value"]
        self._plain = all(len(p) == 1 for p in values)
        self._wrapped = all(len(p) == 2 and p[0] == "payload" for p in values)
        row, take_row = _fields("Row", [p[-1] for p in values])
        block, take_block = _fields("Source", [sources[i].path[0] for i in self._value_cols
                                               if sources[i].kind == "source"])
        # per value column: (which struct of the event, the field's getter)
        rows, blocks = iter(take_row), iter(take_block)
        self._take = [("after", next(rows)) if sources[i].kind == "value" else ("source", next(blocks))
                      for i in self._value_cols]
        # numbers with a fraction kept as their text (_NUMBER), unless a jsonb column would have its objects
        # walked to make them JsonNumbers after: then the decoder makes JsonNumbers, as it always did
        self._lazy = not any(jsonb[i] for i in self._value_cols)
        number = _number if self._lazy else json_number
        if self._cdc:
            event = msgspec.defstruct("Event", [("op", object, None), ("after", row | None, None),
                                                ("source", block | None, None)], gc=False)
            self._decode = msgspec.json.Decoder(list[event], float_hook=number).decode
        else:
            self._decode = msgspec.json.Decoder(list[row], float_hook=number).decode
        self._reads_source = bool(take_block)
        self._texts: dict = {}  # schema text (b"" for plain values) → per value column, value → its text
        self._prefixes: dict[bytes, bytes] = {}  # a wrapped value's bytes before its payload → its schema text

    @staticmethod
    def able(reader) -> bool:
        """Whether ``reader``'s batches may be read column by column: JSON values (no registry format, no
        ``key:`` field), at least one ``json:`` source, each a top-level field of the row (or, not under an
        envelope, each ``/payload/FIELD``); under the Debezium envelope, ``source:`` fields of the source block too."""
        sources = reader.sources
        values = [s for s in sources if s.kind == "value"]
        if not (reader.json_values and values) or any(s.kind in ("key", "envelope") for s in sources):
            return False
        if reader.cdc:
            return all(len(s.path) == 1 for s in sources if s.kind in ("value", "source"))
        return not any(s.kind == "source" for s in sources) and (
            all(len(s.path) == 1 for s in values) or all(len(s.path) == 2 and s.path[0] == "payload" for s in values))

    def rows(self, records) -> list[tuple] | None:
        """The staged rows ``(seq, key, topic, partition, offset, False, *texts)`` of ``records`` (``(record,
        key)`` pairs), or None: read them record by record."""
        if not records:
            return None
        given = RecordColumns.of(records)
        if given is not None:  # no transform's rows among them
            values, keys, topics = given.values, given.ids, given.topics
            partitions, offsets = given.partitions, given.offsets
        else:
            recs = list(map(_FIRST, records))
            if any(map(_ROW, recs)):  # a transform's rows: already decoded
                return None
            values, keys, topics = list(map(_VALUE, recs)), list(map(_SECOND, records)), list(map(_TOPIC, recs))
            partitions, offsets = list(map(_PARTITION, recs)), list(map(_OFFSET, recs))
        if None in values:  # a tombstone
            return None
        found = self._layout(values)
        if found is None:
            return None
        body, schema = found
        if self._cdc and any(mark in body for mark in self._marks):
            return None  # a placeholder keeps its column's value: said record by record
        try:
            structs = self._decode(body)
        except (msgspec.DecodeError, RecursionError):
            return None
        if len(structs) != len(values):  # (cannot be, short of a payload that closed the array itself)
            return None
        parts = {"after": structs}
        if self._cdc:  # change events: each must create, update or read a row
            if not set(map(_OP, structs)) <= UPSERTS:
                return None
            parts = {"after": list(map(_AFTER, structs)), "source": list(map(_SOURCE, structs))}
            if None in parts["after"] or (None in parts["source"] and self._reads_source):
                return None
        texts = self._texts.get(schema)
        if texts is None:
            texts = self._column_texts(schema)
        columns: list = [None] * len(self._reader.sources)
        try:
            for i, (part, take), text in zip(self._value_cols, self._take, texts):
                columns[i] = _column(list(map(take, parts[part])), text, self._lazy)
            for i in self._other_cols:
                read = self._reader.readers[i]
                columns[i] = [read(rec, key, None, None, None) for rec, key in records]
        except ValueError:  # a value its column refuses: said record by record, with the column's name
            return None
        for i, column in enumerate(columns):
            if not self._holdable(column, self._jsonb[i]):
                return None
        n = len(values)
        return list(zip(range(n), keys, topics, partitions, offsets, repeat(False, n), *columns))

    def _layout(self, values: list[bytes]) -> tuple[bytes, bytes] | None:
        """``(the batch as one JSON array of rows, its schema's text)``: each plain value (schema text b""),
        or each wrapped value's payload when every value carries the same schema in JsonConverter's layout."""
        first = values[0]
        wrapped = first.find(b'"schema"', 0, 32) >= 0
        if not wrapped:
            if not self._plain or any(v.find(b'"schema"', 0, 32) >= 0 for v in values):
                return None
            return b"[" + b",".join(values) + b"]", b""
        if not self._wrapped and not self._cdc:
            return None
        split = split_envelope(first)
        if split is None:
            return None
        prefix = first[:split[2]]
        schema = self._prefixes.get(prefix)
        if schema is None:
            schema = self._schema_of(first, split)
            if schema is None:
                return None
            if len(self._prefixes) >= LIMIT:
                self._prefixes.clear()
            self._prefixes[prefix] = schema
        # (values are bytes, as Kafka's client and Arrow give them: bytes.startswith costs half a methodcaller; the
        # closing brace is each value's last byte counted, 0.05 µs a record where bytes.endswith took 0.2)
        if not all(map(bytes.startswith, values, repeat(prefix))):
            return None
        if list(map(getitem, values, repeat(-1))).count(_BRACE) != len(values):  # (none is empty: each has prefix)
            return None
        cut = len(prefix)
        return b"[" + b",".join([v[cut:-1] for v in values]) + b"]", schema

    def _schema_of(self, value: bytes, split) -> bytes | None:
        """The schema text of a wrapped ``value`` once its layout is confirmed (the reader's own JsonConverter
        reading agrees that the text cut out is its schema), else None."""
        try:
            doc, sid = self._reader.value_json.read(value)
        except ValueError:
            return None
        text = value[split[0]:split[1]].rstrip()
        return text if sid == text else None

    def _column_texts(self, schema: bytes) -> list:
        """Per value column, value → its text for ``schema`` (b"": none), as the record reader's plan has it."""
        if len(self._texts) >= LIMIT:
            self._texts.clear()
        parsed = self._reader.value_json.known(schema) if schema else None
        found = self._texts[schema] = self._reader.value_texts(parsed, self._value_cols)
        return found

    def _holdable(self, column: list, jsonb: bool) -> bool:
        """Whether Postgres can hold every text of ``column`` (a cheap look at the column's texts joined, then
        each suspect text as the row maker tests it)."""
        if plain_text("".join(filter(None, column))):
            return True
        return all(storable(v, jsonb) for v in column if v is not None and not plain_text(v))


# A JSON number with a fraction or an exponent as the batch's decode leaves it: its text as written, as bytes
# (msgspec's float_hook is str.encode). Nothing else a JSON decode gives is bytes, so the type says what it is;
# and bytes are not tracked by the garbage collector, where a str subclass was: made for every such number of a
# 10,000-record batch, that cost 0.5-0.9 µs a record in collections (the decode, measured on the Connect
# benchmark's records: 0.72-1.13 µs a record against 0.20). A column of them that becomes text is that text,
# any other is given JsonNumbers (:func:`_numbers`), as the record by record read makes them.
_NUMBER = bytes
_number = str.encode


_NONE = type(None)
_AS_THEY_ARE = {str, _NONE}
_NUMBERS_AS_TEXT = {_NUMBER, _NONE}
_HOLDING = {_NUMBER, dict, list}  # what is or may hold a number still to be made a JsonNumber
_NUMBER_TEXT = attrgetter("text")


def _numbers(value):
    """``value`` with each number's text in it (:data:`_NUMBER`) a :class:`~kdg.mapping.sources.JsonNumber`, as
    the record by record read makes it."""
    kind = type(value)
    if kind is _NUMBER:
        return json_number(value.decode())
    if kind is dict:
        return {k: _numbers(v) for k, v in value.items()}
    if kind is list:
        return list(map(_numbers, value))
    return value


def _column(values: list, text, lazy: bool = False) -> list:
    """``text`` of each of ``values``. Where ``text`` is :func:`~kdg.mapping.sources.as_text` and the column holds
    one kind of value, as it does a batch at a time, the texts are made in C: strings (and nulls) as they are,
    whole numbers by ``str``, other numbers by their own text, as ``as_text`` makes each (0.1 µs a value
    against its 0.5). A converter that makes a column's texts at once (``text.column``) does so. ``lazy``:
    numbers with a fraction come as their text's bytes (:data:`_NUMBER`); a column of them (and nulls) through
    ``as_text`` is their text, any other column gets JsonNumbers first, as the record by record read gives them."""
    kinds = set(map(type, values)) if lazy or text is as_text else None  # (a converter's column needs none)
    if lazy and kinds & _HOLDING:
        if text is as_text and kinds <= _NUMBERS_AS_TEXT:
            return list(map(bytes.decode, values)) if _NONE not in kinds else [
                None if v is None else v.decode() for v in values]
        values = list(map(_numbers, values))
        kinds = set(map(type, values)) if text is as_text else None
    column = getattr(text, "column", None)  # a converter's own column at a time (kdg.mapping.connect)
    if column is not None:
        found = column(values)
        if found is not None:
            return found
    if text is as_text:
        if kinds <= _AS_THEY_ARE:
            return values
        if kinds == {int}:
            return list(map(str, values))
        if kinds == {JsonNumber}:
            return list(map(_NUMBER_TEXT, values))
    return list(map(text, values))


def _fields(name: str, fields: list[str]):
    """A struct type holding only ``fields`` (each decoded as it is, None when missing), and a getter per field."""
    names = list(dict.fromkeys(fields))  # a field two columns read is decoded once
    struct = msgspec.defstruct(name, [(f"f{i}", object, None) for i in range(len(names))],
                               rename={f"f{i}": n for i, n in enumerate(names)}, gc=False)
    return struct, [attrgetter(f"f{names.index(f)}") for f in fields]

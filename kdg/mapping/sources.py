"""Where a column's value comes from: the SOURCE grammar, JSON Pointer, and values as text.

    json:FIELD          a top-level field of the JSON value, the name taken literally (dots included)
    json:/a/b           a JSON Pointer (RFC 6901) into the value: ``~1`` is ``/``, ``~0`` is ``~``
    key                 the record key as UTF-8 text (into bytea: its bytes as they are)
    key:FIELD, key:/p   the record key parsed as JSON, then a field or a pointer as above
    header:NAME         a header's value as UTF-8 text, the last header of that name (into bytea: its bytes)
    source:FIELD, source:/p       under ``--envelope debezium``: the change event's ``source`` block
    envelope:FIELD, envelope:/p   under ``--envelope debezium``: the whole change event (``envelope:op``)
    topic, partition, offset, timestamp, idempotency_key      the record's metadata

Under ``--envelope debezium`` ``json:`` reads the event's row (``after``; for a delete ``before``, or the
record key when ``before`` is null): see :mod:`kdg.mapping.events`.

A FIELD that begins with ``/`` is read as a pointer (``json:/~1x`` names a top-level field ``/x``).
A missing field, a JSON ``null``, a missing key or header: NULL. Values reach Postgres as text, and
Postgres casts them: JSON strings as they are, numbers and booleans as their JSON text (numbers
exactly as written: ``12.50`` stays ``12.50``, ``1e5`` stays ``1e5``), objects and arrays as JSON text.
JSON nested too deeply for Python's decoder is a ValueError, like any other JSON it cannot read.

Example:
    >>> parse_source("json:/customer/name").path
    ('customer', 'name')
"""

import json
import math
from dataclasses import dataclass
from datetime import date, datetime, time
from decimal import Decimal
from uuid import UUID

import msgspec

from kdg.errors import UsageError

METADATA = ("topic", "partition", "offset", "timestamp", "idempotency_key")
GRAMMAR = ("json:FIELD, json:/POINTER, key, key:FIELD, key:/POINTER, header:NAME, source:FIELD, envelope:FIELD, "
           "topic, partition, offset, timestamp or idempotency_key")
ENVELOPE_KINDS = ("source", "envelope")  # read a Debezium change event: only under --envelope debezium


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


class JsonNumber(Decimal):
    """A JSON number with a fraction or an exponent: a Decimal (exact, and a number to a JSON Schema) that keeps
    its text as written. A Decimal's own text changes it: ``1e5`` is ``1E+5``, ``0.0000001`` is ``1E-7``
    (which money refuses), ``100E-2`` is ``1.00``."""

    __slots__ = ("text",)

    def __str__(self) -> str:
        return self.text

    def __reduce__(self):  # a copy or a pickle is made as the decoder makes one: with its text
        return json_number, (self.text,)


def json_number(text: str) -> JsonNumber:
    """The JsonNumber of a number's ``text``: json's ``parse_float``, called per number of every record, so
    Decimal's own constructor and the text set after it (a ``__new__`` written in Python costs twice that)."""
    number = JsonNumber(text)
    number.text = text
    return number


def json_reader(number, constants: bool = False):
    """A reader of JSON documents (bytes or str) whose numbers with a fraction or exponent are ``number(text)``:
    msgspec reads each (a third of the standard library's time); what msgspec refuses is read again by the
    standard library, whose verdict and words stand. ``constants``: NaN and Infinity (which Python's json
    allows and msgspec does not) are taken as floats, else refused. RecursionError is the caller's to word."""
    fast = msgspec.json.Decoder(float_hook=number).decode
    slow = json.JSONDecoder(parse_float=number, **({} if constants else {"parse_constant": _reject_constant})).decode

    def read(data):
        try:
            return fast(data)
        except (ValueError, RecursionError):
            pass
        return slow(data.decode("utf-8") if isinstance(data, bytes) else data)
    return read


# numbers with a fraction or exponent keep their text as written; NaN and Infinity are refused
_read_json = json_reader(json_number)
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


@dataclass(frozen=True)
class Source:
    """One parsed SOURCE. ``kind``: ``value`` or ``key`` (JSON of either), ``source`` or ``envelope`` (of a change
    event), ``key_text``, ``header``, ``meta``."""

    kind: str
    path: tuple[str, ...] = ()   # the field (one name) or the pointer's tokens
    pointer: bool = False        # a pointer may also index arrays; a FIELD names an object member only
    name: str = ""               # header or metadata name
    spec: str = ""               # as the user wrote it

    @property
    def reads_value(self) -> bool:
        """Whether this source needs the record's value (a tombstone has none)."""
        return self.kind == "value" or self.kind in ENVELOPE_KINDS

    def read(self, rec, key: str | None, doc=None, key_doc=None, event=None):
        """The raw value for ``rec`` (``doc``/``key_doc``: its value (or change event's row)/key already parsed as
        JSON; ``event``: the change event), or None."""
        kind = self.kind
        if kind == "value":
            return walk(doc, self.path, self.pointer)
        if kind == "key":
            return walk(key_doc, self.path, self.pointer)
        if kind == "source":
            return walk(event.get("source") if type(event) is dict else None, self.path, self.pointer)
        if kind == "envelope":
            return walk(event, self.path, self.pointer)
        if kind == "key_text":
            return None if rec.key is None else rec.key.decode("utf-8", "replace")
        if kind == "header":
            raw = rec.header(self.name)
            return None if raw is None else raw.decode("utf-8", "replace")
        if self.name == "idempotency_key":
            return key
        if self.name == "timestamp":  # Kafka says -1 when a record has no timestamp
            return rec.timestamp if rec.timestamp is not None and rec.timestamp >= 0 else None
        return getattr(rec, self.name)

    def raw(self, rec) -> bytes | None:
        """The record key's or a header's bytes as they are (a ``key`` or ``header:`` source), for a bytea
        column: :meth:`read` gives them as text, decoded as UTF-8, which changes any byte that is not."""
        return rec.key if self.kind == "key_text" else rec.header(self.name)


def parse_source(spec: str, what: str = "source") -> Source:
    """Parse a SOURCE (see the module's docstring); anything else is a usage error listing the forms."""
    text = spec.strip()
    if text in METADATA:
        return Source("meta", name=text, spec=text)
    if text == "key":
        return Source("key_text", spec=text)
    kind, sep, arg = text.partition(":")
    if sep and arg:
        if kind == "header":
            return Source("header", name=arg, spec=text)
        if kind in ("json", "key") or kind in ENVELOPE_KINDS:
            path, pointer = (parse_pointer(arg, spec), True) if arg.startswith("/") else ((arg,), False)
            return Source("value" if kind == "json" else kind, path=path, pointer=pointer, spec=text)
    raise UsageError(f"unknown {what} {text!r}: use {GRAMMAR}")


def parse_pointer(pointer: str, spec: str = "") -> tuple[str, ...]:
    """RFC 6901: ``/a~1b/c~0d`` → ``('a/b', 'c~d')``; a ``~`` not followed by 0 or 1 is a usage error."""
    tokens = []
    for raw in pointer.split("/")[1:]:
        if "~" in raw.replace("~0", "").replace("~1", ""):
            raise UsageError(f"JSON Pointer {spec or pointer!r}: '~' must be followed by 0 or 1 (RFC 6901)")
        tokens.append(raw.replace("~1", "/").replace("~0", "~"))
    return tuple(tokens)


def walk(doc, path: tuple[str, ...], pointer: bool):
    """Follow ``path`` into ``doc``: object members, and (for a pointer) array indexes; None when missing."""
    for token in path:
        if isinstance(doc, dict):
            doc = doc.get(token)
        elif pointer and isinstance(doc, list) and token.isdigit() and (token == "0" or token[0] != "0"):
            index = int(token)
            doc = doc[index] if index < len(doc) else None
        else:
            return None
        if doc is None:
            return None
    return doc


def parse_json(data: bytes | None):
    """A record's value or key as JSON (None stays None); ValueError if it is not JSON, or nested too deeply
    for Python's decoder (which then raises RecursionError: one record's fault, not the consumer's).

    msgspec reads it (a third of the standard library's time), numbers with a fraction or exponent kept as
    written (:class:`JsonNumber`); what msgspec refuses is read again by the standard library, whose verdict
    and words stand: a lone UTF-16 surrogate escape (which Python's ``json`` takes, and the row maker then
    dead-letters with its own reason), and every malformed document's reason."""
    if data is None:
        return None
    try:
        return _read_json(data)
    except RecursionError as exc:
        raise ValueError(f"nested too deeply to read ({exc})") from None


def as_text(value) -> str | None:
    """A value as Postgres will read it: strings as they are, other JSON as JSON text, null as None."""
    kind = type(value)
    if kind is str or value is None:
        return value
    if kind is JsonNumber:
        return value.text
    if kind is bool:
        return "true" if value else "false"
    if kind is int or kind is Decimal:
        return str(value)
    if kind is float:  # a decoded Avro or Protobuf double's NaN and ±Infinity: real and double take them
        return _dumps(value) if math.isfinite(value) else _float_word(value)
    if kind is dict or kind is list:
        try:
            return json_text(value)
        except ValueError:  # NaN or Infinity inside, which JSON cannot write: a list of numbers as Postgres's array
            if kind is list:
                return _pg_array(value)
            raise
    return _scalar_text(value)


def _float_word(value: float) -> str:
    """NaN, Infinity or -Infinity, as Postgres's real and double precision read them."""
    return "NaN" if value != value else "Infinity" if value > 0 else "-Infinity"


def _pg_array(values: list) -> str:
    """A flat list of numbers holding NaN or Infinity, which JSON has no words for, as a Postgres array literal
    (``{NaN,1.5,NULL}``): what an array column of real or double precision reads."""
    texts = []
    for v in values:
        if v is None:
            texts.append("NULL")
        elif type(v) is float and not math.isfinite(v):
            texts.append(_float_word(v))
        elif type(v) in (int, float, Decimal):
            texts.append(str(v))
        else:
            raise ValueError("NaN or Infinity inside a list of more than numbers: JSON has no words for them")
    return "{" + ",".join(texts) + "}"


def json_text(value) -> str | None:
    """A value as JSON text, for a jsonb column (a string becomes a JSON string); None stays None."""
    if value is None:
        return None
    try:
        try:
            return _dumps(value)
        except TypeError:  # a Decimal (or a decoded value) somewhere inside: numbers exactly as they were written
            return _json_with_decimals(value)
    except ValueError:  # a float NaN or Infinity (a decoded Avro or Protobuf double) somewhere inside
        raise ValueError("NaN or Infinity, which JSON (and so jsonb) has no words for") from None
    except RecursionError:  # _json_with_decimals recurses per level: a document its decoder read, nested deeper
        raise ValueError("nested too deeply to write as JSON text") from None


def _scalar_text(value) -> str:
    """A decoded Avro or Protobuf value that JSON has no type for, as Postgres reads it: bytes as ``\\x`` hex
    (bytea's input form), dates, times and timestamps in ISO 8601, a UUID as its text."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "\\x" + bytes(value).hex()
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    return json_text(value)


def _json_with_decimals(value) -> str:
    """JSON text of a value holding Decimals (numbers kept as written) or decoded values JSON has no type for
    (written as JSON strings of :func:`_scalar_text`)."""
    if type(value) is JsonNumber:
        return value.text
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview, datetime, date, time, UUID)):
        return _dumps(_scalar_text(value))
    if isinstance(value, dict):
        return "{" + ",".join(_dumps(k) + ":" + _json_with_decimals(v) for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_json_with_decimals(v) for v in value) + "]"
    return _dumps(value)


def plain_text(text: str) -> bool:
    """The cheap look before :func:`storable`: ASCII without a NUL or a ``\\u`` escape (most texts), which
    Postgres holds as it is."""
    return text.isascii() and "\x00" not in text and "\\u" not in text


def storable(text: str, jsonb: bool) -> bool:
    """Whether Postgres can hold ``text``: no NUL (jsonb: no ``\\u0000`` escape either), valid UTF-8."""
    if "\x00" in text or (jsonb and "\\u0000" in text and not _only_escaped_backslashes(text)):
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _only_escaped_backslashes(text: str) -> bool:
    """Whether each ``\\u0000`` in JSON ``text`` is an escaped backslash then ``u0000``, never a NUL escape."""
    i = text.find("\\u0000")
    while i >= 0:
        backslashes = len(text[:i]) - len(text[:i].rstrip("\\"))
        if backslashes % 2 == 0:  # this backslash is not itself escaped: a real \u0000
            return False
        i = text.find("\\u0000", i + 1)
    return True

"""Kafka Connect's and Debezium's logical types, decoded from the schema that comes with each record.

Kafka Connect's JsonConverter (``schemas.enable=true``) sends each key and value as ``{"schema", "payload"}``;
the schema names each field's logical type, and the payload holds the type's wire form: days since 1970 for
``io.debezium.time.Date``, base64 bytes and a ``scale`` for ``org.apache.kafka.connect.data.Decimal``.
:func:`converter` turns one field's schema, for one column type, into a function from the field's JSON value
to the text Postgres receives; a type that cannot go to the column gives a function that raises ValueError
(the record is dead-lettered with the reason), never a wrong value. Where the schema comes from (the
wrapper, an Avro writer schema) is :mod:`kdg.mapping.record_schemas`'s part.

Example:
    >>> converter({"type": "int32", "name": "io.debezium.time.Date"}, None)(19_723)
    '2024-01-01'
"""

import base64
import binascii
from datetime import date, datetime, timezone
from itertools import repeat
from operator import add, floordiv, mod

from kdg.mapping.sources import JsonNumber

_TEXT = frozenset({"text", "character varying", "character"})
_TZ, _TS = "timestamp with time zone", "timestamp without time zone"
_TIMETZ, _TIME = "time with time zone", "time without time zone"
_NUMBERS = frozenset({"smallint", "integer", "bigint", "numeric", "real", "double precision", "money"})
_JSON = frozenset({"json", "jsonb"})
# the families kdg knows; a value may go to another (an enum, a domain, a user's type) where Postgres casts it
_KNOWN = frozenset({"date", _TZ, _TS, _TIMETZ, _TIME, "interval", "uuid", "bytea", "boolean", "array", "xml",
                    "inet", "cidr", "macaddr", "bit"}) | _NUMBERS | _JSON | _TEXT
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_UNITS = {"ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
_DEBEZIUM, _CONNECT = "io.debezium.", "org.apache.kafka.connect.data."


def _whole(value, name: str) -> int:
    if type(value) is not int:
        raise ValueError(f"{name}: expected a whole number, not {value!r}")
    return value


def _day(days: int) -> str:
    """The ISO date ``days`` after 1970-01-01, each day's text made once (a batch's timestamps share a few days)."""
    text = _DAY_TEXT.get(days)
    if text is None:
        try:
            text = date.fromordinal(_EPOCH_ORDINAL + days).isoformat()
        except (ValueError, OverflowError):
            raise ValueError(f"{days} days since 1970 is outside the years 1 to 9999") from None
        if len(_DAY_TEXT) >= 4096:
            _DAY_TEXT.clear()
        _DAY_TEXT[days] = text
    return text


_DAY_TEXT: dict[int, str] = {}
_SECOND_TEXT: dict[int, str] = {}
_TWO = [f"{i:02d}" for i in range(100)]  # (a format spec costs more than the rest of a timestamp's text)
_FRACTION = {unit: (per, len(str(per)) - 1) for unit, per in _UNITS.items()}  # a fraction's digits: 3, 6, 9


_MILLIS = [""] + [f".{i:03d}" for i in range(1, 1000)]  # each millisecond's fraction, made once


def _fraction(part: int, unit: str) -> str:
    """``part`` of a second in ``unit`` as ``.digits`` (exact: integers only, never a float)."""
    if unit == "ms":
        return _MILLIS[part]
    return "." + str(part).rjust(_FRACTION[unit][1], "0") if part else ""


def _clock(seconds: int) -> str:
    """``HH:MM:SS`` of ``seconds`` into a day (hours past 99 for a time beyond it, as Connect may send)."""
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return (_TWO[hours] if hours < 100 else str(hours)) + ":" + _TWO[minutes] + ":" + _TWO[seconds]


def _time_of_day(value: int, unit: str) -> str:
    seconds, part = divmod(value, _FRACTION[unit][0])
    return _clock(seconds) + _fraction(part, unit) if part else _clock(seconds)


def _stamp(value: int, unit: str) -> str:
    """``value`` ``unit``s since 1970 as ``YYYY-MM-DD HH:MM:SS[.fraction]``; each second's text made once (a
    batch's timestamps share a few seconds)."""
    seconds, part = divmod(value, _FRACTION[unit][0])  # floor: a fraction before 1970 counts up from the second below
    text = _SECOND_TEXT.get(seconds)
    if text is None:
        days, rest = divmod(seconds, 86_400)
        text = _day(days) + " " + _clock(rest)
        if len(_SECOND_TEXT) >= 4096:
            _SECOND_TEXT.clear()
        _SECOND_TEXT[seconds] = text
    return text + (_MILLIS[part] if unit == "ms" else _fraction(part, unit)) if part else text


def _stamps_ms(values: list, suffix: str) -> list | None:
    """The texts :func:`_stamp` makes of a column of epoch milliseconds, each followed by ``suffix``, made a column
    at a time in C (0.3 µs a value against 1.0 one at a time); None unless every value is a whole number."""
    if set(map(type, values)) != {int}:
        return None
    seconds = list(map(floordiv, values, repeat(1000)))  # floor, as _stamp's divmod
    texts = list(map(_SECOND_TEXT.get, seconds))
    if None in texts:  # a second not met yet: made as _stamp makes it, and kept
        texts = [_stamp(s * 1000, "ms") if t is None else t for t, s in zip(texts, seconds)]
    ends = _ENDS.get(suffix)
    if ends is None:
        ends = _ENDS[suffix] = [m + suffix for m in _MILLIS]
    return list(map(add, texts, map(ends.__getitem__, map(mod, values, repeat(1000)))))


_ENDS: dict[str, list[str]] = {}  # per suffix, each millisecond's fraction and the suffix


def _unscaled(value, name: str) -> int:
    if type(value) is bytes:  # decoded from Avro: the bytes themselves
        return int.from_bytes(value, "big", signed=True)
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise ValueError(f"{name}: {value!r} is not base64 bytes") from None
    return int.from_bytes(raw, "big", signed=True)


def _scaled(unscaled: int, scale: int) -> str:
    """``unscaled × 10^-scale`` as exact decimal text."""
    digits = str(abs(unscaled))
    if scale > 0:
        digits = digits.rjust(scale + 1, "0")
        digits = f"{digits[:-scale]}.{digits[-scale:]}"
    elif scale < 0:
        digits += "0" * -scale
    return ("-" if unscaled < 0 else "") + digits


def _decimal(value, schema: dict, name: str) -> str:
    if type(value) is int or type(value) is JsonNumber:  # JsonConverter's decimal.format = NUMERIC
        return str(value)
    try:
        scale = int((schema.get("parameters") or {}).get("scale", 0))
    except (TypeError, ValueError):
        raise ValueError(f"{name}: its schema's scale is not a number") from None
    return _scaled(_unscaled(value, name), scale)


def _variable_decimal(value, schema: dict, name: str) -> str:
    if type(value) is not dict or type(value.get("scale")) is not int:
        raise ValueError(f"{name}: expected {{scale, value}}, not {value!r}")
    return _scaled(_unscaled(value.get("value"), name), value["scale"])


def _utc_wall(text: str, name: str) -> str:
    """An ISO 8601 time or timestamp with an offset as UTC's wall clock, without the offset."""
    if text.endswith("Z"):
        return text[:-1]
    for utc in ("+00:00", "+00", "-00:00"):
        if text.endswith(utc):
            return text[:-len(utc)]
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{name}: {text!r} is not an ISO 8601 timestamp") from None
    if moment.tzinfo is None:
        return text
    return moment.astimezone(timezone.utc).replace(tzinfo=None).isoformat()


def _string(value, name: str) -> str:
    if type(value) is not str:
        raise ValueError(f"{name}: expected a string, not {value!r}")
    return value


def _pg_array(items: list[str]) -> str:
    """A Postgres array literal of texts, each quoted: ``{"a","b c"}``."""
    return "{" + ",".join('"' + i.replace("\\", "\\\\").replace('"', '\\"') + '"' for i in items) + "}"


# each logical type: (the families it may go to besides text, decode(value, schema, name) → its canonical text)
_DAYS = ({"date", _TS, _TZ}, lambda v, s, n: _day(_whole(v, n)))
_TIMES = {unit: ({_TIME, _TIMETZ}, lambda v, s, n, u=unit: _time_of_day(v if type(v) is int else _whole(v, n), u))
          for unit in _UNITS}
_STAMPS = {unit: ({_TS, _TZ, "date"}, lambda v, s, n, u=unit: _stamp(v if type(v) is int else _whole(v, n), u))
           for unit in _UNITS}
_STRING = (frozenset(), lambda v, s, n: _string(v, n))  # text, or a type of the user's (an enum, a domain)
LOGICAL = {
    _CONNECT + "Date": _DAYS, _DEBEZIUM + "time.Date": _DAYS,
    _CONNECT + "Time": _TIMES["ms"], _DEBEZIUM + "time.Time": _TIMES["ms"],
    _DEBEZIUM + "time.MicroTime": _TIMES["us"], _DEBEZIUM + "time.NanoTime": _TIMES["ns"],
    _CONNECT + "Timestamp": _STAMPS["ms"], _DEBEZIUM + "time.Timestamp": _STAMPS["ms"],
    _DEBEZIUM + "time.MicroTimestamp": _STAMPS["us"], _DEBEZIUM + "time.NanoTimestamp": _STAMPS["ns"],
    _DEBEZIUM + "time.ZonedTimestamp": ({_TZ, _TS, "date"}, lambda v, s, n: _string(v, n)),
    _DEBEZIUM + "time.ZonedTime": ({_TIMETZ, _TIME}, lambda v, s, n: _string(v, n)),
    _DEBEZIUM + "time.Year": (_NUMBERS, lambda v, s, n: str(_whole(v, n))),
    _DEBEZIUM + "time.MicroDuration": ({"interval"} | _NUMBERS, lambda v, s, n: str(_whole(v, n))),
    _DEBEZIUM + "time.Interval": ({"interval"}, lambda v, s, n: _string(v, n)),
    _CONNECT + "Decimal": (_NUMBERS | _JSON, _decimal),
    _DEBEZIUM + "data.VariableScaleDecimal": (_NUMBERS | _JSON, _variable_decimal),
    _DEBEZIUM + "data.Json": (_JSON, lambda v, s, n: _string(v, n)),
    _DEBEZIUM + "data.Uuid": ({"uuid"}, lambda v, s, n: _string(v, n)),
    _DEBEZIUM + "data.Enum": _STRING, _DEBEZIUM + "data.Xml": ({"xml"}, _STRING[1]),
    _DEBEZIUM + "data.Ltree": _STRING,
    _DEBEZIUM + "data.EnumSet": ({"array"}, lambda v, s, n: _string(v, n)),
}


def _base64_bytes(value, schema, name) -> str:
    try:
        return "\\x" + base64.b64decode(_string(value, name), validate=True).hex()
    except (binascii.Error, ValueError):
        raise ValueError(f"a Connect bytes field: {value!r} is not base64") from None


def _to_column(name: str, family: str):
    """How the canonical text of a logical type is adapted to its column's family where Postgres would read it
    otherwise (None: it is not): a time or timestamp without zone into a column with one is UTC's; one with an
    offset into a column without is UTC's wall clock; an EnumSet into an array is an array literal. Decided
    once per field and column, not per value."""
    if family == _TZ and name in _LOCAL_STAMPS:
        return lambda text: text + "+00"
    if family == _TZ and name in _DAY_NAMES:
        return lambda text: text + " 00:00:00+00"
    if family == _TIMETZ and name in _LOCAL_TIMES:
        return lambda text: text + "+00"
    if family in (_TS, _TIME, "date") and name in _ZONED:
        return lambda text: _utc_wall(text, name)
    if family == "array" and name.endswith("EnumSet"):
        return lambda text: _pg_array(text.split(",")) if text else "{}"
    if family == "interval" and name.endswith("MicroDuration"):
        return lambda text: f"{text} microseconds"
    return None


_DAY_NAMES = {n for n, kind in LOGICAL.items() if kind is _DAYS}
_LOCAL_STAMPS = {n for n, kind in LOGICAL.items() if kind in _STAMPS.values()}
_LOCAL_TIMES = {n for n, kind in LOGICAL.items() if kind in _TIMES.values()}
_ZONED = {_DEBEZIUM + "time.ZonedTimestamp", _DEBEZIUM + "time.ZonedTime"}
_RAW_NUMBER_OK = _DAY_NAMES | _LOCAL_STAMPS | _LOCAL_TIMES  # into a number column: the number as sent


def converter(schema, column_type):
    """``convert(value) → text`` for a field of ``schema`` (its Connect schema) going to a column of
    ``column_type`` (a resolved :class:`~kdg.mapping.types.ColumnType`; None: text); None where the field has
    no logical type, and its value goes as plain JSON does.

    A logical type goes to a text column, to the families it names, or to a type kdg does not know (an enum,
    a domain: Postgres casts the text, or refuses it). A date, time or timestamp goes to a number column as
    the number Connect sent. Anything else, and a type kdg does not know into anything but text or JSON,
    is refused: the converter raises ValueError, and the record is dead-lettered with the reason."""
    if type(schema) is not dict:
        return None
    name, family = schema.get("name"), column_type.base if column_type is not None else "text"
    if name is None:  # a plain Connect type; its bytes are base64 on the wire: decoded for bytea, else as sent
        return _converting("bytes", _base64_bytes, schema, family) if schema.get("type") == "bytes" and \
            family == "bytea" else None
    if name not in LOGICAL:
        if family in _TEXT or family in _JSON:
            return None
        return _refusing(f"{name} (a Connect {schema.get('type')}) is a type kdg does not convert: it can go "
                         f"to a text or jsonb column, not {_shown(column_type)}")
    families, decode = LOGICAL[name]
    if family in _NUMBERS and name in _RAW_NUMBER_OK:
        return _converting(name, lambda v, s, n: str(_whole(v, n)), schema, "text")
    if family in _TEXT or family in families or family not in _KNOWN:
        return _converting(name, decode, schema, family)
    return _refusing(f"{name} cannot go to a {_shown(column_type)} column")


def _shown(column_type) -> str:
    return column_type.name if column_type is not None else "text"


def _converting(name: str, decode, schema: dict, family: str = "text"):
    """``convert(value) → text``; for epoch milliseconds, with ``convert.column(values) → texts | None``, the same
    a column at a time (:func:`_stamps_ms`)."""
    adapt = _to_column(name, family)
    if adapt is None:
        def convert(value):
            return None if value is None else decode(value, schema, name)
    else:
        def convert(value):
            return None if value is None else adapt(decode(value, schema, name))
    if decode is _STAMPS["ms"][1] and (adapt is None or name in _LOCAL_STAMPS and family == _TZ):
        suffix = "" if adapt is None else "+00"  # (as _to_column's adapt for a timestamp into timestamptz)
        convert.column = lambda values: _stamps_ms(values, suffix)
    return convert


def _refusing(reason: str):
    def refuse(value):
        if value is not None:
            raise ValueError(reason)
        return None
    return refuse

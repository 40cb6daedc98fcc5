"""Record values (and keys) to documents the mapping reads, and back: JSON, Avro, Protobuf, JSON Schema.

A decoder turns a record's bytes into the document ``json:`` sources read: a dict for an object, with
plain Python values inside (Avro's and Protobuf's bytes, dates and timestamps stay what they are; the
mapping writes them as Postgres reads them). A value it cannot decode — not the wire format, an unknown
schema id, a corrupt payload, a JSON Schema it breaks — raises ValueError with the reason, and the
record goes to the dead-letter topic with it. A registry that cannot be reached raises
:class:`kdg.errors.ConnectionFailed`: that is nobody's record's fault.

Records are decoded with the schema they were written with (the id in the record), so a record written
with a newer, compatible schema still maps: a column whose field it lacks is NULL.
"""

import io
import json
from datetime import datetime, timedelta, timezone
from decimal import Decimal

from kdg.errors import MissingComponent
from kdg.mapping.sources import parse_json
from kdg.schemas.formats import REGISTRY_TYPE
from kdg.schemas.registry import Registry
from kdg.schemas.wire import MAGIC, first_message_indexes, frame, split_frame, split_indexes

_NAMES = {"avro": "Avro", "protobuf": "Protobuf", "json-schema": "JSON Schema"}


_MODULES = {"avro": ("fastavro",), "protobuf": ("google.protobuf", "grpc_tools"), "json-schema": ("jsonschema",)}


def require_codec(fmt: str) -> None:
    """Import what ``fmt`` needs now, so a missing package is one clear error (exit 3), never a dead letter."""
    import importlib

    for name in _MODULES[fmt]:
        try:
            importlib.import_module(name)
        except ImportError:
            raise MissingComponent(f"--value-format {fmt} needs {name.split('.')[0]}: pip install 'kdg[schemas]'") \
                from None


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_DAY_US = 86_400_000_000
_TIME_UNITS = {"millis": 1_000, "micros": 1, "nanos": None}  # microseconds per unit (nanos: divided by 1,000)


def _civil(days: int) -> tuple[int, int, int]:
    """The proleptic Gregorian (year, month, day) of ``days`` after 1970-01-01, for any year (0 is 1 BC)."""
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1_460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, doy - (153 * mp + 2) // 5 + 1


def _pg_date(days: int) -> str:
    year, month, day = _civil(days)
    return f"{year if year > 0 else 1 - year:04d}-{month:02d}-{day:02d}"


def _bc(year_days: int, text: str) -> str:
    return text + " BC" if _civil(year_days)[0] <= 0 else text


def _timestamp_text(us: int, zone: str) -> str:
    """A timestamp Python's datetime cannot hold (years outside 1-9999) as the text Postgres reads, which holds
    4713 BC to 294276 AD: ``10000-01-01 00:00:00.000000+00``, ``0001-12-31 23:59:59.000000+00 BC``."""
    days, rest = divmod(us, _DAY_US)
    seconds, micro = divmod(rest, 1_000_000)
    text = f"{_pg_date(days)} {seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{micro:06d}{zone}"
    return _bc(days, text)


def _timestamp_reader(unit: str, local: bool, fastavro_own):
    """fastavro's reader of a timestamp logical type where it has one, else (nanos) ours; a value outside
    datetime's years as Postgres's text instead of an error that would call a valid payload corrupt."""
    def read(data, writer_schema=None, reader_schema=None):
        if fastavro_own is not None:
            try:
                return fastavro_own(data, writer_schema, reader_schema)
            except (OverflowError, ValueError, OSError):
                pass
        us = data * _TIME_UNITS[unit] if unit != "nanos" else data // 1_000  # Postgres keeps microseconds
        try:
            stamp = _EPOCH + timedelta(microseconds=us)
            return stamp.replace(tzinfo=None) if local else stamp
        except OverflowError:
            return _timestamp_text(us, "" if local else "+00")
    return read


def _date_reader(fastavro_own):
    def read(data, writer_schema=None, reader_schema=None):
        try:
            return fastavro_own(data, writer_schema, reader_schema)
        except (OverflowError, ValueError, OSError):
            return _bc(data, _pg_date(data))
    return read


_readers_added = False


def _add_logical_readers() -> None:
    """Teach fastavro (once per process) the timestamp-nanos types it returns as bare numbers, which a
    timestamptz column would read as milliseconds, and dates and timestamps outside years 1-9999."""
    global _readers_added
    if _readers_added:
        return
    from fastavro.read import LOGICAL_READERS  # the dict its compiled reader looks in too

    for local in (False, True):
        for unit in _TIME_UNITS:
            name = f"long-{'local-' if local else ''}timestamp-{unit}"
            LOGICAL_READERS[name] = _timestamp_reader(unit, local, LOGICAL_READERS.get(name))
    LOGICAL_READERS["int-date"] = _date_reader(LOGICAL_READERS["int-date"])
    _readers_added = True


class SchemaDecoder:
    """Decodes one schema'd format; schemas (and what is compiled from them) are kept per id."""

    def __init__(self, fmt: str, registry: Registry):
        require_codec(fmt)
        self.fmt, self.registry = fmt, registry
        self._compiled: dict[int, object] = {}
        self._decode = {"avro": self._avro, "protobuf": self._protobuf, "json-schema": self._json_schema}[fmt]

    def __call__(self, data: bytes | None):
        if data is None:
            return None
        schema_id, payload = split_frame(data)
        compiled = self._compiled.get(schema_id)
        if compiled is None:
            compiled = self._compiled[schema_id] = self._compile(schema_id)
        return self._decode(schema_id, compiled, payload)

    def writer_schema(self, data: bytes | None) -> tuple[int, object] | None:
        """``(schema id, compiled schema)`` of an Avro value already decoded (None for another format, or a value
        not in the wire format): where :mod:`kdg.mapping.connect` finds the Connect types it names."""
        if self.fmt != "avro" or not data or len(data) < 5 or data[0] != MAGIC:
            return None
        schema_id = int.from_bytes(data[1:5], "big")
        compiled = self._compiled.get(schema_id)
        return None if compiled is None else (schema_id, compiled)

    def prepare(self, values) -> None:
        """The schema of every id among ``values`` fetched (and compiled) if not yet: called between client calls,
        so that a registry that is away is waited for there, never inside a COPY. An id the registry has not,
        or a value not in the wire format, is left to decoding, which says why, record by record."""
        for raw in {data[1:5] for data in values if data and data[0] == MAGIC and len(data) >= 5}:
            schema_id = int.from_bytes(raw, "big")
            if schema_id not in self._compiled:
                try:
                    self._compiled[schema_id] = self._compile(schema_id)
                except ValueError:
                    pass

    def _compile(self, schema_id: int):
        text, schema_type = self.registry.schema(schema_id)
        expected = REGISTRY_TYPE[self.fmt]
        # a registry that leaves schemaType out means AVRO, and the client says so: only another type is a mismatch
        if schema_type and schema_type.upper() not in (expected, "AVRO"):
            raise ValueError(f"schema id {schema_id} is {schema_type}, not {_NAMES[self.fmt]}")
        try:
            if self.fmt == "avro":
                import fastavro
                _add_logical_readers()
                return fastavro.parse_schema(json.loads(text))
            if self.fmt == "protobuf":
                from kdg.schemas.proto import ProtoFile
                return ProtoFile(text)
            import jsonschema
            schema = json.loads(text)
            return jsonschema.validators.validator_for(schema)(schema)
        except ValueError as exc:
            raise ValueError(f"schema id {schema_id} is not a valid {_NAMES[self.fmt]} schema: {exc}") from None
        except Exception as exc:  # fastavro's SchemaParseException and jsonschema's SchemaError
            raise ValueError(f"schema id {schema_id} is not a valid {_NAMES[self.fmt]} schema: "
                             f"{type(exc).__name__}: {exc}") from None

    def _avro(self, schema_id: int, parsed, payload: bytes):
        from fastavro import schemaless_reader

        buf = io.BytesIO(payload)
        try:
            doc = schemaless_reader(buf, parsed, None)
        except Exception as exc:  # EOFError, struct.error, UnicodeDecodeError, IndexError …: a corrupt payload
            raise ValueError(f"corrupt Avro payload (schema id {schema_id}): {type(exc).__name__}: {exc}") from None
        if buf.tell() != len(payload):
            raise ValueError(f"corrupt Avro payload (schema id {schema_id}): {len(payload) - buf.tell()} byte(s) "
                             "left after the record")
        return doc

    def _protobuf(self, schema_id: int, proto_file, payload: bytes):
        from kdg.schemas.proto import message_values

        indexes, body = split_indexes(payload)
        cls = proto_file.message(indexes)
        try:
            return message_values(cls.FromString(body))
        except Exception as exc:  # google.protobuf.message.DecodeError
            raise ValueError(f"corrupt Protobuf payload (schema id {schema_id}): {type(exc).__name__}: {exc}") from None

    def _json_schema(self, schema_id: int, validator, payload: bytes):
        try:
            doc = parse_json(payload)  # nested too deeply to read: a ValueError too
        except ValueError as exc:
            raise ValueError(f"bad JSON (schema id {schema_id}): {exc}") from None
        try:
            error = next(iter(validator.iter_errors(doc)), None)
        except RecursionError:  # a schema that refers to itself, followed down a deeply nested document
            raise ValueError(f"nested too deeply to check against its JSON Schema (id {schema_id})") from None
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path)
            raise ValueError(f"does not match its JSON Schema (id {schema_id})"
                             + (f" at /{where}" if where else "") + f": {error.message}")
        return doc


def optional_decoder(fmt: str, registry_settings: dict[str, str] | None):
    """The decoder of a schema'd ``fmt``; None for json and raw, which need none outside a mapping
    (``--id-from json:`` parses JSON itself, the stdout sink shows the bytes)."""
    return None if fmt in ("json", "raw") else decoder(fmt, registry_settings)


def decoder(fmt: str, registry_settings: dict[str, str] | None, registry: Registry | None = None):
    """``decode(bytes) → document`` for ``fmt``; ``raw`` gives None (only key, header and metadata sources read)."""
    if fmt == "json":
        return parse_json
    if fmt == "raw":
        return lambda data: None
    return SchemaDecoder(fmt, registry or Registry(registry_settings or {}))


class SchemaEncoder:
    """Encodes JSON documents with one schema registered under ``subject`` (``TOPIC-value``), for `kdg produce`."""

    def __init__(self, fmt: str, schema_text: str, subject: str, registry: Registry):
        require_codec(fmt)
        self.fmt, self.subject = fmt, subject
        if fmt == "avro":
            import fastavro
            self._schema = fastavro.parse_schema(json.loads(schema_text))
        elif fmt == "protobuf":
            from kdg.schemas.proto import ProtoFile
            self._message = ProtoFile(schema_text).message((0,))
        else:
            import jsonschema
            schema = json.loads(schema_text)
            self._validator = jsonschema.validators.validator_for(schema)(schema)
        self.schema_id = registry.register(subject, schema_text, REGISTRY_TYPE[fmt])
        self._encode = {"avro": self._avro, "protobuf": self._protobuf, "json-schema": self._json}[fmt]

    def __call__(self, text: bytes) -> bytes:
        """The framed bytes of a JSON document (``text``); ValueError if it is not JSON or the schema does not fit."""
        return frame(self.schema_id, self._encode(text))

    def _avro(self, text: bytes) -> bytes:
        from fastavro import schemaless_writer

        doc = _json(text, parse_float=Decimal)  # a decimal's digits as written
        buf = io.BytesIO()
        try:
            schemaless_writer(buf, self._schema, _avro_ready(self._schema, doc), strict=True)
        except Exception as exc:  # ValueError, TypeError, fastavro's validation errors
            raise ValueError(f"does not fit the Avro schema: {type(exc).__name__}: {exc}") from None
        return buf.getvalue()

    def _protobuf(self, text: bytes) -> bytes:
        from google.protobuf import json_format

        try:  # Protobuf's JSON mapping: int64 as numbers or strings, bytes as base64, Timestamps as RFC 3339
            msg = json_format.Parse(text, self._message())
        except json_format.ParseError as exc:
            raise ValueError(f"does not fit the Protobuf message: {exc}") from None
        return first_message_indexes() + msg.SerializeToString()

    def _json(self, text: bytes) -> bytes:
        error = next(iter(self._validator.iter_errors(_json(text))), None)
        if error is not None:
            raise ValueError(f"does not match the JSON Schema: {error.message}")
        return text  # the document as written


def _json(text: bytes, **options):
    try:
        return json.loads(text, **options)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    except RecursionError as exc:  # this one document's fault, like any other that cannot be read
        raise ValueError(f"nested too deeply to read ({exc})") from None


def _avro_ready(schema, value):
    """A JSON value made ready for Avro ``schema``: bytes and fixed take a string's characters as bytes
    (Avro's own JSON encoding: each character one byte, 0-255); a decimal takes a JSON number."""
    if isinstance(schema, list):  # a union: the branch the value fits, bytes-like only for a string
        if value is None:
            return None
        if isinstance(value, Decimal):  # a number written with a fraction or exponent: a branch that holds one
            fits = [b for b in schema if isinstance(b, dict) and b.get("logicalType") == "decimal"] or \
                   [b for b in schema if _kind(b) in ("double", "float")]
            if fits:
                return _avro_ready(fits[0], value)
        for branch in schema:
            if branch != "null" and (not isinstance(value, str) or _bytes_like(branch)):
                return _avro_ready(branch, value)
        return value
    kind = _kind(schema)
    if isinstance(value, Decimal) and kind in ("double", "float"):
        return float(value)  # JSON's 1.5, parsed as a Decimal to keep a decimal's digits, for a double
    if not isinstance(schema, dict):
        return value.encode("latin-1") if isinstance(value, str) and schema == "bytes" else value
    if schema.get("logicalType") == "decimal" and isinstance(value, (int, float, Decimal)):
        return Decimal(str(value))
    if kind in ("bytes", "fixed") and isinstance(value, str):
        try:
            return value.encode("latin-1")
        except UnicodeEncodeError:
            raise ValueError(f"a {kind} value must be characters U+0000 to U+00FF (Avro's JSON encoding)") from None
    if kind == "record" and isinstance(value, dict):  # fields the schema lacks stay, for strict to name them
        types = {f["name"]: f["type"] for f in schema["fields"]}
        return {k: _avro_ready(types[k], v) if k in types else v for k, v in value.items()}
    if kind == "array" and isinstance(value, list):
        return [_avro_ready(schema["items"], v) for v in value]
    if kind == "map" and isinstance(value, dict):
        return {k: _avro_ready(schema["values"], v) for k, v in value.items()}
    return value


def _kind(schema) -> str | None:
    """An Avro schema's type name: the schema itself for a primitive, else its ``type``."""
    return schema.get("type") if isinstance(schema, dict) else schema if isinstance(schema, str) else None


def _bytes_like(branch) -> bool:
    kind = branch.get("type") if isinstance(branch, dict) else branch
    return kind in ("string", "bytes", "fixed", "enum") or (isinstance(branch, dict) and "logicalType" in branch)

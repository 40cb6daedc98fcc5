"""`kdg produce --value-format avro|protobuf|json-schema --schema FILE`: JSON input lines, sent schema'd.

The schema is registered (or found) under the topic's value subject, ``TOPIC-value`` (the registry's
default subject naming), and each input value, a JSON document, is encoded with it in the wire format.
"""

from pathlib import Path

from kdg.errors import UsageError
from kdg.schemas.codecs import SchemaEncoder
from kdg.schemas.registry import Registry


def value_subject(topic: str) -> str:
    return f"{topic}-value"


def read_schema(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--schema {path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise UsageError(f"--schema {path}: not UTF-8 text") from None


def encoder_for(fmt: str, schema_path: Path, topic: str, registry_settings: dict[str, str]) -> SchemaEncoder:
    """The encoder of ``fmt`` with the schema in ``schema_path``, registered under ``TOPIC-value``."""
    text = read_schema(schema_path)
    try:
        return SchemaEncoder(fmt, text, value_subject(topic), Registry(registry_settings))
    except ValueError as exc:  # the schema itself: not JSON, not Avro, protoc's complaint …
        raise UsageError(f"--schema {schema_path}: {exc}") from None


def encoded(records, encode, fmt: str):
    """``records`` with each value (a JSON document) encoded; a line that is not JSON, or that the schema does
    not fit, is a usage error naming its place (tombstones stay tombstones)."""
    number = 0
    for rec in records:
        if rec is None:  # the input is idle (kdg.sources.IDLE)
            yield rec
            continue
        number += 1
        if rec.value is not None:
            try:
                rec.value = encode(rec.value)
            except ValueError as exc:
                raise UsageError(f"record {number}: {exc} (--value-format {fmt} encodes a JSON document a line)") \
                    from None
        yield rec

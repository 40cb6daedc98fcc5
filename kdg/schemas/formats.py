"""The value and key formats kdg reads and writes, named once."""

from kdg.errors import UsageError

FORMATS = ("json", "avro", "protobuf", "json-schema", "raw")
SCHEMA_FORMATS = ("avro", "protobuf", "json-schema")  # through a Schema Registry
REGISTRY_TYPE = {"avro": "AVRO", "protobuf": "PROTOBUF", "json-schema": "JSON"}  # its schemaType


def check_format(fmt: str, option: str = "--value-format") -> str:
    if fmt not in FORMATS:
        raise UsageError(f"{option} {fmt!r}: use {', '.join(FORMATS)}")
    return fmt

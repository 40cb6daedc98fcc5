"""Schema'd records: the Schema Registry wire format, Avro / Protobuf / JSON Schema codecs, and mappings
derived from a subject's schema (``kdg mapping from-schema``).

Needs kdg's ``schemas`` extra (fastavro, protobuf, grpcio-tools, jsonschema and confluent-kafka's registry
client's own dependencies); JSON and raw values need nothing more.
"""

from kdg.schemas.formats import FORMATS, SCHEMA_FORMATS, check_format

__all__ = ["FORMATS", "SCHEMA_FORMATS", "check_format"]

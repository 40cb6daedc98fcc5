"""The record → row mapping of a typed sink, declared once and used by `kdg consume` and Spark alike.

``sources``: where a value comes from (the SOURCE grammar, JSON Pointer); ``types``: the column
types and their casts; ``spec``: columns, the TOML file and flags; ``rows``: records to staged rows.
Nothing here imports asyncpg or confluent_kafka.
"""

from kdg.mapping.rows import RowMaker
from kdg.mapping.sources import Source, parse_pointer, parse_source
from kdg.mapping.spec import Column, Mapping, build_mapping, parse_column
from kdg.mapping.types import ColumnType, parse_type

__all__ = ["Column", "ColumnType", "Mapping", "RowMaker", "Source", "build_mapping", "parse_column",
           "parse_pointer", "parse_source", "parse_type"]

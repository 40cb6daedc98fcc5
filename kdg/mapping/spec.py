"""A mapping from a record to a row of the user's table, declared once: on the command line or in TOML.

    kdg consume orders -G etl --table app.orders --mode upsert \\
        --column 'order_id bigint = json:id' --column 'amount numeric(12,2) = json:/total/amount'

or ``--mapping orders.toml``::

    table = "app.orders"
    mode = "upsert"              # insert (default) | upsert
    key = ["order_id"]           # upsert/delete key [default: the table's primary key]
    on_tombstone = "delete"      # dead-letter (default) | delete | ignore
    on_truncate = "apply"        # dead-letter (default) | apply: a Debezium truncate (op t) empties the table
    create_table = false
    envelope = "none"            # none (default) | debezium: json: reads the change event's row (`after`; a delete's
                                 #   `before`, or the record key when before is null); source:/envelope: the event
    value_format = "json"        # json (default) | avro | protobuf | json-schema (through a Schema Registry) | raw
    key_format = "json"          # how key:FIELD sources read the key, the same choices
    [columns]
    order_id = { type = "bigint", from = "json:id" }
    note = { from = "json:note" }  # no type: the table's own (the table must exist)
    '"OrderId"' = { from = "key" }   # names as SQL spells them: OrderId is orderid, "OrderId" keeps its case

Flags override the file's values; a ``--column`` replaces the file's column of the same name.
"""

import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from kdg.errors import UsageError
from kdg.mapping.sources import ENVELOPE_KINDS, Source, parse_source
from kdg.mapping.types import ColumnType, parse_type
from kdg.schemas.formats import check_format
from kdg.settings import TableName, table_name

MODES = ("insert", "upsert")
TOMBSTONES = ("dead-letter", "delete", "ignore")
TRUNCATES = ("dead-letter", "apply")
ENVELOPES = ("none", "debezium")
EVOLVE = ("none", "add-columns")
INCOMPATIBLE = ("stop", "dead-letter")  # a field whose new type the table cannot take (kdg.mapping.evolution)
_FILE_KEYS = {"table", "mode", "key", "on_tombstone", "on_truncate", "create_table", "columns", "envelope",
              "value_format", "key_format"}
# the NAME of 'NAME [TYPE] = SOURCE': a double-quoted name may hold spaces and '=' (its rule: column_name)
_NAME = re.compile(r'\s*("(?:[^"]|"")*"|[^\s=]+)')


def column_name(text: str, what: str = "column") -> str:
    """``text`` read as Postgres reads a column name: unquoted, folded to lower case; double-quoted, kept as
    written (``""`` for a quote). The rule, and the code, of a table's name (:func:`kdg.settings.table_name`),
    of one part.

    >>> column_name("OrderId"), column_name('"OrderId"')
    ('orderid', 'OrderId')
    """
    try:
        parsed = table_name(text.strip())
    except UsageError:
        parsed = None
    if parsed is None or parsed.schema is not None:
        raise UsageError(f'{what} name {text!r} must match [a-z_][a-z0-9_]* or be double-quoted ("OrderId"), '
                         "as in SQL (1 to 63 bytes)")
    return parsed.name


def spelled(name: str) -> str:
    """A column's name as SQL spells it, quoted only where it must be: ``order_id``, ``"OrderId"``."""
    return TableName(None, name).text


@dataclass(frozen=True)
class Column:
    name: str
    type: ColumnType | None  # None: the table's column type, read from the catalog
    source: Source

    @property
    def sql(self) -> str:
        """For SQL text, double-quoted (a quote in it doubled): never the name as the user typed it."""
        return TableName(None, self.name).sql

    @property
    def type_name(self) -> str | None:
        return self.type.name if self.type is not None else None

    def describe(self) -> str:
        return f"{spelled(self.name)} {self.type_name or '(the table’s type)'} = {self.source.spec}"


@dataclass(frozen=True)
class Mapping:
    """Which table, which columns from which sources, and how rows are written."""

    table: TableName
    columns: tuple[Column, ...]
    mode: str = "insert"
    key: tuple[str, ...] = ()          # empty: the table's primary key
    on_tombstone: str = "dead-letter"
    create_table: bool = False
    envelope: str = "none"             # debezium: json: sources read the event's after (before for a delete)
    value_format: str = "json"         # how the value is decoded for json: sources (kdg.schemas.codecs.FORMATS)
    key_format: str = "json"           # ... and the key for key:FIELD sources
    from_schema: bool = False          # columns = "from-schema": each topic's columns come from its records' schema
    evolve: str = "none"               # add-columns: a field new to the table adds a nullable column (from-schema)
    on_truncate: str = "dead-letter"   # apply: a Debezium truncate (op t) deletes every row, in record order
    extra_columns: tuple[Column, ...] = ()  # from-schema: columns listed besides the schema's (source:ts_ms, ...)
    on_incompatible: str = "stop"      # dead-letter: a record whose schema's type the column cannot take, to the DLQ

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)

    @property
    def reads_value(self) -> bool:
        return any(c.source.reads_value for c in self.columns)

    def check_key(self, key: tuple[str, ...], origin: str) -> None:
        """Key columns must be mapped; deleting on tombstones needs them from outside the value."""
        unmapped = [k for k in key if k not in {c.name for c in self.columns}]
        if unmapped:
            raise UsageError(f"key column {unmapped[0]!r} ({origin}) is not one of the mapped columns")
        if self.on_tombstone == "delete" and self.envelope == "none":  # a Debezium delete carries `before`
            from_value = [k for k in key if self.column(k).source.reads_value]
            if from_value:
                raise UsageError(f"on_tombstone = delete: key column {from_value[0]!r} comes from "
                                 f"{self.column(from_value[0]).source.spec!r}, and a tombstone has no value; "
                                 "take it from key, key:FIELD, header:NAME or metadata")

    def to_dict(self) -> dict:
        return {"table": self.table.text, "mode": self.mode, "key": list(map(spelled, self.key)),
                "on_tombstone": self.on_tombstone, "on_truncate": self.on_truncate, "create_table": self.create_table,
                "envelope": self.envelope,
                "value_format": self.value_format, "key_format": self.key_format,
                "columns": [{"name": spelled(c.name), "type": c.type_name, "from": c.source.spec}
                            for c in self.columns],
                **({"extra_columns": [{"name": spelled(c.name), "type": c.type_name, "from": c.source.spec}
                                      for c in self.extra_columns]} if self.extra_columns else {})}


def parse_column(spec: str) -> Column:
    """``'NAME [TYPE] = SOURCE'`` → a Column; a malformed spec is a usage error naming it."""
    name = _NAME.match(spec)
    left, sep, source = spec[name.end() if name else 0:].partition("=")
    if not name or not sep or not source.strip():
        raise UsageError(f"--column {spec!r}: expected 'NAME [TYPE] = SOURCE', e.g. 'order_id bigint = json:id' "
                         "(without TYPE, the table's own)")
    return make_column(name.group(1), left.strip() or None, source)


def make_column(text: str, type_text: str | None, source: str) -> Column:
    name = column_name(text)
    return Column(name, parse_type(type_text, name) if type_text is not None else None,
                  parse_source(source, f"source of column {name!r}"))


def load_file(path: Path) -> dict:
    """The TOML mapping file as the keyword arguments of :func:`build_mapping`; errors name the file."""
    try:
        doc = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"--mapping {path}: cannot read it ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"--mapping {path}: not TOML ({exc})") from None
    unknown = sorted(set(doc) - _FILE_KEYS)
    if unknown:
        raise UsageError(f"--mapping {path}: unknown key {unknown[0]!r}; the keys are {', '.join(sorted(_FILE_KEYS))}")
    columns = doc.get("columns", {})
    if not isinstance(columns, dict):
        raise UsageError(f"--mapping {path}: [columns] must be a table of NAME = {{ type = …, from = … }}")
    parsed = [_file_column(path, name, entry) for name, entry in columns.items()]
    names = [c.name for c in parsed]
    if len(set(names)) != len(names):  # OrderId and orderid: one column, as SQL reads them
        twice = next(n for n in names if names.count(n) > 1)
        raise UsageError(f"--mapping {path}: column {spelled(twice)} is named twice in [columns] "
                         "(an unquoted name is folded to lower case)")
    key = doc.get("key", [])
    if isinstance(key, str):
        key = [key]
    for name, kind in (("table", str), ("mode", str), ("on_tombstone", str), ("on_truncate", str),
                       ("create_table", bool), ("key", list),
                       ("envelope", str), ("value_format", str), ("key_format", str)):
        value = key if name == "key" else doc.get(name)
        if value is not None and not isinstance(value, kind):
            raise UsageError(f"--mapping {path}: {name} must be a {kind.__name__}, not {value!r}")
    if not all(isinstance(k, str) for k in key):
        raise UsageError(f"--mapping {path}: key must list column names, not {key!r}")
    return {"table": doc.get("table"), "columns": parsed, "mode": doc.get("mode"), "key": tuple(key),
            "on_tombstone": doc.get("on_tombstone"), "on_truncate": doc.get("on_truncate"),
            "create_table": doc.get("create_table"),
            "envelope": doc.get("envelope"), "value_format": doc.get("value_format"),
            "key_format": doc.get("key_format")}


def _file_column(path: Path, name: str, entry) -> Column:
    if not isinstance(entry, dict) or "from" not in entry or not set(entry) <= {"type", "from"} or not all(
            isinstance(v, str) for v in entry.values()):
        raise UsageError(f'--mapping {path}: column {name!r} must be {{ type = "TYPE", from = "SOURCE" }} '
                         "(type may be left out: the table's own)")
    return make_column(name, entry.get("type"), entry["from"])


def build_mapping(*, file: Path | None = None, columns: list[str] | None = None, table: str | None = None,
                  mode: str | None = None, on_tombstone: str | None = None, create_table: bool = False,
                  key: tuple[str, ...] = (), envelope: str | None = None, value_format: str | None = None,
                  key_format: str | None = None, from_schema: bool = False, evolve: str | None = None,
                  on_truncate: str | None = None, on_incompatible: str | None = None) -> Mapping | None:
    """The mapping the flags and file describe, flags winning; None when no typed-sink option was given.

    Under ``envelope = debezium`` the mode defaults to upsert and tombstones to delete: a change stream's
    creates and updates replace the row, its deletes remove it. With ``from_schema`` the row's columns come
    from the records' schema, and ``columns`` may only add what the row has not: ``source:``, ``envelope:``,
    the key, a header or the record's metadata (``extra_columns``)."""
    if file is None and not columns and mode is None and on_tombstone is None and not create_table \
            and envelope is None and not from_schema and on_truncate is None:
        return None  # (a --value-format alone is for the stdout sink or --id-from; the caller checks it)
    base = load_file(file) if file is not None else {}
    merged: dict[str, Column] = {c.name: c for c in base.get("columns", [])}
    for column in map(parse_column, columns or []):
        merged[column.name] = column
    table = table or base.get("table")
    row_column = next((c for c in merged.values() if c.source.kind == "value"), None)
    if from_schema and row_column is not None:
        raise UsageError(f"columns = \"from-schema\" takes the row's columns from the records' schema: column "
                         f"{row_column.name!r} reads {row_column.source.spec!r}; list only columns the row has not "
                         "(source:, envelope:, key, header:, metadata)")
    if not merged and not from_schema:
        raise UsageError("a typed sink needs columns: --column 'NAME [TYPE] = SOURCE' or [columns] in --mapping")
    if not table:
        raise UsageError("a typed sink needs its table: --table [SCHEMA.]NAME, or table = in --mapping")
    envelope = envelope or base.get("envelope") or "none"
    cdc = envelope == "debezium"
    key = tuple(column_name(k, "key column") for k in key or base.get("key") or ())  # spelled as the columns are
    mapping = Mapping(table_name(table), tuple(merged.values()),
                      mode or base.get("mode") or ("upsert" if cdc else "insert"), key,
                      on_tombstone or base.get("on_tombstone") or ("delete" if cdc else "dead-letter"),
                      bool(create_table or base.get("create_table")), envelope,
                      value_format or base.get("value_format") or "json", key_format or base.get("key_format") or "json",
                      from_schema, evolve or "none", on_truncate or base.get("on_truncate") or "dead-letter")
    if mapping.evolve not in EVOLVE:
        raise UsageError(f"evolve {mapping.evolve!r}: use {' or '.join(EVOLVE)}")
    if mapping.evolve != "none" and not from_schema:
        raise UsageError('evolve = "add-columns" follows the records\' schema: give columns = "from-schema" too')
    if on_incompatible not in (None, *INCOMPATIBLE):
        raise UsageError(f"on_incompatible {on_incompatible!r}: use {' or '.join(INCOMPATIBLE)}")
    if on_incompatible is not None and not from_schema:
        raise UsageError('on_incompatible says what to do when the records\' schema changes: give columns = '
                         '"from-schema" too')
    mapping = replace(mapping, on_incompatible=on_incompatible or "stop")
    if from_schema:  # its columns (and key) are each topic's records' (kdg.mapping.from_record): checked then
        checked = validate(replace(mapping, key=()))  # the columns listed besides the schema's, checked now
        return replace(checked, columns=(), extra_columns=checked.columns, key=key)
    return validate(mapping)


def validate(mapping: Mapping) -> Mapping:
    if mapping.mode not in MODES:
        raise UsageError(f"mode {mapping.mode!r}: use insert or upsert")
    if mapping.on_tombstone not in TOMBSTONES:
        raise UsageError(f"on_tombstone {mapping.on_tombstone!r}: use {', '.join(TOMBSTONES)}")
    if mapping.on_truncate not in TRUNCATES:
        raise UsageError(f"on_truncate {mapping.on_truncate!r}: use {' or '.join(TRUNCATES)}")
    if mapping.on_truncate == "apply" and mapping.envelope != "debezium":
        raise UsageError('on_truncate = "apply" applies a Debezium truncate (op t): give envelope = "debezium"')
    if mapping.envelope not in ENVELOPES:
        raise UsageError(f"envelope {mapping.envelope!r}: use {' or '.join(ENVELOPES)}")
    check_format(mapping.value_format, "value_format")
    check_format(mapping.key_format, "key_format")
    for fmt, kind, what in ((mapping.value_format, "value", "json:"), (mapping.key_format, "key", "key:FIELD")):
        reading = next((c for c in mapping.columns if c.source.kind == kind), None)
        if fmt == "raw" and (reading is not None or (kind == "value" and mapping.envelope != "none")):
            shown = f"column {reading.name!r} reads {reading.source.spec!r}" if reading else "envelope = debezium"
            raise UsageError(f"{kind}_format raw: {shown}, which needs the {kind} decoded; "
                             f"use json, avro, protobuf or json-schema, or no {what} source")
    enveloped = next((c for c in mapping.columns if c.source.kind in ENVELOPE_KINDS), None)
    if enveloped is not None and mapping.envelope != "debezium":
        raise UsageError(f"column {enveloped.name!r} reads {enveloped.source.spec!r}, a field of a change event: "
                         "give --envelope debezium (envelope = \"debezium\" in --mapping)")
    if len(set(mapping.key)) != len(mapping.key):
        raise UsageError(f"key {list(mapping.key)} names a column twice")
    mapping.check_key(mapping.key, "key")
    return mapping


def with_key(mapping: Mapping, key: tuple[str, ...]) -> Mapping:
    """``mapping`` with key columns found in the table (its primary key), checked like the mapping's own."""
    mapping.check_key(key, "the table's primary key")
    return replace(mapping, key=key)

"""What evolution would do to a live table, without doing it (issue 47): ``kdg pipeline check`` and
``kdg mapping from-schema --preview`` show it.

A schema (a record's, :func:`~kdg.mapping.from_record.mapping_from_record`, or a registry subject's) is planned
against the table as Postgres has it now (:func:`~kdg.mapping.evolution.plan_changes`), as the sink plans it
before the batch that carries it; each change is said as the route's ``evolve`` and ``on_incompatible`` would
treat it. Nothing is altered: the table is only inspected.

Example:
    >>> from kdg.mapping.evolution import SchemaChange
    >>> from kdg.settings import table_name
    >>> describe(SchemaChange("qty", "widen", "bigint", "integer"), table_name("t"), "add-columns", "stop")
    'would widen qty integer → bigint'
"""

from dataclasses import dataclass, field

from kdg.mapping.evolution import SchemaChange, plan_changes
from kdg.mapping.spec import Mapping, spelled
from kdg.settings import TableName

UP_TO_DATE = "up to date"
# evolve = "none": what the sink does with a change it only says (kdg.sinks.postgres)
_LEFT = {"add": "its values are not written", "widen": "a value past the column's range is dead-lettered",
         "drop not null": "a null is dead-lettered"}


@dataclass
class EvolutionPreview:
    """What one schema asks of one table, and what the route would do about it."""

    table: str                  # the table's identity (schema-qualified)
    state: str                  # exists | would be created | does not exist
    changes: list[dict] = field(default_factory=list)  # each change planned: column, change, type, was
    lines: list[str] = field(default_factory=list)     # each said for a person; "up to date" when none
    stops: str | None = None    # an incompatible change that would stop the route: why (on_incompatible = stop)


def describe(change: SchemaChange, table: TableName, evolve: str, on_incompatible: str) -> str:
    """One change as the route would meet it: ``would add column x text``, ``would widen qty integer →
    bigint``, ``would drop NOT NULL of y``, what evolve = none leaves, or an incompatible change and what follows."""
    if change.change == "incompatible":
        then = ("stops the route" if on_incompatible != "dead-letter"
                else 'its records go to the dead-letter topic: on_incompatible = "dead-letter"')
        return f"incompatible: {change.reason(table)} ({then})"
    column = spelled(change.column)
    said = {"add": f"add column {column} {change.type}", "widen": f"widen {column} {change.was} → {change.type}",
            "drop not null": f"drop NOT NULL of {column}"}[change.change]
    if evolve != "add-columns":
        return f"would not {said} (evolve = none: said once; {_LEFT[change.change]})"
    return f"would {said}"


def preview_schema(store, found: Mapping, optional: set) -> EvolutionPreview:
    """Plan ``found`` (its columns and types the schema's; its evolve, on_incompatible and create_table the
    route's) against its table through ``store`` (:class:`kdg.store.pg.Store`), altering nothing. ``optional``:
    the columns whose fields may be null."""
    table = store.resolve_table(found.table)
    shape = store.table_shape(table)
    if shape is None:
        columns = ", ".join(f"{spelled(c.name)} {c.type_name}" for c in found.columns)
        if not found.create_table:
            return EvolutionPreview(table.text, "does not exist", lines=[
                f"table {table.text} does not exist: create it, or set create_table = true (--create-table)"])
        return EvolutionPreview(table.text, "would be created", lines=[f"would create it: {columns}"])
    changes = plan_changes(found, optional, shape.types, shape.not_null, shape.primary_key)
    lines = [describe(c, table, found.evolve, found.on_incompatible) for c in changes] or [UP_TO_DATE]
    wrong = next((c for c in changes if c.change == "incompatible"), None)
    stops = wrong.reason(table) if wrong is not None and found.on_incompatible != "dead-letter" else None
    return EvolutionPreview(table.text, "exists", [{"column": c.column, "change": c.change, "type": c.type,
                                                    "was": c.was} for c in changes], lines, stops)


def preview_records(store, mapping: Mapping, records, registry: dict | None = None) -> EvolutionPreview | None:
    """The newest of ``records`` (:class:`kdg.records.Record`) that carries a schema, planned against
    ``mapping``'s table (a ``columns = "from-schema"`` route's mapping, its table named); None when none does.
    ``registry``: the Schema Registry settings, for records that name their schema by id. A schema kdg cannot
    make columns of is the usage error :func:`mapping_from_record` raises."""
    from kdg.mapping.from_record import mapping_from_record, optional_columns
    from kdg.schemas.formats import SCHEMA_FORMATS
    from kdg.schemas.registry import Registry

    client = Registry(registry or {}) if mapping.value_format in SCHEMA_FORMATS else None

    newest = sorted((r for r in records if r.value is not None),
                    key=lambda r: (r.timestamp or 0, r.offset or 0), reverse=True)
    for rec in newest:
        found = mapping_from_record(rec.value, rec.key, mapping, mapping.table, client)
        if found is not None:
            return preview_schema(store, found, optional_columns(rec.value, mapping.envelope, mapping.value_format,
                                                                 client))
    return None


def preview_subject(dsn: str, doc: dict, text: str, fmt: str) -> EvolutionPreview:
    """What evolve = "add-columns" would do to ``doc``'s table (a mapping :func:`kdg.schemas.derive.derive_mapping`
    made of the schema ``text`` of format ``fmt``) in the database at ``dsn``, altering nothing."""
    from kdg.mapping.spec import make_column
    from kdg.settings import table_name
    from kdg.store.pg import Store

    columns = tuple(make_column(name, c["type"], c["from"]) for name, c in doc["columns"].items())
    found = Mapping(table_name(doc["table"]), columns, create_table=True, evolve="add-columns")
    with Store(dsn) as store:
        return preview_schema(store, found, optional_fields(text, fmt))


def optional_fields(text: str, fmt: str) -> set:
    """The columns whose fields a registry schema lets be null: an Avro union with null, a JSON Schema property
    not ``required`` (a Protobuf field always has a value: its default)."""
    import json

    from kdg.schemas.derive import column_name

    if fmt == "protobuf":
        return set()
    schema = json.loads(text)
    if fmt == "avro":
        return {column_name(f["name"]) for f in schema.get("fields", ())
                if isinstance(f.get("type"), list) and "null" in f["type"]}
    required = set(schema.get("required") or ())
    return {column_name(name) for name in schema.get("properties") or {} if name not in required}

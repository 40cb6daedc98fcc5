"""A user's table as a typed sink meets it: its columns and unique keys, checked against the mapping.

Everything is checked before a record is read: a mapped column missing from the table, a type
Postgres does not have or that does not fit, a NOT NULL column nothing fills, an upsert key without a
unique index, a column Postgres generates itself — each is a usage error naming the column. A column
mapped without a type takes the table's. ``create_table`` makes the table from the mapping instead
(every type given, then).
"""

from dataclasses import dataclass, field, replace

from kdg.errors import UsageError
from kdg.mapping.spec import Column, Mapping, spelled, with_key
from kdg.mapping.types import ColumnType
from kdg.store.identity import resolve_table
from kdg.store.owners import follow_new_table

_COLUMNS = """SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type,
                     format_type(a.atttypid, NULL) AS pg, t.typcategory = 'A' AS is_array,
                     a.attnotnull AS not_null, a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '' AS defaulted,
                     CASE WHEN a.attidentity = 'a' THEN 'GENERATED ALWAYS AS IDENTITY'
                          WHEN a.attgenerated = 's' THEN 'GENERATED ALWAYS AS (…) STORED'
                          WHEN a.attgenerated <> '' THEN 'GENERATED ALWAYS AS (…)' END AS generated
              FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
              WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
              ORDER BY a.attnum"""
# type names (already checked to be nothing more) as Postgres resolves them on the search path, in one trip
_TYPES = """SELECT format_type(t.oid, NULL) AS pg, t.typcategory = 'A' AS is_array
            FROM unnest($1::text[]) WITH ORDINALITY AS n(name, i)
            LEFT JOIN pg_type t ON t.oid = to_regtype(n.name) AND t.typisdefined ORDER BY n.i"""
# unique indexes ON CONFLICT can use: no predicate, no expressions; key columns only (INCLUDE ones left out)
_UNIQUE = """SELECT i.indisprimary AS is_primary, array_agg(a.attname::text ORDER BY k.n) AS columns
             FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
             WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indisvalid AND i.indpred IS NULL
               AND i.indexprs IS NULL AND k.n <= i.indnkeyatts
             GROUP BY i.indexrelid, i.indisprimary"""


@dataclass(frozen=True)
class TableShape:
    """What a typed sink needs to know of a table."""

    types: dict[str, str]                                  # column → format_type()
    base: dict[str, tuple[str, bool]]                      # column → (format_type without modifier, array)
    unfilled: tuple[str, ...] = ()                         # NOT NULL columns with no default
    unique_keys: tuple[frozenset, ...] = ()                # column sets of usable unique indexes
    primary_key: tuple[str, ...] = ()
    generated: dict[str, str] = field(default_factory=dict)  # column → how Postgres fills it, refusing any value
    not_null: tuple[str, ...] = ()                         # NOT NULL columns, defaulted or not

    def has(self, column: str) -> bool:
        return column in self.types


async def inspect_table(conn, table) -> TableShape | None:
    """The shape of ``table`` (a TableName), or None if there is no such table."""
    kind = await conn.fetchval(
        "SELECT c.relkind::text FROM pg_class c WHERE c.oid = to_regclass($1)", table.sql)
    if kind is None:
        return None
    if kind not in ("r", "p"):
        raise UsageError(f"{table.text} is not a table (relkind {kind!r}); a typed sink writes into tables only")
    columns = await conn.fetch(_COLUMNS, table.sql)
    unique = await conn.fetch(_UNIQUE, table.sql)
    return TableShape(types={r["name"]: r["type"] for r in columns},
                      base={r["name"]: (r["pg"], r["is_array"]) for r in columns},
                      unfilled=tuple(r["name"] for r in columns if r["not_null"] and not r["defaulted"]),
                      unique_keys=tuple(frozenset(r["columns"]) for r in unique),
                      primary_key=next((tuple(r["columns"]) for r in unique if r["is_primary"]), ()),
                      generated={r["name"]: r["generated"] for r in columns if r["generated"] is not None},
                      not_null=tuple(r["name"] for r in columns if r["not_null"]))


async def resolve_types(conn, mapping: Mapping) -> Mapping:
    """Every type the mapping names, as Postgres names it (a usage error when Postgres has no such type)."""
    typed = [c for c in mapping.columns if c.type is not None]
    found = dict(zip((c.name for c in typed),
                     await conn.fetch(_TYPES, [c.type.lookup for c in typed]) if typed else []))
    columns = []
    for column in mapping.columns:
        if column.type is not None:
            pg = found[column.name]
            if pg["pg"] is None:
                raise UsageError(f"column {column.name!r}: unknown type {column.type.name!r}: Postgres has no such "
                                 "type on the search path (a type in another schema: SCHEMA.TYPE)")
            column = replace(column, type=column.type.resolved(pg["pg"], pg["is_array"]))
        columns.append(column)
    return replace(mapping, columns=tuple(columns))


def _from_table(column: Column, shape: TableShape) -> Column:
    pg, array = shape.base[column.name]
    return replace(column, type=ColumnType(shape.types[column.name], pg, pg=pg, array=array))


def check_mapping(mapping: Mapping, shape: TableShape) -> Mapping:
    """``mapping`` (its types resolved) checked against the table; its key columns resolved (the table's primary
    key if unset) and the type of each column mapped without one taken from the table.

    Columns from the records' schema (``from_schema``; not its ``extra_columns``) take the table's types: whether
    the table takes a schema's types is decided per schema as its records are written
    (:func:`kdg.mapping.evolution.plan_changes`)."""
    table = mapping.table.text
    if mapping.from_schema:
        mapping = replace(mapping, columns=tuple(replace(c, type=None) if c not in mapping.extra_columns
                                                 and shape.has(c.name) else c for c in mapping.columns))
    for column in mapping.columns:
        if not shape.has(column.name):
            raise UsageError(f'column "{column.name}" is not in table {table} (its columns: '
                             f'{", ".join(shape.types)})')
        if column.name in shape.generated:
            # Postgres would refuse every row's INSERT (428C9), found only once records were read: under
            # at-most-once, after their offsets were committed
            how = shape.generated[column.name]
            by_default = (f"; or let it take given values: ALTER TABLE {table} ALTER COLUMN {column.sql} SET "
                          "GENERATED BY DEFAULT") if how.endswith("IDENTITY") else ""
            raise UsageError(f'column "{column.name}" of {table} is {how}: Postgres generates its values and '
                             f"refuses any other; leave it out of the mapping and Postgres fills it{by_default}")
        found = shape.types[column.name]
        if column.type is not None and not column.type.fits(found, shape.base[column.name][0]):
            raise UsageError(f'column "{column.name}": the mapping says {column.type.name}, '
                             f"table {table} has {found}")
    mapping = replace(mapping, columns=tuple(c if c.type is not None else _from_table(c, shape)
                                             for c in mapping.columns))
    mapped = {c.name for c in mapping.columns}
    unfilled = [c for c in shape.unfilled if c not in mapped]
    if unfilled:
        raise UsageError(f'column "{unfilled[0]}" of {table} is NOT NULL with no default, and the mapping '
                         "does not fill it: map it with --column or [columns]")
    if mapping.mode != "upsert" and mapping.on_tombstone != "delete":
        return mapping
    why = "upsert" if mapping.mode == "upsert" else "on_tombstone = delete"
    if not mapping.key and not shape.primary_key:
        raise UsageError(f"{why} needs key columns: key = [\"…\"] in --mapping, or a primary key on {table}")
    resolved = mapping if mapping.key else with_key(mapping, shape.primary_key)
    if mapping.mode == "upsert" and frozenset(resolved.key) not in shape.unique_keys:
        cols = ", ".join(resolved.key)
        raise UsageError(f"upsert on ({cols}) needs a primary key or unique index on exactly those columns of "
                         f"{table}: CREATE UNIQUE INDEX ON {table} ({cols})")
    return resolved


def create_table_sql(mapping: Mapping) -> str:
    """DDL of a table made from the mapping: each column with its type, the key columns as primary key."""
    cols = [f"{c.sql} {c.type.name}" for c in mapping.columns]
    if mapping.key:
        cols.append(f"PRIMARY KEY ({', '.join(mapping.column(k).sql for k in mapping.key)})")
    return f"CREATE TABLE IF NOT EXISTS {mapping.table.sql} ({', '.join(cols)})"


async def prepare_table(conn, mapping: Mapping, *, dry_run: bool = False,
                        notices: list | None = None) -> tuple[Mapping, TableShape | None]:
    """Check ``mapping`` against its table, creating the table first if the mapping says so (not on a dry run);
    claims kept under the name of a table it creates go with it, said in ``notices``
    (:func:`kdg.store.owners.follow_new_table`).

    Returns the mapping with its table resolved to its identity (schema-qualified, :mod:`kdg.store.identity`)
    and its key resolved, and the table's shape (None: a dry run would create it).
    """
    table = await resolve_table(conn, mapping.table)
    mapping = await resolve_types(conn, replace(mapping, table=table))
    shape = await inspect_table(conn, table)
    if shape is None:
        if not mapping.create_table:
            raise UsageError(f"table {table.text} does not exist: create it, or pass --create-table "
                             "(create_table = true) to make it from the mapping")
        untyped = [c.name for c in mapping.columns if c.type is None]
        if untyped:
            raise UsageError(f"--create-table: column {untyped[0]!r} needs its type, as the table does not exist "
                             f"yet: --column '{spelled(untyped[0])} TYPE = …'")
        if not mapping.key and (mapping.mode == "upsert" or mapping.on_tombstone == "delete"):
            why = "upsert" if mapping.mode == "upsert" else "on_tombstone = delete"
            raise UsageError(f"--create-table: {why} needs key columns, the new table's primary key: "
                             "key = [\"…\"] in --mapping")
        if dry_run:
            return mapping, None
        async with conn.transaction():  # the table appears with its name's old claims gone
            await conn.execute(create_table_sql(mapping))
            notes = await follow_new_table(conn, table)
        if notices is not None:
            notices.extend(notes)
        shape = await inspect_table(conn, table)
    return check_mapping(mapping, shape), shape

"""One identity per table: the schema-qualified name Postgres itself resolves a spelling to.

``events``, ``public.events`` and ``"public"."events"`` name one table under the default search
path, and ``ev`` names two different tables under ``search_path=sa`` and ``search_path=sb``. Every
key kdg stores for a table (dedup claims, replays, the audit's lookups) is the identity this module
returns, never the user's spelling: one table is one namespace, and two tables never share one.
"""

from kdg.errors import UsageError
from kdg.settings import TableName, table_name

# An existing relation: where the search path finds it.
_FOUND = """SELECT n.nspname, c.relname FROM pg_class c
            JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)"""


async def resolve_table(conn, spelling: "str | TableName", *, where: str = "") -> TableName:
    """The identity of the table ``spelling`` names on ``conn``: schema-qualified, case as stored.

    An existing table is found the way a query would find it (``to_regclass``, after the search path).
    A table still to be created gets the schema ``CREATE TABLE`` would put it in: the named one, or
    ``current_schema()``. A named schema that does not exist, or a search path with no schema to
    create in, is a usage error (``where``, e.g. `` in postgresql://…``, says which database).
    """
    table = table_name(spelling)
    found = await conn.fetchrow(_FOUND, table.sql)
    if found is not None:
        return TableName(found["nspname"], found["relname"])
    if table.schema is not None:
        if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", table.schema):
            schema = TableName(None, table.schema).text
            raise UsageError(f'schema "{table.schema}" does not exist{where}; create it first (CREATE SCHEMA {schema})')
        return table
    schema = await conn.fetchval("SELECT current_schema()")
    if schema is None:
        path = await conn.fetchval("SHOW search_path")
        raise UsageError(f"table {table.text}: no schema on the search path ({path}) exists{where} to create it "
                         "in; name its schema (--table SCHEMA.NAME)")
    return TableName(schema, table.name)

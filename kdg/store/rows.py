"""The shape of a sink row, defined once.

`kdg consume` builds these rows in Python, Spark's projection builds them in SQL, and the store
COPYs them; the column list, the staging table and the Spark projection are all generated from
:data:`SINK_ROW` below, so the three can never drift apart.
"""

from json.encoder import encode_basestring_ascii as _esc

# (column, Postgres type, Spark SQL expression over the Kafka source's frame); the idempotency
# key's expression depends on --id-from, so it is given by the caller.
SINK_ROW: tuple[tuple[str, str, str], ...] = (
    ("idempotency_key", "text", "{key}"),
    ("topic", "text", "topic"),
    ("partition", "integer", "partition"),
    ("offset", "bigint", "offset"),
    ("key", "bytea", "key"),
    ("value", "bytea", "value"),
    # repeated header names: the last wins, as jsonb (and Spark's LAST_WIN map policy) keep it
    ("headers", "jsonb", "coalesce(to_json(map_from_entries(transform(headers, "
                         "h -> struct(h.key, cast(h.value as string))))), '{{}}')"),
)

SINK_COLUMNS = tuple(name for name, _, _ in SINK_ROW)
# the sink table adds the group that wrote each row, right after the key
GROUP_SINK_COLUMNS = (SINK_COLUMNS[0], "consumer_group", *SINK_COLUMNS[1:])


def quoted(columns: tuple[str, ...]) -> str:
    """``"idempotency_key", "topic", …`` for SQL text."""
    return ", ".join(f'"{c}"' for c in columns)


def staging_table(name: str = "kdg_stage") -> str:
    """DDL of the per-connection staging table the store COPYs batches into."""
    cols = ", ".join(f'"{c}" {pg_type}' for c, pg_type, _ in SINK_ROW)
    return f"CREATE TEMP TABLE IF NOT EXISTS {name} ({cols}) ON COMMIT DELETE ROWS"


def spark_projection(key_sql: str) -> list[str]:
    """``selectExpr`` arguments that shape Spark's Kafka frame as sink rows."""
    return [f"{expr.format(key=key_sql)} AS `{c}`" for c, _, expr in SINK_ROW]


def headers_json(headers) -> str:
    """Headers as a JSON object, exactly as ``json.dumps`` would write it, at under half the cost.

    A repeated header name appears twice in the text; ``jsonb`` keeps the last, as a dict would.
    """
    return "{" + ",".join([_esc(k) + ":" + ("null" if v is None else _esc(v.decode("utf-8", "replace")))
                           for k, v in headers]) + "}"


def sink_row(rec, key: str) -> tuple:
    """One record as a sink row, in :data:`SINK_COLUMNS` order."""
    return (key, rec.topic, rec.partition, rec.offset, rec.key, rec.value, headers_json(rec.headers))

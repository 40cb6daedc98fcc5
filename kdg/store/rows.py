"""The shape of a sink row, defined once.

`kdg consume` builds these rows in Python, Spark's projection builds them in SQL, and the store
COPYs them; the column list, the staging table and the Spark projection are all generated from
:data:`SINK_ROW` below, so the three can never drift apart.
"""

from itertools import chain, groupby, repeat
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


class SinkRows:
    """A batch's sink rows as columns in :data:`SINK_COLUMNS` order: what the store COPYs, made per batch.

    The consume loop sorts a poll straight into columns (:mod:`kdg.batching`), so a row is never a Python
    object of its own: COPY reads tuples that ``zip`` makes in C as it goes, and the claims, the sink table
    and the staging table each take the columns they need. Rows made one at a time (Spark's, the per-record
    path's :func:`sink_row`) are turned into columns by :meth:`of`.
    """

    __slots__ = ("columns",)

    def __init__(self, columns: list[list]):
        if len(columns) != len(SINK_COLUMNS):
            raise ValueError(f"{len(columns)} columns, not {len(SINK_COLUMNS)}")
        self.columns = columns

    @classmethod
    def of(cls, rows) -> "SinkRows":
        """``rows`` as columns: already columns, or tuples in :data:`SINK_COLUMNS` order."""
        if isinstance(rows, SinkRows):
            return rows
        rows = list(rows)
        return cls([list(c) for c in zip(*rows)] if rows else [[] for _ in SINK_COLUMNS])

    @classmethod
    def concat(cls, parts: "list[SinkRows]") -> "SinkRows":
        return cls([[v for p in parts for v in p.columns[i]] for i in range(len(SINK_COLUMNS))])

    def __len__(self) -> int:
        return len(self.columns[0])

    def __bool__(self) -> bool:
        return bool(self.columns[0])

    @property
    def keys(self) -> list[str]:
        return self.columns[0]

    @property
    def partitions(self) -> list[int]:
        return self.columns[2]

    def as_list(self) -> list[tuple]:
        """The rows as a list of tuples, as a ``--handler`` is given them."""
        return list(zip(*self.columns))

    def tuples(self):
        """The rows as tuples in :data:`SINK_COLUMNS` order, made as they are read."""
        return zip(*self.columns)

    def grouped(self, group: str):
        """The rows as :data:`GROUP_SINK_COLUMNS` tuples: the group that writes them after the key."""
        key, *rest = self.columns
        return zip(key, repeat(group, len(key)), *rest)


def topic_runs(topics: list[str]) -> list[tuple[str, int, int]]:
    """``(topic, start, end)`` of each run of one topic in a batch's column of topics, in order (a poll comes in
    runs of one partition: each fetch's messages in order), so that a table's share is cut per run, not per row."""
    runs, start = [], 0
    for topic, run in groupby(topics):
        end = start + len(list(run))
        runs.append((topic, start, end))
        start = end
    return runs


def take_spans(columns: list[list], spans: list[tuple[int, int]]) -> list[list]:
    """The rows in ``spans`` (``(start, end)``, in order) of each column: a table's share of a batch of several
    topics, sliced in C."""
    if len(spans) == 1:
        start, end = spans[0]
        return [col[start:end] for col in columns]
    return [list(chain.from_iterable(col[start:end] for start, end in spans)) for col in columns]

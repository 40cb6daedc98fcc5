"""Exactly-once claims: each row's idempotency key is claimed once in ``kdg_dedup``, and only rows
whose claim is new reach the sink.

The claim itself (:data:`CLAIM`, :func:`copy_claims`) is shared with the typed sink
(:mod:`kdg.store.typed`); :class:`ClaimsMixin` is the generic sink's exactly-once path, mixed
into :class:`kdg.store.pg.Store`.
"""

import asyncio

import asyncpg

from kdg.settings import TableName, table_name
from kdg.store.rows import GROUP_SINK_COLUMNS, SINK_COLUMNS

# Claim each staged key in kdg_dedup; the generic sink's fallback path (below) and the typed sink's
# TypedTarget.claim_sql use the same statement.
CLAIM = """INSERT INTO kdg_dedup (sink_table, idempotency_key, topic, "partition", "offset")
           SELECT $1, idempotency_key, topic, "partition", "offset" FROM {stage}
           ON CONFLICT DO NOTHING RETURNING idempotency_key, "partition", "offset\""""


DEDUP_COLUMNS = ("sink_table", "idempotency_key", "topic", "partition", "offset")  # a claim: whose key, from where


async def copy_claims(conn: asyncpg.Connection, claims: list[tuple]) -> bool:
    """Claim keys by COPY straight into ``kdg_dedup``, under a savepoint; False (nothing claimed) if any
    key was claimed before or comes twice — then the caller claims through :data:`CLAIM`, row by row in SQL.

    The common case (every key new) costs one COPY instead of an INSERT … SELECT that returns each claim.
    """
    try:
        async with conn.transaction():
            await conn.copy_records_to_table("kdg_dedup", records=claims, columns=DEDUP_COLUMNS)
        return True
    except asyncpg.exceptions.UniqueViolationError:
        return False


async def maybe_await(value):
    """``value``, awaited first if it is a coroutine (a user's handler may be sync or async)."""
    if asyncio.iscoroutine(value):
        return await value
    return value


class ClaimsMixin:
    """The generic sink's exactly-once writes: owns claiming keys and inserting the newly claimed rows.

    Touches ``kdg_dedup`` (the claims), the temp ``kdg_stage`` table (the fallback path), the sink
    table named by the caller, and — through :class:`~kdg.store.offsets.OffsetsMixin`'s
    ``_move_offsets`` — ``kdg_offsets``, all in the one transaction of the batch.
    """

    def write_exactly_once(self, table: str | TableName, group: str, rows: list[tuple], next_offsets: dict[int, int],
                           topic: str, fences: dict[int, int], handler=None, before_commit=None, *,
                           expected: dict[int, int | None] | None = None, turn=None) -> int:
        """One transaction: claim keys, insert newly claimed rows, move fenced offsets. Returns rows inserted.

        ``expected`` (pipelined writes) also requires each partition's stored offset to be what the
        batch before this one left (partitions missing from it are not checked), so a batch whose predecessor rolled back rolls back too. ``turn``
        (a :class:`kdg.sinks.pipeline.Turn`) orders the claims and the offset update after the
        predecessor's, on another connection; see :mod:`kdg.sinks.pipeline`.
        """
        return self._run(self._write_exactly_once(table, group, rows, next_offsets, topic, fences,
                                                  handler, before_commit, expected, turn))

    async def _write_exactly_once(self, table, group, rows, next_offsets, topic, fences, handler, before_commit,
                                  expected=None, turn=None):
        async with self.conn.transaction():
            if turn is not None:
                turn.wait_claims()
            inserted = await self._claim_and_insert(table, group, rows, claimed=turn.claimed if turn else None)
            if turn is not None:  # the user's SQL runs after the batch before ended, as without a pipeline
                turn.wait_update() if handler is None else turn.wait_ended()
            if handler is not None:
                await maybe_await(handler(rows, self.conn))
            await self._move_offsets(group, topic, next_offsets, fences, expected)
            if turn is not None:
                turn.updated()  # (a failure ends the turn too: the pipeline's job always ends it)
            if before_commit is not None:
                before_commit()
        return inserted

    def write_claimed(self, table: str | TableName, group: str, rows: list[tuple]) -> int:
        """One transaction: claim keys, insert newly claimed rows (no offsets). Returns rows inserted."""
        async def write():
            async with self.conn.transaction():
                return await self._claim_and_insert(table, group, rows)

        return self._run(write()) if rows else 0

    async def _claim_and_insert(self, table: str | TableName, group: str, rows: list[tuple], claimed=None) -> int:
        """Claim each row's key in ``kdg_dedup`` and insert the rows whose claim is new (inside a transaction).

        Keys never claimed before (the common case) go in by COPY straight into ``kdg_dedup`` and
        the sink. A key claimed earlier, or twice in ``rows``, breaks ``kdg_dedup``'s primary key;
        the savepoint then rolls back and the ON CONFLICT path claims only what is new.
        ``claimed()``, when given, is called once this batch's keys are claimed (before its rows go in).
        """
        if not rows:
            if claimed is not None:
                claimed()
            return 0
        table = table_name(table)
        if await copy_claims(self.conn, [(table.text, *r[:4]) for r in rows]):
            if claimed is not None:
                claimed()
            await self.conn.copy_records_to_table(
                table.name, schema_name=table.schema, records=[(r[0], group, *r[1:]) for r in rows],
                columns=GROUP_SINK_COLUMNS)
            return len(rows)
        await self.conn.copy_records_to_table("kdg_stage", records=rows, columns=SINK_COLUMNS)
        # ON CONFLICT DO NOTHING also skips a key repeated within the batch: the first
        # staged copy wins, and only the claimed (key, partition, offset) rows are inserted.
        status = await self.conn.execute(f"""
            WITH claimed AS ({CLAIM.format(stage="kdg_stage")})
            INSERT INTO {table.sql} (idempotency_key, consumer_group, topic, "partition", "offset",
                                 key, value, headers)
            SELECT s.idempotency_key, $2, s.topic, s."partition", s."offset", s.key, s.value, s.headers
            FROM kdg_stage s JOIN claimed c USING (idempotency_key, "partition", "offset")""", table.text, group)
        if claimed is not None:
            claimed()
        return int(status.split()[-1])

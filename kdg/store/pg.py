"""The one Postgres store: sink rows, dedup claims, fenced offsets and the producer ledger.

``kdg consume``, ``kdg produce``, ``kdg audit`` and Spark executors all write through here.
The SQL is async (asyncpg); :class:`Store` gives plain callers a blocking facade on a private
event loop, so it can be used from confluent-kafka callbacks and Spark tasks alike.
"""

import asyncio
import json
import time
from typing import Callable

import asyncpg

from kdg.errors import ConnectionFailed, Fenced, PostgresRefused, RetryBatch, UsageError
from kdg.settings import TableName, redact_dsn, table_name
from kdg.store.identity import resolve_table
from kdg.store.migrations import connect, require_schema
from kdg.store.rows import GROUP_SINK_COLUMNS, SINK_COLUMNS, quoted, staging_table
from kdg.store.tables import prepare_table
from kdg.store.typed import CLAIM, TypedResult, TypedTarget, copy_claims, write_batch

LEDGER_COLUMNS = ("run_id", "idempotency_key", "topic", "seq", "status", "partition", "offset", "error")
_STAGE = staging_table()


class Store:
    """A blocking facade over one asyncpg connection."""

    def __init__(self, dsn: str):
        self.dsn = dsn
        self._loop = asyncio.new_event_loop()
        self._sink_ready: set[TableName] = set()
        self._stages: set[str] = set()
        try:
            self.conn: asyncpg.Connection = self._run(connect(dsn))
        except BaseException:
            self._loop.close()
            raise
        try:
            self._run(require_schema(self.conn, dsn))
            self._run(self.conn.execute(_STAGE))
        except BaseException:
            self.close()  # a store that cannot be used leaves no connection behind
            raise

    def _run(self, coro):
        try:
            return self._loop.run_until_complete(coro)
        except (OSError, asyncpg.exceptions.ConnectionDoesNotExistError,
                asyncpg.exceptions.InterfaceError, asyncpg.exceptions.AdminShutdownError,
                asyncpg.exceptions.CannotConnectNowError) as exc:
            raise ConnectionFailed(f"lost Postgres at {redact_dsn(self.dsn)}: {exc}") from exc
        except asyncpg.PostgresError as exc:
            raise PostgresRefused(f"Postgres refused a statement ({exc.sqlstate} {type(exc).__name__}): "
                                  f"{str(exc).splitlines()[0]}") from exc

    def lost(self) -> bool:
        """Whether the connection is gone (the server went away), as opposed to a statement failing."""
        return self.conn.is_closed()

    def alive(self) -> bool:
        """Whether Postgres answers on this connection now (a connection idle through a restart looks open)."""
        if self.lost():
            return False
        try:
            self._run(self.conn.fetchval("SELECT 1"))
            return True
        except ConnectionFailed:
            return False

    def reconnect(self, give_up_after: float, notice: Callable[[str], None] = lambda text: None) -> float:
        """Connect again after :meth:`lost`, backing off until Postgres answers; returns the seconds waited.

        Postgres restarting, in recovery or out of connections is waited for; after
        ``give_up_after`` seconds the last error is raised as :class:`ConnectionFailed`.
        Per-session state (the temp staging tables) is made again on the new connection.
        """
        self.conn.terminate()
        started, delay, attempt = time.monotonic(), 0.25, 0
        while True:
            attempt += 1
            try:
                conn = self._run(connect(self.dsn, timeout=5))
                try:
                    self._run(conn.execute(_STAGE))
                except BaseException:
                    conn.terminate()
                    raise
                break
            except ConnectionFailed as exc:
                waited = time.monotonic() - started
                if waited + delay > give_up_after:
                    raise ConnectionFailed(f"Postgres did not come back within {give_up_after:g} s "
                                           f"(attempt {attempt}): {exc}") from exc
                notice(f"Postgres unreachable (attempt {attempt}, {waited:.1f} s): {exc}; "
                       f"retrying in {delay:g} s")
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        self.conn = conn
        self._stages.clear()
        return time.monotonic() - started

    def close(self) -> None:
        """Close the connection and the private loop; a second call does nothing."""
        if self._loop.is_closed():
            return
        closing = self.conn.close(timeout=5)
        try:
            self._loop.run_until_complete(closing)
        except Exception:  # closing a dead connection must not hide the real error
            closing.close()  # never awaited if the loop did not get to run it
            self.conn.terminate()
        self._loop.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- sink tables -------------------------------------------------------------------------
    def ensure_sink_table(self, table: str | TableName) -> TableName:
        """Create sink ``table`` shaped like ``kdg_events`` if missing; returns its identity (schema-qualified).

        A named schema must exist already: kdg creates its own tables, never a user's schema.
        """
        identity = self.resolve_table(table)
        if identity not in self._sink_ready:
            self._run(self.conn.execute(
                f"CREATE TABLE IF NOT EXISTS {identity.sql} (LIKE kdg_events INCLUDING DEFAULTS INCLUDING INDEXES)"))
            self._sink_ready.add(identity)
        return identity

    def resolve_table(self, table: str | TableName) -> TableName:
        """The identity Postgres gives the table ``table`` names (:func:`kdg.store.identity.resolve_table`)."""
        return self._run(resolve_table(self.conn, table, where=f" in {redact_dsn(self.dsn)}"))

    # -- offsets -----------------------------------------------------------------------------
    def acquire_partitions(self, group: str, topic: str, partitions: list[int]) -> dict[int, tuple[int, int | None]]:
        """Take ownership of ``partitions``: bump each fence; return ``{p: (fence, next_offset)}``."""
        rows = self._run(self.conn.fetch(
            """INSERT INTO kdg_offsets (consumer_group, topic, "partition", fence)
               SELECT $1, $2, p, 1 FROM unnest($3::int[]) AS p
               ON CONFLICT (consumer_group, topic, "partition")
               DO UPDATE SET fence = kdg_offsets.fence + 1, updated_at = now()
               RETURNING "partition", fence, next_offset""", group, topic, partitions))
        return {r["partition"]: (r["fence"], r["next_offset"]) for r in rows}

    def stored_offsets(self, group: str, topic: str) -> dict[int, int]:
        rows = self._run(self.conn.fetch(
            """SELECT "partition", next_offset FROM kdg_offsets
               WHERE consumer_group = $1 AND topic = $2 AND next_offset IS NOT NULL""", group, topic))
        return {r["partition"]: r["next_offset"] for r in rows}

    # -- batches -----------------------------------------------------------------------------
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
                await _maybe_await(handler(rows, self.conn))
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

    async def _move_offsets(self, group, topic, next_offsets, fences, expected=None) -> None:
        if not next_offsets:
            return
        parts = sorted(next_offsets)
        if expected is not None:
            await self._check_chain(group, topic, parts, fences, expected)
        status = await self.conn.execute(
            """UPDATE kdg_offsets o SET next_offset = v.next, updated_at = now()
               FROM unnest($3::int[], $4::bigint[], $5::bigint[]) AS v(p, next, fence)
               WHERE o.consumer_group = $1 AND o.topic = $2 AND o."partition" = v.p AND o.fence = v.fence""",
            group, topic, parts, [next_offsets[p] for p in parts], [fences[p] for p in parts])
        if int(status.split()[-1]) != len(parts):
            raise Fenced(f"partitions {parts} of {topic} were reassigned; this consumer's batch was rolled back")

    async def _check_chain(self, group, topic, parts, fences, expected) -> None:
        """Each partition must still hold what the batch before this one stored there (pipelined writes).

        ``FOR UPDATE`` waits for that batch's transaction on another connection and then reads what
        it left; a plain UPDATE's WHERE would have compared against the row as it was before.
        """
        held = {r["partition"]: r for r in await self.conn.fetch(
            """SELECT "partition", fence, next_offset FROM kdg_offsets
               WHERE consumer_group = $1 AND topic = $2 AND "partition" = ANY($3::int[])
               ORDER BY "partition" FOR UPDATE""", group, topic, parts)}
        if any(p not in held or held[p]["fence"] != fences[p] for p in parts):
            raise Fenced(f"partitions {parts} of {topic} were reassigned; this consumer's batch was rolled back")
        if any(held[p]["next_offset"] != expected.get(p, held[p]["next_offset"]) for p in parts):
            raise RetryBatch(f"the batch written before this one on partitions {parts} of {topic} did not "
                             "commit; this one was rolled back to be read again")

    def write_plain(self, table: str | TableName, group: str, rows: list[tuple], handler=None,
                    before_commit=None) -> int:
        """At-most/at-least-once: insert every row (duplicates stay visible) in one transaction."""
        return self._run(self._write_plain(table, group, rows, handler, before_commit))

    async def _write_plain(self, table, group, rows, handler, before_commit):
        table = table_name(table)
        async with self.conn.transaction():
            if rows:
                await self.conn.copy_records_to_table("kdg_stage", records=rows, columns=SINK_COLUMNS)
                await self.conn.execute(f"""
                    INSERT INTO {table.sql} (idempotency_key, consumer_group, topic, "partition", "offset",
                                         key, value, headers)
                    SELECT idempotency_key, $1, topic, "partition", "offset", key, value, headers
                    FROM kdg_stage""", group)
            if handler is not None:
                await _maybe_await(handler(rows, self.conn))
            if before_commit is not None:
                before_commit()
        return len(rows)

    # -- typed sinks: a user's table, through a mapping --------------------------------------
    def prepare_typed(self, mapping, *, dry_run: bool = False):
        """Check ``mapping`` against its table (creating it if the mapping says so, unless ``dry_run``).

        Returns ``(TypedTarget, TableShape | None)``; a mismatch is a usage error naming the column.
        """
        async def prepare():
            checked, shape = await prepare_table(self.conn, mapping, dry_run=dry_run)
            return TypedTarget(checked), shape

        return self._run(prepare())

    def write_typed(self, target: TypedTarget, rows: list[tuple], *, claim: bool, group: str | None = None,
                    topic: str | None = None, next_offsets: dict[int, int] | None = None,
                    fences: dict[int, int] | None = None, on_rejected=None, handler=None,
                    before_commit=None) -> TypedResult:
        """One transaction: stage and write ``rows`` (claiming keys when ``claim``), then move fenced offsets.

        ``on_rejected(rejected)`` runs before the commit, so rows Postgres refused are dead-lettered
        durably before the offsets that account for them move.
        """
        return self._run(self._write_typed(target, rows, claim, group, topic, next_offsets, fences, on_rejected,
                                           handler, before_commit))

    async def _write_typed(self, target, rows, claim, group, topic, next_offsets, fences, on_rejected, handler,
                           before_commit) -> TypedResult:
        if target.stage not in self._stages:  # ISO times without an offset are UTC, in consume and Spark alike
            await self.conn.execute("SET TIME ZONE 'UTC'")
            await self.conn.execute(target.stage_ddl())
            self._stages.add(target.stage)
        async with self.conn.transaction():
            result = await write_batch(self.conn, target, rows,
                                       claim_table=target.mapping.table.text if claim else None)
            if result.rejected and on_rejected is not None:
                on_rejected(result.rejected)
            if handler is not None:
                await _maybe_await(handler(rows, self.conn))
            if next_offsets:
                await self._move_offsets(group, topic, next_offsets, fences)
            if before_commit is not None:
                before_commit()
        return result

    # -- replay ledger -----------------------------------------------------------------------
    def record_replay(self, replay_id, group: str, topic: str, table: str, guarantee: str,
                      ranges: dict[int, tuple[int, int]], *, done: bool) -> None:
        """Record a replay run; ``done`` also advances the group's stored offsets, in one transaction."""
        async def record():
            async with self.conn.transaction():
                await self.conn.execute(
                    """INSERT INTO kdg_replays (replay_id, consumer_group, topic, sink_table, guarantee, ranges,
                                                status, finished_at)
                       VALUES ($1, $2, $3, $4, $5, $6, $7, CASE WHEN $7 = 'done' THEN now() END)""",
                    replay_id, group, topic, table, guarantee,
                    json.dumps({str(p): list(r) for p, r in sorted(ranges.items())}), "done" if done else "running")
                if done:
                    await self._advance_offsets(group, topic, ranges)

        self._run(record())

    def finish_replay(self, replay_id, group: str, topic: str, ranges: dict[int, tuple[int, int]], *,
                      status: str, summary: dict | None = None, error: str | None = None,
                      advance: bool = False) -> None:
        """Close a run's row (``done`` or ``failed``); ``advance`` moves stored offsets in the same transaction."""
        async def finish():
            async with self.conn.transaction():
                await self.conn.execute(
                    """UPDATE kdg_replays SET status = $2, finished_at = now(), summary = $3, error = $4
                       WHERE replay_id = $1""",
                    replay_id, status, json.dumps(summary) if summary is not None else None, error)
                if advance:
                    await self._advance_offsets(group, topic, ranges)

        self._run(finish())

    async def _advance_offsets(self, group: str, topic: str, ranges: dict[int, tuple[int, int]]) -> None:
        """Stored offsets only move forward; a consumer's fence is left alone."""
        parts = sorted(ranges)
        await self.conn.execute(
            """INSERT INTO kdg_offsets (consumer_group, topic, "partition", next_offset)
               SELECT $1, $2, p, o FROM unnest($3::int[], $4::bigint[]) AS v(p, o)
               ON CONFLICT (consumer_group, topic, "partition") DO UPDATE
               SET next_offset = GREATEST(kdg_offsets.next_offset, EXCLUDED.next_offset), updated_at = now()""",
            group, topic, parts, [ranges[p][1] for p in parts])

    # -- producer ledger ---------------------------------------------------------------------
    def start_run(self, run_id, topic: str, guarantee: str) -> None:
        self._run(self.conn.execute(
            "INSERT INTO kdg_producer_runs (run_id, topic, guarantee) VALUES ($1, $2, $3)", run_id, topic, guarantee))

    def finish_run(self, run_id, summary: dict) -> None:
        self._run(self.conn.execute(
            "UPDATE kdg_producer_runs SET finished_at = now(), summary = $2 WHERE run_id = $1",
            run_id, json.dumps(summary)))

    def copy_ledger(self, rows: list[tuple]) -> None:
        self.copy_rows("kdg_ledger", rows, LEDGER_COLUMNS)

    def copy_rows(self, table: str, rows: list[tuple], columns: tuple[str, ...]) -> None:
        """COPY ``rows`` into ``table`` (a name kdg chose, never the user's)."""
        if rows:
            self._run(self.conn.copy_records_to_table(table, records=rows, columns=columns))

    def execute(self, sql: str, *args) -> str:
        return self._run(self.conn.execute(sql, *args))

    def fetch(self, sql: str, *args):
        return self._run(self.conn.fetch(sql, *args))

    def fetchval(self, sql: str, *args):
        return self._run(self.conn.fetchval(sql, *args))


async def _maybe_await(value):
    if asyncio.iscoroutine(value):
        return await value
    return value


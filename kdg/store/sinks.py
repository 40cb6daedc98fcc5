"""Sink tables and their writes, but for the generic sink's exactly-once path (:mod:`kdg.store.claims`):
the generic table's at-most/at-least-once inserts, and the typed sink (a user's table, through a
mapping), whose exactly-once claim is made inside :func:`kdg.store.typed.write_batch`.

Mixed into :class:`kdg.store.pg.Store`. The typed table's statements are built in
:mod:`kdg.store.typed`, its checks and DDL in :mod:`kdg.store.tables`.
"""

from kdg.mapping.rows import StagedRows
from kdg.settings import TableName, redact_dsn, table_name
from kdg.store.handler import call_handler
from kdg.store.identity import resolve_table
from kdg.store.owners import follow_new_table
from kdg.store.rows import GROUP_SINK_COLUMNS, SinkRows
from kdg.store.tables import inspect_table, prepare_table
from kdg.store.typed import TypedResult, TypedTarget, prepare_batch, stage_batch, write_batch, written_rows


class SinksMixin:
    """The sink tables: owns creating and resolving them, and writing plain and typed batches.

    Touches the generic sink tables (created ``LIKE kdg_events``; plain batches go in by COPY, straight),
    a typed mapping's table through its temp ``kdg_tstage_*`` table (and ``kdg_dedup``
    when the typed write claims), and ``kdg_offsets`` when a typed batch moves its offsets.
    """

    # -- sink tables -------------------------------------------------------------------------
    def ensure_sink_table(self, table: str | TableName) -> TableName:
        """Create sink ``table`` shaped like ``kdg_events`` if missing; returns its identity (schema-qualified).

        A named schema must exist already: kdg creates its own tables, never a user's schema. Claims kept under
        the name of a table kdg creates go with it (:func:`kdg.store.owners.follow_new_table`; said in ``healed``).
        """
        identity = self.resolve_table(table)
        if identity not in self._sink_ready:
            self._run(self._create_sink_table(identity))
            self._sink_ready.add(identity)
        return identity

    async def _create_sink_table(self, table: TableName) -> None:
        if await self.conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table.sql):
            return
        async with self.conn.transaction():  # the table appears with its name's old claims gone
            await self.conn.execute(
                f"CREATE TABLE IF NOT EXISTS {table.sql} (LIKE kdg_events INCLUDING DEFAULTS INCLUDING INDEXES)")
            self.healed.extend(await follow_new_table(self.conn, table))

    def resolve_table(self, table: str | TableName) -> TableName:
        """The identity Postgres gives the table ``table`` names (:func:`kdg.store.identity.resolve_table`)."""
        return self._run(resolve_table(self.conn, table, where=f" in {redact_dsn(self.dsn)}"))

    # -- plain batches -----------------------------------------------------------------------
    def write_plain(self, table: str | TableName, group: str, rows, handler=None,
                    before_commit=None) -> int:
        """At-most/at-least-once: insert every row (duplicates stay visible) in one transaction."""
        return self._run(self._write_plain(table, group, rows, handler, before_commit))

    async def _write_plain(self, table, group, rows, handler, before_commit):
        table, rows = table_name(table), SinkRows.of(rows)
        async with self.conn.transaction():
            if rows:
                await self.conn.copy_records_to_table(table.name, schema_name=table.schema,
                                                      records=rows.grouped(group), columns=GROUP_SINK_COLUMNS)
            if handler is not None:
                await call_handler(handler, rows.as_list(), self.conn)
            if before_commit is not None:
                before_commit()
        return len(rows)

    # -- typed sinks: a user's table, through a mapping --------------------------------------
    def prepare_typed(self, mapping, *, dry_run: bool = False):
        """Check ``mapping`` against its table (creating it if the mapping says so, unless ``dry_run``: claims kept
        under its name then go with it, said in ``healed``).

        Returns ``(TypedTarget, TableShape | None)``; a mismatch is a usage error naming the column.
        """
        async def prepare():
            checked, shape = await prepare_table(self.conn, mapping, dry_run=dry_run, notices=self.healed)
            return TypedTarget(checked), shape

        return self._run(prepare())

    def add_columns(self, table: TableName, columns) -> list:
        """Add each of ``columns`` (:class:`kdg.mapping.spec.Column`) the table lacks, nullable (see
        :meth:`evolve_table`). Returns the columns this call added."""
        from kdg.mapping.evolution import SchemaChange

        done = {c.column for c in self.evolve_table(table, [SchemaChange(c.name, "add", c.type.name) for c in columns])}
        return [c for c in columns if c.name in done]

    def table_shape(self, table: TableName):
        """The table's :class:`~kdg.store.tables.TableShape` as it is now (None: no such table)."""
        return self._run(inspect_table(self.conn, table))

    def evolve_table(self, table: TableName, changes) -> list:
        """Apply ``changes`` (:class:`kdg.mapping.evolution.SchemaChange`: add a nullable column, widen one, drop
        a NOT NULL) in one transaction under the table's evolution lock, each only if the table still needs it
        once the lock is held: two writers meeting the same change make it once. Returns the changes this call
        made (none while the table is not made yet: it is made with every column)."""
        from kdg.mapping.evolution import type_change

        async def evolve():
            async with self.conn.transaction():
                await self.conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"kdg-evolve:{table.text}")
                shape = await inspect_table(self.conn, table)
                if shape is None:
                    return []
                made = [c for c in changes if c.change == "add" and not shape.has(c.column)
                        or c.change == "widen" and shape.has(c.column)
                        and type_change(shape.types[c.column], c.type) == "widening"
                        or c.change == "drop not null" and c.column in shape.not_null]
                for change in made:
                    await self.conn.execute(change.alter_sql(table))
                return made

        return self._run(evolve())

    async def _make_stages(self, targets) -> None:
        """Each target's temp stage on this connection, made once and outside any transaction (one made inside
        would be undone by its rollback, and still taken as made); first, ISO times without an offset are UTC,
        in consume and Spark alike."""
        for stage, ddl in {t.stage: t.stage_ddl() for t in targets if t.stage not in self._stages}.items():
            if not self._stages:
                await self.conn.execute("SET TIME ZONE 'UTC'")
            await self.conn.execute(ddl)
            self._stages.add(stage)

    def write_typed(self, target: TypedTarget, rows: StagedRows, *, claim: bool, group: str | None = None,
                    topic: str | None = None, next_offsets: dict[int, int] | None = None,
                    fences: dict[int, int] | None = None, dead_letter=None, handler=None,
                    before_commit=None) -> TypedResult:
        """One transaction: stage and write ``rows`` (claiming keys when ``claim``), then move fenced offsets.

        ``dead_letter(unreadable, rejected)`` runs before the commit, with the records the mapping could not
        read (``(record, reason, key)``) and the rows Postgres refused (``(seq, sqlstate, message)``), so they
        are dead-lettered durably before the offsets that account for them move.
        """
        return self._run(self._write_typed(target, rows, claim, group, topic, next_offsets, fences, dead_letter,
                                           handler, before_commit))

    async def _write_typed(self, target, rows, claim, group, topic, next_offsets, fences, dead_letter, handler,
                           before_commit) -> TypedResult:
        await self._make_stages([target])
        async with self.conn.transaction():
            await stage_batch(self.conn, target, rows)
            claims = None
            if claim:
                claims = await prepare_batch(self.conn, await self._claim_window(target.mapping.table), rows)
            result = await write_batch(self.conn, target, rows, claims=claims)
            self.unclaimed += result.outside
            if (rows.dead or result.rejected) and dead_letter is not None:
                dead_letter(rows.dead, result.rejected)
            if handler is not None:  # the rows this transaction writes: never a duplicate, nor a refused row
                await call_handler(handler, await written_rows(self.conn, target, rows, result), self.conn)
            if next_offsets:
                await self._move_offsets(group, topic, next_offsets, fences)
            if before_commit is not None:
                before_commit()
        return result

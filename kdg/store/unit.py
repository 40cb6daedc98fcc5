"""One batch, many tables: every route's rows (and claims), then every partition's offsets, in ONE transaction.

The consume path's transaction unit. A batch of records from several topics is split by the router
(:mod:`kdg.flow.routes`) into :class:`Part` s, one per table; :meth:`UnitMixin.write_unit` opens one
transaction, lets each part write itself (the generic table: claims and COPY; a user's table: staged,
claimed and cast, :mod:`kdg.store.typed`), calls the ``--handler`` per part with the rows that
transaction writes, and only then moves the fenced offsets of every (topic, partition) in the batch.
A kill anywhere inside leaves every table and every offset as they were.

Mixed into :class:`kdg.store.pg.Store`.
"""

from collections import Counter
from dataclasses import dataclass, field

from kdg.settings import TableName
from kdg.store.claims import Claims
from kdg.store.filtered import mark_filtered
from kdg.store.handler import call_handler
from kdg.store.rows import GROUP_SINK_COLUMNS, SinkRows
from kdg.store.typed import TypedResult, TypedTarget, prepare_batch, stage_batch, write_batch, written_rows


@dataclass
class PartResult:
    """Where one part's rows ended (:class:`kdg.sinks.WriteResult`'s fields, for one table)."""

    table: str
    written: int = 0
    duplicates: int = 0
    superseded: int = 0
    deleted: int = 0
    filtered: int = 0
    rejected: list = field(default_factory=list)  # typed: (seq, sqlstate, message) of rows Postgres refused
    reprocessed: int = 0              # typed, --reprocess: rows claimed before, applied again (written or superseded)
    events: Counter = field(default_factory=Counter)  # typed: Debezium's skipped events by kind, and its
    # placeholders ("unavailable"), of the batch this result accounts for (a batch read again counts anew)


@dataclass
class Part:
    """One table's share of a batch: generic ``SinkRows``, or a typed target's staged rows."""

    table: TableName
    rows: object                      # SinkRows | kdg.mapping.rows.StagedRows
    target: TypedTarget | None = None  # None: the generic sink table
    staged: bool = False              # typed: its rows are in its stage already (:meth:`stage_rows`)
    claims: Claims | None = None      # typed, exactly-once: its claims (:meth:`prepare_claims`; None: no row)

    @property
    def stage(self) -> str:
        """The temp table this part stages its rows in (``ON COMMIT DELETE ROWS``)."""
        return self.target.stage if self.target is not None else "kdg_stage"

    async def write(self, store, group: str, claim: bool, keep_written: bool, claiming=None,
                    on_claimed=None) -> tuple[PartResult, list | None]:
        """Write inside the open transaction; the result, and (``keep_written``) the rows a handler is given.
        ``claiming``: the generic table's claims, made by :meth:`kdg.store.claims.ClaimsMixin._claim_tables`.
        ``on_claimed()``: typed, called once its claims are made, before its table is written."""
        conn = store.conn
        if self.target is None:
            rows = SinkRows.of(self.rows)
            if claiming is not None:
                written = set() if keep_written else None
                count = await store._insert_claimed(claiming, group, written=written)
                listed = rows.as_list() if keep_written else None
                if keep_written and count < len(rows):  # a handler never sees a duplicate
                    listed = [r for r in listed if (r[0], r[2], r[3]) in written]
                return PartResult(self.table.text, count, len(rows) - count), listed
            if rows and not claim:
                await conn.copy_records_to_table(self.table.name, schema_name=self.table.schema,
                                                 records=rows.grouped(group), columns=GROUP_SINK_COLUMNS)
            return PartResult(self.table.text, len(rows)), rows.as_list() if keep_written else None
        if not self.staged:
            await self.stage_rows(store)
        if claim and self.claims is None:  # (prepared already by a pipelined batch, unless it has no row)
            await self.prepare_claims(store)
        typed: TypedResult = await write_batch(conn, self.target, self.rows, claims=self.claims,
                                               on_claimed=on_claimed)
        store.unclaimed += typed.outside
        listed = await written_rows(conn, self.target, self.rows, typed) if keep_written else None
        events = Counter(self.rows.skipped)
        if self.rows.keeps:
            events["unavailable"] = len(self.rows.keeps)
        return PartResult(self.table.text, typed.written, typed.duplicates, typed.superseded, typed.deleted,
                          typed.filtered, typed.rejected, typed.reprocessed, events), listed

    async def stage_rows(self, store) -> None:
        """A typed part's rows into its stage (made by :meth:`~kdg.store.sinks.SinksMixin._make_stages`), in the
        open transaction."""
        await stage_batch(store.conn, self.target, self.rows)
        self.staged = True

    async def prepare_claims(self, store, also: int | None = None, early: bool = False) -> bool:
        """Exactly-once: a typed part's claims prepared (:func:`~kdg.store.claims.prepare_claims`: its horizon
        held, its partitions made, ``early``: its claims copied in where they can be, then the lock for keys
        without a time taken, and ``also`` with it); nothing of its table is read yet. Whether ``also`` was
        taken."""
        window = await store._claim_window(self.target.mapping.table)
        self.claims = await prepare_batch(store.conn, window, self.rows, also, early)
        return self.claims is not None and self.claims.also


class UnitMixin:
    """The consume path's one transaction per batch: owns the order "every part, then the offsets"."""

    def write_unit(self, parts: list[Part], group: str, *, claim: bool, offsets=None, fences=None, expected=None,
                   handler=None, dead_letter=None, before_commit=None, turn=None, filtered=None) -> list[PartResult]:
        """One transaction: each part written (claimed when ``claim``), then ``offsets`` — ``{(topic, partition):
        next}`` under ``fences`` (and ``expected``, pipelined) — moved. ``dead_letter(part, result)`` runs
        before the commit for each part with refused rows or unreadable records, so they are durable before
        the offsets that account for them move. ``turn``: a pipelined batch's place (:mod:`kdg.sinks.pipeline`).
        ``filtered``: per table, what its transform filtered out, claimed as such under every guarantee
        (:mod:`kdg.store.filtered`)."""
        return self._run(self._write_unit(parts, group, claim, offsets, fences, expected, handler, dead_letter,
                                          before_commit, turn, filtered))

    async def _write_unit(self, parts, group, claim, offsets, fences, expected, handler, dead_letter,
                          before_commit, turn, filtered=None) -> list[PartResult]:
        results, handed = [None] * len(parts), [None] * len(parts)
        alone = False  # a pipelined batch of one typed table, whose claims go in early (below)
        await self._make_stages([part.target for part in parts if part.target is not None])
        async with self.conn.transaction():
            if turn is not None:
                # a pipelined batch stages its typed parts first: their COPYs overlap the batch before (each
                # connection has stages of its own); nothing of the table is touched yet
                typed = [part for part in parts if part.target is not None]
                early = len({part.stage for part in typed}) == len(typed)
                if early:
                    for part in typed:
                        await part.stage_rows(self)
                # A batch of one typed table, with nothing to do after its rows but move offsets, copies its
                # claims in before the locks, and lets the next batch do the same once it has claimed: that
                # COPY then overlaps this batch's upsert. (It only inserts claims, which nothing of this batch
                # touches after its own; a second table's claims, a handler's SQL or filtered records'
                # claims could wait on the next batch's new partitions while it waits for this commit.)
                alone = bool(early and claim and len(parts) == 1 and typed and handler is None and not filtered)
                if typed:  # it reads its tables (a delete's rows, a kept value): the batch before must have
                    # committed. Once that batch holds the pipeline's lock (and its claims' locks), this one's
                    # claims are prepared and the lock asked for: Postgres grants it at that batch's commit
                    turn.wait_locked()
                    locked = False  # in the statement that takes a lock for keys without a time, if there is one
                    if early and claim:
                        for part in typed:
                            locked = await part.prepare_claims(self, None if locked else turn.key,
                                                               alone) or locked
                    if not locked:
                        await self.conn.execute("SELECT pg_advisory_xact_lock($1)", turn.key)
                else:
                    turn.wait_claims()
            generic = [i for i, part in enumerate(parts) if part.target is None and claim and part.rows]
            claimed = dict(zip(generic, await self._claim_tables(
                [(parts[i].table, SinkRows.of(parts[i].rows)) for i in generic]) if generic else []))
            # claimed by COPY: their rows go in once the next batch may claim (its claims then overlap them)
            later = [i for i in generic if claimed[i].copied]
            staged = set()
            for i, part in enumerate(parts):
                if i in later:
                    continue
                if part.stage in staged:  # an earlier part of this transaction left its rows there
                    await self.conn.execute(f"DELETE FROM {part.stage}")
                staged.add(part.stage)
                results[i], handed[i] = await part.write(self, group, claim, handler is not None, claimed.get(i),
                                                         turn.locked if alone else None)
                if dead_letter is not None:
                    dead_letter(part, results[i])
            if filtered:  # with the batch's rows (and claims): a kill cannot keep one and lose the other
                await mark_filtered(self, filtered, {c.claims.window.relation for c in claimed.values()})
            if turn is not None:
                if typed:
                    turn.locked()
                turn.claimed()
            for i in later:
                results[i], handed[i] = await parts[i].write(self, group, claim, handler is not None, claimed[i])
                if dead_letter is not None:
                    dead_letter(parts[i], results[i])
            if turn is not None:
                turn.wait_update() if handler is None else turn.wait_ended()
            if handler is not None:  # per table, the rows this transaction writes: never a duplicate
                for listed in handed:
                    if listed is not None:
                        await call_handler(handler, listed, self.conn)
            if offsets:
                await self._move_all_offsets(group, offsets, fences, expected)
            if turn is not None:
                turn.updated()
            if before_commit is not None:
                before_commit()
        return results

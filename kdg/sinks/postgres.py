"""The Postgres sink: each batch's records into their routes' tables, in one transaction with the offsets.

A batch may hold records of several topics. The router (:mod:`kdg.flow.routes`) names each topic's
table; each table has a :class:`TableWriter` — the generic table (``kdg_events``' shape), or a user's
table through a mapping (staged, cast by Postgres; a record the mapping cannot read, or a row Postgres
refuses, goes to the dead-letter topic and the rest of its batch is written). The batch's parts and,
under exactly-once, its claims and the fenced offsets of every (topic, partition) in it commit in one
transaction (:mod:`kdg.store.unit`).
"""

import time
from collections import Counter
from dataclasses import dataclass, field, replace

from kdg import faults
from kdg.errors import UsageError
from kdg.flow.routes import Router, Target, source_block
from kdg.flow.transform import generic_rows
from kdg.records import RecordColumns
from kdg.sinks import Batch, Outcome, Sink, WriteResult
from kdg.sinks.dead_letters import DeadLetterQueue, refused_row, tally
from kdg.sinks.pipeline import Pipeline
from kdg.store.pg import Store
from kdg.store.rows import SinkRows, take_spans, topic_runs
from kdg.store.unit import Part

UNROUTED_REASON = ("its table is named by its topic's events (a {source.*} template, or columns from the schema), "
                   "and no event of the topic read so far names it")


@dataclass
class TableWriter:
    """One table a route resolved to: the generic sink table, or a typed target with its row maker."""

    table: object            # kdg.settings.TableName, the identity Postgres gives it
    route: str               # the name of the route that writes it
    target: object = None    # kdg.store.typed.TypedTarget (None: the generic table)
    rows: object = None      # kdg.mapping.RowMaker
    schemas: set = field(default_factory=set)  # columns from the schema: the record schemas (their text) looked at
    said: set = field(default_factory=set)     # ... and, evolve = none, the changes said (once each)
    refused: dict = field(default_factory=dict)  # ... and the schemas on_incompatible = dead-letter refuses: why


class PostgresSink(Sink):
    atomic_offsets = True   # results and offsets can commit in one transaction
    keeps_offsets = True    # ... and then the offsets live here (kdg_offsets), not in Kafka

    def __init__(self, dsn: str, router: Router, group: str, dlq: DeadLetterQueue, handler=None,
                 pipeline: int = 0, registry: dict[str, str] | None = None, on_table=None, reprocess: bool = False):
        """``pipeline``: exactly-once batches written at once on as many connections (not with ``reprocess``, nor
        with a route whose columns come from the schema: its table may change between two batches);
        ``on_table(table, topic)``: told of each table as the first topic routed to it is (the claim window);
        ``reprocess``: records claimed before are applied again (:mod:`kdg.store.reprocess`; typed upserts only)."""
        self.router, self.group, self.dlq, self.handler = router, group, dlq, handler
        self.reprocess = reprocess
        self.registry, self.on_table = registry, on_table or (lambda store, table, topic, sink: None)
        self.takes_rows = not router.typed  # the generic table's rows: sorted per batch (kdg.batching)
        self.fences: dict[tuple[str, int], int] = {}
        self.stored: dict[tuple[str, int], int | None] = {}  # what the last batch written will store, per partition
        self.writers: dict[str, TableWriter] = {}  # by table identity
        self._by_topic: dict[str, TableWriter] = {}
        self._sources: dict[str, object] = {}  # per route of a {source.*} template: a reader of its events
        self._registry_client = None  # from-schema routes' registry schemas (kdg.schemas.registry.Registry)
        self.schema_changes: list[dict] = []  # columns evolve = add-columns added, said as they are
        self.windows: list = []  # exactly-once: the tables' claim windows, maintained from here (keep_window)
        self.partitions_dropped = 0
        self._maintain_at, self._maintain_every = 0.0, 300.0
        self._held: list[Outcome] = []  # outcomes drained at a rebalance, handed back with the next ones
        self.store = Store(dsn)
        try:
            for topic in router.names:  # the listed topics' tables are checked (made) before a record is read
                for route in router.fanned(topic):
                    self._writer(topic, [], route.name if route.fan is not None else None)
            depth = pipeline if not reprocess and not _evolving(router) else 0
            # exactly-once batches are written on `depth` connections of their own, in turn (kdg.sinks.pipeline)
            self.pipeline = Pipeline(lambda: Store(dsn), depth) if depth > 0 else None
        except BaseException:
            self.store.close()
            raise

    # -- tables --------------------------------------------------------------------------------
    def _writer(self, topic: str, records, route: str | None = None) -> TableWriter | None:
        """The writer of ``topic``'s table (of a fan-out, route ``route``'s; made on first sight); None while
        its table cannot be told yet."""
        found = self._by_topic.get((topic, route))
        if found is not None:
            return found
        target = self.router.target(topic, lambda: self._source(topic, records), route)
        if target.table is None:
            return None
        if target.mapping is not None and target.mapping.from_schema:  # columns = "from-schema"
            mapping = self._derive(topic, target, records)
            if mapping is None:
                return None
            target = replace(target, mapping=mapping)
        writer = self._open(target, topic)
        self._by_topic[topic, route] = writer
        return writer

    def _open(self, target: Target, topic: str) -> TableWriter:
        if target.mapping is None:
            if self.reprocess:
                raise UsageError(f"--reprocess applies records already written again, and {target.route.name!r} "
                                 f"writes {target.table.text} as the generic table, which keeps each record as a row "
                                 "of its own: each would be a second row. It needs a mapping in mode = upsert")
            identity = self.store.ensure_sink_table(target.table)
            writer = self.writers.get(identity.text) or TableWriter(identity, target.route.name)
        else:
            from kdg.mapping import RowMaker

            if target.mapping.evolve == "add-columns":  # a table made before the schema grew: its new columns first
                self._added(self.store.add_columns(target.table, target.mapping.columns), target.table)
            typed, _ = self.store.prepare_typed(target.mapping)  # checked (made) before its records are written
            if self.reprocess:
                route = target.route
                typed = typed.reprocessing(len(route.topics) + (2 if route.pattern else 0))
            identity = typed.mapping.table
            writer = self.writers.get(identity.text) or TableWriter(identity, target.route.name, typed, RowMaker(
                typed.mapping, self.registry, watch=True, truncates=True))
        if identity.text not in self.writers:
            self.writers[identity.text] = writer
            self.on_table(self.store, identity, topic, self)
        return writer

    def _evolve(self, writer: TableWriter, records) -> list:
        """Columns from the records' schema: each record schema new to ``writer`` is met against its table
        (:func:`~kdg.mapping.evolution.plan_changes`) before the batch that carries it is written. Under
        ``evolve = "add-columns"`` a new field adds a nullable column, a widened type widens its column and a field
        that became optional drops its NOT NULL (:meth:`Store.evolve_table`); under ``none`` each is said once:
        never silent. A type the column cannot take stops the route (:class:`~kdg.errors.SchemaIncompatible`,
        nothing of the batch written, its offsets not moved) or, under ``on_incompatible = "dead-letter"``, sends
        that schema's records to the dead-letter topic: returned as ``(record, reason, key)``."""
        from kdg.mapping import RowMaker
        from kdg.mapping.evolution import meet_schema
        from kdg.mapping.from_record import SCHEMA_FORMATS, mapping_from_record, optional_columns, schema_head

        mapping, table, dead = writer.target.mapping, writer.target.mapping.table, []
        registry = self._schema_registry(mapping)
        framed = mapping.value_format in SCHEMA_FORMATS  # the schema is named by a 5-byte header
        last = None  # the schema of the record before, met already: most records carry it (two compares, no copy)
        for rec, key in records:
            value = rec.value
            if last is not None and rec.row is None and value is not None and value.startswith(last) and (
                    framed or value.startswith(b'"payload"', len(last))):
                continue
            # the schema it carries, named without decoding: a registry id's header, JsonConverter's schema text
            head = schema_head(value, mapping.value_format) if rec.row is None else None
            if head in writer.refused:
                dead.append((rec, writer.refused[head], key))
            if head in writer.schemas:
                last = head
            if head is None or head in writer.schemas or head in writer.refused:
                continue
            found = mapping_from_record(value, rec.key, mapping, table, registry)
            if found is None:  # no row schema: nothing to meet
                writer.schemas.add(head)
                continue
            met = meet_schema(self.store, mapping, found,
                              optional_columns(value, mapping.envelope, mapping.value_format, registry), writer.said,
                              "start kdg again: it resumes at the batch it stopped before, none of which was written")
            if met.refused is not None:
                writer.refused[head] = met.refused
                dead.append((rec, met.refused, key))
                continue
            writer.schemas.add(head)
            last = head
            self.schema_changes += met.said
            if met.changed:
                typed, _ = self.store.prepare_typed(replace(mapping, columns=mapping.columns + met.columns))
                typed = replace(typed, reprocess=writer.target.reprocess)  # (checked when the writer was made)
                writer.target, writer.rows = typed, RowMaker(typed.mapping, self.registry, watch=True, truncates=True)
                mapping = typed.mapping
        return dead

    def _added(self, columns, table) -> None:
        from kdg.mapping.evolution import SchemaChange, said

        self.schema_changes += [said(table, SchemaChange(c.name, "add", c.type.name)) for c in columns]

    def _derive(self, topic: str, target: Target, records):
        """The mapping of ``topic``'s table from the schema the first of its records that has one carries
        (:func:`kdg.mapping.from_record.mapping_from_record`); None until one does."""
        from kdg.mapping.from_record import mapping_from_record

        registry = self._schema_registry(target.mapping)
        for rec, _ in records:
            if rec.topic == topic and rec.value is not None:
                found = mapping_from_record(rec.value, rec.key, target.mapping, target.table, registry)
                if found is not None:
                    return found
        return None

    def _schema_registry(self, mapping):
        """The registry client from-schema routes read registry schemas with (one, made when first needed);
        None for a route whose values are JSON."""
        from kdg.schemas.formats import SCHEMA_FORMATS

        if mapping.value_format not in SCHEMA_FORMATS:
            return None
        if self._registry_client is None:
            from kdg.schemas.registry import Registry

            self._registry_client = Registry(self.registry or {})
        return self._registry_client

    def _source(self, topic: str, records):
        """The source block of the first of ``topic``'s records that has one (a ``{source.*}`` template)."""
        route = self.router.route(topic)
        reader = self._sources.get(route.name)
        if reader is None:
            from kdg.mapping import RowMaker

            reader = self._sources[route.name] = RowMaker(route.mapping, self.registry)._reader
        for rec, _ in records:
            if rec.topic == topic and rec.value is not None:
                try:
                    doc = reader.document(rec)
                except ValueError:  # unreadable: the record's own write dead-letters it
                    continue
                found = source_block(doc.event) if doc.control in (None, "truncate") else None
                if found is not None:
                    return found
        return None

    @property
    def tables(self) -> list[str]:
        return list(self.writers)

    def keep_window(self, window) -> None:
        """Maintain ``window`` (:class:`kdg.store.windows.Window`) while consuming: at most once per
        partition width (1 s to 5 min), under the database's maintenance lock (another process may hold it)."""
        self.windows.append(window)
        self._maintain_every = min(self._maintain_every, max(1.0, window.width_ms / 1000))
        if not self._maintain_at:
            self._maintain_at = time.monotonic() + self._maintain_every

    def maintain_if_due(self) -> list:
        """Drop the windows' expired partitions if it is time; the passes that were skipped (and why)."""
        if not self.windows or time.monotonic() < self._maintain_at:
            return []
        self._maintain_at = time.monotonic() + self._maintain_every
        done = self.store.maintain(relations=[w.relation for w in self.windows])
        self.partitions_dropped += sum(m.dropped for m in done)
        return [m for m in done if m.skipped and "another process" not in m.skipped]

    def field_notes(self) -> list:
        """What the typed tables' watches found since last asked, as ``(table, note)``."""
        return [(w.table, note) for w in self.writers.values() if w.rows is not None and w.rows.watch is not None
                for note in w.rows.watch.news()]

    def _control(self, rec) -> str | None:
        """What a record no table took is, if a Debezium heartbeat or schema-change event."""
        route = self.router.route(rec.topic)
        if rec.value is None or route.mapping is None or route.mapping.envelope != "debezium":
            return None
        from kdg.mapping import RowMaker

        reader = self._sources.get(route.name)
        if reader is None:
            reader = self._sources[route.name] = RowMaker(route.mapping, self.registry)._reader
        try:
            return reader.document(rec).control
        except ValueError:
            return None

    def field_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for w in self.writers.values():
            if w.rows is not None and w.rows.watch is not None:
                for kind, n in w.rows.watch.counts().items():
                    counts[kind] = counts.get(kind, 0) + n
        return counts

    # -- connections and partitions ------------------------------------------------------------
    def _stores(self) -> list[Store]:
        """Every connection of this sink: its own, and the pipeline's."""
        return [self.store] + (self.pipeline.stores if self.pipeline is not None else [])

    def healed(self) -> list[str]:
        """Claim state its writes or upkeep found dropped outside kdg since last asked, on every connection."""
        notes = []
        for store in self._stores():
            while store.healed:
                notes.append(store.healed.popleft())
        return notes

    def unclaimed(self) -> int:
        """Rows written without a claim (older than the window), on every connection of this sink."""
        return sum(store.unclaimed for store in self._stores())

    def acquire(self, tps: list[tuple[str, int]]) -> dict[tuple[str, int], int | None]:
        """Own ``tps`` (each fence bumped, so an older owner's batches are refused); their stored offsets."""
        taken = self.store.acquire(self.group, tps)
        for tp, (fence, stored) in taken.items():
            self.fences[tp] = fence
            self.stored[tp] = stored
        return {tp: stored for tp, (_, stored) in taken.items()}

    def release(self, tps: list[tuple[str, int]]) -> None:
        if self.pipeline is not None:  # batches of these partitions end before another member takes them
            self._held += self.pipeline.drain()
        for tp in tps:
            self.fences.pop(tp, None)
            self.stored.pop(tp, None)

    def stored_offsets(self, topics=None) -> dict[tuple[str, int], int]:
        topics = topics if topics is not None else {t for t, _ in self.fences}
        found = self.store.stored(self.group, topics) if topics else {}
        if self.pipeline is not None and not self.pipeline.records_in_flight:
            self.stored.update({tp: found.get(tp) for tp in self.stored})  # what the next batch chains on
        return found

    @property
    def records_in_flight(self) -> int:
        """Records submitted whose outcome the loop has not had yet (drained at a rebalance included)."""
        if self.pipeline is None:
            return 0
        return self.pipeline.records_in_flight + sum(len(done.batch) for done in self._held)

    # -- writing -------------------------------------------------------------------------------
    def submit(self, batch: Batch, *, atomic: bool) -> list[Outcome]:
        if self.pipeline is None or not atomic:
            return super().submit(batch, atomic=atomic)
        # typed rows are made here, on this thread (the row makers are this thread's); the connection's thread
        # only copies them
        parts, unrouted, unnamed, events = self._parts(batch, made=True)
        unreadable = [d for part, _ in parts if part.target is not None for d in part.rows.dead]
        filtered = self._filtered(batch)
        # durable before the rows and offsets that account for them commit
        self.dlq.send(batch.dead + unnamed + unreadable)
        offsets = dict(batch.next_offsets)
        fences = {tp: self.fences.get(tp, -1) for tp in offsets}
        expected = {tp: self.stored.get(tp) for tp in offsets}
        self.stored.update(offsets)

        def write(store: Store, turn) -> WriteResult:
            dead = unnamed + unreadable
            done = store.write_unit([p for p, _ in parts], self.group, claim=True, offsets=offsets, fences=fences,
                                    expected=expected, handler=self.handler, before_commit=_at_commit(True),
                                    dead_letter=self._dead_letter(parts, dead, made=True), turn=turn,
                                    filtered=filtered)
            return _result(done, dead, unrouted, events)

        return self._finished(self.pipeline.submit(batch, write))

    def drain(self) -> list[Outcome]:
        return self._finished(self.pipeline.drain()) if self.pipeline is not None else []

    def collect(self) -> list[Outcome]:
        return self._finished(self.pipeline.finished()) if self.pipeline is not None else []

    def _finished(self, outcomes: list[Outcome]) -> list[Outcome]:
        """Outcomes in order; after a failure, also those of every later batch (they chained on it)."""
        outcomes, self._held = self._held + outcomes, []
        if any(o.error is not None for o in outcomes):
            outcomes += self.pipeline.drain()
            if not self.lost_connection():
                self.stored_offsets()  # the next batch chains on what Postgres really holds
        return outcomes

    def write(self, batch: Batch, *, atomic: bool) -> WriteResult:
        parts, unrouted, unnamed, events = self._parts(batch)
        self.dlq.send(batch.dead + unnamed)  # durable before the rows and offsets that account for them commit
        dead: list = list(unnamed)
        offsets = dict(batch.next_offsets) if atomic else None
        done = self.store.write_unit(
            [p for p, _ in parts], self.group, claim=atomic, offsets=offsets,
            fences={tp: self.fences.get(tp, -1) for tp in offsets or ()}, handler=self.handler,
            dead_letter=self._dead_letter(parts, dead), before_commit=_at_commit(atomic),
            filtered=self._filtered(batch))
        return _result(done, dead, unrouted, events)

    def _dead_letter(self, parts: list[tuple[Part, list]], dead: list, made: bool = False):
        """``write_unit``'s ``dead_letter(part, result)``, run inside the transaction (so durable before it
        commits): the records of a typed part its row maker could not read (unless ``made``: the rows were made,
        and those sent, before), and the rows Postgres refused; each sent and added to ``dead``."""
        def dead_letter(part: Part, result) -> None:
            records = next(recs for p, recs in parts if p is part)
            found = (part.rows.dead if part.target is not None and not made else []) + [
                refused_row(*records[seq], state, message) for seq, state, message in result.rejected]
            if found:
                self.dlq.send(found)
                dead.extend(found)
        return dead_letter

    def _parts(self, batch: Batch, made: bool = False) -> tuple[list[tuple[Part, list]], int, list, Counter]:
        """The batch split by table: ``(part, its records)`` each; and the records no table could take yet,
        their table named by their topic's events and none read so far naming it: the tombstones among them
        are counted filtered (nothing to write), the others are dead letters with the reason; and, of those,
        Debezium's heartbeats and schema-change events by ``(topic, kind)``. ``made``: typed rows are made now
        (kept for the COPY), not as the COPY reads them."""
        if batch.rows is not None:  # one poll, sorted per batch: the generic table's rows (kdg.batching)
            return self._row_parts(batch.rows), 0, [], Counter()
        if (columns := RecordColumns.of(batch.records)) is not None:
            found = self._column_parts(columns, made)
            if found is not None:
                return found, 0, [], Counter()
        groups: dict[int, tuple[TableWriter, list]] = {}  # by writer: one per table
        unrouted, unnamed, events = 0, [], Counter()
        last = entry = None  # a batch comes in runs of one topic: its table is looked up once a run
        for pair in batch.records:
            rec = pair[0]
            at = (rec.topic, rec.route)
            if at == last:
                entry[1].append(pair)
                continue
            writer = self._by_topic.get(at) or self._writer(*at[:1], batch.records, at[1])
            if writer is None:
                control = self._control(rec) if rec.value is not None else None
                if pair[0].value is None or control in ("heartbeat", "schema change"):
                    unrouted += 1
                    if control is not None:
                        events[rec.topic, control] += 1
                else:
                    unnamed.append((pair[0], UNROUTED_REASON, pair[1]))
                continue
            entry = groups.get(id(writer))
            if entry is None:
                entry = groups[id(writer)] = (writer, [])
            entry[1].append(pair)
            last = at
        parts = [part for writer, records in groups.values() if (part := self._part(writer, records, made, unnamed))]
        return parts, unrouted, unnamed, events

    def _part(self, writer: TableWriter, records, made: bool, unnamed: list) -> tuple[Part, list] | None:
        """One table's share of a batch: ``(part, its records)``; None when a schema change refused every record
        of it (each added to ``unnamed``, as a dead letter)."""
        if writer.target is None:
            return Part(writer.table, generic_rows(records)), records
        if writer.target.mapping.from_schema:
            refused = self._evolve(writer, records)
            if refused:  # on_incompatible = dead-letter: the rest of the batch is written
                unnamed += refused
                gone = {id(rec) for rec, _, _ in refused}
                records = [pair for pair in records if id(pair[0]) not in gone]
                if not records:
                    return None
        writer.rows.prepare(records)  # a registry that is away is waited for here, not inside the COPY
        staged = writer.rows.staged(records, keep=made or self.handler is not None)
        if made:
            staged.make()
        return Part(writer.table, staged, writer.target), records

    def _column_parts(self, records: RecordColumns, made: bool) -> list[tuple[Part, list]] | None:
        """:meth:`_parts` of a batch whose records are columns, each table's share taken by a slice a run of one
        topic (a poll comes in runs of one partition); None unless every topic's table is known already and takes
        the columns as they are (the record-by-record split names a table on first sight, and says why it cannot;
        a schema that may change the table reads each record)."""
        groups: dict[int, tuple[TableWriter, list]] = {}
        for topic, start, end in topic_runs(records.topics):
            writer = self._by_topic.get((topic, None))
            if writer is None or (writer.target is not None and writer.target.mapping.from_schema):
                return None
            groups.setdefault(id(writer), (writer, []))[1].append((start, end))
        return [self._part(writer, records.take(runs), made, []) for writer, runs in groups.values()]

    def _filtered(self, batch: Batch) -> list[tuple]:
        """Per table, ``(table, [(key, topic, partition, offset), …])`` of what its route's transform filtered out."""
        found: dict = {}
        for topic, route, key, partition, offset in batch.gone:
            writer = self._by_topic.get((topic, route)) or self._writer(topic, [], route)
            if writer is not None:  # (a {source.*} table not named yet: nothing to claim it in)
                found.setdefault(writer.table.text, (writer.table, []))[1].append((key, topic, partition, offset))
        return list(found.values())

    def _row_parts(self, rows: SinkRows) -> list[tuple[Part, list]]:
        """The generic rows split by table. A poll comes in runs of one partition (each fetch's messages in
        order): the rows are cut at each change of topic, each run taken whole by a C-level slice, so a
        table's share costs per run, not per row."""
        runs = topic_runs(rows.columns[1])
        writers = {t: self._by_topic.get((t, None)) or self._writer(t, []) for t, _, _ in runs}
        if len({w.table.text for w in writers.values()}) <= 1:
            return [(Part(w.table, rows), []) for w in list(writers.values())[:1]]
        picks: dict[str, tuple[TableWriter, list[tuple[int, int]]]] = {}
        for topic, start, end in runs:
            w = writers[topic]
            picks.setdefault(w.table.text, (w, []))[1].append((start, end))
        return [(Part(w.table, SinkRows(take_spans(rows.columns, spans))), []) for w, spans in picks.values()]

    def lost_connection(self) -> bool:
        """Whether a failed write means Postgres went away (wait for it) rather than refused something."""
        return self.store.lost() or (self.pipeline is not None and self.pipeline.lost())

    def reconnect(self, give_up_after: float, notice, sleep=time.sleep) -> float:
        """Wait for Postgres to answer again (backing off, ``notice`` told each retry); seconds waited.

        Call it with nothing in flight (after :meth:`drain`). ``sleep`` waits between attempts
        (see :meth:`Store.reconnect`).
        """
        waited = self.store.reconnect(give_up_after, notice, sleep) if not self.store.alive() else 0.0
        if self.pipeline is not None:
            waited += self.pipeline.reconnect(give_up_after - waited, notice, sleep)
        return waited

    def close(self) -> None:
        try:
            if getattr(self, "pipeline", None) is not None:
                self.pipeline.close()
        finally:
            self.store.close()


def _evolving(router: Router) -> bool:
    """Whether a route's columns come from the records' schema: its table may be altered between two batches,
    so its batches are written one at a time."""
    return any(route.mapping is not None and route.mapping.from_schema for route in router.routes)


def _result(done: list, dead: list, unrouted: int, events: Counter) -> WriteResult:
    """The parts' results as one; the per-table counts kept in ``tables``, the Debezium events of the batch's
    tables and of ``events`` (those no table took) in ``events``."""
    result = WriteResult(filtered=unrouted, dead_lettered=len(dead), dead_reasons=tally(dead), events=events)
    for part in done:
        result.written += part.written
        result.duplicates_suppressed += part.duplicates
        result.superseded += part.superseded
        result.deleted += part.deleted
        result.filtered += part.filtered
        result.tables[part.table] = part
        result.events.update({(part.table, kind): n for kind, n in part.events.items()})
    return result


def _at_commit(atomic: bool):
    def reach() -> None:
        faults.reach("inside-pg-transaction")
        if atomic:
            faults.reach("after-process-before-commit")
    return reach

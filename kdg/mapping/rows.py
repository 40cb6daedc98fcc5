"""Records to staged rows: one text value per mapped column, extracted in Python, cast later by Postgres.

A staged row is ``(seq, idempotency_key, topic, partition, offset, tombstone, *values)``: ``seq`` is
the record's place in its batch (Kafka order within a partition), so a rejected row leads back to
its record and the latest version of a key wins an upsert.

Under ``--envelope debezium`` a truncate (op t) with ``on_truncate = "apply"`` is staged as a tombstone
without values and listed in :attr:`StagedRows.truncates` (the store empties the table at its place);
Debezium's unavailable-value placeholder (an unchanged TOASTed column) is staged as NULL and listed in
:attr:`StagedRows.keeps`, so that an upsert leaves the column's current value; heartbeats and schema-change
events are no rows: counted in :attr:`StagedRows.skipped`.
"""

from collections import Counter

from kdg.mapping.batch_read import BatchReader
from kdg.mapping.events import TRUNCATE, RecordReader
from kdg.mapping.fields import UNMAPPED_EVERY, FieldWatch
from kdg.mapping.sources import parse_json, plain_text, storable
from kdg.mapping.spec import Mapping
from kdg.records import RecordColumns

STAGE_PREFIX = (("seq", "integer"), ("idempotency_key", "text"), ("topic", "text"), ("partition", "integer"),
                ("offset", "bigint"), ("tomb", "boolean"))
TOMBSTONE_REASON = "tombstone (null value): --on-tombstone dead-letter"
DELETE_REASON = "a Debezium delete (op d): --on-tombstone dead-letter"
TRUNCATE_REASON = "a Debezium truncate (op t): --on-truncate dead-letter"
NOT_APPLIED_REASON = ("a Debezium truncate (op t): on_truncate = apply is applied by kdg consume only (Spark's tasks "
                      "write their ranges at once: a truncate in one would delete rows another wrote after it)")
# Debezium's unavailable.value.placeholder, by default: sent for an unchanged TOASTed column (a bytes column: its
# base64; an array: the placeholder its one element)
UNAVAILABLE = "__debezium_unavailable_value"
UNAVAILABLE_B64 = "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="
_UNAVAILABLE_MARKS = (UNAVAILABLE.encode(), UNAVAILABLE_B64[:-2].encode())


class RowMaker:
    """The compiled form of a mapping: ``rows(records)`` → staged rows and dead letters."""

    def __init__(self, mapping: Mapping, registry: dict[str, str] | None = None, *, watch: bool = False,
                 truncates: bool = False):
        """``registry``: the Schema Registry settings, for a schema'd value or key format; ``watch``: hold the
        mapping against each batch's rows (:attr:`watch`, :mod:`kdg.mapping.fields`); ``truncates``: the writer
        applies truncates in record order (``kdg consume``'s one transaction per batch; Spark's tasks cannot, and
        dead-letter them with the reason)."""
        self.mapping = mapping
        self.columns = mapping.columns
        self._jsonb = [c.type.base == "jsonb" for c in mapping.columns]
        self._tombstones = mapping.on_tombstone
        client = _registry(mapping, registry)  # one client (and schema cache) for value and key
        self._decode_value, value_bad = _decoding(mapping.value_format, client, "")
        self._decode_key, key_bad = _decoding(mapping.key_format, client, " in the record key")
        self._reader = RecordReader(
            [c.source for c in mapping.columns], [c.type for c in mapping.columns], envelope=mapping.envelope,
            decode_value=None if self._decode_value is parse_json else self._decode_value,
            decode_key=None if self._decode_key is parse_json else self._decode_key,
            value_bad=value_bad, key_bad=key_bad)
        self._names = [f"column {c.name!r}" for c in mapping.columns]
        # a delete must say which row: deleting by a NULL key would delete nothing, silently
        self._delete_keys = [(i, c) for i, c in enumerate(mapping.columns) if c.name in mapping.key] \
            if mapping.on_tombstone == "delete" else []
        self._truncate = None if mapping.on_truncate == "apply" and truncates else \
            NOT_APPLIED_REASON if mapping.on_truncate == "apply" else TRUNCATE_REASON
        self._blank = (None,) * len(mapping.columns)
        self._fields = [(i, mapping.columns[i].source.path[0]) for i in keepable(mapping)]
        # a batch at a time where the mapping allows (kdg.mapping.batch_read), else record by record
        self._batch = BatchReader(self._reader, self._jsonb, _UNAVAILABLE_MARKS) \
            if BatchReader.able(self._reader) else None
        self.watch = FieldWatch(mapping) if watch else None
        if self.watch is not None and not self.watch.active:
            self.watch = None
        self._watching: FieldWatch | None = None  # the watch, while a batch it looks at is made

    def document(self, rec):
        """What ``rec``'s ``json:`` sources read (a change event's row); ValueError if it cannot be read."""
        return self._reader.document(rec).row

    def prepare(self, records) -> None:
        """Schemas of ``records``' schema'd values and keys fetched before their rows are made (and a COPY
        opens): see :meth:`kdg.schemas.codecs.SchemaDecoder.prepare`."""
        if hasattr(self._decode_value, "prepare"):
            self._decode_value.prepare([rec.value for rec, _ in records])
        if hasattr(self._decode_key, "prepare"):
            self._decode_key.prepare([rec.key for rec, _ in records])

    def rows(self, records) -> tuple[list[tuple], list[tuple]]:
        """Staged rows for ``records`` (``(record, key)`` pairs; ``seq`` is the index), and dead letters.

        A value or key that is not JSON, or text Postgres cannot hold (NUL, a lone surrogate),
        makes a dead letter with the reason; so does a tombstone under ``dead-letter``.
        """
        staged = self.staged(records)
        return list(staged), staged.dead

    def staged(self, records, *, keep: bool = False) -> "StagedRows":
        """:meth:`rows`, made as they are read: a COPY takes each row as it is made, so a batch's rows
        never all live at once (``keep`` keeps them, for a ``--handler``)."""
        return StagedRows(self, records, keep)

    def _row(self, seq: int, rec, key, staged: "StagedRows") -> tuple | None:
        """The staged row of one record; None when it became a dead letter ``(record, reason, key)`` in
        ``staged.dead``, or was skipped (a heartbeat, a schema-change event)."""
        dead = staged.dead
        tomb = rec.value is None
        if tomb and self._tombstones == "dead-letter":
            dead.append((rec, TOMBSTONE_REASON, key))
            return None
        try:
            doc = self._reader.document(rec)
            if doc.control is not None:
                return self._control(seq, rec, key, doc.control, staged)
            watch = self._watching  # (FieldWatch.wants, inlined: this runs once per record)
            if watch is not None and (watch.missing or not seq % UNMAPPED_EVERY) and not doc.deleted:
                watch.see(seq, doc.row)
            deletes = doc.deleted and not tomb  # a change event's delete (a tombstone after it is for compaction)
            if deletes:  # staged as a tombstone: deleted by key, or (ignore) claimed and not applied
                if self._tombstones == "dead-letter":
                    dead.append((rec, DELETE_REASON, key))
                    return None
                tomb = True
            values = self._reader.texts(rec, key, doc, self._names)
            if self._fields and not doc.deleted and rec.row is None and (
                    _UNAVAILABLE_MARKS[0] in rec.value or _UNAVAILABLE_MARKS[1] in rec.value):
                self._keep(seq, doc.row, values, staged)
            if deletes:
                for i, column in self._delete_keys:
                    if values[i] is None:
                        raise ValueError(_keyless(column, doc.row_from_key))
        except ValueError as exc:
            dead.append((rec, str(exc), key))
            return None
        for i, value in enumerate(values):
            if value is not None and not plain_text(value) and not storable(value, self._jsonb[i]):
                dead.append((rec, f"column {self.columns[i].name!r}: Postgres text cannot hold this value "
                                  "(a NUL character or a lone UTF-16 surrogate)", key))
                return None
        return (seq, key, rec.topic, rec.partition, rec.offset, tomb, *values)


    def look(self, watch: FieldWatch, records) -> None:
        """Let ``watch`` see a batch read a column at a time: the rows it asks for, each read again whole (the
        first ones while a mapped field is missing, then one in :data:`UNMAPPED_EVERY`)."""
        watch.begin()
        n, seq = len(records), 0
        while seq < n and watch.missing:  # (each row seen can only take fields off the missing ones)
            watch.see(seq, self._reader.document(records[seq][0]).row)
            seq += 1
        for seq in range(-(-seq // UNMAPPED_EVERY) * UNMAPPED_EVERY, n, UNMAPPED_EVERY):  # records by index: a
            watch.see(seq, self._reader.document(records[seq][0]).row)  # batch's columns make no pair for the rest
        watch.end(n)

    def _control(self, seq: int, rec, key, control: str, staged: "StagedRows") -> tuple | None:
        """A truncate's staged row (a tombstone without values, listed in ``staged.truncates``) or its dead
        letter; a heartbeat or schema-change event counted, and no row."""
        if control != TRUNCATE:
            staged.skipped[control] += 1
            return None
        if self._truncate is not None:
            staged.dead.append((rec, self._truncate, key))
            return None
        staged.truncates.append(seq)
        return (seq, key, rec.topic, rec.partition, rec.offset, True, *self._blank)

    def _keep(self, seq: int, row, values: list, staged: "StagedRows") -> None:
        """Each column whose field holds Debezium's placeholder: staged NULL, and listed to keep its value."""
        if type(row) is not dict:
            return
        for i, field in self._fields:
            found = row.get(field)
            if found == UNAVAILABLE or found == UNAVAILABLE_B64 or found == [UNAVAILABLE] \
                    or found == _UNAVAILABLE_MARKS[0]:  # (a decoded Avro bytes field: the placeholder's bytes)
                values[i] = None
                staged.keeps.append((seq, i))


def keepable(mapping: Mapping) -> list[int]:
    """The columns a Debezium placeholder may stand in for: each a top-level field of the row, not a key column."""
    if mapping.envelope != "debezium":
        return []
    return [i for i, c in enumerate(mapping.columns)
            if c.source.kind == "value" and len(c.source.path) == 1 and c.name not in mapping.key]


def _keyless(column, row_from_key: bool) -> str:
    why = (f"before is null, and {column.source.spec} read the record key, which has no such field"
           if row_from_key and column.source.kind == "value" else f"{column.source.spec} is null or missing")
    return f"a delete without its key: key column {column.name!r} has no value ({why}); nothing says which row " \
           "to delete"


class StagedRows:
    """A batch's staged rows (:meth:`RowMaker.staged`), made on the first pass over them; later passes
    give the kept rows (``keep``) or nothing.

    After that pass: ``count`` rows were made, ``dead`` holds the dead letters ``(record, reason, key)``,
    and :meth:`claims` gives ``(key, topic, partition, offset)`` of each row, for its claim; ``truncates``
    the seqs of truncates to apply, ``keeps`` ``(seq, column index)`` of each placeholder, ``skipped`` the
    heartbeats and schema-change events by kind.
    """

    def __init__(self, maker: RowMaker, records, keep: bool):
        self.records, self.count, self.dead = records, 0, []
        self._maker, self._kept, self._made = maker, [] if keep else None, False
        self._dead_seqs: set[int] = set()
        self.tombs: set[int] = set()  # seqs of the rows staged as tombstones (a tombstone, or a change event's delete)
        self.truncates: list[int] = []  # seqs of the truncates staged (also tombs)
        self.keeps: list[tuple[int, int]] = []  # (seq, column index): a placeholder, the column's value kept
        self.skipped: Counter = Counter()  # heartbeats and schema-change events: no rows

    @property
    def kept(self) -> list[tuple]:
        """Every row, for a ``--handler``: made with ``keep``, or not made yet."""
        if self._kept is None:
            if self._made:
                raise RuntimeError("staged rows were made without keep=True: they are gone")
            self._kept = []
        self.make()
        return self._kept

    def make(self) -> None:
        """Make every row now, unless made: they are then kept (made with ``keep``) for the passes after."""
        if not self._made:
            for _ in self:
                pass

    def __iter__(self):
        if self._made:
            yield from self._kept or ()
            return
        self._made = True
        row_of, dead_seqs, kept = self._maker._row, self._dead_seqs, self._kept
        watch = self._maker.watch
        if watch is not None and not watch.due():
            watch = None
        batch = self._maker._batch
        rows = batch.rows(self.records) if batch is not None else None
        if rows is not None:  # read a column at a time: no dead letters, no tombstones, nothing skipped
            if watch is not None:
                self._maker.look(watch, self.records)
            self.count = len(rows)
            if kept is not None:
                kept.extend(rows)
            yield from rows
            return
        if watch is not None:
            watch.begin()
            self._maker._watching = watch
        for seq, (rec, key) in enumerate(self.records):
            row = row_of(seq, rec, key, self)
            if row is None:
                dead_seqs.add(seq)
                continue
            self.count += 1
            if row[5]:
                self.tombs.add(seq)
            if kept is not None:
                kept.append(row)
            yield row
        if watch is not None:
            self._maker._watching = None
            watch.end(len(self.records))

    def claims(self):
        """The claims of the rows made, as ``(keys, topics, partitions, offsets)`` columns (what
        :meth:`kdg.store.claims.Claims.rows` takes; ``zip(*…)`` for tuples)."""
        dead, columns = self._dead_seqs, RecordColumns.of(self.records)
        if not dead and columns is not None:
            return columns.ids, columns.topics, columns.partitions, columns.offsets
        pairs = self.records if not dead else [pair for seq, pair in enumerate(self.records) if seq not in dead]
        recs = [pair[0] for pair in pairs]
        return ([pair[1] for pair in pairs], [r.topic for r in recs], [r.partition for r in recs],
                [r.offset for r in recs])


def _registry(mapping: Mapping, settings: dict[str, str] | None):
    """The registry client a mapping's schema'd formats share; None when neither format needs one."""
    if not {mapping.value_format, mapping.key_format} - {"json", "raw"}:
        return None
    from kdg.schemas.registry import Registry

    return Registry(settings or {})


def _decoding(fmt: str, registry, where: str):
    """``(decode, reason prefix)`` for a value or key format: JSON's reasons say "bad JSON", a schema'd
    decoder's say what failed themselves (:mod:`kdg.schemas.codecs`)."""
    if fmt == "json":
        return parse_json, f"bad JSON{where}: "
    from kdg.schemas.codecs import decoder

    return decoder(fmt, None, registry), ("record key: " if where else "")

"""Records to staged rows: one text value per mapped column, extracted in Python, cast later by Postgres.

A staged row is ``(seq, idempotency_key, topic, partition, offset, tombstone, *values)``: ``seq`` is
the record's place in its batch (Kafka order within a partition), so a rejected row leads back to
its record and the latest version of a key wins an upsert.
"""

from kdg.mapping.events import RecordReader
from kdg.mapping.fields import UNMAPPED_EVERY, FieldWatch
from kdg.mapping.sources import parse_json
from kdg.mapping.spec import Mapping

STAGE_PREFIX = (("seq", "integer"), ("idempotency_key", "text"), ("topic", "text"), ("partition", "integer"),
                ("offset", "bigint"), ("tomb", "boolean"))
TOMBSTONE_REASON = "tombstone (null value): --on-tombstone dead-letter"
DELETE_REASON = "a Debezium delete (op d): --on-tombstone dead-letter"


class RowMaker:
    """The compiled form of a mapping: ``rows(records)`` → staged rows and dead letters."""

    def __init__(self, mapping: Mapping, registry: dict[str, str] | None = None, *, watch: bool = False):
        """``registry``: the Schema Registry settings, for a schema'd value or key format; ``watch``: hold the
        mapping against each batch's rows (:attr:`watch`, :mod:`kdg.mapping.fields`)."""
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

    def _row(self, seq: int, rec, key, dead: list) -> tuple | None:
        """The staged row of one record; None when it became a dead letter ``(record, reason, key)`` in ``dead``."""
        tomb = rec.value is None
        if tomb and self._tombstones == "dead-letter":
            dead.append((rec, TOMBSTONE_REASON, key))
            return None
        try:
            doc = self._reader.document(rec)
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
            if deletes:
                for i, column in self._delete_keys:
                    if values[i] is None:
                        raise ValueError(_keyless(column, doc.row_from_key))
        except ValueError as exc:
            dead.append((rec, str(exc), key))
            return None
        for i, value in enumerate(values):
            if value is not None and ("\x00" in value or not value.isascii() or "\\u" in value) \
                    and not _storable(value, self._jsonb[i]):
                dead.append((rec, f"column {self.columns[i].name!r}: Postgres text cannot hold this value "
                                  "(a NUL character or a lone UTF-16 surrogate)", key))
                return None
        return (seq, key, rec.topic, rec.partition, rec.offset, tomb, *values)


def _keyless(column, row_from_key: bool) -> str:
    why = (f"before is null, and {column.source.spec} read the record key, which has no such field"
           if row_from_key and column.source.kind == "value" else f"{column.source.spec} is null or missing")
    return f"a delete without its key: key column {column.name!r} has no value ({why}); nothing says which row " \
           "to delete"


class StagedRows:
    """A batch's staged rows (:meth:`RowMaker.staged`), made on the first pass over them; later passes
    give the kept rows (``keep``) or nothing.

    After that pass: ``count`` rows were made, ``dead`` holds the dead letters ``(record, reason, key)``,
    and :meth:`claims` gives ``(key, topic, partition, offset)`` of each row, for its claim.
    """

    def __init__(self, maker: RowMaker, records, keep: bool):
        self.records, self.count, self.dead = records, 0, []
        self._maker, self._kept, self._made = maker, [] if keep else None, False
        self._dead_seqs: set[int] = set()
        self.tombs: set[int] = set()  # seqs of the rows staged as tombstones (a tombstone, or a change event's delete)

    @property
    def kept(self) -> list[tuple]:
        """Every row, for a ``--handler``: made with ``keep``, or not made yet."""
        if self._kept is None:
            if self._made:
                raise RuntimeError("staged rows were made without keep=True: they are gone")
            self._kept = []
        if not self._made:
            for _ in self:
                pass
        return self._kept

    def __iter__(self):
        if self._made:
            yield from self._kept or ()
            return
        self._made = True
        row_of, dead, dead_seqs, kept = self._maker._row, self.dead, self._dead_seqs, self._kept
        watch = self._maker.watch
        if watch is not None and watch.due():
            watch.begin()
            self._maker._watching = watch
        else:
            watch = None
        for seq, (rec, key) in enumerate(self.records):
            row = row_of(seq, rec, key, dead)
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
        dead = self._dead_seqs
        for seq, (rec, key) in enumerate(self.records):
            if seq not in dead:
                yield key, rec.topic, rec.partition, rec.offset


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


def _storable(text: str, jsonb: bool) -> bool:
    """Whether Postgres can hold ``text``: no NUL (jsonb: no ``\\u0000`` escape either), valid UTF-8."""
    if "\x00" in text or (jsonb and "\\u0000" in text and not _only_escaped_backslashes(text)):
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _only_escaped_backslashes(text: str) -> bool:
    """Whether each ``\\u0000`` in JSON ``text`` is an escaped backslash then ``u0000``, never a NUL escape."""
    i = text.find("\\u0000")
    while i >= 0:
        backslashes = len(text[:i]) - len(text[:i].rstrip("\\"))
        if backslashes % 2 == 0:  # this backslash is not itself escaped: a real \u0000
            return False
        i = text.find("\\u0000", i + 1)
    return True

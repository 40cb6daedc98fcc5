"""Records to staged rows: one text value per mapped column, extracted in Python, cast later by Postgres.

A staged row is ``(seq, idempotency_key, topic, partition, offset, tombstone, *values)``: ``seq`` is
the record's place in its batch (Kafka order within a partition), so a rejected row leads back to
its record and the latest version of a key wins an upsert.
"""

import re

from kdg.mapping.sources import as_text, json_text, parse_json
from kdg.mapping.spec import Mapping

STAGE_PREFIX = (("seq", "integer"), ("idempotency_key", "text"), ("topic", "text"), ("partition", "integer"),
                ("offset", "bigint"), ("tomb", "boolean"))
TOMBSTONE_REASON = "tombstone (null value): --on-tombstone dead-letter"
DELETE_REASON = "a Debezium delete (op d): --on-tombstone dead-letter"
UPSERTS = frozenset(("c", "u", "r"))  # Debezium's create, update, read (snapshot): the row is `after`


class RowMaker:
    """The compiled form of a mapping: ``rows(records)`` → staged rows and dead letters."""

    def __init__(self, mapping: Mapping, registry: dict[str, str] | None = None):
        """``registry``: the Schema Registry settings, for a schema'd value or key format."""
        self.mapping = mapping
        self.columns = mapping.columns
        self._value_json = mapping.reads_value
        self._key_json = any(c.source.kind == "key" for c in mapping.columns)
        self._readers = [_reader(c.source, c.type) for c in mapping.columns]
        self._jsonb = [c.type.base == "jsonb" for c in mapping.columns]
        self._tombstones = mapping.on_tombstone
        self._cdc = mapping.envelope == "debezium"
        client = _registry(mapping, registry)  # one client (and schema cache) for value and key
        self._decode_value, self._value_bad = _decoding(mapping.value_format, client, "")
        self._decode_key, self._key_bad = _decoding(mapping.key_format, client, " in the record key")

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
            deleted, doc = self._change(rec) if self._cdc and not tomb else (False, None)
            if deleted:  # staged as a tombstone: deleted by key, or (ignore) claimed and not applied
                if self._tombstones == "dead-letter":
                    dead.append((rec, DELETE_REASON, key))
                    return None
                tomb = True
            values = self._values(rec, key, tomb, doc)
        except ValueError as exc:
            dead.append((rec, str(exc), key))
            return None
        return (seq, key, rec.topic, rec.partition, rec.offset, tomb, *values)

    def _change(self, rec) -> tuple[bool, dict | None]:
        """A Debezium change event (bare, or JsonConverter's ``{"schema", "payload"}``): (False, its ``after``)
        for a create, update or snapshot read; (True, its ``before``) for a delete."""
        try:
            event = _unwrapped(self._decode_value(rec.value))
        except ValueError as exc:
            raise ValueError(f"{self._value_bad}{exc}") from None
        op = event.get("op") if type(event) is dict else None
        if op in UPSERTS:
            after = event.get("after")
            if type(after) is not dict:
                raise ValueError(f"a Debezium change event (op {op}) without an after row")
            return False, after
        if op == "d":
            return True, event.get("before") if type(event.get("before")) is dict else None
        if op is None:
            raise ValueError("not a Debezium change event: no op (with --envelope debezium)")
        raise ValueError(f"a Debezium change event with op {op!r}: only c, u, r and d are applied")

    def _values(self, rec, key, tomb: bool, doc=None) -> list:
        """The column texts; ``doc`` is the value's JSON already read (a change event's row), else read here."""
        if not self._cdc:
            try:
                doc = self._decode_value(rec.value) if self._value_json and not tomb else None
            except ValueError as exc:
                raise ValueError(f"{self._value_bad}{exc}") from None
        try:
            key_doc = self._decode_key(rec.key) if self._key_json else None
        except ValueError as exc:
            raise ValueError(f"{self._key_bad}{exc}") from None
        if self._cdc:  # the key as Kafka Connect wrapped it, or bare
            key_doc = _unwrapped(key_doc)
        try:
            values = [read(rec, key, doc, key_doc) for read in self._readers]
        except ValueError:  # said again column by column, to name the one that cannot take its value
            values = []
            for column, read in zip(self.columns, self._readers):
                try:
                    values.append(read(rec, key, doc, key_doc))
                except ValueError as exc:
                    raise ValueError(f"column {column.name!r}: {exc}") from None
        for i, value in enumerate(values):
            if value is not None and ("\x00" in value or not value.isascii() or "\\u" in value) \
                    and not _storable(value, self._jsonb[i]):
                raise ValueError(f"column {self.columns[i].name!r}: Postgres text cannot hold this value "
                                 "(a NUL character or a lone UTF-16 surrogate)")
        return values


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


def _unwrapped(doc):
    """Kafka Connect's JsonConverter with schemas on wraps each key and value as ``{"schema", "payload"}``."""
    if type(doc) is dict and len(doc) == 2 and "payload" in doc and "schema" in doc:
        return doc["payload"]
    return doc


def _reader(source, column_type):
    """``read(rec, key, doc, key_doc)`` → the column's text; a top-level JSON field (the common case) is
    read without the general path walk, once per record and column."""
    if column_type.base == "bytea" and source.kind in ("key_text", "header"):
        raw = source.raw  # the bytes, in bytea's hex form: as UTF-8 text, any other byte would become U+FFFD
        return lambda rec, key, doc, key_doc: as_text(raw(rec))
    if column_type.reads_json:
        text = json_text
    elif column_type.reads_epoch and source.kind in ("value", "key"):
        text = _dated_text
    else:
        text = as_text
    if source.kind == "value" and not source.pointer:
        name = source.path[0]
        return lambda rec, key, doc, key_doc: text(doc.get(name)) if type(doc) is dict else None
    read = source.read
    return lambda rec, key, doc, key_doc: text(read(rec, key, doc, key_doc))


_BASIC_DATE = re.compile(r"[0-9]{8}").fullmatch  # ISO 8601's basic date, YYYYMMDD


def _dated_text(value) -> str | None:
    """:func:`as_text` for a timestamptz, timestamp or date column. Digits alone are epoch milliseconds (a JSON
    number, or a string: producers that write 64-bit numbers as strings), except a JSON string of exactly 8
    digits, ISO 8601's basic date (``"20240229"``; as epoch milliseconds, 2 hours into 1970): it is staged with
    a leading space, which the cast's epoch test does not pass and Postgres's date input skips, so Postgres
    reads it as 2024-02-29, or refuses it and the row is dead-lettered with Postgres's reason."""
    if type(value) is str:
        return " " + value if _BASIC_DATE(value) else value
    return as_text(value)


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

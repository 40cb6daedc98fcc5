"""A record's idempotency key: the ``kdg-id`` header, else what ``--id-from`` says.

One resolver for `kdg consume` and for `kdg spark-replay`'s executors, so a replay keys each
record exactly as the consumer did (a JSON number as written, ``1.50`` not ``1.5``).
"""

from kdg.errors import UsageError
from kdg.mapping import parse_source
from kdg.mapping.events import RecordReader
from kdg.mapping.sources import ENVELOPE_KINDS
from kdg.records import Record, offset_key

FORMS = "header:NAME, json:FIELD, json:/POINTER, source:FIELD, envelope:FIELD or offset"


class KeyResolver:
    """Finds a record's idempotency key: the ``kdg-id`` header, else what ``--id-from`` says.

    ``json:``, ``source:`` and ``envelope:`` are read as the typed sink's columns are
    (:class:`kdg.mapping.events.RecordReader`), so a key and a column read the same field the same way:
    under ``--envelope debezium``, ``json:`` reads the change event's row (``after``; a delete's ``before``),
    ``source:`` its ``source`` block, ``envelope:`` the whole event. Their ``kind`` is ``json`` (read from
    the value, in Python).
    """

    def __init__(self, id_from: str | None, decode=None, envelope: str | None = None):
        """``decode``: how the value is read (JSON; a schema'd format's decoder, :mod:`kdg.schemas.codecs`).
        ``envelope``: the typed sink's (``none`` or ``debezium``); None where only the flag is checked."""
        self.kind, self.arg, self.source, self.decode, self.spec = None, None, None, decode, id_from
        self.envelope = envelope or "none"
        self.unreadable = "bad JSON: " if decode is None else ""  # a decoder's reasons say what failed
        if id_from:
            kind, sep, arg = id_from.partition(":")
            if kind not in ("header", "json", "offset", *ENVELOPE_KINDS) or (
                    bool(sep) if kind == "offset" else not arg):
                raise UsageError(f"--id-from {id_from!r}: use {FORMS}")
            self.kind, self.arg = ("json" if kind in ENVELOPE_KINDS else kind), arg
            if self.kind == "json":
                self.source = parse_source(id_from, "--id-from")
                if kind in ENVELOPE_KINDS and envelope == "none":
                    raise UsageError(f"--id-from {id_from!r} reads a change event: give --envelope debezium")
                self._reader = RecordReader([self.source], [None], envelope=self.envelope, decode_value=decode,
                                            value_bad=self.unreadable)

    def key(self, rec: Record) -> str | None:
        """The key, or None if the record has none; raises ValueError if ``json:`` cannot parse it."""
        found = rec.idempotency_key
        if found is not None:
            return found
        if self.kind == "header":
            raw = rec.header(self.arg)
            return raw.decode("utf-8", "replace") if raw is not None else None
        if self.kind == "json":
            if rec.value is None and (self.envelope == "none" or self.source.kind in ENVELOPE_KINDS):
                raise ValueError(f"a tombstone (null value) has no {self._document} to read --id-from "
                                 f"{self.spec} from")
            doc = self._reader.document(rec)
            return self._reader.texts(rec, None, doc, ("--id-from " + self.spec,))[0]
        if self.kind == "offset":
            return offset_key(rec.topic, rec.partition, rec.offset)
        return None

    def key_or_fallback(self, rec: Record, *, fallback: bool) -> str | None:
        """:meth:`key`, with unreadable JSON as no key; with ``fallback``, no key is topic/partition/offset."""
        try:
            found = self.key(rec)
        except ValueError:
            found = None
        if found is None and fallback:
            return offset_key(rec.topic, rec.partition, rec.offset)
        return found

    def missing(self, rec: Record) -> str:
        """Why ``rec`` has no key: what was given, and what it found."""
        where = f"{rec.topic}/{rec.partition}/{rec.offset}"
        if self.kind is None:
            return f"record {where} has no kdg-id header and no --id-from was given"
        if self.kind == "header":
            return f"record {where} has no kdg-id header and no {self.arg!r} header (--id-from {self.spec})"
        read = f"--id-from {self.spec} found nothing in record {where} (no kdg-id header either)"
        if self.envelope == "debezium" and self.source.kind == "value":
            return (f"{read}: under --envelope debezium json: reads the change event's row (after; a delete's "
                    "before, or the record key when before is null); the event's own fields are envelope:FIELD, "
                    "its source block source:FIELD")
        if self.source.kind in ENVELOPE_KINDS:
            return f"{read}: the change event has no such field"
        return f"{read}: the value has no such field, or it is null"

    @property
    def _document(self) -> str:
        return "change event" if self.source.kind in ENVELOPE_KINDS else "JSON"

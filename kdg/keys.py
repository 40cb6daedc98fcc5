"""A record's idempotency key: the ``kdg-id`` header, else what ``--id-from`` says.

One resolver for `kdg consume` and for `kdg spark-replay`'s executors, so a replay keys each
record exactly as the consumer did (a JSON number as written, ``1.50`` not ``1.5``).
"""

from kdg.errors import UsageError
from kdg.mapping import parse_source
from kdg.records import Record


class KeyResolver:
    """Finds a record's idempotency key: the ``kdg-id`` header, else what ``--id-from`` says.

    ``json:FIELD`` and ``json:/POINTER`` are read by the typed sink's own sources
    (:mod:`kdg.mapping.sources`), so a key and a column read the same field the same way.
    """

    def __init__(self, id_from: str | None, decode=None):
        """``decode``: how ``json:`` reads the value (JSON; a schema'd format's decoder, :mod:`kdg.schemas.codecs`)."""
        self.kind, self.arg, self.source, self.decode = None, None, None, decode
        self.unreadable = "bad JSON: " if decode is None else ""  # a decoder's reasons say what failed
        if id_from:
            kind, sep, arg = id_from.partition(":")
            if kind not in ("header", "json", "offset") or (bool(sep) if kind == "offset" else not arg):
                raise UsageError(f"--id-from {id_from!r}: use header:NAME, json:FIELD, json:/POINTER or offset")
            self.kind, self.arg = kind, arg
            if kind == "json":
                self.source = parse_source(id_from, "--id-from")

    def key(self, rec: Record) -> str | None:
        """The key, or None if the record has none; raises ValueError if ``json:`` cannot parse it."""
        found = rec.idempotency_key
        if found is not None:
            return found
        if self.kind == "header":
            raw = rec.header(self.arg)
            return raw.decode("utf-8", "replace") if raw is not None else None
        if self.kind == "json":
            return self.source.text_of(rec, decode=self.decode)
        if self.kind == "offset":
            return f"{rec.topic}/{rec.partition}/{rec.offset}"
        return None

    def key_or_fallback(self, rec: Record, *, fallback: bool) -> str | None:
        """:meth:`key`, with unreadable JSON as no key; with ``fallback``, no key is topic/partition/offset."""
        try:
            found = self.key(rec)
        except ValueError:
            found = None
        if found is None and fallback:
            return f"{rec.topic}/{rec.partition}/{rec.offset}"
        return found

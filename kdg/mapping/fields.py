"""A mapping held against the data: mapped fields no record has, and fields no column maps.

A misspelled source (``json:customerid`` for ``customerId``) reads NULL from every record, and a field
the producer added is dropped without a word. :class:`FieldWatch` sees both while a typed sink runs,
and says each once; ``kdg mapping check --sample N`` does the same over N records of a topic.

What counts is the row the mapping's ``json:`` sources read (a change event's ``after``). A mapped field
is *absent* when no record of a batch has it, null or not; a field is *unmapped* when a record has it
and no ``json:`` source starts with it. A running consumer looks at one batch a second at most (every
record of it for absent fields, one row in :data:`UNMAPPED_EVERY` for unmapped ones).

Example:
    >>> from kdg.mapping import build_mapping
    >>> watch = FieldWatch(build_mapping(columns=["id bigint = json:id", "who text = json:customerid"],
    ...                                  table="t"))
    >>> watch.batch([{"id": 1, "customerId": "a"}, {"id": 2, "customerId": "b"}])
    >>> [(n.kind, n.field) for n in watch.news()]
    [('absent', 'customerid'), ('unmapped', 'customerId')]
"""

import time
from dataclasses import dataclass

from kdg.mapping.record_schemas import is_wrapped
from kdg.mapping.spec import Mapping

UNMAPPED_EVERY = 64  # the rows whose fields are listed: every this many of a batch (and its first)
WATCH_EVERY_S = 1.0  # a running consumer's batches looked at: the first, then one a second at most


@dataclass(frozen=True)
class FieldNote:
    kind: str    # absent | unmapped
    field: str   # the top-level field of the row
    source: str  # absent: the source that names it; unmapped: ""
    batch: int   # the records of the batch it was found in

    def describe(self, table: str) -> str:
        if self.kind == "absent":
            return (f"mapping of {table}: {self.source} reads field {self.field!r}, which none of a batch's "
                    f"{self.batch:,} records has (misspelled? it writes NULL)")
        return (f"mapping of {table}: records carry field {self.field!r}, which no column maps (its values are "
                "not written)")


class FieldWatch:
    """Per batch, mapped fields absent from every row and fields no column maps; each said once."""

    def __init__(self, mapping: Mapping):
        self._mapped: dict[str, str] = {}  # top-level field → the first source that reads it
        # JsonConverter's values read as they are (json:/payload/FIELD): the fields are the payload's
        paths = [c.source.path for c in mapping.columns if c.source.kind == "value" and c.source.path]
        self._payload = bool(paths) and all(len(p) > 1 and p[0] == "payload" for p in paths)
        for column in mapping.columns:
            if column.source.kind == "value" and column.source.path:
                self._mapped.setdefault(column.source.path[1 if self._payload else 0], column.source.spec)
        self._said: set[tuple[str, str]] = set()
        self._news: list[FieldNote] = []
        self.missing: set[str] = set()
        self._seen: set[str] = set()
        self._next = 0.0

    @property
    def active(self) -> bool:
        """Whether the mapping reads any field of the value (there is nothing to watch otherwise)."""
        return bool(self._mapped)

    def batch(self, rows) -> None:
        """Look at one batch's rows at once (:meth:`begin`, :meth:`see` each, :meth:`end`)."""
        self.begin()
        count = 0
        for count, row in enumerate(rows, 1):
            if self.wants(count - 1):
                self.see(count - 1, row)
        self.end(count)

    def due(self) -> bool:
        """Whether the next batch is one to look at (:data:`WATCH_EVERY_S`): a field that appears, or goes
        missing, is said within a second or so, at a cost per record too small to measure."""
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + WATCH_EVERY_S
        return True

    def begin(self) -> None:
        """A batch starts: every mapped field not said yet is missing until a row has it."""
        self.missing = {f for f in self._mapped if ("absent", f) not in self._said}
        self._seen: set[str] = set()

    def wants(self, i: int) -> bool:
        """Whether row ``i`` of the batch is to be seen: while a mapped field is missing (usually only the
        first row), and every :data:`UNMAPPED_EVERY`-th for its fields."""
        return bool(self.missing) or i % UNMAPPED_EVERY == 0

    def see(self, i: int, row) -> None:
        if type(row) is not dict:
            return
        if is_wrapped(row) or (self._payload and "payload" in row):  # JsonConverter's {"schema", "payload"}: the
            row = row["payload"]                                          # fields are the payload's
            if type(row) is not dict:
                return
        if self.missing:
            self.missing.difference_update([f for f in self.missing if f in row])
        if i % UNMAPPED_EVERY == 0:
            self._seen.update(row)

    def end(self, count: int) -> None:
        """The batch of ``count`` rows ended: note what it showed."""
        if not count:
            return
        for field in sorted(self.missing):
            self._note(FieldNote("absent", field, self._mapped[field], count))
        for field in sorted(self._seen - self._mapped.keys()):
            self._note(FieldNote("unmapped", field, "", count))

    def _note(self, note: FieldNote) -> None:
        if (note.kind, note.field) not in self._said:
            self._said.add((note.kind, note.field))
            self._news.append(note)

    def news(self) -> list[FieldNote]:
        """The notes found since last asked."""
        news, self._news = self._news, []
        return news

    def counts(self) -> dict[str, int]:
        """Fields said so far, by kind."""
        kinds = [kind for kind, _ in self._said]
        return {"absent": kinds.count("absent"), "unmapped": kinds.count("unmapped")}

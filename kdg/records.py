"""What kdg knows about a record: its idempotency key, its envelope form, and how keys are made."""

import base64
import json
import re
import secrets
import string
import struct
import time

import msgspec

from kdg.errors import UsageError
from kdg.store.rows import take_spans

ID_HEADER = "kdg-id"
SEQ_HEADER = "kdg-seq"
GROUP_HEADER = "kdg-group"  # on a Kafka sink's output: the consumer group that wrote it (kdg audit --sink kafka:)
PROBE_HEADER = "kdg-doctor"  # `kdg doctor --topic`'s permission probe: no kdg-id, never written by a consumer
# a record's own coordinates as its idempotency key (an offset key): `--id-from offset`, and a key's fallback;
# claimed by them as runs of offsets (kdg.store.claims, whose SQL spells it as OWN)
offset_key = "{}/{}/{}".format


def offset_prefix(topic: str, partition: int) -> str:
    """What every offset key (:data:`offset_key`) of one partition starts with."""
    return f"{topic}/{partition}/"


class OffsetKeys(list):
    """A batch's idempotency keys, each made as its own record's offset key (:data:`offset_key` of the batch's
    topic, partition and offset at its place): the claims take its stretches of consecutive offsets as runs
    without reading the keys (:meth:`kdg.store.claims.Claims.split`). Only the sorts that make the keys so make
    one; a slice or a copy is a plain list, whose keys are read."""

    __slots__ = ()


class Uuid7Maker:
    """Time-ordered UUIDs (version 7) that the producer ledger can store as ranges.

    A key is 48 bits of Unix milliseconds, the version, 42 random bits drawn once per maker (with the
    variant), and the record's sequence number in its last 32 bits (RFC 9562's dedicated counter): the text
    ``head + "%08x" % seq``. The head holds the time and is made again once :data:`HEAD_MS` have passed, so
    a key's time is the moment it was taken, up to 0.1 s early (a claim's partition in ``kdg_dedup`` is
    chosen by it; partitions are 1 s wide at the least), and a run of records sent within it is one
    ledger row (``key_form`` 'x8', see ``006_ledger_ranges.sql``); a head per millisecond made rows of
    about 10 records at 20,000 records/s. Keys of one maker are unique while their sequences are (``kdg
    produce`` gives each record of a run its own); two makers share keys only if their 42 random bits agree.
    A sequence past 2^32 wraps (unique still: no head lives for 2^32 records) and is stored as one row.

    Example: ``Uuid7Maker()(7)`` → ``'019a6f0e-4a1b-7c3d-9e4f-5a6b00000007'``.
    """

    form, suffix = "x8", None  # how the ledger rebuilds a key from its head and sequence
    HEAD_MS = 100              # a head (its time) serves this long

    def __init__(self):
        bits = secrets.randbits(42)
        variant = "89ab"[bits >> 40]
        self._run = f"{bits >> 28 & 0xFFF:03x}-{variant}{bits >> 16 & 0xFFF:03x}-{bits & 0xFFFF:04x}"
        self._ms, self._head = -1, ""
        self._next = 0  # the sequence of a key asked for without one

    def __call__(self, seq: int | None = None) -> str:
        ms = time.time_ns() // 1_000_000
        if not 0 <= ms - self._ms < self.HEAD_MS:
            t = f"{ms & 0xFFFF_FFFF_FFFF:012x}"
            self._ms, self._head = ms, f"{t[:8]}-{t[8:]}-7{self._run}"
        if seq is None:
            seq, self._next = self._next, self._next + 1
        return self._head + "%08x" % (seq & 0xFFFF_FFFF)

    def many(self, first: int, n: int) -> list[str]:
        """The keys of sequences ``first`` to ``first + n - 1``, taken now: what ``n`` calls would make, in C
        (the sequences packed as 32-bit big-endian words and written in hex in one pass: a third of the
        cost of formatting each)."""
        self(first)  # the head, renewed if its time is up
        if self.in_range(first, first + n - 1):
            return self.made_of(self._head, first, n)
        return [self._head + "%08x" % (seq & 0xFFFF_FFFF) for seq in range(first, first + n)]

    @staticmethod
    def head_part(key: str) -> str:
        """The part of ``key`` a head would be (whether or not it is one: :meth:`made_of` tells)."""
        return key[:28]

    @staticmethod
    def made_of(head: str, first: int, n: int) -> list[str]:
        """The keys ``head`` makes of sequences ``first`` to ``first + n - 1`` (all in range)."""
        words = struct.pack(f">{n}I", *range(first, first + n)).hex(" ", 4).split(" ") if n > 0 else []
        return list(map(head.__add__, words))

    @staticmethod
    def in_range(first: int, last: int) -> bool:
        return 0 <= first and last <= 0xFFFF_FFFF

    @staticmethod
    def head_of(key: str, seq: int) -> str | None:
        """``key``'s head if ``key`` is that head followed by ``seq`` in this form (else None), whoever made it."""
        if 0 <= seq <= 0xFFFF_FFFF and len(key) == 36 and key[28:] == "%08x" % seq:
            return key[:28]
        return None


class TemplateMaker:
    """Keys from an ``--id`` template: ``template.format(seq=…)``. A template whose one field is a plain
    ``{seq}`` (``order-{seq}``) makes keys the ledger can store as ranges (``key_form`` 'd')."""

    def __init__(self, template: str):
        self.template = template
        before, field, after = template.partition("{seq}")
        plain = field and "{" not in before + after and "}" not in before + after
        self.form, self.suffix = ("d", after) if plain else (None, None)
        self._before, self._after = before, after
        self._plain = before.replace("%", "%%") + "%d" + after.replace("%", "%%")  # a plain {seq}, as %-format

    def __call__(self, seq: int) -> str:
        return self.template.format(seq=seq)

    def many(self, first: int, n: int) -> list[str]:
        """The keys of sequences ``first`` to ``first + n - 1``."""
        return list(map(self, range(first, first + n)))

    def head_part(self, key: str) -> str:
        """The part of ``key`` a head would be: the template's text before ``{seq}``."""
        return self._before

    def made_of(self, head: str, first: int, n: int) -> list[str]:
        """The keys of sequences ``first`` to ``first + n - 1`` (``head`` is this template's)."""
        return list(map(self._plain.__mod__, range(first, first + n)))

    @staticmethod
    def in_range(first: int, last: int) -> bool:
        return True

    def head_of(self, key: str, seq: int) -> str | None:
        """``key``'s head (the text before the number) if ``key`` is what this template makes of ``seq``."""
        if self.form is not None and key == f"{self._before}{seq}{self._after}":
            return self._before
        return None


def uuid7() -> str:
    """One time-ordered UUID (version 7); a :class:`Uuid7Maker` makes many for less."""
    return Uuid7Maker()()


def id_maker(template: str | None):
    """A function ``seq -> idempotency key`` with ``form``, ``suffix`` and ``head_of`` for the ledger's ranges:
    UUIDv7 by default, or ``template.format(seq=…)``.

    Example: ``id_maker("order-{seq}")(7) == "order-7"``.
    """
    if template is None:
        return Uuid7Maker()
    try:
        template.format(seq=0)
        fields = [(name, spec) for _, name, spec, _ in string.Formatter().parse(template) if name is not None]
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as exc:
        raise UsageError(f"--id {template!r}: a template may only use {{seq}} ({exc})") from None
    if not fields:
        raise UsageError(f"--id {template!r} must contain {{seq}}, or every record would share one key")
    for name, spec in fields:
        # the key must differ for every seq: {seq} as an integer, padded or in another base, never rounded
        if name != "seq" or not _INTEGER_SPEC.match(spec or ""):
            raise UsageError(f"--id {template!r}: {{{name}{':' + spec if spec else ''}}} could give two records "
                             "one key; write {seq} or an integer format of it ({seq:08d}, {seq:x})")
    return TemplateMaker(template)


# an integer's format spec that keeps every value apart: fill, align, sign, #, width, grouping, a base; no
# precision and no float or character presentation (``{seq:.0e}`` makes 10 and 11 both ``1e+01``)
_INTEGER_SPEC = re.compile(r"^(?:.?[<>=^])?[+\- ]?#?0?\d*[,_]?[bdoxXn]?$")


class Record(msgspec.Struct, gc=False):
    """A record as kdg moves it; ``headers`` keeps order and allows repeats, as Kafka does. A struct made in C
    (0.24 µs against a slotted dataclass's 0.63: the consumer makes one per record), never tracked by the
    garbage collector: it holds bytes, text, numbers, header pairs and a transform's decoded row, never itself."""

    value: bytes | None
    key: bytes | None = None
    headers: list[tuple[str, bytes]] = msgspec.field(default_factory=list)
    partition: int | None = None
    topic: str | None = None
    offset: int | None = None
    timestamp: int | None = None
    row: dict | None = None     # a transform's row: what the mapping's json: sources read (kdg.flow.transform)
    route: str | None = None    # a fan-out's route this copy of the record goes to

    def header(self, name: str) -> bytes | None:
        """The value of header ``name``; of a repeated name the last, as the jsonb headers column and Spark keep it."""
        for k, v in reversed(self.headers):
            if k == name:
                return v
        return None

    @property
    def idempotency_key(self) -> str | None:
        raw = self.header(ID_HEADER)
        return raw.decode("utf-8", "replace") if raw is not None else None

    @property
    def is_probe(self) -> bool:
        """``kdg doctor --topic``'s record: consumers step over it (offsets move on, nothing is written)."""
        return self.header(PROBE_HEADER) is not None and self.header(ID_HEADER) is None


class RecordColumns:
    """A poll's good records as columns, as :func:`kdg.flow.source.sort_headerless` sorts a poll none of whose
    messages has headers: the ``(record, key)`` pairs a batch holds are made only if something asks for them.

    The typed sink's batch read (:mod:`kdg.mapping.batch_read`), its claims and the generic table's rows take the
    columns as they are, so the common batch makes no :class:`Record` and no pair per message (about 1 µs a
    record, half of it freeing them). Anything else reads it as the list of pairs it stands for: indexed,
    iterated or added to, the pairs are made once (:meth:`pairs`) and the columns are done with."""

    __slots__ = ("values", "keys", "partitions", "topics", "offsets", "stamps", "ids", "_pairs")

    def __init__(self, values: list, keys: list, partitions: list, topics: list, offsets: list, stamps: list,
                 ids: list):
        self.values, self.keys, self.partitions, self.topics = values, keys, partitions, topics
        self.offsets, self.stamps, self.ids = offsets, stamps, ids  # ids: each record's idempotency key
        self._pairs: list | None = None

    @property
    def columnar(self) -> bool:
        """Whether the columns still stand for the records (no pair made yet: nothing may have changed them)."""
        return self._pairs is None

    @staticmethod
    def of(records) -> "RecordColumns | None":
        """``records`` (a batch's, in whatever form) if they are columns that still stand for the records: what
        a reader of columns takes as they are; else None, and the records are read as pairs."""
        return records if isinstance(records, RecordColumns) and records.columnar else None

    def pairs(self) -> list[tuple[Record, str]]:
        """The ``(record, key)`` pairs, each record as the record-by-record sort makes one without headers."""
        if self._pairs is None:
            n = len(self.ids)
            self._pairs = list(zip(map(Record, self.values, self.keys, [[] for _ in range(n)], self.partitions,
                                       self.topics, self.offsets, self.stamps), self.ids))
            self.values = self.keys = self.partitions = self.topics = self.offsets = self.stamps = self.ids = None
        return self._pairs

    def take(self, runs: list[tuple[int, int]]) -> "RecordColumns":
        """The records of ``runs`` (``(start, end)`` each, in order) as columns of their own, a slice a run."""
        if runs == [(0, len(self))]:
            return self
        columns = take_spans([self.values, self.keys, self.partitions, self.topics, self.offsets, self.stamps,
                              self.ids], runs)
        if type(self.ids) is OffsetKeys:  # (a share of offset keys is offset keys of its own records)
            columns[-1] = OffsetKeys(columns[-1])
        return RecordColumns(*columns)

    def __len__(self) -> int:
        return len(self.ids) if self._pairs is None else len(self._pairs)

    def __iter__(self):
        return iter(self.pairs())

    def __getitem__(self, index):
        """A pair by its index is made alone while the records are columns (equal each time, not the same object);
        a slice makes every pair."""
        if self._pairs is None and type(index) is int:
            i = range(len(self.ids))[index]  # (a negative index counts from the end; out of range raises)
            return (Record(self.values[i], self.keys[i], [], self.partitions[i], self.topics[i], self.offsets[i],
                           self.stamps[i]), self.ids[i])
        return self.pairs()[index]

    def __add__(self, other: list) -> list:
        return self.pairs() + list(other)


def all_utf8(data: bytes) -> bool:
    """Whether ``data`` (a poll's values joined) is UTF-8; ASCII is, and is checked without making the text (0.3 µs
    a record of the Connect benchmark's)."""
    if data.isascii():
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def with_value(rec: Record, value: bytes | None) -> Record:
    """A copy of ``rec`` with ``value``."""
    return msgspec.structs.replace(rec, value=value)


def _text_or_b64(data: bytes | None) -> tuple[str | None, bool]:
    if data is None:
        return None, False
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return base64.b64encode(data).decode(), True


def to_envelope(rec: Record) -> str:
    """One JSON line that ``kdg produce --format json`` reads back into the same record."""
    value, value_b64 = _text_or_b64(rec.value)
    key, key_b64 = _text_or_b64(rec.key)
    headers = []
    for name, raw in rec.headers:
        text, b64 = _text_or_b64(raw)
        headers.append({"name": name, "value": text, **({"b64": True} if b64 else {})})
    env = {"topic": rec.topic, "partition": rec.partition, "offset": rec.offset, "timestamp": rec.timestamp,
           "key": key, "value": value, "headers": headers}
    if key_b64:
        env["key_b64"] = True
    if value_b64:
        env["value_b64"] = True
    return json.dumps(env, separators=(",", ":"))


def _decode(text: str | None, b64: bool) -> bytes | None:
    if text is None:
        return None
    return base64.b64decode(text) if b64 else text.encode("utf-8")


def from_envelope(line: str, where: str) -> Record:
    """Parse an envelope line; a malformed one is a usage error naming ``where`` (file:line)."""
    try:
        env = json.loads(line)
        headers = [(h["name"], _decode(h.get("value"), h.get("b64", False))) for h in env.get("headers", [])]
        return Record(value=_decode(env.get("value"), env.get("value_b64", False)),
                      key=_decode(env.get("key"), env.get("key_b64", False)), headers=headers)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"{where}: not a kdg JSON envelope ({exc})") from None

"""A poll's messages sorted into sink rows per batch, with no Python per record: the generic Postgres sink's path.

`kdg consume`'s general sort (:func:`kdg.flow.source.sort_batch`) makes one :class:`~kdg.records.Record` per message and
reads each one in Python: 5-10 µs a record, against about 2 µs for confluent-kafka to hand the message over.
Most batches are alike, though: every record with the same header names (a producer's own, kdg's
``kdg-id`` and ``kdg-seq``), plain UTF-8 values of a sane size. :func:`sort_rows` checks that a batch is one of
those with a few passes over whole columns, done in C (``map`` over confluent-kafka's methods, ``bytes.join``,
slicing), and then builds the batch's :class:`~kdg.store.rows.SinkRows` the same way. A batch that is not
(a header missing or repeated differently, a value that is not UTF-8, one that is too big, a header that
needs JSON escapes) returns None, and the general sort takes it, dead letters and all: the two paths give the
same rows, which ``tests/test_hot_paths.py`` checks on every kind of batch.
"""

from itertools import chain
from json.encoder import encode_basestring_ascii as _esc
from operator import itemgetter

from confluent_kafka import Message

from kdg.records import ID_HEADER, PROBE_HEADER, OffsetKeys, all_utf8, offset_key
from kdg.sinks import Batch
from kdg.store.rows import SinkRows

_NAME, _VALUE = itemgetter(0), itemgetter(1)
# header values that JSON writes as they are (printable ASCII but '"' and '\'); NUL is not one of them
_NEEDS_NO_ESCAPE = bytes(range(0x20, 0x7F)).replace(b'"', b"").replace(b"\\", b"")
_shapes: dict[tuple[str, ...], tuple[list[bytes], bytes]] = {}  # per header-name sequence: its JSON's pieces


def _headers_json(shape: tuple[str, ...], values: list[bytes], n: int) -> list[str]:
    """Each record's headers as :func:`kdg.store.rows.headers_json` writes them, for ``n`` records whose headers
    have the names ``shape`` and the values ``values`` (record by record, flat), none of which needs escapes.

    The pieces of every record's text are laid out in one list by slice assignment, joined once, decoded
    once and split on NUL (which no value holds): no Python runs per record."""
    pieces = _shapes.get(shape)
    if pieces is None:
        heads = [("{" if i == 0 else '",') + _esc(name) + ':"' for i, name in enumerate(shape)]
        pieces = _shapes[shape] = ([h.encode() for h in heads], b'"}\0')
    heads, tail = pieces
    width, step = len(shape), 2 * len(shape) + 1
    flat: list = [None] * (step * n)
    for i, head in enumerate(heads):
        flat[2 * i::step] = [head] * n
        flat[2 * i + 1::step] = values[i::width]
    flat[step - 1::step] = [tail] * n
    texts = b"".join(flat).decode("ascii").split("\0")
    texts.pop()  # after the last NUL
    return texts


def _texts(raw: list[bytes]) -> list[str]:
    """``raw`` (printable ASCII, checked) decoded in one pass."""
    return b"\0".join(raw).decode("ascii").split("\0")


def sort_rows(msgs: list, max_bytes: int, require_utf8: bool, must_have_key: bool) -> Batch | None:
    """``msgs`` (one poll, errors already taken out) as a batch of sink rows, or None where the general sort
    must take it. Keys as :class:`~kdg.keys.KeyResolver` finds them without ``--id-from``: the last ``kdg-id``
    header, else (unless ``must_have_key``) ``topic/partition/offset``."""
    n = len(msgs)
    if not n:
        return None
    topics = list(map(Message.topic, msgs))  # one poll may hold several topics' (a pipeline's)
    values = list(map(Message.value, msgs))
    present = list(filter(None, values))  # None and b"" need no checks
    if present:
        if max(map(len, present)) > max_bytes:
            return None
        if require_utf8:
            # b"\0" joins them so that a value's broken sequence cannot be completed by the next one's bytes
            if not all_utf8(b"\0".join(present)):
                return None
    headers = list(map(Message.headers, msgs))
    if headers.count(None) == n:
        if must_have_key:
            return None  # the general sort says what is missing
        ids, jsons = None, ["{}"] * n
    else:
        if None in headers:
            return None
        width = len(headers[0])
        if not width or list(map(len, headers)).count(width) != n:
            return None
        flat = list(chain.from_iterable(headers))
        names = list(map(_NAME, flat))
        shape = tuple(names[:width])
        if any(names[i::width].count(shape[i]) != n for i in range(width)):
            return None
        if PROBE_HEADER in shape:
            return None  # the general sort steps over `kdg doctor`'s record
        raw = list(map(_VALUE, flat))
        if None in raw:
            return None
        if b"".join(raw).translate(None, _NEEDS_NO_ESCAPE):
            return None
        jsons = _headers_json(shape, raw, n)
        if ID_HEADER in shape:
            last = width - 1 - shape[::-1].index(ID_HEADER)  # of a repeated name the last, as jsonb keeps it
            ids = _texts(raw[last::width])
        elif must_have_key:
            return None
        else:
            ids = None
    partitions = list(map(Message.partition, msgs))
    offsets = list(map(Message.offset, msgs))
    if ids is None:
        ids = OffsetKeys(map(offset_key, topics, partitions, offsets))
    batch = Batch(rows=SinkRows([ids, topics, partitions, offsets, list(map(Message.key, msgs)), values, jsons]))
    # librdkafka hands a partition's messages over in order: its last offset here is its highest
    tps = list(zip(topics, partitions))
    batch.next_offsets = {tp: o + 1 for tp, o in dict(zip(tps, offsets)).items()}
    firsts = dict(zip(reversed(tps), range(n - 1, -1, -1)))
    batch.first_offsets = {tp: offsets[i] for tp, i in firsts.items()}
    batch.first_timestamps = {tp: msgs[i].timestamp()[1] for tp, i in firsts.items()}
    return batch

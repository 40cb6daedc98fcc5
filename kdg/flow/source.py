"""The source of the consume flow: a poll's messages sorted into a batch, each record keyed by its route.

:class:`Keys` holds each topic's :class:`~kdg.keys.KeyResolver` (its route's ``id_from``, else
``--id-from``) and its route's transform; :func:`sort_batch` turns messages into a
:class:`~kdg.sinks.Batch` of keyed records and dead letters, and :meth:`Keys.transformed` puts each
record through its route's transform (or a fan-out's). The router (:mod:`kdg.flow.routes`) decides the
table; the transaction unit (:mod:`kdg.store.unit`) writes it.
"""

from itertools import groupby, repeat
from operator import add

from kdg.errors import UsageError
from kdg.flow.routes import Router
from kdg.keys import KeyResolver
from kdg.records import OffsetKeys, Record, RecordColumns, all_utf8, offset_key, offset_prefix
from kdg.sinks import Batch


def value_decoder(req):
    """How values are read outside a mapping (``--id-from json:``, the stdout sink): None for JSON or raw bytes."""
    from kdg.schemas.codecs import optional_decoder

    return optional_decoder(req.value_format, req.conn.registry)


class Keys:
    """Each topic's :class:`KeyResolver`: its route's ``id_from`` (else ``--id-from``) and envelope."""

    def __init__(self, req, router: Router):
        self.req, self.router = req, router
        self._by_route: dict[str, KeyResolver] = {}
        self._by_topic: dict[str, KeyResolver] = {}
        for route in router.routes:  # a malformed --id-from is refused before anything is read
            self._for(route)
        self.plain = all(r.kind is None for r in self._by_route.values())  # every key from the kdg-id header
        self.fans = {r.name: _transform(self.req, r) for r in router.routes if r.transform is not None}
        fanned = any(r.fan is not None for r in router.routes)
        self.plain = self.plain and not self.fans and not fanned  # a transform, or a fan-out, reads each record
        if fanned and not self.fans:
            self.fans = {None: None}  # (a fan-out without transforms still copies each record per route)

    def _for(self, route) -> KeyResolver:
        found = self._by_route.get(route.name)
        if found is None:
            id_from = route.id_from or self.req.id_from
            decode = value_decoder(self.req) if id_from else None
            envelope = route.mapping.envelope if route.mapping is not None else "none"
            found = self._by_route[route.name] = KeyResolver(id_from, decode, envelope=envelope)
        return found

    def transformed(self, batch: Batch) -> None:
        """Each record through its route's transform (a fan-out: every route's): rows in place of records,
        filtered and failed counted."""
        if not self.fans or not batch.records:
            return
        from kdg.flow.transform import fan_out

        records, batch.records = batch.records, []
        run: list = []
        topic = None
        for pair in records + [(None, None)]:  # runs of one topic, in order
            now = pair[0].topic if pair[0] is not None else None
            if now != topic and run:
                outputs = self._outputs(topic)
                if outputs is None:
                    batch.records += run
                else:
                    made, failed = len(batch.records), len(batch.dead)
                    filtered, extra = fan_out(run, outputs, batch.records, batch.dead, batch.gone)
                    batch.filtered += filtered
                    batch.exploded += extra
                    if filtered and len(outputs) == 1:  # (a fan-out's routes name what each filtered)
                        batch.gone += _gone(run, outputs[0][0], batch.records[made:], batch.dead[failed:])
                run = []
            topic = now
            run.append(pair)

    def _outputs(self, topic: str) -> list | None:
        """``(route name, Transform or None)`` of each route ``topic`` goes to; None: one route, no transform."""
        routes = self.router.fanned(topic)
        if len(routes) == 1 and routes[0].transform is None:
            return None
        return [(r.name if len(routes) > 1 else None, self.fans.get(r.name)) for r in routes]

    def of(self, topic: str) -> KeyResolver:
        found = self._by_topic.get(topic)
        if found is None:
            found = self._by_topic[topic] = self._for(self.router.route(topic))
        return found


def _gone(pairs: list, route: str | None, rows: list, dead: list) -> list[tuple]:
    """What one route's transform filtered out of one topic's ``pairs``, given the ``rows`` and ``dead`` letters it
    made: ``(topic, route, key, partition, offset)`` of each record it left without a row, so that its table
    claims it as filtered."""
    made = {(rec.partition, rec.offset) for rec, _ in rows}
    made.update((rec.partition, rec.offset) for rec, *_ in dead)
    return [(rec.topic, route, key, rec.partition, rec.offset) for rec, key in pairs
            if (rec.partition, rec.offset) not in made]


def _transform(req, route):
    """The route's transform, its value and key decoded by its formats (a mapping's, else the request's)."""
    from kdg.flow.transform import Transform, load_function
    from kdg.schemas.codecs import optional_decoder

    fn = load_function(route.transform, "--transform")
    formats = (route.mapping.value_format, route.mapping.key_format) if route.mapping is not None else (
        req.value_format, "json")
    decode = [optional_decoder(f, req.conn.registry) for f in formats]
    return Transform(fn, *decode)


def sort_batch(msgs, keys: Keys, req, must_have_key: bool) -> Batch:
    """Turn messages into a batch: good records with keys, and dead letters with a reason.

    This runs once per record, so it reads each message once and keeps to local names. Records share
    one topic string (a message's own lives as long as anything holds it), and each message is let go
    once read: a batch's messages and its records never all live at once.
    """
    batch = sort_headerless(msgs, keys, req, must_have_key)
    return batch if batch is not None else sort_each(msgs, keys, req, must_have_key)


def sort_each(msgs, keys: Keys, req, must_have_key: bool) -> Batch:
    """:func:`sort_batch` a record at a time: any poll."""
    batch = Batch()
    records, dead, first, after = batch.records, batch.dead, batch.first_offsets, batch.next_offsets
    max_bytes, utf8 = req.max_bytes, req.require_utf8
    topic = resolver = by_offset = None
    for i, msg in enumerate(msgs):
        msgs[i] = None
        partition, offset = msg.partition(), msg.offset()
        if msg.topic() != topic:
            topic = msg.topic()
            resolver = keys.of(topic)
            by_offset = resolver.kind == "offset"  # every record has a key: a probe is known by its headers alone
        rec = Record(msg.value(), msg.key(), msg.headers() or [], partition, topic, offset, msg.timestamp()[1])
        tp = (topic, partition)
        if tp not in first:
            first[tp] = offset
            batch.first_timestamps[tp] = rec.timestamp
        if offset >= after.get(tp, 0):
            after[tp] = offset + 1
        value = rec.value or b""
        if len(value) > max_bytes:
            dead.append((rec, f"oversize: {len(value)} bytes > {max_bytes}", rec.idempotency_key))
            continue
        if utf8:
            try:
                value.decode("utf-8")
            except UnicodeDecodeError as exc:
                dead.append((rec, f"not UTF-8: {exc.reason} at byte {exc.start}", rec.idempotency_key))
                continue
        try:
            key = resolver.key(rec)
        except ValueError as exc:
            if rec.is_probe:
                batch.probes.append(tp)
                continue
            dead.append((rec, f"{resolver.unreadable}{exc}", None))
            continue
        if (key is None or by_offset) and rec.is_probe:  # `kdg doctor`'s record: stepped over
            batch.probes.append(tp)
            continue
        if key is None:
            if must_have_key:
                raise UsageError(f"{resolver.missing(rec)}; exactly-once needs an idempotency key for every "
                                 "record (nothing of this batch was written)")
            key = offset_key(topic, partition, offset)
        records.append((rec, key))
    return batch


def sort_headerless(msgs, keys: Keys, req, must_have_key: bool) -> Batch | None:
    """:func:`sort_batch` a list at a time for the common poll whose records all go in as they are: no message
    has headers (no ``kdg-id``, no probe), every key is topic/partition/offset (``--id-from offset``, or none
    needed), every value fits and is UTF-8 where that is asked: the batch's records as columns
    (:class:`~kdg.records.RecordColumns`). None for any other poll: the record-by-record sort then says what
    is wrong with which record."""
    if not msgs or any([m.headers() for m in msgs]):
        return None
    topics = [m.topic() for m in msgs]
    for topic in set(topics):
        kind = keys.of(topic).kind
        if not (kind == "offset" or (kind is None and not must_have_key)):
            return None
    values = [m.value() for m in msgs]
    present = [v for v in values if v is not None]
    if present and max(map(len, present)) > req.max_bytes:
        return None
    if req.require_utf8:
        if not all_utf8(b"\n".join(present)):  # (a newline ends any sequence a value left open: no false pass)
            return None
    partitions, offsets = [m.partition() for m in msgs], [m.offset() for m in msgs]
    stamps = [m.timestamp()[1] for m in msgs]
    batch = Batch()
    first, after, stamped = batch.first_offsets, batch.next_offsets, batch.first_timestamps
    keys = OffsetKeys()  # topic/partition/offset: a run of one partition's prefix, and each offset's digits
    i = 0
    for tp, run in groupby(zip(topics, partitions)):
        n = len(list(run))
        if tp not in first:
            first[tp], stamped[tp] = offsets[i], stamps[i]
        last = max(offsets[i:i + n]) + 1
        if last > after.get(tp, 0):
            after[tp] = last
        keys += map(add, repeat(offset_prefix(*tp), n), map(str, offsets[i:i + n]))
        i += n
    batch.records = RecordColumns(values, [m.key() for m in msgs], partitions, topics, offsets, stamps, keys)
    return batch

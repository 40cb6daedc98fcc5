"""The per-record code of produce and consume, checked against the obvious (slower) way of doing it."""

import itertools
import json
import time
import uuid

import confluent_kafka
import pytest

from kdg.consume import ConsumeRequest
from kdg.flow.source import Keys
from kdg.flow.source import sort_batch as _sort
from kdg.errors import UsageError
from kdg.produce import _stamp
from kdg.records import OffsetKeys, Record, Uuid7Maker, id_maker, uuid7
from kdg.settings import Connection
from kdg.store.rows import headers_json as _headers_json

HEADER_CASES = [
    [],
    [("kdg-id", b"0190f1c2-3b4d-7e8f-9a0b-1c2d3e4f5a6b"), ("kdg-seq", b"12")],
    [("quote\"back\\slash", b"tab\there\nnewline"), ("empty", b""), ("none", None)],
    [("unicode-\u00e9", "z\u00fcrich \u2603 \U0001F600".encode()), ("bad-utf8", b"\xff\xfeok")],
]


@pytest.mark.parametrize("headers", HEADER_CASES)
def test_headers_json_is_what_json_dumps_writes(headers):
    expected = json.dumps({k: None if v is None else v.decode("utf-8", "replace") for k, v in headers},
                          separators=(",", ":"))
    assert json.loads(_headers_json(headers)) == json.loads(expected)
    assert _headers_json(headers) == expected


def test_a_repeated_header_keeps_the_last_value_as_jsonb_does():
    assert json.loads(_headers_json([("a", b"1"), ("a", b"2")])) == {"a": "2"}


def _msg(partition, offset, value=b"v", headers=None):
    return confluent_kafka.Message(topic="t", partition=partition, offset=offset, key=None, value=value,
                                   headers=headers, timestamp=(1, 1_700_000_000_000))


def test_sort_keys_offsets_and_dead_letters():
    req = ConsumeRequest("t", "g", "at-least-once", Connection("b", "d"), max_bytes=10)
    msgs = [_msg(0, 7, headers=[("kdg-id", b"k7")]), _msg(1, 3), _msg(0, 8, value=b"\xff"),
            _msg(1, 4, value=b"x" * 11), _msg(0, 9, headers=[("kdg-id", b"k9")])]
    batch = _sort(msgs, Keys(req, req.router()), req, must_have_key=False)
    assert [key for _, key in batch.records] == ["k7", "t/1/3", "k9"]  # no key: topic/partition/offset
    assert [reason.split(":")[0] for _, reason, _ in batch.dead] == ["not UTF-8", "oversize"]
    assert batch.first_offsets == {("t", 0): 7, ("t", 1): 3}
    assert batch.next_offsets == {("t", 0): 10, ("t", 1): 5}
    assert len(batch) == 5


def _kdg_msgs(changes=None, n=6):
    """Messages as kdg produces them (kdg-id, kdg-seq), over two partitions; ``changes[i]`` edits message i."""
    msgs = []
    for i in range(n):
        fields = dict(topic="t", partition=i % 2, offset=100 + i, key=b"k%d" % i if i % 3 else None,
                      value=b'{"n": %d}' % i, headers=[("kdg-id", b"id-%d" % i), ("kdg-seq", b"%d" % i)],
                      timestamp=(1, 1_700_000_000_000 + i))
        fields.update((changes or {}).get(i, {}))
        msgs.append(confluent_kafka.Message(**fields))
    return msgs


BATCHES = {  # name: (messages, whether the per-batch sort takes them)
    "kdg's own": (_kdg_msgs(), True),
    "no headers at all": ([_msg(i % 2, i) for i in range(4)], True),
    "the same headers, other names": (_kdg_msgs({i: {"headers": [("a%b", b"1"), ("kdg-id", b"x%d" % i), ("kdg-id", b"y%d" % i)]}
                                                   for i in range(6)}), True),
    "a null value": (_kdg_msgs({2: {"value": None}}), True),
    "one record without headers": (_kdg_msgs({3: {"headers": None}}), False),
    "headers in another order": (_kdg_msgs({1: {"headers": [("kdg-seq", b"1"), ("kdg-id", b"id-1")]}}), False),
    "a header that JSON escapes": (_kdg_msgs({4: {"headers": [("kdg-id", b'q"4'), ("kdg-seq", b"4")]}}), False),
    "a null header": (_kdg_msgs({0: {"headers": [("kdg-id", b"id-0"), ("kdg-seq", None)]}}), False),
    "a value that is not UTF-8": (_kdg_msgs({5: {"value": b"ok\xc3"}}), False),
    "a value split so that the next completes it": (_kdg_msgs({0: {"value": b"\xc3"}, 1: {"value": b"\xa9"}}), False),
    "an oversize value": (_kdg_msgs({2: {"value": b"x" * 2000}}), False),
    "two topics": (_kdg_msgs({3: {"topic": "u"}}), True),  # a pipeline's poll: sorted per batch too
}


@pytest.mark.parametrize("name", BATCHES)
def test_the_per_batch_sort_makes_what_the_per_record_sort_makes(name):
    """kdg.batching's rows, offsets and timestamps are the general sort's, or it leaves the batch to it."""
    from kdg.batching import sort_rows
    from kdg.store.rows import SinkRows, sink_row

    msgs, taken = BATCHES[name]
    req = ConsumeRequest(["t", "u"], "g", "at-least-once", Connection("b", "d"), max_bytes=1000)
    fast = sort_rows(list(msgs), req.max_bytes, req.require_utf8, must_have_key=False)
    assert (fast is not None) == taken
    if fast is None:
        return
    slow = _sort(list(msgs), Keys(req, req.router()), req, must_have_key=False)
    assert not slow.dead
    assert fast.rows.columns == SinkRows.of([sink_row(rec, key) for rec, key in slow.records]).columns
    assert (type(fast.rows.keys) is OffsetKeys) == (name == "no headers at all")  # (the others carry kdg-ids)
    assert (fast.first_offsets, fast.next_offsets, fast.first_timestamps, len(fast)) == \
        (slow.first_offsets, slow.next_offsets, slow.first_timestamps, len(slow))


def test_the_per_batch_sort_leaves_a_keyless_batch_to_the_general_one_under_exactly_once():
    from kdg.batching import sort_rows

    assert sort_rows([_msg(0, 1), _msg(0, 2)], 1000, True, must_have_key=True) is None
    assert sort_rows(_kdg_msgs(), 1000, True, must_have_key=True) is not None


def test_sort_refuses_a_keyless_record_when_keys_are_required():
    req = ConsumeRequest("t", "g", "exactly-once", Connection("b", "d"))
    with pytest.raises(UsageError, match="t/2/5 has no kdg-id header"):
        _sort([_msg(2, 5)], Keys(req, req.router()), req, must_have_key=True)


@pytest.mark.parametrize("make", [uuid7, Uuid7Maker()], ids=["one-off", "maker"])
def test_uuid7_is_a_version_7_uuid_ordered_by_time(make):
    before = time.time_ns() // 1_000_000
    keys = [make() for _ in range(20_000)]
    after = time.time_ns() // 1_000_000
    assert len(set(keys)) == len(keys)
    for key in keys[:100] + keys[-100:]:
        parsed = uuid.UUID(key)
        assert str(parsed) == key  # canonical lower-case 8-4-4-4-12 form
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
        assert before <= parsed.int >> 80 <= after
    assert [k[:13] for k in keys] == sorted(k[:13] for k in keys)  # the millisecond prefix never goes back


@pytest.mark.parametrize("first, n", [(0, 0), (0, 1), (7, 1000), (2**32 - 3, 3), (2**32 - 2, 5)],
                         ids=["none", "one", "a chunk", "up to the last sequence", "across the wrap"])
def test_keys_made_per_chunk_are_the_keys_made_one_by_one(first, n, monkeypatch):
    monkeypatch.setattr(time, "time_ns", lambda: 1_764_000_000_000_000_000)  # one head for both
    make = Uuid7Maker()
    assert make.many(first, n) == [make(seq) for seq in range(first, first + n)]


def test_stamp_adds_a_key_and_a_sequence_only_when_missing():
    fresh = Record(b"v", headers=[("x", b"1")])
    key, seq = _stamp(fresh, 41, id_maker("order-{seq}"))
    assert (key, seq) == ("order-41", 41)
    assert fresh.headers == [("x", b"1"), ("kdg-id", b"order-41"), ("kdg-seq", b"41")]
    replayed = Record(b"v", headers=[("kdg-seq", b"7"), ("kdg-id", b"first"), ("kdg-id", b"second")])
    # the last of a repeated header counts, as the audit's dict(), jsonb and Spark's LAST_WIN map read it
    assert _stamp(replayed, 0, id_maker(None)) == ("second", 7)
    assert len(replayed.headers) == 3
    odd = Record(b"v", headers=[("kdg-id", None), ("kdg-seq", b"not-a-number")])
    key, seq = _stamp(odd, 5, id_maker("k-{seq}"))
    assert (key, seq) == ("k-5", 5)  # a None id is no id; a bad sequence keeps the record's position
    assert odd.headers[-1] == ("kdg-id", b"k-5") and len(odd.headers) == 3


def test_calm_collector_collects_once_a_burst_has_passed(monkeypatch):
    """A full collection only after a burst, only once the loop caught up, and at most every `every_s`."""
    import gc

    from kdg.memory import CalmCollector

    runs = []
    monkeypatch.setattr(gc, "collect", lambda *a: runs.append(now[0]) or 0)
    now = [0.0]
    calm = CalmCollector(records=100, every_s=30, clock=lambda: now[0])
    assert not calm.turned(60, busy=False)           # not a burst yet
    assert not calm.turned(60, busy=True)            # a burst, but still catching up
    assert calm.turned(3, busy=False) and runs == [0.0]
    assert not calm.turned(500, busy=False)          # another burst within 30 s: waits
    now[0] = 31.0
    assert calm.turned(0, busy=False) and runs == [0.0, 31.0]
    assert not calm.turned(0, busy=False)            # nothing since


def _expand(row: tuple) -> list[tuple]:
    """A ledger row as the records it stands for, as ``kdg_ledger_keys`` expands it (006_ledger_ranges.sql)."""
    run_id, key, topic, seq, status, partition, offset, error, n, form, suffix = row
    if n is None:
        return [(key, seq, status, partition, offset, error)]
    made = (lambda s: key + "%08x" % s) if form == "x8" else (lambda s: f"{key}{s}{suffix or ''}")
    return [(made(s), s, status, partition, None if offset is None else offset + s - seq, error)
            for s in range(seq, seq + n)]


@pytest.mark.parametrize("template", [None, "order-{seq}-x", "o-{seq:05d}"], ids=["uuid7", "template", "formatted"])
@pytest.mark.parametrize("confirms", [True, False], ids=["acked", "sent"])
@pytest.mark.parametrize("refusals", [True, False], ids=["refusals", "all-delivered"])
@pytest.mark.parametrize("told", [True, False], ids=["heads-told", "heads-found"])
def test_ledger_runs_stand_for_exactly_the_records_they_replace(template, confirms, refusals, told, monkeypatch):
    """Delivery reports as they arrive (partitions interleaved; an offset taken by another producer; a
    refusal; a key from the input; a sequence from the input; a key's head renewed mid-run) make fewer rows,
    which expand to exactly the rows one per record would be. Without refusals, most go by the per-run path.
    ``told``: the producer says which keys its id maker made (their head), as a chunk of made keys does;
    else the ledger finds and checks each key's head itself."""
    from kdg.metrics import Metrics
    from kdg.produce import ProduceReport, _Outcomes

    one_by_one = []
    each = _Outcomes._record_each
    monkeypatch.setattr(_Outcomes, "_record_each", lambda self, d, **kw: (one_by_one.extend(d), each(self, d, **kw)))
    make = id_maker(template)
    reports, expected, offsets = [], [], {0: 100, 1: 7}
    for seq in range(400):
        partition = (seq // 40) % 2  # runs of 40, as a sticky partitioner sends them
        if seq == 200 and template is None:
            time.sleep(0.002)
            make._ms = -1  # the head's time is up: a new head (a later millisecond) from here
        key = "from-the-input" if seq == 57 else make(seq)
        head = make.head_part(key) if told and make.form is not None and seq not in (57, 300) else None
        if seq == 120:
            offsets[partition] += 1  # another producer's record (or a transaction marker) in between
        if refusals and seq % 97 == 5:
            reports.append((key, seq, None, None, "MSG_SIZE_TOO_LARGE", "too large", head))
            expected.append((key, seq, "failed", None, None, "too large"))
            continue
        at = 10_000 + seq if seq == 300 else seq  # a kdg-seq header of its own: not the key's sequence
        reports.append((key, at, partition, offsets[partition], None, None, head))
        expected.append((key, at, "acked" if confirms else "sent", partition,
                         offsets[partition] if confirms else None, None))
        offsets[partition] += 1
    outcomes = _Outcomes(ProduceReport("at-least-once", "t", "r"), None, "run", "t", confirms, Metrics("produce", "g"),
                         keys=make)
    outcomes.due = float("inf")
    for at in range(0, 400, 64):  # reports are taken in chunks; a run goes on across them
        outcomes._record(reports[at:at + 64])
    outcomes._write()
    if template is None:
        assert len({r[1] for r in outcomes.rows if r[8]}) == 2, "the head was not renewed"
    expanded = [r for row in outcomes.rows for r in _expand(row)]
    assert sorted(expanded, key=lambda r: r[1]) == sorted(expected, key=lambda r: r[1])
    if make.form is None:
        assert len(outcomes.rows) == 400
    else:
        assert len(outcomes.rows) < 40, outcomes.rows  # ~10 runs of 40, split where the list above says
        if not refusals:  # only the chunks holding the odd records above went one by one
            assert 0 < len(one_by_one) <= 3 * 64, len(one_by_one)


def test_a_paced_synthetic_load_hands_out_only_what_is_due_in_few_wake_ups(monkeypatch):
    """`kdg produce --count N --rate R` goes in chunks: each take hands out only records already due (record k
    at k/R s), never one ahead of its time, all N in order, and sleeps once per PACE_S worth, not per record."""
    from kdg import sources

    clock, sleeps = [0.0], []

    def sleep(seconds):
        assert seconds >= 0
        sleeps.append(seconds)
        clock[0] += seconds + 0.0003  # a wake-up is always a little late

    monkeypatch.setattr(sources.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(sources.time, "sleep", sleep)
    rate, count = 7000.0, 7000
    load = sources.synthetic(count, 10, rate, sources.LineOptions(key="k"))
    assert isinstance(load, sources.SyntheticLoad)
    taken, sizes = 0, []
    while (columns := load.take(1000)) is not None:
        n = len(columns[0])
        assert 1 <= n <= 1000 and columns[1] == [b"k"] * n and columns[2] == [[]] * n
        taken += n
        sizes.append(n)
        assert taken <= clock[0] * rate + 1, f"{taken} records handed out by {clock[0]:.4f} s: ahead of the rate"
        clock[0] += 0.00005  # sending a chunk takes a little time
    assert taken == count
    assert clock[0] >= (count - 1) / rate
    assert len(sleeps) < count / 10, f"{len(sleeps)} wake-ups for {count} records"
    assert max(sizes) > 1


def test_an_unpaced_synthetic_load_takes_whole_chunks_without_sleeping(monkeypatch):
    from kdg import sources

    monkeypatch.setattr(sources.time, "sleep", lambda s: pytest.fail("slept"))
    load = sources.synthetic(2500, 10, None, sources.LineOptions())
    assert [len(c[0]) for c in iter(lambda: load.take(1000), None)] == [1000, 1000, 500]
    records = list(sources.synthetic(3, 4, None, sources.LineOptions(partition=2)))
    assert [(len(r.value), r.key, r.headers, r.partition) for r in records] == [(4, None, [], 2)] * 3
    paced = sources.synthetic(None, 4, 1e9, sources.LineOptions())  # endless; iterated, paced one by one
    assert len(list(itertools.islice(paced, 5))) == 5 and paced.taken == 5


HEADERLESS = {  # name: (messages, --id-from, exactly-once, whether the list-at-a-time sort takes them)
    "no headers, keys by offset": ([_msg(i % 3, 10 + i // 3) for i in range(9)], "offset", True, True),
    "no headers, no keys needed": ([_msg(1, 5), _msg(1, 6, value=None), _msg(0, 2)], None, False, True),
    "two topics, offsets out of order": ([confluent_kafka.Message(topic=t, partition=0, offset=o, value=b"v",
                                                                  timestamp=(1, o)) for t, o in
                                          (("t", 4), ("t", 3), ("u", 9), ("t", 7))], "offset", True, True),
    "one header": ([_msg(0, 1), _msg(0, 2, headers=[("a", b"1")])], "offset", True, False),
    "no keys under exactly-once": ([_msg(0, 1)], None, True, False),
    "keys from a field": ([_msg(0, 1, value=b'{"id": 1}')], "json:id", True, False),
    "an oversize value": ([_msg(0, 1), _msg(0, 2, value=b"x" * 11)], "offset", True, False),
    "a value split so that the next completes it": ([_msg(0, 1, value=b"\xc3"), _msg(0, 2, value=b"\xa9")],
                                                     "offset", True, False),
}


@pytest.mark.parametrize("name", HEADERLESS)
def test_the_list_at_a_time_sort_makes_what_the_record_at_a_time_sort_makes(name):
    from kdg.flow.source import sort_each, sort_headerless
    from kdg.flow.transform import generic_rows

    msgs, id_from, exactly, taken = HEADERLESS[name]
    req = ConsumeRequest(["t", "u"], "g", "exactly-once" if exactly else "at-least-once", Connection("b", "d"),
                         max_bytes=10, id_from=id_from)
    keys = Keys(req, req.router())
    fast = sort_headerless(list(msgs), keys, req, must_have_key=exactly)
    assert (fast is not None) == taken
    if fast is None:
        return
    slow = sort_each(list(msgs), keys, req, must_have_key=exactly)
    # its keys are made as offset keys, and a topic's share of them still says so (the claims trust it)
    assert type(fast.records.ids) is OffsetKeys and type(fast.records.take([(1, 2)]).ids) is OffsetKeys
    # what reads the columns as they are (before anything makes the pairs) reads what the pairs hold
    assert fast.records.columnar and fast.topic_partitions() == slow.topic_partitions()
    assert generic_rows(fast.records).columns == generic_rows(slow.records).columns
    assert (fast.records[0], fast.records[-1]) == (slow.records[0], slow.records[-1]) and fast.records.columnar
    assert [(r, k) for r, k in fast.records] == [(r, k) for r, k in slow.records] and not slow.dead
    assert (fast.first_offsets, fast.next_offsets, fast.first_timestamps) == \
        (slow.first_offsets, slow.next_offsets, slow.first_timestamps)


OFFSET_BATCHES = {  # name: (topic, partition, offset) of each record, its key made as its offset key
    "two partitions interleaved, with a gap": [("t", p, o) for o in (*range(5), *range(9, 12)) for p in (0, 1)],
    "two topics, one partition": [("t", 0, 3), ("u", 0, 3), ("t", 0, 4), ("u", 0, 4)],
    "an offset twice": [("t", 0, 1), ("t", 0, 2), ("t", 0, 2)],
    "an offset going back": [("t", 0, 5), ("t", 0, 6), ("t", 1, 0), ("t", 0, 3)],
}


@pytest.mark.parametrize("name", OFFSET_BATCHES)
def test_offset_keys_made_by_a_sort_are_claimed_as_the_keys_read_one_by_one_are(name):
    """Claims.split takes a batch of OffsetKeys (the keys a sort made as offset keys) as runs without reading
    them: the runs, and whether the batch can be claimed by COPY at all, are those of the same keys read."""
    from kdg.records import offset_key
    from kdg.store.claims import Claims
    from kdg.store.windows import Window, keys_ms

    coordinates = OFFSET_BATCHES[name]
    topics, partitions, offsets = (list(c) for c in zip(*coordinates))
    window = Window(relation="kdg_dedup_1", sink_table="public.t", retention_ms=None, retention_from=None,
                    width_ms=86_400_000, horizon_ms=None)
    found = []
    for keys in (list(map(offset_key, topics, partitions, offsets)), OffsetKeys(map(offset_key, topics, partitions,
                                                                                      offsets))):
        claims = Claims(window, 1, keys_ms(keys), timeless=list(keys))
        found.append((claims.split((keys, topics, partitions, offsets)), claims.runs, claims.singles))
    assert found[0] == found[1]
    assert found[1][0] == (name not in ("an offset twice", "an offset going back"))

"""A batch read column by column (kdg.mapping.batch_read) gives the rows a record-by-record read gives.

Each case is read both ways: by the row maker as it runs, and by the same row maker with its batch reader
taken away. The clean batches must have been read a batch at a time (else the comparison proves nothing);
the others must fall back, and then the record-by-record read says what is wrong, dead letters and all.
"""

import base64
import json

import pytest

from kdg.mapping import RowMaker, build_mapping
from kdg.records import Record, RecordColumns

COLUMNS = ["id bigint = json:id", "name text = json:name", "amount numeric = json:amount", "doc jsonb = json:doc",
           "paid boolean = json:paid", "at timestamptz = json:at", "again bigint = json:id", "off bigint = offset",
           "k text = key"]
WRAPPED = [c.replace("json:", "json:/payload/") for c in COLUMNS[:7]] + COLUMNS[7:] + [
    "day date = json:/payload/day", "price numeric(10,2) = json:/payload/price"]
SCHEMA = {"type": "struct", "optional": False, "fields": [
    {"type": "int64", "field": "id"}, {"type": "string", "optional": True, "field": "name"},
    {"type": "double", "optional": True, "field": "amount"}, {"type": "string", "optional": True, "field": "doc"},
    {"type": "boolean", "optional": True, "field": "paid"},
    {"type": "int64", "optional": True, "name": "org.apache.kafka.connect.data.Timestamp", "field": "at"},
    {"type": "int32", "optional": True, "name": "org.apache.kafka.connect.data.Date", "field": "day"},
    {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
     "parameters": {"scale": "2"}, "field": "price"}]}


def _plain(i: int) -> dict:
    return {"id": i, "name": ["ann", "Zoë", "b\"q", ""][i % 4], "amount": [1.10, 1e5, 7, -0.0][i % 4],
            "doc": [{"a": [1, 2.50]}, None, "s", 3][i % 4], "paid": i % 3 == 0, "at": 1732800000000 + i * 7,
            "extra": {"skipped": [1, {"x": "y"}]}} if i % 5 else {"id": i}


def _wrapped(i: int, schema=SCHEMA) -> dict:
    payload = {k: v for k, v in _plain(i).items() if k != "extra" and k != "doc"}
    payload.update(doc=json.dumps(_plain(i).get("doc")), day=19_000 + i,
                   price=base64.b64encode((i * 1001).to_bytes(4, "big", signed=True)).decode())
    return {"schema": schema, "payload": payload}


def _records(docs, raw=()):
    values = [json.dumps(d, separators=(",", ":")).encode() for d in docs] + list(raw)
    return [(Record(v, f"k{i}".encode(), [], i % 3, "orders", 100 + i, 1732350000000), f"id-{i}")
            for i, v in enumerate(values)]


def _columns(records) -> RecordColumns:
    """Headerless ``records`` as the list-at-a-time sort holds them."""
    return RecordColumns(*map(list, zip(*[(r.value, r.key, r.partition, r.topic, r.offset, r.timestamp, k)
                                          for r, k in records])))


def _both(columns, records):
    """(rows, dead) of the row maker as it runs, of it read record by record, and whether it read a batch."""
    fast = RowMaker(build_mapping(columns=columns, table="t"))
    slow = RowMaker(build_mapping(columns=columns, table="t"))
    slow._batch = None
    took = fast._batch is not None and fast._batch.rows(records) is not None
    rows, dead = fast.rows(records)
    rows_slow, dead_slow = slow.rows(records)
    shown = [(r.offset, reason) for r, reason, _ in dead]
    assert (rows, shown) == (rows_slow, [(r.offset, reason) for r, reason, _ in dead_slow])
    if all(not rec.headers and rec.row is None for rec, _ in records):  # what a headerless poll's sort makes
        staged = fast.staged(_columns(records))
        assert (list(staged), [(r.offset, reason) for r, reason, _ in staged.dead]) == (rows, shown)
        if not dead:
            assert staged.claims() == slow.staged(records).claims()
    return rows, shown, took


def test_plain_and_wrapped_batches_are_read_a_batch_at_a_time_into_the_same_rows():
    written = b'{"id": 99, "amount": 1E5, "doc": {"n": [1.50, 2e-3]}, "at": "2024-02-29T10:00:00Z"}'
    rows, dead, took = _both(COLUMNS, _records([_plain(i) for i in range(40)], [written]))
    assert took and not dead and len(rows) == 41
    assert rows[1][6:] == ("1", "Zoë", "100000.0", None, "false", "1732800000007", "1", "101", "k1")
    assert rows[2][8:10] == ("7", '"s"') and rows[5][6:9] == ("5", None, None)  # a jsonb string quoted; missing
    assert rows[40][8:12] == ("1E5", '{"n":[1.50,2e-3]}', None, "2024-02-29T10:00:00Z")  # numbers as written
    rows, dead, took = _both(WRAPPED, _records([_wrapped(i) for i in range(40)]))
    assert took and not dead
    assert rows[1][6:] == ("1", "Zoë", "100000.0", '"null"', "false", "2024-11-28 13:20:00.007+00", "1", "101", "k1",
                           "2022-01-09", "10.01")
    # every timestamp present: the column's texts made at once, before 1970, on the second, and in seconds not met
    stamps = [-1, -1000, -1001, 0, 999, 1000, 1732800000000, 1732800000999, 253402300799999] + [
        1900000000000 + i * 1_234_567 for i in range(31)]
    docs = [_wrapped(i) for i in range(40)]
    for doc, at in zip(docs, stamps):
        doc["payload"]["at"] = at
    rows, dead, took = _both(WRAPPED, _records(docs))
    assert took and not dead
    assert [r[11] for r in rows[:3]] == ["1969-12-31 23:59:59.999+00", "1969-12-31 23:59:59+00",
                                         "1969-12-31 23:59:58.999+00"]
    assert rows[8][11] == "9999-12-31 23:59:59.999+00"


def test_a_column_of_fractional_numbers_is_their_text_as_written():
    """A column whose every value is a number with a fraction or exponent (or null), a batch at a time, is each
    number's text as the record was written, as the record by record read gives it."""
    amounts = [b"1.50", b"2e-3", b"-0.0", b"null", b"1E+400", b"0.1000000000000000055511151231257827"]
    raw = [b'{"id": %d, "amount": %s, "note": %s}' % (i, a, b'{"x": [%s, 7]}' % a if i % 2 else b'"n"')
           for i, a in enumerate(amounts * 5)]
    rows, dead, took = _both(["id bigint = json:id", "amount numeric = json:amount", "note text = json:note"],
                             _records([], raw))
    assert took and not dead
    assert [r[7] for r in rows[:6]] == ["1.50", "2e-3", "-0.0", None, "1E+400", "0.1000000000000000055511151231257827"]
    assert [r[8] for r in rows[:4]] == ["n", '{"x":[2e-3,7]}', "n", '{"x":[null,7]}']  # an object's numbers too
    # and a column without a null (the common one: the C path)
    rows, dead, took = _both(["id bigint = json:id", "amount double precision = json:amount"],
                             _records([{"id": i, "amount": 1.5 + i} for i in range(3)], [b'{"id":3,"amount":2.50}']))
    assert took and not dead and [r[7] for r in rows] == ["1.5", "2.5", "3.5", "2.50"]


@pytest.mark.parametrize("case, raw", [
    ("not JSON", [b"{oops"]),
    ("not an object", [b"[1, 2]"]),
    ("a lone surrogate", [b'{"id": 9, "name": "\\ud800"}']),
    ("a NUL", [b'{"id": 9, "name": "a\\u0000b"}']),
    ("a tombstone", [None]),
    ("a wrapped value among plain ones", [json.dumps(_wrapped(9)).encode()]),
])
def test_a_batch_it_cannot_read_whole_is_read_record_by_record(case, raw):
    rows, dead, took = _both(COLUMNS, _records([_plain(i) for i in range(6)], raw))
    assert not took, case
    assert len(rows) + len(dead) == 7 or (case == "a tombstone" and len(rows) == 7)


def test_two_schemas_in_a_batch_or_a_bad_timestamp_fall_back_with_the_reason():
    other = {**SCHEMA, "name": "v2"}
    rows, dead, took = _both(WRAPPED, _records([_wrapped(i) for i in range(4)] + [_wrapped(5, other)]))
    assert not took and len(rows) == 5 and not dead
    # a schema of the same length (a logical type's name changed: the value is the plain number), and an envelope
    # left open: each is read with its own schema, or dead-lettered, not cut out as its neighbours' payload
    same_length = json.loads(json.dumps(SCHEMA).replace("data.Timestamp", "data.Timestamx"))
    values = [json.dumps(_wrapped(i), separators=(",", ":")).encode() for i in range(4)]
    for odd in (json.dumps(_wrapped(5, same_length), separators=(",", ":")).encode(), values[1][:-1] + b"]"):
        rows, dead, took = _both(WRAPPED, _records([], values + [odd]))
        assert not took and len(rows) + len(dead) == 5
    assert rows and dead and "at" not in dead[0][1]
    bad = _wrapped(6)
    bad["payload"]["at"] = "yesterday"
    rows, dead, took = _both(WRAPPED, _records([_wrapped(i) for i in range(4)] + [bad]))
    assert not took and len(rows) == 4 and dead[0][0] == 104 and "at" in dead[0][1]


def test_the_field_watch_sees_a_batch_read_at_once():
    maker = RowMaker(build_mapping(columns=["id bigint = json:id", "who text = json:customerid"], table="t"),
                     watch=True)
    records = _records([{"id": i, "customerId": "c"} for i in range(100)])
    assert maker._batch.rows(records) is not None  # (the batch is read at once)
    rows, dead = maker.rows(records)
    assert len(rows) == 100 and not dead
    assert [(n.kind, n.field) for n in maker.watch.news()] == [("absent", "customerid"), ("unmapped", "customerId")]


def test_the_field_watch_reads_every_64th_row_of_columns_once_each_mapped_field_is_seen():
    """Once every mapped field has been seen, the watch reads rows 0, 64, 128, …: a field only row 128 has is said
    unmapped, one only row 100 has is not. The records stay columns: no pair is made for the rows between."""
    maker = RowMaker(build_mapping(columns=["id bigint = json:id"], table="t"), watch=True)
    records = _columns(_records([{"id": i, **({"extra": 1} if i == 128 else {}), **({"late": 1} if i == 100 else {})}
                                 for i in range(200)]))
    rows, dead = maker.rows(records)
    assert len(rows) == 200 and not dead and records.columnar
    assert [(n.kind, n.field) for n in maker.watch.news()] == [("unmapped", "extra")]


def test_the_field_watch_reads_a_wrapped_value_s_fields_in_its_payload():
    maker = RowMaker(build_mapping(columns=["id bigint = json:/payload/id", "who text = json:/payload/customerid"],
                                   table="t"), watch=True)
    schema = {"type": "struct", "fields": [{"type": "int64", "field": "id"}, {"type": "string", "field": "customerId"}]}
    rows, dead = maker.rows(_records([{"schema": schema, "payload": {"id": i, "customerId": "c"}} for i in range(9)]))
    assert len(rows) == 9 and not dead
    assert [(n.kind, n.field) for n in maker.watch.news()] == [("absent", "customerid"), ("unmapped", "customerId")]


CDC = ["id bigint = json:id", "name text = json:name", "at timestamptz = json:at", "price numeric(10,2) = json:price",
       "lsn bigint = source:lsn", "db text = source:db", "off bigint = offset"]
_ROW = {"type": "struct", "optional": True, "fields": [
    {"type": "int64", "field": "id"}, {"type": "string", "optional": True, "field": "name"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "field": "at"},
    {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
     "parameters": {"scale": "2"}, "field": "price"}]}
EVENT = {"type": "struct", "fields": [{**_ROW, "field": "before"}, {**_ROW, "field": "after"},
                                      {"type": "struct", "field": "source", "fields": [
                                          {"type": "int64", "field": "lsn"}, {"type": "string", "field": "db"}]},
                                      {"type": "string", "field": "op"}, {"type": "int64", "field": "ts_ms"}]}


def _event(i: int, op: str = "u", wrapped: bool = True, **row) -> dict:
    after = {"id": i, "name": f"n{i}", "at": 1732800000000000 + i, "price": base64.b64encode(
        (i * 7).to_bytes(3, "big", signed=True)).decode(), **row}
    event = {"before": {"id": i} if op != "c" else None, "after": after if op != "d" else None,
             "source": {"lsn": 1000 + i, "db": "shop", "ts_ms": 5}, "op": op, "ts_ms": 7}
    return {"schema": EVENT, "payload": event} if wrapped else event


def _both_cdc(records, columns=CDC):
    fast = RowMaker(build_mapping(columns=columns, table="t", envelope="debezium", key=("id",)), truncates=True)
    slow = RowMaker(build_mapping(columns=columns, table="t", envelope="debezium", key=("id",)), truncates=True)
    slow._batch = None
    took = fast._batch is not None and fast._batch.rows(records) is not None
    made = [fast.staged(records), slow.staged(records)]
    shown = [((list(staged), [(r.offset, why) for r, why, _ in staged.dead]), staged.keeps, staged.skipped)
             for staged in made]
    assert shown[0] == shown[1]
    return shown[0][0][0], took


def test_debezium_change_events_are_read_a_batch_at_a_time_into_the_same_rows():
    rows, took = _both_cdc(_records([_event(i, op) for i, op in enumerate("crruuc")]))
    assert took and len(rows) == 6
    assert rows[2][6:] == ("2", "n2", "2024-11-28 13:20:00.000002+00", "0.14", "1002", "shop", "102")
    rows, took = _both_cdc(_records([_event(i, wrapped=False) for i in range(5)]))  # schemas.enable=false
    assert took and rows[1][6:9] == ("1", "n1", "1732800000000001")


@pytest.mark.parametrize("case, event", [
    ("a delete", _event(9, "d")),
    ("a truncate", {"schema": EVENT, "payload": {"op": "t", "source": {"lsn": 1, "db": "shop"}}}),
    ("a heartbeat", {"ts_ms": 5}),
    ("a placeholder", _event(9, name="__debezium_unavailable_value")),
    ("no after", {"schema": EVENT, "payload": {"op": "u", "after": None, "source": {"lsn": 1, "db": "shop"}}}),
    ("not a change event", {"schema": EVENT, "payload": {"op": "x", "after": {"id": 9}}}),
])
def test_a_batch_with_anything_but_creates_updates_and_reads_is_read_record_by_record(case, event):
    rows, took = _both_cdc(_records([_event(i) for i in range(4)] + [event]))
    assert not took, case

"""How a record's values reach a typed sink's columns: bytes as bytes, dates as written, numbers as written, and a
value too deeply nested to read dead-lettered instead of stopping the consumer.

The rest of the typed sink is tests/test_typed_sink.py, whose helpers these tests share; the pure-Python half of
the mapping is tests/test_mapping.py.
"""

import base64
import json
import uuid
from datetime import date, datetime, timezone
from decimal import Decimal

from conftest import as_json
from test_typed_sink import consume, dead_letters, produce

from kdg.store.pg import Store

KEY = bytes.fromhex("019fff41")  # not UTF-8: as text, 9f and ff would each become U+FFFD
HEADER = bytes.fromhex("ff00fe")


def record(key: bytes | str, value: str, headers: dict[str, bytes] | None = None) -> str:
    """A `kdg produce --format json` envelope; bytes as base64, as kdg writes those that are not UTF-8."""
    env = {"value": value, "headers": [{"name": n, "value": base64.b64encode(v).decode(), "b64": True}
                                       for n, v in (headers or {}).items()]}
    if isinstance(key, bytes):
        env.update(key=base64.b64encode(key).decode(), key_b64=True)
    else:
        env["key"] = key
    return json.dumps(env)


def test_values_land_as_written_and_a_value_nested_too_deeply_is_dead_lettered(kdg, conn, topic, group, tmp_path):
    """One run over one table: a binary key and header into bytea keep their bytes (into text, the key is UTF-8
    text as before); a JSON string of 8 digits into date and timestamptz is Postgres's to read (2024-02-29),
    other digits (a number, or a string) still epoch milliseconds, and a date Postgres cannot read is refused
    with its reason;
    numbers reach text, json, numeric and money as written (0.0000001, 1e5, 100E-2: no 1E-7 that money
    refuses); a value nested deeper than Python's JSON decoder goes is a bad-JSON dead letter, and the rest of
    its batch is written."""
    table, replayed = (f"public.values_{uuid.uuid4().hex[:8]}" for _ in range(2))
    with Store(conn.pg_dsn) as store:
        for name in (table, replayed):
            store.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, kb bytea, hb bytea, kt text, d date, "
                          "ts timestamptz, nt text, nn numeric, nm money, js json)")
    nested = '{"id": 4, "x": ' + "[" * 5000 + "]" * 5000 + "}"
    produce(kdg, topic, tmp_path, [
        record(KEY, '{"id": 1, "d": "20240229", "ts": "20240229", "n": 0.0000001, "js": {"a": 1e5, "b": 100E-2}}',
               {"h": HEADER}),
        record("2", '{"id": 2, "d": 1732350000000, "ts": 1732350000000, "n": 1e5}'),
        record("3", '{"id": 3, "n": 100E-2}'),
        record("4", nested),
        record("5", '{"id": 5, "d": "20241399"}'),
        record("6", '{"id": 6, "d": "1732350000000", "ts": "1732350000000"}'),  # a string of epoch ms: as before
    ])
    columns = ["id = json:id", "kb = key", "hb = header:h", "kt = key", "d = json:d", "ts = json:ts",
               "nt = json:n", "nn = json:n", "nm = json:n", "js = json:js"]
    flags = [arg for c in columns for arg in ("--column", c)]
    report = consume(kdg, topic, group, "exactly-once", "--table", table, *flags)
    assert (report["consumed"], report["processed"], report["dead_lettered"]) == (6, 4, 2), report

    with Store(conn.pg_dsn) as store:
        found = {r["id"]: dict(r) for r in store.fetch(
            f"SELECT id, kb, hb, kt, d, ts, nt, nn, nm::numeric AS nm, js::text AS js FROM {table}")}
    assert sorted(found) == [1, 2, 3, 6]
    assert (found[6]["d"], found[6]["ts"]) == (date(2024, 11, 23), datetime(2024, 11, 23, 8, 20, tzinfo=timezone.utc))
    one, two, three = found[1], found[2], found[3]
    assert (one["kb"], one["hb"], one["kt"]) == (KEY, HEADER, KEY.decode("utf-8", "replace"))
    assert (one["d"], one["ts"]) == (date(2024, 2, 29), datetime(2024, 2, 29, tzinfo=timezone.utc))
    assert (two["d"], two["ts"]) == (date(2024, 11, 23), datetime(2024, 11, 23, 8, 20, tzinfo=timezone.utc))
    assert [(r["nt"], r["nn"], r["nm"]) for r in (one, two, three)] == [
        ("0.0000001", Decimal("0.0000001"), Decimal("0.00")), ("1e5", Decimal("100000"), Decimal("100000.00")),
        ("100E-2", Decimal("1.00"), Decimal("1.00"))]
    assert one["js"] == '{"a":1e5,"b":100E-2}'

    letters = {d["key"]: d["headers"] for d in dead_letters(kdg, topic)}
    assert sorted(letters) == ["4", "5"], letters
    assert letters["4"]["kdg-dlq-reason"].startswith("bad JSON: nested too deeply to read"), letters["4"]
    assert letters["5"]["kdg-sqlstate"] == "22008", letters["5"]  # month 13: refused, never taken as 1970
    assert "20241399" in letters["5"]["kdg-sql-message"], letters["5"]

    # spark-replay maps each record with the same code, from what Spark hands its executors: the same rows
    spark = as_json(kdg("spark-replay", topic, "-g", "exactly-once", "--table", replayed, *flags, "--json"))
    assert (spark["rows_read"], spark["rows_written"], spark["dead_lettered"]) == (6, 4, 2), spark
    with Store(conn.pg_dsn) as store:
        both = [[tuple(r) for r in store.fetch(f"SELECT id, kb, hb, kt, d, ts, nt, nn, nm::numeric, js::text "
                                               f"FROM {name} ORDER BY id")] for name in (table, replayed)]
    assert both[0] == both[1], both

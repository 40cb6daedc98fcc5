"""The Debezium-shaped change stream of tests/cdc_source.py: exact offline, and as today's kdg reads it.

The generator is checked against itself first (the final state read back from the events' JSON is the
source's own, Decimals encode as Java's BigInteger does), then against `kdg consume` twice: each of the three
topics into its table by a mapping file, one process per topic; and all three in one `--pipeline` of one
route. Every table equals the final state.
"""

import json
import uuid
from collections import Counter
from datetime import datetime
from decimal import Decimal

import pytest
from cdc_source import (TABLES, UNAVAILABLE, _simulate, decode_decimal, decode_micro_timestamp, encode_decimal,
                        encode_micro_timestamp, final_state, generate, mapping_toml, produce, topic_of)
from conftest import as_json

from kdg.mapping.spec import load_file
from kdg.store.pg import Store


def test_the_final_state_read_from_the_events_is_the_sources_own():
    """Decoding every event's JSON through its schema, applying r/c/u as upserts and d as deletes, gives
    the rows the simulated source holds: values (Decimal, datetime, NULL) and deletes round-trip."""
    events, truth = _simulate(seed=7, per_table=1000, server="shop")
    assert final_state(events) == truth
    assert events == generate(7) and generate(8, per_table=50) != generate(7, per_table=50)  # seeded
    counts = Counter(table for table, _, _ in events)
    assert set(counts) == set(TABLES) and all(1000 <= n <= 1001 for n in counts.values()), counts
    ops = Counter(json.loads(v)["payload"]["op"] if v else "tombstone" for _, _, v in events)
    assert ops["r"] == 900 and min(ops["c"], ops["u"], ops["d"]) > 50 and ops["tombstone"] == ops["d"], ops


def test_each_event_is_shaped_as_debeziums_json_converter_writes_it():
    """Keys and values in Connect's wrapper; a delete has after null and is followed by its key's tombstone;
    each key's LSNs grow; the source block names the table; types carry Debezium's logical names."""
    events = generate(3, per_table=200)
    last_lsn: dict[tuple, int] = {}
    for n, (table, key, value) in enumerate(events):
        k = json.loads(key)
        assert k["schema"]["fields"] == [{"type": "int64", "optional": False, "field": "id"}]
        if value is None:
            assert events[n - 1][1] == key and json.loads(events[n - 1][2])["payload"]["op"] == "d"
            continue
        doc = json.loads(value)
        payload = doc["payload"]
        assert payload["source"]["table"] == table and payload["source"]["schema"] == "public"
        assert (payload["before"] is None) == (payload["op"] in ("r", "c"))
        assert (payload["after"] is None) == (payload["op"] == "d")
        assert payload["source"]["lsn"] > last_lsn.get((table, k["payload"]["id"]), 0)
        last_lsn[(table, k["payload"]["id"])] = payload["source"]["lsn"]
        after = {f["field"]: f for f in doc["schema"]["fields"][1]["fields"]}
        assert [f["field"] for f in doc["schema"]["fields"][:3]] == ["before", "after", "source"]
        assert set(after) == {c.name for c in TABLES[table]}
    first_order = json.loads(next(v for t, _, v in events if t == "orders"))
    orders = {f["field"]: f for f in first_order["schema"]["fields"][1]["fields"]}
    assert orders["total"]["name"] == "org.apache.kafka.connect.data.Decimal"
    assert orders["total"]["parameters"] == {"scale": "2", "connect.decimal.precision": "12"}
    assert (orders["placed_at"]["type"], orders["placed_at"]["name"]) == ("int64", "io.debezium.time.MicroTimestamp")


def test_truncates_placeholders_and_a_new_column_are_sent_as_debezium_sends_them_and_read_back_exactly():
    """With every option: order_lines is truncated once (op t, no key, no rows); customers' unchanged TOASTed bio
    and avatar come as the placeholder (the bytes column: its base64), never in a create; loyalty_tier is in the
    schema from halfway on. The final state read back from the events is still the source's own."""
    events, truth = _simulate(seed=5, per_table=1000, server="shop", toast=True, truncate=True, loyalty_tier=True)
    finals = final_state(events)
    for table, rows in truth.items():
        assert finals[table] == {i: {**dict.fromkeys(finals[table][i]), **row} for i, row in rows.items()}, table
    truncates = [(t, k, json.loads(v)["payload"]) for t, k, v in events if v and b'"op":"t"' in v]
    assert [(t, k, p["before"], p["after"]) for t, k, p in truncates] == [("order_lines", None, None, None)]
    placeholders = Counter()
    tiered = False
    for table, _, value in events:
        if table != "customers" or value is None:
            continue
        payload = json.loads(value)["payload"]
        after = payload["after"] or {}
        placeholders.update(f for f, v in after.items() if v in (UNAVAILABLE, "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="))
        assert payload["op"] == "u" or UNAVAILABLE not in value.decode()
        fields = [f["field"] for f in json.loads(value)["schema"]["fields"][1]["fields"]]
        assert tiered <= ("loyalty_tier" in fields)  # once there, it stays
        tiered = "loyalty_tier" in fields
    assert tiered and placeholders["bio"] > 50 and placeholders["avatar"] > 50, placeholders
    plain = generate(5, per_table=300)  # none of it unless asked
    assert all(k is not None for _, k, _ in plain) and not any(v and UNAVAILABLE.encode() in v for _, _, v in plain)


@pytest.mark.parametrize(("value", "scale", "sent"), [
    (Decimal("0.00"), 2, "AA=="), (Decimal("1.27"), 2, "fw=="), (Decimal("1.28"), 2, "AIA="),  # 128: a sign byte
    (Decimal("-1.28"), 2, "gA=="), (Decimal("-1.29"), 2, "/38="), (Decimal("8.23"), 2, "Azc="),
    (Decimal("-0.55"), 2, "yQ=="), (Decimal("99999999.99"), 2, "AlQL4/8="),
])
def test_a_decimal_is_encoded_exactly_as_javas_big_integer(value, scale, sent):
    """The unscaled value's minimal two's complement, as Java's BigInteger.toByteArray (0x80 alone is -128,
    +128 needs 0x0080, -0.55 is 0xc9 alone)."""
    assert encode_decimal(value, scale) == sent
    assert decode_decimal(sent, scale) == value


def test_a_decimal_with_more_places_than_its_scale_is_refused_and_a_timestamp_keeps_its_microseconds():
    with pytest.raises(ValueError):
        encode_decimal(Decimal("1.005"), 2)
    for when in (datetime(2025, 10, 15, 18, 6, 55, 254_053), datetime(1969, 12, 31, 23, 59, 59, 999_999)):
        assert decode_micro_timestamp(encode_micro_timestamp(when)) == when
    assert encode_micro_timestamp(datetime(2025, 10, 15, 18, 6, 55, 254_053)) == 1_760_551_615_254_053


def test_each_mapping_file_is_one_kdg_reads(tmp_path):
    for table in TABLES:
        path = tmp_path / f"{table}.toml"
        path.write_text(mapping_toml(table, f"app.{table}"))
        spec = load_file(path)
        assert (spec["table"], spec["envelope"], spec["key"]) == (f"app.{table}", "debezium", ("id",))
        assert [c.name for c in spec["columns"]] == [c.name for c in TABLES[table]]


def test_todays_kdg_consume_replicates_each_topic_into_its_table(kdg_spawn, conn, group, tmp_path):
    """Three topics, three `kdg consume TOPIC --mapping FILE` under exactly-once, one process each (the way
    kdg ran before a pipeline could take them all): each table equals the source's final state."""
    prefix = f"cdc{uuid.uuid4().hex[:6]}"
    events = generate(seed=11)
    sent = produce(conn.bootstrap_servers, prefix, events)
    runs = {}
    for table in TABLES:
        mapping = tmp_path / f"{table}.toml"
        mapping.write_text(mapping_toml(table, f"{prefix}_{table}"))
        runs[table] = kdg_spawn("consume", topic_of(prefix, table), "-G", group, "--mapping", mapping,
                                "-g", "exactly-once", "-e", "-o", "beginning", "--id-from", "offset", "--json")
    try:
        reports = {}
        for table, run in runs.items():
            out, err = run.communicate(timeout=180)
            assert run.returncode == 0, err
            reports[table] = as_json(type("P", (), {"stdout": out}))
    finally:
        for run in runs.values():
            run.kill()
    expected = final_state(events)
    with Store(conn.pg_dsn) as store:
        for table, report in reports.items():
            assert (report["consumed"], report["dead_lettered"]) == (sent[topic_of(prefix, table)], 0), report
            rows = {r["id"]: dict(r) for r in store.fetch(f'SELECT * FROM "{prefix}_{table}"')}
            assert rows == expected[table], table

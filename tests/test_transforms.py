"""The user's logic in `kdg consume`: per-record transforms, a fan-out into two tables, errors as dead letters."""

import json
import os
import signal
import uuid
from decimal import Decimal

from conftest import as_json, audited

from kdg.store.pg import Store

HERE = os.path.dirname(__file__)
ORDERS = [{"id": i, "test": i % 9 == 0, "items": [{"sku": f"s{j}", "qty": j + 1, "price": "2.35"}
                                                  for j in range(i % 3 + 1)]} for i in range(400)]
PIPELINE = """[[route]]
name = "shop"
topics = ["{topic}"]

[[route.into]]
table = "{prefix}_orders"
transform = "shop_logic:orders"
mode = "upsert"
key = ["id"]
create_table = true
[route.into.columns]
id = {{ type = "bigint", from = "json:id" }}
total = {{ type = "numeric(12,2)", from = "json:total" }}

[[route.into]]
table = "{prefix}_order_lines"
transform = "shop_logic:lines"
mode = "upsert"
key = ["order_id", "n"]
create_table = true
[route.into.columns]
order_id = {{ type = "bigint", from = "json:order_id" }}
n = {{ type = "integer", from = "json:n" }}
sku = {{ type = "text", from = "json:sku" }}
qty = {{ type = "integer", from = "json:qty" }}
"""


def _produce(kdg, topic, tmp_path, values) -> None:
    src = tmp_path / "orders.txt"
    src.write_text("".join(json.dumps(v) + "\n" for v in values))
    kdg("produce", topic, "-g", "exactly-once", "--file", src)


def test_orders_fan_out_into_two_tables_exactly_once_through_a_kill(kdg, conn, topic, group, tmp_path):
    """Test orders dropped, totals computed, items exploded into order_lines: one transaction writes both tables,
    and a kill inside it leaves both exact after the restart; the filtered orders are counted, never lost: the
    audit of each table counts them filtered (claimed so in the batch's transaction) and each exploded order
    once."""
    _produce(kdg, topic, tmp_path, ORDERS)
    prefix = f"tx{uuid.uuid4().hex[:8]}"
    pipeline = tmp_path / "shop.toml"
    pipeline.write_text(PIPELINE.format(topic=topic, prefix=prefix))
    run = ("consume", "--pipeline", pipeline, "-G", group, "-g", "exactly-once", "-e", "--batch-size", 50, "--json")
    env = {"PYTHONPATH": HERE}
    crashed = kdg(*run, env={**env, "KDG_FAULT": "inside-pg-transaction@3"}, check=False)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    report = as_json(kdg(*run, env=env))
    kept = [o for o in ORDERS if not o["test"]]
    with Store(conn.pg_dsn) as store:
        orders = {r["id"]: r["total"] for r in store.fetch(f"SELECT * FROM {prefix}_orders")}
        lines = {(r["order_id"], r["n"]): (r["sku"], r["qty"]) for r in store.fetch(f"SELECT * FROM {prefix}_order_lines")}
    assert orders == {o["id"]: sum(Decimal("2.35") * i["qty"] for i in o["items"]) for o in kept}
    assert lines == {(o["id"], n): (i["sku"], i["qty"]) for o in kept for n, i in enumerate(o["items"])}
    # the restart read on from the committed batches: its counts add up with the transform's explode
    assert report["consumed"] + report["exploded"] == sum(report[k] for k in (
        "written", "superseded", "deleted", "filtered", "duplicates_suppressed", "dead_lettered", "probes_skipped"))
    assert report["filtered"] > 0 and report["dead_lettered"] == 0, report
    audit = audited(kdg, "--pipeline", pipeline, "-G", group)
    tests = len(ORDERS) - len(kept)
    assert audit["balanced"] and len(audit["routes"]) == 2, audit  # a route per table
    assert [(r["filtered"], r["lost"], r["duplicates"], r["unexpected"], r["audits"][0]["processed_unique"])
            for r in audit["routes"]] == [(tests, 0, 0, 0, len(kept))] * 2, audit


def test_a_transform_that_raises_dead_letters_its_record_and_the_rest_are_written(kdg, topic, group, tmp_path):
    """… and the audit counts those dead letters by error type, and (at-least-once too) the records the transform
    filtered out as filtered, not lost: their marks commit with the batch's rows."""
    _produce(kdg, topic, tmp_path, ORDERS)
    table = f"tx{uuid.uuid4().hex[:8]}"
    report = as_json(kdg("consume", topic, "-G", group, "--table", table, "-e", "--json",
                         "--transform", "shop_logic:choosy", env={"PYTHONPATH": HERE}))
    tests = sum(o["test"] for o in ORDERS) - 1  # (order 342 raises first)
    assert (report["written"], report["dead_lettered"], report["filtered"]) == (396 - tests, 4, tests), report
    assert report["dead_letter_reasons"] == {"transform raised ValueError": 4}
    audit = audited(kdg, topic, "--table", table, "-G", group)
    assert audit["dead_letter_reasons"] == {"transform raised ValueError": 4}, audit
    assert (audit["dead_lettered"], audit["filtered"], audit["lost"], audit["duplicates"]) == (4, tests, 0, 0), audit
    out = kdg("consume", f"{topic}.dlq", "-G", f"dlq-{group}", "--sink", "stdout", "--format", "json",
              "-o", "beginning", "-e").stdout.splitlines()
    headers = [{h["name"]: h["value"] for h in json.loads(line)["headers"]} for line in out]
    assert sorted(h["kdg-error-message"] for h in headers) == sorted(f"order {i} has no customer" for i in (42, 142, 242, 342))
    assert {h["kdg-error-type"] for h in headers} == {"ValueError"}

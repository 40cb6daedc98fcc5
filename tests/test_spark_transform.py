"""Your logic on Spark: the same transforms (a fan-out among them) give the same tables, counts and audit in `kdg
consume`, `kdg spark-replay` and `kdg spark-stream`, and a ``--handler`` runs in each Spark task's transaction
with only the rows it writes."""

import json
import os
import uuid
import zipfile
from decimal import Decimal

from conftest import audited
from test_examples import copied, kdg_in, run
from test_transforms import ORDERS, PIPELINE as FAN_OUT

from kdg.kafka.admin import ensure_topic
from kdg.store.pg import Store

HERE = os.path.dirname(__file__)
# test_transforms' fan-out (one topic into two tables, each with its transform), and a route whose transform raises
# on some orders
PIPELINE = FAN_OUT.replace("{topic}", "{orders}") + """
[[route]]
name = "fragile"
topics = ["{fragile}"]
table = "{prefix}_fragile"
transform = "shop_logic:fragile"
"""


def _tables(conn, prefix: str) -> tuple:
    with Store(conn.pg_dsn) as store:
        return ({r["id"]: r["total"] for r in store.fetch(f"SELECT id, total FROM {prefix}_orders")},
                {(r["order_id"], r["n"]): (r["sku"], r["qty"]) for r in store.fetch(f"SELECT * FROM {prefix}_order_lines")},
                {r["idempotency_key"]: json.loads(r["value"]) for r in store.fetch(
                    f"SELECT idempotency_key, value FROM {prefix}_fragile")})


# how each engine runs the pipeline: consume to the end; spark-replay with its first task killed once a chunk
# committed (both tables of the fan-out in one transaction); spark-stream until the data there is written
ENGINES = {"consume": (("-e",), {}),
           "spark-replay": (("--chunk-rows", 50), {"KDG_FAULT": "spark-task-mid-write"}),
           "spark-stream": (("--trigger", "available-now"), {})}


def test_the_same_transforms_give_the_same_tables_in_every_engine(kdg, conn, topic, group, tmp_path):
    topics = {"orders": topic, "fragile": f"t-{uuid.uuid4().hex[:10]}"}
    ensure_topic(conn.bootstrap_servers, topics["fragile"], partitions=3)
    src = tmp_path / "orders.txt"
    src.write_text("".join(json.dumps(o) + "\n" for o in ORDERS))
    for name, at in topics.items():
        kdg("produce", at, "-g", "exactly-once", "--file", src, "--id", f"{name}-{{seq}}")
    env = {"PYTHONPATH": HERE}
    # a transform that cannot be imported: refused before anything is read (no Spark started)
    missing = kdg("spark-replay", topic, "--transform", "shop_logic:nowhere", "--table", "never_made", env=env,
                  check=False)
    assert missing.returncode == 2 and "shop_logic:nowhere" in missing.stderr, missing.stderr

    reports, tables, audits, prefixes = {}, {}, {}, {}
    for engine, (args, fault) in ENGINES.items():
        prefix = prefixes[engine] = f"tx{uuid.uuid4().hex[:8]}"
        pipeline = tmp_path / f"{engine}.toml"
        pipeline.write_text(PIPELINE.format(prefix=prefix, **topics))
        mine = f"{engine}-{group}"
        proc = kdg(engine, "--pipeline", pipeline, "-G", mine, "-g", "exactly-once", *args, "--json",
                   env={**env, **fault}, timeout=600)
        reports[engine] = json.loads(proc.stdout.splitlines()[-1] if engine == "spark-stream" else proc.stdout)
        tables[engine] = _tables(conn, prefix)
        audit = audited(kdg, "--pipeline", pipeline, "-G", mine)
        audits[engine] = [(r["filtered"], r["lost"], r["duplicates"], r["unexpected"]) for r in audit["routes"]]

    kept = [o for o in ORDERS if not o["test"]]
    orders, lines, fragile = tables["consume"]
    assert orders == {o["id"]: sum(Decimal("2.35") * i["qty"] for i in o["items"]) for o in kept}
    assert lines == {(o["id"], n): (i["sku"], i["qty"]) for o in kept for n, i in enumerate(o["items"])}
    assert len(fragile) == len(ORDERS) - 4
    # every table, row for row (the generic one: each key's transformed value), and the same counts
    assert tables["spark-replay"] == tables["spark-stream"] == tables["consume"]
    for name in ("filtered", "dead_lettered", "exploded"):
        assert {e: r[name] for e, r in reports.items()} == dict.fromkeys(ENGINES, {
            "filtered": len(ORDERS) - len(kept), "dead_lettered": 4,
            "exploded": sum(len(o["items"]) for o in kept)}[name]), reports  # (a fan-out: the lines beyond the order)
    assert reports["spark-replay"]["duplicates_dropped"] > 0, reports  # the retry re-claimed the dead attempt's
    p = prefixes["spark-replay"]  # a fan-out's tables share one entry of the report
    assert set(reports["spark-replay"]["tables"]) == {f"public.{p}_orders+public.{p}_order_lines", f"public.{p}_fragile"}
    # the audit of each engine's tables: the filtered orders claimed as such (in the write's transaction)
    assert audits["spark-replay"] == audits["spark-stream"] == audits["consume"], audits
    assert [f for f, *_ in audits["consume"]] == [len(ORDERS) - len(kept)] * 2 + [0], audits
    # Spark's dead letters are consume's: the transform's error in kdg-error-type and kdg-error-message
    out = kdg("consume", f"{topics['fragile']}.dlq", "-G", f"dlq-{group}", "--sink", "stdout", "--format", "json",
              "-o", "beginning", "-e").stdout.splitlines()
    headers = [{h["name"]: h["value"] for h in json.loads(line)["headers"]} for line in out]
    # each engine's at least once: a dead letter is durable before its chunk commits, so a killed task's retry
    # may send it again
    messages = [h["kdg-error-message"] for h in headers]
    assert sorted(set(messages)) == sorted(f"order {i} has no customer" for i in (42, 142, 242, 342))
    assert all(messages.count(m) >= len(ENGINES) for m in messages), messages
    assert {h["kdg-error-type"] for h in headers} == {"ValueError"}


def test_the_handler_runs_in_each_spark_task_transaction_with_the_rows_it_writes(stack, conn, topic, tmp_path):
    """examples/balances' handler on Spark, imported from the current directory as `python -m` finds modules: every
    payment sent twice, each moves its balance once (the handler never sees a duplicate the claims suppressed); at
    least once, each twice. A handler that never awaits its calls commits nothing."""
    accounts, payments = f"acc_{uuid.uuid4().hex[:8]}", f"pay_{uuid.uuid4().hex[:8]}"
    here = copied("balances", tmp_path, {"accounts": accounts})
    with Store(conn.pg_dsn) as store:
        store.execute((here / "setup.sql").read_text())
    made = run(stack, here, "make_payments.py", 300).stdout
    for _ in range(2):
        kdg_in(stack, here, "produce", topic, "-g", "exactly-once", "--id", "pay-{seq}", stdin=made)
    expected: dict = {}
    for p in map(json.loads, made.splitlines()):
        expected[p["account"]] = expected.get(p["account"], 0) + p["amount"]
    for guarantee, times in (("exactly-once", 1), ("at-least-once", 2)):
        with Store(conn.pg_dsn) as store:
            store.execute(f"UPDATE {accounts} SET balance = 0")
        report = json.loads(kdg_in(stack, here, "spark-replay", topic, "-g", guarantee, "--table", f"{payments}_{times}",
                                   "--handler", "balances:apply", "--json").stdout)
        with Store(conn.pg_dsn) as store:
            balances = {r["id"]: r["balance"] for r in store.fetch(f"SELECT id, balance FROM {accounts}")}
        # at-least-once keeps no claims: the handler is given every payment sent, each duplicate moving it again
        assert (report["rows_written"], report["duplicates_dropped"]) == (300 * times, 600 - 300 * times), report
        assert balances == {a: n * times for a, n in expected.items()}, guarantee
    # a sync handler whose asyncpg calls never ran: each task's transaction rolled back, one error line, exit 2
    (here / "lazy.py").write_text("def apply(rows, conn):\n    for row in rows:\n"
                                  f"        conn.execute('UPDATE {accounts} SET balance = balance + 1')\n")
    lazy = kdg_in(stack, here, "spark-replay", topic, "-g", "exactly-once", "--table", f"{payments}_lazy", "--handler",
                  "lazy:apply", code=2)
    assert "without awaiting it" in lazy.stderr.splitlines()[-1], lazy.stderr
    with Store(conn.pg_dsn) as store:
        assert store.fetchval(f"SELECT count(*) FROM {payments}_lazy") == 0
        assert {r["id"]: r["balance"] for r in store.fetch(f"SELECT id, balance FROM {accounts}")} == balances


def test_a_cluster_gets_the_transforms_module_with_kdg(tmp_path, monkeypatch):
    """Off the local master the driver ships each named module (a package whole) in kdg's zip: the one an
    executor there imports the transform and the handler from. (Pure Python: no Spark started.)"""
    from kdg.flow.routes import Route, Router
    from kdg.spark.logic import module_roots
    from kdg.spark.session import _package_zip

    package = tmp_path / "src" / "shop"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "logic.py").write_text("def orders(record):\n    return record.value\n")
    (tmp_path / "src" / "pay.py").write_text("def apply(rows, conn):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    router = Router([Route("r", ("orders",), transform="shop.logic:orders")])
    shipped = _package_zip(tmp_path, module_roots(router, "pay:apply"))
    with zipfile.ZipFile(shipped) as zf:
        names = set(zf.namelist())
    assert {"shop/__init__.py", "shop/logic.py", "pay.py", "kdg/spark/logic.py"} <= names

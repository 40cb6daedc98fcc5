"""kdg as a library: the issue's example as written, a stop token, errors raised (never SystemExit)."""

import signal
import threading
import time
import uuid
from decimal import Decimal

import pytest

import kdg
from kdg import StopToken, consume
from kdg.errors import UsageError
from kdg.store.pg import Store

LOGIC = '''from decimal import Decimal


def orders(record):
    order = record.value
    if order.get("test"):
        return None
    return {"id": order["id"], "total": sum(Decimal(i["price"]) * i["qty"] for i in order["items"])}
'''
ORDERS = [{"id": i, "test": i % 10 == 0, "items": [{"sku": "a", "qty": i % 3 + 1, "price": "1.25"}]}
          for i in range(100)]


@pytest.fixture
def on_stack(stack, monkeypatch):
    """The environment a user's program would have: where Kafka and Postgres are."""
    for name, value in (("KDG_BOOTSTRAP_SERVERS", stack.bootstrap_servers), ("KDG_PG_DSN", stack.pg_dsn),
                        ("KDG_STATE_DIR", str(stack.state_dir))):
        monkeypatch.setenv(name, value)
    with Store(stack.pg_dsn) as store:
        store.execute("CREATE SCHEMA IF NOT EXISTS app")


def test_the_issue_example_works_as_written(on_stack, conn, topic, group, tmp_path, monkeypatch):
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "logic.py").write_text(LOGIC)
    monkeypatch.syspath_prepend(str(tmp_path))
    kdg.produce(topic, ORDERS, guarantee="exactly-once")
    table = f"app.orders_{uuid.uuid4().hex[:8]}"
    report = kdg.consume(topic, group=group, guarantee="exactly-once", table=table,
                         columns=["id bigint = json:id", "total numeric = json:total"], create_table=True,
                         transform="shop.logic:orders", until_end=True)
    assert (report.processed, report.filtered, report.written) == (100, 10, 90)
    with Store(conn.pg_dsn) as store:
        rows = {r["id"]: r["total"] for r in store.fetch(f"SELECT id, total FROM {table}")}
    assert rows == {o["id"]: Decimal("1.25") * (o["id"] % 3 + 1) for o in ORDERS if not o["test"]}


def test_a_stop_token_ends_a_consume_with_its_report_and_no_signal_handler(on_stack, topic, group):
    kdg.produce(topic, [{"id": i} for i in range(50)], guarantee="exactly-once")
    seen: list = []

    async def count(rows, conn):  # a function object, not a module:function name
        seen.extend(rows)

    before = signal.getsignal(signal.SIGTERM)
    token = StopToken()
    out: dict = {}
    table = f"app.ev_{uuid.uuid4().hex[:8]}"
    run = threading.Thread(target=lambda: out.update(report=consume(
        topic, group=group, guarantee="exactly-once", table=table, handler=count, offset="beginning", stop=token)))
    run.start()
    deadline = time.monotonic() + 60
    while len(seen) < 50 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert signal.getsignal(signal.SIGTERM) is before  # the library installed nothing
    token.stop()
    run.join(60)
    assert not run.is_alive()
    report = out["report"]
    assert (report.stopped_by, report.processed, report.written) == ("stop requested", 50, 50), report
    audits = kdg.audit(topic, group=group, table=table)
    assert audits.balanced and audits.reports[0].lost == 0, audits


def test_bad_input_raises_the_error_family_not_system_exit():
    with pytest.raises(UsageError, match="--group must not be empty"):
        kdg.consume("t", group=" ")
    with pytest.raises(UsageError, match="--batch-size 0: must be at least 1"):
        kdg.consume("t", group="g", batch_size=0)
    with pytest.raises(UsageError, match="use module:function"):
        kdg.consume("t", group="g", handler="no_colon")
    assert all(getattr(kdg, name) is not None for name in kdg.__all__)

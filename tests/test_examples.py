"""The examples run as their READMEs say, against the session stack (so none can rot).

Each example is copied to a fresh directory with its names (topic, schema, tables) made unique for the test,
then run from there, as a user would from the example's own directory.
"""

import json
import shutil
import signal
import subprocess
import sys
import time
import uuid
from decimal import Decimal
from pathlib import Path

import pytest
from conftest import _kdg_env

from kdg.store.pg import Store

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def copied(name: str, tmp_path: Path, renames: dict) -> Path:
    """The example directory copied, each of ``renames`` replaced in its text files."""
    dest = shutil.copytree(EXAMPLES / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    for path in dest.rglob("*"):
        if path.suffix in (".py", ".toml", ".sql"):
            text = path.read_text()
            for old, new in renames.items():
                text = text.replace(old, new)
            path.write_text(text)
    return dest


def run(stack, cwd: Path, *args, env: dict | None = None, stdin: str | None = None):
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True, text=True, input=stdin,
                          env=_kdg_env(stack, env), timeout=300)


def kdg_in(stack, cwd: Path, *args, env: dict | None = None, stdin: str | None = None, code: int = 0):
    proc = run(stack, cwd, "-m", "kdg", *args, env=env, stdin=stdin)
    assert proc.returncode == code, f"kdg {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr}"
    return proc


def test_orders_filter_compute_and_explode(stack, conn, topic, group, tmp_path):
    schema = f"shop_{uuid.uuid4().hex[:8]}"
    here = copied("orders", tmp_path, {'topics = ["orders"]': f'topics = ["{topic}"]', "shop.orders": f"{schema}.orders",
                                       "shop.order_lines": f"{schema}.order_lines"})
    with Store(conn.pg_dsn) as store:
        store.execute(f"CREATE SCHEMA {schema}")
    orders = [json.loads(line) for line in run(stack, here, "make_orders.py", 300).stdout.splitlines()]
    kdg_in(stack, here, "produce", topic, "-g", "exactly-once", stdin="".join(json.dumps(o) + "\n" for o in orders))
    # a kill inside the fan-out's transaction is tests/test_transforms.py's: the example runs as its README says
    report = json.loads(kdg_in(stack, here, "consume", "--pipeline", "pipeline.toml", "-G", group, "-g",
                               "exactly-once", "-e", "--json").stdout)
    kept = [o for o in orders if not o["test"]]
    assert (report["consumed"], report["filtered"]) == (300, 300 - len(kept)), report
    with Store(conn.pg_dsn) as store:
        totals = {r["id"]: r["total"] for r in store.fetch(f"SELECT id, total FROM {schema}.orders")}
        lines = store.fetchval(f"SELECT count(*) FROM {schema}.order_lines")
    assert totals == {o["id"]: sum(Decimal(i["price"]) * i["qty"] for i in o["items"]) for o in kept}
    assert lines == sum(len(o["items"]) for o in kept)


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_balances_after_a_kill_exactly_once_right_at_least_once_off_by_the_batch_again(stack, conn, topic, group,
                                                                                        tmp_path, guarantee):
    accounts, payments = f"acc_{uuid.uuid4().hex[:8]}", f"pay_{uuid.uuid4().hex[:8]}"
    here = copied("balances", tmp_path, {"accounts": accounts})
    with Store(conn.pg_dsn) as store:
        store.execute((here / "setup.sql").read_text())  # psql -f setup.sql
    made = run(stack, here, "make_payments.py", 300).stdout
    kdg_in(stack, here, "produce", topic, "-g", "exactly-once", stdin=made)
    job = ("consume", topic, "-G", group, "-g", guarantee, "-e", "--table", payments, "--handler", "balances:apply",
           "--batch-size", 50)
    kdg_in(stack, here, *job, env={"KDG_FAULT": "after-process-before-commit@3"}, code=-signal.SIGKILL)
    kdg_in(stack, here, *job)
    expected: dict = {}
    for p in map(json.loads, made.splitlines()):
        expected[p["account"]] = expected.get(p["account"], 0) + p["amount"]
    with Store(conn.pg_dsn) as store:
        balances = {r["id"]: r["balance"] for r in store.fetch(f"SELECT id, balance FROM {accounts}")}
        again = [json.loads(r["value"]) for r in store.fetch(
            f"SELECT (array_agg(value))[1] AS value FROM {payments} GROUP BY idempotency_key HAVING count(*) > 1")]
    if guarantee == "exactly-once":
        assert balances == expected and again == []
        return
    assert 0 < len(again) <= 50  # the batch the kill caught after Postgres committed it, before Kafka did
    off = {a: balances[a] - expected[a] for a in expected}
    assert off == {a: sum(p["amount"] for p in again if p["account"] == a) for a in expected}
    assert any(off.values())


def test_service_stops_on_its_own_sigterm_with_its_report(stack, conn, topic, group, tmp_path):
    here = copied("service", tmp_path, {})
    table = f"app.svc_{uuid.uuid4().hex[:8]}"
    with Store(conn.pg_dsn) as store:
        store.execute("CREATE SCHEMA IF NOT EXISTS app")
    kdg_in(stack, here, "produce", topic, "-g", "exactly-once", stdin="".join(f'{{"n": {i}}}\n' for i in range(200)))
    service = subprocess.Popen([sys.executable, "service.py", topic, group, table], cwd=here, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_kdg_env(stack, None))
    try:
        deadline, written = time.monotonic() + 60, 0
        while written < 200 and time.monotonic() < deadline and service.poll() is None:
            time.sleep(0.2)
            with Store(conn.pg_dsn) as store:
                written = store.fetchval(f"SELECT count(*) FROM pg_class WHERE oid = to_regclass('{table}')") and \
                    store.fetchval(f"SELECT count(*) FROM {table}")
        service.send_signal(signal.SIGTERM)
        out, err = service.communicate(timeout=60)
    finally:
        service.kill()
    assert service.returncode == 0, err
    report = json.loads(out)
    assert (report["stopped_by"], report["written"]) == ("SIGTERM", 200), report

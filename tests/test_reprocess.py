"""``--reprocess``: after a table gains a column, records read before are applied again to fill it (issue 47).

Under exactly-once a record read again is suppressed (its key's claim belongs to the table, whichever group
reads it), so a new column stays NULL for every row written before it: the failure the issue found. With
``--reprocess`` an upsert route applies them again, each only over a row that came from the same partition at
no later an offset, so an older version never rolls a row back.
"""

import json
import uuid
from pathlib import Path

import pytest
from conftest import as_json

from kdg.kafka.admin import ensure_topic
from kdg.store.pg import Store

BEFORE = ["order_id bigint = json:id", "amount numeric(12,2) = json:amount", "src_partition integer = partition",
          "src_offset bigint = offset"]
AFTER = BEFORE + ["tier text = json:tier"]


async def handled(rows, conn) -> None:
    """A ``--handler``: each row it is given, by topic and key (it must never be given a record twice)."""
    await conn.execute("CREATE TABLE IF NOT EXISTS reprocess_handled (topic text, idempotency_key text)")
    await conn.executemany("INSERT INTO reprocess_handled VALUES ($1, $2)", [(row[2], row[1]) for row in rows])


def flags(columns: list[str]) -> list[str]:
    return [arg for column in columns for arg in ("--column", column)]


def order(i: int, version: int) -> str:
    tier = "bronze" if version == 1 else "gold"
    return json.dumps({"key": str(i), "value": json.dumps({"id": i, "amount": f"{i}.{version:02d}", "tier": tier}),
                       "headers": []})


@pytest.fixture
def orders(kdg, conn, tmp_path) -> str:
    """One partition: v1 of orders 0-9 (offsets 0-9), then v2 of orders 0-4 (offsets 10-14)."""
    topic = f"reprocess-{uuid.uuid4().hex[:8]}"
    ensure_topic(conn.bootstrap_servers, topic, partitions=1)
    src = tmp_path / "orders.jsonl"
    src.write_text("\n".join([order(i, 1) for i in range(10)] + [order(i, 2) for i in range(5)]) + "\n")
    sent = as_json(kdg("produce", topic, "-g", "at-least-once", "--format", "json", "--file", src, "--json"))
    assert (sent["sent"], sent["failed"]) == (15, 0), sent
    return topic


def table_rows(conn, table: str) -> dict:
    with Store(conn.pg_dsn) as store:
        found = store.fetch(f"SELECT * FROM {table} ORDER BY order_id")
    return {r["order_id"]: (str(r["amount"]), r.get("tier"), r["src_offset"]) for r in found}


def test_reprocess_fills_a_new_column_that_a_plain_re_read_leaves_null_and_never_rolls_a_row_back(kdg, conn, orders):
    table = f"app.reprocess_{uuid.uuid4().hex[:8]}"
    with Store(conn.pg_dsn) as store:
        store.execute("CREATE SCHEMA IF NOT EXISTS app")
        store.execute(f"CREATE TABLE {table} (order_id bigint PRIMARY KEY, amount numeric(12,2), "
                      "src_partition integer, src_offset bigint)")

    def consume(group: str, columns: list[str], *args) -> dict:
        return as_json(kdg("consume", orders, "-G", group, "-g", "exactly-once", "--table", table, "--mode", "upsert",
                           *flags(columns), "--batch-size", 5, "--handler", "test_reprocess:handled", "--json", *args,
                           env={"PYTHONPATH": str(Path(__file__).parent)}))

    first = consume(f"g-{uuid.uuid4().hex[:8]}", BEFORE, "-e")
    assert (first["written"], first["superseded"], first["reprocessed"]) == (15, 0, 0), first
    latest = {i: (f"{i}.02" if i < 5 else f"{i}.01", None, 10 + i if i < 5 else i) for i in range(10)}
    assert table_rows(conn, table) == latest

    with Store(conn.pg_dsn) as store:  # the table gains a column; the mapping gains it too
        store.execute(f"ALTER TABLE {table} ADD COLUMN tier text")

    plain = consume(f"g-{uuid.uuid4().hex[:8]}", AFTER, "-e")  # a new group reads it all again: all suppressed
    assert (plain["duplicates_suppressed"], plain["written"]) == (15, 0), plain
    assert {i: row[1] for i, row in table_rows(conn, table).items()} == {i: None for i in range(10)}

    backfill = f"g-{uuid.uuid4().hex[:8]}"
    part = consume(backfill, AFTER, "--reprocess", "-c", 10)  # v1 only: older than the rows of orders 0-4
    assert part["consumed"] == 10 and part["duplicates_suppressed"] == 0, part
    assert (part["reprocessed"], part["written"], part["superseded"]) == (10, 5, 5), part
    assert table_rows(conn, table) == {i: (f"{i}.02", None, 10 + i) if i < 5 else (f"{i}.01", "bronze", i)
                                       for i in range(10)}, "a v1 record read again rolled its order back"

    rest = consume(backfill, AFTER, "--reprocess", "-e")  # the same group reads on: v2 of orders 0-4
    assert (rest["consumed"], rest["reprocessed"], rest["written"]) == (5, 5, 5), rest
    assert table_rows(conn, table) == {i: (amount, "gold" if i < 5 else "bronze", offset)
                                       for i, (amount, _, offset) in latest.items()}
    with Store(conn.pg_dsn) as store:
        assert store.fetchval(f"SELECT count(*) FROM {table}") == 10  # no row twice
        handed = store.fetch("SELECT idempotency_key, count(*) AS n FROM reprocess_handled WHERE topic = $1 "
                             "GROUP BY 1", orders)
    assert len(handed) == 15 and {r["n"] for r in handed} == {1}, "the handler was given a record twice"


@pytest.mark.parametrize("args, why", [
    (["--column", "id bigint = json:id", "--column", "p integer = partition", "--column", "o bigint = offset"],
     "insert mode, where each would be a second row"),
    (["--mode", "upsert", "--column", "id bigint = json:id"], "partition and offset are not mapped"),
    ([], "the generic table keeps each record as a row of its own"),
])
def test_reprocess_is_refused_where_it_would_duplicate_or_roll_back(kdg, topic, args, why):
    proc = kdg("consume", topic, "-G", f"g-{uuid.uuid4().hex[:8]}", "-g", "exactly-once", "--table",
               "app.never_written", *args, "--reprocess", "-e", check=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert why in errors[0] and "--reprocess" in errors[0], errors[0]


def test_reprocess_is_refused_under_at_least_once(kdg, topic):
    proc = kdg("consume", topic, "-G", f"g-{uuid.uuid4().hex[:8]}", "-g", "at-least-once", "--table",
               "app.never_written", "--mode", "upsert", *flags(BEFORE), "--reprocess", "-e", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "is written again already" in proc.stderr, proc.stderr

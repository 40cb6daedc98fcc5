"""Typed sinks on the real stack: JSON orders into the user's own table, typed, under each guarantee and mode.

Every table here is pre-created by the test (or by ``--create-table``) in schema ``app``, a fresh name
per test; its contents are read back with SQL, types included. The pure-Python half (grammar, types,
TOML, staged rows) is tests/test_mapping.py.
"""

import asyncio
import json
import os
import signal
import time
import uuid
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from conftest import as_json, audited, change_stream, finished, wait_stopped

from kdg.errors import UnknownTopic
from kdg.kafka.admin import ensure_topic, topic_partitions
from kdg.mapping import build_mapping
from kdg.store.pg import Store

GUARANTEES = ["at-most-once", "at-least-once", "exactly-once"]
# one column per interesting source and type; the same mapping drives --column and the TOML file
COLUMNS = [
    ("order_id", "bigint", "json:id"),
    ("customer", "text", "json:/customer/name"),
    ("tier", "text", "json:/customer/tier"),
    ("amount", "numeric(12,2)", "json:amount"),
    ("placed_at", "timestamptz", "json:placed_at"),
    ("placed_on", "date", "json:placed_at"),
    ("paid", "boolean", "json:paid"),
    ("note", "text", "json:note"),
    ("tags", "jsonb", "json:tags"),
    ("version", "integer", "json:version"),
    ("idempotency_key", "text", "idempotency_key"),
]
TABLE_COLUMNS = """customer text NOT NULL, tier text, amount numeric(12,2) CHECK (amount >= 0), placed_at timestamptz,
    placed_on date, paid boolean, note text, tags jsonb, version integer, idempotency_key text"""
# upsert: one row per order; insert: a log of versions (no unique order_id, so duplicates can show)
UPSERT_TABLE = f"CREATE TABLE {{t}} (order_id bigint PRIMARY KEY, {TABLE_COLUMNS})"
INSERT_TABLE = f"CREATE TABLE {{t}} (row_id bigserial PRIMARY KEY, order_id bigint NOT NULL, {TABLE_COLUMNS})"
BASE = datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)


# -- orders ----------------------------------------------------------------------------------------

def placed(i: int) -> datetime:
    return BASE + timedelta(hours=i % 7, seconds=i)


def order_json(i: int, version: int, amount: str | None = None) -> str:
    """An order as JSON text: nested customer, numbers and number-strings, timestamps as ISO (with an
    offset, or none: UTC) or epoch millis, a null note or none at all."""
    at = placed(i)
    stamp = [f'"{at.astimezone(timezone(timedelta(hours=2))).isoformat()}"',          # ISO, +02:00
             f'"{at.replace(tzinfo=None).isoformat()}"',                                # ISO, no offset: UTC
             str(int(at.timestamp() * 1000))][i % 3]                                    # epoch millis
    amount = amount or ([f"{i}.{version:02d}", f'"{i}.{version:02d}"'][i % 2])          # a number, or a string
    note = ['', ', "note": null', ', "note": "leave at door"'][i % 3]                     # missing / null / text
    return (f'{{"id": {i}, "version": {version}, "customer": {{"name": "c{i}", "tier": "{["gold", "silver"][i % 2]}"}},'
            f' "amount": {amount}, "placed_at": {stamp}, "paid": {"true" if i % 2 else "false"},'
            f' "tags": ["v{version}", {{"n": 1.50}}]{note}}}')


def expected_row(i: int, version: int) -> dict:
    return {"order_id": i, "customer": f"c{i}", "tier": ["gold", "silver"][i % 2],
            "amount": Decimal(f"{i}.{version:02d}"), "placed_at": placed(i), "placed_on": placed(i).date(),
            "paid": bool(i % 2), "note": [None, None, "leave at door"][i % 3],
            "tags": [f"v{version}", {"n": 1.50}], "version": version}


def envelope(key: str | None, value: str | None) -> str:
    return json.dumps({"key": key, "value": value, "headers": []})


def produce(kdg, topic, tmp_path, lines: list[str]) -> None:
    src = tmp_path / f"{uuid.uuid4().hex[:6]}.jsonl"
    src.write_text("\n".join(lines) + "\n")
    report = as_json(kdg("produce", topic, "-g", "at-least-once", "--format", "json", "--file", src, "--json"))
    assert (report["sent"], report["failed"]) == (len(lines), 0), report


def produce_orders(kdg, topic, tmp_path, orders: int, versions: int) -> None:
    """Every order's versions in turn (all v1, then all v2, …), keyed by order id: one partition per order."""
    produce(kdg, topic, tmp_path, [envelope(str(i), order_json(i, v)) for v in range(1, versions + 1)
                                   for i in range(orders)])


# -- tables, mappings, reading back ----------------------------------------------------------------

@pytest.fixture
def table(conn) -> str:
    name = f"app.orders_{uuid.uuid4().hex[:8]}"
    with Store(conn.pg_dsn) as store:
        store.execute("CREATE SCHEMA IF NOT EXISTS app")
    return name


def create(conn, ddl: str, table: str) -> None:
    with Store(conn.pg_dsn) as store:
        store.execute(ddl.format(t=table))


def column_flags(columns=COLUMNS) -> list[str]:
    return [arg for name, pg_type, source in columns for arg in ("--column", f"{name} {pg_type} = {source}")]


def mapping_file(tmp_path, table: str, *, mode: str = "insert", key=None, extra: str = "", columns=COLUMNS):
    lines = [f'table = "{table}"', f'mode = "{mode}"', extra]
    if key:
        lines.append(f"key = {json.dumps(key)}")
    lines.append("[columns]")
    lines += [f'{name} = {{ type = "{pg_type}", from = "{source}" }}' for name, pg_type, source in columns]
    path = tmp_path / f"orders-{uuid.uuid4().hex[:6]}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def rows(conn, table: str, where: str = "true") -> list[dict]:
    with Store(conn.pg_dsn) as store:
        found = store.fetch(f"SELECT * FROM {table} WHERE {where} ORDER BY order_id, version")
    return [{k: (json.loads(v) if k == "tags" else v) for k, v in dict(r).items() if k != "row_id"} for r in found]


def consume(kdg, topic, group, guarantee, *args, env=None, check=True):
    proc = kdg("consume", topic, "-G", group, "-g", guarantee, "-e", "--json", *args, env=env, check=check)
    return as_json(proc) if check else proc


def dead_letters(kdg, topic) -> list[dict]:
    """The DLQ topic's records as kdg envelopes, headers as a dict."""
    lines = kdg("consume", f"{topic}.dlq", "-G", f"dlq-{uuid.uuid4().hex[:6]}", "--sink", "stdout", "--format",
                "json", "-o", "beginning", "-e").stdout.splitlines()
    return [{**(env := json.loads(line)), "headers": {h["name"]: h["value"] for h in env["headers"]}} for line in lines]


# -- each guarantee × each mode --------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["insert", "upsert"])
@pytest.mark.parametrize("guarantee", GUARANTEES)
def test_json_orders_land_typed_in_a_precreated_table(kdg, conn, topic, group, table, tmp_path, guarantee, mode):
    create(conn, UPSERT_TABLE if mode == "upsert" else INSERT_TABLE, table)
    produce_orders(kdg, topic, tmp_path, orders=30, versions=2)
    # insert through --column flags, upsert through a mapping file: both forms, one mapping
    typed = (["--mapping", mapping_file(tmp_path, table, mode="upsert")] if mode == "upsert"
             else ["--table", table, *column_flags()])
    report = consume(kdg, topic, group, guarantee, *typed, "--batch-size", 25)
    assert (report["consumed"], report["processed"], report["dead_lettered"]) == (60, 60, 0), report

    found = rows(conn, table)
    versions = [2] if mode == "upsert" else [1, 2]
    assert [{k: v for k, v in r.items() if k != "idempotency_key"} for r in found] == [
        expected_row(i, v) for i in range(30) for v in versions]
    # the types are the table's: asyncpg hands back Decimal, aware datetime, date, bool
    sample = found[0]
    assert (type(sample["amount"]), type(sample["placed_at"]), type(sample["placed_on"]), type(sample["paid"])) == (
        Decimal, datetime, date, bool)
    with Store(conn.pg_dsn) as store:
        assert store.fetchval(f"SELECT count(*) FROM {table} WHERE note IS NULL") == len(versions) * 20  # null+missing
        assert store.fetchval(f"SELECT count(*) FROM {table} WHERE tags -> 1 ->> 'n' = '1.50'") == len(found)

    audit = audited(kdg, topic, "--table", table, "-G", group)
    if guarantee == "exactly-once":  # every record's key claimed, replaced versions included
        assert (audit["basis"], audit["processed_unique"], audit["lost"], audit["duplicates"]) == (
            "idempotency_key column and kdg_dedup claims", 60, 0, 0) and audit["balanced"], audit
    elif mode == "insert":  # the table keeps every version with its idempotency key
        assert (audit["basis"], audit["processed_unique"], audit["rows"]) == ("idempotency_key column", 60, 60)
        assert audit["balanced"], audit
    else:  # an upsert replaced each first version: the table cannot tell replaced from lost
        assert (audit["basis"], audit["lost"], audit["processed_unique"]) == ("idempotency_key column", 30, 30)
        assert "cannot be told apart" in audit["note"]


# -- rows Postgres refuses -----------------------------------------------------------------------

BAD = {13: "-1.00", 101: "-5.00", 377: "-0.01", 640: "-12.00",     # CHECK (amount >= 0): 23514
       58: '"twelve"', 499: '"1.2.3"', 998: '"€5"'}                 # a failed numeric cast: 22P02


def produce_thousand_with_seven_bad(kdg, topic, tmp_path) -> None:
    produce(kdg, topic, tmp_path, [envelope(str(i), order_json(i, 1, BAD.get(i))) for i in range(1000)])


def assert_seven_refused(kdg, conn, topic, table, group) -> None:
    with Store(conn.pg_dsn) as store:
        assert store.fetchval(f"SELECT count(*) FROM {table}") == 993
        assert store.fetchval(f"SELECT count(DISTINCT order_id) FROM {table}") == 993
        assert store.fetchval(f"SELECT count(*) FROM {table} WHERE order_id = ANY($1::bigint[])", list(BAD)) == 0
    letters = {int(json.loads(d["value"])["id"]): d["headers"] for d in dead_letters(kdg, topic)}
    assert sorted(letters) == sorted(BAD)
    states = {i: h["kdg-sqlstate"] for i, h in letters.items()}
    assert states == {i: "23514" if i in (13, 101, 377, 640) else "22P02" for i in BAD}, states
    assert all(h["kdg-dlq-reason"].startswith("postgres refused the row: ") for h in letters.values())
    assert 'check constraint' in letters[13]["kdg-sql-message"] and "numeric" in letters[58]["kdg-sql-message"]
    audit = audited(kdg, topic, "--table", table, "-G", group)
    assert (audit["acked"], audit["dead_lettered"], audit["lost"], audit["pending"], audit["duplicates"]) == (
        1000, 7, 0, 0, 0) and audit["balanced"], audit
    assert audit["dead_letter_reasons"] == {"postgres refused the row: 23514 check_violation": 4,
                                            "postgres refused the row: 22P02 invalid_text_representation": 3}
    text = kdg("audit", topic, "--table", table, "-G", group).stdout
    assert "dead-lettered        4  postgres refused the row: 23514 check_violation" in text, text


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_seven_bad_rows_in_a_thousand_are_dead_lettered_and_the_rest_written(kdg, conn, group, table, tmp_path,
                                                                             guarantee):
    topic = f"t-{uuid.uuid4().hex[:10]}"
    ensure_topic(conn.bootstrap_servers, topic, partitions=1)  # one partition: one batch of 1,000
    create(conn, INSERT_TABLE, table)
    produce_thousand_with_seven_bad(kdg, topic, tmp_path)
    report = consume(kdg, topic, group, guarantee, "--table", table, *column_flags(), "--batch-size", 1000)
    assert (report["consumed"], report["processed"], report["dead_lettered"]) == (1000, 993, 7), report
    if guarantee == "exactly-once":  # offsets moved with the batch, the refused rows' too
        with Store(conn.pg_dsn) as store:
            assert store.fetchval("SELECT next_offset FROM kdg_offsets WHERE consumer_group = $1 AND topic = $2",
                                  group, topic) == 1000
            assert store.fetchval("SELECT count(*) FROM kdg_dedup WHERE sink_table = $1", table) == 1000
    assert_seven_refused(kdg, conn, topic, table, group)  # audit pending 0: the group's position passed them all


def test_seven_bad_rows_survive_a_kill_inside_the_transaction_exactly_once(kdg, conn, group, table, tmp_path):
    """The DLQ send is durable before the commit and the kill comes after it: the restart refuses the same rows
    and sends them again (the audit counts keys: 7), and writes the 993 others once."""
    topic = f"t-{uuid.uuid4().hex[:10]}"
    ensure_topic(conn.bootstrap_servers, topic, partitions=1)
    create(conn, INSERT_TABLE, table)
    produce_thousand_with_seven_bad(kdg, topic, tmp_path)
    args = ("--table", table, *column_flags(), "--batch-size", 1000)
    crashed = consume(kdg, topic, group, "exactly-once", *args, env={"KDG_FAULT": "inside-pg-transaction"},
                      check=False)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    with Store(conn.pg_dsn) as store:
        assert store.fetchval(f"SELECT count(*) FROM {table}") == 0  # the transaction never committed
    sent = [int(json.loads(d["value"])["id"]) for d in dead_letters(kdg, topic)]
    assert sent and set(sent) <= set(BAD), sent  # ... but the killed batch's dead letters were already durable
    consume(kdg, topic, group, "exactly-once", *args)
    assert_seven_refused(kdg, conn, topic, table, group)


def test_refused_rows_are_found_on_postgres_15_too(kdg, conn, external_pg, group, tmp_path):
    """Bisecting under savepoints needs nothing newer than Postgres 15 (which has no pg_input_is_valid)."""
    from pg_server import fresh_database

    with fresh_database(external_pg, f"kdg_{uuid.uuid4().hex[:10]}") as dsn:
        env = {"KDG_PG_DSN": dsn}
        kdg("db", "migrate", env=env)
        with Store(dsn) as store:
            assert store.fetchval("SHOW server_version_num").startswith("15")
            store.execute(INSERT_TABLE.format(t="app.orders"))
        topic = f"t-{uuid.uuid4().hex[:10]}"
        ensure_topic(conn.bootstrap_servers, topic, partitions=1)
        src = tmp_path / "orders.jsonl"
        src.write_text("\n".join(envelope(str(i), order_json(i, 1, BAD.get(i))) for i in range(1000)) + "\n")
        kdg("produce", topic, "-g", "at-least-once", "--format", "json", "--file", src, env=env)
        report = as_json(kdg("consume", topic, "-G", group, "-g", "exactly-once", "-e", "--json", "--table",
                             "app.orders", *column_flags(), "--batch-size", 1000, env=env))
        assert (report["processed"], report["dead_lettered"]) == (993, 7), report
        with Store(dsn) as store:
            assert store.fetchval("SELECT count(*) FROM app.orders") == 993
        assert sorted(int(json.loads(d["value"])["id"]) for d in dead_letters(kdg, topic)) == sorted(BAD)


def test_a_deferred_foreign_key_refuses_its_rows_not_the_batch(kdg, conn, topic, group, table, tmp_path):
    """A DEFERRABLE INITIALLY DEFERRED foreign key is checked at COMMIT, where no row can be told apart: kdg
    checks constraints at each statement instead, so the two orders of unknown customers are dead-lettered
    (23503) and the other 48 written, in the batch's one transaction."""
    customers = f"{table}_customers"
    with Store(conn.pg_dsn) as store:
        store.execute(f"CREATE TABLE {customers} (name text PRIMARY KEY)")
        store.execute(f"INSERT INTO {customers} SELECT 'c' || i FROM generate_series(0, 49) i WHERE i NOT IN (7, 31)")
        store.execute(f"""CREATE TABLE {table} (order_id bigint PRIMARY KEY, customer text NOT NULL
                          REFERENCES {customers} DEFERRABLE INITIALLY DEFERRED, amount numeric(12,2))""")
    produce(kdg, topic, tmp_path, [envelope(str(i), order_json(i, 1)) for i in range(50)])
    report = consume(kdg, topic, group, "exactly-once", "--table", table, "--mode", "upsert",
                     "--column", "order_id bigint = json:id", "--column", "customer text = json:/customer/name",
                     "--column", "amount numeric(12,2) = json:amount")
    assert (report["processed"], report["dead_lettered"]) == (48, 2), report
    with Store(conn.pg_dsn) as store:
        assert store.fetchval(f"SELECT count(*) FROM {table}") == 48
    letters = {int(json.loads(d["value"])["id"]): d["headers"]["kdg-sqlstate"] for d in dead_letters(kdg, topic)}
    assert letters == {7: "23503", 31: "23503"}


# -- crashes: what each guarantee × mode leaves in the table --------------------------------------

CRASH_ORDERS, CRASH_VERSIONS, CRASH_BATCH = 1000, 3, 300


def crash_and_restart(kdg, conn, topic, group, table, tmp_path, guarantee, mode, point, nth=3):
    create(conn, UPSERT_TABLE if mode == "upsert" else INSERT_TABLE, table)
    produce_orders(kdg, topic, tmp_path, CRASH_ORDERS, CRASH_VERSIONS)
    args = ("--table", table, "--mode", mode, *column_flags(), "--batch-size", CRASH_BATCH)
    fault = point if point == "during-rebalance" else f"{point}@{nth}"
    crashed = consume(kdg, topic, group, guarantee, *args, env={"KDG_FAULT": fault}, check=False)
    assert crashed.returncode == -signal.SIGKILL, f"the fault did not fire: {crashed.stderr}"
    consume(kdg, topic, group, guarantee, *args)


def test_at_least_once_insert_killed_before_commit_shows_duplicate_rows(kdg, conn, topic, group, table, tmp_path):
    crash_and_restart(kdg, conn, topic, group, table, tmp_path, "at-least-once", "insert",
                      "after-process-before-commit")
    with Store(conn.pg_dsn) as store:
        total, distinct = store.fetch(f"SELECT count(*), count(DISTINCT idempotency_key) FROM {table}")[0]
    assert distinct == CRASH_ORDERS * CRASH_VERSIONS and total > distinct  # the re-read batch, written twice
    audit = audited(kdg, topic, "--table", table, "-G", group)
    assert audit["duplicates"] == total - distinct and audit["lost"] == 0


def test_at_least_once_upsert_killed_before_commit_shows_no_duplicates(kdg, conn, topic, group, table, tmp_path):
    """The same crash as above: the batch is written twice, but the second write of each order replaces the
    first (ON CONFLICT on its primary key), and the re-read continues in Kafka order, so each order ends at
    its last version. Idempotent writes: effectively once for this table."""
    crash_and_restart(kdg, conn, topic, group, table, tmp_path, "at-least-once", "upsert",
                      "after-process-before-commit")
    found = rows(conn, table)
    assert [(r["order_id"], r["version"]) for r in found] == [(i, CRASH_VERSIONS) for i in range(CRASH_ORDERS)]
    assert found == [dict(expected_row(i, CRASH_VERSIONS), idempotency_key=found[i]["idempotency_key"])
                     for i in range(CRASH_ORDERS)]


@pytest.mark.parametrize("point", [  # where the weaker guarantees break, and inside the typed write itself
    "after-process-before-commit", "after-commit-before-process", "inside-pg-transaction",
    "pipelined-commit",  # a batch committing while the next is staged and waits its turn on another connection
    pytest.param("after-poll-before-process", marks=pytest.mark.long), pytest.param("during-rebalance",
                                                                                     marks=pytest.mark.long)])
def test_exactly_once_upsert_killed_anywhere_gives_each_order_once_at_its_last_version(kdg, conn, topic, group,
                                                                                     table, tmp_path, point):
    crash_and_restart(kdg, conn, topic, group, table, tmp_path, "exactly-once", "upsert", point)
    found = rows(conn, table)
    assert [(r["order_id"], r["version"]) for r in found] == [(i, CRASH_VERSIONS) for i in range(CRASH_ORDERS)]
    audit = audited(kdg, topic, "--table", table, "-G", group)
    assert (audit["basis"], audit["processed_unique"], audit["lost"], audit["duplicates"]) == (
        "idempotency_key column and kdg_dedup claims", CRASH_ORDERS * CRASH_VERSIONS, 0, 0) and audit["balanced"], audit


@pytest.mark.parametrize("point", ["inside-pg-transaction", "after-commit-before-process"])
def test_keys_without_a_time_killed_anywhere_give_each_order_once_at_its_last_version(kdg, conn, topic, group,
                                                                                      table, tmp_path, point):
    """Records without kdg headers keyed by --id-from offset (as Kafka Connect writes them): keys without a
    time, claimed by COPY once none of a batch's was claimed before. A kill loses and repeats nothing, and the
    topic read again in another group is found claimed, record by record (at-least-once's anomaly for the same
    crash is the test above)."""
    from confluent_kafka import Producer

    create(conn, UPSERT_TABLE, table)
    producer = Producer({"bootstrap.servers": conn.bootstrap_servers})
    for v in range(1, CRASH_VERSIONS + 1):
        for i in range(CRASH_ORDERS):
            producer.produce(topic, order_json(i, v).encode(), str(i).encode())
    assert producer.flush(30) == 0
    args = ("--table", table, "--mode", "upsert", *column_flags(), "--batch-size", CRASH_BATCH, "--id-from", "offset")
    crashed = consume(kdg, topic, group, "exactly-once", *args, env={"KDG_FAULT": f"{point}@3"}, check=False)
    assert crashed.returncode == -signal.SIGKILL, f"the fault did not fire: {crashed.stderr}"
    consume(kdg, topic, group, "exactly-once", *args)
    found = rows(conn, table)
    assert [(r["order_id"], r["version"]) for r in found] == [(i, CRASH_VERSIONS) for i in range(CRASH_ORDERS)]
    audit = audited(kdg, topic, "--table", table, "-G", group, "--id-from", "offset")
    assert (audit["lost"], audit["duplicates"]) == (0, 0) and audit["balanced"], audit
    # the whole topic again, in another group: every record found claimed, nothing written
    again = consume(kdg, topic, f"{group}-again", "exactly-once", *args)
    assert (again["duplicates_suppressed"], again["written"]) == (CRASH_ORDERS * CRASH_VERSIONS, 0), again
    assert rows(conn, table) == found


def test_keys_without_a_time_go_in_by_copy_only_when_none_was_claimed_before(conn, table):
    """A batch of keys without a time is claimed by COPY (at one ``now``); a key of it claimed in an earlier
    transaction, or twice in the batch, sends the batch to the SQL claim, which claims only the new ones."""
    from kdg.store.claims import copy_all_claims, prepare_claims

    def attempt(store, keys: list[str]) -> tuple[bool, int]:
        async def go():
            async with store.conn.transaction():
                window = await store._claim_window(identity)
                claims = await prepare_claims(store.conn, window, keys)
                copied = await copy_all_claims(store.conn, [(claims, [(k, "tp", 0, i) for i, k in enumerate(keys)])])
                return copied, claims.now
        return store._run(go())

    with Store(conn.pg_dsn) as store:
        identity = store.ensure_sink_table(table)
        copied, now = attempt(store, ["t/0/1", "t/0/2", "order-3"])
        assert copied
        claimed = store.fetch("SELECT idempotency_key, key_ms FROM kdg_dedup WHERE sink_table = $1 ORDER BY 1",
                              identity.text)
        assert [(r["idempotency_key"], r["key_ms"]) for r in claimed] == [("order-3", now), ("t/0/1", now),
                                                                          ("t/0/2", now)]
        assert attempt(store, ["t/0/4", "t/0/2"])[0] is False  # t/0/2 was claimed before
        assert attempt(store, ["t/0/5", "t/0/5"])[0] is False  # twice in the batch
        # through the SQL claim, only what is new goes in
        assert store.write_claimed(table, "g", [(k, "tp", 0, i, None, b"v", "{}")
                                                for i, k in enumerate(["t/0/4", "t/0/2", "t/0/5", "t/0/5"])]) == 2


def test_claims_copied_before_the_lock_are_taken_back_when_another_transaction_claimed_a_key(conn, table):
    """A pipelined batch copies its claims in before it holds the lock for keys without a time, and looks them
    up once it does. Two transactions copy the same key; the first to hold the lock finds it new (the other's
    COPY is not committed) and commits; the second then finds it claimed, takes its COPY back and claims in
    SQL: one claim. Without that look-up both claims would stand (each transaction's COPY succeeded)."""
    import threading

    from kdg.store.claims import copy_all_claims, prepare_claims

    keys = ["t/0/1", "t/0/2"]
    keyed = [(k, "tp", 0, i) for i, k in enumerate(keys)]
    first_locked, results = threading.Event(), {}

    async def claim(store, name: str, then=None):
        async with store.conn.transaction():
            window = await store._claim_window(identity)
            claims = await prepare_claims(store.conn, window, keys, early=iter(keyed))
            mine = await store.conn.fetchval("SELECT count(*) FROM kdg_dedup WHERE sink_table = $1", identity.text)
            if then is not None:
                await then(store)
            results[name] = (claims.early, mine, await copy_all_claims(store.conn, [(claims, keyed)]))

    async def after_the_second_waits(store):
        first_locked.set()
        for _ in range(200):  # the second's COPY is in, and it waits for the lock this transaction holds
            if await store.conn.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                                         "AND pid = $1", second.conn.get_server_pid()):
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the second transaction never waited for the lock")

    with Store(conn.pg_dsn) as first, Store(conn.pg_dsn) as second:
        identity = first.ensure_sink_table(table)
        second.ensure_sink_table(table)

        def run_second():
            first_locked.wait(30)
            time.sleep(0.01)  # claimed at another millisecond than the first
            second._run(claim(second, "second"))

        thread = threading.Thread(target=run_second)
        thread.start()
        first._run(claim(first, "first", after_the_second_waits))
        thread.join(60)
        assert results["first"] == (True, 2, True), results  # its COPY in, found new: kept
        assert results["second"] == (True, 4, False), results  # its own and the first's (committed by then)
        claimed = first.fetch("SELECT idempotency_key, key_ms FROM kdg_dedup WHERE sink_table = $1", identity.text)
        assert sorted(r["idempotency_key"] for r in claimed) == keys and len({r["key_ms"] for r in claimed}) == 1


# -- Postgres going away mid-consume ---------------------------------------------------------------

@pytest.mark.disrupts_stack
@pytest.mark.parametrize("guarantee", ["exactly-once", "at-most-once"])
def test_postgres_killed_and_restarted_mid_consume_is_waited_for_not_dead_lettered(kdg, stack, conn, topic, group,
                                                                                table, tmp_path, guarantee):
    """The chaos ``postgres-restart`` fault on a typed table: the consumer stops itself with its 2nd batch
    polled, Postgres is SIGKILLed and restarted under it, and it goes on. The lost connection is not the
    records' fault: nothing is dead-lettered, the consumer reconnects and carries on from where the stored
    offsets say — exactly-once writes each order once. At-most-once had committed the batch's offsets before
    the write, so that batch is lost: its anomaly, counted in the report and by the audit."""
    import subprocess
    import sys

    from kdg.stack import postgres

    create(conn, INSERT_TABLE, table)
    produce_orders(kdg, topic, tmp_path, 300, 1)
    env = {**{k: v for k, v in os.environ.items() if k != "KDG_FAULT"}, "KDG_BOOTSTRAP_SERVERS":
           stack.bootstrap_servers, "KDG_PG_DSN": stack.pg_dsn, "KDG_STATE_DIR": str(stack.state_dir),
           "KDG_FAULT": "after-poll-before-process@2:stop"}
    proc = subprocess.Popen([sys.executable, "-m", "kdg", "consume", topic, "-G", group, "-g", guarantee, "-e",
                             "--json", "--table", table, *column_flags(), "--batch-size", "100"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_stopped(proc, "its 2nd batch")
        postgres.restart(stack, hard=True)  # SIGKILL, then start again
    finally:
        proc.send_signal(signal.SIGCONT)
    code, out, err = finished(proc)
    assert code == 0, err
    assert "reconnecting" in err and "Postgres is back" in err, err
    report = json.loads(out)
    assert report["pg_outages"] == 1 and report["dead_lettered"] == 0, report
    with pytest.raises(UnknownTopic):  # nothing was ever dead-lettered: the DLQ topic was never made
        topic_partitions(conn.bootstrap_servers, f"{topic}.dlq")
    audit = audited(kdg, topic, "--table", table, "-G", group)
    if guarantee == "exactly-once":
        assert [r["order_id"] for r in rows(conn, table)] == list(range(300))
        assert (audit["lost"], audit["duplicates"], report["lost_in_outages"]) == (0, 0, 0), audit
    else:
        assert report["lost_in_outages"] == 100 and audit["lost"] == 100 and audit["duplicates"] == 0, audit
        assert len(rows(conn, table)) == 200


# -- tombstones ------------------------------------------------------------------------------------

KEYED = [("order_id", "bigint", "key"), *COLUMNS[1:]]  # the order id from the record key: tombstones have one


@pytest.mark.parametrize("on_tombstone", ["delete", "ignore", "dead-letter"])
def test_tombstones_delete_ignore_or_dead_letter(kdg, conn, topic, group, table, tmp_path, on_tombstone):
    create(conn, UPSERT_TABLE, table)
    lines = [envelope(str(i), order_json(i, 1)) for i in range(10)]
    lines += [envelope(str(i), None) for i in (2, 5, 7)]            # delete 2, 5 and 7 ...
    lines += [envelope("7", order_json(7, 2))]                      # ... and 7 comes back, in the same batch
    produce(kdg, topic, tmp_path, lines)
    report = consume(kdg, topic, group, "exactly-once", "--table", table, "--mode", "upsert",
                     "--on-tombstone", on_tombstone, *column_flags(KEYED))
    found = {r["order_id"]: r["version"] for r in rows(conn, table)}
    if on_tombstone == "delete":
        assert found == {0: 1, 1: 1, 3: 1, 4: 1, 6: 1, 7: 2, 8: 1, 9: 1}
    else:
        assert found == {**{i: 1 for i in range(10)}, 7: 2}
    assert report["dead_lettered"] == (3 if on_tombstone == "dead-letter" else 0), report
    if on_tombstone == "dead-letter":
        assert {d["key"] for d in dead_letters(kdg, topic)} == {"2", "5", "7"}


# -- any type the table declares ---------------------------------------------------------------------

# column, DDL type, the type the mapping gives (None: read from the catalog), a good value, a bad value and
# the SQLSTATE Postgres refuses it with (json takes the field as JSON: no JSON value is a bad one)
WIDE = [
    ("f8", "double precision", "float8", 1.5, "x", "22P02"),
    ("f4", "real", None, 2.25, "y", "22P02"),
    ("i2", "smallint", None, 7, 70000, "22003"),
    ("vc", "varchar(5)", "varchar(5)", "abc", "toolong", "22001"),
    ("ch", "char(3)", None, "xy", "abcd", "22001"),
    ("ts", "timestamp", None, "2026-01-02 03:04:05", "nope", "22007"),
    ("tm", "time", "time", "12:00", "25:99", "22008"),
    ("iv", "interval", None, "1 day 2 hours", "soon", "22007"),
    ("js", "json", None, {"a": [1, "x"]}, None, None),
    ("ip", "inet", None, "10.0.0.1", "999.1.1.1", "22P02"),
    ("net", "cidr", None, "10.0.0.0/8", "10.0.0.1/8", "22P02"),
    ("mac", "macaddr", None, "08:00:2b:01:02:03", "zz", "22P02"),
    ("md", "{schema}.mood", "{schema}.mood", "ok", "angry", "22P02"),
    ("dm", "{schema}.positive", None, 3, -1, "23514"),
    ("rg", "int4range", "int4range", "[1,5)", "[5,1)", "22000"),
    ("arr", "text[]", "text[]", ["a", "b,c", None], "{unbalanced", "22P02"),
    ("iarr", "integer[]", None, [1, 2], ["a"], "22P02"),
]


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_a_wide_table_of_every_kind_of_type_takes_good_values_and_dead_letters_one_bad_per_type(
        kdg, conn, group, table, tmp_path, guarantee):
    """Types named in the mapping or read from the catalog; each bad value refused by Postgres with its own
    SQLSTATE (a varchar(5) too long 22001, never cut; an enum label 22P02) and dead-lettered, the rest written."""
    schema = f"wide_{uuid.uuid4().hex[:8]}"
    wide = [(c, ddl.format(schema=schema), given and given.format(schema=schema), good, bad, state)
            for c, ddl, given, good, bad, state in WIDE]
    with Store(conn.pg_dsn) as store:
        store.execute(f"CREATE SCHEMA {schema}; CREATE TYPE {schema}.mood AS ENUM ('ok', 'sad'); "
                      f"CREATE DOMAIN {schema}.positive AS integer CHECK (VALUE > 0)")
        store.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, "
                      + ", ".join(f"{c} {ddl}" for c, ddl, *_ in wide) + ")")
    good = {c: value for c, _, _, value, _, _ in wide}
    docs = [dict(good, id=i) for i in range(10)] + [
        dict(good, id=100 + n, **{c: bad}) for n, (c, _, _, _, bad, state) in enumerate(wide) if state]
    docs.append(dict(good, id=50, ts=1767323045123, arr="{x,y}"))  # epoch millis; Postgres's own array literal
    topic = f"t-{uuid.uuid4().hex[:10]}"
    # and one value that is not JSON: dead-lettered before any write, so exactly-once claims nothing for it
    produce(kdg, topic, tmp_path, [envelope(str(d["id"]), json.dumps(d)) for d in docs] + [envelope("999", "{oops")])
    columns = ["--column", "id = json:id"] + [a for c, _, given, *_ in wide
                                              for a in ("--column", f"{c} {given or ''} = json:{c}")]
    # one bad value per type: more dead letters than the default --max-dead-letters (10 %) lets a run go on with
    report = consume(kdg, topic, group, guarantee, "--table", table, *columns, "--max-dead-letters", "all")
    refused = {100 + n: (c, state) for n, (c, *_, state) in enumerate(wide) if state}
    assert (report["consumed"], report["processed"], report["dead_lettered"]) == (
        len(docs) + 1, len(docs) - len(refused), len(refused) + 1), report

    letters = {int(json.loads(d["value"])["id"]): d["headers"] for d in dead_letters(kdg, topic)
               if d["value"] != "{oops"}
    assert {i: h["kdg-sqlstate"] for i, h in letters.items()} == {i: state for i, (_, state) in refused.items()}
    assert "character varying(5)" in letters[103]["kdg-sql-message"], letters[103]
    with Store(conn.pg_dsn) as store:
        found = {r["id"]: dict(r) for r in store.fetch(f"SELECT * FROM {table}")}
    assert sorted(found) == [*range(10), 50]
    row = found[0]
    assert (row["f8"], row["f4"], row["i2"], row["vc"], row["ch"], row["md"], row["dm"]) == (
        1.5, 2.25, 7, "abc", "xy ", "ok", 3)
    assert (row["ts"], row["tm"], row["iv"]) == (datetime(2026, 1, 2, 3, 4, 5), datetime(2026, 1, 1, 12).time(),
                                                 timedelta(days=1, hours=2))
    assert (json.loads(row["js"]), str(row["ip"]), str(row["net"]), row["mac"]) == (
        {"a": [1, "x"]}, "10.0.0.1", "10.0.0.0/8", "08:00:2b:01:02:03")
    assert (row["rg"].lower, row["rg"].upper, row["arr"], row["iarr"]) == (1, 5, ["a", "b,c", None], [1, 2])
    assert (found[50]["ts"], found[50]["arr"]) == (datetime(2026, 1, 2, 3, 4, 5, 123000), ["x", "y"])
    audit = audited(kdg, topic, "--table", table, "-G", group) if guarantee == "exactly-once" else None
    if audit is not None:
        # the unclaimed one too: before the table's claims had a horizon, its audit failed (23502 on "outside")
        assert (audit["dead_lettered"], audit["lost"], audit["duplicates"]) == (len(refused) + 1, 0, 0), audit

    if guarantee == "exactly-once":  # --create-table learns the same types, each as the mapping gives it
        made = f"{table}_made"
        typed = [f"{c} {ddl} = json:{c}" for c, ddl, *_ in wide]
        with Store(conn.pg_dsn) as store:
            store.prepare_typed(build_mapping(table=made, columns=typed, create_table=True))
            types = {r["name"]: r["type"] for r in store.fetch(
                "SELECT attname AS name, format_type(atttypid, atttypmod) AS type FROM pg_attribute "
                "WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped", made)}
            store.execute(f"DROP TABLE {made}")
        assert types == {"f8": "double precision", "f4": "real", "i2": "smallint", "vc": "character varying(5)",
                         "ch": "character(3)", "ts": "timestamp without time zone", "tm": "time without time zone",
                         "iv": "interval", "js": "json", "ip": "inet", "net": "cidr", "mac": "macaddr",
                         "md": f"{schema}.mood", "dm": f"{schema}.positive", "rg": "int4range", "arr": "text[]",
                         "iarr": "integer[]"}
    with Store(conn.pg_dsn) as store:
        store.execute(f"DROP TABLE {table}; DROP SCHEMA {schema} CASCADE")


# -- change-data-capture -------------------------------------------------------------------------------

def test_a_debezium_change_stream_leaves_the_table_equal_to_the_source(kdg, conn, group, table, tmp_path):
    """Debezium's JsonConverter shape (schema + payload, key and value): a snapshot, creates, updates and deletes
    (each followed by its tombstone), keyed by id; the table ends equal to the source's last state, 0/0."""
    events, source = change_stream(22, snapshot=30, steps=300, ids=45)
    schema = {"type": "struct", "name": "shop.orders.Envelope", "optional": False, "fields": []}
    lines = []
    for op, row_id, before, after in events:
        key = {"schema": {"type": "struct", "fields": [{"field": "id", "type": "int64"}]}, "payload": {"id": row_id}}
        event = {"before": before, "after": after, "op": op, "ts_ms": 1767323045123,
                 "source": {"connector": "postgresql", "db": "shop", "table": "orders"}}
        lines.append(envelope(json.dumps(key), json.dumps({"schema": schema, "payload": event})))
        if op == "d":
            lines.append(envelope(json.dumps(key), None))
    topic = f"t-{uuid.uuid4().hex[:10]}"
    produce(kdg, topic, tmp_path, lines)
    create(conn, "CREATE TABLE {t} (id bigint PRIMARY KEY, name text NOT NULL, qty integer)", table)
    report = consume(kdg, topic, group, "exactly-once", "--table", table, "--envelope", "debezium",
                     "--column", "id = json:id", "--column", "name = json:name", "--column", "qty = json:qty",
                     "--batch-size", 50)
    assert (report["consumed"], report["dead_lettered"]) == (len(lines), 0), report
    with Store(conn.pg_dsn) as store:
        found = {r["id"]: dict(r) for r in store.fetch(f"SELECT * FROM {table}")}
    assert found == source
    audit = audited(kdg, topic, "--table", table, "-G", group)
    assert (audit["acked"], audit["lost"], audit["duplicates"]) == (len(lines), 0, 0) and audit["balanced"], audit


# -- --create-table and `kdg mapping check` ----------------------------------------------------------

def test_create_table_makes_the_table_from_the_mapping(kdg, conn, topic, group, table, tmp_path):
    produce_orders(kdg, topic, tmp_path, orders=5, versions=1)
    path = mapping_file(tmp_path, table, mode="upsert", key=["order_id"], extra="create_table = true")
    consume(kdg, topic, group, "at-least-once", "--mapping", path)
    with Store(conn.pg_dsn) as store:
        types = {r["name"]: r["type"] for r in store.fetch(
            "SELECT attname AS name, format_type(atttypid, atttypmod) AS type FROM pg_attribute "
            "WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped", table)}
        pk = store.fetchval("SELECT array_agg(a.attname::text) FROM pg_index i JOIN pg_attribute a ON "
                            "a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                            "WHERE i.indrelid = to_regclass($1) AND i.indisprimary", table)
    assert types == {"order_id": "bigint", "customer": "text", "tier": "text", "amount": "numeric(12,2)",
                     "placed_at": "timestamp with time zone", "placed_on": "date", "paid": "boolean", "note": "text",
                     "tags": "jsonb", "version": "integer", "idempotency_key": "text"}
    assert pk == ["order_id"]
    assert [r["order_id"] for r in rows(conn, table)] == [0, 1, 2, 3, 4]


def test_mapping_check_reads_the_live_table_and_writes_nothing(kdg, conn, table, tmp_path):
    create(conn, UPSERT_TABLE, table)
    good = as_json(kdg("mapping", "check", mapping_file(tmp_path, table, mode="upsert"), "--json"))
    assert (good["table_state"], good["key"], good["ok"]) == ("exists", ["order_id"], True)
    assert {c["name"]: c["table_type"] for c in good["columns"]}["placed_at"] == "timestamp with time zone"
    missing = f"{table}_new"
    path = mapping_file(tmp_path, missing, mode="upsert", key=["order_id"], extra="create_table = true")
    assert as_json(kdg("mapping", "check", path, "--json"))["table_state"] == "would be created"
    with Store(conn.pg_dsn) as store:
        assert store.fetchval("SELECT to_regclass($1) IS NULL", missing)
    bad = kdg("mapping", "check", mapping_file(tmp_path, table, columns=[("amount", "integer", "json:amount")]),
              check=False)
    assert bad.returncode == 2
    assert error_line(bad) == (f'error: column "amount": the mapping says integer, table {table} has '
                               "numeric(12,2)")


# -- bad mappings: exit 2, one line, nothing consumed ----------------------------------------------

def error_line(proc) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


@pytest.mark.parametrize("case, says", [
    ("unknown-type", "unknown type 'bignum'"),
    ("unknown-source", "unknown source of column 'order_id' 'jsn:id'"),
    ("column-not-in-table", 'column "discount" is not in table'),
    ("type-mismatch", 'column "amount": the mapping says integer, table'),
    ("upsert-without-unique-index", "upsert on (order_id) needs a primary key or unique index"),
    ("table-missing", "does not exist: create it, or pass --create-table"),
    ("delete-by-json-key", "a tombstone has no value"),
])
def test_a_bad_mapping_is_refused_before_anything_is_consumed(kdg, conn, topic, group, table, tmp_path, case, says):
    create(conn, INSERT_TABLE, table)
    produce_orders(kdg, topic, tmp_path, orders=5, versions=1)
    flags = {
        "unknown-type": ["--table", table, "--column", "order_id bignum = json:id"],
        "unknown-source": ["--table", table, "--column", "order_id bigint = jsn:id"],
        "column-not-in-table": ["--table", table, *column_flags(), "--column", "discount numeric = json:discount"],
        "type-mismatch": ["--table", table, *column_flags(), "--column", "amount integer = json:amount"],
        "upsert-without-unique-index": ["--mapping", mapping_file(tmp_path, table, mode="upsert", key=["order_id"])],
        "table-missing": ["--table", f"{table}_nope", *column_flags()],
        "delete-by-json-key": ["--mapping", mapping_file(tmp_path, table, mode="upsert", key=["order_id"],
                                                         extra='on_tombstone = "delete"')],
    }[case]
    for guarantee in ("at-least-once", "exactly-once"):
        proc = consume(kdg, topic, group, guarantee, *flags, check=False)
        assert proc.returncode == 2, (proc.returncode, proc.stderr)
        assert says in error_line(proc), proc.stderr
    with Store(conn.pg_dsn) as store:
        assert store.fetchval(f"SELECT count(*) FROM {table}") == 0
        assert store.fetchval("SELECT count(*) FROM kdg_offsets WHERE consumer_group = $1", group) == 0
    # nor did Kafka move: the group reads all 5 records from the start
    assert consume(kdg, topic, group, "at-least-once", "--table", table, *column_flags())["consumed"] == 5


# -- spark-replay: the same mapping, the same store method, in Spark's executors ------------------

@pytest.mark.long  # make test budget: Spark's typed writer stays in test_spark_stream's typed upsert
def test_spark_replay_after_a_partial_consume_writes_each_key_once(kdg, conn, topic, group, table, tmp_path):
    create(conn, INSERT_TABLE, table)  # insert: a second write of any record would show as a second row
    bad = {41: "-3.00", 222: '"n/a"'}
    produce(kdg, topic, tmp_path, [envelope(str(i), order_json(i, v, bad.get(i) if v == 2 else None))
                                   for v in (1, 2) for i in range(300)])
    path = mapping_file(tmp_path, table)
    assert consume(kdg, topic, group, "exactly-once", "--mapping", path, "-c", 250)["consumed"] == 250

    replay = as_json(kdg("spark-replay", topic, "-g", "exactly-once", "--mapping", path, "--json", timeout=600))
    assert (replay["table"], replay["rows_read"], replay["duplicates_dropped"]) == (table, 600, 250), replay
    assert replay["rows_written"] + replay["dead_lettered"] == 350, replay  # the refused ones may be either side's
    with Store(conn.pg_dsn) as store:
        total, keys = store.fetch(f"SELECT count(*), count(DISTINCT idempotency_key) FROM {table}")[0]
    assert (total, keys) == (598, 598)
    found = rows(conn, table)
    assert [{k: v for k, v in r.items() if k != "idempotency_key"} for r in found] == [
        expected_row(i, v) for i in range(300) for v in (1, 2) if not (v == 2 and i in bad)]
    dead = dead_letters(kdg, topic)
    assert sorted({int(json.loads(d["value"])["id"]) for d in dead}) == sorted(bad)
    # an audit of -G GROUP counts the dead letters that group wrote; the replay's carry the replay's own group, and
    # which side refuses which bad row depends on how far the consume's 250 records reached in each partition
    ours = sum(d["headers"].get("kdg-group") == group for d in dead)
    audit = audited(kdg, topic, "--table", table, "-G", group)
    assert (audit["basis"], audit["processed_unique"], audit["dead_lettered"], audit["lost"], audit["duplicates"]) == (
        "idempotency_key column and kdg_dedup claims", 600, ours, 0, 0), audit

    # the same file with --table and --mode on top: an upsert table ends with each order's last good version
    latest = f"{table}_latest"
    create(conn, UPSERT_TABLE, latest)
    again = as_json(kdg("spark-replay", topic, "-g", "at-least-once", "--mapping", path, "--table", latest,
                        "--mode", "upsert", "--json", timeout=600))
    assert (again["rows_read"], again["dead_lettered"]) == (600, 2), again
    assert [(r["order_id"], r["version"]) for r in rows(conn, latest)] == [
        (i, 1 if i in bad else 2) for i in range(300)]


def test_rows_refused_by_an_upserts_modifier_or_an_index_limit_are_the_rows_not_the_batchs(kdg, conn, topic, group,
                                                                                           table, tmp_path):
    """Two keys equal only once numeric(10,0) rounds them, in one upsert batch (21000: ON CONFLICT cannot affect
    a row twice), a value too large for an index row (54000), and a jsonb number past numeric's range (22003,
    met by the staging COPY when values were staged as jsonb): before, each stopped the consumer with the
    whole batch unwritten; now the first is written row by row (the later version wins), the others are
    dead-lettered, and the rest of the batch lands."""
    create(conn, "CREATE TABLE {t} (k numeric(10,0) PRIMARY KEY, name text UNIQUE, doc jsonb)", table)
    huge = os.urandom(12_000).hex()  # 24,000 characters that do not compress: past a btree row's 8191 bytes
    produce(kdg, topic, tmp_path, [envelope("a", v) for v in (
        '{"k": 1, "name": "one"}', '{"k": 1.2, "name": "one again"}', f'{{"k": 2, "name": "{huge}"}}',
        '{"k": 3, "name": "three", "doc": {"x": 1.5e3}}', '{"k": 4, "name": "four", "doc": {"x": 1e200000}}')])
    report = consume(kdg, topic, group, "exactly-once", "--table", table, "--mode", "upsert",
                     "--column", "k = json:k", "--column", "name = json:name", "--column", "doc = json:doc")
    assert (report["consumed"], report["processed"], report["dead_lettered"]) == (5, 3, 2), report
    with Store(conn.pg_dsn) as store:
        found = {int(r["k"]): (r["name"], r["doc"]) for r in store.fetch(f"SELECT k, name, doc::text FROM {table}")}
    assert found == {1: ("one again", None), 3: ("three", '{"x": 1500}')}, found
    assert sorted(d["headers"]["kdg-sqlstate"] for d in dead_letters(kdg, topic)) == ["22003", "54000"]


def test_two_topics_feeding_one_table_exactly_once_are_audited_each_on_its_own(kdg, conn, group, table, tmp_path):
    """The table has no topic column; each key's claim says which topic it came from, so one topic's audit
    does not count the other's rows as unexpected."""
    create(conn, "CREATE TABLE {t} (id bigint PRIMARY KEY, idempotency_key text)", table)
    topics = [f"t-{region}-{uuid.uuid4().hex[:6]}" for region in ("eu", "us")]
    for n, topic in enumerate(topics):
        produce(kdg, topic, tmp_path, [envelope(None, json.dumps({"id": 10 * n + i})) for i in range(3)])
        consume(kdg, topic, f"{group}-{n}", "exactly-once", "--table", table, "--column", "id = json:id",
                "--column", "idempotency_key = idempotency_key")
    for n, topic in enumerate(topics):
        audit = audited(kdg, topic, "--table", table, "-G", f"{group}-{n}")
        assert (audit["rows"], audit["unexpected"], audit["lost"], audit["balanced"]) == (3, 0, 0, True), audit

"""A Debezium-shaped change stream of a small shop database, for tests and benchmarks that need CDC topics.

Three source tables (``customers``, ``orders``, ``order_lines``), each written to its own topic
``{prefix}.public.{table}`` as Debezium's Postgres connector does with Kafka Connect's JsonConverter and
``schemas.enable=true``: the value ``{"schema": …, "payload": {"before", "after", "source", "op", "ts_ms",
"transaction"}}``, the key ``{"schema": …, "payload": {"id": …}}``. Types follow Debezium's conventions:
``numeric(p,s)`` as base64 big-endian two's complement bytes named ``org.apache.kafka.connect.data.Decimal``
with a ``scale`` parameter, ``timestamp`` as ``io.debezium.time.MicroTimestamp`` microseconds.

A seeded scenario: a snapshot (``op: r``) of every table, then random creates (``c``), updates (``u``) and
deletes (``d``, ``after: null``), each delete followed by its tombstone (null value, same key).

What else Debezium sends, each asked for (the default stream has none of it):

- ``toast=True``: ``customers`` has a ``bio`` (text) and an ``avatar`` (bytea) that the source stores TOASTed;
  an update that leaves one unchanged sends Debezium's unavailable-value placeholder for it
  (``__debezium_unavailable_value``; for the bytes column, the base64 of those bytes);
- ``truncate=True``: ``order_lines`` is truncated halfway (``op: t``, no key, no rows); its topic must have
  one partition for the replica to be exact (Debezium's own advice: a truncate has no key, and nothing
  orders it against the other partitions' changes);
- ``loyalty_tier=True``: ``customers`` gains a ``loyalty_tier`` column halfway (``ALTER TABLE … ADD COLUMN``):
  the events' schema has it from then on, the rows before hold NULL;
- :func:`produce_heartbeats`: Debezium's heartbeat topic (``{heartbeat prefix}.{topic.prefix}``).

    events = generate(seed=1)                    # [(table, key bytes or None, value bytes or None)], in commit order
    produce(bootstrap, "shop", events)           # to shop.public.customers, shop.public.orders, ...
    expected = final_state(events)               # {table: {id: row}}, as Postgres returns the rows
    Path("customers.toml").write_text(mapping_toml("customers"))
"""

from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Callable

CONNECT_DECIMAL = "org.apache.kafka.connect.data.Decimal"
MICRO_TIMESTAMP = "io.debezium.time.MicroTimestamp"
EPOCH = datetime(1970, 1, 1)
SERVER = "shop"  # the connector's topic.prefix, as it appears in schema names and source.name
START_MS = 1_764_320_000_000  # 2025-11-28 08:53:20 UTC: the snapshot's time; changes follow it

Event = tuple[str, "bytes | None", "bytes | None"]  # (source table = topic suffix, key (None: a truncate's), value or
#                                                    None for a tombstone)
UNAVAILABLE = "__debezium_unavailable_value"  # Debezium's unavailable.value.placeholder, by default
HEARTBEAT_PREFIX = "__debezium-heartbeat"     # Debezium's topic.heartbeat.prefix, by default


@dataclass(frozen=True)
class Column:
    """One source column: its Postgres type and how Debezium writes it (Connect type, logical name, parameters)."""

    name: str
    pg_type: str
    connect_type: str
    logical: str | None = None
    parameters: dict | None = None
    optional: bool = True

    def field_schema(self) -> dict:
        schema: dict[str, Any] = {"type": self.connect_type, "optional": self.optional}
        if self.logical:
            schema.update(name=self.logical, version=1)
        if self.parameters:
            schema["parameters"] = self.parameters
        schema["field"] = self.name
        return schema


def _decimal(precision: int, scale: int) -> dict:
    return {"connect_type": "bytes", "logical": CONNECT_DECIMAL,
            "parameters": {"scale": str(scale), "connect.decimal.precision": str(precision)}}


ID = Column("id", "bigint", "int64", optional=False)
TABLES: dict[str, tuple[Column, ...]] = {
    "customers": (ID, Column("name", "text", "string"), Column("email", "text", "string"),
                  Column("balance", "numeric(12,2)", **_decimal(12, 2))),
    "orders": (ID, Column("customer_id", "bigint", "int64"), Column("total", "numeric(12,2)", **_decimal(12, 2)),
               Column("status", "text", "string"), Column("placed_at", "timestamp", "int64", MICRO_TIMESTAMP)),
    "order_lines": (ID, Column("order_id", "bigint", "int64"), Column("sku", "text", "string"),
                    Column("qty", "integer", "int32")),
}
STATUSES = ("new", "paid", "shipped", "cancelled")
TOASTED = (Column("bio", "text", "string"), Column("avatar", "bytea", "bytes"))  # customers', with toast=True
LOYALTY_TIER = Column("loyalty_tier", "text", "string")  # customers', halfway, with loyalty_tier=True
TIERS = ("bronze", "silver", "gold", None)
TRUNCATED = "order_lines"  # the table truncate=True truncates


# -- encoding and decoding Connect's values -----------------------------------------------------------------

def encode_decimal(value: Decimal, scale: int) -> str:
    """``value`` as JsonConverter writes a Decimal of ``scale``: base64 of the unscaled value's minimal
    big-endian two's complement bytes (Java's ``BigInteger.toByteArray``)."""
    unscaled = int(value.scaleb(scale).to_integral_exact())
    if Decimal(unscaled).scaleb(-scale) != value:
        raise ValueError(f"{value} has more than {scale} decimal places")
    size = (unscaled if unscaled >= 0 else ~unscaled).bit_length() // 8 + 1
    return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()


def decode_decimal(text: str, scale: int) -> Decimal:
    return Decimal(int.from_bytes(base64.b64decode(text), "big", signed=True)).scaleb(-scale)


def encode_micro_timestamp(value: datetime) -> int:
    """A ``timestamp`` (no time zone) as Debezium's MicroTimestamp: its wall-clock time as microseconds since 1970."""
    delta = value - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def decode_micro_timestamp(micros: int) -> datetime:
    return EPOCH + timedelta(microseconds=micros)


def _encoded(column: Column, value: Any) -> Any:
    if value is None:
        return None
    if value is UNCHANGED:  # an unchanged TOASTed column: Debezium's placeholder (bytes: as bytes, in base64)
        return base64.b64encode(UNAVAILABLE.encode()).decode() if column.connect_type == "bytes" else UNAVAILABLE
    if column.connect_type == "bytes" and column.logical is None:
        return base64.b64encode(value).decode()
    if column.logical == CONNECT_DECIMAL:
        return encode_decimal(value, int(column.parameters["scale"]))
    if column.logical == MICRO_TIMESTAMP:
        return encode_micro_timestamp(value)
    return value


UNCHANGED = object()  # a row's value the simulation marks: an unchanged TOASTed column of an update


def _decoded(field: dict, value: Any) -> Any:
    """A payload value back to Python, read from its field's schema as a sink would (UNCHANGED: the
    placeholder)."""
    if value is None:
        return None
    if field["type"] == "bytes" and field.get("name") is None:
        raw = base64.b64decode(value)
        return UNCHANGED if raw == UNAVAILABLE.encode() else raw
    if value == UNAVAILABLE:
        return UNCHANGED
    if field.get("name") == CONNECT_DECIMAL:
        return decode_decimal(value, int(field["parameters"]["scale"]))
    if field.get("name") == MICRO_TIMESTAMP:
        return decode_micro_timestamp(value)
    return value


# -- schemas -----------------------------------------------------------------------------------------------

def _struct(name: str, fields: list[dict], *, optional: bool, field: str | None = None, version: int | None = None):
    schema: dict[str, Any] = {"type": "struct", "fields": fields, "optional": optional, "name": name}
    if version is not None:
        schema["version"] = version
    if field is not None:
        schema["field"] = field
    return schema


def _plain(field: str, kind: str, optional: bool = False, **extra) -> dict:
    return {"type": kind, "optional": optional, **extra, "field": field}


SOURCE_SCHEMA = _struct("io.debezium.connector.postgresql.Source", [
    _plain("version", "string"), _plain("connector", "string"), _plain("name", "string"), _plain("ts_ms", "int64"),
    _plain("snapshot", "string", True, name="io.debezium.data.Enum", version=1,
           parameters={"allowed": "true,last,false,incremental"}, default="false"),
    _plain("db", "string"), _plain("sequence", "string", True), _plain("schema", "string"), _plain("table", "string"),
    _plain("txId", "int64", True), _plain("lsn", "int64", True), _plain("xmin", "int64", True),
], optional=False, field="source")
TRANSACTION_SCHEMA = _struct("event.block", [
    _plain("id", "string"), _plain("total_order", "int64"), _plain("data_collection_order", "int64"),
], optional=True, field="transaction", version=1)


def value_schema(table: str, server: str = SERVER, columns: tuple[Column, ...] | None = None) -> dict:
    """The Envelope schema Debezium sends with every change event of ``table`` (of ``columns``: its own now)."""
    row = [c.field_schema() for c in columns or TABLES[table]]
    value = f"{server}.public.{table}.Value"
    return _struct(f"{server}.public.{table}.Envelope", [
        _struct(value, row, optional=True, field="before"), _struct(value, row, optional=True, field="after"),
        SOURCE_SCHEMA, _plain("op", "string"), _plain("ts_ms", "int64", True), TRANSACTION_SCHEMA,
    ], optional=False, version=1)


def key_bytes(table: str, row_id: int, server: str = SERVER) -> bytes:
    """The record key Debezium writes for ``table``'s row ``row_id``: its primary key in Connect's wrapper."""
    schema = _struct(f"{server}.public.{table}.Key", [ID.field_schema()], optional=False)
    return _dumps({"schema": schema, "payload": {"id": row_id}})


def _dumps(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


# -- the scenario ------------------------------------------------------------------------------------------

def _row_maker(rng: random.Random, toast: bool) -> dict[str, Callable[[int, int], dict]]:
    """For each table, a function of (id, step) giving a fresh random row as Python values."""
    def money() -> Decimal:
        return Decimal(rng.randrange(-5_000, 10_000_000)).scaleb(-2)

    def when(step: int) -> datetime:
        return datetime(2025, 11, 1) + timedelta(minutes=step, microseconds=rng.randrange(60_000_000))

    def customer(i: int, step: int) -> dict:
        row = {"id": i, "name": f"customer {i}.{step}",
               "email": None if rng.random() < 0.1 else f"c{i}.{step}@example.com", "balance": money()}
        if toast:  # long enough that the source keeps them out of line (TOAST)
            row.update(bio=f"customer {i} wrote this at step {step}. " * 20, avatar=rng.randbytes(24))
        return row

    return {
        "customers": customer,
        "orders": lambda i, step: {"id": i, "customer_id": rng.randrange(1, 500), "total": money(),
                                   "status": rng.choice(STATUSES), "placed_at": when(step)},
        "order_lines": lambda i, step: {"id": i, "order_id": rng.randrange(1, 2_000),
                                        "sku": f"SKU-{rng.randrange(10**6):06d}",
                                        "qty": None if rng.random() < 0.05 else rng.randrange(-3, 100)},
    }


class _Database:
    """The source database as the connector sees it: rows by table and id, an LSN that grows with every change."""

    def __init__(self, rng: random.Random, server: str, toast: bool):
        self.rng, self.server = rng, server
        self.rows: dict[str, dict[int, dict]] = {t: {} for t in TABLES}
        self.events: list[Event] = []
        self.counts = dict.fromkeys(TABLES, 0)
        self.lsn, self.tx, self.clock = 24_000_000, 760, START_MS
        self.columns = {t: TABLES[t] + (TOASTED if toast and t == "customers" else ()) for t in TABLES}
        self.schemas = {t: value_schema(t, server, self.columns[t]) for t in TABLES}

    def add_column(self, table: str, column: Column) -> None:
        """``ALTER TABLE … ADD COLUMN``: the rows hold NULL, and the events' schema has it from now on."""
        self.columns[table] += (column,)
        self.schemas[table] = value_schema(table, self.server, self.columns[table])
        for row in self.rows[table].values():
            row[column.name] = None

    def _source(self, table: str, snapshot: str = "false") -> dict:
        self.lsn += self.rng.randrange(8, 400)
        self.clock += self.rng.randrange(0, 40)
        return {"version": "2.7.3.Final", "connector": "postgresql", "name": self.server, "ts_ms": self.clock,
                "snapshot": snapshot, "db": "shop", "sequence": json.dumps([str(self.lsn - 8), str(self.lsn)]),
                "schema": "public", "table": table, "txId": self.tx, "lsn": self.lsn, "xmin": None}

    def emit(self, table: str, op: str, row_id: int, before: dict | None, after: dict | None,
             snapshot: str = "false") -> None:
        if op != "r":
            self.tx += 1
        source = self._source(table, snapshot)
        columns = self.columns[table]
        image = (lambda row: None if row is None else {c.name: _encoded(c, row.get(c.name)) for c in columns})
        payload = {"before": image(before), "after": image(after), "source": source, "op": op,
                   "ts_ms": self.clock + self.rng.randrange(1, 30), "transaction": None}
        key = key_bytes(table, row_id, self.server)
        self.events.append((table, key, _dumps({"schema": self.schemas[table], "payload": payload})))
        self.counts[table] += 1
        if op == "d":  # tombstones.on.delete=true, Debezium's default
            self.events.append((table, key, None))
            self.counts[table] += 1

    def truncate(self, table: str) -> None:
        """``TRUNCATE``: one event without key or rows (truncate.handling.mode=include, or skipped.operations=none)."""
        self.tx += 1
        payload = {"before": None, "after": None, "source": self._source(table), "op": "t",
                   "ts_ms": self.clock + self.rng.randrange(1, 30), "transaction": None}
        self.events.append((table, None, _dumps({"schema": self.schemas[table], "payload": payload})))
        self.counts[table] += 1
        self.rows[table].clear()


def _simulate(seed: int, per_table: int, server: str, *, toast: bool = False, truncate: bool = False,
              loyalty_tier: bool = False) -> tuple[list[Event], dict[str, dict[int, dict]]]:
    """The events and the source's final rows, as the simulation holds them (not read back from the events)."""
    rng = random.Random(seed)
    db, make = _Database(rng, server, toast), _row_maker(rng, toast)
    snapshot = max(1, per_table * 3 // 10)
    ids = {t: snapshot + max(1, per_table // 4) for t in TABLES}  # ids are reused: deleted rows come back
    for table in TABLES:
        for i in range(1, snapshot + 1):
            db.rows[table][i] = make[table](i, 0)
            last = table == list(TABLES)[-1] and i == snapshot
            db.emit(table, "r", i, None, db.rows[table][i], snapshot="last" if last else "true")
    step, halfway = 0, False
    while any(n < per_table for n in db.counts.values()):
        step += 1
        if not halfway and sum(db.counts.values()) >= len(TABLES) * per_table * 6 // 10:
            halfway = True
            if truncate:
                db.truncate(TRUNCATED)
            if loyalty_tier:
                db.add_column("customers", LOYALTY_TIER)
        table = rng.choice([t for t, n in db.counts.items() if n < per_table])
        rows, i = db.rows[table], rng.randrange(1, ids[table] + 1)

        def fresh_row() -> dict:
            row = make[table](i, step)
            if halfway and loyalty_tier and table == "customers":
                row["loyalty_tier"] = rng.choice(TIERS)
            return row
        if i not in rows:
            rows[i] = fresh_row()
            db.emit(table, "c", i, None, rows[i])
        elif rng.random() < 0.2:
            db.emit(table, "d", i, rows.pop(i), None)
        else:
            fresh = fresh_row()
            names = [c.name for c in db.columns[table][1:]]
            changed = rng.sample(names, rng.randrange(1, len(names) + 1))
            before, rows[i] = rows[i], {**rows[i], **{name: fresh[name] for name in changed}}
            unchanged = {c.name: UNCHANGED for c in TOASTED if table == "customers" and toast and c.name not in changed}
            db.emit(table, "u", i, before, {**rows[i], **unchanged})
    return db.events, db.rows


def generate(seed: int, per_table: int = 1000, server: str = SERVER, **options) -> list[Event]:
    """A seeded change stream of every table, about ``per_table`` records each (tombstones included), in the
    source's commit order (so each key's changes are in order): ``(table, key, value or None)``. ``options``:
    ``toast``, ``truncate``, ``loyalty_tier`` (see the module's docstring)."""
    return _simulate(seed, per_table, server, **options)[0]


def final_state(events: list[Event]) -> dict[str, dict[int, dict]]:
    """Each source table's rows after ``events``, read back from the events themselves (their JSON and
    schemas), as Python values: ``{table: {id: {column: value}}}``, Decimal, datetime and bytes included. A
    placeholder keeps the row's value; a truncate empties the table; a column added later is NULL in the rows
    written before it."""
    state: dict[str, dict[int, dict]] = {t: {} for t in TABLES}
    columns: dict[str, list[str]] = {t: [] for t in TABLES}
    for table, key, value in events:
        rows = state.setdefault(table, {})
        if value is None:  # a tombstone: deletes the key, which its delete already did
            rows.pop(json.loads(key)["payload"]["id"], None)
            continue
        doc = json.loads(value)
        payload, fields = doc["payload"], {f["field"]: f for f in doc["schema"]["fields"]}
        if payload["op"] == "t":
            rows.clear()
            continue
        row_id = json.loads(key)["payload"]["id"]
        if payload["op"] == "d":
            rows.pop(row_id, None)
            continue
        row_fields = {f["field"]: f for f in fields["after"]["fields"]}
        columns[table] += [f for f in row_fields if f not in columns[table]]
        old = rows.get(row_id, {})
        decoded = {name: _decoded(row_fields[name], v) for name, v in payload["after"].items()}
        rows[row_id] = {name: old.get(name) if v is UNCHANGED else v for name, v in decoded.items()}
    return {t: {i: {**dict.fromkeys(columns[t]), **row} for i, row in rows.items()} for t, rows in state.items()}


def last_sources(events: list[Event]) -> dict[str, dict[int, dict]]:
    """Each row's last change's ``source`` block (``ts_ms``, ``lsn``, ``txId``, …), of the rows ``final_state`` holds."""
    found: dict[str, dict[int, dict]] = {t: {} for t in TABLES}
    for table, key, value in events:
        if value is None:
            continue
        payload = json.loads(value)["payload"]
        if payload["op"] == "t":
            found[table].clear()
        elif payload["op"] != "d":
            found[table][json.loads(key)["payload"]["id"]] = payload["source"]
    return found


def topic_of(prefix: str, table: str) -> str:
    return f"{prefix}.public.{table}"


def produce(bootstrap: str, prefix: str, events: list[Event], extra: dict | None = None,
            partitions: int = 3) -> dict[str, int]:
    """Write ``events`` to ``{prefix}.public.{table}`` (created with ``partitions`` if missing, one for a table with
    a truncate: it has no key), keyed, with an idempotent producer, so each key's events stay in order; the number
    of records per topic."""
    from confluent_kafka import KafkaException, Producer

    from kdg.kafka.admin import ensure_topic

    truncated = {table for table, key, _ in events if key is None}
    for table in TABLES:
        ensure_topic(bootstrap, topic_of(prefix, table), partitions=1 if table in truncated else partitions,
                     extra=extra)
    failures: list[str] = []

    def delivered(err, msg) -> None:
        if err is not None:
            failures.append(f"{msg.topic()}: {err.str()}")

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20,
                         **(extra or {})})
    sent = dict.fromkeys((topic_of(prefix, t) for t in TABLES), 0)
    for table, key, value in events:
        topic = topic_of(prefix, table)
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.1)
        sent[topic] += 1
    if producer.flush(60) or failures:
        raise KafkaException(f"cdc_source: {len(failures)} records not delivered, first: {failures[:1]}")
    return sent


def heartbeat_topic(prefix: str, heartbeat_prefix: str = HEARTBEAT_PREFIX) -> str:
    """Debezium's heartbeat topic: ``{topic.heartbeat.prefix}.{topic.prefix}``."""
    return f"{heartbeat_prefix}.{prefix}"


def heartbeats(prefix: str, count: int) -> list[tuple[bytes, bytes]]:
    """``count`` heartbeats as Debezium writes them, ``(key, value)`` (JsonConverter, schemas on: the key names
    the connector's server, the value holds ``ts_ms`` alone)."""
    key = _dumps({"schema": _struct("io.debezium.connector.common.ServerNameKey",
                                    [_plain("serverName", "string")], optional=False),
                  "payload": {"serverName": prefix}})
    schema = _struct("io.debezium.connector.common.Heartbeat", [_plain("ts_ms", "int64")], optional=False)
    return [(key, _dumps({"schema": schema, "payload": {"ts_ms": START_MS + n * 10_000}})) for n in range(count)]


def produce_heartbeats(bootstrap: str, prefix: str, count: int, heartbeat_prefix: str = HEARTBEAT_PREFIX) -> str:
    """``count`` :func:`heartbeats` to the heartbeat topic, which this returns."""
    from confluent_kafka import Producer

    from kdg.kafka.admin import ensure_topic

    topic = heartbeat_topic(prefix, heartbeat_prefix)
    ensure_topic(bootstrap, topic, partitions=1)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, value in heartbeats(prefix, count):
        producer.produce(topic, value, key)
    if producer.flush(30):
        raise RuntimeError("cdc_source: heartbeats not delivered")
    return topic


def mapping_toml(table: str, target: str | None = None) -> str:
    """A kdg mapping file for ``table``'s change stream into ``target`` (default: the same name): Debezium's
    envelope (upserts by key, deletes and tombstones delete), every column read from ``json:FIELD``."""
    columns = "\n".join(f'{c.name} = {{ type = "{c.pg_type}", from = "json:{c.name}" }}' for c in TABLES[table])
    return (f'table = "{target or table}"\nenvelope = "debezium"\nkey = ["id"]\ncreate_table = true\n\n'
            f"[columns]\n{columns}\n")

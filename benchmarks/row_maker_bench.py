"""The typed sink's per-record Python work alone: records → staged rows (no Kafka, no Postgres).

    python benchmarks/row_maker_bench.py [--records 50000] [--repeat 7] [--json out.json]

Two inputs, each through the mapping the typed-sink benchmarks use:

- ``plain``: JSON orders (a nested field, a number as a string, an ISO time, a boolean);
- ``connect``: the same rows as Debezium change events in Kafka Connect's JsonConverter envelope
  (``schemas.enable=true``: every record carries its whole schema), read under ``--envelope debezium``,
  with a ``io.debezium.time.MicroTimestamp`` and a ``Decimal`` (base64 bytes with a scale) to decode.

- ``doubles``: plain JSON rows of an id and six numbers with a fraction, each into a ``double precision``
  column (measurements, prices: what a row of numbers costs the batch read).

A fourth case, ``plain+transform``, puts each plain record through a transform that returns its value as it
is (``--transform``'s cheapest: the record decoded once, handed over, its row read by the mapping), so its
difference from ``plain`` is what a transform costs per record (issue 46's budget: at most 1 µs).

Reported: µs of CPU per record (process time, so another process's load does not count), the median of
``--repeat`` runs and the best. Run it on two checkouts to compare a change to the row maker; the
consumer's whole loop is ``typed_sink_bench.py``'s.
"""

import argparse
import base64
import gc
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kdg.flow.transform import Transform, fan_out  # noqa: E402
from kdg.mapping import RowMaker, build_mapping  # noqa: E402
from kdg.memory import GC_YOUNG  # noqa: E402
from kdg.records import Record  # noqa: E402

PLAIN = ["order_id bigint = json:id", "customer text = json:/customer/name", "amount numeric(12,2) = json:amount",
         "placed_at timestamptz = json:placed_at", "paid boolean = json:paid", "qty integer = json:qty"]
DOUBLES = ["order_id bigint = json:id"] + [f"m{j} double precision = json:m{j}" for j in range(6)]
CONNECT = ["order_id bigint = json:id", "customer text = json:customer", "amount numeric(12,2) = json:amount",
           "placed_at timestamp = json:placed_at", "paid boolean = json:paid", "qty integer = json:qty"]
_SCHEMA = {"type": "struct", "optional": True, "fields": [
    {"type": "int64", "optional": False, "field": "id"},
    {"type": "string", "optional": True, "field": "customer"},
    {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
     "parameters": {"scale": "2", "connect.decimal.precision": "12"}, "field": "amount"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "version": 1,
     "field": "placed_at"},
    {"type": "boolean", "optional": True, "field": "paid"},
    {"type": "int32", "optional": True, "field": "qty"}]}
ENVELOPE_SCHEMA = {"type": "struct", "optional": False, "name": "shop.public.orders.Envelope", "fields": [
    {**_SCHEMA, "name": "shop.public.orders.Value", "field": "before"},
    {**_SCHEMA, "name": "shop.public.orders.Value", "field": "after"},
    {"type": "struct", "optional": False, "name": "io.debezium.connector.postgresql.Source", "field": "source",
     "fields": [{"type": "string", "optional": False, "field": "connector"},
                {"type": "int64", "optional": False, "field": "ts_ms"},
                {"type": "int64", "optional": True, "field": "lsn"}]},
    {"type": "string", "optional": False, "field": "op"},
    {"type": "int64", "optional": True, "field": "ts_ms"}]}


def plain(i: int) -> bytes:
    return (f'{{"id": {i}, "customer": {{"name": "c{i % 5000}", "tier": "gold"}}, "amount": "{i % 10_000}.'
            f'{i % 100:02d}", "placed_at": "2026-11-23T00:00:{i % 60:02d}+00:00", "paid": '
            f'{"true" if i % 2 else "false"}, "qty": {i % 7}}}').encode()


def doubles(i: int) -> bytes:
    return (f'{{"id": {i}, ' + ", ".join(f'"m{j}": {i % 1000}.{(i * 7 + j) % 1000:03d}' for j in range(6)) + "}").encode()


def connect(i: int) -> bytes:
    cents = (i % 10_000) * 100 + i % 100
    after = {"id": i, "customer": f"c{i % 5000}",
             "amount": base64.b64encode(cents.to_bytes(4, "big", signed=True)).decode(),
             "placed_at": 1_763_856_000_000_000 + i * 1_000_003, "paid": bool(i % 2), "qty": i % 7}
    event = {"before": None, "after": after, "source": {"connector": "postgresql", "ts_ms": 1763856000000,
                                                        "lsn": 1000 + i}, "op": "c", "ts_ms": 1763856000123}
    return json.dumps({"schema": ENVELOPE_SCHEMA, "payload": event}).encode()


def identity(record):
    return record.value


def measure(maker: RowMaker, records: list, repeat: int, transform=None) -> list[float]:
    per_record = []
    for _ in range(repeat):
        started = time.process_time()
        if transform is not None:  # what kdg.flow.source does with a route's transform, then the rows
            made, failed = [], []
            fan_out(records, [(None, transform)], made, failed)
            assert not failed, failed[:1]
            rows, dead = maker.rows(made)
        else:
            rows, dead = maker.rows(records)
        per_record.append((time.process_time() - started) / len(records) * 1e6)
        assert not dead, dead[:1]
        assert len(rows) == len(records)
    return per_record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    gc.freeze()  # as `kdg consume` runs: young collections every GC_YOUNG allocations, not Python's 700
    gc.set_threshold(GC_YOUNG)
    cases = {"plain": (PLAIN, "none", plain), "plain+transform": (PLAIN, "none", plain),
             "doubles": (DOUBLES, "none", doubles), "connect": (CONNECT, "debezium", connect)}
    prepared = {}
    for name, (columns, envelope, make) in cases.items():
        mapping = build_mapping(columns=columns, table="orders", mode="upsert", key=("order_id",),
                                envelope=envelope)
        records = [(Record(make(i), str(i).encode(), [], i % 3, "orders", i, 0), str(i))
                   for i in range(args.records)]
        transform = Transform(identity) if name.endswith("+transform") else None
        prepared[name] = (RowMaker(mapping), records, transform)
    times = {name: [] for name in cases}
    for _ in range(args.repeat):  # interleaved: a slow moment of the machine falls on every case alike
        for name, (maker, records, transform) in prepared.items():
            times[name] += measure(maker, records, 1, transform)
    results = {}
    for name, took in times.items():
        results[name] = {"us_per_record_median": round(statistics.median(took), 3),
                         "us_per_record_best": round(min(took), 3), "records": args.records,
                         "repeat": args.repeat}
        print(f"{name:16} {results[name]['us_per_record_median']:7.2f} µs/record (median of {args.repeat}), "
              f"best {results[name]['us_per_record_best']:.2f}")
    cost = statistics.median(t - p for t, p in zip(times["plain+transform"], times["plain"]))
    results["transform_cost_us"] = round(cost, 3)
    print(f"a trivial transform costs {cost:.2f} µs/record (median of the runs' differences; budget 1 µs)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
